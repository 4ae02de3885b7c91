//! HTTP CONNECT front end: `CONNECT host:port HTTP/1.1`, answered with 200
//! on success, 403 when the server's rules refuse, 504 on timeout and 502
//! for other failures.

use std::time::Duration;

use longhaul_proto::frame::format_dest;
use longhaul_proto::Reason;
use longhaul_session::SessionHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest request head accepted.
const MAX_HEAD: usize = 8 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads the request head one byte at a time so nothing past it is consumed
/// (a client may send its first bytes right after the head).
async fn read_head(sock: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(256);
    let mut b = [0u8; 1];
    while head.len() < MAX_HEAD {
        if sock.read(&mut b).await? == 0 {
            return Ok(None);
        }
        head.push(b[0]);
        if head.ends_with(b"\r\n\r\n") {
            return Ok(Some(head));
        }
    }
    Ok(None)
}

/// The target of a CONNECT request line, as `(host, port)`.
pub fn parse_connect(head: &[u8]) -> Result<(String, u16), &'static str> {
    let text = std::str::from_utf8(head).map_err(|_| "400 Bad Request")?;
    let line = text.lines().next().ok_or("400 Bad Request")?;
    let mut parts = line.split_whitespace();
    let method = parts.next().ok_or("400 Bad Request")?;
    let authority = parts.next().ok_or("400 Bad Request")?;
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err("400 Bad Request");
    }
    if method != "CONNECT" {
        return Err("405 Method Not Allowed");
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or("400 Bad Request")?;
        (h, p)
    } else {
        authority.rsplit_once(':').ok_or("400 Bad Request")?
    };
    let port: u16 = port.parse().map_err(|_| "400 Bad Request")?;
    if host.is_empty() || port == 0 {
        return Err("400 Bad Request");
    }
    Ok((host.to_owned(), port))
}

/// Answers with `status` and a line of text that says why (and what to do).
async fn respond(sock: &mut TcpStream, status: &str, why: &str) {
    let body = match (status, why) {
        (s, _) if s.starts_with("405") => "this is an HTTP CONNECT proxy (longhaul --http-proxy): it serves only CONNECT HOST:PORT; set it as your program's HTTPS proxy (e.g. https_proxy=http://this-address)\n".to_string(),
        (s, _) if s.starts_with("400") => "expected a request line CONNECT HOST:PORT HTTP/1.1\n".to_string(),
        (_, why) => format!("{why}\n"),
    };
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = sock.write_all(msg.as_bytes()).await;
}

pub async fn serve(mut sock: TcpStream, session: SessionHandle) {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut sock)).await {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) => return respond(&mut sock, "400 Bad Request", "").await,
        _ => return,
    };
    let (host, port) = match parse_connect(&head) {
        Ok(t) => t,
        Err(status) => return respond(&mut sock, status, "").await,
    };
    let dest = format_dest(&host, port);
    match session.open(&dest).await {
        Ok(opened) => {
            if sock
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_ok()
            {
                opened.attach(sock);
            }
        }
        Err(e) => {
            let why = longhaul_session::logs::escaped(&e);
            tracing::info!(dest = %longhaul_session::logs::shown(&dest), "CONNECT failed: {why}");
            let status = match e.reason {
                Reason::NOT_ALLOWED => "403 Forbidden",
                Reason::TTL_EXPIRED => "504 Gateway Timeout",
                _ => "502 Bad Gateway",
            };
            // The server's words, escaped (no line of theirs reaches the
            // client's program raw).
            respond(&mut sock, status, &why).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_lines() {
        assert_eq!(
            parse_connect(b"CONNECT a.b:443 HTTP/1.1\r\nHost: a.b\r\n\r\n"),
            Ok(("a.b".into(), 443))
        );
        assert_eq!(
            parse_connect(b"CONNECT [::1]:80 HTTP/1.0\r\n\r\n"),
            Ok(("::1".into(), 80))
        );
        assert_eq!(
            parse_connect(b"GET / HTTP/1.1\r\n\r\n"),
            Err("405 Method Not Allowed")
        );
        assert_eq!(
            parse_connect(b"CONNECT a.b HTTP/1.1\r\n\r\n"),
            Err("400 Bad Request")
        );
        assert_eq!(parse_connect(b"\xff\r\n\r\n"), Err("400 Bad Request"));
    }
}
