//! Carriers: the byte pipes a session runs over.
//!
//! A carrier is just an ordered, reliable byte stream split into a read half
//! and a write half, plus a way to ask the path's RTT. The multiplexer sees
//! only [`Carrier`], so TLS, WebSocket, stdio, striped or folder carriers can
//! be added without touching it.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

mod sockopt;

pub use sockopt::tcp_rtt;

pub type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// Measures the path's round-trip time, if the carrier can (TCP_INFO).
pub trait RttSource: Send + Sync {
    fn rtt(&self) -> Option<Duration>;
}

/// One established carrier.
pub struct Carrier {
    pub reader: BoxRead,
    pub writer: BoxWrite,
    /// RTT of the underlying path, when known.
    pub rtt: Option<Box<dyn RttSource>>,
    /// Human-readable description of the far end, for logs.
    pub peer: String,
}

struct TcpRtt(socket2::Socket);

impl RttSource for TcpRtt {
    fn rtt(&self) -> Option<Duration> {
        tcp_rtt(&self.0)
    }
}

impl Carrier {
    /// Wraps an established TCP connection.
    pub fn from_tcp(stream: TcpStream) -> io::Result<Carrier> {
        tune_socket(&stream)?;
        let peer = stream.peer_addr()?.to_string();
        // A duplicate descriptor lets the RTT probe outlive the split halves
        // safely: it refers to the same socket, never to a reused number.
        let probe = socket2::SockRef::from(&stream).try_clone()?;
        let (r, w) = stream.into_split();
        Ok(Carrier {
            reader: Box::new(r),
            writer: Box::new(w),
            rtt: Some(Box::new(TcpRtt(probe))),
            peer,
        })
    }

    /// Connects a TCP carrier.
    pub async fn connect_tcp(addr: &str) -> io::Result<Carrier> {
        let s = TcpStream::connect(addr).await?;
        Carrier::from_tcp(s)
    }
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

/// Binds a TCP listener with SO_REUSEADDR (so a restarted server gets its
/// port back at once).
pub fn bind_listener(addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        // `[::]` means IPv6 only here; bind 0.0.0.0 as well for both.
        let _ = s.set_only_v6(true);
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    tokio::net::TcpListener::from_std(s.into())
}
