//! `longhaul demo`: the whole path on loopback, measured against direct.
//!
//! Starts three child processes of this same binary — a bench server, a
//! longhaul server allowed to reach only that bench server, and a client
//! with one `-L` forward — then runs tput (1 and 10 streams) and rr both
//! directly and through the forward, interleaved, and prints the ratios.

use std::net::TcpListener as StdListener;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::stats::fmt_bps;
use crate::{rr, tput};
use anyhow::{bail, Context};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::carriers::{self, CarrierKind, Keys};
use longhaul_forward::spec::ForwardSpec;
use longhaul_forward::{Client, ClientConfig};

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

/// One path under test: direct, or a forward over a carrier kind.
struct Path {
    name: &'static str,
    addr: String,
}

/// Time from nothing to the first byte back: for longhaul, a new client
/// session (TCP, TLS and authentication, hello), a connection to its `-L`
/// forward, the OPEN to the target and one 1-byte request/response. For
/// direct, a TCP connect and the same request/response.
async fn first_byte(
    kind: Option<CarrierKind>,
    server: &str,
    bench: &str,
    keys: &Keys,
) -> anyhow::Result<Duration> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t0 = Instant::now();
    let mut client = None;
    let addr = match kind {
        None => bench.to_string(),
        Some(kind) => {
            let url = format!("{}://{server}", kind.name());
            let mut cfg = ClientConfig::new(url.parse().map_err(|e: String| anyhow::anyhow!(e))?);
            cfg.insecure = kind == CarrierKind::Tcp;
            if kind != CarrierKind::Tcp {
                cfg.identity = Some(keys.client.clone());
                cfg.pin = Some(
                    keys.server_fp
                        .parse()
                        .map_err(|e: String| anyhow::anyhow!(e))?,
                );
            }
            let (host, port) = bench.rsplit_once(':').context("bench address")?;
            cfg.local = vec![ForwardSpec {
                transport: longhaul_forward::spec::Transport::Tcp,
                bind: "127.0.0.1".into(),
                port: 0,
                host: host.into(),
                host_port: port.parse()?,
            }];
            let c = Client::start(cfg).await?;
            let a = c.local_addrs[0].to_string();
            client = Some(c);
            a
        }
    };
    let mut s = tokio::net::TcpStream::connect(&addr).await?;
    s.set_nodelay(true)?;
    let mut req = crate::hello(crate::MODE_RR, crate::send::Sender::Iperf, 0, 0).to_vec();
    req.extend_from_slice(&1u32.to_be_bytes());
    req.push(7);
    s.write_all(&req).await?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await?;
    let took = t0.elapsed();
    if let Some(c) = client {
        c.stop("demo measurement done");
    }
    Ok(took)
}

/// What `longhaul demo` measures, and how long.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Seconds per throughput measurement.
    pub time: f64,
    /// Round trips per rr size.
    pub count: usize,
    /// Every measurement repeated, interleaved direct/tunnel; medians reported.
    pub rounds: u16,
    /// Also write the results as JSON here.
    pub json: Option<std::path::PathBuf>,
}

