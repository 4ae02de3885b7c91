//! `longhaul demo`: the whole path on loopback, measured against direct.
//!
//! Starts three child processes of this same binary — a bench server, a
//! longhaul server allowed to reach only that bench server, and a client
//! with one `-L` forward — then runs tput (1 and 10 streams) and rr both
//! directly and through the forward, interleaved, and prints the ratios.

use std::net::TcpListener as StdListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use longhaul_bench::stats::fmt_bps;
use longhaul_bench::{rr, tput};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::args::DemoArgs;

/// Per-size rr results across rounds.
#[derive(Clone, Default)]
struct RrSamples {
    direct_rate: Vec<f64>,
    tunnel_rate: Vec<f64>,
    direct_p50: Vec<f64>,
    tunnel_p50: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn wait_listening(port: u16, child: &mut Child, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited early ({status})");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("{what} did not start listening on port {port} within 10 s")
}

fn spawn(args: &[String]) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("cannot find the longhaul binary")?;
    Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start a longhaul child process")
}

pub async fn run(d: DemoArgs) -> anyhow::Result<()> {
    let (pb, ps, pf) = (free_port()?, free_port()?, free_port()?);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut bench = spawn(&s(&[
        "-q",
        "bench",
        "server",
        "--listen",
        &format!("127.0.0.1:{pb}"),
    ]))?;
    wait_listening(pb, &mut bench, "bench server").await?;
    let mut server = spawn(&s(&[
        "-q",
        "server",
        "--listen",
        &format!("127.0.0.1:{ps}"),
        "--allow",
        &format!("127.0.0.1:{pb}"),
    ]))?;
    wait_listening(ps, &mut server, "longhaul server").await?;
    let mut client = spawn(&s(&[
        "-q",
        "client",
        &format!("127.0.0.1:{ps}"),
        "-L",
        &format!("127.0.0.1:{pf}:127.0.0.1:{pb}"),
    ]))?;
    wait_listening(pf, &mut client, "longhaul client").await?;

    let direct = format!("127.0.0.1:{pb}");
    let tunnel = format!("127.0.0.1:{pf}");
    eprintln!(
        "demo: bench server {direct}, longhaul server 127.0.0.1:{ps}, client forward {tunnel} -> {direct}"
    );
    let dur = Duration::from_secs_f64(d.time.max(0.5));
    let tp = |addr: &str, n: usize| tput::TputOptions {
        addr: addr.to_string(),
        parallel: n,
        duration: dur,
        reverse: false,
        buffer: None,
        interval: None,
    };
    let rounds = d.rounds.max(1) as usize;
    let mut direct_one = 0.0;
    let mut rows: Vec<(String, String, String, f64)> = vec![];
    let mut out = serde_json::Map::new();
    for n in [1usize, 10] {
        let mut direct_rates = vec![];
        let mut tunnel_rates = vec![];
        let mut jains = vec![];
        let mut ratios = vec![];
        let mut runs = vec![];
        for r in 0..rounds {
            eprintln!(
                "demo: tput, {n} stream(s), direct then tunnel ({:.0} s each), round {}/{rounds}…",
                dur.as_secs_f64(),
                r + 1
            );
            let a = tput::run(tp(&direct, n)).await.context("direct tput")?;
            let b = tput::run(tp(&tunnel, n)).await.context("tunnel tput")?;
            direct_rates.push(a.total_bytes_per_sec);
            tunnel_rates.push(b.total_bytes_per_sec);
            jains.push(b.jain);
            ratios.push(b.total_bytes_per_sec / a.total_bytes_per_sec);
            runs.push(json!({"direct": a, "tunnel": b}));
        }
        let ratio = median(&ratios);
        if n == 1 {
            direct_one = median(&direct_rates);
        }
        rows.push((
            format!("tput, {n} stream{}", if n > 1 { "s" } else { "" }),
            fmt_bps(median(&direct_rates)),
            format!(
                "{} (Jain {:.3})",
                fmt_bps(median(&tunnel_rates)),
                median(&jains)
            ),
            ratio,
        ));
        if n > 1 && direct_one > 0.0 {
            // Seed 004's baseline: a multiplexer funnels every stream into
            // one connection, so direct 1-stream is the best it can hope for.
            rows.push((
                format!("tput, {n} streams vs direct 1 stream"),
                fmt_bps(direct_one),
                fmt_bps(median(&tunnel_rates)),
                median(&tunnel_rates) / direct_one,
            ));
        }
        out.insert(
            format!("tput_{n}"),
            json!({"median_ratio": ratio, "median_direct_bytes_per_sec": median(&direct_rates),
                   "median_tunnel_bytes_per_sec": median(&tunnel_rates), "runs": runs}),
        );
    }
    let sizes = vec![1, 1000, 100_000];
    let ro = |addr: &str| rr::RrOptions {
        addr: addr.to_string(),
        sizes: sizes.clone(),
        count: d.count.max(1),
    };
    let mut per_size: Vec<RrSamples> = vec![RrSamples::default(); sizes.len()];
    let mut rr_runs = vec![];
    for r in 0..rounds {
        eprintln!(
            "demo: rr, {} round trips per size, direct then tunnel, round {}/{rounds}…",
            d.count,
            r + 1
        );
        let a = rr::run(ro(&direct)).await.context("direct rr")?;
        let b = rr::run(ro(&tunnel)).await.context("tunnel rr")?;
        for (i, (x, y)) in a.rows.iter().zip(&b.rows).enumerate() {
            per_size[i].direct_rate.push(x.round_trips_per_sec);
            per_size[i].tunnel_rate.push(y.round_trips_per_sec);
            per_size[i].direct_p50.push(x.p50_us);
            per_size[i].tunnel_p50.push(y.p50_us);
        }
        rr_runs.push(json!({"direct": a, "tunnel": b}));
    }
    for (size, p) in sizes.iter().zip(&per_size) {
        let ratio = median(&p.tunnel_rate) / median(&p.direct_rate);
        rows.push((
            format!("rr {size} B (round trips/s)"),
            format!(
                "{:.0}/s, p50 {:.0} µs",
                median(&p.direct_rate),
                median(&p.direct_p50)
            ),
            format!(
                "{:.0}/s, p50 {:.0} µs",
                median(&p.tunnel_rate),
                median(&p.tunnel_p50)
            ),
            ratio,
        ));
    }
    out.insert("rr".into(), json!({"runs": rr_runs}));
    out.insert("rounds".into(), json!(rounds));

    println!();
    println!("| measurement | direct | through longhaul | ratio |");
    println!("|---|---|---|---|");
    for (m, a, b, r) in &rows {
        println!("| {m} | {a} | {b} | {r:.2} |");
    }
    println!();
    println!("(loopback on this machine; ratios, not absolute numbers, are what compare across machines)");
    if let Some(path) = d.json {
        std::fs::write(&path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    for mut c in [client, server, bench] {
        let _ = c.kill().await;
    }
    Ok(())
}
