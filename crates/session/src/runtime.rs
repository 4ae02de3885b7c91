//! Session state, the carrier reader/writer and the public handle.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use longhaul_carrier::{BoxRead, BoxWrite, Carrier, PathProbe, UrgentSend};
use longhaul_proto::drr::Drr;
use longhaul_proto::frame::{self, DecodeLimits, Frame, Reason, MAX_DATA_PAYLOAD};
use longhaul_proto::handshake::{self, Hello, HELLO_LEN};
use longhaul_proto::window::{Budget, RecvWindow, SendCredit, WindowConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::AbortHandle;

use crate::outframe::OutFrame;
use crate::stream::{downlink, uplink, Inbound};

/// Largest batch the writer hands to one vectored write.
const WRITE_BATCH_BYTES: usize = 1024 * 1024;
/// Batch size while the carrier is backed up (its last write was partial):
/// frames taken out of the scheduler can no longer be overtaken, so take
/// only what is about to fit.
const BACKLOG_BATCH_BYTES: usize = 64 * 1024;
/// Largest number of buffers in one vectored write (well under IOV_MAX).
const MAX_IOV: usize = 64;
/// Carrier read buffer size. DATA payloads are slices of it, so one buffer
/// lives until its last payload is delivered (bounded by the windows).
const READ_CHUNK: usize = 512 * 1024;
/// Smallest window granted to a new stream when the budget is spent.
const MIN_WINDOW: u64 = 16 * 1024;
/// Reverse-forward listeners one session may ask for.
const MAX_BINDS: usize = 256;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Framing on the carrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// longhaul's own: a hello, then JMUX messages plus extensions.
    Native,
    /// Plain JMUX, no hello, no extensions: interoperates with jetsocat.
    Jmux,
}

/// Session limits and tuning. Every queue a session keeps is bounded by one
/// of these.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub mode: Mode,
    /// Receive windows: initial size and per-stream cap.
    pub window: WindowConfig,
    /// Sum of all receive windows of the session (bytes the peer may have in
    /// flight towards us). Default 512 MiB.
    pub budget: u64,
    /// Streams open at once, including ones still connecting. Default 16 384.
    pub max_streams: usize,
    /// Largest frame we accept (≤ 65535).
    pub max_frame: u16,
    /// Bytes read from one local socket and waiting for the carrier.
    /// Default 512 KiB.
    pub send_queue: usize,
    /// Bytes of control messages waiting for the carrier before the peer is
    /// judged to be flooding us without reading. Default 4 MiB.
    pub control_limit: usize,
    /// PING interval in native mode. Default 10 s.
    pub keepalive: Duration,
    /// Nothing heard for this long: the peer is dead. Default 45 s.
    pub dead_after: Duration,
    /// Time allowed for the hello. Default 10 s.
    pub handshake_timeout: Duration,
    /// Time allowed for an OPEN to be answered. Default 30 s.
    pub open_timeout: Duration,
    /// Close the session after this long with no stream open and no data
    /// moving. Default: never (a client has no reconnect yet, so an idle
    /// `-L` would otherwise be cut).
    pub idle_timeout: Option<Duration>,
    /// Lower bound on the RTT used to decide window growth, so that windows
    /// still grow on sub-millisecond paths where the pipeline, not the wire,
    /// holds the bytes in flight. Default 1 ms.
    pub rtt_floor: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            mode: Mode::Native,
            window: WindowConfig::default(),
            budget: 512 * 1024 * 1024,
            max_streams: 16_384,
            max_frame: u16::MAX,
            send_queue: 512 * 1024,
            control_limit: 4 * 1024 * 1024,
            keepalive: Duration::from_secs(10),
            dead_after: Duration::from_secs(45),
            handshake_timeout: Duration::from_secs(10),
            open_timeout: Duration::from_secs(30),
            idle_timeout: None,
            rtt_floor: Duration::from_millis(1),
        }
    }
}

/// Why a stream (or a reverse bind) could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRefused {
    pub reason: Reason,
    pub description: String,
}

impl OpenRefused {
    pub fn new(reason: Reason, description: impl Into<String>) -> OpenRefused {
        OpenRefused {
            reason,
            description: description.into(),
        }
    }
}

impl std::fmt::Display for OpenRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.description.is_empty() {
            write!(f, "{}", self.reason)
        } else {
            write!(f, "{}: {}", self.reason, self.description)
        }
    }
}

impl std::error::Error for OpenRefused {}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("carrier I/O failed during the hello: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Hello(#[from] handshake::HelloError),
    #[error("peer did not complete the hello within {0:?}")]
    HelloTimeout(Duration),
}

/// What a session does when the peer opens a stream or asks for a reverse
/// listener. The server answers with its allow rules; the client allows only
/// the targets of its own `-R` forwards.
pub trait Acceptor: Send + Sync + 'static {
    /// Connects to `dest` (`tcp://host:port`) for a stream the peer opened.
    fn connect(&self, dest: String) -> BoxFuture<Result<TcpStream, OpenRefused>>;

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

