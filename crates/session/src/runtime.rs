//! The session's shared state: the protocol ([`Connection`]: multiplexer
//! and link layer) under one lock, plus what only the runtime has — each
//! stream's wake-ups and inbound queue, the tasks of its pumps, the
//! openers waiting for answers. Every call into the core is followed by
//! [`Shared::dispatch`], which turns the core's events into wake-ups,
//! queued data and spawned work.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use longhaul_proto::connection::{Connection, Received};
use longhaul_proto::mux::{Event, IncomingOpen, Mux, Refused};
use longhaul_proto::StreamMap;
use tokio::sync::{oneshot, watch, Notify};

use crate::config::DatagramSink;
use crate::config::{BoxFuture, OpenRefused, SessionConfig};
use crate::driver::{AbortHandle, Driver, Task};
use crate::local::LocalStream;
use crate::requests::Work;
use crate::stream_io::StreamIo;
use crate::tasks::CarrierSlot;
use longhaul_proto::frame::Reason;
use longhaul_proto::outframe::OutFrame;

/// What a session does when the peer opens a stream or asks for a reverse
/// listener. The server answers with its allow rules; the client allows only
/// the targets of its own `-R` forwards.
pub trait Acceptor: Send + Sync + 'static {
    /// Connects to `dest` (`tcp://host:port`, or a service of this
    /// process) for a stream the peer opened.
    fn connect(&self, dest: String) -> BoxFuture<Result<LocalStream, OpenRefused>>;

    /// Starts listening on `bind` and opening streams to `dest` through
    /// `session` for every accepted connection. Returns the bound port.
    fn bind(
        &self,
        bind: String,
        dest: String,
        session: SessionHandle,
    ) -> BoxFuture<Result<u16, OpenRefused>> {
        let _ = (bind, dest, session);
        Box::pin(async {
            Err(OpenRefused::new(
                Reason::NOT_ALLOWED,
                "reverse forwards are not accepted here",
            ))
        })
    }
}

/// A cheap, clonable handle to a running session (its methods are in
/// `handle`).
#[derive(Clone)]
pub struct SessionHandle {
    pub(crate) shared: Arc<Shared>,
}

/// The runtime's side of one stream.
pub(crate) struct StreamRt {
    pub io: Arc<StreamIo>,
    /// The task running the uplink: the stream's relay (both pumps, see
    /// `stream`) when `relay`, else a task of the uplink's own.
    pub uplink: Option<AbortHandle>,
    pub relay: bool,
    /// Where it goes, and which side opened it (for `status`).
    pub dest: Arc<str>,
    pub opened_here: bool,
    pub since: Instant,
    /// The local socket's other end: the application (a stream opened
    /// here) or the target (one the peer opened).
    pub local: Option<String>,
    /// Where its local socket is.
    pub socket: Socket,
    /// A UDP flow: where the peer's datagrams go.
    pub flow: Option<Arc<dyn DatagramSink>>,
}

impl StreamRt {
    /// The stream is closed: its uplink stops. A relay's downlink goes on
    /// writing what is left, so the relay is woken to look, not stopped.
    pub fn stop_uplink(&self) {
        self.io.stop_uplink();
        if let Some(task) = &self.uplink {
            match self.relay {
                true => task.wake(),
                false => task.abort(),
            }
        }
    }
}

/// A stream's local socket, as far as its pumps go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Socket {
    /// Not attached yet.
    NotYet,
    /// Its pumps run.
    Open,
    /// Its downlink ended (the socket is closed or going).
    Closed,
}

type OpenReply = oneshot::Sender<Result<(), OpenRefused>>;
type BindReply = oneshot::Sender<Result<u16, OpenRefused>>;