pub async fn run(d: DemoOptions) -> anyhow::Result<()> {
    let keys = Keys::new("demo")?;
    let (pb, ps_tcp, ps_tls, pf_tcp, pf_tls) = (
        free_port()?,
        free_port()?,
        free_port()?,
        free_port()?,
        free_port()?,
    );
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let direct = format!("127.0.0.1:{pb}");
    let mut bench = spawn(&s(&["-q", "bench", "server", "--listen", &direct]))?;
    wait_listening(pb, &mut bench, "bench server").await?;
    let mut children = vec![];
    let mut paths = vec![Path {
        name: "direct",
        addr: direct.clone(),
    }];
    for (kind, ps, pf) in [
        (CarrierKind::Tcp, ps_tcp, pf_tcp),
        (CarrierKind::Tls, ps_tls, pf_tls),
    ] {
        let saddr = format!("127.0.0.1:{ps}");
        let mut a = s(&["-q", "server"]);
        a.extend(carriers::server_args(kind, &saddr, &keys));
        a.extend(s(&["--allow", &direct]));
        let mut server = spawn(&a)?;
        wait_listening(ps, &mut server, "longhaul server").await?;
        let mut a = s(&["-q", "client"]);
        a.extend(carriers::client_args(kind, &saddr, &keys));
        a.extend(s(&["-L", &format!("127.0.0.1:{pf}:{direct}")]));
        let mut client = spawn(&a)?;
        wait_listening(pf, &mut client, "longhaul client").await?;
        children.push(server);
        children.push(client);
        paths.push(Path {
            name: kind.name(),
            addr: format!("127.0.0.1:{pf}"),
        });
    }
    eprintln!(
        "demo: bench server {direct}; longhaul over tcp:// (127.0.0.1:{ps_tcp} -> forward :{pf_tcp}) and over tls:// with pinned keys (127.0.0.1:{ps_tls} -> forward :{pf_tls})"
    );
    let dur = Duration::from_secs_f64(d.time.max(0.5));
    let tp = |addr: &str, n: usize| tput::TputOptions {
        addr: addr.to_string(),
        parallel: n,
        duration: dur,
        reverse: false,
        buffer: None,
        interval: None,
        omit: std::time::Duration::ZERO,
        sender: crate::send::Sender::Iperf,
    };
    let rounds = d.rounds.max(1) as usize;
    // rows: measurement, then one value per path (direct, tcp, tls).
    let mut rows: Vec<(String, Vec<String>, Vec<f64>)> = vec![];
    let mut out = serde_json::Map::new();
    let mut direct_one = 0.0;
    for n in [1usize, 10] {
        let mut rates = vec![vec![]; paths.len()];
        let mut runs = vec![];
        for r in 0..rounds {
            eprintln!(
                "demo: tput, {n} stream(s), direct / tcp / tls ({:.0} s each), round {}/{rounds}…",
                dur.as_secs_f64(),
                r + 1
            );
            let mut run = serde_json::Map::new();
            for (i, p) in paths.iter().enumerate() {
                let res = tput::run(tp(&p.addr, n))
                    .await
                    .with_context(|| format!("{} tput", p.name))?;
                rates[i].push(res.total_bytes_per_sec);
                run.insert(p.name.into(), json!(res));
            }
            runs.push(run);
        }
        let med: Vec<f64> = rates.iter().map(|r| median(r)).collect();
        if n == 1 {
            direct_one = med[0];
        }
        rows.push((
            format!("tput, {n} stream{}", if n > 1 { "s" } else { "" }),
            med.iter().map(|&r| fmt_bps(r)).collect(),
            med.clone(),
        ));
        if n > 1 && direct_one > 0.0 {
            // Seed 004's baseline: a multiplexer funnels every stream into
            // one connection, so direct 1-stream is the best it can hope for.
            let mut v = med.clone();
            v[0] = direct_one;
            rows.push((
                format!("tput, {n} streams (direct: 1 stream)"),
                v.iter().map(|&r| fmt_bps(r)).collect(),
                v,
            ));
        }
        out.insert(
            format!("tput_{n}"),
            json!({"median_bytes_per_sec": med, "paths": ["direct", "tcp", "tls"], "runs": runs}),
        );
    }
    let sizes = vec![1, 1000, 100_000];
    let mut per_size = vec![vec![vec![]; paths.len()]; sizes.len()];
    let mut p50s = vec![vec![vec![]; paths.len()]; sizes.len()];
    let mut rr_runs = vec![];
    for r in 0..rounds {
        eprintln!(
            "demo: rr, {} round trips per size, direct / tcp / tls, round {}/{rounds}…",
            d.count,
            r + 1
        );
        let mut run = serde_json::Map::new();
        for (pi, p) in paths.iter().enumerate() {
            let res = rr::run(rr::RrOptions {
                addr: p.addr.clone(),
                sizes: sizes.clone(),
                count: d.count.max(1),
            })
            .await
            .with_context(|| format!("{} rr", p.name))?;
            for (si, row) in res.rows.iter().enumerate() {
                per_size[si][pi].push(row.round_trips_per_sec);
                p50s[si][pi].push(row.p50_us);
            }
            run.insert(p.name.into(), json!(res));
        }
        rr_runs.push(run);
    }
    for (si, size) in sizes.iter().enumerate() {
        let med: Vec<f64> = per_size[si].iter().map(|r| median(r)).collect();
        let text = med
            .iter()
            .zip(&p50s[si])
            .map(|(r, p)| format!("{r:.0}/s, p50 {:.0} µs", median(p)))
            .collect();
        rows.push((format!("rr {size} B (round trips/s)"), text, med));
    }
    out.insert("rr".into(), json!({"runs": rr_runs}));

    // Connect to first byte: fresh sessions, so TLS and authentication count.
    let tries = 50;
    eprintln!("demo: new session + first byte, {tries} times per path…");
    let mut fb = vec![vec![]; paths.len()];
    for _ in 0..tries {
        for (i, kind) in [None, Some(CarrierKind::Tcp), Some(CarrierKind::Tls)]
            .into_iter()
            .enumerate()
        {
            let server = match kind {
                Some(CarrierKind::Tls) => format!("127.0.0.1:{ps_tls}"),
                _ => format!("127.0.0.1:{ps_tcp}"),
            };
            let t = first_byte(kind, &server, &direct, &keys)
                .await
                .with_context(|| format!("{} first byte", paths[i].name))?;
            fb[i].push(t.as_secs_f64() * 1e6);
        }
    }
    let fb_p50: Vec<f64> = fb.iter().map(|v| median(v)).collect();
    let fb_p90: Vec<f64> = fb
        .iter()
        .map(|v| {
            let mut s = v.clone();
            s.sort_by(|a, b| a.total_cmp(b));
            crate::stats::percentile(&s, 90.0)
        })
        .collect();
    rows.push((
        "connect to first byte (p50 / p90)".into(),
        fb_p50
            .iter()
            .zip(&fb_p90)
            .map(|(a, b)| format!("{:.2} / {:.2} ms", a / 1000.0, b / 1000.0))
            .collect(),
        // Higher is better in every other row; invert so ratios read the same way.
        fb_p50.iter().map(|v| 1.0 / v).collect(),
    ));
    out.insert(
        "first_byte_us".into(),
        json!({"p50": fb_p50, "p90": fb_p90, "samples": fb}),
    );
    out.insert("rounds".into(), json!(rounds));

    println!();
    println!(
        "| measurement | direct | longhaul tcp:// | longhaul tls:// | tls vs direct | tls vs tcp |"
    );
    println!("|---|---|---|---|---|---|");
    for (m, text, v) in &rows {
        println!(
            "| {m} | {} | {} | {} | {:.2} | {:.2} |",
            text[0],
            text[1],
            text[2],
            v[2] / v[0],
            v[2] / v[1]
        );
    }
    println!();
    println!("(loopback on this machine; ratios, not absolute numbers, are what compare across machines;");
    println!(" for connect to first byte the ratios are speed ratios: 0.5 means twice the time)");
    if let Some(path) = d.json {
        std::fs::write(&path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    for mut c in children.into_iter().chain([bench]) {
        let _ = c.kill().await;
    }
    Ok(())
}
