//! `bench matrix` reports: the seed-004 table as Markdown, the raw data as
//! JSON, and an SVG chart a human can read at a glance. Pure functions of
//! the results, so they are tested without a network.

use serde::{Deserialize, Serialize};

use crate::load::Timekeeping;
use crate::rr::RrResult;
use crate::stats::fmt_bps;
use crate::tput::TputResult;

/// One (delay, connections) cell, measured direct and through the tunnel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    pub delay_ms: f64,
    pub conns: usize,
    pub direct: TputResult,
    pub tunnel: TputResult,
    /// How the emulator kept time during the direct and the tunnel run
    /// (absent in older reports, or when its status was unreadable).
    #[serde(default)]
    pub emulator: [Option<Timekeeping>; 2],
}

impl Cell {
    /// Tunnel over direct with the same number of connections.
    pub fn ratio(&self) -> f64 {
        self.tunnel.total_bytes_per_sec / self.direct.total_bytes_per_sec.max(1e-9)
    }
}

/// The rr sweep at one delay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RrSweep {
    pub delay_ms: f64,
    pub direct: RrResult,
    pub tunnel: RrResult,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Matrix {
    pub seconds_per_cell: f64,
    pub rate: Option<String>,
    pub loss: Option<String>,
    pub app_buffer: Option<u64>,
    pub tcp_buffers: Option<u64>,
    /// longhaul's carrier (`tcp`, `tls`); absent in reports made before
    /// carriers could be chosen (those were `tcp`).
    #[serde(default)]
    pub carrier: Option<String>,
    /// Warm-up left out of each throughput measurement (iperf3's -O).
    #[serde(default)]
    pub omit_seconds: f64,
    /// The load generator (absent in reports made before it could be
    /// chosen: those used `bench tput`'s old fill-the-socket sender).
    #[serde(default)]
    pub load: Option<String>,
    pub cells: Vec<Cell>,
    pub rr: Vec<RrSweep>,
}

impl Matrix {
    /// Direct 1-connection throughput at a delay: seed 004's baseline, the
    /// best a multiplexer funnelling into one connection can hope for.
    fn direct_one(&self, delay_ms: f64) -> Option<f64> {
        self.cells
            .iter()
            .find(|c| c.delay_ms == delay_ms && c.conns == 1)
            .map(|c| c.direct.total_bytes_per_sec)
    }

    pub fn markdown(&self) -> String {
        let mut s = String::from("# longhaul bench matrix\n\n");
        s += &format!(
            "longhaul carrier {}; load {}; {} s per cell after a {} s warm-up that is not measured; rate {}; loss {}; application socket buffers {}; namespace TCP buffer max {}.\n\n",
            self.carrier.as_deref().unwrap_or("tcp"),
            self.load.as_deref().unwrap_or("longhaul bench tput (fill sender)"),
            self.seconds_per_cell,
            self.omit_seconds,
            self.rate.as_deref().unwrap_or("unlimited"),
            self.loss.as_deref().unwrap_or("0"),
            self.app_buffer.map_or("default".into(), |b| format!("{b} B")),
            self.tcp_buffers.map_or("default".into(), |b| format!("{b} B")),
        );
        s += "## Throughput (seed 004's table)\n\n";
        s += "| RTT | connections | direct | through longhaul | ratio | vs direct 1 conn | fairness (Jain) | emulator (direct / tunnel) |\n";
        s += "|---|---|---|---|---|---|---|---|\n";
        let mut late_cells = 0;
        for c in &self.cells {
            let vs_one = self.direct_one(c.delay_ms).map_or("–".into(), |d| {
                format!("{:.2}", c.tunnel.total_bytes_per_sec / d.max(1e-9))
            });
            let clock = match c.emulator {
                [Some(d), Some(t)] => {
                    let worst = d.worst_us.into_iter().chain(t.worst_us).fold(0.0, f64::max);
                    let shares = format!(
                        "{:.2} % / {:.2} % late{}",
                        d.late_share() * 100.0,
                        t.late_share() * 100.0,
                        if worst > 0.0 {
                            format!(", worst {:.1} ms", worst / 1000.0)
                        } else {
                            String::new()
                        }
                    );
                    if d.kept_time() && t.kept_time() {
                        format!("kept time ({shares})")
                    } else {
                        late_cells += 1;
                        format!("**late** ({shares})")
                    }
                }
                _ => "–".to_string(),
            };
            s += &format!(
                "| {} ms | {} | {} | {} | {:.2} | {} | {:.3} | {} |\n",
                c.delay_ms * 2.0,
                c.conns,
                fmt_bps(c.direct.total_bytes_per_sec),
                fmt_bps(c.tunnel.total_bytes_per_sec),
                c.ratio(),
                vs_one,
                c.tunnel.jain,
                clock
            );
        }
        if late_cells > 0 {
            s += &format!(
                "\n**{late_cells} cell(s) marked late**: in the direct or the tunnel run the emulator released more than {:.0} % of the packets over 1 ms after they were due (a loaded machine); their figures are less trustworthy.\n",
                Timekeeping::LATE_SHARE * 100.0
            );
        }
        if !self.rr.is_empty() {
            s += "\n## Request/response (seed 000's method)\n\n";
            s += "| RTT | size | direct p50 | tunnel p50 | direct p99 | tunnel p99 | tunnel − direct (p50) |\n";
            s += "|---|---|---|---|---|---|---|\n";
            for sw in &self.rr {
                for (d, t) in sw.direct.rows.iter().zip(&sw.tunnel.rows) {
                    s += &format!(
                        "| {} ms | {} B | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:+.0} µs |\n",
                        sw.delay_ms * 2.0,
                        d.size,
                        d.p50_us,
                        t.p50_us,
                        d.p99_us,
                        t.p99_us,
                        t.p50_us - d.p50_us
                    );
                }
            }
        }
        s
    }

