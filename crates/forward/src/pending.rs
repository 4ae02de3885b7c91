//! Carriers that have not authenticated yet, bounded apart from sessions.
//!
//! A connection that never finishes its handshake must not take what an
//! authenticated client needs. So pending handshakes have their own table,
//! bounded in total and per source address, and when it is full the
//! *oldest* pending handshake is dropped to make room, never the new one
//! (OpenSSH's `MaxStartups` and `PerSourcePenalties` are the model). A
//! flood can then only delay a real client by as long as its own handshake
//! takes, and a flood from one address only displaces its own connections.
//! Session slots (`--max-sessions`) are taken only after authentication.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// What counts as one source: an IPv4 address, or an IPv6 /64 (one
/// host's share of addresses is commonly a whole /64).
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let mut o = v6.octets();
            o[8..].fill(0);
            IpAddr::V6(o.into())
        }
        v4 => v4,
    }
}

/// Handshakes pending at once, from all sources.
pub const MAX_PENDING: usize = 256;
/// Handshakes pending at once from one source address.
pub const MAX_PENDING_PER_SOURCE: usize = 32;
/// At most one log line about dropped handshakes per this long.
const LOG_EVERY: Duration = Duration::from_secs(10);

pub(crate) struct Pending {
    table: Mutex<Table>,
    total: usize,
    per_source: usize,
}

#[derive(Default)]
struct Table {
    next: u64,
    /// By age: the first entry is the oldest.
    entries: BTreeMap<u64, Entry>,
    by_source: HashMap<IpAddr, usize>,
    dropped: u64,
    logged: Option<Instant>,
}

struct Entry {
    source: Option<IpAddr>,
    /// Dropping it tells the handshake's task to give up.
    _cancel: oneshot::Sender<()>,
}

/// A pending handshake's place in the table; leaving it (drop) frees it.
pub(crate) struct Ticket {
    id: u64,
    pending: Arc<Pending>,
    cancelled: oneshot::Receiver<()>,
}

impl Pending {
    pub fn new(total: usize, per_source: usize) -> Arc<Pending> {
        Arc::new(Pending {
            table: Mutex::new(Table::default()),
            total: total.max(1),
            per_source: per_source.max(1),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a quarter of the table, or half of `source`'s share, is
    /// taken: then a QUIC client's address is checked (a Retry) before its
    /// handshake takes a place, so that packets with forged sources can
    /// neither fill the table nor push out one address's real handshakes
    /// (under the per-address cap the table never reaches a quarter).
    pub fn busy(&self, source: IpAddr) -> bool {
        let t = self.lock();
        t.entries.len() >= self.total.div_ceil(4)
            || t.by_source.get(&source).copied().unwrap_or(0) >= self.per_source.div_ceil(2)
    }

    /// Admits a new handshake from `source` (None: not counted per source,
    /// e.g. behind a reverse proxy every client has the proxy's address),
    /// dropping the oldest one of that source, or of all, if full.
    pub fn admit(self: &Arc<Self>, source: Option<IpAddr>) -> Ticket {
        let mut t = self.lock();
        let source_full = source.is_some_and(|ip| t.by_source.get(&ip) >= Some(&self.per_source));
        let victim = if source_full {
            t.entries
                .iter()
                .find(|(_, e)| e.source == source)
                .map(|(&id, _)| id)
        } else if t.entries.len() >= self.total {
            t.entries.keys().next().copied()
        } else {
            None
        };
        if let Some(id) = victim {
            t.remove(id);
            t.dropped += 1;
            if t.logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
                t.logged = Some(Instant::now());
                let n = std::mem::take(&mut t.dropped);
                tracing::warn!(
                    dropped = n,
                    "too many connections without a finished handshake: dropped the oldest (at most {} pending, {} per address)",
                    self.total,
                    self.per_source
                );
            }
        }
        let (tx, rx) = oneshot::channel();
        t.next += 1;
        let id = t.next;
        t.entries.insert(
            id,
            Entry {
                source,
                _cancel: tx,
            },
        );
        if let Some(ip) = source {
            *t.by_source.entry(ip).or_default() += 1;
        }
        Ticket {
            id,
            pending: self.clone(),
            cancelled: rx,
        }
    }

    /// Handshakes pending now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

impl Table {
    fn remove(&mut self, id: u64) {
        let Some(e) = self.entries.remove(&id) else {
            return;
        };
        if let Some(ip) = e.source {
            if let Some(n) = self.by_source.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    self.by_source.remove(&ip);
                }
            }
        }
    }
}

impl Ticket {
    /// Runs `f` (the handshake) unless the ticket is dropped to make room
    /// first: then None.
    pub async fn run<F: Future>(mut self, f: F) -> Option<F::Output> {
        tokio::select! {
            r = f => Some(r),
            _ = &mut self.cancelled => None,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.pending.lock().remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_oldest_is_dropped_and_a_flood_from_one_address_displaces_only_itself() {
        let p = Pending::new(4, 2);
        let a: IpAddr = "198.18.0.1".parse().unwrap();
        let b: IpAddr = "198.18.0.2".parse().unwrap();
        let b1 = p.admit(Some(b));
        let a1 = p.admit(Some(a));
        let a2 = p.admit(Some(a));
        // A third from `a` drops a's oldest, not b's.
        let a3 = p.admit(Some(a));
        assert!(a1.run(std::future::pending::<()>()).await.is_none());
        assert_eq!(p.len(), 3);
        // A whole IPv6 /64 is one source.
        assert_eq!(
            source_of("2001:db8::1".parse().unwrap()),
            source_of("2001:db8::ffff:1".parse().unwrap())
        );
        assert_eq!(
            source_of("::ffff:198.18.0.1".parse().unwrap()),
            "198.18.0.1".parse::<IpAddr>().unwrap()
        );
        // Full in total: the oldest of all (b1) goes.
        let _c = p.admit(None);
        let _d = p.admit(None);
        assert!(b1.run(std::future::pending::<()>()).await.is_none());
        assert_eq!(p.len(), 4);
        // One that finishes leaves its place.
        assert_eq!(a3.run(async { 7 }).await, Some(7));
        assert_eq!(p.len(), 3);
        drop(a2);
        assert_eq!(p.len(), 2);
    }
}
