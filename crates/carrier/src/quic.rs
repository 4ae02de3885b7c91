//! QUIC carriers (`quic://`, quinn): the session's bytes over one
//! bidirectional QUIC stream, inside the same TLS 1.3 with pinned keys as
//! `tls://` (the same rustls configs, so the same identities, pins and
//! tickets; 0-RTT stays off: its data could be replayed).
//!
//! One stream, not one per tunnelled connection: the multiplexer, its
//! windows, resume and the link layer stay as they are, and a QUIC
//! connection that dies is resumed like a TCP one. What QUIC adds below
//! them: loss recovery without a kernel's head-of-line wait per segment
//! train, an address that may change under a live connection (the server
//! follows a client that moved: migration), and UDP paths where TCP is
//! throttled.
//!
//! Bounds: a client opens one stream and the server none; before the
//! client authenticates, the server lets it send at most
//! [`UNAUTHENTICATED_WINDOW`] unread (then [`CONNECTION_WINDOW`]).
//!
//! UDP flows go as QUIC datagrams (RFC 9221, [`DatagramPath`]) when both
//! ends offer them: never retransmitted, so a voice packet never waits
//! behind a lost segment of a bulk transfer in the stream. quinn puts
//! queued datagrams in each packet ahead of stream data; they share the
//! connection's congestion window.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use tokio::io::AsyncWrite;

use crate::keys::Fingerprint;
use crate::{Carrier, PathProbe};

#[path = "quic_datagram.rs"]
mod datagram;
#[path = "quic_reorder.rs"]
mod reorder;
pub use datagram::DatagramPath;

/// One stream may have this much in flight: a 1 Gbit/s path of 100 ms
/// holds 12.5 MB.
pub const STREAM_WINDOW: u32 = 32 * 1024 * 1024;
/// The whole connection, once its client authenticated.
pub const CONNECTION_WINDOW: u32 = STREAM_WINDOW;
/// What an unauthenticated client may send (its hello and proof need a
/// few hundred bytes): the server's handshake table holds many of them.
pub const UNAUTHENTICATED_WINDOW: u32 = 64 * 1024;
/// A connection that hears nothing this long is gone: QUIC's stand-in
/// for TCP_USER_TIMEOUT on a TCP carrier, the same time
/// ([`crate::CARRIER_USER_TIMEOUT`]). It catches a path that dies while
/// the session's own check is relaxed (a quiet session allows
/// `--dead-after` plus its quiet interval of silence; a transfer whose
/// windows ran out counts as quiet).
const IDLE_TIMEOUT: Duration = crate::CARRIER_USER_TIMEOUT;
/// QUIC PINGs this often keep an idle connection (a quiet session PINGs
/// only every 25 s) within [`IDLE_TIMEOUT`] with a lost packet to spare,
/// and a NAT's binding warm. The cost: one small packet each way per
/// 5 s per idle session, which a TCP carrier does not pay.
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// The UDP socket buffers asked for: a fast path's bursts between reads.
const SOCKET_BUFFER: usize = 8 * 1024 * 1024;
/// After the session lets go of a carrier, its connection stays this
/// long at most for the last bytes written to be delivered.
const LINGER: Duration = Duration::from_secs(2);
/// A server that sends nothing back over UDP within this long is taken as
/// out of reach that way (UDP blocked on the path), so that a client with
/// a `--failover tls://…` moves on soon. Three tries of the first packet
/// (1 s, then 2 s apart) fit in it.
pub const FIRST_ANSWER: Duration = Duration::from_secs(3);
/// Bytes of datagrams received and not yet read that a connection holds
/// (past it the oldest are dropped). Until the session reads them, a task
/// reads and discards them (`datagram::discard_unclaimed`): what the
/// buffer holds also pins the receive buffers they arrived in.
pub const DATAGRAM_RECEIVE_BUFFER: usize = 64 * 1024;
/// Bytes of datagrams queued in quinn to send (past it the oldest are
/// dropped: the session hands it no more than it has room for); the
/// session's own queue holds the rest.
pub const DATAGRAM_SEND_BUFFER: usize = 64 * 1024;
/// The server name sent when there is no instance to name (names are not
/// checked: keys are pinned).
const DEFAULT_NAME: &str = "longhaul";

/// The congestion controllers `quic://` has (quinn's own; the system's
/// TCP ones do not apply to it).
pub const CONGESTION: &str = "bbr (the default), cubic or reno";

/// Checks a `--congestion` name for `quic://` up front: one line that says
/// which names it takes.
pub fn check_congestion(name: &str) -> io::Result<()> {
    match name {
        "bbr" | "cubic" | "reno" | "newreno" => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--congestion {name:?} is not one quic:// has: give {CONGESTION}"),
        )),
    }
}