/// A snapshot of a session's counters.
#[derive(Debug, Clone, Default)]
pub struct SessionStats {
    pub streams: usize,
    pub budget_used: u64,
    pub rtt: Duration,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

pub(crate) struct StreamEntry {
    /// The peer's id for this stream (valid once open).
    pub remote: u32,
    /// Waiting for OPEN_SUCCESS/FAILURE; the opener's reply channel.
    pub opening: Option<oneshot::Sender<Result<(), OpenRefused>>>,
    /// We stopped waiting for an OPEN answer: close the stream if it succeeds.
    pub abandoned: bool,
    pub credit: SendCredit,
    pub max_packet: usize,
    /// Wakes the uplink: credit arrived, queue room freed, or closing.
    pub wake: Arc<Notify>,
    pub recv: RecvWindow,
    /// Budget bytes held by this stream's receive window.
    pub reserved: u64,
    /// Queue to the downlink; `None` once the stream is closing.
    pub inbound: Option<mpsc::UnboundedSender<Inbound>>,
    pub uplink: Option<AbortHandle>,
    pub eof_sent: bool,
    pub eof_recv: bool,
    pub eof_delivered: bool,
    pub close_sent: bool,
    pub close_recv: bool,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub credit_stalls: u64,
}

pub(crate) struct State {
    control: VecDeque<Bytes>,
    control_bytes: usize,
    pub data: Drr<OutFrame>,
    pub streams: HashMap<u32, StreamEntry>,
    next_id: u32,
    connecting: usize,
    pub budget: Budget,
    binds_out: HashMap<u32, oneshot::Sender<Result<u16, OpenRefused>>>,
    next_bind: u32,
    binds_in: usize,
    pub dead: Option<String>,
    /// `close` has run: streams dropped, waiters told.
    torn_down: bool,
    bytes_sent: u64,
    bytes_received: u64,
}

pub(crate) struct Shared {
    pub st: Mutex<State>,
    pub wake_writer: Notify,
    closed_tx: watch::Sender<Option<String>>,
    pub config: SessionConfig,
    acceptor: Arc<dyn Acceptor>,
    started: Instant,
    ping_rtt_ns: AtomicU64,
    tcp_rtt_ns: AtomicU64,
    last_rx_ns: AtomicU64,
    peer: String,
    /// Extension messages (PING, BIND) negotiated.
    ext: bool,
    /// Largest DATA payload we accept, advertised in OPEN/OPEN_SUCCESS.
    our_max_packet: u16,
    /// Largest DATA payload the carrier's frame limit lets us send.
    send_max_payload: usize,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a task panicked mid-update; the state may be
        // inconsistent, but closing cleanly still needs it.
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// RTT used for window growth decisions.
    pub fn window_rtt_ns(&self) -> u64 {
        let floor = self.config.rtt_floor.as_nanos() as u64;
        self.ping_rtt_ns
            .load(Ordering::Relaxed)
            .max(self.tcp_rtt_ns.load(Ordering::Relaxed))
            .max(floor)
    }

    /// Closes the whole session: every stream ends, the carrier is dropped.
    pub fn close(&self, why: String) {
        let mut st = self.lock();
        if st.torn_down {
            return;
        }
        st.torn_down = true;
        let why = st.dead.get_or_insert(why).clone();
        let streams = std::mem::take(&mut st.streams);
        st.binds_out.clear();
        st.control.clear();
        drop(st);
        for (_, e) in streams {
            if let Some(a) = e.uplink {
                a.abort();
            }
            e.wake.notify_one();
            // Dropping `inbound` lets each downlink finish what it has and end.
        }
        self.closed_tx.send_replace(Some(why));
        self.wake_writer.notify_one();
    }

    /// Queues a control message (never behind bulk data).
    pub fn send_control(&self, st: &mut State, f: Frame) {
        let Ok(b) = f.to_bytes() else {
            // Only an over-long string could fail; such frames are never built.
            return;
        };
        st.control_bytes += b.len();
        st.control.push_back(b);
        if st.control_bytes > self.config.control_limit && st.dead.is_none() {
            // The peer keeps causing replies (PONGs, adjusts) but does not
            // read them: it is not a well-behaved peer.
            st.dead = Some("peer is not reading its control messages".into());
        }
    }

    /// Queues EOF/CLOSE for a stream behind that stream's own queued data,
    /// but ahead of every other stream's.
    pub fn send_stream_control(&self, st: &mut State, id: u32, f: Frame) {
        if st.data.queued(id) > 0 {
            if let Ok(b) = f.to_bytes() {
                st.data.push(id, OutFrame::encoded(b));
            }
        } else {
            self.send_control(st, f);
        }
    }

    /// Sends CLOSE when both directions have ended and removes the stream
    /// once CLOSE went both ways.
    pub fn finish_if_done(&self, st: &mut State, id: u32) {
        let Some(e) = st.streams.get_mut(&id) else {
            return;
        };
        if !e.close_sent && e.eof_sent && e.eof_recv && e.eof_delivered {
            e.close_sent = true;
            let remote = e.remote;
            self.send_stream_control(st, id, Frame::Close { recipient: remote });
        }
        let Some(e) = st.streams.get(&id) else {
            return;
        };
        if e.close_sent && e.close_recv {
            self.remove_stream(st, id);
        }
    }

