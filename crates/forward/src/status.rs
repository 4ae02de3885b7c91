//! The control channel: each running server and client answers on a local
//! control socket (on Unix the folder 0700, the socket 0600; on Windows a
//! named pipe whose access list admits the user, SYSTEM and
//! Administrators: [`crate::sys`]). An asker writes one request line —
//! `status` (a JSON snapshot of sessions and streams; also what an asker
//! that writes nothing gets) or `reload` (a server reads its configuration
//! again, as on SIGHUP) — and reads the answer to its end. `longhaul status`
//! asks every socket in the folder, or one; `longhaul reload` every server.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use longhaul_session::logs::shown;

use crate::metrics::Metrics;
use crate::sys;
pub use crate::sys::{check_private, default_dir, make_private, sockets};

/// The control sockets to ask: `one`, or every one in the default folder
/// (none from a folder another user controls: refused with why).
pub fn to_ask(one: Option<&Path>) -> std::io::Result<Vec<PathBuf>> {
    if let Some(p) = one {
        return Ok(vec![p.to_path_buf()]);
    }
    let dir = default_dir();
    if dir.symlink_metadata().is_ok() {
        check_private(&dir)?;
    }
    Ok(sockets(&dir))
}

/// The socket a process uses by default: `DIR/ROLE-PID.sock`.
pub fn default_path(role: &str) -> PathBuf {
    default_dir().join(format!("{role}-{}.sock", std::process::id()))
}

/// Removes the socket file when the process ends normally.
pub struct Control(PathBuf);

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Longest answer `status` reads from one socket.
const MAX_ANSWER: u64 = 64 << 20;
/// How long `status` waits for one answer (a reload reads files: longer).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest request line read, and how long an asker has to write it.
const MAX_REQUEST: u64 = 64;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What a reload said: done (and what it did) or refused (and why).
pub type ReloadResult = Result<String, String>;
/// What the channel's `reload` runs (a server's; a client has none).
pub type ReloadFn = Arc<dyn Fn() -> ReloadResult + Send + Sync>;

/// Serves the control channel on `path` until the runtime ends. The
/// default folder must be ours alone ([`make_private`]); a folder named
/// with `--control` is the user's choice, made 0700 if it is missing.
pub fn serve(
    path: &Path,
    role: &'static str,
    metrics: Arc<Metrics>,
    reload: Option<ReloadFn>,
) -> std::io::Result<Control> {
    let listener = sys::ControlListener::bind(path, &default_dir())?;
    let started = Instant::now();
    tokio::spawn(async move {
        loop {
            let Ok(sock) = listener.accept().await else {
                // EMFILE and the like: try again a little later.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let (metrics, reload) = (metrics.clone(), reload.clone());
            tokio::spawn(answer(sock, role, started, metrics, reload));
        }
    });
    Ok(Control(path.to_path_buf()))
}

/// Reads one request and answers it.
async fn answer(
    mut sock: sys::ControlStream,
    role: &'static str,
    started: Instant,
    metrics: Arc<Metrics>,
    reload: Option<ReloadFn>,
) {
    let mut line = Vec::new();
    // To the line's end (a named pipe's writer cannot half-close).
    let mut request = tokio::io::BufReader::new((&mut sock).take(MAX_REQUEST));
    // An asker that writes nothing and waits (an older `status`) gets a
    // snapshot once the time is up.
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, request.read_until(b'\n', &mut line)).await;
    drop(request);
    let body = match line.trim_ascii() {
        b"" | b"status" => snapshot(role, started, &metrics, usize::MAX),
        b"reload" => {
            let result = match reload {
                // Reading files: off the runtime's threads.
                Some(f) => tokio::task::spawn_blocking(move || f())
                    .await
                    .unwrap_or_else(|e| Err(format!("the reload failed: {e}"))),
                None => Err(format!("a {role} has nothing to reload")),
            };
            json!({
                "role": role,
                "pid": std::process::id(),
                "reloaded": result.is_ok(),
                "message": result.unwrap_or_else(|e| e),
            })
        }
        _ => json!({ "error": "unknown request: ask 'status' or 'reload'" }),
    };
    let _ = tokio::time::timeout(ANSWER_TIMEOUT, sock.write_all(body.to_string().as_bytes())).await;
    let _ = sock.shutdown().await;
}

