//! What the peer asks for that needs a task of its own: a connection to a
//! target for its OPEN, a listener for its BIND. Started by the carrier
//! reader once the frame is handled; each answers the core when done.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use longhaul_proto::frame::Reason;
use longhaul_proto::mux::{IncomingOpen, Refused};

use crate::config::OpenRefused;
use crate::logs::shown;
use crate::runtime::{SessionHandle, Shared};
use crate::stream::spawn_pumps;

/// What the peer asked for that needs a task: started by the reader
/// (`reader`) once the frame is handled.
pub(crate) enum Work {
    /// Connect to `dest`, then answer the OPEN.
    Connect(IncomingOpen, String),
    /// Listen on `bind` for streams to `dest`, then answer the BIND.
    Bind(u32, String, String),
}

/// Connects to targets that run at once for one session's OPENs; the rest
/// wait in [`Connects`], in order. A burst of thousands of OPENs then
/// holds a queue entry each, not a task with a connect in flight: those
/// left allocator pages scattered long after the burst (docs/BENCHMARKS.md,
/// "Fourth part"), and they raced each other to the target's backlog.
pub(crate) const CONNECTS_AT_ONCE: usize = 64;

/// A connect still unanswered after this long stops counting under
/// [`CONNECTS_AT_ONCE`] (its task hands its place to a new one and ends
/// with that connect, or with the session). So OPENs to targets that
/// never answer drain at 256 a second: an OPEN waits behind them only
/// while more keep coming (7 680 outstanding fill its 30 s; `max_streams`
/// is 16 384). A connect on a LAN or a WAN path answers well within it,
/// so a burst stays bounded. At most 256 connects turn slow per second,
/// each ending within `open_timeout`: ≤ 7 680 per session.
const SLOW_CONNECT: Duration = Duration::from_millis(250);

/// Taken off the `open_timeout` of an OPEN that waited in the queue, so
/// its answer reaches the peer before the peer's own timeout gives up.
const ANSWER_MARGIN: Duration = Duration::from_secs(2);

/// Destinations queued at once, in bytes: a destination may be as long as
/// a frame, and an OPEN waiting here is not yet refused by the rules.
const QUEUED_BYTES: usize = 1 << 20;

/// The peer's OPENs waiting for one of the connect tasks. At most
/// `max_streams` entries (the core counts an OPEN until it is answered)
/// of ≈ 56 B, plus ≤ [`QUEUED_BYTES`] of destinations. Each is answered
/// within `open_timeout` of its arrival, queueing included.
#[derive(Default)]
pub(crate) struct Connects {
    running: usize,
    bytes: usize,
    waiting: VecDeque<Queued>,
}

struct Queued {
    open: IncomingOpen,
    dest: String,
    since: Instant,
}

impl Connects {
    /// The session ended: nobody is left to answer.
    pub(crate) fn clear(&mut self) {
        self.waiting = VecDeque::new();
        self.bytes = 0;
    }
}

/// Connects to what the peer asked for, then answers its OPEN; waits its
/// turn when [`CONNECTS_AT_ONCE`] connects run.
pub(crate) fn connect_for_peer(shared: &Arc<Shared>, open: IncomingOpen, dest: String) {
    if dest.starts_with("udp://") && shared.config.mode == crate::Mode::Jmux {
        // JMUX has no datagrams: a flow could never carry one.
        let refused = Refused::new(Reason::NOT_ALLOWED, "UDP needs longhaul's native mode");
        return shared.with(|m, _| m.refuse_open(open, refused));
    }
    let mut st = shared.lock();
    if st.connects.bytes + dest.len() > QUEUED_BYTES {
        drop(st);
        let why = "too many opens waiting to connect";
        crate::logs::log_refused(&shared.peer, &dest, &why);
        return shared.with(|m, _| m.refuse_open(open, Refused::new(Reason::GENERAL_FAILURE, why)));
    }
    st.connects.bytes += dest.len();
    st.connects.waiting.push_back(Queued {
        open,
        dest,
        since: Instant::now(),
    });
    if st.connects.running < CONNECTS_AT_ONCE {
        st.connects.running += 1;
        drop(st);
        tokio::spawn(run_connects(shared.clone()));
    }
}