    fn remove_stream(&self, st: &mut State, id: u32) {
        if let Some(e) = st.streams.remove(&id) {
            st.budget.release(e.reserved);
            if let Some(a) = e.uplink {
                a.abort();
            }
            e.wake.notify_one();
            tracing::debug!(
                stream = id,
                peer = %self.peer,
                tx = e.tx_bytes,
                rx = e.rx_bytes,
                window = e.recv.size(),
                credit_stalls = e.credit_stalls,
                "stream closed"
            );
        }
    }

    /// Ends a stream abruptly (local socket error): CLOSE to the peer, stop
    /// reading locally; the entry stays until the peer's CLOSE arrives.
    pub fn abort_stream(&self, st: &mut State, id: u32) {
        let Some(e) = st.streams.get_mut(&id) else {
            return;
        };
        if let Some(a) = e.uplink.take() {
            a.abort();
        }
        e.inbound = None;
        if !e.close_sent {
            e.close_sent = true;
            let remote = e.remote;
            if e.opening.is_none() {
                self.send_stream_control(st, id, Frame::Close { recipient: remote });
            }
        }
        self.finish_if_done(st, id);
        self.wake_writer.notify_one();
    }

    fn alloc_id(st: &mut State) -> u32 {
        loop {
            let id = st.next_id;
            st.next_id = st.next_id.wrapping_add(1);
            if !st.streams.contains_key(&id) {
                return id;
            }
        }
    }

    fn new_entry(
        &self,
        st: &mut State,
        remote: u32,
        peer_window: u32,
        peer_max_packet: u16,
    ) -> (u32, mpsc::UnboundedReceiver<Inbound>) {
        let id = Self::alloc_id(st);
        let want = self.config.window.initial as u64;
        let reserved = st.budget.reserve_with_floor(want, MIN_WINDOW.min(want));
        // Unbounded in type only: the carrier reader checks every DATA
        // against this stream's receive window before sending it here, so
        // the queue never holds more than the window (≤ the per-stream cap).
        let (tx, rx) = mpsc::unbounded_channel();
        st.streams.insert(
            id,
            StreamEntry {
                remote,
                opening: None,
                abandoned: false,
                credit: SendCredit::new(peer_window),
                max_packet: self.clamp_packet(peer_max_packet),
                wake: Arc::new(Notify::new()),
                recv: RecvWindow::new(reserved as u32, self.config.window.max, self.now_ns()),
                reserved,
                inbound: Some(tx),
                uplink: None,
                eof_sent: false,
                eof_recv: false,
                eof_delivered: false,
                close_sent: false,
                close_recv: false,
                tx_bytes: 0,
                rx_bytes: 0,
                credit_stalls: 0,
            },
        );
        (id, rx)
    }

    fn clamp_packet(&self, peer_max_packet: u16) -> usize {
        (peer_max_packet as usize).clamp(1, self.send_max_payload)
    }

