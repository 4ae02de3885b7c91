//! UDP forwards (`-L udp:`, `-R udp:`): one listening socket, one flow
//! through the session per source address.
//!
//! A source's first datagram opens a flow to the destination (the far
//! side checks its rules and answers with a socket `connect`ed there);
//! what it sends meanwhile waits in a small queue. Answers go back to the
//! source they belong to. A flow ends after [`FLOW_IDLE`] without a
//! datagram either way, or [`FLOW_IDLE_ANSWERED`] once the destination
//! has answered (conntrack's UDP timeouts), when the session ends, or when
//! the far side closes it. A refused destination is not asked again for
//! [`REFUSED_HOLD`]: its datagrams are dropped meanwhile, with a
//! throttled log line.
//!
//! Bounds: [`MAX_FLOWS`] flows per listener (and the session's stream
//! limit), [`OPENING_QUEUE`] datagrams (at most [`OPENING_BYTES`]) per
//! flow while it opens, one 64 KiB receive buffer per listener; datagrams
//! on their way are bounded by the session (see `longhaul_proto::mux`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use longhaul_carrier::udp_batch;
use longhaul_session::logs::{escaped, shown, Throttle};
use longhaul_session::{DatagramSink, Flow, SessionHandle, MAX_DATAGRAM};
use tokio::net::UdpSocket;

/// A flow nobody has answered ends after this long without a datagram.
pub const FLOW_IDLE: Duration = Duration::from_secs(30);
/// A flow the destination has answered ends after this long idle.
pub const FLOW_IDLE_ANSWERED: Duration = Duration::from_secs(120);
/// Flows one listener keeps at once; a new source past it is dropped.
pub const MAX_FLOWS: usize = 4096;
/// Datagrams a flow keeps while its open is on the way.
pub const OPENING_QUEUE: usize = 16;
/// … and their bytes.
pub const OPENING_BYTES: usize = 64 * 1024;
/// Bytes all the flows of one listener (or association) keep while they
/// open: a peer that leaves OPENs unanswered holds no more.
pub const OPENING_TOTAL: usize = 1 << 20;
/// How long a refused destination is not asked again.
pub const REFUSED_HOLD: Duration = Duration::from_secs(5);
/// How often idle flows are looked for.
pub(crate) const SWEEP: Duration = Duration::from_secs(1);

/// Datagrams dropped at listeners, logged at most every few seconds.
static DROPS: Throttle = Throttle::new();
/// Refused flows, likewise.
static REFUSED: Throttle = Throttle::new();

/// Sends one answer back to a flow's source.
pub(crate) type Reply = Box<dyn Fn(&[u8]) + Send + Sync>;

/// Where a flow's answers go (its source, through the listener's
/// socket), and what the flow's timers need.
struct Source {
    reply: Reply,
    /// Milliseconds since the table was made, at the last datagram.
    last: AtomicU64,
    answered: AtomicBool,
    ended: AtomicBool,
    start: Instant,
}

impl Source {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let since = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(since.saturating_sub(self.last.load(Ordering::Relaxed)))
    }
}

impl DatagramSink for Source {
    fn deliver(&self, payload: Bytes) {
        self.answered.store(true, Ordering::Relaxed);
        self.touch();
        (self.reply)(&payload);
    }

    fn finished(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }
}

enum State {
    Opening { queued: Vec<Bytes>, bytes: usize },
    Open(Arc<Flow>),
    Refused { until: Instant },
}

struct Entry {
    state: State,
    source: Arc<Source>,
}

/// The flows of one listener (or SOCKS5 association), by key: the source
/// address of a `-L udp:` listener, the destination of an association.
/// The lock is never held while the session's is wanted by someone else
/// who then waits for this one (sinks only touch atomics).
pub(crate) struct Flows<K> {
    table: Arc<Mutex<Table<K>>>,
    max: usize,
    start: Instant,
}

struct Table<K> {
    flows: HashMap<K, Entry>,
    /// Bytes queued in flows still opening (≤ [`OPENING_TOTAL`]).
    opening: usize,
}

impl<K: std::hash::Hash + Eq> Table<K> {
    /// Forgets flow `key` (its opening queue no longer counts).
    fn remove(&mut self, key: &K) {
        if let Some(e) = self.flows.remove(key) {
            self.opening -= e.state.queued_bytes();
        }
    }
}

