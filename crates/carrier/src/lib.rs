//! Carriers: the byte pipes a session runs over.
//!
//! A carrier is just an ordered, reliable byte stream split into a read half
//! and a write half, plus a way to ask the path's RTT. The multiplexer sees
//! only [`Carrier`], so TLS, WebSocket, stdio, striped or folder carriers can
//! be added without touching it.
// `unsafe` only in `sys`, where the system calls std lacks are made.
#![deny(unsafe_code)]

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

mod accept;
pub mod cushion;
pub mod dial;
mod fill;
pub mod folder;
pub mod keys;
pub mod quic;
mod sockopt;
#[allow(unsafe_code)]
mod sys;
pub mod tls;
pub mod udp_batch;
pub mod url;
pub mod ws;

pub use accept::accept_with_backoff;
pub use dial::{accept, accept_folder, dial, stdio, DialOptions};
pub use fill::UrgentFlag;
pub use keys::{Fingerprint, Identity};
pub use sockopt::{
    poll_writable, send_space, set_notsent_lowat, tcp_path, tcp_rtt, SendSpace, TcpPath,
};
pub use sys::private;
pub use url::{CarrierUrl, ListenUrl, Transport};

/// Unsent bytes a new carrier socket may hold in the kernel (see
/// [`set_notsent_lowat`]), until [`PathProbe::retune`] sizes it to the path.
pub const CARRIER_NOTSENT_LOWAT: u32 = 64 * 1024;
/// The kernel's unsent queue is sized to this much time at the path's
/// delivery rate: an interactive frame waits at most about this long behind
/// bulk data there, while a fast path still gets enough queued to stay busy
/// between writer wake-ups.
pub const SEND_QUEUE_TIME: Duration = Duration::from_millis(2);
/// Bounds on that queue.
pub const NOTSENT_MIN: u32 = 16 * 1024;
/// The smallest unsent queue for a lane of a striped session: a slow lane
/// (one repairing losses) must not hold chunks the other lanes could send.
pub const LANE_NOTSENT_MIN: u32 = 4 * 1024;
pub const NOTSENT_MAX: u32 = 1024 * 1024;

pub type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// Looks at the path under a carrier: its RTT, and a chance to resize the
/// kernel's send queue to the path's rate. Called off the data path, on the
/// session's housekeeping tick.
pub trait PathProbe: Send + Sync {
    fn rtt(&self) -> Option<Duration>;
    fn retune(&self) {
        if let Some(p) = self.path() {
            self.retune_with(&p);
        }
    }
    /// [`PathProbe::retune`] with a sample just taken (one TCP_INFO read
    /// serves both).
    fn retune_with(&self, path: &TcpPath) {
        let _ = path;
    }
    /// Lets the send queue shrink to `bytes` on a slow path (a lane of a
    /// striped session), and applies it at once.
    fn set_floor(&self, bytes: u32) {
        let _ = bytes;
    }
    /// What TCP_INFO says of the path, where there is a TCP socket.
    fn path(&self) -> Option<TcpPath> {
        None
    }
    /// The kernel watches the carrier for the session, so that rare PINGs
    /// while no data moves still find a dead first hop within about
    /// `dead_after` (or [`CARRIER_USER_TIMEOUT`]): keepalive probes after
    /// `keepalive` without traffic, every `keepalive`, the connection ended
    /// when they go unanswered (where there is a TCP socket). A proxy on
    /// the way answers them itself: beyond it, the session's own check.
    fn watch(&self, keepalive: Duration, dead_after: Duration) {
        let _ = (keepalive, dead_after);
    }
    /// The server authenticated the carrier's client: what was held back
    /// from unauthenticated peers (a QUIC connection's window) may open.
    fn admitted(&self) {}
}