fn transport(congestion: Option<&str>, server: bool) -> Arc<quinn::TransportConfig> {
    use quinn::congestion;
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(VarInt::from_u32(server as u32))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .stream_receive_window(VarInt::from_u32(STREAM_WINDOW))
        .receive_window(VarInt::from_u32(match server {
            true => UNAUTHENTICATED_WINDOW,
            false => CONNECTION_WINDOW,
        }))
        .send_window(STREAM_WINDOW as u64)
        .datagram_receive_buffer_size(Some(DATAGRAM_RECEIVE_BUFFER))
        .datagram_send_buffer_size(DATAGRAM_SEND_BUFFER)
        .max_idle_timeout(Some(IDLE_TIMEOUT.try_into().expect("in range")))
        .keep_alive_interval(Some(KEEP_ALIVE));
    // BBR unless told otherwise: a loss-based controller halves its window
    // on every random loss (over the emulator at 100 ms RTT and 0.1 %
    // loss, Cubic moved 8 Mbit/s where BBR moved 520), and a datagram
    // waits while the window is full (docs/BENCHMARKS.md).
    match congestion {
        Some("cubic") => {
            t.congestion_controller_factory(Arc::new(congestion::CubicConfig::default()));
        }
        Some("reno") | Some("newreno") => {
            t.congestion_controller_factory(Arc::new(congestion::NewRenoConfig::default()));
        }
        _ => {
            t.congestion_controller_factory(Arc::new(congestion::BbrConfig::default()));
        }
    }
    Arc::new(t)
}

/// A UDP socket with buffers for a fast path; says once which setting to
/// raise when the system caps them.
fn udp_socket(addr: SocketAddr, server: bool) -> io::Result<std::net::UdpSocket> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if addr.is_ipv6() {
        // A listener on `[::]` takes IPv6 only, as TCP listeners do (bind
        // 0.0.0.0 as well for both); a client's socket reaches either.
        let _ = s.set_only_v6(server);
    }
    let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    let got = s.recv_buffer_size().unwrap_or(0);
    // Linux reports twice what it grants.
    if got < SOCKET_BUFFER / 2 {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::warn!(
                "UDP socket buffers are capped at {} KiB: quic:// may drop packets on a fast path; raise the limit (Linux: sysctl -w net.core.rmem_max={SOCKET_BUFFER} net.core.wmem_max={SOCKET_BUFFER})",
                got / 1024
            )
        });
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

fn tls_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("QUIC TLS setup: {e}"))
}

fn conn_error(e: quinn::ConnectionError) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, described(&e))
}

/// Bytes of a peer's close reason shown (escaped: it goes in log lines).
const REASON_SHOWN: usize = 64;

/// Why a QUIC connection ended, in words; the peer's own reason escaped
/// and cut short, so that it cannot forge a log line.
fn described(e: &quinn::ConnectionError) -> String {
    use quinn::ConnectionError as E;
    let said = |r: &[u8]| match r.is_empty() {
        true => String::new(),
        false => {
            let shown = r[..r.len().min(REASON_SHOWN)].escape_ascii();
            format!(": \"{shown}\"")
        }
    };
    match e {
        E::ApplicationClosed(c) => {
            format!("closed by peer (code {}){}", c.error_code, said(&c.reason))
        }
        E::ConnectionClosed(c) => format!("aborted by peer ({}){}", c.error_code, said(&c.reason)),
        E::TimedOut => format!("timed out (nothing heard for {IDLE_TIMEOUT:?})"),
        // Our own words (a violation this end found, a reset, a close).
        other => other.to_string(),
    }
}

/// `e` from a stream of `conn`, with the reason the connection ended
/// (quinn says only "connection lost").
fn stream_error(conn: &Connection, e: io::Error) -> io::Error {
    match conn.close_reason() {
        Some(why) => io::Error::new(e.kind(), format!("QUIC connection {}", described(&why))),
        None => e,
    }
}

/// A server's QUIC listener.
pub struct QuicListener {
    endpoint: Endpoint,
}

impl QuicListener {
    pub fn bind(
        addr: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        congestion: Option<&str>,
    ) -> io::Result<QuicListener> {
        let crypto = QuicServerConfig::try_from(tls).map_err(tls_error)?;
        let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        cfg.transport_config(transport(congestion, true));
        // A client that moves (NAT rebinding, another network) keeps its
        // connection; the new address is validated before it gets more
        // than three times what it sent (quinn-proto).
        cfg.migration(true);
        let endpoint = Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(cfg),
            udp_socket(addr, true)?,
            Arc::new(quinn::TokioRuntime),
        )?;
        Ok(QuicListener { endpoint })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// The next client's first packet (`None`: the endpoint closed).
    pub async fn accept(&self) -> Option<quinn::Incoming> {
        self.endpoint.accept().await
    }
}

