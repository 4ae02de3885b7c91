//! The session's shared state: the protocol core ([`Mux`]) under one lock,
//! plus what only the runtime has — each stream's wake-ups and inbound
//! queue, the tasks of its pumps, the openers waiting for answers. Every
//! call into the core is followed by [`Shared::dispatch`], which turns the
//! core's events into wake-ups, queued data and spawned work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use longhaul_proto::frame::Reason;
use longhaul_proto::mux::{Event, IncomingOpen, Mux, Refused};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch, Notify};
use tokio::task::AbortHandle;

use crate::config::{Acceptor, OpenRefused, SessionConfig};
use crate::handle::SessionHandle;
use crate::inbound::InQueue;
use crate::stream::{downlink, uplink};

/// What a stream's pumps share with the rest of the session without taking
/// the session lock: their wake-ups and the inbound queue.
#[derive(Default)]
pub(crate) struct StreamIo {
    /// Wakes the uplink: credit arrived, queue room freed, or closing.
    pub up: Notify,
    /// Wakes the downlink: data or EOF queued, or closing.
    pub down: Notify,
    inbox: Mutex<Inbox>,
}

#[derive(Default)]
pub(crate) struct Inbox {
    pub q: InQueue,
    /// Nothing more will be queued; the downlink ends once `q` is written.
    pub closed: bool,
    /// The local socket is full: queue copies, not slices of carrier buffers.
    pub blocked: bool,
}

impl StreamIo {
    pub fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No more inbound data: the downlink writes what it has and ends.
    /// `discard` drops what is queued as well (the stream failed).
    pub fn close_inbox(&self, discard: bool) {
        let mut ib = self.inbox();
        ib.closed = true;
        if discard {
            ib.q = InQueue::default();
        }
        drop(ib);
        self.down.notify_one();
    }
}

/// The runtime's side of one stream.
pub(crate) struct StreamRt {
    pub io: Arc<StreamIo>,
    pub uplink: Option<AbortHandle>,
}

type OpenReply = oneshot::Sender<Result<(), OpenRefused>>;
type BindReply = oneshot::Sender<Result<u16, OpenRefused>>;

pub(crate) struct State {
    pub mux: Mux,
    pub streams: HashMap<u32, StreamRt>,
    /// Openers waiting for the peer's answer.
    pub opens: HashMap<u32, OpenReply>,
    pub binds: HashMap<u32, BindReply>,
    /// DATA may be queued as slices of the carrier's read buffer (the
    /// reader says so before each batch of frames).
    pub may_slice: bool,
    /// `teardown` has run: waiters told, tasks stopping.
    torn_down: bool,
}

pub(crate) struct Shared {
    pub st: Mutex<State>,
    pub wake_writer: Notify,
    pub closed_tx: watch::Sender<Option<String>>,
    /// Set once the carrier writer has ended (the carrier is shut down).
    pub finished_tx: watch::Sender<bool>,
    pub config: SessionConfig,
    pub acceptor: Arc<dyn Acceptor>,
    pub started: Instant,
    pub peer: String,
}

fn refused(r: Refused) -> OpenRefused {
    OpenRefused {
        reason: r.reason,
        description: r.description,
    }
}

