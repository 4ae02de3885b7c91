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
    match path {
        b"/metrics" => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            m.render(),
        ),
        b"/" | b"/index.html" => ("200 OK", "text/html; charset=utf-8", PAGE.into()),
        b"/dashboard.js" => ("200 OK", "text/javascript; charset=utf-8", SCRIPT.into()),
        b"/status.json" => (
            "200 OK",
            "application/json",
            bounded(crate::status::snapshot(role, started, m)).to_string(),
        ),
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "try /metrics, or / for the dashboard\n".into(),
        ),
    }
}

/// The snapshot cut to [`WEB_SESSIONS`] sessions of [`WEB_STREAMS`]
/// streams each, with the totals.
fn bounded(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(sessions) = v["sessions"].as_array_mut() {
        let total = sessions.len();
        sessions.truncate(WEB_SESSIONS);
        for s in sessions.iter_mut() {
            if let Some(streams) = s["streams"].as_array_mut() {
                let n = streams.len();
                streams.truncate(WEB_STREAMS);
                s["streams_total"] = n.into();
            }
        }
        v["sessions_total"] = total.into();
    }
    v
}
