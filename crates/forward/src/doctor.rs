//! The server's side of `longhaul doctor`: its network limits, and bytes
//! to measure with — over the session, and over one plain TCP connection
//! with default buffers. Only for authenticated clients (it is a stream
//! like any other); at most [`MAX_SECONDS`] of sending per request and
//! [`MAX_AT_ONCE`] requests at a time. The plain connection is listened
//! for only on the address the client's carrier came in on, and served to
//! the client's address alone, once: over stdio or a folder, where that
//! address is unknown, it is refused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use longhaul_session::LocalStream;

use crate::server_config::Ends;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// The destination a client opens for it.
pub const SERVICE: &str = "longhaul://doctor";
/// Longest a source runs.
pub const MAX_SECONDS: u64 = 30;
/// Doctor streams served at once by one server.
pub const MAX_AT_ONCE: usize = 4;
/// How long the plain TCP listener waits for the client.
const DIRECT_WAIT: Duration = Duration::from_secs(10);

static BUSY: AtomicUsize = AtomicUsize::new(0);

/// A host's TCP limits, as `sysctl` shows them.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    pub tcp_rmem: [u64; 3],
    pub tcp_wmem: [u64; 3],
    pub rmem_max: u64,
    pub wmem_max: u64,
    pub congestion: String,
    pub window_scaling: bool,
}

impl Limits {
    /// This host's (this network namespace's).
    pub fn local() -> Limits {
        let read =
            |k: &str| std::fs::read_to_string(format!("/proc/sys/net/{k}")).unwrap_or_default();
        let triple = |k: &str| {
            let v: Vec<u64> = read(k)
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            [
                v.first().copied().unwrap_or(0),
                v.get(1).copied().unwrap_or(0),
                v.get(2).copied().unwrap_or(0),
            ]
        };
        let one = |k: &str| read(k).trim().parse().unwrap_or(0);
        Limits {
            tcp_rmem: triple("ipv4/tcp_rmem"),
            tcp_wmem: triple("ipv4/tcp_wmem"),
            rmem_max: one("core/rmem_max"),
            wmem_max: one("core/wmem_max"),
            congestion: read("ipv4/tcp_congestion_control").trim().to_string(),
            window_scaling: one("ipv4/tcp_window_scaling") == 1,
        }
    }
}

/// Starts serving one doctor stream for the client at `ends` (None: its
/// address is unknown); returns the end the session relays.
pub(crate) fn accept(ends: Option<Ends>) -> Result<LocalStream, String> {
    if BUSY.fetch_add(1, Ordering::AcqRel) >= MAX_AT_ONCE {
        BUSY.fetch_sub(1, Ordering::AcqRel);
        return Err(format!("doctor busy ({MAX_AT_ONCE} at once)"));
    }
    let r = LocalStream::pair().and_then(|(ours, theirs)| {
        let theirs = longhaul_session::local::pair_end_async(theirs)?;
        tokio::spawn(async move {
            let _ = serve(theirs, ends).await;
            BUSY.fetch_sub(1, Ordering::AcqRel);
        });
        Ok(ours)
    });
    r.map_err(|e| {
        BUSY.fetch_sub(1, Ordering::AcqRel);
        e.to_string()
    })
}

async fn serve(
    sock: longhaul_session::local::PairStream,
    ends: Option<Ends>,
) -> std::io::Result<()> {
    let (r, mut w) = sock.into_split();
    let mut r = BufReader::new(r);
    let mut line = String::new();
    loop {
        line.clear();
        let n = tokio::time::timeout(
            Duration::from_secs(60),
            (&mut r).take(256).read_line(&mut line),
        )
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)??;
        if n == 0 {
            return Ok(());
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let secs = |i: usize| {
            Duration::from_secs(
                words
                    .get(i)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(5)
                    .min(MAX_SECONDS),
            )
        };
        match words.first().copied() {
            Some("PING") => w.write_all(b"PONG\n").await?,
            Some("INFO") => {
                let j = serde_json::to_string(&Limits::local()).unwrap_or_default();
                w.write_all(format!("{j}\n").as_bytes()).await?;
            }
            Some("SOURCE") => {
                source(&mut w, secs(1)).await?;
                return w.shutdown().await;
            }
            Some("DIRECT") => {
                let Some(ends) = ends else {
                    w.write_all(b"REFUSED no direct measurement: the client's address is unknown over this carrier (stdio or folder)\n").await?;
                    continue;
                };
                let client = ends.client.ip().to_canonical();
                let listener = TcpListener::bind((ends.local.ip().to_canonical(), 0)).await?;
                let port = listener.local_addr()?.port();
                w.write_all(format!("PORT {port}\n").as_bytes()).await?;
                let deadline = Instant::now() + DIRECT_WAIT;
                // Only the client's own address gets the bytes; others
                // are closed unanswered.
                let sock = loop {
                    let (s, from) = tokio::time::timeout_at(deadline.into(), listener.accept())
                        .await
                        .map_err(|_| std::io::ErrorKind::TimedOut)??;
                    if from.ip().to_canonical() == client {
                        break s;
                    }
                };
                // One connection: nobody else gets in after it.
                drop(listener);
                let (_, mut sw) = sock.into_split();
                source(&mut sw, secs(1)).await?;
                let _ = sw.shutdown().await;
            }
            _ => return Ok(()),
        }
    }
}

/// Writes zeros for `d`.
async fn source(w: &mut (impl AsyncWrite + Unpin), d: Duration) -> std::io::Result<()> {
    let block = vec![0u8; 256 * 1024];
    let end = Instant::now() + d;
    while Instant::now() < end {
        w.write_all(&block).await?;
    }
    Ok(())
}

/// Reads until EOF (or `d` passes), counting what arrives after `omit`:
/// bits per second.
pub async fn sink(r: &mut (impl AsyncRead + Unpin), omit: Duration) -> std::io::Result<f64> {
    let mut buf = vec![0u8; 256 * 1024];
    let start = Instant::now();
    let (mut bytes, mut since) = (0u64, None::<Instant>);
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        // The read that opens the window arrived before it: not counted.
        match since {
            Some(_) => bytes += n as u64,
            None if start.elapsed() >= omit => since = Some(Instant::now()),
            None => {}
        }
    }
    let secs = since.map_or(0.0, |s| s.elapsed().as_secs_f64());
    Ok(if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    })
}
