//! `longhaul bench matrix`: seed 004's table, reproduced automatically.
//!
//! For each delay: bring the WAN emulator up; start a bench server and a
//! longhaul server on side b and a longhaul client on side a; then for every
//! connection count measure direct (a → b) and through the tunnel,
//! interleaved so drift cancels out, plus the rr sweep. Writes report.md,
//! report.json and chart.svg. Everything it started is stopped and the
//! emulator taken down on exit, error or Ctrl-C.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::report::{Cell, Matrix, RrSweep};
use crate::rr::RrResult;
use crate::tput::TputResult;
use anyhow::{bail, Context};
use longhaul_netem as ne;
use tokio::process::{Child, Command};

use crate::carriers::{self, CarrierKind};
use crate::load::{emulator_counters, from_iperf3_json, timekeeping, Load, IPERF3_PORT};

const BENCH_PORT: u16 = 5201;
const CARRIER_PORT: u16 = 7000;
const FORWARD_PORT: u16 = 5301;
const IPERF3_FORWARD_PORT: u16 = 5302;

/// What `longhaul bench matrix` measures (the CLI's flags, parsed).
#[derive(Debug, Clone)]
pub struct MatrixOptions {
    /// One-way delays (RTT = 2 × delay).
    pub delay: Vec<Duration>,
    /// Parallel connections per cell.
    pub conns: Vec<u16>,
    /// Seconds per measurement.
    pub time: f64,
    /// Warm-up before each throughput measurement, not measured.
    pub omit: f64,
    pub out: std::path::PathBuf,
    /// Rate cap of the emulated link, bits per second.
    pub rate: Option<u64>,
    /// Random loss on the emulated link (0..1).
    pub loss: f64,
    /// Fixed socket buffers for the application (seed 001's scenario).
    pub app_buffer: Option<u64>,
    /// The namespaces' TCP buffer maximum.
    pub tcp_buffers: Option<u64>,
    pub rr_count: Option<usize>,
    pub rr_sizes: Vec<u32>,
    pub no_rr: bool,
    /// Emulator instance name.
    pub name: String,
    pub congestion: Option<String>,
    /// `tcp`, `tls` or `quic`.
    pub carrier: String,
    /// What generates the load.
    pub load: Load,
}

/// One throughput run from side a against `addr` (a bench server or, for
/// iperf3, an iperf3 server), by the chosen load generator.
async fn run_load(
    a: &MatrixOptions,
    addr: &str,
    conns: usize,
    buffer_args: &[String],
) -> anyhow::Result<TputResult> {
    let t = a.time.max(0.2);
    match a.load {
        Load::Bench => {
            let mut args = strs(&[
                "-q",
                "bench",
                "tput",
                addr,
                "-P",
                &conns.to_string(),
                "-t",
                &t.to_string(),
                "-O",
                &a.omit.to_string(),
                "-i",
                "0",
                "--json",
            ]);
            args.extend(buffer_args.iter().cloned());
            json_in(&a.name, 'a', &args).await
        }
        Load::Iperf3 => {
            let (host, port) = addr.rsplit_once(':').context("address without port")?;
            let mut args = strs(&[
                "-c",
                host,
                "-p",
                port,
                "-P",
                &conns.to_string(),
                "-t",
                &t.to_string(),
                "-O",
                &a.omit.to_string(),
                "-J",
            ]);
            if let Some(b) = a.app_buffer {
                args.extend(strs(&["-w", &b.to_string()]));
            }
            // The iperf3 server (or the forward to it) may still be
            // starting: retry a refused connection for a few seconds.
            let mut tries = 0;
            loop {
                let out = in_ns_run(&a.name, 'a', Path::new("iperf3"), &args)?
                    .output()
                    .await
                    .context("cannot run iperf3 in the emulator")?;
                // On error iperf3 exits non-zero but still prints JSON.
                let v: serde_json::Value =
                    serde_json::from_slice(&out.stdout).with_context(|| {
                        format!(
                            "iperf3 {}: no JSON ({})",
                            args.join(" "),
                            String::from_utf8_lossy(&out.stderr).trim()
                        )
                    })?;
                if let Some(r) = from_iperf3_json(addr, &v) {
                    return Ok(r);
                }
                let err = v.get("error").and_then(|e| e.as_str()).unwrap_or("?");
                if tries < 20 && err.contains("unable to connect") {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                bail!("iperf3 gave no result: {err}");
            }
        }
    }
}

/// Takes the emulator down when dropped (normal end, error, or Ctrl-C).
struct NetemGuard(String);

impl Drop for NetemGuard {
    fn drop(&mut self) {
        let _ = ne::down(&self.0);
    }
}

fn exe() -> anyhow::Result<std::path::PathBuf> {
    std::env::current_exe().context("cannot find the longhaul binary")
}

fn in_ns(name: &str, side: char, args: &[String]) -> anyhow::Result<Command> {
    in_ns_run(name, side, &exe()?, args)
}

/// Any program on one side of the emulator.
fn in_ns_run(name: &str, side: char, program: &Path, args: &[String]) -> anyhow::Result<Command> {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &ne::ns_name(name, side)])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    Ok(c)
}

