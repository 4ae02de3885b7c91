//! Building carriers from URLs: transport, then (where it applies) TLS.

use std::io;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout};

use crate::fill::UrgentFlag;
use crate::keys::Fingerprint;
use crate::url::{CarrierUrl, Transport};
use crate::{set_congestion, tls, ws, Carrier};

/// How to dial: TLS settings (None: no TLS layer, `--insecure`) and the
/// carrier's congestion control.
#[derive(Clone, Default)]
pub struct DialOptions {
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub congestion: Option<String>,
    /// Leave from this local address (an uplink of its own, for the lanes
    /// of a striped session bonding several).
    pub bind: Option<std::net::IpAddr>,
    /// The server instance that holds the session this carrier joins (a
    /// resume, a lane): sent as the TLS server name and in the WebSocket
    /// upgrade's `Longhaul-Instance` header, where a load balancer can
    /// route on it without terminating longhaul's TLS. See
    /// `longhaul_proto::resume::instance`.
    pub instance: Option<String>,
}

fn need_tls(url: &CarrierUrl) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{url} needs TLS settings"),
    )
}

/// Connects to `addr` from the local address `local` (the first of
/// `addr`'s addresses of the same family).
async fn connect_from(local: std::net::IpAddr, addr: &str) -> io::Result<TcpStream> {
    let to = tokio::net::lookup_host(addr)
        .await?
        .find(|a| a.is_ipv4() == local.is_ipv4())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("{addr} has no address of the same family as {local}"),
            )
        })?;
    let sock = match local {
        std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    sock.bind(std::net::SocketAddr::new(local, 0))
        .map_err(|e| io::Error::new(e.kind(), format!("cannot leave from {local}: {e}")))?;
    sock.connect(to).await
}

/// Connects a carrier. For `cmd://` the command runs until the carrier's
/// read half is dropped.
pub async fn dial(url: &CarrierUrl, opts: &DialOptions) -> io::Result<Carrier> {
    let (transport, addr) = match url {
        CarrierUrl::Cmd { command } => return spawn_command(command),
        CarrierUrl::Dir(folder) => {
            return over_folder(crate::folder::dial(folder)?, opts.tls.clone()).await
        }
        CarrierUrl::Net { transport, addr } => (transport, addr),
    };
    if *transport == Transport::Quic {
        let cfg = opts.tls.clone().ok_or_else(|| need_tls(url))?;
        let (cc, name) = (opts.congestion.as_deref(), opts.instance.as_deref());
        return crate::quic::dial(addr, cfg, cc, opts.bind, name, url.to_string()).await;
    }
    let tcp = match opts.bind {
        None => TcpStream::connect(addr.as_str()).await?,
        Some(local) => connect_from(local, addr).await?,
    };
    if let Some(cc) = &opts.congestion {
        set_congestion(&tcp, cc)?;
    }
    // No Nagle under TLS and WebSocket too: small records must not wait
    // for an ACK (40 ms with delayed ACKs).
    crate::tune_carrier_socket(&tcp)?;
    let peer = url.to_string();
    let flag = UrgentFlag::default();
    let name = opts.instance.as_deref();
    match transport {
        Transport::Tcp => Carrier::from_tcp(tcp),
        // Dialed above, over UDP.
        Transport::Quic => Err(io::Error::other("quic:// takes no TCP connection")),
        Transport::Tls => {
            let cfg = opts.tls.clone().ok_or_else(|| need_tls(url))?;
            let (filler, probe) = crate::filler_and_probe(tcp, &flag)?;
            let s = tls::connect_named(filler, cfg, name).await?;
            let b = tls::binding(s.get_ref().1);
            Ok(Carrier::from_io(s, Some(probe), Some(flag), peer).bound(b))
        }
        Transport::Ws { path } => {
            let (filler, probe) = crate::filler_and_probe(tcp, &flag)?;
            let w = ws::connect_to(filler, &format!("ws://{addr}{path}"), name).await?;
            match opts.tls.clone() {
                Some(cfg) => {
                    let s = tls::connect_named(w, cfg, name).await?;
                    let b = tls::binding(s.get_ref().1);
                    Ok(Carrier::from_io(s, Some(probe), Some(flag), peer).bound(b))
                }
                None => Ok(Carrier::from_io(w, Some(probe), Some(flag), peer)),
            }
        }
        Transport::Wss { path } => {
            let cfg = opts.tls.clone().ok_or_else(|| need_tls(url))?;
            let (filler, probe) = crate::filler_and_probe(tcp, &flag)?;
            let s = tls::connect_named(filler, cfg, name).await?;
            let b = tls::binding(s.get_ref().1);
            let w = ws::connect_to(s, &format!("wss://{addr}{path}"), name).await?;
            Ok(Carrier::from_io(w, Some(probe), Some(flag), peer).bound(b))
        }
    }
}

