//! `longhaul`: the thin command-line front end.
// `unsafe` only in `sys`: Windows' Event Log.
#![deny(unsafe_code)]

mod arg_errors;
mod args;
mod bench_args;
mod config;
mod conn_args;
mod connect;
#[cfg(any(target_os = "linux", windows))]
mod cp;
mod install;
mod reload;
mod serve;
#[allow(unsafe_code)]
mod sys;
mod values;

use std::process::ExitCode;

/// The version, the commit it was built from and the target it was built
/// for (`build.rs`).
pub(crate) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("LONGHAUL_COMMIT"),
    ", ",
    env!("LONGHAUL_TARGET"),
    ")"
);

/// mimalloc keeps freed buffers for reuse; glibc malloc returned the
/// carrier's 256 KiB read buffers to the kernel and paid page faults and
/// zeroing to get them back (≈6% of the relay's CPU in profiles).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

use args::{BenchCmd, Cli, Cmd, NetemArgs, NetemCmd};
use longhaul_bench::{rr, server as bench_server, tput};
use longhaul_forward::Client;

fn main() -> ExitCode {
    // Every command holds a descriptor per connection, stream or file: the
    // soft limit (often 1 024) goes up to the hard one, before anything
    // starts. A failure leaves the limit as it was.
    let _ = longhaul_files::raise_nofile_limit();
    let argv = match config::expand(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("longhaul: {e}");
            return ExitCode::from(2);
        }
    };
    let path = arg_errors::command_path(&argv);
    let cli = match Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind::*;
            if matches!(
                e.kind(),
                DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            eprintln!(
                "longhaul: {}",
                arg_errors::one_line_error(&e.render().to_string(), &path)
            );
            return ExitCode::from(2);
        }
    };
    if let Cmd::Service(args::ServiceArgs {
        cmd: args::ServiceCmd::Run { name, dir, command },
    }) = cli.cmd
    {
        // The service manager started us: logs go to a file, not stderr.
        return sys::run_service(name, dir, command);
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(log_filter(&cli)))
        .with_writer(std::io::stderr)
        .with_target(false);
    match cli.log_format {
        // Colours only for a person at a terminal, not in files and pipes.
        args::LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        args::LogFormat::Json => logs.json().init(),
    }
    let rt = match runtime(&cli) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("longhaul: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli.cmd)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // An error may quote what a server sent (cp's messages, paths):
            // its control characters are shown, never sent to the terminal.
            eprintln!("longhaul: {}", terminal_safe(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// What is logged: `RUST_LOG`, else the level `-v`/`-q` ask for.
pub(crate) fn log_filter(cli: &Cli) -> String {
    std::env::var("RUST_LOG").unwrap_or_else(|_| {
        match cli.verbose {
            0 if cli.quiet => "warn",
            0 => "info",
            1 => "debug",
            _ => "trace",
        }
        .to_string()
    })
}

/// The runtime the command runs on.
pub(crate) fn runtime(cli: &Cli) -> std::io::Result<tokio::runtime::Runtime> {
    // One thread saves the hand-offs (futex wake-ups, context switches)
    // between a stream's pump and the carrier writer: on loopback ≈ 10 %
    // less CPU per byte (docs/BENCHMARKS.md, issue 11).
    match cli.threads() {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        0 => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
}

pub(crate) async fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Server(a) => serve::server(a).await,
        Cmd::Client(a) => client(a).await,
        Cmd::Cp(a) => sys::cp(a).await,
        Cmd::Status(a) => status(a).await,
        Cmd::Reload(a) => reload::by_control(a).await,
        Cmd::Service(a) => sys::service(a.cmd),
        Cmd::Doctor(a) => doctor(a).await,
        Cmd::Keygen(k) => {
            let path = k
                .out
                .or_else(|| args::config_path("key"))
                .ok_or_else(|| anyhow::anyhow!("no HOME to put the key in; give --out FILE"))?;
            let id = longhaul_carrier::Identity::generate()?;
            id.save(&path)?;
            eprintln!(
                "key written to {} (fingerprint also in {}.pub)",
                path.display(),
                path.display()
            );
            println!("{}", id.fingerprint);
            Ok(())
        }
        Cmd::Completions { shell } => install::completions(shell),
        Cmd::Man { dir } => install::man(dir),
        Cmd::Fingerprint { file } => {
            println!("{}", longhaul_carrier::Identity::load(&file)?.fingerprint);
            Ok(())
        }
        Cmd::Bench(b) => match b.cmd {
            BenchCmd::Server(s) => {
                let l = longhaul_carrier::bind_listener(s.listen)
                    .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", s.listen))?;
                let at = l.local_addr()?;
                let udp = tokio::net::UdpSocket::bind(at)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot listen for UDP on {at}: {e}"))?;
                tracing::info!("bench server listening on {at} (TCP and UDP)");
                tokio::select! {
                    _ = bench_server::run(l, s.buffer.map(|b| b as u32)) => {}
                    _ = longhaul_bench::udp::reflect(udp) => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                Ok(())
            }
            BenchCmd::Tput(t) => {
                let r = tput::run(tput::TputOptions {
                    addr: t.addr.clone(),
                    parallel: t.parallel as usize,
                    duration: std::time::Duration::from_secs_f64(t.time),
                    reverse: t.reverse,
                    buffer: t.buffer.map(|b| b as u32),
                    interval: (!t.json && t.interval > 0.0)
                        .then(|| std::time::Duration::from_secs_f64(t.interval)),
                    omit: std::time::Duration::from_secs_f64(t.omit),
                    sender: t.sender.into(),
                })
                .await
                .map_err(|e| anyhow::anyhow!("bench tput against {}: {e}", t.addr))?;
                if t.json {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                } else {
                    print!("{}", r.human());
                }
                Ok(())
            }
            BenchCmd::Matrix(m) => longhaul_bench::matrix::run(m.into()).await,
            BenchCmd::Udp(u) => {
                let r = longhaul_bench::udp::run(longhaul_bench::udp::UdpOptions {
                    addr: u.addr.clone(),
                    rate: u.rate,
                    size: u.size as usize,
                    duration: std::time::Duration::from_secs_f64(u.time),
                    warmup: std::time::Duration::from_secs_f64(u.warmup.unwrap_or(0.0)),
                })
                .await
                .map_err(|e| anyhow::anyhow!("bench udp against {}: {e}", u.addr))?;
                if u.json {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                } else {
                    print!("{}", r.human());
                }
                Ok(())
            }
            BenchCmd::Sessions(o) => {
                let cfg = connect::client_config(&o.server, &o.conn, &o.session, false)?;
                let (r, held) =
                    longhaul_bench::sessions::run(longhaul_bench::sessions::SessionsOptions {
                        client: cfg,
                        count: o.count,
                        concurrency: o.concurrency,
                        dest: format!("tcp://{}", o.to),
                    })
                    .await;
                if o.json {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                } else {
                    print!("{}", r.human());
                }
                use std::io::Write;
                let _ = std::io::stdout().flush();
                held.hold(std::time::Duration::from_secs_f64(o.hold.max(0.0)))
                    .await;
                Ok(())
            }
            BenchCmd::Goodput(o) => {
                let r = longhaul_bench::goodput::run(longhaul_bench::goodput::GoodputOptions {
                    addr: o.addr.clone(),
                    sizes: o.sizes.clone(),
                    depths: o.depth.clone(),
                    total: o.total,
                    duration: std::time::Duration::from_secs_f64(o.time),
                })
                .await
                .map_err(|e| anyhow::anyhow!("bench goodput against {}: {e}", o.addr))?;
                if o.json {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                } else {
                    print!("{}", r.human());
                }
                Ok(())
            }
            BenchCmd::Rr(o) => {
                let r = rr::run(rr::RrOptions {
                    addr: o.addr.clone(),
                    sizes: o.sizes.clone(),
                    count: o.count,
                })
                .await
                .map_err(|e| anyhow::anyhow!("bench rr against {}: {e}", o.addr))?;
                if o.json {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                } else {
                    print!("{}", r.human());
                }
                Ok(())
            }
        },
        Cmd::Demo(d) => longhaul_bench::demo::run(d.into()).await,
        Cmd::Netem(n) => netem(n),
    }
}

async fn doctor(a: args::DoctorArgs) -> anyhow::Result<()> {
    let mut cfg = connect::client_config(&a.server, &a.conn, &a.session, false)?;
    cfg.reconnect = false;
    let host = match &a.server.url {
        longhaul_carrier::CarrierUrl::Net { addr, .. } => addr
            .rsplit_once(':')
            .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']').to_string()),
        _ => None,
    };
    let client = Client::start(cfg).await?;
    let opts = longhaul_bench::doctor::DoctorOptions {
        seconds: a.time,
        app_buffer: a.app_buffer,
        host,
        progress: !a.json,
    };
    let d = longhaul_bench::doctor::run(&client.session(), &opts).await;
    client
        .shutdown("doctor done", std::time::Duration::from_secs(1))
        .await;
    let d = d?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        print!("{}", d.human());
    }
    Ok(())
}