/// What `status` shows: the process and (at most `most` of) its sessions
/// with their streams.
pub(crate) fn snapshot(role: &str, started: Instant, metrics: &Metrics, most: usize) -> Value {
    let all = metrics.sessions();
    let total = all.len();
    let sessions: Vec<Value> = all
        .iter()
        .take(most)
        .map(|(peer, h)| {
            let s = h.stats();
            let streams: Vec<Value> = h
                .streams()
                .iter()
                .map(|t| {
                    json!({
                        "id": t.id,
                        "dest": t.dest,
                        "local": t.local,
                        "opened_here": t.opened_here,
                        "age_s": t.age.as_secs_f64(),
                        "bytes_sent": t.bytes_sent,
                        "bytes_received": t.bytes_received,
                        "window": t.window,
                        "credit": t.credit,
                        "stalls": t.stalls,
                    })
                })
                .collect();
            json!({
                "peer": peer,
                "age_s": s.age.as_secs_f64(),
                "detached": s.detached,
                "rtt_ms": s.rtt.as_secs_f64() * 1e3,
                "lanes": h.lanes(),
                "bytes_sent": s.bytes_sent,
                "bytes_received": s.bytes_received,
                "resumes": s.resumes,
                "window_stalls": s.window_stalls,
                "datagrams": {
                    "sent": s.datagrams.sent,
                    "received": s.datagrams.received,
                    "dropped": s.datagrams.dropped,
                    "path_sent": s.datagrams.path_sent,
                    "path_received": s.datagrams.path_received,
                },
                "streams": streams,
            })
        })
        .collect();
    json!({
        "role": role,
        "pid": std::process::id(),
        "uptime_s": started.elapsed().as_secs_f64(),
        "sessions_total": total,
        "sessions": sessions,
    })
}

/// Asks one control socket for its snapshot.
pub async fn query(path: &Path) -> std::io::Result<Value> {
    ask(path, "status", ANSWER_TIMEOUT).await
}

/// Asks the server at one control socket to reload its configuration:
/// its answer has `reloaded` (true or false) and `message`.
pub async fn reload(path: &Path) -> std::io::Result<Value> {
    ask(path, "reload", RELOAD_TIMEOUT).await
}

async fn ask(path: &Path, request: &str, timeout: Duration) -> std::io::Result<Value> {
    let mut sock = sys::connect(path).await?;
    let mut buf = Vec::new();
    let exchange = async {
        sock.write_all(format!("{request}\n").as_bytes()).await?;
        sock.shutdown().await?;
        (&mut sock).take(MAX_ANSWER).read_to_end(&mut buf).await
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))??;
    serde_json::from_slice(&buf)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A snapshot for people, `ss`-style.
pub fn human(v: &Value) -> String {
    let num = |x: &Value| x.as_f64().unwrap_or(0.0);
    let mut out = format!(
        "{} pid {} (up {}), {} session(s)\n",
        shown(v["role"].as_str().unwrap_or("?")),
        v["pid"],
        dur(num(&v["uptime_s"])),
        v["sessions"].as_array().map_or(0, |a| a.len())
    );
    for s in v["sessions"].as_array().into_iter().flatten() {
        out += &format!(
            "  {}{}  up {}  rtt {:.1} ms  streams {}  sent {}  received {}{}{}\n",
            shown(s["peer"].as_str().unwrap_or("?")),
            if s["detached"] == true {
                " (detached)"
            } else {
                ""
            },
            dur(num(&s["age_s"])),
            num(&s["rtt_ms"]),
            s["streams"].as_array().map_or(0, |a| a.len()),
            bytes(num(&s["bytes_sent"])),
            bytes(num(&s["bytes_received"])),
            match s["lanes"].as_u64() {
                Some(n) if n > 1 => format!("  lanes {n}"),
                _ => String::new(),
            },
            match &s["datagrams"] {
                d if num(&d["sent"]) + num(&d["received"]) + num(&d["dropped"]) > 0.0 => format!(
                    "  datagrams sent {} received {} dropped {}{}",
                    d["sent"],
                    d["received"],
                    d["dropped"],
                    match num(&d["path_sent"]) + num(&d["path_received"]) > 0.0 {
                        true => format!(
                            " (as QUIC datagrams: sent {} received {})",
                            d["path_sent"], d["path_received"]
                        ),
                        false => String::new(),
                    }
                ),
                _ => String::new(),
            }
        );
        for t in s["streams"].as_array().into_iter().flatten() {
            // Source → target: the application here, or the peer there.
            // A target is the peer's string: escaped for the terminal.
            let local = shown(t["local"].as_str().unwrap_or("?"));
            let dest = shown(t["dest"].as_str().unwrap_or("?"));
            let (from, to) = match t["opened_here"] == true {
                true => (local.to_string(), dest.to_string()),
                false => (
                    shown(s["peer"].as_str().unwrap_or("?")).to_string(),
                    format!("{dest} ({local})"),
                ),
            };
            out += &format!(
                "    #{:<5} {from} → {to}  up {}  sent {}  received {}  window {}  credit {}\n",
                t["id"],
                dur(num(&t["age_s"])),
                bytes(num(&t["bytes_sent"])),
                bytes(num(&t["bytes_received"])),
                bytes(num(&t["window"])),
                bytes(num(&t["credit"])),
            );
        }
    }
    out
}

fn dur(s: f64) -> String {
    match s {
        s if s < 60.0 => format!("{s:.0}s"),
        s if s < 3600.0 => format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64),
        s => format!(
            "{}h{:02}m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        ),
    }
}

fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut u) = (b, 0);
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{b:.0} B"),
        _ => format!("{v:.1} {}", UNITS[u]),
    }
}
