//! A session's public types: configuration, errors, the acceptor trait.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::time::Duration;

use longhaul_proto::frame::Reason;
use longhaul_proto::handshake;
use longhaul_proto::window::WindowConfig;

/// Which end of the session this is: the client dials and resumes, the
/// server waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

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
    /// Bytes read from all local sockets and waiting for the carrier: what
    /// a peer that stops reading can make the session hold. Default 64 MiB.
    pub send_total: usize,
    /// Bytes of control messages waiting for the carrier before the peer is
    /// judged to be flooding us without reading. Default 4 MiB.
    pub control_limit: usize,
    /// PING interval in native mode. Default 5 s.
    pub keepalive: Duration,
    /// Nothing heard for this long: the carrier is dead (resumable
    /// sessions move to a new one), or the peer (others). Default 15 s.
    pub dead_after: Duration,
    /// PING interval while no data moves, where both sides offer it (the
    /// shorter of the two is used) and the carrier is a TCP socket (whose
    /// kernel keepalive, set from `keepalive` and `dead_after`, watches it
    /// meanwhile); None or not above `keepalive`: PINGs at the usual pace.
    /// Default 25 s (under the 30 s and 60 s idle timeouts common in
    /// proxies and load balancers).
    pub quiet_keepalive: Option<Duration>,
    /// Offer the link layer that lets the session survive a dropped
    /// carrier (native mode; both sides must offer it). Off for pipes that
    /// cannot be dialled again (`--stdio`, `cmd://`).
    pub resume: bool,
    /// Bytes sent and not yet acknowledged that the link layer keeps for a
    /// replay; the writer waits when it is full. 0: sized to this machine's
    /// TCP buffers (`auto_replay_limit`).
    pub replay_limit: usize,
    /// Client: carriers ("lanes") to stripe the session over; 0 or 1: one
    /// carrier. Needs resume on both sides.
    pub stripes: u8,
    /// Server: most lanes granted to one session (up to
    /// `MAX_LANES`). Default 8.
    pub max_stripes: u8,
    /// How long a server keeps a session whose carrier dropped, waiting for
    /// the client to resume it. Default 60 s.
    pub resume_timeout: Duration,
    /// Time allowed for the hello. Default 10 s.
    pub handshake_timeout: Duration,
    /// Time allowed for an OPEN to be answered. Default 30 s.
    pub open_timeout: Duration,
    /// Close the session after this long with no stream open and no data
    /// moving. Default here: never; the `longhaul server` command sets 1 h
    /// in native mode (its clients come back on demand).
    pub idle_timeout: Option<Duration>,
    /// Lower bound on the RTT used to decide window growth, so that windows
    /// still grow on sub-millisecond paths where the pipeline, not the wire,
    /// holds the bytes in flight. Default 1 ms.
    pub rtt_floor: Duration,
    /// Server: its instance name, told to clients in a new session's
    /// answer (`longhaul_proto::resume::instance`); their later carriers
    /// of the session carry it for a load balancer to route on. None: no
    /// name (and on a client, unused).
    pub instance: Option<String>,
    /// A UDP flow the peer opened here ends after this long without a
    /// datagram either way (the opening side's own timers are shorter:
    /// this one holds when a peer never closes its flows). Default 180 s.
    pub flow_idle: Duration,
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
            send_total: 64 * 1024 * 1024,
            control_limit: 4 * 1024 * 1024,
            keepalive: Duration::from_secs(5),
            dead_after: Duration::from_secs(15),
            quiet_keepalive: Some(Duration::from_secs(25)),
            resume: true,
            replay_limit: 0,
            stripes: 0,
            max_stripes: 8,
            resume_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
            open_timeout: Duration::from_secs(30),
            idle_timeout: None,
            rtt_floor: Duration::from_millis(1),
            instance: None,
            flow_idle: Duration::from_secs(180),
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
    #[error("{0}")]
    Attach(#[from] longhaul_proto::resume::ResumeError),
    #[error("server refused: {}", .0.as_str())]
    ResumeRefused(longhaul_proto::resume::Refusal),
    #[error("peer does not offer session resume")]
    NoResume,
    #[error("the session is over: {0}")]
    Closed(String),
}

/// A snapshot of one stream.
#[derive(Debug, Clone)]
pub struct StreamStats {
    pub id: u32,
    /// `tcp://host:port` or a service.
    pub dest: String,
    /// The local socket's other end: the application that connected (a
    /// stream opened here), or the target's address (one the peer opened).
    pub local: Option<String>,
    /// Opened by this side (a forward here), or by the peer.
    pub opened_here: bool,
    pub age: Duration,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// This side's receive window now.
    pub window: u32,
    /// What the peer lets this side send now.
    pub credit: u64,
    /// Times this side had data and no credit.
    pub stalls: u64,
}

/// A snapshot of a session's counters.
#[derive(Debug, Clone, Default)]
pub struct SessionStats {
    pub streams: usize,
    pub budget_used: u64,
    pub rtt: Duration,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Carrier drops the session survived.
    pub resumes: u64,
    /// Bytes sent again after those drops.
    pub replayed: u64,
    /// Bytes held in the replay buffer now.
    pub replay_held: usize,
    /// Times a stream had data to send and had to wait for the peer's
    /// credit (its window was full).
    pub window_stalls: u64,
    /// Since the session started.
    pub age: Duration,
    /// Waiting for a carrier (a resume).
    pub detached: bool,
    /// UDP datagrams sent, received, and dropped here (no room, no
    /// carrier, too long, or for a flow no longer open).
    pub datagrams: longhaul_proto::mux::DatagramStats,
}

/// Where a UDP flow's datagrams from the peer go (see `flow`). Called with
/// the session's state held: must not block (a socket that has no room
/// drops).
pub trait DatagramSink: Send + Sync + 'static {
    /// One datagram from the peer.
    fn deliver(&self, payload: bytes::Bytes);
    /// The flow is over (closed by either side, or with the session).
    fn finished(&self) {}
}