fn spawn_in(name: &str, side: char, args: &[String]) -> anyhow::Result<Child> {
    in_ns(name, side, args)?
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start a longhaul process in the emulator")
}

async fn json_in<T: serde::de::DeserializeOwned>(
    name: &str,
    side: char,
    args: &[String],
) -> anyhow::Result<T> {
    json_out(in_ns(name, side, args)?, args).await
}

async fn json_out<T: serde::de::DeserializeOwned>(
    mut cmd: Command,
    args: &[String],
) -> anyhow::Result<T> {
    let out = cmd
        .output()
        .await
        .context("cannot run a bench command in the emulator")?;
    if !out.status.success() {
        bail!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("bench output was not JSON")
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Waits until a bench server answers at `addr` from side a.
async fn wait_ready(name: &str, addr: &str) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        let probe: anyhow::Result<RrResult> = json_in(
            name,
            'a',
            &strs(&[
                "-q", "bench", "rr", addr, "--sizes", "1", "-n", "1", "--json",
            ]),
        )
        .await;
        if probe.is_ok() {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(15) {
            bail!("nothing answered at {addr} within 15 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn fmt_elapsed(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

pub async fn run(a: MatrixOptions) -> anyhow::Result<()> {
    tokio::select! {
        r = run_inner(&a) => r,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("matrix: interrupted; stopping processes and taking the emulator down");
            bail!("interrupted")
        }
    }
}

async fn run_inner(a: &MatrixOptions) -> anyhow::Result<()> {
    if a.delay.is_empty() || a.conns.is_empty() {
        bail!("give at least one --delay and one --conns value");
    }
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let carrier = CarrierKind::parse(&a.carrier).map_err(|e| anyhow::anyhow!(e))?;
    let keys = carriers::Keys::new("matrix")?;
    let cc_args: Vec<String> = a
        .congestion
        .as_ref()
        .map(|c| vec!["--congestion".to_string(), c.clone()])
        .unwrap_or_default();
    let buffer_args: Vec<String> = a
        .app_buffer
        .map(|b| vec!["--buffer".to_string(), b.to_string()])
        .unwrap_or_default();
    let t = a.time.max(0.2);
    let steps = a.delay.len() * a.conns.len() * 2;
    let rr_sizes = a
        .rr_sizes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let started = Instant::now();
    let mut step = 0usize;
    let mut matrix = Matrix {
        seconds_per_cell: t,
        omit_seconds: a.omit,
        rate: a.rate.map(|r| format!("{} Mbit/s", r / 1_000_000)),
        loss: (a.loss > 0.0).then(|| format!("{:.3}%", a.loss * 100.0)),
        app_buffer: a.app_buffer,
        tcp_buffers: a.tcp_buffers,
        carrier: Some(carrier.name().to_string()),
        load: Some(a.load.describe()),
        cells: vec![],
        rr: vec![],
    };
    for &delay in &a.delay {
        let cfg = ne::NetemConfig {
            name: a.name.clone(),
            delay_us: delay.as_micros() as u64,
            rate_bps: a.rate,
            loss: a.loss,
            loss_back: None,
            link2: None,
            queue_bytes: None,
            tcp_buffer_max: a.tcp_buffers,
        };
        ne::up(&cfg, &exe()?)?;
        let _guard = NetemGuard(a.name.clone());
        let delay_ms = delay.as_secs_f64() * 1000.0;
        let mut bench_args = strs(&[
            "-q",
            "bench",
            "server",
            "--listen",
            &format!("0.0.0.0:{BENCH_PORT}"),
        ]);
        bench_args.extend(buffer_args.iter().cloned());
        let _bench = spawn_in(&a.name, 'b', &bench_args)?;
        let _iperf3 = match a.load {
            Load::Iperf3 => {
                // (The client's -w applies to both ends.)
                let args = strs(&["-s", "-p", &IPERF3_PORT.to_string()]);
                Some(
                    in_ns_run(&a.name, 'b', Path::new("iperf3"), &args)?
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .context("cannot start iperf3 -s")?,
                )
            }
            Load::Bench => None,
        };
        let mut server_args = strs(&["-q", "server"]);
        server_args.extend(carriers::server_args(
            carrier,
            &format!("{}:{CARRIER_PORT}", ne::ADDR_B),
            &keys,
        ));
        server_args.extend(strs(&["--allow", &format!("127.0.0.1:{BENCH_PORT}")]));
        server_args.extend(strs(&["--allow", &format!("127.0.0.1:{IPERF3_PORT}")]));
        server_args.extend(cc_args.iter().cloned());
        let _server = spawn_in(&a.name, 'b', &server_args)?;
        let direct = format!("{}:{BENCH_PORT}", ne::ADDR_B);
        let tunnel = format!("127.0.0.1:{FORWARD_PORT}");
        wait_ready(&a.name, &direct).await?;
        let mut client_args = strs(&["-q", "client"]);
        client_args.extend(carriers::client_args(
            carrier,
            &format!("{}:{CARRIER_PORT}", ne::ADDR_B),
            &keys,
        ));
        client_args.extend(strs(&[
            "-L",
            &format!("127.0.0.1:{FORWARD_PORT}:127.0.0.1:{BENCH_PORT}"),
            "-L",
            &format!("127.0.0.1:{IPERF3_FORWARD_PORT}:127.0.0.1:{IPERF3_PORT}"),
        ]));
        client_args.extend(cc_args.iter().cloned());
        let _client = spawn_in(&a.name, 'a', &client_args)?;
        wait_ready(&a.name, &tunnel).await?;
        let (load_direct, load_tunnel) = match a.load {
            Load::Bench => (direct.clone(), tunnel.clone()),
            Load::Iperf3 => (
                format!("{}:{IPERF3_PORT}", ne::ADDR_B),
                format!("127.0.0.1:{IPERF3_FORWARD_PORT}"),
            ),
        };
        for conns in a.conns.iter().map(|&c| c as usize) {
            let mut results: Vec<TputResult> = vec![];
            let mut clocks = vec![];
            for (what, addr) in [("direct", &load_direct), ("tunnel", &load_tunnel)] {
                step += 1;
                let done = started.elapsed();
                let left = done.mul_f64((steps - step + 1) as f64 / step.max(1) as f64);
                eprintln!(
                    "[{step:2}/{steps}] RTT {:.0} ms, {conns} conn{}, {what} ({:.0} s)   elapsed {}, about {} left",
                    delay_ms * 2.0,
                    if conns > 1 { "s" } else { "" },
                    t,
                    fmt_elapsed(done),
                    fmt_elapsed(left)
                );
                let before = emulator_counters(&a.name);
                results.push(run_load(a, addr, conns, &buffer_args).await?);
                // The emulator publishes its counters every 500 ms.
                tokio::time::sleep(Duration::from_millis(600)).await;
                clocks.push(timekeeping(before, emulator_counters(&a.name)));
            }
            let tunnel_r = results.pop().context("missing tunnel result")?;
            let direct_r = results.pop().context("missing direct result")?;
            matrix.cells.push(Cell {
                delay_ms,
                conns,
                direct: direct_r,
                tunnel: tunnel_r,
                emulator: [clocks[0], clocks[1]],
            });
        }
        if !a.no_rr {
            let rtt = (delay * 2).as_secs_f64().max(1e-4);
            let count = a
                .rr_count
                .unwrap_or_else(|| ((2.0 / rtt) as usize).clamp(10, 1000));
            eprintln!(
                "        RTT {:.0} ms, rr sweep {rr_sizes} B, {count} round trips per size",
                delay_ms * 2.0
            );
            let rr = |addr: &str| {
                strs(&[
                    "-q",
                    "bench",
                    "rr",
                    addr,
                    "--sizes",
                    &rr_sizes,
                    "-n",
                    &count.to_string(),
                    "--json",
                ])
            };
            let direct_rr: RrResult = json_in(&a.name, 'a', &rr(&direct)).await?;
            let tunnel_rr: RrResult = json_in(&a.name, 'a', &rr(&tunnel)).await?;
            matrix.rr.push(RrSweep {
                delay_ms,
                direct: direct_rr,
                tunnel: tunnel_rr,
            });
        }
        // Children are killed and the emulator taken down here (drops).
    }
    write_reports(&matrix, &a.out)?;
    print!("{}", matrix.markdown());
    eprintln!(
        "matrix: wrote {0}/report.md, {0}/report.json, {0}/chart.svg in {1}",
        a.out.display(),
        fmt_elapsed(started.elapsed())
    );
    Ok(())
}

fn write_reports(m: &Matrix, dir: &Path) -> anyhow::Result<()> {
    std::fs::write(dir.join("report.md"), m.markdown())?;
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(m)?)?;
    std::fs::write(dir.join("chart.svg"), m.svg())?;
    Ok(())
}
