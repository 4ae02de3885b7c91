//! `longhaul bench rr`: seed 000's method — for each size, N request/response
//! round trips of that size; mean, p50, p99 and round trips per second.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::stats::percentile;
use crate::*;

#[derive(Debug, Clone)]
pub struct RrOptions {
    pub addr: String,
    pub sizes: Vec<u32>,
    pub count: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RrRow {
    pub size: u32,
    pub count: usize,
    pub mean_us: f64,
    pub p50_us: f64,
    #[serde(default)]
    pub p90_us: f64,
    pub p99_us: f64,
    #[serde(default)]
    pub max_us: f64,
    pub round_trips_per_sec: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RrResult {
    pub addr: String,
    pub rows: Vec<RrRow>,
}

pub async fn run(opts: RrOptions) -> std::io::Result<RrResult> {
    let mut s = connect(&opts.addr, None).await?;
    s.write_all(&hello(MODE_RR, crate::send::Sender::Iperf, 0, 0))
        .await?;
    let mut rows = vec![];
    for &size in &opts.sizes {
        if size > MAX_RR_SIZE {
            return Err(std::io::Error::other(format!(
                "rr size {size} above the limit {MAX_RR_SIZE}"
            )));
        }
        let mut req = Vec::with_capacity(4 + size as usize);
        req.extend_from_slice(&size.to_be_bytes());
        req.extend((0..size).map(|i| i as u8));
        let mut resp = vec![0u8; size as usize];
        let mut samples = Vec::with_capacity(opts.count);
        // One warm-up round trip per size, not counted.
        for i in 0..=opts.count {
            let t = Instant::now();
            s.write_all(&req).await?;
            s.read_exact(&mut resp).await?;
            if i > 0 {
                samples.push(t.elapsed());
            }
        }
        if resp[..] != req[4..] {
            return Err(std::io::Error::other("rr echo came back altered"));
        }
        let total: Duration = samples.iter().sum();
        let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        us.sort_by(|a, b| a.total_cmp(b));
        rows.push(RrRow {
            size,
            count: samples.len(),
            mean_us: us.iter().sum::<f64>() / us.len().max(1) as f64,
            p50_us: percentile(&us, 50.0),
            p90_us: percentile(&us, 90.0),
            p99_us: percentile(&us, 99.0),
            max_us: us.last().copied().unwrap_or(0.0),
            round_trips_per_sec: samples.len() as f64 / total.as_secs_f64().max(1e-9),
        });
    }
    Ok(RrResult {
        addr: opts.addr,
        rows,
    })
}

impl RrResult {
    pub fn human(&self) -> String {
        let mut out = format!(
            "{:>8} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            "size", "n", "mean µs", "p50 µs", "p90 µs", "p99 µs", "max µs", "rt/s"
        );
        for r in &self.rows {
            out += &format!(
                "{:>8} {:>7} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.0}\n",
                r.size,
                r.count,
                r.mean_us,
                r.p50_us,
                r.p90_us,
                r.p99_us,
                r.max_us,
                r.round_trips_per_sec
            );
        }
        out
    }
}