impl Drop for QuicListener {
    /// The endpoint lives on with the connections of sessions still
    /// draining; until they are gone, a new client is refused at once (so
    /// it moves on to a `--failover` or retries) instead of waiting for a
    /// handshake nobody accepts. Then the socket closes.
    fn drop(&mut self) {
        let endpoint = self.endpoint.clone();
        let refuse = async move {
            loop {
                tokio::select! {
                    incoming = endpoint.accept() => match incoming {
                        Some(i) => i.refuse(),
                        None => return,
                    },
                    _ = endpoint.wait_idle() => return,
                }
            }
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn(refuse));
        }
    }
}

/// Server side: the client's connection, its stream and key.
pub async fn accept(incoming: quinn::Incoming) -> io::Result<(Carrier, Option<Fingerprint>)> {
    let peer = incoming.remote_address().to_string();
    let conn = incoming
        .accept()
        .map_err(conn_error)?
        .await
        .map_err(conn_error)?;
    let fp = conn
        .peer_identity()
        .and_then(|i| {
            i.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        })
        .and_then(|c| c.first().and_then(|c| Fingerprint::of_cert(c).ok()));
    let (send, recv) = conn.accept_bi().await.map_err(conn_error)?;
    Ok((carrier(conn, None, send, recv, peer, false), fp))
}

/// Client side: a connection to `addr` from its own UDP socket, and the
/// stream the session runs over.
pub async fn dial(
    addr: &str,
    tls: Arc<rustls::ClientConfig>,
    congestion: Option<&str>,
    bind: Option<std::net::IpAddr>,
    instance: Option<&str>,
    peer: String,
) -> io::Result<Carrier> {
    let mut to = tokio::net::lookup_host(addr).await?;
    let to = match bind {
        Some(local) => to.find(|a| a.is_ipv4() == local.is_ipv4()),
        None => to.next(),
    }
    .ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!("{addr}: no address"),
        )
    })?;
    let local = match (bind, to) {
        (Some(ip), _) => SocketAddr::new(ip, 0),
        (None, SocketAddr::V4(_)) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        (None, SocketAddr::V6(_)) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let crypto = QuicClientConfig::try_from(tls).map_err(tls_error)?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
    cfg.transport_config(transport(congestion, false));
    let endpoint = Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        udp_socket(local, false)?,
        Arc::new(quinn::TokioRuntime),
    )?;
    let name = instance
        .filter(|n| rustls::pki_types::ServerName::try_from(*n).is_ok())
        .unwrap_or(DEFAULT_NAME);
    let connecting = endpoint
        .connect_with(cfg, to, name)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let conn = match tokio::time::timeout(FIRST_ANSWER, connecting).await {
        Ok(c) => c.map_err(conn_error)?,
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{peer}: no answer over UDP within {FIRST_ANSWER:?} (UDP blocked on the way? add --failover tls://…)"),
            ))
        }
    };
    let (send, recv) = conn.open_bi().await.map_err(conn_error)?;
    Ok(carrier(conn, Some(endpoint), send, recv, peer, true))
}

fn carrier(
    conn: Connection,
    endpoint: Option<Endpoint>,
    send: SendStream,
    recv: RecvStream,
    peer: String,
    admitted: bool,
) -> Carrier {
    let admitted = Arc::new(std::sync::atomic::AtomicBool::new(admitted));
    let mut binding = [0u8; 32];
    let binding = conn
        .export_keying_material(&mut binding, crate::tls::BINDING_LABEL, b"")
        .ok()
        .map(|_| binding);
    // Only when the peer takes datagrams (an older one does not).
    let datagrams = conn
        .max_datagram_size()
        .map(|_| DatagramPath::new(conn.clone()));
    Carrier {
        reader: Box::new(QuicReader {
            recv,
            conn: conn.clone(),
            reorder: Default::default(),
            admitted: admitted.clone(),
            ended: false,
        }),
        writer: Box::new(QuicWriter {
            send: Some(send),
            conn: conn.clone(),
            _endpoint: endpoint,
            admitted: admitted.clone(),
        }),
        probe: Some(Box::new(QuicProbe { conn, admitted })),
        urgent: None,
        urgent_flag: None,
        peer,
        binding,
        datagrams,
    }
}

/// The read half: the stream read unordered and put in order
/// ([`reorder`] says why).
struct QuicReader {
    recv: RecvStream,
    conn: Connection,
    reorder: reorder::Reorder,
    /// Until its client is let in, a connection has the small window.
    admitted: Arc<std::sync::atomic::AtomicBool>,
    ended: bool,
}

/// In-order bytes (with each piece's cost) taken from quinn ahead of the
/// caller, while no hole waits: past this the rest stays in quinn, under
/// its flow control, until the caller reads.
const READY_MAX: usize = 256 * 1024;

