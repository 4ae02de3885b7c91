//! SOCKS5 front end (RFC 1928): no-auth method, CONNECT to IPv4, IPv6 and
//! domain names. The server's failure reason maps straight to the SOCKS5
//! reply code (JMUX reason codes are SOCKS5's).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use longhaul_proto::frame::format_dest;
use longhaul_session::SessionHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Time a SOCKS client has to state its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub const REP_SUCCEEDED: u8 = 0;
pub const REP_GENERAL_FAILURE: u8 = 1;
pub const REP_COMMAND_NOT_SUPPORTED: u8 = 7;
pub const REP_ADDRESS_TYPE_NOT_SUPPORTED: u8 = 8;

async fn reply(sock: &mut TcpStream, code: u8) -> std::io::Result<()> {
    sock.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await
}

/// Reads the greeting and request; returns the destination URL.
async fn read_request(sock: &mut TcpStream) -> std::io::Result<Result<String, u8>> {
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
    if req[1] != 1 {
        return Ok(Err(REP_COMMAND_NOT_SUPPORTED));
    }
    Ok(Ok(format_dest(&host, u16::from_be_bytes(port))))
}

/// Serves one SOCKS5 client.
pub async fn serve(mut sock: TcpStream, session: SessionHandle) {
    let req = tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut sock)).await;
    let dest = match req {
        Ok(Ok(Ok(dest))) => dest,
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