/// Writes straight to the carrier's socket, bypassing the async runtime's
/// cached write readiness. After a write hits a full socket, epoll reports
/// it writable again only once a third of the send buffer has drained
/// (tens of ms on a long path), while the kernel would accept a small
/// urgent frame as soon as any space is free. The session's writer uses this
/// only from its own task, between its ordinary writes, so bytes never
/// interleave.
pub trait UrgentSend: Send + Sync {
    /// Non-blocking vectored send; `WouldBlock` when no space is free.
    fn try_send(&self, bufs: &[std::io::IoSlice<'_>]) -> io::Result<usize>;
}

/// One established carrier.
pub struct Carrier {
    pub reader: BoxRead,
    pub writer: BoxWrite,
    /// Probe of the underlying path, when the carrier has one.
    pub probe: Option<Box<dyn PathProbe>>,
    /// Direct sends for urgent frames, when the carrier can (plain TCP).
    pub urgent: Option<Box<dyn UrgentSend>>,
    /// Raised while urgent bytes are written, when the carrier keeps a
    /// reserve for them in the kernel's send buffer (TCP underneath).
    pub urgent_flag: Option<UrgentFlag>,
    /// Human-readable description of the far end, for logs.
    pub peer: String,
    /// What ties an attach proof to this carrier (its TLS exporter value),
    /// when TLS runs over it.
    pub binding: Option<[u8; 32]>,
    /// Messages beside the byte stream that are never retransmitted or
    /// ordered (QUIC DATAGRAM frames), when the carrier and its peer have
    /// them: UDP flows go there instead of waiting behind lost bytes.
    pub datagrams: Option<quic::DatagramPath>,
}

struct TcpUrgent(std::sync::Arc<socket2::Socket>);

impl UrgentSend for TcpUrgent {
    fn try_send(&self, bufs: &[std::io::IoSlice<'_>]) -> io::Result<usize> {
        // The duplicate shares the original's non-blocking file status, so
        // this never blocks the runtime.
        self.0.send_vectored(bufs)
    }
}

struct TcpProbe {
    /// A duplicate of the carrier's descriptor (shared with its urgent
    /// sender on plain TCP): the probe may outlive the carrier's halves.
    sock: std::sync::Arc<socket2::Socket>,
    lowat: std::sync::atomic::AtomicU32,
    /// Shared with the socket's writer ([`fill::Filler`]): a lane's lower
    /// floor also tells it to leave the unsent queue to the kernel.
    floor: fill::Floor,
}

impl PathProbe for TcpProbe {
    fn rtt(&self) -> Option<Duration> {
        tcp_rtt(&self.sock)
    }

    fn path(&self) -> Option<TcpPath> {
        tcp_path(&self.sock)
    }

    fn set_floor(&self, bytes: u32) {
        use std::sync::atomic::Ordering;
        self.floor.store(bytes, Ordering::Relaxed);
        if set_notsent_lowat(&socket2::SockRef::from(&self.sock), bytes).is_ok() {
            self.lowat.store(bytes, Ordering::Relaxed);
        }
    }

    fn watch(&self, keepalive: Duration, dead_after: Duration) {
        let keepalive = keepalive.max(Duration::from_secs(1));
        let retries = (dead_after.as_secs() / keepalive.as_secs()).clamp(1, 100) as u32;
        // Best effort: the session's own dead-peer check stays. (Linux
        // ends the connection at TCP_USER_TIMEOUT, CARRIER_USER_TIMEOUT,
        // once a probe is out.)
        let _ = sys::set_keepalive(&self.sock, keepalive, keepalive, retries);
    }

    fn retune_with(&self, p: &TcpPath) {
        use std::sync::atomic::Ordering;
        if p.delivery_rate == 0 {
            return;
        }
        let want = (p.delivery_rate as f64 * SEND_QUEUE_TIME.as_secs_f64()) as u64;
        let floor = self.floor.load(Ordering::Relaxed);
        // A lane (a floor below the usual) keeps half a window unsent, so
        // that each ACK finds data to send: a sender that runs dry is not
        // window-limited, and the kernel then stops growing its window.
        let want = match floor < NOTSENT_MIN {
            true => want.max(p.cwnd_bytes / 2),
            false => want,
        };
        let want = want.clamp(floor as u64, NOTSENT_MAX as u64) as u32;
        let have = self.lowat.load(Ordering::Relaxed);
        // Only touch the socket when the change is worth it (> 25 %).
        if want.abs_diff(have) > have / 4
            && set_notsent_lowat(&socket2::SockRef::from(&self.sock), want).is_ok()
        {
            self.lowat.store(want, Ordering::Relaxed);
        }
    }
}

/// The writer of a TCP socket that TLS or WebSocket wrap, and a probe of
/// its path: the RTT and send-queue tuning still apply below them.
pub(crate) fn filler_and_probe(
    stream: TcpStream,
    flag: &UrgentFlag,
) -> io::Result<(fill::Filler<TcpStream>, Box<dyn PathProbe>)> {
    set_notsent_lowat(&socket2::SockRef::from(&stream), CARRIER_NOTSENT_LOWAT)?;
    let floor = fill::Floor::new(NOTSENT_MIN.into());
    let probe = Box::new(TcpProbe {
        sock: std::sync::Arc::new(socket2::SockRef::from(&stream).try_clone()?),
        lowat: CARRIER_NOTSENT_LOWAT.into(),
        floor: floor.clone(),
    });
    Ok((fill::Filler::new(stream, flag.clone(), floor)?, probe))
}

impl Carrier {
    /// Wraps one read+write stream (TLS, WebSocket).
    pub fn from_io<S>(
        io: S,
        probe: Option<Box<dyn PathProbe>>,
        urgent_flag: Option<UrgentFlag>,
        peer: String,
    ) -> Carrier
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (reader, writer) = dial::split_io(io);
        Carrier {
            reader,
            writer,
            probe,
            urgent: None,
            urgent_flag,
            peer,
            binding: None,
            datagrams: None,
        }
    }

    /// The carrier with its TLS exporter value (see [`Carrier::binding`]).
    pub fn bound(mut self, binding: Option<[u8; 32]>) -> Carrier {
        self.binding = binding;
        self
    }

    /// A folder carrier without TLS (`--insecure`).
    pub fn from_folder(stream: folder::FolderStream) -> Carrier {
        let peer = stream.peer.clone();
        let (r, w) = stream.into_split();
        Carrier {
            reader: Box::new(r),
            writer: Box::new(w),
            probe: None,
            urgent: None,
            urgent_flag: None,
            datagrams: None,
            peer,
            binding: None,
        }
    }

    /// Wraps an established TCP connection.
    pub fn from_tcp(stream: TcpStream) -> io::Result<Carrier> {
        tune_carrier_socket(&stream)?;
        set_notsent_lowat(&socket2::SockRef::from(&stream), CARRIER_NOTSENT_LOWAT)?;
        let peer = stream.peer_addr()?.to_string();
        // A duplicate descriptor lets the RTT probe and the urgent sender
        // outlive the split halves safely: it refers to the same socket,
        // never to a reused number. One for both.
        let sock = std::sync::Arc::new(socket2::SockRef::from(&stream).try_clone()?);
        let urgent = sock.clone();
        let (r, w) = stream.into_split();
        let flag = UrgentFlag::default();
        let floor = fill::Floor::new(NOTSENT_MIN.into());
        Ok(Carrier {
            reader: Box::new(r),
            writer: Box::new(fill::Filler::new(w, flag.clone(), floor.clone())?),
            urgent_flag: Some(flag),
            datagrams: None,
            probe: Some(Box::new(TcpProbe {
                sock,
                lowat: CARRIER_NOTSENT_LOWAT.into(),
                floor,
            })),
            urgent: Some(Box::new(TcpUrgent(urgent))),
            peer,
            binding: None,
        })
    }

    /// Connects a TCP carrier, optionally with a given congestion control.
    pub async fn connect_tcp(addr: &str, congestion: Option<&str>) -> io::Result<Carrier> {
        let s = TcpStream::connect(addr).await?;
        if let Some(cc) = congestion {
            set_congestion(&s, cc)?;
        }
        Carrier::from_tcp(s)
    }
}

/// A carrier whose sent data stays unacknowledged this long is dead (the
/// kernel aborts it: TCP_USER_TIMEOUT), so a resumable session moves to a
/// new carrier within about this long even when the path went silent
/// without a reset.
pub const CARRIER_USER_TIMEOUT: Duration = Duration::from_secs(15);

/// Options for a carrier's TCP socket (any transport over it).
pub fn tune_carrier_socket(stream: &TcpStream) -> io::Result<()> {
    tune_socket(stream)?;
    sys::set_user_timeout(&socket2::SockRef::from(stream), CARRIER_USER_TIMEOUT)
}

/// Socket options for every TCP socket longhaul owns: no Nagle (longhaul
/// batches itself and flushes when its queue is empty) and keepalive so a
/// vanished peer is eventually noticed even in JMUX mode, which has no PING.
pub fn tune_socket(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let s = socket2::SockRef::from(stream);
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10));
    s.set_tcp_keepalive(&ka)?;
    Ok(())
}