/// Pieces taken from quinn in one poll at most (then the task yields).
const CHUNKS_PER_POLL: usize = 1024;

impl tokio::io::AsyncRead for QuicReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        use std::future::Future;
        let me = self.get_mut();
        let window = match me.admitted.load(std::sync::atomic::Ordering::Relaxed) {
            true => CONNECTION_WINDOW as usize,
            false => UNAUTHENTICATED_WINDOW as usize,
        };
        // What quinn has, first: what it keeps unread counts against its
        // own limit of holes. In-order bytes only so far ahead of the
        // caller; while holes wait, on (their repairs must not pile up in
        // quinn, each a hole of its own there), within the bound below.
        // (Cancel-safe: a new future each time.)
        let mut quinn_pending = false;
        let mut taken = 0;
        let mut failed = None;
        while !me.ended
            && (me.reorder.ready_cost() < READY_MAX.min(window) || me.reorder.has_holes())
            && taken < CHUNKS_PER_POLL
        {
            let chunk = std::pin::pin!(me.recv.read_chunk(usize::MAX, false)).poll(cx);
            taken += 1;
            match chunk {
                Poll::Pending => {
                    quinn_pending = true;
                    break;
                }
                Poll::Ready(Ok(Some(c))) => {
                    // Past holes: twice the window (quinn releases credit
                    // for what is read, in order or not; a sender repairs
                    // a loss within a round trip or two).
                    if let Err(why) = me.reorder.insert(c.offset, c.bytes, 2 * window) {
                        me.conn.close(VarInt::from_u32(1), why.as_bytes());
                        let why = format!("QUIC stream: {why}");
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)));
                    }
                }
                // quinn ends a stream only once every byte was read.
                Poll::Ready(Ok(None)) => me.ended = true,
                Poll::Ready(Err(e)) => {
                    // What is in order goes out first.
                    failed = Some(stream_error(&me.conn, e.into()));
                    break;
                }
            }
        }
        if me.reorder.take_into(buf) > 0 || buf.remaining() == 0 || me.ended {
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = failed {
            return Poll::Ready(Err(e));
        }
        if !quinn_pending {
            // Stopped at the per-poll bound: come back at once.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// The write half; once dropped, the stream is finished and the
/// connection lingers ([`LINGER`] at most) until the peer acknowledged
/// what was written, then closes.
struct QuicWriter {
    send: Option<SendStream>,
    conn: Connection,
    /// A client's endpoint (its UDP socket) lives as long as its carrier.
    _endpoint: Option<Endpoint>,
    /// Only a carrier whose client was let in lingers: one refused or
    /// timed out closes at once, so that dropped handshakes hold nothing.
    admitted: Arc<std::sync::atomic::AtomicBool>,
}

impl QuicWriter {
    fn send(&mut self) -> Pin<&mut SendStream> {
        Pin::new(self.send.as_mut().expect("taken only on drop"))
    }

    /// `p` with the reason the connection ended, if it failed.
    fn explained<T>(&self, p: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match p {
            Poll::Ready(Err(e)) => Poll::Ready(Err(stream_error(&self.conn, e))),
            other => other,
        }
    }
}

impl AsyncWrite for QuicWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let p = AsyncWrite::poll_write(me.send(), cx, b);
        me.explained(p)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let p = AsyncWrite::poll_flush(me.send(), cx);
        me.explained(p)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let p = AsyncWrite::poll_shutdown(me.send(), cx);
        me.explained(p)
    }
}

impl Drop for QuicWriter {
    fn drop(&mut self) {
        let Some(mut send) = self.send.take() else {
            return;
        };
        if !self.admitted.load(std::sync::atomic::Ordering::Relaxed) {
            return self.conn.close(VarInt::from_u32(0), b"refused");
        }
        let conn = self.conn.clone();
        let endpoint = self._endpoint.take();
        let linger = async move {
            let _ = send.finish();
            let _ = tokio::time::timeout(LINGER, send.stopped()).await;
            conn.close(VarInt::from_u32(0), b"carrier closed");
            drop(endpoint);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(linger)),
            Err(_) => self.conn.close(VarInt::from_u32(0), b"carrier closed"),
        }
    }
}

/// Reads the RTT off the connection; opens its window once the client
/// authenticated.
struct QuicProbe {
    conn: Connection,
    admitted: Arc<std::sync::atomic::AtomicBool>,
}

impl PathProbe for QuicProbe {
    fn rtt(&self) -> Option<Duration> {
        Some(self.conn.rtt())
    }
    fn admitted(&self) {
        self.admitted
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.conn
            .set_receive_window(VarInt::from_u32(CONNECTION_WINDOW));
    }
}