impl State {
    fn queued_bytes(&self) -> usize {
        match self {
            State::Opening { bytes, .. } => *bytes,
            _ => 0,
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone + Send + 'static> Flows<K> {
    /// A table of at most `max` flows.
    pub(crate) fn new(max: usize) -> Flows<K> {
        Flows {
            table: Arc::new(Mutex::new(Table {
                flows: HashMap::new(),
                opening: 0,
            })),
            max,
            start: Instant::now(),
        }
    }

    /// One datagram for flow `key`, to `dest` (`udp://host:port`): into
    /// its flow, or opening one on `session()`, whose answers go to
    /// `reply`.
    pub(crate) fn send(
        &self,
        key: K,
        dest: &str,
        payload: Bytes,
        reply: impl FnOnce() -> Reply,
        session: &impl Fn() -> Option<SessionHandle>,
    ) {
        let mut guard = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut *guard;
        if let Some(e) = t.flows.get_mut(&key) {
            if !e.source.ended.load(Ordering::Relaxed) {
                match &mut e.state {
                    State::Open(flow) => {
                        e.source.touch();
                        if let Err(why) = flow.send(payload) {
                            dropped(dest, &format!("{why:?}"));
                        }
                        return;
                    }
                    State::Opening { queued, bytes } => {
                        let n = payload.len();
                        if queued.len() < OPENING_QUEUE
                            && *bytes + n <= OPENING_BYTES
                            && t.opening + n <= OPENING_TOTAL
                        {
                            e.source.touch();
                            *bytes += n;
                            t.opening += n;
                            queued.push(payload);
                        } else {
                            dropped(dest, "its flow is still opening");
                        }
                        return;
                    }
                    State::Refused { until } if Instant::now() < *until => {
                        return dropped(dest, "the destination was refused");
                    }
                    State::Refused { .. } => {}
                }
            }
            // Ended, or refused long enough ago: a new flow.
            t.remove(&key);
        }
        if t.flows.len() >= self.max {
            return dropped(dest, "too many flows");
        }
        if t.opening + payload.len() > OPENING_TOTAL {
            return dropped(dest, "too many datagrams wait for flows to open");
        }
        let Some(session) = session() else {
            return dropped(dest, "no session");
        };
        let new = Arc::new(Source {
            reply: reply(),
            last: AtomicU64::new(0),
            answered: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            start: self.start,
        });
        new.touch();
        t.opening += payload.len();
        let state = State::Opening {
            bytes: payload.len(),
            queued: vec![payload],
        };
        t.flows.insert(
            key.clone(),
            Entry {
                state,
                source: new.clone(),
            },
        );
        drop(guard);
        let (table, dest) = (self.table.clone(), dest.to_owned());
        tokio::spawn(async move {
            let flow = match session.open(&dest).await {
                Ok(o) => o.into_flow(new.clone()).map(Arc::new),
                Err(e) => {
                    if REFUSED.pass("refused UDP flows") {
                        let (dest, why) = (shown(&dest), escaped(&e));
                        tracing::info!(%dest, "UDP flow refused: {why}");
                    }
                    None
                }
            };
            let mut guard = table.lock().unwrap_or_else(|p| p.into_inner());
            let t = &mut *guard;
            // Still the entry this task opens for (not expired meanwhile)?
            let Some(e) = t
                .flows
                .get_mut(&key)
                .filter(|e| Arc::ptr_eq(&e.source, &new))
            else {
                return;
            };
            t.opening -= e.state.queued_bytes();
            let Some(flow) = flow else {
                e.state = State::Refused {
                    until: Instant::now() + REFUSED_HOLD,
                };
                return;
            };
            let queued = match std::mem::replace(&mut e.state, State::Open(flow.clone())) {
                State::Opening { queued, .. } => queued,
                _ => Vec::new(),
            };
            for d in queued {
                if let Err(why) = flow.send(d) {
                    dropped(&dest, &format!("{why:?}"));
                }
            }
        });
    }

    /// Ends flows idle past their timeout, or over at the far side, and
    /// forgets refusals that are old enough.
    pub(crate) fn expire(&self) {
        let now = Instant::now();
        let mut guard = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut *guard;
        let opening = &mut t.opening;
        t.flows.retain(|_, e| {
            let s = &e.source;
            let limit = if s.answered.load(Ordering::Relaxed) {
                FLOW_IDLE_ANSWERED
            } else {
                FLOW_IDLE
            };
            let keep = match e.state {
                State::Refused { until } => now < until,
                // An open that takes longer than the idle limit: the
                // session's open timeout ends it first; the entry goes too.
                _ => !s.ended.load(Ordering::Relaxed) && s.idle() < limit,
            };
            if !keep {
                *opening -= e.state.queued_bytes();
            }
            keep
        });
    }
}

/// `n` bytes fit a frame; else the datagram is dropped (counted).
pub(crate) fn fits(n: usize) -> bool {
    let ok = n <= MAX_DATAGRAM;
    if !ok {
        dropped("", "longer than a frame carries");
    }
    ok
}

/// Counts a dropped datagram (throttled log line).
fn dropped(dest: &str, why: &str) {
    if DROPS.pass("dropped UDP datagrams") {
        tracing::info!(dest = %shown(dest), "dropped a datagram: {why}");
    }
}

/// Kernel buffers asked for a listener's socket (the kernel caps them at
/// `net.core.rmem_max`/`wmem_max`): one socket takes every source's
/// datagrams, and bursts at a gigabit overflow the default 208 KiB while
/// the session is busy. They cost memory only while datagrams wait.
pub const LISTENER_BUFFERS: usize = 4 << 20;

/// Datagrams a listener reads in one call (`recvmmsg`, into buffers of
/// 64 KiB each that live only while it reads: 512 KiB).
const LISTENER_BATCH: usize = 8;
/// Datagrams a listener takes before it lets other tasks run.
const LISTENER_BURST: usize = 64;

/// A UDP socket bound to `addr` (a listener), for the runtime.
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let s = std::net::UdpSocket::bind(addr)?;
    let r = socket2::SockRef::from(&s);
    // Best effort: smaller buffers only lose more under bursts.
    let _ = r.set_recv_buffer_size(LISTENER_BUFFERS);
    let _ = r.set_send_buffer_size(LISTENER_BUFFERS);
    longhaul_carrier::udp_batch::ignore_icmp_resets(&r)?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s)
}

