//! The read-only page on the `--metrics` listener: sessions, their
//! streams and flows, and live rates, drawn in the browser from
//! `status.json`. No outside assets (it works offline), nothing it can
//! change; peer-chosen strings travel as JSON and are put on the page as
//! text only, and the headers forbid anything but this page's own script.

use std::sync::Arc;
use std::time::Instant;

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