    /// Handles one frame from the peer. An `Err` is a protocol violation that
    /// ends the session.
    fn on_frame(self: &Arc<Self>, f: Frame) -> Result<(), String> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.dead.is_some() {
            return Ok(());
        }
        match f {
            Frame::Data { recipient, payload } => {
                let Some(e) = st.streams.get_mut(&recipient) else {
                    return Err(format!("DATA for unknown stream {recipient}"));
                };
                if e.opening.is_some() || e.abandoned {
                    return Err(format!("DATA for stream {recipient} before it was open"));
                }
                if payload.len() > self.our_max_packet as usize {
                    return Err(format!(
                        "DATA of {} bytes exceeds the maximum packet size {}",
                        payload.len(),
                        self.our_max_packet
                    ));
                }
                e.recv
                    .on_data(payload.len())
                    .map_err(|o| format!("stream {recipient}: window overrun: {o}"))?;
                if e.eof_recv {
                    return Err(format!("DATA after EOF on stream {recipient}"));
                }
                st.bytes_received += payload.len() as u64;
                if let Some(tx) = &e.inbound {
                    // Bounded by the receive window checked just above.
                    let _ = tx.send(Inbound::Data(payload));
                }
            }
            Frame::WindowAdjust {
                recipient,
                increment,
            } => {
                let Some(e) = st.streams.get_mut(&recipient) else {
                    return Err(format!("WINDOW_ADJUST for unknown stream {recipient}"));
                };
                e.credit.add(increment);
                e.wake.notify_one();
            }
            Frame::Open {
                sender,
                window,
                max_packet,
                dest,
            } => {
                if st.streams.len() + st.connecting >= self.config.max_streams {
                    tracing::warn!(peer = %self.peer, %dest, limit = self.config.max_streams, "refusing stream: stream limit reached");
                    self.send_control(
                        st,
                        Frame::OpenFailure {
                            recipient: sender,
                            reason: Reason::GENERAL_FAILURE,
                            description: "too many streams".into(),
                        },
                    );
                } else {
                    st.connecting += 1;
                    let me = self.clone();
                    let fut = self.acceptor.connect(dest.clone());
                    tokio::spawn(async move {
                        let r = fut.await;
                        me.finish_inbound_open(sender, window, max_packet, dest, r);
                    });
                }
            }
            Frame::OpenSuccess {
                recipient,
                sender,
                window,
                max_packet,
            } => {
                let max_packet = self.clamp_packet(max_packet);
                let Some(e) = st.streams.get_mut(&recipient) else {
                    return Err(format!("OPEN_SUCCESS for unknown stream {recipient}"));
                };
                if e.opening.is_none() && !e.abandoned {
                    return Err(format!("duplicate OPEN_SUCCESS for stream {recipient}"));
                }
                e.remote = sender;
                e.credit = SendCredit::new(window);
                e.max_packet = max_packet;
                let delivered = match e.opening.take() {
                    Some(tx) => tx.send(Ok(())).is_ok(),
                    None => false,
                };
                if !delivered {
                    e.abandoned = false;
                    self.abort_stream(st, recipient);
                }
            }
            Frame::OpenFailure {
                recipient,
                reason,
                description,
            } => {
                let Some(e) = st.streams.get_mut(&recipient) else {
                    return Err(format!("OPEN_FAILURE for unknown stream {recipient}"));
                };
                if e.opening.is_none() && !e.abandoned {
                    return Err(format!("OPEN_FAILURE for open stream {recipient}"));
                }
                if let Some(tx) = e.opening.take() {
                    let _ = tx.send(Err(OpenRefused {
                        reason,
                        description,
                    }));
                }
                if let Some(e) = st.streams.get_mut(&recipient) {
                    e.close_sent = true;
                    e.close_recv = true;
                }
                self.remove_stream(st, recipient);
            }
            Frame::Eof { recipient } => {
                let Some(e) = st.streams.get_mut(&recipient) else {
                    return Err(format!("EOF for unknown stream {recipient}"));
                };
                e.eof_recv = true;
                match &e.inbound {
                    Some(tx) => {
                        let _ = tx.send(Inbound::Eof);
                    }
                    None => e.eof_delivered = true,
                }
                self.finish_if_done(st, recipient);
            }
            Frame::Close { recipient } => {
                let Some(e) = st.streams.get_mut(&recipient) else {
                    return Err(format!("CLOSE for unknown stream {recipient}"));
                };
                e.close_recv = true;
                e.inbound = None;
                if let Some(a) = e.uplink.take() {
                    a.abort();
                }
                if !e.close_sent {
                    e.close_sent = true;
                    let remote = e.remote;
                    // The peer is done with the stream: our unsent data for it is moot.
                    st.data.remove(recipient);
                    self.send_control(st, Frame::Close { recipient: remote });
                }
                self.finish_if_done(st, recipient);
            }
            Frame::Ping { nonce } => self.send_control(st, Frame::Pong { nonce }),
            Frame::Pong { nonce } => {
                let now = self.now_ns();
                if nonce <= now {
                    let sample = now - nonce;
                    let old = self.ping_rtt_ns.load(Ordering::Relaxed);
                    let new = if old == 0 {
                        sample
                    } else {
                        (old * 7 + sample) / 8
                    };
                    self.ping_rtt_ns.store(new, Ordering::Relaxed);
                }
            }
            Frame::Bind {
                request,
                bind,
                dest,
            } => {
                if st.binds_in >= MAX_BINDS {
                    self.send_control(
                        st,
                        Frame::BindFailure {
                            request,
                            reason: Reason::GENERAL_FAILURE,
                            description: "too many reverse forwards".into(),
                        },
                    );
                } else {
                    st.binds_in += 1;
                    let me = self.clone();
                    let fut = self.acceptor.bind(
                        bind,
                        dest,
                        SessionHandle {
                            shared: self.clone(),
                        },
                    );
                    tokio::spawn(async move {
                        let r = fut.await;
                        let mut st = me.lock();
                        let f = match r {
                            Ok(port) => Frame::BindSuccess { request, port },
                            Err(e) => {
                                st.binds_in -= 1;
                                Frame::BindFailure {
                                    request,
                                    reason: e.reason,
                                    description: e.description,
                                }
                            }
                        };
                        me.send_control(&mut st, f);
                        drop(st);
                        me.wake_writer.notify_one();
                    });
                }
            }
            Frame::BindSuccess { request, port } => {
                let Some(tx) = st.binds_out.remove(&request) else {
                    return Err(format!("BIND_SUCCESS for unknown request {request}"));
                };
                let _ = tx.send(Ok(port));
            }
            Frame::BindFailure {
                request,
                reason,
                description,
            } => {
                let Some(tx) = st.binds_out.remove(&request) else {
                    return Err(format!("BIND_FAILURE for unknown request {request}"));
                };
                let _ = tx.send(Err(OpenRefused {
                    reason,
                    description,
                }));
            }
        }
        if let Some(why) = st.dead.clone() {
            return Err(why);
        }
        drop(guard);
        self.wake_writer.notify_one();
        Ok(())
    }

    fn finish_inbound_open(
        self: &Arc<Self>,
        sender: u32,
        window: u32,
        max_packet: u16,
        dest: String,
        r: Result<TcpStream, OpenRefused>,
    ) {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.connecting -= 1;
        if st.dead.is_some() {
            return;
        }
        match r {
            Ok(sock) => {
                let (id, rx) = self.new_entry(st, sender, window, max_packet);
                let ours = st.streams.get(&id).map_or(0, |e| e.recv.size());
                self.send_control(
                    st,
                    Frame::OpenSuccess {
                        recipient: sender,
                        sender: id,
                        window: ours,
                        max_packet: self.our_max_packet,
                    },
                );
                tracing::debug!(peer = %self.peer, %dest, stream = id, "stream opened by peer");
                self.spawn_pumps(st, id, sock, rx);
            }
            Err(e) => {
                tracing::info!(peer = %self.peer, %dest, reason = %e, "stream refused");
                self.send_control(
                    st,
                    Frame::OpenFailure {
                        recipient: sender,
                        reason: e.reason,
                        description: e.description,
                    },
                );
            }
        }
        drop(guard);
        self.wake_writer.notify_one();
    }

