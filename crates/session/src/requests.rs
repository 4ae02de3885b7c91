//! What the peer asks for that needs a task of its own: a connection to a
//! target for its OPEN, a listener for its BIND. Started by the carrier
//! reader once the frame is handled; each answers the core when done.

use std::collections::VecDeque;
use std::sync::Arc;

use longhaul_proto::frame::Reason;
use longhaul_proto::mux::{IncomingOpen, Refused};

use crate::config::OpenRefused;
use crate::logs::shown;
use crate::runtime::{SessionHandle, Shared, Work};
use crate::stream::spawn_pumps;

/// Connects to targets that run at once for one session's OPENs; the rest
/// wait in [`Connects`], in order. A burst of thousands of OPENs then
/// holds a queue entry each (≈ 60 B), not a task with a connect in
/// flight: those left allocator pages scattered long after the burst
/// (docs/BENCHMARKS.md, "10 000 idle streams"), and they raced each other
/// to the target's listen backlog.
pub(crate) const CONNECTS_AT_ONCE: usize = 64;

/// The peer's OPENs waiting for one of the [`CONNECTS_AT_ONCE`] connect
/// tasks. Bounded by `max_streams`: the core counts an OPEN until it is
/// answered. An entry's `open_timeout` starts when its connect does; the
/// peer's own timeout bounds how long it waits for the answer.
#[derive(Default)]
pub(crate) struct Connects {
    running: usize,
    waiting: VecDeque<(IncomingOpen, String)>,
}

/// Connects to what the peer asked for (bounded by `open_timeout`), then
/// answers its OPEN; waits its turn when [`CONNECTS_AT_ONCE`] connects run.
pub(crate) fn connect_for_peer(shared: &Arc<Shared>, open: IncomingOpen, dest: String) {
    if dest.starts_with("udp://") && shared.config.mode == crate::Mode::Jmux {
        // JMUX has no datagrams: a flow could never carry one.
        let refused = Refused::new(Reason::NOT_ALLOWED, "UDP needs longhaul's native mode");
        return shared.with(|m, _| m.refuse_open(open, refused));
    }
    {
        let mut st = shared.lock();
        st.connects.waiting.push_back((open, dest));
        if st.connects.running >= CONNECTS_AT_ONCE {
            return;
        }
        st.connects.running += 1;
    }
    tokio::spawn(run_connects(shared.clone()));
}

/// One of the session's connect tasks: answers queued OPENs one after
/// another until none waits. Its place in `running` is given back under
/// the same lock that finds the queue empty, so an OPEN queued meanwhile
/// always finds a task.
async fn run_connects(me: Arc<Shared>) {
    let mut slot = ConnectSlot(Some(me.clone()));
    loop {
        let (open, dest) = {
            let mut st = me.lock();
            if st.conn().mux().dead().is_some() {
                // Nobody is left to answer.
                st.connects.waiting.clear();
            }
            match st.connects.waiting.pop_front() {
                Some(next) => next,
                None => {
                    st.connects.running -= 1;
                    slot.0 = None;
                    return;
                }
            }
        };
        connect_one(&me, open, dest).await;
    }
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

async fn connect_one(me: &Arc<Shared>, open: IncomingOpen, dest: String) {
    let limit = me.config.open_timeout;
    let r = match tokio::time::timeout(limit, me.acceptor.connect(dest.clone())).await {
        Ok(r) => r,
        Err(_) => Err(OpenRefused::new(
            Reason::TTL_EXPIRED,
            format!("target did not answer within {limit:?}"),
        )),
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