/// Chooses the TCP congestion control of a carrier socket (e.g. `cubic`,
/// `bbr`). All of a session's streams share the carrier's, so it matters
/// more than for one connection: BBR's periodic PROBE_RTT, for one, stalls
/// every stream for ~200 ms every 10 s while bulk data keeps the carrier busy.
pub fn set_congestion(stream: &TcpStream, algo: &str) -> io::Result<()> {
    apply_congestion(&socket2::SockRef::from(stream), algo)
}

/// Checks up front that a congestion control can be used, so a server
/// fails at start rather than on every connection.
pub fn check_congestion(algo: &str) -> io::Result<()> {
    let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    apply_congestion(&socket2::SockRef::from(&probe), algo)
}

fn apply_congestion(sock: &socket2::SockRef<'_>, algo: &str) -> io::Result<()> {
    sys::set_congestion(sock, algo)
}

/// Binds a TCP listener that a restarted server gets back at once
/// (SO_REUSEADDR on Unix; Windows' own rules need nothing).
pub fn bind_listener(addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    sys::rebind_at_once(&s)?;
    if addr.is_ipv6() {
        // `[::]` means IPv6 only here; bind 0.0.0.0 as well for both.
        let _ = s.set_only_v6(true);
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    tokio::net::TcpListener::from_std(s.into())
}