    fn spawn_pumps(
        self: &Arc<Self>,
        st: &mut State,
        id: u32,
        sock: TcpStream,
        rx: mpsc::UnboundedReceiver<Inbound>,
    ) {
        let _ = longhaul_carrier::tune_socket(&sock);
        let (r, w) = sock.into_split();
        let up = tokio::spawn(uplink(self.clone(), id, r));
        tokio::spawn(downlink(self.clone(), id, w, rx));
        if let Some(e) = st.streams.get_mut(&id) {
            e.uplink = Some(up.abort_handle());
        } else {
            up.abort();
        }
    }
}

/// A cheap, clonable handle to a running session.
#[derive(Clone)]
pub struct SessionHandle {
    shared: Arc<Shared>,
}

/// A stream the peer accepted, not yet attached to a local socket. Dropping
/// it closes the stream.
pub struct Opened {
    shared: Arc<Shared>,
    id: u32,
    rx: Option<mpsc::UnboundedReceiver<Inbound>>,
}

impl Opened {
    /// Starts relaying between the stream and `sock`.
    pub fn attach(mut self, sock: TcpStream) {
        let Some(rx) = self.rx.take() else { return };
        let shared = self.shared.clone();
        let mut st = shared.lock();
        if st.streams.contains_key(&self.id) {
            shared.spawn_pumps(&mut st, self.id, sock, rx);
        }
    }

    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if self.rx.is_some() {
            let mut st = self.shared.lock();
            self.shared.abort_stream(&mut st, self.id);
        }
    }
}

pub struct Session;

impl Session {
    /// Runs the hello (native mode) and starts the session's tasks.
    pub async fn start(
        mut carrier: Carrier,
        config: SessionConfig,
        acceptor: Arc<dyn Acceptor>,
    ) -> Result<SessionHandle, SessionError> {
        let (ext, frame_limit) = match config.mode {
            Mode::Jmux => (false, u16::MAX),
            Mode::Native => {
                let ours = Hello::ours(config.max_frame);
                let hello = async {
                    carrier.writer.write_all(&ours.encode()).await?;
                    carrier.writer.flush().await?;
                    let mut b = [0u8; HELLO_LEN];
                    carrier.reader.read_exact(&mut b).await?;
                    Ok::<_, SessionError>(Hello::decode(&b)?)
                };
                let peer = tokio::time::timeout(config.handshake_timeout, hello)
                    .await
                    .map_err(|_| SessionError::HelloTimeout(config.handshake_timeout))??;
                let n = ours.negotiate(&peer);
                (n.features & handshake::FEATURE_PING != 0, n.max_frame)
            }
        };
        let send_max_payload = (frame_limit as usize)
            .saturating_sub(frame::DATA_HEADER_LEN)
            .clamp(1, MAX_DATA_PAYLOAD);
        let our_max_packet = (config.max_frame as usize)
            .saturating_sub(frame::DATA_HEADER_LEN)
            .clamp(1, MAX_DATA_PAYLOAD) as u16;
        let (closed_tx, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            st: Mutex::new(State {
                control: VecDeque::new(),
                control_bytes: 0,
                data: Drr::new(MAX_DATA_PAYLOAD + frame::DATA_HEADER_LEN),
                streams: HashMap::new(),
                next_id: 1,
                connecting: 0,
                budget: Budget::new(config.budget),
                binds_out: HashMap::new(),
                next_bind: 1,
                binds_in: 0,
                dead: None,
                torn_down: false,
                bytes_sent: 0,
                bytes_received: 0,
            }),
            wake_writer: Notify::new(),
            closed_tx,
            acceptor,
            started: Instant::now(),
            ping_rtt_ns: AtomicU64::new(0),
            tcp_rtt_ns: AtomicU64::new(0),
            last_rx_ns: AtomicU64::new(0),
            peer: carrier.peer.clone(),
            ext,
            our_max_packet,
            send_max_payload,
            config,
        });
        let limits = DecodeLimits {
            max_frame: shared.config.max_frame as usize,
            extensions: ext,
        };
        let reader = tokio::spawn(carrier_reader(shared.clone(), carrier.reader, limits));
        let writer = tokio::spawn(carrier_writer(
            shared.clone(),
            carrier.writer,
            carrier.urgent,
        ));
        let house = tokio::spawn(housekeeping(shared.clone(), carrier.probe));
        // When the session closes, stop the tasks that might be parked.
        let mut closed = shared.closed_tx.subscribe();
        tokio::spawn(async move {
            let _ = closed.wait_for(|c| c.is_some()).await;
            reader.abort();
            house.abort();
            // The writer sees `dead` and exits on its own after waking.
            let _ = writer.await;
        });
        Ok(SessionHandle { shared })
    }
}