/// Client side of a folder carrier: TLS inside the files, unless
/// `--insecure`.
async fn over_folder(
    stream: crate::folder::FolderStream,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> io::Result<Carrier> {
    let peer = stream.peer.clone();
    match tls {
        Some(cfg) => {
            let s = tls::connect(stream, cfg).await?;
            let b = tls::binding(s.get_ref().1);
            Ok(Carrier::from_io(s, None, None, peer).bound(b))
        }
        None => Ok(Carrier::from_folder(stream)),
    }
}

/// Server side of a folder carrier: TLS inside the files (`tls: None` is
/// `--insecure`), and the client's key if it showed one.
pub async fn accept_folder(
    stream: crate::folder::FolderStream,
    tls_cfg: Option<Arc<rustls::ServerConfig>>,
) -> io::Result<(Carrier, Option<Fingerprint>)> {
    let peer = stream.peer.clone();
    match tls_cfg {
        Some(cfg) => {
            let (s, fp) = tls::accept(stream, cfg).await?;
            let b = tls::binding(s.get_ref().1);
            Ok((Carrier::from_io(s, None, None, peer).bound(b), fp))
        }
        None => Ok((Carrier::from_folder(stream), None)),
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
    let flag = UrgentFlag::default();
    match transport {
        Transport::Tcp => Ok((Carrier::from_tcp(tcp)?, None)),
        Transport::Quic => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "quic:// is not accepted on a TCP socket",
        )),
        Transport::Tls => {
            let cfg = tls_cfg.ok_or_else(no_tls)?;
            crate::tune_carrier_socket(&tcp)?;
            let (filler, probe) = crate::filler_and_probe(tcp, &flag)?;
            let (s, fp) = tls::accept(filler, cfg).await?;
            let b = tls::binding(s.get_ref().1);
            Ok((
                Carrier::from_io(s, Some(probe), Some(flag), peer).bound(b),
                fp,
            ))
        }
        Transport::Ws { path } => {
            crate::tune_carrier_socket(&tcp)?;
            let (filler, probe) = crate::filler_and_probe(tcp, &flag)?;
            let w = ws::accept(filler, path).await?;
            match tls_cfg {
                Some(cfg) => {
                    let (s, fp) = tls::accept(w, cfg).await?;
                    let b = tls::binding(s.get_ref().1);
                    Ok((
                        Carrier::from_io(s, Some(probe), Some(flag), peer).bound(b),
                        fp,
                    ))
                }
                None => Ok((Carrier::from_io(w, Some(probe), Some(flag), peer), None)),
            }
        }
        Transport::Wss { path } => {
            let cfg = tls_cfg.ok_or_else(no_tls)?;
            crate::tune_carrier_socket(&tcp)?;
            let (filler, probe) = crate::filler_and_probe(tcp, &flag)?;
            let (s, fp) = tls::accept(filler, cfg).await?;
            let b = tls::binding(s.get_ref().1);
            let w = ws::accept(s, path).await?;
            Ok((
                Carrier::from_io(w, Some(probe), Some(flag), peer).bound(b),
                fp,
            ))
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
    let mut child = crate::sys::shell(command)
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
        urgent_flag: None,
        datagrams: None,
        peer: format!("cmd://{command}"),
        binding: None,
    })
}

/// This process's stdin/stdout as a carrier (`longhaul server --stdio`).
pub fn stdio() -> Carrier {
    Carrier {
        reader: Box::new(tokio::io::stdin()),
        writer: Box::new(tokio::io::stdout()),
        probe: None,
        urgent: None,
        urgent_flag: None,
        datagrams: None,
        peer: "stdio".into(),
        binding: None,
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
