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
    let mut rows: Vec<(String, String, String, f64)> = vec![];
    let mut out = serde_json::Map::new();
    for n in [1usize, 10] {
        eprintln!(
            "demo: tput, {n} stream(s), direct then tunnel ({:.0} s each)…",
            dur.as_secs_f64()
        );
        let a = tput::run(tp(&direct, n)).await.context("direct tput")?;
        let b = tput::run(tp(&tunnel, n)).await.context("tunnel tput")?;
        let ratio = b.total_bytes_per_sec / a.total_bytes_per_sec;
        rows.push((
            format!("tput, {n} stream{}", if n > 1 { "s" } else { "" }),
            fmt_bps(a.total_bytes_per_sec),
            format!("{} (Jain {:.3})", fmt_bps(b.total_bytes_per_sec), b.jain),
            ratio,
        ));
        out.insert(
            format!("tput_{n}"),
            json!({"direct": a, "tunnel": b, "ratio": ratio}),
        );
    }
    let sizes = vec![1, 1000, 100_000];
    eprintln!(
        "demo: rr, {} round trips per size, direct then tunnel…",
        d.count
    );
    let ro = |addr: &str| rr::RrOptions {
        addr: addr.to_string(),
        sizes: sizes.clone(),
        count: d.count.max(1),
    };
    let a = rr::run(ro(&direct)).await.context("direct rr")?;
    let b = rr::run(ro(&tunnel)).await.context("tunnel rr")?;
    for (x, y) in a.rows.iter().zip(&b.rows) {
        let ratio = y.round_trips_per_sec / x.round_trips_per_sec;
        rows.push((
            format!("rr {} B (round trips/s)", x.size),
            format!("{:.0}/s, p50 {:.0} µs", x.round_trips_per_sec, x.p50_us),
            format!("{:.0}/s, p50 {:.0} µs", y.round_trips_per_sec, y.p50_us),
            ratio,
        ));
    }
    out.insert("rr".into(), json!({"direct": a, "tunnel": b}));

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
