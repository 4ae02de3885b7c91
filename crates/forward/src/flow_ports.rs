//! The server's UDP flows, bounded per server and per client identity.
//!
//! Each flow a peer opens binds a UDP socket of its own (port 0: a port
//! from the host's ephemeral range, held as long as the flow lives). Left
//! unbounded, one client could take every such port, and the host's other
//! programs — its resolver first — could no longer send a datagram. So a
//! flow takes a lease before its socket is bound: by default at most half
//! of the ephemeral range for the whole server and an eighth per identity
//! (an authorized key, the token, anonymous). A refusal is counted, and
//! logged at most once per [`LOG_EVERY`] with how many there were.
//! TCP connections are not counted here: the kernel reuses a local port
//! for connections to different destinations, and they are bounded by
//! `--max-streams` per session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// At most one log line about refused flows per this long.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The host's ephemeral port range (Linux's default when it cannot be
/// read: 32768–60999).
pub fn ephemeral_ports() -> usize {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|v| v.parse::<usize>().ok());
            let (lo, hi) = (it.next()??, it.next()??);
            (hi >= lo).then_some(hi - lo + 1)
        })
        .unwrap_or(60999 - 32768 + 1)
}

/// Default of the server-wide bound: half the ephemeral range.
pub fn default_total() -> usize {
    (ephemeral_ports() / 2).max(1)
}

/// Default of the per-identity bound: an eighth of the ephemeral range.
pub fn default_per_client() -> usize {
    (ephemeral_ports() / 8).max(1)
}

pub struct FlowPorts {
    total: usize,
    per_client: usize,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    used: usize,
    by_client: HashMap<String, usize>,
    refused: u64,
    logged: Option<Instant>,
}

impl std::fmt::Debug for FlowPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowPorts")
            .field("total", &self.total)
            .field("per_client", &self.per_client)
            .finish()
    }
}

/// One flow's place; dropping it (with the flow's socket) frees it.
#[derive(Debug)]
pub struct FlowLease {
    ports: Arc<FlowPorts>,
    client: String,
}

impl FlowPorts {
    pub fn new(total: usize, per_client: usize) -> Arc<FlowPorts> {
        Arc::new(FlowPorts {
            total: total.max(1),
            per_client: per_client.max(1),
            table: Mutex::new(Table::default()),
        })
    }

    /// The defaults, from this host's ephemeral range.
    pub fn host_defaults() -> Arc<FlowPorts> {
        FlowPorts::new(default_total(), default_per_client())
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn per_client(&self) -> usize {
        self.per_client
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A lease for one more flow of `client`, or why not.
    pub fn lease(self: &Arc<Self>, client: &str) -> Result<FlowLease, String> {
        let mut t = self.lock();
        let mine = t.by_client.get(client).copied().unwrap_or(0);
        let why = if t.used >= self.total {
            Some(format!(
                "the server has {} UDP flows open, its limit (--max-flows)",
                self.total
            ))
        } else if mine >= self.per_client {
            Some(format!(
                "this client has {} UDP flows open, its limit (--max-flows-per-client)",
                self.per_client
            ))
        } else {
            None
        };
        if let Some(why) = why {
            t.refused += 1;
            if t.logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                t.logged = Some(Instant::now());
                let n = std::mem::take(&mut t.refused);
                tracing::warn!(refused = n, "refusing UDP flows: {why}");
            }
            return Err(why);
        }
        t.used += 1;
        *t.by_client.entry(client.to_owned()).or_default() += 1;
        Ok(FlowLease {
            ports: self.clone(),
            client: client.to_owned(),
        })
    }

    /// Flows open now.
    pub fn used(&self) -> usize {
        self.lock().used
    }
}

impl Drop for FlowLease {
    fn drop(&mut self) {
        let mut t = self.ports.lock();
        t.used = t.used.saturating_sub(1);
        if let Some(n) = t.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                t.by_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_per_client_and_in_total_and_freed_on_drop() {
        let p = FlowPorts::new(3, 2);
        let a1 = p.lease("a").unwrap();
        let _a2 = p.lease("a").unwrap();
        assert!(p.lease("a").unwrap_err().contains("--max-flows-per-client"));
        let _b1 = p.lease("b").unwrap();
        assert!(p.lease("b").unwrap_err().contains("--max-flows"));
        drop(a1);
        assert_eq!(p.used(), 2);
        let _b2 = p.lease("b").unwrap();
        assert!(ephemeral_ports() > 0);
    }
}