/// One of the session's connect tasks: answers queued OPENs one after
/// another until none waits. Its place in `running` is given back under
/// the same lock that finds the queue empty, so an OPEN queued meanwhile
/// always finds a task. Boxed: it starts tasks like itself.
fn run_connects(me: Arc<Shared>) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let mut slot = ConnectSlot(Some(me.clone()));
        loop {
            let Queued { open, dest, since } = {
                let mut st = me.lock();
                if st.conn().mux().dead().is_some() {
                    st.connects.clear();
                }
                let Some(q) = st.connects.waiting.pop_front() else {
                    // Empty after a burst: let its table go too.
                    st.connects.clear();
                    st.connects.running -= 1;
                    slot.0 = None;
                    return;
                };
                st.connects.bytes -= q.dest.len();
                q
            };
            let connect = connect_one(&me, open, dest, since.elapsed());
            tokio::pin!(connect);
            tokio::select! {
                () = &mut connect => continue,
                () = tokio::time::sleep(SLOW_CONNECT) => {}
            }
            // Slow: the place goes to a new task; this one ends with its connect.
            slot.0 = None;
            {
                let mut st = me.lock();
                if st.connects.waiting.is_empty() {
                    st.connects.running -= 1;
                } else {
                    drop(st);
                    tokio::spawn(run_connects(me.clone()));
                }
            }
            let mut closed = me.closed_tx.subscribe();
            tokio::select! {
                () = connect => {}
                _ = closed.wait_for(|c| c.is_some()) => {}
            }
            return;
        }
    })
}

/// A connect task's place, handed to a new task if the task ends without
/// giving it back (a panic in a connect): the queue still drains.
struct ConnectSlot(Option<Arc<Shared>>);

impl Drop for ConnectSlot {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(run_connects(shared))),
                Err(_) => shared.lock().connects.running -= 1,
            }
        }
    }
}

/// Connects within what is left of the OPEN's `open_timeout` after it
/// `waited` in the queue, then answers it.
async fn connect_one(me: &Arc<Shared>, open: IncomingOpen, dest: String, waited: Duration) {
    let limit = me.config.open_timeout;
    let queued = waited >= SLOW_CONNECT;
    let left = if queued {
        limit.saturating_sub(waited + ANSWER_MARGIN)
    } else {
        limit
    };
    let expired = || {
        let why = if queued {
            format!(
                " ({:.1} s of them waiting to connect)",
                waited.as_secs_f32()
            )
        } else {
            String::new()
        };
        OpenRefused::new(
            Reason::TTL_EXPIRED,
            format!("target did not answer within {limit:?}{why}"),
        )
    };
    let r = if left.is_zero() {
        Err(expired())
    } else {
        match tokio::time::timeout(left, me.acceptor.connect(dest.clone())).await {
            Ok(r) => r,
            Err(_) => Err(expired()),
        }
    };
    match r {
        Ok(sock) => {
            if let Some((id, _)) = me.accepted(open, &dest) {
                tracing::debug!(peer = %me.peer, dest = %shown(&dest), stream = id, "stream opened by peer");
                spawn_pumps(me, id, sock);
            }
        }
        Err(e) => {
            // Throttled for the whole process: the acceptor logs each
            // session's refusals (throttled too) with their reasons.
            crate::logs::log_refused(&me.peer, &dest, &e);
            me.with(|m, _| m.refuse_open(open, Refused::new(e.reason, e.description)));
        }
    }
}

/// Listens where the peer asked (through the acceptor's rules), then
/// answers its BIND.
pub(crate) fn serve_bind(shared: &Arc<Shared>, request: u32, bind: String, dest: String) {
    let me = shared.clone();
    let handle = SessionHandle {
        shared: shared.clone(),
    };
    let fut = shared.acceptor.bind(bind, dest, handle);
    tokio::spawn(async move {
        let r = fut.await.map_err(|e| Refused::new(e.reason, e.description));
        me.with(|m, _| m.answer_bind(request, r));
    });
}

/// Starts the work the peer's frames asked for (a reader hands it over once
/// the frames are handled and the session lock is let go).
pub(crate) fn start_work(shared: &Arc<Shared>, work: Vec<Work>) {
    for w in work {
        match w {
            Work::Connect(open, dest) => connect_for_peer(shared, open, dest),
            Work::Bind(request, bind, dest) => serve_bind(shared, request, bind, dest),
        }
    }
}
