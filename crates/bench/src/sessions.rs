//! Many sessions at one server: `longhaul bench sessions` starts N clients
//! in this process, each its own session (carrier, TLS, hello, attach) with
//! one stream held open to a target, `concurrency` at a time, and says how
//! fast they came up (handshakes per second, and each one's time to its
//! first stream). The server's memory and CPU per session are read from
//! outside (`scripts/many_sessions.py`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_forward::{Client, ClientConfig};
use serde::Serialize;
use tokio::sync::Semaphore;

pub struct SessionsOptions {
    pub client: ClientConfig,
    pub count: usize,
    pub concurrency: usize,
    /// Where each session's stream goes (`tcp://host:port`).
    pub dest: String,
}

/// The sessions that came up, each with its stream: held until dropped
/// or [`Held::hold`] ends.
pub struct Held(Vec<(Client, longhaul_session::Opened)>);

impl Held {
    /// Keeps every session for `d`, then stops them.
    pub async fn hold(self, d: Duration) {
        tokio::time::sleep(d).await;
        for (client, _) in &self.0 {
            client.stop("bench over");
        }
    }
}

#[derive(Debug, Serialize)]
pub struct SessionsReport {
    pub sessions: usize,
    pub failed: usize,
    /// From the first dial to the last session with its stream.
    pub seconds: f64,
    pub per_second: f64,
    /// Time from dial to an open stream, per session.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub first_error: Option<String>,
}

impl SessionsReport {
    pub fn human(&self) -> String {
        format!(
            "{} sessions with a stream each in {:.2} s: {:.0} per second; dial to open stream p50 {:.1} ms, p99 {:.1} ms; {} failed{}\n",
            self.sessions,
            self.seconds,
            self.per_second,
            self.p50_ms,
            self.p99_ms,
            self.failed,
            self.first_error
                .as_deref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        )
    }
}

pub async fn run(o: SessionsOptions) -> (SessionsReport, Held) {
    let gate = Arc::new(Semaphore::new(o.concurrency.max(1)));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..o.count {
        let gate = gate.clone();
        let cfg = o.client.clone();
        let dest = o.dest.clone();
        tasks.spawn(async move {
            let permit = gate.acquire_owned().await.expect("never closed");
            let t = Instant::now();
            let client = Client::start(cfg).await.map_err(|e| format!("{e:#}"))?;
            let stream = client
                .session()
                .open(&dest)
                .await
                .map_err(|e| e.to_string())?;
            drop(permit);
            Ok::<_, String>((t.elapsed(), client, stream))
        });
    }
    let mut held = Vec::with_capacity(o.count);
    let mut times = Vec::with_capacity(o.count);
    let (mut failed, mut first_error) = (0, None);
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok((t, client, stream))) => {
                times.push(t);
                held.push((client, stream));
            }
            Ok(Err(e)) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    times.sort();
    let pct = |p: usize| {
        times
            .get((times.len() * p / 100).min(times.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let report = SessionsReport {
        sessions: held.len(),
        failed,
        seconds,
        per_second: held.len() as f64 / seconds.max(1e-9),
        p50_ms: pct(50),
        p99_ms: pct(99),
        first_error,
    };
    (report, Held(held))
}