/// The control socket for `status`; a failure is a warning, not fatal.
pub(crate) fn control(
    path: Option<&std::path::Path>,
    role: &'static str,
    metrics: std::sync::Arc<longhaul_forward::metrics::Metrics>,
    reload: Option<longhaul_forward::status::ReloadFn>,
) -> Option<longhaul_forward::status::Control> {
    use longhaul_forward::status;
    let path = match path {
        Some(p) if p.as_os_str() == "none" => return None,
        Some(p) => p.to_path_buf(),
        None => status::default_path(role),
    };
    match status::serve(&path, role, metrics, reload) {
        Ok(c) => {
            tracing::debug!("control socket {}", path.display());
            Some(c)
        }
        // Not built for this system: said, but nothing went wrong.
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            tracing::info!("no control socket for 'longhaul status': {e}");
            None
        }
        Err(e) => {
            tracing::warn!(
                "no control socket for 'longhaul status' at {}: {e}",
                path.display()
            );
            None
        }
    }
}

async fn status(a: args::StatusArgs) -> anyhow::Result<()> {
    use longhaul_forward::status;
    let sockets = status::to_ask(a.socket.as_deref())?;
    let mut all = vec![];
    for s in &sockets {
        match status::query(s).await {
            Ok(v) => all.push(v),
            // A process that ended without removing its socket.
            Err(e) if a.socket.is_none() => tracing::debug!("{}: {e}", s.display()),
            Err(e) => anyhow::bail!("{}: {e}", s.display()),
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else if all.is_empty() {
        println!(
            "no longhaul server or client running here (looked in {})",
            status::default_dir().display()
        );
    } else {
        for v in &all {
            print!("{}", status::human(v));
        }
    }
    Ok(())
}

pub(crate) use sys::stop_signal;

async fn client(a: args::ClientArgs) -> anyhow::Result<()> {
    // A terminal closing, or a habit from the server's reload, must not
    // kill a client by surprise.
    if let Ok(mut hup) = sys::Hangups::watch() {
        tokio::spawn(async move {
            while hup.next().await.is_some() {
                tracing::info!(
                    "reload ({}) ignored: a client has nothing to reload (restart it to change its forwards)",
                    sys::HANGUP
                );
            }
        });
    }
    let mut cfg = connect::client_config(&a.server, &a.conn, &a.session, a.jmux)?;
    cfg.local = a.local.clone();
    cfg.remote = a.remote.clone();
    cfg.socks = a.socks.clone();
    cfg.http = a.http_proxy.clone();
    cfg.reconnect = !a.no_reconnect;
    cfg.wait_for_server = a.wait_for_server;
    cfg.failover = a.failover.iter().map(|f| f.url.clone()).collect();
    if cfg.local.is_empty() && cfg.remote.is_empty() && cfg.socks.is_empty() && cfg.http.is_empty()
    {
        anyhow::bail!("nothing to forward: give at least one of -L, -R, -D or --http-proxy");
    }
    let metrics = cfg.metrics.clone();
    // Before the session: a taken metrics address must not leave a session
    // behind on the server.
    if let Some(addr) = a.metrics {
        serve::serve_metrics(addr, metrics.clone(), "client").await?;
    }
    // Ctrl-C while it waits for a server (or dials) ends it at once.
    let client = tokio::select! {
        c = Client::start(cfg) => c?,
        _ = stop_signal() => return Ok(()),
    };
    let _control = control(a.control.as_deref(), "client", metrics, None);
    for (spec, addr) in a.local.iter().zip(&client.local_addrs) {
        let (p, h, hp) = (spec.prefix(), &spec.host, spec.host_port);
        tracing::info!("forwarding {p}{addr} -> {h}:{hp}");
    }
    for addr in &client.socks_addrs {
        tracing::info!("SOCKS5 proxy on {addr}");
    }
    for addr in &client.http_addrs {
        tracing::info!("HTTP CONNECT proxy on {addr}");
    }
    tokio::select! {
        why = client.wait() => anyhow::bail!("session with {} ended: {why}", a.server.url),
        _ = stop_signal() => {
            // Said to the server, so that it frees our -R ports now
            // rather than keep the session for a resume that cannot come.
            client
                .shutdown("client stopped", longhaul_forward::client::GOODBYE_GRACE)
                .await;
            Ok(())
        }
    }
}

fn netem(n: NetemArgs) -> anyhow::Result<()> {
    use longhaul_netem as ne;
    match n.cmd {
        NetemCmd::Up {
            delay,
            rate,
            loss,
            loss_back,
            link2,
            queue,
            tcp_buffers,
        } => {
            let cfg = ne::NetemConfig {
                name: n.name.clone(),
                delay_us: delay.as_micros() as u64,
                rate_bps: rate,
                loss,
                loss_back,
                link2,
                queue_bytes: queue,
                tcp_buffer_max: tcp_buffers,
            };
            ne::up(&cfg, &std::env::current_exe()?)?;
            println!(
                "netem up: a {} (ns {}) <-> b {} (ns {}); delay {:?} each way (RTT {:?}){}{}",
                ne::ADDR_A,
                cfg.ns_a(),
                ne::ADDR_B,
                cfg.ns_b(),
                delay,
                delay * 2,
                rate.map(|r| format!(", rate {} Mbit/s", r / 1_000_000))
                    .unwrap_or_default(),
                match loss_back {
                    Some(back) =>
                        format!(", loss {:.3}% a→b, {:.3}% b→a", loss * 100.0, back * 100.0),
                    None if loss > 0.0 => format!(", loss {:.3}%", loss * 100.0),
                    None => String::new(),
                },
            );
            Ok(())
        }
        NetemCmd::Down => {
            if ne::down(&n.name)? {
                println!("netem '{}' down", n.name);
            } else {
                println!("netem '{}' was not up", n.name);
            }
            Ok(())
        }
        NetemCmd::Status { json } => match ne::status(&n.name)? {
            None => {
                println!("netem '{}' is not up", n.name);
                Ok(())
            }
            Some(s) if json => {
                println!("{}", serde_json::to_string_pretty(&s)?);
                Ok(())
            }
            Some(s) => {
                println!(
                    "netem '{}' up (pid {}): delay {} µs each way, rate {}, loss {:.3}% a→b, {:.3}% b→a, offload {}",
                    n.name,
                    s.pid,
                    s.config.delay_us,
                    s.config.rate_bps.map(|r| format!("{} Mbit/s", r / 1_000_000)).unwrap_or("unlimited".into()),
                    s.config.loss * 100.0,
                    s.config.loss_back.unwrap_or(s.config.loss) * 100.0,
                    s.offload
                );
                let mut dirs = vec![("a→b", &s.a_to_b), ("b→a", &s.b_to_a)];
                if let Some([ab, ba]) = &s.link2 {
                    dirs.extend([("link 2 a→b", ab), ("link 2 b→a", ba)]);
                }
                for (dir, d) in dirs {
                    println!(
                        "  {dir}: {} packets, {} bytes, {} queue drops, {} lost, {} late (>1 ms), worst lateness {:.0} µs",
                        d.packets, d.bytes, d.queue_drops, d.lost, d.late_releases, d.worst_lateness_us
                    );
                }
                Ok(())
            }
        },
        NetemCmd::Exec { side, cmd } => {
            let side = side.chars().next().unwrap_or('a');
            // Become the command (via `ip netns exec`), so its PID is ours
            // and signals sent to us reach it; returns only on failure.
            let err = sys::become_command(&mut ne::exec_command(&n.name, side, &cmd)?);
            anyhow::bail!("cannot run {:?} in side {side}: {err}", cmd.join(" "))
        }
        NetemCmd::Daemon { config } => {
            let cfg: ne::NetemConfig = serde_json::from_str(&config)?;
            ne::daemon(cfg)
        }
    }
}

/// `s` with control characters, Unicode line separators and bidirectional
/// overrides escaped (`\u{1b}`), for a terminal: text a peer chose cannot
/// drive it (scp's CVE-2019-6109). Nothing is cut.
pub(crate) fn terminal_safe(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let unsafe_char = c.is_control()
                || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
            let mut out = String::new();
            if unsafe_char {
                out.extend(c.escape_debug());
            } else {
                out.push(c);
            }
            out.chars().collect::<Vec<_>>()
        })
        .collect()
}