impl SessionHandle {
    /// Opens a stream to `dest` (`tcp://host:port`) at the peer.
    pub async fn open(&self, dest: &str) -> Result<Opened, OpenRefused> {
        let sh = &self.shared;
        let (tx, rx) = oneshot::channel();
        let (id, inbound_rx) = {
            let mut guard = sh.lock();
            let st = &mut *guard;
            if let Some(why) = &st.dead {
                return Err(OpenRefused::new(
                    Reason::GENERAL_FAILURE,
                    format!("session closed: {why}"),
                ));
            }
            if st.streams.len() + st.connecting >= sh.config.max_streams {
                return Err(OpenRefused::new(
                    Reason::GENERAL_FAILURE,
                    "too many streams",
                ));
            }
            let (id, inbound_rx) = sh.new_entry(st, 0, 0, 0);
            let window = match st.streams.get_mut(&id) {
                Some(e) => {
                    e.opening = Some(tx);
                    e.recv.size()
                }
                None => 0,
            };
            sh.send_control(
                st,
                Frame::Open {
                    sender: id,
                    window,
                    max_packet: sh.our_max_packet,
                    dest: dest.to_owned(),
                },
            );
            (id, inbound_rx)
        };
        sh.wake_writer.notify_one();
        let answer = tokio::time::timeout(sh.config.open_timeout, rx).await;
        match answer {
            Ok(Ok(Ok(()))) => Ok(Opened {
                shared: sh.clone(),
                id,
                rx: Some(inbound_rx),
            }),
            Ok(Ok(Err(refused))) => Err(refused),
            Ok(Err(_)) => Err(OpenRefused::new(
                Reason::GENERAL_FAILURE,
                format!(
                    "session closed: {}",
                    self.close_reason().unwrap_or_default()
                ),
            )),
            Err(_) => {
                let mut st = sh.lock();
                if let Some(e) = st.streams.get_mut(&id) {
                    if e.opening.take().is_some() {
                        e.abandoned = true;
                    }
                }
                Err(OpenRefused::new(
                    Reason::TTL_EXPIRED,
                    "the peer did not answer the open in time",
                ))
            }
        }
    }

    /// Asks the peer to listen on `bind` and open streams back to `dest`.
    pub async fn bind(&self, bind: &str, dest: &str) -> Result<u16, OpenRefused> {
        let sh = &self.shared;
        if !sh.ext {
            return Err(OpenRefused::new(
                Reason::GENERAL_FAILURE,
                "reverse forwards need longhaul's native mode (not --jmux)",
            ));
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut guard = sh.lock();
            let st = &mut *guard;
            if st.dead.is_some() || st.binds_out.len() >= MAX_BINDS {
                return Err(OpenRefused::new(
                    Reason::GENERAL_FAILURE,
                    "session closed or too many binds",
                ));
            }
            let request = st.next_bind;
            st.next_bind = st.next_bind.wrapping_add(1);
            st.binds_out.insert(request, tx);
            sh.send_control(
                st,
                Frame::Bind {
                    request,
                    bind: bind.to_owned(),
                    dest: dest.to_owned(),
                },
            );
        }
        sh.wake_writer.notify_one();
        match tokio::time::timeout(sh.config.open_timeout, rx).await {
            Ok(Ok(r)) => r,
            _ => Err(OpenRefused::new(
                Reason::GENERAL_FAILURE,
                "no answer to the reverse-forward request",
            )),
        }
    }

    /// Waits until the session has ended; returns why.
    pub async fn closed(&self) -> String {
        let mut rx = self.shared.closed_tx.subscribe();
        let r = rx.wait_for(|c| c.is_some()).await;
        match r {
            Ok(v) => v.clone().unwrap_or_default(),
            Err(_) => "session dropped".into(),
        }
    }

    pub fn close_reason(&self) -> Option<String> {
        self.shared.lock().dead.clone()
    }

    pub fn is_closed(&self) -> bool {
        self.close_reason().is_some()
    }

    /// Ends the session and every stream in it.
    pub fn close(&self, why: &str) {
        self.shared.close(why.to_owned());
    }

    pub fn peer(&self) -> &str {
        &self.shared.peer
    }

    pub fn stats(&self) -> SessionStats {
        let st = self.shared.lock();
        SessionStats {
            streams: st.streams.len(),
            budget_used: st.budget.used(),
            rtt: Duration::from_nanos(self.shared.window_rtt_ns()),
            bytes_sent: st.bytes_sent,
            bytes_received: st.bytes_received,
        }
    }
}

async fn carrier_reader(shared: Arc<Shared>, mut r: BoxRead, limits: DecodeLimits) {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        loop {
            match frame::decode(&mut buf, limits) {
                Ok(Some(f)) => {
                    if let Err(why) = shared.on_frame(f) {
                        tracing::warn!(peer = %shared.peer, "closing session: {why}");
                        shared.close(why);
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let why = format!("malformed frame from peer: {e}");
                    tracing::warn!(peer = %shared.peer, "closing session: {why}");
                    shared.close(why);
                    return;
                }
            }
        }
        if buf.capacity() - buf.len() < frame::MAX_FRAME_LEN {
            // Start a fresh buffer holding only the unfinished frame at the
            // tail (< 64 KiB); growing the old one would copy the frames
            // already handed out of it as well.
            let mut fresh = BytesMut::with_capacity(READ_CHUNK + buf.len());
            fresh.extend_from_slice(&buf);
            buf = fresh;
        }
        match r.read_buf(&mut buf).await {
            Ok(0) => {
                tracing::info!(peer = %shared.peer, "carrier closed by peer");
                shared.close("carrier closed by peer".into());
                return;
            }
            Ok(_) => shared.last_rx_ns.store(shared.now_ns(), Ordering::Relaxed),
            Err(e) => {
                tracing::info!(peer = %shared.peer, "carrier read failed: {e}");
                shared.close(format!("carrier read failed: {e}"));
                return;
            }
        }
    }
}

