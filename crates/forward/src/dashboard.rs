//! The `--metrics` listener: Prometheus' `/metrics`, and the read-only page: sessions, their
//! streams and flows, and live rates, drawn in the browser from
//! `status.json`. No outside assets (it works offline), nothing it can
//! change; peer-chosen strings travel as JSON and are put on the page as
//! text only, and the headers forbid anything but this page's own script.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::metrics::Metrics;

const PAGE: &str = include_str!("../assets/dashboard.html");
const SCRIPT: &str = include_str!("../assets/dashboard.js");

/// Sessions listed in `status.json`, and streams per session: a page for
/// people, bounded whatever the server holds (the counts say how many).
pub const WEB_SESSIONS: usize = 500;
pub const WEB_STREAMS: usize = 100;

/// Headers every answer carries: only this page's own script runs, and
/// nothing is sniffed or framed.
pub const HEADERS: &str = "Content-Security-Policy: default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self'; frame-ancestors 'none'\r\nX-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\n";

/// How long one snapshot serves every request for `status.json`: however
/// many ask, it is built at most once per this long.
const SNAPSHOT_TTL: std::time::Duration = std::time::Duration::from_millis(900);

/// Whether the request's `Host` is an address or `localhost` (or absent,
/// HTTP/1.0): a page elsewhere whose name was made to point here (DNS
/// rebinding) names its own host, and is refused.
fn host_ok(head: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(head) else {
        return false;
    };
    let Some(v) = text.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case("host").then(|| v.trim())
    }) else {
        return true;
    };
    let host = match v.strip_prefix('[') {
        Some(r) => r.split_once(']').map_or(r, |(h, _)| h),
        None => v.rsplit_once(':').map_or(v, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok()
}

/// The answer to a request head: status, content type, body.
pub(crate) fn answer(
    head: &[u8],
    m: &Arc<Metrics>,
    role: &str,
    started: Instant,
) -> (&'static str, &'static str, String) {
    let path = head
        .strip_prefix(b"GET ")
        .and_then(|r| r.split(|&b| b == b' ').next())
        .unwrap_or_default();
    // The page and its data only by address (scrapers of /metrics may
    // use a name, as they always could).
    if path != b"/metrics" && !host_ok(head) {
        return (
            "421 Misdirected Request",
            "text/plain; charset=utf-8",
            "open the dashboard by this listener's address (an IP address or localhost)\n".into(),
        );
    }
    match path {
        b"/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            m.render(),
        ),
        b"/" | b"/index.html" => ("200 OK", "text/html; charset=utf-8", PAGE.into()),
        b"/dashboard.js" => ("200 OK", "text/javascript; charset=utf-8", SCRIPT.into()),
        b"/status.json" => ("200 OK", "application/json", cached(m, role, started)),
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "try /metrics, or / for the dashboard\n".into(),
        ),
    }
}

/// The bounded snapshot, built at most once per [`SNAPSHOT_TTL`].
fn cached(m: &Arc<Metrics>, role: &str, started: Instant) -> String {
    static LAST: std::sync::Mutex<Option<(Instant, String)>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, body)) = last.as_ref() {
        if at.elapsed() < SNAPSHOT_TTL {
            return body.clone();
        }
    }
    let body = bounded(crate::status::snapshot(role, started, m, WEB_SESSIONS)).to_string();
    *last = Some((Instant::now(), body.clone()));
    body
}

/// The snapshot cut to [`WEB_SESSIONS`] sessions of [`WEB_STREAMS`]
/// streams each, with the totals.
fn bounded(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(sessions) = v["sessions"].as_array_mut() {
        for s in sessions.iter_mut() {
            if let Some(streams) = s["streams"].as_array_mut() {
                let n = streams.len();
                streams.truncate(WEB_STREAMS);
                s["streams_total"] = n.into();
            }
        }
    }
    v
}

/// Scrapes answered at once.
const MAX_SCRAPES: usize = 16;
/// Longest request head the endpoint reads.
const MAX_REQUEST: usize = 8 * 1024;
/// Time a scraper has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `GET /metrics` on `addr`, and the read-only dashboard: `GET /`
/// (a page with no outside assets), `/dashboard.js` and `/status.json`
/// (what `longhaul status` shows, bounded: see [`WEB_SESSIONS`]);
/// anything else: 404. `role`: "server" or "client". Returns the bound
/// address; the endpoint runs until the runtime ends.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    role: &'static str,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    let started = std::time::Instant::now();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = longhaul_carrier::accept_with_backoff(&listener, "--metrics").await;
            // More scrapers than this at once: closed without an answer.
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let m = metrics.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let mut buf = Vec::with_capacity(1024);
                let head = tokio::time::timeout(REQUEST_TIMEOUT, async {
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_REQUEST {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return false,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    true
                })
                .await;
                if !matches!(head, Ok(true)) {
                    return;
                }
                let (status, kind, body) = answer(&buf, &m, role, started);
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n{body}",
                    body.len(),
                    HEADERS
                );
                // A reader that never reads does not keep its slot.
                let _ = tokio::time::timeout(REQUEST_TIMEOUT * 2, async {
                    sock.write_all(reply.as_bytes()).await?;
                    sock.shutdown().await
                })
                .await;
            });
        }
    });
    Ok(bound)
}
