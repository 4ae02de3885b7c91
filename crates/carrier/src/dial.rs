//! Building carriers from URLs: transport, then (where it applies) TLS.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};

use crate::keys::Fingerprint;
use crate::url::{CarrierUrl, Transport};
use crate::{set_congestion, tls, ws, Carrier};

/// How to dial: TLS settings (None: no TLS layer, `--insecure`) and the
/// carrier's congestion control.
#[derive(Clone, Default)]
pub struct DialOptions {
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub congestion: Option<String>,
}

fn need_tls(url: &CarrierUrl) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{url} needs TLS settings"),
    )
}

/// Connects a carrier. For `cmd://` the command runs until the carrier's
/// read half is dropped.
pub async fn dial(url: &CarrierUrl, opts: &DialOptions) -> io::Result<Carrier> {
    let (transport, addr) = match url {
        CarrierUrl::Cmd { command } => return spawn_command(command),
        CarrierUrl::Net { transport, addr } => (transport, addr),
    };
    let tcp = TcpStream::connect(addr.as_str()).await?;
    if let Some(cc) = &opts.congestion {
        set_congestion(&tcp, cc)?;
    }
    // No Nagle under TLS and WebSocket too: small records must not wait
    // for an ACK (40 ms with delayed ACKs).
    crate::tune_socket(&tcp)?;
    let peer = url.to_string();
    match transport {
        Transport::Tcp => Carrier::from_tcp(tcp),
        Transport::Tls => {
            let cfg = opts.tls.clone().ok_or_else(|| need_tls(url))?;
            let probe = crate::tcp_probe(&tcp)?;
            let s = tls::connect(NudgedTcp::new(tcp)?, cfg).await?;
            Ok(Carrier::from_io(s, Some(probe), peer))
        }
        Transport::Ws { path } => {
            let probe = crate::tcp_probe(&tcp)?;
            let w = ws::connect(NudgedTcp::new(tcp)?, &format!("ws://{addr}{path}")).await?;
            match opts.tls.clone() {
                Some(cfg) => {
                    let s = tls::connect(w, cfg).await?;
                    Ok(Carrier::from_io(s, Some(probe), peer))
                }
                None => Ok(Carrier::from_io(w, Some(probe), peer)),
            }
        }
        Transport::Wss { path } => {
            let cfg = opts.tls.clone().ok_or_else(|| need_tls(url))?;
            let probe = crate::tcp_probe(&tcp)?;
            let s = tls::connect(NudgedTcp::new(tcp)?, cfg).await?;
            let w = ws::connect(s, &format!("wss://{addr}{path}")).await?;
            Ok(Carrier::from_io(w, Some(probe), peer))
        }
    }
}

/// Server side: runs the transport's handshakes on an accepted socket and
/// returns the carrier and the client's key, if it showed one. `tls: None`
/// means plain (`--insecure`); `tls://` and `wss://` always need it.
pub async fn accept(
    tcp: TcpStream,
    transport: &Transport,
    tls_cfg: Option<Arc<rustls::ServerConfig>>,
) -> io::Result<(Carrier, Option<Fingerprint>)> {
    let peer = tcp.peer_addr()?.to_string();
    let no_tls = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "this listener needs a TLS key (--key)",
        )
    };
    match transport {
        Transport::Tcp => Ok((Carrier::from_tcp(tcp)?, None)),
        Transport::Tls => {
            let cfg = tls_cfg.ok_or_else(no_tls)?;
            crate::tune_socket(&tcp)?;
            let probe = crate::tcp_probe(&tcp)?;
            let (s, fp) = tls::accept(NudgedTcp::new(tcp)?, cfg).await?;
            Ok((Carrier::from_io(s, Some(probe), peer), fp))
        }
        Transport::Ws { path } => {
            crate::tune_socket(&tcp)?;
            let probe = crate::tcp_probe(&tcp)?;
            let w = ws::accept(NudgedTcp::new(tcp)?, path).await?;
            match tls_cfg {
                Some(cfg) => {
                    let (s, fp) = tls::accept(w, cfg).await?;
                    Ok((Carrier::from_io(s, Some(probe), peer), fp))
                }
                None => Ok((Carrier::from_io(w, Some(probe), peer), None)),
            }
        }
        Transport::Wss { path } => {
            let cfg = tls_cfg.ok_or_else(no_tls)?;
            crate::tune_socket(&tcp)?;
            let probe = crate::tcp_probe(&tcp)?;
            let (s, fp) = tls::accept(NudgedTcp::new(tcp)?, cfg).await?;
            let w = ws::accept(s, path).await?;
            Ok((Carrier::from_io(w, Some(probe), peer), fp))
        }
    }
}

