//! SOCKS5 front end (RFC 1928): no-auth method, CONNECT and UDP ASSOCIATE
//! to IPv4, IPv6 and domain names. The server's failure reason maps
//! straight to the SOCKS5 reply code (JMUX reason codes are SOCKS5's).
//!
//! A UDP association relays the datagrams of the client that asked for it
//! (its address, and its port once the first datagram came) through one
//! flow per destination (see `udp`), until the client closes the TCP
//! connection it asked on. Fragments (FRAG ≠ 0) are dropped, as RFC 1928
//! allows.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use longhaul_proto::frame::{format_dest, format_target, Transport};
use longhaul_session::logs::Throttle;
use longhaul_session::{SessionHandle, MAX_DATAGRAM};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::udp::{Flows, Reply};

/// Time a SOCKS client has to state its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub const REP_SUCCEEDED: u8 = 0;
pub const REP_GENERAL_FAILURE: u8 = 1;
pub const REP_COMMAND_NOT_SUPPORTED: u8 = 7;
pub const REP_ADDRESS_TYPE_NOT_SUPPORTED: u8 = 8;
const CMD_CONNECT: u8 = 1;
const CMD_UDP_ASSOCIATE: u8 = 3;
/// Destinations one UDP association has flows to at once.
pub const MAX_ASSOCIATION_FLOWS: usize = 256;

/// Dropped association datagrams, logged at most every few seconds.
static DROPS: Throttle = Throttle::new();

async fn reply(sock: &mut TcpStream, code: u8) -> std::io::Result<()> {
    sock.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// A request: its command and destination.
struct Request {
    cmd: u8,
    host: String,
    port: u16,
}

/// Reads the greeting and request.
async fn read_request(sock: &mut TcpStream) -> std::io::Result<Result<Request, u8>> {
    let mut hdr = [0u8; 2];
    sock.read_exact(&mut hdr).await?;
    if hdr[0] != 5 {
        return Err(std::io::Error::other("not a SOCKS5 client"));
    }
    let mut methods = vec![0u8; hdr[1] as usize];
    sock.read_exact(&mut methods).await?;
    if !methods.contains(&0) {
        sock.write_all(&[5, 0xff]).await?;
        return Err(std::io::Error::other("client offers no no-auth method"));
    }
    sock.write_all(&[5, 0]).await?;
    let mut req = [0u8; 4];
    sock.read_exact(&mut req).await?;
    if req[0] != 5 {
        return Err(std::io::Error::other("bad SOCKS5 request"));
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            sock.read_exact(&mut a).await?;
            Ipv4Addr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            sock.read_exact(&mut a).await?;
            Ipv6Addr::from(a).to_string()
        }
        3 => {
            let mut n = [0u8; 1];
            sock.read_exact(&mut n).await?;
            let mut name = vec![0u8; n[0] as usize];
            sock.read_exact(&mut name).await?;
            match String::from_utf8(name) {
                Ok(s) if !s.is_empty() => s,
                _ => return Ok(Err(REP_ADDRESS_TYPE_NOT_SUPPORTED)),
            }
        }
        _ => return Ok(Err(REP_ADDRESS_TYPE_NOT_SUPPORTED)),
    };
    let mut port = [0u8; 2];
    sock.read_exact(&mut port).await?;
    if req[1] != CMD_CONNECT && req[1] != CMD_UDP_ASSOCIATE {
        return Ok(Err(REP_COMMAND_NOT_SUPPORTED));
    }
    Ok(Ok(Request {
        cmd: req[1],
        host,
        port: u16::from_be_bytes(port),
    }))
}

/// Serves one SOCKS5 client.
pub async fn serve(mut sock: TcpStream, session: SessionHandle) {
    let req = tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut sock)).await;
    let dest = match req {
        Ok(Ok(Ok(r))) if r.cmd == CMD_UDP_ASSOCIATE && session.carries_datagrams() => {
            return associate(sock, session, r.host, r.port).await;
        }
        Ok(Ok(Ok(r))) if r.cmd == CMD_UDP_ASSOCIATE => {
            // JMUX mode: no datagrams.
            let _ = reply(&mut sock, REP_COMMAND_NOT_SUPPORTED).await;
            return;
        }
        Ok(Ok(Ok(r))) => format_dest(&r.host, r.port),
        Ok(Ok(Err(code))) => {
            let _ = reply(&mut sock, code).await;
            return;
        }
        Ok(Err(e)) => return tracing::debug!("socks5: {e}"),
        Err(_) => return tracing::debug!("socks5: request timed out"),
    };
    match session.open(&dest).await {
        Ok(opened) => {
            if reply(&mut sock, REP_SUCCEEDED).await.is_ok() {
                opened.attach(sock);
            }
        }
        Err(e) => {
            let why = longhaul_session::logs::escaped(&e);
            tracing::info!(dest = %longhaul_session::logs::shown(&dest), "socks5 connect failed: {why}");
            let code = match e.reason.0 {
                c @ 1..=8 => c as u8,
                _ => REP_GENERAL_FAILURE,
            };
            let _ = reply(&mut sock, code).await;
        }
    }
}

/// SOCKS5's address: ATYP, then the address, then the port.
fn put_addr(out: &mut Vec<u8>, host: &str, port: u16) {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => {
            out.push(1);
            out.extend_from_slice(&a.octets());
        }
        Ok(IpAddr::V6(a)) => {
            out.push(4);
            out.extend_from_slice(&a.octets());
        }
        Err(_) => {
            out.push(3);
            out.push(host.len() as u8);
            out.extend_from_slice(host.as_bytes());
        }
    }
    out.extend_from_slice(&port.to_be_bytes());
}