async fn carrier_writer(shared: Arc<Shared>, mut w: BoxWrite, urgent: Option<Box<dyn UrgentSend>>) {
    let mut batch: VecDeque<OutFrame> = VecDeque::with_capacity(MAX_IOV);
    let mut touched: Vec<u32> = Vec::with_capacity(MAX_IOV);
    let mut wakes: Vec<Arc<Notify>> = Vec::with_capacity(MAX_IOV);
    let mut backed_up = false;
    let mut drained;
    let mut dirty = false;
    loop {
        {
            let mut guard = shared.lock();
            let st = &mut *guard;
            if let Some(why) = st.dead.clone() {
                drop(guard);
                shared.close(why);
                break;
            }
            while let Some(f) = st.control.pop_front() {
                st.control_bytes -= f.len();
                batch.push_back(OutFrame::encoded(f));
            }
            let mut bytes = 0;
            let limit = if backed_up {
                BACKLOG_BATCH_BYTES
            } else {
                WRITE_BATCH_BYTES
            };
            // Two iovecs per DATA frame (header, payload).
            while bytes < limit && batch.len() < MAX_IOV / 2 {
                let Some((id, f)) = st.data.pop() else { break };
                bytes += f.remaining();
                batch.push_back(f);
                if !touched.contains(&id) {
                    touched.push(id);
                }
            }
            st.bytes_sent += bytes as u64;
            drained = st.data.is_empty();
            for id in touched.drain(..) {
                if let Some(e) = st.streams.get(&id) {
                    wakes.push(e.wake.clone());
                }
            }
        }
        for n in wakes.drain(..) {
            n.notify_one();
        }
        if batch.is_empty() {
            if dirty {
                // TLS and WebSocket carriers keep bytes in their own
                // buffers until flushed; flush whenever the queue runs dry,
                // but let new work interrupt (a flush may wait on a full
                // socket, and is resumed the next time round).
                tokio::select! {
                    r = w.flush() => match r {
                        Ok(()) => dirty = false,
                        Err(e) => {
                            tracing::info!(peer = %shared.peer, "carrier flush failed: {e}");
                            shared.close(format!("carrier write failed: {e}"));
                            break;
                        }
                    },
                    _ = shared.wake_writer.notified() => {}
                }
                continue;
            }
            shared.wake_writer.notified().await;
            continue;
        }
        dirty = true;
        match write_batch(&shared, &mut w, urgent.as_deref(), &mut batch).await {
            // Backed up once the carrier takes less than offered; caught up
            // again only when the scheduler has run dry.
            Ok(partial) => backed_up = partial || (backed_up && !drained),
            Err(e) => {
                tracing::info!(peer = %shared.peer, "carrier write failed: {e}");
                shared.close(format!("carrier write failed: {e}"));
                break;
            }
        }
    }
    let _ = w.shutdown().await;
}

/// What ended one wait of the writer.
enum Step {
    Wrote(usize),
    /// Something was queued while the carrier was full.
    Woken,
    /// Time to try the stuck urgent frames again.
    Retry,
}

/// While urgent frames wait at the front of a full carrier, how often a
/// direct send is retried. Armed only then: ordinary data never waits on it.
const URGENT_RETRY: std::time::Duration = std::time::Duration::from_millis(1);

fn iovecs(batch: &VecDeque<OutFrame>, upto: usize) -> Vec<IoSlice<'_>> {
    let mut slices = Vec::with_capacity(MAX_IOV);
    for f in batch.iter().take(upto) {
        if slices.len() + 2 > MAX_IOV {
            break;
        }
        let h = f.head();
        if !h.is_empty() {
            slices.push(IoSlice::new(h));
        }
        if !f.body.is_empty() {
            slices.push(IoSlice::new(&f.body));
        }
    }
    slices
}

fn advance(batch: &mut VecDeque<OutFrame>, mut n: usize) {
    while n > 0 {
        let Some(front) = batch.front_mut() else {
            break;
        };
        n = front.advance(n);
        if front.remaining() == 0 {
            batch.pop_front();
        }
    }
}