/// The read half of a `cmd://` carrier owns the child, so the command is
/// killed when the session lets go of the carrier.
struct ChildReader {
    out: ChildStdout,
    _child: Child,
}

impl AsyncRead for ChildReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.out).poll_read(cx, buf)
    }
}

fn spawn_command(command: &str) -> io::Result<Carrier> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run '{command}': {e}")))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(io::Error::other("command has no stdin/stdout pipes"));
    };
    Ok(Carrier {
        reader: Box::new(ChildReader {
            out: stdout,
            _child: child,
        }),
        writer: Box::new(stdin),
        probe: None,
        urgent: None,
        peer: format!("cmd://{command}"),
    })
}

/// This process's stdin/stdout as a carrier (`longhaul server --stdio`).
pub fn stdio() -> Carrier {
    Carrier {
        reader: Box::new(tokio::io::stdin()),
        writer: Box::new(tokio::io::stdout()),
        probe: None,
        urgent: None,
        peer: "stdio".into(),
    }
}

/// Any single read+write object (a TLS or WebSocket stream) as a carrier.
pub(crate) fn split_io<S>(io: S) -> (crate::BoxRead, crate::BoxWrite)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(io);
    (Box::new(r), Box::new(w))
}

/// How often a write blocked on a full socket is tried again directly.
const NUDGE: std::time::Duration = std::time::Duration::from_millis(1);

/// A TCP socket under TLS or WebSocket whose blocked writes are retried
/// every millisecond with a direct send, instead of waiting for epoll to
/// report the socket writable. Epoll does that only once a third of the
/// send buffer is free (tens of ms on a long path), while the kernel would
/// take an interactive frame's few bytes much sooner. (Plain TCP carriers
/// get the same effect from [`crate::UrgentSend`], used only for urgent
/// frames; under TLS the bytes are already encrypted in order, so every
/// blocked write is nudged.)
///
/// Plain TCP carriers do not use it: there, nudging every blocked write
/// raised bulk throughput at 100 ms RTT from 219 to 320 Mbit/s but also
/// the interactive p99 beside it from 103 to 111 ms (docs/BENCHMARKS.md).
pub(crate) struct Nudged<T> {
    tcp: T,
    /// A duplicate of the socket's descriptor, for the direct sends.
    raw: socket2::Socket,
    retry: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The TCP socket itself, nudged (under TLS or WebSocket).
pub(crate) type NudgedTcp = Nudged<TcpStream>;

impl NudgedTcp {
    pub(crate) fn new(tcp: TcpStream) -> io::Result<NudgedTcp> {
        let raw = socket2::SockRef::from(&tcp).try_clone()?;
        Ok(Nudged::wrap(tcp, raw))
    }
}

impl<T> Nudged<T> {
    /// `raw` must be a duplicate of the descriptor `tcp` writes to.
    fn wrap(tcp: T, raw: socket2::Socket) -> Nudged<T> {
        Nudged {
            tcp,
            raw,
            retry: None,
        }
    }

    /// After the runtime said "not writable": try the socket itself, and
    /// if it really is full, make sure we are polled again soon.
    fn nudge(
        &mut self,
        cx: &mut Context<'_>,
        send: impl FnOnce(&socket2::Socket) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        match send(&self.raw) {
            Ok(n) => {
                self.retry = None;
                Poll::Ready(Ok(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let sleep = self
                    .retry
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(NUDGE)));
                if sleep.as_mut().poll(cx).is_ready() {
                    // Fired: re-arm so the next poll has a timer again.
                    sleep.as_mut().reset(tokio::time::Instant::now() + NUDGE);
                    let _ = sleep.as_mut().poll(cx);
                }
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Nudged<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Nudged<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.tcp).poll_write(cx, buf) {
            Poll::Pending => self.nudge(cx, |s| s.send(buf)),
            ready => {
                self.retry = None;
                ready
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.nudge(cx, |s| s.send_vectored(bufs)),
            ready => {
                self.retry = None;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