/// Parses a UDP request header: the destination and where the data
/// starts; `Err` says why the datagram is dropped.
fn parse_udp(d: &[u8]) -> Result<(String, u16, usize), &'static str> {
    let (&[r1, r2, frag, atyp], rest) = d.split_first_chunk::<4>().ok_or("too short")?;
    if r1 != 0 || r2 != 0 {
        return Err("reserved bytes not zero");
    }
    if frag != 0 {
        return Err("fragments are not supported");
    }
    let (host, len) = match atyp {
        1 => {
            let a: [u8; 4] = rest
                .get(..4)
                .ok_or("too short")?
                .try_into()
                .unwrap_or_default();
            (Ipv4Addr::from(a).to_string(), 4)
        }
        4 => {
            let a: [u8; 16] = rest
                .get(..16)
                .ok_or("too short")?
                .try_into()
                .unwrap_or_default();
            (Ipv6Addr::from(a).to_string(), 16)
        }
        3 => {
            let n = *rest.first().ok_or("too short")? as usize;
            let name = rest.get(1..1 + n).ok_or("too short")?;
            match std::str::from_utf8(name) {
                Ok(s) if !s.is_empty() => (s.to_owned(), 1 + n),
                _ => return Err("bad domain name"),
            }
        }
        _ => return Err("unknown address type"),
    };
    let p = rest.get(len..len + 2).ok_or("too short")?;
    Ok((host, u16::from_be_bytes([p[0], p[1]]), 4 + len + 2))
}

/// Serves a UDP ASSOCIATE until the client closes its TCP connection.
/// `host:port`: where the client says it will send from (zeros: not
/// known yet).
async fn associate(mut ctl: TcpStream, session: SessionHandle, host: String, port: u16) {
    let (Ok(local), Ok(peer)) = (ctl.local_addr(), ctl.peer_addr()) else {
        return;
    };
    let sock = match crate::udp::bind(SocketAddr::new(local.ip(), 0)) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::info!("socks5: cannot bind a UDP socket for an association: {e}");
            let _ = reply(&mut ctl, REP_GENERAL_FAILURE).await;
            return;
        }
    };
    let Ok(bound) = sock.local_addr() else { return };
    let mut answer = vec![5, REP_SUCCEEDED, 0];
    put_addr(&mut answer, &bound.ip().to_string(), bound.port());
    if ctl.write_all(&answer).await.is_err() {
        return;
    }
    // Only the client that asked: the address it named (else its TCP
    // connection's), from the port it named (else the port of the first
    // datagram that parses from that address: junk sent first by another
    // local program does not take the association).
    // (A client behind NAT may name its private address: its TCP
    // connection's address counts as well.)
    let named = host
        .parse::<IpAddr>()
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .map(|ip| ip.to_canonical());
    let peer_ip = peer.ip().to_canonical();
    let port = (port != 0).then_some(port);
    let from_client = move |from: SocketAddr| {
        let ip = from.ip().to_canonical();
        (ip == peer_ip || Some(ip) == named) && port.is_none_or(|p| p == from.port())
    };
    let same = |a: SocketAddr, b: SocketAddr| {
        a.ip().to_canonical() == b.ip().to_canonical() && a.port() == b.port()
    };
    let mut client: Option<SocketAddr> = None;
    let flows: Flows<(String, u16)> = Flows::new(MAX_ASSOCIATION_FLOWS);
    let current = session.clone();
    let session_closed = async move {
        current.closed().await;
    };
    tokio::pin!(session_closed);
    let current = session.clone();
    let session = move || (!current.is_closed()).then(|| current.clone());
    // Room for the longest header (a 255-byte name) and the longest
    // datagram a frame carries, and one byte more to see a longer one.
    let mut buf = vec![0u8; 4 + 1 + 255 + 2 + MAX_DATAGRAM + 1];
    let mut ctl_buf = [0u8; 64];
    let mut sweep = tokio::time::interval(crate::udp::SWEEP);
    loop {
        tokio::select! {
            r = sock.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                let ours = match client {
                    Some(c) => same(c, from),
                    None => from_client(from),
                };
                if !ours {
                    continue;
                }
                let (host, port, at) = match parse_udp(&buf[..n]) {
                    Ok(x) => x,
                    Err(why) => {
                        if DROPS.pass("dropped SOCKS5 datagrams") {
                            tracing::info!(%from, "socks5: dropped a datagram: {why}");
                        }
                        continue;
                    }
                };
                if !crate::udp::fits(n - at) {
                    continue;
                }
                client = Some(from);
                let payload = Bytes::copy_from_slice(&buf[at..n]);
                let dest = format_target(Transport::Udp, &host, port);
                let mut header = vec![0, 0, 0];
                put_addr(&mut header, &host, port);
                let reply = || -> Reply {
                    let sock = sock.clone();
                    Box::new(move |d: &[u8]| {
                        let mut out = Vec::with_capacity(header.len() + d.len());
                        out.extend_from_slice(&header);
                        out.extend_from_slice(d);
                        // A full socket buffer: lost, as on the network.
                        let _ = sock.try_send_to(&out, from);
                    })
                };
                flows.send((host, port), &dest, payload, reply, &session);
            }
            _ = sweep.tick() => flows.expire(),
            // The association lives as long as the TCP connection, and
            // its session: the client asks again, on the next one.
            r = ctl.read(&mut ctl_buf) => if !matches!(r, Ok(n) if n > 0) { return },
            _ = session_closed.as_mut() => return,
        }
    }
}