    /// Grouped bars (direct vs tunnel per cell) above rr round-trip time vs
    /// size on log axes.
    pub fn svg(&self) -> String {
        let w = 900.0;
        let bar_h = 320.0;
        let rr_h = if self.rr.is_empty() { 0.0 } else { 320.0 };
        let h = 60.0 + bar_h + 60.0 + rr_h + 40.0;
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        s += "<text x=\"450\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">Throughput: direct (grey) vs through longhaul (blue)</text>\n";
        let (x0, y0) = (100.0, 50.0);
        let plot_w = w - x0 - 50.0;
        let max = self
            .cells
            .iter()
            .flat_map(|c| [c.direct.bits_per_sec, c.tunnel.bits_per_sec])
            .fold(1.0f64, f64::max);
        let n = self.cells.len().max(1) as f64;
        let group = plot_w / n;
        for i in 0..=4 {
            let v = max * i as f64 / 4.0;
            let y = y0 + bar_h - bar_h * i as f64 / 4.0;
            s += &format!(
                "<line x1=\"{x0}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
                w - 20.0,
                x0 - 5.0,
                y + 4.0,
                fmt_bps(v / 8.0)
            );
        }
        for (i, c) in self.cells.iter().enumerate() {
            let gx = x0 + group * i as f64;
            let bw = group * 0.35;
            for (k, (v, color)) in [
                (c.direct.bits_per_sec, "#999"),
                (c.tunnel.bits_per_sec, "#2a6fdb"),
            ]
            .iter()
            .enumerate()
            {
                let bh = bar_h * v / max;
                let x = gx + group * 0.12 + bw * k as f64;
                s += &format!(
                    "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"{color}\"/>\n",
                    y0 + bar_h - bh
                );
            }
            s += &format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{} ms, {} conn</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">×{:.2}</text>\n",
                gx + group / 2.0,
                y0 + bar_h + 16.0,
                c.delay_ms * 2.0,
                c.conns,
                gx + group / 2.0,
                y0 + bar_h + 32.0,
                c.ratio()
            );
        }
        if !self.rr.is_empty() {
            let top = y0 + bar_h + 70.0;
            s += &format!(
                "<text x=\"450\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"16\">Round-trip time vs request size (log scales); dashed = direct</text>\n",
                top - 10.0
            );
            let pts: Vec<(f64, f64)> = self
                .rr
                .iter()
                .flat_map(|sw| sw.direct.rows.iter().chain(&sw.tunnel.rows))
                .map(|r| (r.size.max(1) as f64, r.p50_us.max(1.0)))
                .collect();
            let (xmin, xmax) = pts
                .iter()
                .fold((f64::MAX, 1.0f64), |(a, b), p| (a.min(p.0), b.max(p.0)));
            let (ymin, ymax) = pts
                .iter()
                .fold((f64::MAX, 1.0f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
            let lx = |v: f64| {
                let span = (xmax.log10() - xmin.log10()).max(1e-9);
                x0 + plot_w * (v.log10() - xmin.log10()) / span
            };
            let ly = |v: f64| {
                let lo = (ymin * 0.8).log10();
                let span = ((ymax * 1.25).log10() - lo).max(1e-9);
                top + rr_h - 40.0 - (rr_h - 60.0) * (v.log10() - lo) / span
            };
            let colors = ["#2a6fdb", "#d94a38", "#2f9e44", "#9c36b5", "#e67700"];
            for (i, sw) in self.rr.iter().enumerate() {
                let color = colors[i % colors.len()];
                for (rows, dash) in [(&sw.direct.rows, "5,4"), (&sw.tunnel.rows, "")] {
                    let path: Vec<String> = rows
                        .iter()
                        .map(|r| {
                            format!(
                                "{:.1},{:.1}",
                                lx(r.size.max(1) as f64),
                                ly(r.p50_us.max(1.0))
                            )
                        })
                        .collect();
                    s += &format!(
                        "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>\n",
                        path.join(" ")
                    );
                }
                s += &format!(
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\" text-anchor=\"end\">RTT {} ms</text>\n",
                    w - 30.0,
                    top + 14.0 * (i + 1) as f64,
                    sw.delay_ms * 2.0
                );
            }
            for r in self.rr.first().map(|sw| &sw.direct.rows[..]).unwrap_or(&[]) {
                s += &format!(
                    "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{} B</text>\n",
                    lx(r.size.max(1) as f64),
                    top + rr_h - 22.0,
                    r.size
                );
            }
            s += &format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0} µs</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0} µs</text>\n",
                x0 - 5.0,
                ly(ymax),
                ymax,
                x0 - 5.0,
                ly(ymin),
                ymin
            );
        }
        s += "</svg>\n";
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rr::RrRow;
    use crate::tput::StreamResult;

    fn clock(packets: u64, late: u64) -> Timekeeping {
        Timekeeping {
            packets,
            late,
            worst_us: None,
        }
    }

    fn tput(bps: f64, n: usize) -> TputResult {
        TputResult {
            addr: "x".into(),
            parallel: n,
            reverse: false,
            seconds: 1.0,
            streams: (0..n)
                .map(|_| StreamResult {
                    bytes: (bps / n as f64) as u64,
                    seconds: 1.0,
                    bytes_per_sec: bps / n as f64,
                    omitted_bytes: 0,
                })
                .collect(),
            total_bytes: bps as u64,
            total_bytes_per_sec: bps,
            bits_per_sec: bps * 8.0,
            jain: 1.0,
            omit_seconds: 0.0,
            sender: Default::default(),
            cpu_seconds: 0.1,
        }
    }

    fn rr(p50: f64) -> RrResult {
        RrResult {
            addr: "x".into(),
            rows: [1u32, 1000, 100_000]
                .iter()
                .map(|&size| RrRow {
                    size,
                    count: 10,
                    mean_us: p50,
                    p50_us: p50,
                    p90_us: p50 * 1.5,
                    p99_us: p50 * 2.0,
                    max_us: p50 * 3.0,
                    round_trips_per_sec: 1e6 / p50,
                })
                .collect(),
        }
    }

    #[test]
    fn report_shapes() {
        let m = Matrix {
            seconds_per_cell: 1.0,
            omit_seconds: 0.0,
            rate: None,
            loss: None,
            app_buffer: None,
            tcp_buffers: None,
            carrier: Some("tls".into()),
            load: Some("iperf 3.12".into()),
            cells: vec![
                Cell {
                    delay_ms: 50.0,
                    conns: 1,
                    direct: tput(100e6, 1),
                    tunnel: tput(98e6, 1),
                    emulator: [Some(clock(10_000, 0)), Some(clock(10_000, 10))],
                },
                Cell {
                    delay_ms: 50.0,
                    conns: 10,
                    direct: tput(900e6, 10),
                    tunnel: tput(99e6, 10),
                    emulator: [Some(clock(10_000, 0)), Some(clock(10_000, 101))],
                },
            ],
            rr: vec![RrSweep {
                delay_ms: 50.0,
                direct: rr(100_000.0),
                tunnel: rr(100_100.0),
            }],
        };
        let md = m.markdown();
        assert!(
            md.contains(
                "| 100 ms | 1 | 800.0 Mbit/s | 784.0 Mbit/s | 0.98 | 0.98 | 1.000 | kept time (0.00 % / 0.10 % late) |"
            ),
            "{md}"
        );
        // 101 late of 10 000 is over 1 %: marked, and counted below.
        assert!(
            md.contains("| 100 ms | 10 | 7.20 Gbit/s | 792.0 Mbit/s | 0.11 | 0.99 | 1.000 | **late** (0.00 % / 1.01 % late) |"),
            "{md}"
        );
        assert!(md.contains("**1 cell(s) marked late**"), "{md}");
        assert!(md.contains("load iperf 3.12"), "{md}");
        assert!(md.contains("| 100 ms | 1000 B |"));
        let svg = m.svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect x=").count(), 4, "two bars per cell");
        assert_eq!(svg.matches("<polyline").count(), 2);
        let back: Matrix = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back.cells.len(), 2);
    }
}