/// Moves urgent frames (the control lane, and streams that just became
/// active) to right behind the frame being written. Returns how many
/// frames now lead the batch and may go out in a direct send.
///
/// Order within a stream is never changed: a frame only moves if no frame
/// of its stream is already in the batch; the first one that cannot move
/// stops the pulling, so the control lane stays first in, first out, and
/// DATA moves only once the control lane is empty.
fn pull_urgent(shared: &Shared, batch: &mut VecDeque<OutFrame>) -> usize {
    let mut urgent: Vec<OutFrame> = Vec::new();
    let mut wakes: Vec<Arc<Notify>> = Vec::new();
    let in_batch = |r: Option<u32>| r.is_some_and(|r| batch.iter().any(|f| f.recipient == Some(r)));
    {
        let mut guard = shared.lock();
        let st = &mut *guard;
        while let Some(f) = st.control.front() {
            if in_batch(crate::outframe::stream_recipient(f)) {
                break;
            }
            let Some(f) = st.control.pop_front() else {
                break;
            };
            st.control_bytes -= f.len();
            urgent.push(OutFrame::encoded(f));
        }
        // DATA may only follow the whole control lane: an OPEN_SUCCESS still
        // waiting there must reach the peer before its stream's first DATA.
        while st.control.is_empty() && urgent.len() < MAX_IOV / 4 {
            let Some((id, f)) = st.data.pop_new_if(|f| !in_batch(f.recipient)) else {
                break;
            };
            st.bytes_sent += f.remaining() as u64;
            urgent.push(f);
            if let Some(e) = st.streams.get(&id) {
                wakes.push(e.wake.clone());
            }
        }
    }
    for n in wakes {
        n.notify_one();
    }
    if urgent.is_empty() {
        return 0;
    }
    let at = usize::from(batch.front().is_some_and(|f| f.started));
    let count = urgent.len();
    for (i, f) in urgent.into_iter().enumerate() {
        batch.insert(at + i, f);
    }
    at + count
}

/// Writes the whole batch; returns whether the carrier pushed back (some
/// write took less than offered). While the carrier is full, urgent frames
/// queued meanwhile are moved forward and sent directly, without waiting
/// for the runtime to see the socket writable again.
async fn write_batch(
    shared: &Shared,
    w: &mut BoxWrite,
    urgent: Option<&dyn UrgentSend>,
    batch: &mut VecDeque<OutFrame>,
) -> io::Result<bool> {
    let mut partial = false;
    // Leading frames of the batch that are urgent and not yet fully sent.
    let mut stuck = 0usize;
    while !batch.is_empty() {
        let step = {
            let slices = iovecs(batch, usize::MAX);
            match urgent {
                None => Step::Wrote(w.write_vectored(&slices).await?),
                Some(_) => {
                    tokio::select! {
                        r = w.write_vectored(&slices) => Step::Wrote(r?),
                        _ = shared.wake_writer.notified() => Step::Woken,
                        _ = tokio::time::sleep(URGENT_RETRY), if stuck > 0 => Step::Retry,
                    }
                }
            }
        };
        match step {
            Step::Wrote(0) => return Err(io::ErrorKind::WriteZero.into()),
            Step::Wrote(n) => {
                advance(batch, n);
                stuck = 0;
            }
            Step::Woken | Step::Retry => {
                let pulled = pull_urgent(shared, batch);
                let lead = pulled.max(stuck.min(batch.len()));
                if let (Some(u), true) = (urgent, lead > 0) {
                    let before = batch.len();
                    let sent = u.try_send(&iovecs(batch, lead));
                    match sent {
                        Ok(n) => advance(batch, n),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    // Frames fully sent left the batch; the rest stay stuck.
                    stuck = lead.saturating_sub(before - batch.len());
                }
                // Wakes from bulk pushes find nothing urgent and just wait
                // again; the outer loop looks at the queues before it sleeps,
                // so consuming the wake here loses no work.
                if shared.lock().dead.is_some() {
                    return Err(io::Error::other("session closed"));
                }
                continue;
            }
        }
        partial |= !batch.is_empty();
    }
    Ok(partial)
}

async fn housekeeping(shared: Arc<Shared>, probe: Option<Box<dyn PathProbe>>) {
    let tick = Duration::from_millis(500);
    let mut last_ping: Option<Instant> = None;
    let mut busy_at = Instant::now();
    let mut last_bytes = 0u64;
    loop {
        if let Some(limit) = shared.config.idle_timeout {
            let st = shared.lock();
            let bytes = st.bytes_sent + st.bytes_received;
            let busy = !st.streams.is_empty() || bytes != last_bytes;
            drop(st);
            last_bytes = bytes;
            if busy {
                busy_at = Instant::now();
            } else if busy_at.elapsed() >= limit {
                let why = format!("idle for {limit:?} (no streams; --idle-timeout)");
                tracing::info!(peer = %shared.peer, "closing session: {why}");
                shared.close(why);
                return;
            }
        }
        if let Some(p) = &probe {
            if let Some(r) = p.rtt() {
                shared
                    .tcp_rtt_ns
                    .store(r.as_nanos() as u64, Ordering::Relaxed);
            }
            p.retune();
        }
        if shared.ext {
            if last_ping.is_none_or(|t| t.elapsed() >= shared.config.keepalive) {
                last_ping = Some(Instant::now());
                let mut st = shared.lock();
                let nonce = shared.now_ns();
                shared.send_control(&mut st, Frame::Ping { nonce });
                drop(st);
                shared.wake_writer.notify_one();
            }
            let silent = shared
                .now_ns()
                .saturating_sub(shared.last_rx_ns.load(Ordering::Relaxed));
            if silent > shared.config.dead_after.as_nanos() as u64 {
                let why = format!("peer unresponsive for {:?}", Duration::from_nanos(silent));
                tracing::warn!(peer = %shared.peer, "closing session: {why}");
                shared.close(why);
                return;
            }
        }
        tokio::time::sleep(tick).await;
    }
}