impl Shared {
    pub fn new(
        mux: Mux,
        config: SessionConfig,
        acceptor: Arc<dyn Acceptor>,
        peer: String,
    ) -> Shared {
        Shared {
            st: Mutex::new(State {
                mux,
                streams: HashMap::new(),
                opens: HashMap::new(),
                binds: HashMap::new(),
                may_slice: true,
                torn_down: false,
            }),
            wake_writer: Notify::new(),
            closed_tx: watch::channel(None).0,
            finished_tx: watch::channel(false).0,
            config,
            acceptor,
            started: Instant::now(),
            peer,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a task panicked mid-update; the state may be
        // inconsistent, but closing cleanly still needs it.
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// Runs `f` on the protocol core under the session lock, then acts on
    /// what it asked for. The one way tasks other than the reader change the
    /// core.
    pub fn with<R>(self: &Arc<Self>, f: impl FnOnce(&mut Mux, u64) -> R) -> R {
        let mut st = self.lock();
        let r = f(&mut st.mux, self.now_ns());
        self.dispatch(&mut st);
        r
    }

    /// Closes the whole session for a reason of ours (already logged).
    pub fn close(self: &Arc<Self>, why: String) {
        let mut st = self.lock();
        st.mux.close(why);
        self.dispatch_quiet(&mut st);
    }

    /// Acts on everything the core asked for; wakes the writer when it has
    /// something to send. Logs the reason if the core ended the session.
    pub fn dispatch(self: &Arc<Self>, st: &mut State) {
        if let (Some(why), false) = (st.mux.dead(), st.torn_down) {
            tracing::warn!(peer = %self.peer, "closing session: {why}");
        }
        self.dispatch_quiet(st);
    }

    fn dispatch_quiet(self: &Arc<Self>, st: &mut State) {
        while let Some(ev) = st.mux.poll_event() {
            self.on_event(st, ev);
        }
        if let (Some(why), false) = (st.mux.dead().map(str::to_owned), st.torn_down) {
            st.torn_down = true;
            for (_, s) in st.streams.drain() {
                if let Some(a) = s.uplink {
                    a.abort();
                }
                s.io.up.notify_one();
                s.io.close_inbox(false);
            }
            st.opens.clear();
            st.binds.clear();
            self.closed_tx.send_replace(Some(why));
            self.wake_writer.notify_one();
        } else if st.mux.take_new_output() {
            self.wake_writer.notify_one();
        }
    }

    fn on_event(self: &Arc<Self>, st: &mut State, ev: Event) {
        match ev {
            Event::Data { id, payload } => {
                if let Some(s) = st.streams.get(&id) {
                    let mut ib = s.io.inbox();
                    if !ib.closed {
                        // Bounded by the receive window the core checked.
                        let slice = st.may_slice && !ib.blocked;
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
                        st.mux.eof_delivered(id);
                    } else {
                        s.io.down.notify_one();
                    }
                }
                None => st.mux.eof_delivered(id),
            },
            Event::Finished { id, discard } => {
                if let Some(s) = st.streams.remove(&id) {
                    if let Some(a) = s.uplink {
                        a.abort();
                    }
                    s.io.up.notify_one();
                    s.io.close_inbox(discard);
                }
            }
            Event::Writable { id } => {
                if let Some(s) = st.streams.get(&id) {
                    s.io.up.notify_one();
                }
            }
            Event::OpenRequest { open, dest } => self.connect_for_peer(open, dest),
            Event::OpenAnswered { id, result } => {
                let delivered = match st.opens.remove(&id) {
                    Some(tx) => tx.send(result.clone().map_err(refused)).is_ok(),
                    None => false,
                };
                if result.is_err() {
                    st.streams.remove(&id);
                } else if !delivered {
                    // The opener went away meanwhile.
                    st.mux.abandon(id);
                }
            }
            Event::BindRequest {
                request,
                bind,
                dest,
            } => {
                let me = self.clone();
                let handle = SessionHandle {
                    shared: self.clone(),
                };
                let fut = self.acceptor.bind(bind, dest, handle);
                tokio::spawn(async move {
                    let r = fut.await.map_err(|e| Refused::new(e.reason, e.description));
                    let mut st = me.lock();
                    st.mux.answer_bind(request, r);
                    me.dispatch(&mut st);
                });
            }
            Event::BindAnswered { request, result } => {
                if let Some(tx) = st.binds.remove(&request) {
                    let _ = tx.send(result.map_err(refused));
                }
            }
        }
    }

    /// Connects to what the peer asked for (bounded by `open_timeout`),
    /// then answers the OPEN.
    fn connect_for_peer(self: &Arc<Self>, open: IncomingOpen, dest: String) {
        let me = self.clone();
        let fut = self.acceptor.connect(dest.clone());
        let limit = self.config.open_timeout;
        tokio::spawn(async move {
            let r = match tokio::time::timeout(limit, fut).await {
                Ok(r) => r,
                Err(_) => Err(OpenRefused::new(
                    Reason::TTL_EXPIRED,
                    format!("target did not answer within {limit:?}"),
                )),
            };
            let mut guard = me.lock();
            let st = &mut *guard;
            match r {
                Ok(sock) => {
                    if let Some(id) = st.mux.accept_open(open, me.now_ns()) {
                        tracing::debug!(peer = %me.peer, %dest, stream = id, "stream opened by peer");
                        let io = Arc::new(StreamIo::default());
                        st.streams.insert(id, StreamRt { io, uplink: None });
                        me.spawn_pumps(st, id, sock);
                    }
                }
                Err(e) => {
                    tracing::info!(peer = %me.peer, %dest, reason = %e, "stream refused");
                    st.mux
                        .refuse_open(open, Refused::new(e.reason, e.description));
                }
            }
            me.dispatch(st);
        });
    }

    pub fn spawn_pumps(self: &Arc<Self>, st: &mut State, id: u32, sock: TcpStream) {
        let Some(s) = st.streams.get_mut(&id) else {
            return;
        };
        let _ = longhaul_carrier::tune_socket(&sock);
        let (r, w) = sock.into_split();
        let up = tokio::spawn(uplink(self.clone(), id, s.io.clone(), r));
        tokio::spawn(downlink(self.clone(), id, s.io.clone(), w));
        s.uplink = Some(up.abort_handle());
    }
}