pub(crate) struct State {
    /// The protocol: multiplexer and link layer.
    conn: Connection,
    /// Boxed: a table of 10 000 idle streams holds about 1.6 slots per
    /// stream, and an empty slot costs a pointer rather than a `StreamRt`.
    pub(crate) streams: StreamMap<Box<StreamRt>>,
    /// Openers waiting for the peer's answer.
    opens: StreamMap<OpenReply>,
    binds: StreamMap<BindReply>,
    work: Vec<Work>,
    /// The peer's OPENs waiting for a connect task (`requests`).
    pub(crate) connects: crate::requests::Connects,
    /// `teardown` has run: waiters told, tasks stopping.
    torn_down: bool,
    /// The core found the carrier silent (resumable session): the
    /// housekeeping task drops it.
    silent: Option<std::time::Duration>,
    /// Finished streams whose downlink still writes their last bytes (or
    /// waits to reset): told when the session dies, like live streams.
    /// Bounded by `max_streams` (the core keeps their slots).
    pub(crate) lingering: StreamMap<Arc<StreamIo>>,
    /// Streams that finished before their local socket was attached:
    /// the attach still delivers what they received, and their end.
    pub(crate) unattached: StreamMap<Arc<StreamIo>>,
    /// The tasks of the carrier or lanes now running (see `link`), under
    /// the same lock as the connection that says which are current.
    pub(crate) slot: CarrierSlot,
}

impl State {
    /// The protocol, to read (figures for `status`).
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

/// The session's clock (nanoseconds since it started), handed to calls
/// into the core and read only by those that need the time: most calls on
/// a message's path do not, and a clock read is a measurable part of them.
#[derive(Clone, Copy)]
pub(crate) struct Clock<'a>(&'a Instant);