/// Serves one UDP listener until `stop` resolves: a flow to `dest`
/// (`udp://host:port`) per source, on the session `session()` gives
/// (none: the datagram is dropped).
pub(crate) async fn serve(
    sock: UdpSocket,
    dest: String,
    session: impl Fn() -> Option<SessionHandle> + Send + 'static,
    stop: impl std::future::Future<Output = ()>,
) {
    let sock = Arc::new(sock);
    let flows = Flows::new(MAX_FLOWS);
    let mut sweep = tokio::time::interval(SWEEP);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            r = sock.readable() => {
                if r.is_err() {
                    // The runtime is going away.
                    return;
                }
                let mut sources = [None; LISTENER_BATCH];
                // One byte more than a frame holds: a longer datagram is
                // seen as such. Uninitialised, and only for this turn: an
                // idle listener holds no buffer.
                let mut bufs: Vec<Vec<u8>> = (0..LISTENER_BATCH)
                    .map(|_| Vec::with_capacity(MAX_DATAGRAM + 1))
                    .collect();
                let mut taken = 0;
                let mut failed = false;
                while taken < LISTENER_BURST {
                    // Not connected: no ICMP reports come here (without
                    // IP_RECVERR), so a short batch means drained.
                    let n = match udp_batch::try_recv(&sock, &mut bufs, &mut sources, false) {
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            // Out of memory and the like: nothing to read
                            // now; pause rather than spin on it.
                            if DROPS.pass("UDP listener errors") {
                                tracing::warn!("UDP listener: {e}");
                            }
                            failed = true;
                            break;
                        }
                    };
                    taken += n;
                    for (b, from) in bufs.iter().zip(sources).take(n) {
                        let Some(from) = from.filter(|_| fits(b.len())) else {
                            continue;
                        };
                        let payload = Bytes::copy_from_slice(b);
                        let reply = || -> Reply {
                            let sock = sock.clone();
                            // A full socket buffer: lost, as on the network.
                            Box::new(move |d: &[u8]| {
                                let _ = sock.try_send_to(d, from);
                            })
                        };
                        flows.send(from, &dest, payload, reply, &session);
                    }
                    if n < LISTENER_BATCH {
                        // Drained, and the runtime was told.
                        break;
                    }
                }
                drop(bufs);
                if failed {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                } else if taken >= LISTENER_BURST {
                    // A flood must not keep the runtime (the session's
                    // driver, other forwards) from running.
                    tokio::task::yield_now().await;
                }
            }
            _ = sweep.tick() => flows.expire(),
            _ = &mut stop => return,
        }
    }
}
