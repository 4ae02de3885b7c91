//! The matrix's load generators, and the emulator's timekeeping around
//! each run.
//!
//! Seed 004 measured with iperf; when Debian's iperf3 is installed the
//! matrix can use it, so the figures come from a tool nobody here wrote.
//! Its JSON is turned into the same [`TputResult`] as `bench tput`'s.

use serde::{Deserialize, Serialize};

use crate::send::Sender;
use crate::tput::{StreamResult, TputResult};

/// Port of the iperf3 server the matrix starts on side b.
pub const IPERF3_PORT: u16 = 5202;

/// Which program produced the throughput figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// `longhaul bench tput` (iperf3's sending pattern).
    Bench,
    /// Debian's `iperf3 -c … -J`.
    Iperf3,
}

impl Load {
    /// `auto`: iperf3 when it is on the PATH.
    pub fn parse(s: &str) -> Result<Load, String> {
        match s {
            "bench" => Ok(Load::Bench),
            "iperf3" if iperf3_version().is_some() => Ok(Load::Iperf3),
            "iperf3" => Err("--load iperf3: iperf3 is not installed (apt-get install iperf3), or use --load bench".into()),
            "auto" => Ok(if iperf3_version().is_some() {
                Load::Iperf3
            } else {
                Load::Bench
            }),
            other => Err(format!("--load '{other}': use auto, bench or iperf3")),
        }
    }

    /// For the report.
    pub fn describe(self) -> String {
        match self {
            Load::Bench => format!("longhaul bench tput (sender: {})", Sender::Iperf.name()),
            Load::Iperf3 => iperf3_version().unwrap_or_else(|| "iperf3".into()),
        }
    }
}

/// `iperf3 --version`'s first line, if iperf3 runs.
pub fn iperf3_version() -> Option<String> {
    let out = std::process::Command::new("iperf3")
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next()?.trim();
    // "iperf 3.12 (cJSON 1.7.15)" and the like.
    Some(first.split(" (").next().unwrap_or(first).to_string())
}

/// Turns `iperf3 -J` output into a [`TputResult`]; `None` if it is not
/// a finished client run.
pub fn from_iperf3_json(addr: &str, json: &serde_json::Value) -> Option<TputResult> {
    let end = json.get("end")?;
    let f = |v: &serde_json::Value, k: &str| v.get(k).and_then(serde_json::Value::as_f64);
    let streams: Vec<StreamResult> = end
        .get("streams")?
        .as_array()?
        .iter()
        .filter_map(|s| {
            let r = s.get("receiver")?;
            let bytes = f(r, "bytes")? as u64;
            let seconds = f(r, "seconds")?;
            Some(StreamResult {
                bytes,
                seconds,
                bytes_per_sec: f(r, "bits_per_second")? / 8.0,
                omitted_bytes: 0,
            })
        })
        .collect();
    let sum = end.get("sum_received")?;
    let rates: Vec<f64> = streams.iter().map(|s| s.bytes_per_sec).collect();
    let omit = json
        .get("start")
        .and_then(|s| s.get("test_start"))
        .and_then(|t| f(t, "omit"))
        .unwrap_or(0.0);
    let seconds = f(sum, "seconds")?;
    let host_cpu = end
        .get("cpu_utilization_percent")
        .and_then(|c| f(c, "host_total"))
        .unwrap_or(0.0);
    let bits = f(sum, "bits_per_second")?;
    Some(TputResult {
        addr: addr.to_string(),
        parallel: streams.len(),
        reverse: false,
        seconds,
        jain: crate::stats::jain(&rates),
        streams,
        total_bytes: f(sum, "bytes")? as u64,
        total_bytes_per_sec: bits / 8.0,
        bits_per_sec: bits,
        cpu_seconds: host_cpu / 100.0 * seconds,
        omit_seconds: omit,
        sender: Sender::Iperf,
    })
}

/// How well the emulator kept time during one run.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Timekeeping {
    /// Packets it forwarded (both directions).
    pub packets: u64,
    /// Of those, released more than 1 ms after they were due.
    pub late: u64,
    /// Worst lateness seen so far by this emulator (it keeps only a
    /// running maximum), when it grew during the run.
    pub worst_us: Option<f64>,
}

impl Timekeeping {
    /// Above this share of late packets a run is marked in the report.
    pub const LATE_SHARE: f64 = 0.01;

    pub fn late_share(&self) -> f64 {
        self.late as f64 / self.packets.max(1) as f64
    }

    pub fn kept_time(&self) -> bool {
        self.late_share() <= Self::LATE_SHARE
    }
}

/// The emulator's counters now: packets, late releases, worst lateness.
pub fn emulator_counters(name: &str) -> Option<(u64, u64, f64)> {
    let s = longhaul_netem::status(name).ok()??;
    Some((
        s.a_to_b.packets + s.b_to_a.packets,
        s.a_to_b.late_releases + s.b_to_a.late_releases,
        s.a_to_b.worst_lateness_us.max(s.b_to_a.worst_lateness_us),
    ))
}

/// What happened between two [`emulator_counters`] readings.
pub fn timekeeping(
    before: Option<(u64, u64, f64)>,
    after: Option<(u64, u64, f64)>,
) -> Option<Timekeeping> {
    let (b, a) = (before?, after?);
    Some(Timekeeping {
        packets: a.0.saturating_sub(b.0),
        late: a.1.saturating_sub(b.1),
        worst_us: (a.2 > b.2).then_some(a.2),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields of a real `iperf3 -c 127.0.0.1 -P 2 -t 1 -J` (3.12).
    const IPERF3: &str = r#"{"start": {"test_start": {"protocol": "TCP", "num_streams": 2, "omit": 2, "duration": 1}}, "end": {"streams": [{"receiver": {"bytes": 1955594240, "seconds": 1.000636, "bits_per_second": 15633841498.633951}}, {"receiver": {"bytes": 1951662080, "seconds": 1.000636, "bits_per_second": 15602406160.49997}}], "sum_received": {"bytes": 3907256320, "seconds": 1.000698, "bits_per_second": 31236247659.133923}, "cpu_utilization_percent": {"host_total": 95.22038843567738}}}"#;

    #[test]
    fn reads_iperf3_json() {
        let v: serde_json::Value = serde_json::from_str(IPERF3).unwrap();
        let r = from_iperf3_json("127.0.0.1:5202", &v).unwrap();
        assert_eq!(r.parallel, 2);
        assert_eq!(r.total_bytes, 3_907_256_320);
        assert!((r.bits_per_sec - 31_236_247_659.13).abs() < 1.0);
        assert!((r.total_bytes_per_sec * 8.0 - r.bits_per_sec).abs() < 1.0);
        assert!(r.jain > 0.999);
        assert_eq!(r.omit_seconds, 2.0);
        assert!((r.cpu_seconds - 0.9529).abs() < 0.001);
        // An error report instead of a result.
        let err: serde_json::Value =
            serde_json::from_str(r#"{"start": {}, "end": {}, "error": "unable to connect"}"#)
                .unwrap();
        assert!(from_iperf3_json("x:1", &err).is_none());
    }
}