impl Clock<'_> {
    pub fn ns(self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

pub(crate) struct Shared {
    pub st: Mutex<State>,
    /// Both sides offered resume: the connection has a link layer.
    pub resumable: bool,
    /// `true` while the session has no carrier (waiting for a resume).
    pub detached_tx: watch::Sender<bool>,
    /// Several lanes (a striped session).
    pub striped: bool,
    /// Lanes running now (striped sessions).
    pub lanes_tx: watch::Sender<usize>,
    /// One attach (resume) at a time.
    pub attach_lock: tokio::sync::Mutex<()>,
    /// The peer ended the session on purpose (GOODBYE).
    pub peer_goodbye: std::sync::atomic::AtomicBool,
    /// This side is draining (see `SessionHandle::drain`).
    pub drain_tx: watch::Sender<bool>,
    /// The peer is draining: its reason.
    pub peer_drain_tx: watch::Sender<Option<String>>,
    /// Client side: the server's instance name (see `SessionHandle::instance`).
    pub instance: std::sync::OnceLock<String>,
    pub wake_writer: Notify,
    /// Set by the timer when the session went quiet (it then stops
    /// sampling the path); cleared, and the timer woken (`timer_woken`),
    /// as soon as data moves again ([`Shared::moves_again`]).
    pub quiet: std::sync::atomic::AtomicBool,
    pub timer_woken: Notify,
    /// An OPEN or BIND of ours now waits for its answer: the timer, which
    /// may sleep until the next keepalive (or for ever, without one), looks
    /// at the connection's deadlines again.
    pub deadline_added: Notify,
    pub closed_tx: watch::Sender<Option<String>>,
    /// Set once the carrier writer has ended (the carrier is shut down).
    pub finished_tx: watch::Sender<bool>,
    pub config: SessionConfig,
    pub acceptor: Arc<dyn Acceptor>,
    pub started: Instant,
    pub peer: String,
    /// Times a stream had data to send and no credit from the peer.
    pub window_stalls: std::sync::atomic::AtomicU64,
    /// Runs the session's tasks (carrier, lanes, pumps, timer).
    driver: Driver,
}

fn refused(r: Refused) -> OpenRefused {
    OpenRefused {
        reason: r.reason,
        description: r.description,
    }
}

impl Shared {
    pub fn new(
        conn: Connection,
        config: SessionConfig,
        acceptor: Arc<dyn Acceptor>,
        peer: String,
    ) -> Shared {
        Shared {
            striped: conn.is_striped(),
            resumable: conn.link().is_some(),
            lanes_tx: watch::channel(0).0,
            detached_tx: watch::channel(false).0,
            attach_lock: tokio::sync::Mutex::new(()),
            peer_goodbye: std::sync::atomic::AtomicBool::new(false),
            drain_tx: watch::channel(false).0,
            peer_drain_tx: watch::channel(None).0,
            instance: std::sync::OnceLock::new(),
            st: Mutex::new(State {
                conn,
                streams: Default::default(),
                opens: Default::default(),
                binds: Default::default(),
                work: Vec::new(),
                connects: Default::default(),
                torn_down: false,
                silent: None,
                lingering: Default::default(),
                unattached: Default::default(),
                slot: CarrierSlot::default(),
            }),
            wake_writer: Notify::new(),
            quiet: std::sync::atomic::AtomicBool::new(false),
            timer_woken: Notify::new(),
            deadline_added: Notify::new(),
            closed_tx: watch::channel(None).0,
            finished_tx: watch::channel(false).0,
            config,
            acceptor,
            started: Instant::now(),
            window_stalls: Default::default(),
            peer,
            driver: Driver::start(),
        }
    }

    /// Runs `fut` as one of the session's tasks, in its driver.
    pub fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) -> Task {
        self.driver.spawn(fut)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a task panicked mid-update; the state may be
        // inconsistent, but closing cleanly still needs it.
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session is over.
    pub fn is_dead(&self) -> bool {
        self.lock().conn.mux().dead().is_some()
    }

    pub fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    fn clock(&self) -> Clock<'_> {
        Clock(&self.started)
    }

    /// Runs `f` on the protocol core under the session lock, then acts on
    /// what it asked for. The one way tasks other than the reader change the
    /// core.
    pub fn with<R>(self: &Arc<Self>, f: impl FnOnce(&mut Mux, Clock) -> R) -> R {
        let mut st = self.lock();
        let r = f(st.conn.mux_mut(), self.clock());
        self.dispatch(&mut st);
        r
    }

    /// Asks the multiplexer something that changes nothing the runtime acts
    /// on (no event, no output): under the lock, without the clock and
    /// without a dispatch, since a busy stream asks before every read.
    pub fn peek<R>(&self, f: impl FnOnce(&mut Mux) -> R) -> R {
        f(self.lock().conn.mux_mut())
    }

    /// Closes the whole session for a reason of ours (already logged).
    pub fn close(self: &Arc<Self>, why: String) {
        let mut st = self.lock();
        st.conn.mux_mut().close(why);
        self.dispatch_quiet(&mut st);
    }

    /// Acts on everything the core asked for; wakes the writer when it has
    /// something to send. Logs the reason if the core ended the session.
    pub fn dispatch(self: &Arc<Self>, st: &mut State) {
        if let (Some(why), false) = (st.conn.mux_mut().dead(), st.torn_down) {
            tracing::warn!(peer = %self.peer, "closing session: {why}");
        }
        self.dispatch_quiet(st);
    }

    pub(crate) fn dispatch_quiet(self: &Arc<Self>, st: &mut State) {
        while let Some(ev) = st.conn.mux_mut().poll_event() {
            self.on_event(st, ev);
        }
        if let (Some(why), false) = (st.conn.mux_mut().dead().map(str::to_owned), st.torn_down) {
            st.torn_down = true;
            for (_, s) in st.streams.drain() {
                s.stop_uplink();
                if let Some(sink) = s.flow {
                    sink.finished();
                }
                s.io.abort_inbox();
            }
            for (_, io) in st.lingering.drain().chain(st.unattached.drain()) {
                io.abort_inbox();
            }
            st.opens.clear();
            st.binds.clear();
            st.connects.clear();
            self.closed_tx.send_replace(Some(why));
            self.wake_writer.notify_one();
            return;
        }
        crate::link::send_path_datagrams(st, self.now_ns());
        if st.conn.mux_mut().take_new_output() {
            self.wake_writer.notify_one();
        }
    }

    fn on_event(self: &Arc<Self>, st: &mut State, ev: Event) {
        match ev {
            Event::Data { id, payload } => {
                // A flow carries datagrams only: DATA for one is dropped
                // (its window is never given back, so a peer that sends it
                // anyway stops at the window).
                if let Some(s) = st.streams.get(&id).filter(|s| s.flow.is_none()) {
                    let mut ib = s.io.inbox();
                    if !ib.closed {
                        // Bounded by the receive window the core checked.
                        let slice = st.conn.may_slice() && !ib.blocked;
                        ib.q.push(payload, slice);
                        drop(ib);
                        s.io.down.notify_one();
                    }
                }
            }
            Event::Eof { id } => match st.streams.get(&id) {
                Some(s) => {
                    let closed = {
                        let mut ib = s.io.inbox();
                        ib.q.eof = true;
                        ib.closed
                    };
                    if closed {
                        st.conn.mux_mut().eof_delivered(id);
                    } else {
                        s.io.down.notify_one();
                    }
                }
                None => st.conn.mux_mut().eof_delivered(id),
            },
            Event::Finished {
                id,
                discard,
                reset,
                sent,
                received,
            } => {
                if let Some(s) = st.streams.remove(&id) {
                    tracing::debug!(
                        peer = %self.peer,
                        stream = id,
                        dest = %crate::logs::shown(s.dest.as_ref()),
                        sent,
                        received,
                        secs = s.since.elapsed().as_secs_f64(),
                        reset,
                        "stream closed"
                    );
                    s.stop_uplink();
                    if let Some(sink) = s.flow {
                        // A flow has no socket of its own to drain.
                        sink.finished();
                        return;
                    }
                    if st.conn.mux_mut().dead().is_some() {
                        s.io.abort_inbox();
                    } else {
                        s.io.close_inbox(discard, reset);
                        match (discard, s.socket) {
                            (false, Socket::Open) => {
                                st.lingering.insert(id, s.io);
                            }
                            (false, Socket::NotYet) => {
                                st.unattached.insert(id, s.io);
                            }
                            _ => {}
                        }
                    }
                }
            }
            Event::Datagram { id, payload } => {
                if let Some(sink) = st.streams.get(&id).and_then(|s| s.flow.as_ref()) {
                    sink.deliver(payload);
                }
            }
            Event::Writable { id } => {
                if let Some(s) = st.streams.get(&id) {
                    s.io.up.notify_one();
                }
            }
            Event::OpenRequest { open, dest } => st.work.push(Work::Connect(open, dest)),
            Event::OpenAnswered { id, result } => {
                let delivered = match st.opens.remove(&id) {
                    Some(tx) => tx.send(result.clone().map_err(refused)).is_ok(),
                    None => false,
                };
                if result.is_err() {
                    st.streams.remove(&id);
                } else if !delivered {
                    // The opener went away meanwhile.
                    st.conn.mux_mut().abandon(id);
                }
            }
            Event::BindRequest {
                request,
                bind,
                dest,
            } => st.work.push(Work::Bind(request, bind, dest)),
            Event::BindAnswered { request, result } => {
                if let Some(tx) = st.binds.remove(&request) {
                    let _ = tx.send(result.map_err(refused));
                }
            }
            Event::CarrierSilent { silent } => st.silent = Some(silent),
            Event::RefusedOpen { dest, why } => crate::logs::log_refused(&self.peer, &dest, &why),
            Event::PeerDraining { reason } => {
                tracing::info!(
                    peer = %self.peer,
                    reason = %crate::logs::escaped(&reason),
                    "the peer is draining: it ends this session once its streams are done"
                );
                self.peer_drain_tx.send_replace(Some(reason));
            }
        }
    }

    /// Runs `f` (input from a carrier) on the connection under the session
    /// lock, then acts on its events; returns what it said and the work
    /// the peer's frames asked for.
    pub fn input(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Connection, u64) -> Received,
    ) -> (Received, Vec<Work>) {
        let mut st = self.lock();
        let r = f(&mut st.conn, self.now_ns());
        if r == Received::Ended && st.conn.peer_goodbye() && !st.torn_down {
            tracing::info!(peer = %self.peer, "peer ended the session");
            self.peer_goodbye
                .store(true, std::sync::atomic::Ordering::Relaxed);
            self.dispatch_quiet(&mut st);
        } else {
            // A violation is logged by `dispatch`, with its reason.
            self.dispatch(&mut st);
        }
        (r, std::mem::take(&mut st.work))
    }

    /// Runs `f` on the whole connection (multiplexer and link layer) under
    /// the session lock, then acts on its events.
    pub fn with_conn<R>(self: &Arc<Self>, f: impl FnOnce(&mut Connection, Clock) -> R) -> R {
        let mut st = self.lock();
        let r = f(&mut st.conn, self.clock());
        self.dispatch(&mut st);
        r
    }

    /// Like [`Shared::with_conn`], without logging the session's end (the
    /// caller says why).
    pub fn with_conn_quiet<R>(self: &Arc<Self>, f: impl FnOnce(&mut Connection, Clock) -> R) -> R {
        let mut st = self.lock();
        let r = f(&mut st.conn, self.clock());
        self.dispatch_quiet(&mut st);
        r
    }

    /// `n` bytes at the front of `batch` were written to the single
    /// carrier (the connection records frames for a replay as they start).
    pub fn written(&self, batch: &mut std::collections::VecDeque<OutFrame>, n: usize) {
        self.lock().conn.on_written(batch, n);
    }

    /// Opens a stream: registers its runtime side and the opener's reply.
    pub fn open_stream(
        self: &Arc<Self>,
        dest: &str,
    ) -> Result<(u32, oneshot::Receiver<Result<(), OpenRefused>>), OpenRefused> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.lock();
        let id = st
            .conn
            .mux_mut()
            .open(dest, self.now_ns())
            .map_err(refused)?;
        st.opens.insert(id, tx);
        self.deadline_added_if_quiet();
        st.streams.insert(
            id,
            Box::new(StreamRt {
                io: Arc::new(StreamIo::default()),
                uplink: None,
                relay: false,
                dest: dest.into(),
                opened_here: true,
                since: Instant::now(),
                local: None,
                socket: Socket::NotYet,
                flow: None,
            }),
        );
        self.dispatch(&mut st);
        Ok((id, rx))
    }

    /// The opener of `id` stopped waiting.
    pub fn give_up_open(self: &Arc<Self>, id: u32) {
        let mut st = self.lock();
        st.opens.remove(&id);
        st.conn.mux_mut().abandon(id);
        self.dispatch(&mut st);
    }

    /// Asks the peer for a reverse listener; the answer comes on the receiver.
    pub fn bind_request(
        self: &Arc<Self>,
        bind: &str,
        dest: &str,
    ) -> Result<oneshot::Receiver<Result<u16, OpenRefused>>, OpenRefused> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.lock();
        let request = st
            .conn
            .mux_mut()
            .bind(bind, dest, self.now_ns())
            .map_err(refused)?;
        st.binds.insert(request, tx);
        self.deadline_added_if_quiet();
        self.dispatch(&mut st);
        Ok(rx)
    }

    /// A stream the peer opened, accepted: its runtime side.
    pub fn accepted(
        self: &Arc<Self>,
        open: IncomingOpen,
        dest: &str,
    ) -> Option<(u32, Arc<StreamIo>)> {
        let mut st = self.lock();
        let id = st.conn.mux_mut().accept_open(open, self.now_ns());
        let r = id.map(|id| {
            let io = Arc::new(StreamIo::default());
            st.streams.insert(
                id,
                Box::new(StreamRt {
                    io: io.clone(),
                    uplink: None,
                    relay: false,
                    dest: dest.into(),
                    opened_here: false,
                    since: Instant::now(),
                    local: None,
                    socket: Socket::NotYet,
                    flow: None,
                }),
            );
            (id, io)
        });
        self.dispatch(&mut st);
        r
    }

    /// The carrier was found silent since the last call: for how long.
    pub fn take_silent(&self) -> Option<std::time::Duration> {
        self.lock().silent.take()
    }
}
