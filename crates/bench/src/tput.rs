//! `longhaul bench tput`: N parallel connections, per-stream and total
//! throughput, Jain's fairness, CPU used.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::send::{send_until, Sender, BLOCK};
use crate::stats::{cpu_seconds, fmt_bps, jain};
use crate::*;

#[derive(Debug, Clone)]
pub struct TputOptions {
    pub addr: String,
    pub parallel: usize,
    pub duration: Duration,
    /// Server sends, client receives (iperf's -R).
    pub reverse: bool,
    /// Fixed SO_SNDBUF/SO_RCVBUF.
    pub buffer: Option<u32>,
    /// Print a line per interval (None: quiet).
    pub interval: Option<Duration>,
    /// Warm-up not measured (iperf3's `-O`): slow start and window growth.
    pub omit: Duration,
    /// How the sending side writes.
    pub sender: Sender,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamResult {
    /// Bytes received after the warm-up.
    pub bytes: u64,
    /// From the end of the warm-up to the last byte received.
    pub seconds: f64,
    pub bytes_per_sec: f64,
    /// Bytes received during the warm-up (not in the rate).
    #[serde(default)]
    pub omitted_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TputResult {
    pub addr: String,
    pub parallel: usize,
    pub reverse: bool,
    pub seconds: f64,
    pub streams: Vec<StreamResult>,
    pub total_bytes: u64,
    pub total_bytes_per_sec: f64,
    pub bits_per_sec: f64,
    pub jain: f64,
    pub cpu_seconds: f64,
    /// The warm-up left out of every figure above, in seconds.
    #[serde(default)]
    pub omit_seconds: f64,
    /// How the sending side wrote.
    #[serde(default)]
    pub sender: Sender,
}

async fn one_stream(
    opts: Arc<TputOptions>,
    counter: Arc<AtomicU64>,
) -> std::io::Result<StreamResult> {
    let mut s = connect(&opts.addr, opts.buffer).await?;
    let ms = opts.duration.as_millis().min(MAX_DURATION_MS as u128) as u32;
    let omit_ms = opts.omit.as_millis().min(MAX_DURATION_MS as u128) as u32;
    let mode = if opts.reverse {
        MODE_DOWNLOAD
    } else {
        MODE_UPLOAD
    };
    s.write_all(&hello(mode, opts.sender, ms, omit_ms)).await?;
    let (omitted, bytes, seconds) = if opts.reverse {
        let mut buf = vec![0u8; BLOCK];
        let mut meter = ReceiveMeter::new(opts.omit);
        loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            meter.add(n);
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
        (meter.omitted, meter.measured, meter.seconds())
    } else {
        // For the warm-up plus the measured time.
        let end = Instant::now() + opts.omit + opts.duration;
        send_until(&mut s, opts.sender, end, Some(&counter)).await?;
        s.shutdown().await?;
        let mut got = [0u8; 24];
        s.read_exact(&mut got).await?;
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&got[i * 8..i * 8 + 8]);
            u64::from_be_bytes(b)
        };
        (word(0), word(1), word(2) as f64 / 1e6)
    };
    Ok(StreamResult {
        bytes,
        seconds,
        bytes_per_sec: if seconds > 0.0 {
            bytes as f64 / seconds
        } else {
            0.0
        },
        omitted_bytes: omitted,
    })
}

/// Runs the test. Every stream's bytes are counted at the receiver.
pub async fn run(opts: TputOptions) -> std::io::Result<TputResult> {
    let opts = Arc::new(opts);
    let cpu0 = cpu_seconds();
    let counter = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = vec![];
    for _ in 0..opts.parallel.max(1) {
        tasks.push(tokio::spawn(one_stream(opts.clone(), counter.clone())));
    }
    let reporter = opts.interval.map(|iv| {
        let counter = counter.clone();
        tokio::spawn(async move {
            let mut last = 0u64;
            let mut t = Instant::now();
            loop {
                tokio::time::sleep(iv).await;
                let now = counter.load(Ordering::Relaxed);
                let dt = t.elapsed().as_secs_f64();
                t = Instant::now();
                eprintln!(
                    "[{:6.1}s] {}",
                    start.elapsed().as_secs_f64(),
                    fmt_bps((now - last) as f64 / dt)
                );
                last = now;
            }
        })
    });
    let mut streams = vec![];
    for t in tasks {
        streams.push(t.await.map_err(std::io::Error::other)??);
    }
    if let Some(r) = reporter {
        r.abort();
    }
    let seconds = streams.iter().map(|s| s.seconds).fold(0.0, f64::max);
    let total_bytes: u64 = streams.iter().map(|s| s.bytes).sum();
    let rates: Vec<f64> = streams.iter().map(|s| s.bytes_per_sec).collect();
    let total_bytes_per_sec: f64 = rates.iter().sum();
    Ok(TputResult {
        addr: opts.addr.clone(),
        parallel: streams.len(),
        reverse: opts.reverse,
        seconds,
        jain: jain(&rates),
        omit_seconds: opts.omit.as_secs_f64(),
        sender: opts.sender,
        streams,
        total_bytes,
        total_bytes_per_sec,
        bits_per_sec: total_bytes_per_sec * 8.0,
        cpu_seconds: cpu_seconds() - cpu0,
    })
}

impl TputResult {
    pub fn human(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.streams.iter().enumerate() {
            out += &format!(
                "[{:3}] {:8.2} s {:10.1} MB  {}\n",
                i + 1,
                s.seconds,
                s.bytes as f64 / 1e6,
                fmt_bps(s.bytes_per_sec)
            );
        }
        out += &format!(
            "[SUM] {:8.2} s {:10.1} MB  {}   fairness (Jain) {:.3}   cpu {:.2} s\n",
            self.seconds,
            self.total_bytes as f64 / 1e6,
            fmt_bps(self.total_bytes_per_sec),
            self.jain,
            self.cpu_seconds
        );
        out += &format!(
            "      sender: {} ({})\n",
            self.sender.name(),
            match self.sender {
                Sender::Iperf => "up to ten 128 KiB blocks per wake-up, as iperf3",
                Sender::Fill => "writes until the socket refuses",
            }
        );
        if self.omit_seconds > 0.0 {
            let omitted: u64 = self.streams.iter().map(|s| s.omitted_bytes).sum();
            out += &format!(
                "      (a {:.1} s warm-up before that, {:.1} MB, is not counted)\n",
                self.omit_seconds,
                omitted as f64 / 1e6
            );
        }
        out
    }
}
