//! `longhaul server`: the arguments turned into a `ServerConfig`, then the
//! server run until a stop signal (the first drains, a second ends).

use longhaul_forward::{Server, ServerConfig};

use crate::{args, control, reload, stop_signal};

/// Sessions a server serves at once unless told: each holds at least its
/// carrier's descriptor and one per stream and its target, so an eighth of
/// the open-files limit leaves room for a few streams each, the listeners
/// and the files of `longhaul cp`. At least 64; at most 16 384, as memory
/// is the other bound.
fn default_max_sessions() -> usize {
    let limit = longhaul_files::open_files_limit().unwrap_or(1024);
    usize::try_from(limit / 8)
        .unwrap_or(usize::MAX)
        .clamp(64, 16_384)
}

/// A server's default `--idle-timeout` in native mode.
const SERVER_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

pub(crate) async fn server(a: args::ServerArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let mut cfg = ServerConfig::default();
    for l in &a.listen {
        match l {
            args::Listen::Net(u) => cfg.listen.push(u.clone()),
            args::Listen::Dir(d) => cfg.folders.push(d.clone()),
        }
    }
    let policy = reload::policy(&a)?;
    let running = reload::fixed(&a);
    cfg.rules = policy.rules.clone();
    cfg.bind_rules = policy.bind_rules.clone();
    cfg.auth = policy.auth.clone();
    // Idle sessions cost the server a slot; native clients come back on
    // demand (JMUX peers would not), so the server closes them after 1 h.
    let idle = if a.jmux || a.stdio {
        std::time::Duration::ZERO
    } else {
        SERVER_IDLE_TIMEOUT
    };
    cfg.session = a.session.config(a.jmux, idle);
    cfg.max_sessions = match a.max_sessions {
        Some(n) => n as usize,
        None => default_max_sessions(),
    };
    tracing::debug!(max_sessions = cfg.max_sessions, "session slots");
    cfg.drain_timeout = a.drain_timeout;
    cfg.session.instance = match a.instance.as_deref() {
        None => longhaul_forward::server::host_instance(),
        Some("") => None,
        Some(n) if longhaul_proto::resume::instance::valid(n) => Some(n.to_owned()),
        Some(n) => anyhow::bail!(
            "--instance {n:?}: use up to 63 letters, digits, '-' and '.' (each dot-separated part starting and ending with a letter or digit, the last not a number: it is sent as a TLS server name), or \"\" for none"
        ),
    };
    cfg.session.max_stripes = a.max_stripes;
    cfg.session.flow_idle = a.flow_idle.max(std::time::Duration::from_secs(1));
    cfg.flows = longhaul_forward::flow_ports::FlowPorts::new(
        a.max_flows
            .map_or_else(longhaul_forward::flow_ports::default_total, |n| n as usize),
        a.max_flows_per_client
            .map_or_else(longhaul_forward::flow_ports::default_per_client, |n| {
                n as usize
            }),
    );
    tracing::debug!(
        max_flows = cfg.flows.total(),
        per_client = cfg.flows.per_client(),
        "UDP flow bounds"
    );
    cfg.congestion = a.session.congestion.clone();
    if let Some(dir) = &a.files {
        let files = longhaul_files::serve::FileServer::open(dir)
            .map_err(|e| anyhow::anyhow!("--files {}: {e}", dir.display()))?;
        tracing::info!("offering {} to 'longhaul cp'", dir.display());
        if !a.files_keep_partial.is_zero() {
            files.sweep_partial_every_hour(a.files_keep_partial);
        }
        cfg.files = Some(files);
        cfg.files_without_key = a.files_for_token;
    }
    if cfg.rules.is_empty() && cfg.files.is_none() {
        tracing::warn!("no --allow rule given: every stream will be refused (add --allow HOST:PORT, or --allow-all)");
    }
    if a.stdio {
        let why = Server::serve_stdio(cfg)
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        tracing::info!("stdio {why}");
        return Ok(());
    }
    if let Some(k) = &a.key {
        cfg.identity = Some(longhaul_carrier::Identity::load(k)?);
    }
    let open = cfg.auth.is_open();
    let key_fp = cfg.identity.as_ref().map(|i| i.fingerprint);
    let instance = cfg.session.instance.clone();
    let metrics = cfg.metrics.clone();
    let server = Server::bind(cfg).await.context("server not started")?;
    let reload = reload::Reload::new(server.reloader(), running);
    tokio::spawn(reload.clone().on_hangup());
    if let Some(addr) = a.metrics {
        serve_metrics(addr, metrics.clone(), "server").await?;
    }
    let by_control: longhaul_forward::status::ReloadFn =
        std::sync::Arc::new(move || reload.run("longhaul reload"));
    let _control = control(a.control.as_deref(), "server", metrics, Some(by_control));
    if a.insecure {
        tracing::warn!(
            "--insecure: unencrypted tcp:// and ws:// listeners allowed (dir:// only where it says ?tls=off){}",
            if open {
                ", and anyone who can connect may use this server"
            } else {
                ""
            }
        );
    }
    if let Some(name) = &instance {
        tracing::debug!("instance {name} (clients' resumes and lanes name it for a load balancer)");
    }
    if let Some(fp) = key_fp {
        tracing::info!("server key {fp} (clients: --pin {fp})");
    }
    for l in server.listening() {
        tracing::info!("listening on {l}");
    }
    for d in server.folders() {
        tracing::info!("serving the folder {d}");
    }
    // The first signal starts the drain, a second one ends it.
    let (stopping, mut signals) = tokio::sync::watch::channel(0u32);
    tokio::spawn(async move {
        loop {
            stop_signal().await;
            stopping.send_modify(|n| *n += 1);
        }
    });
    let mut hurry = signals.clone();
    server
        .run_draining(
            async move { _ = signals.wait_for(|n| *n >= 1).await },
            async move { _ = hurry.wait_for(|n| *n >= 2).await },
        )
        .await;
    Ok(())
}

pub(crate) async fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: std::sync::Arc<longhaul_forward::metrics::Metrics>,
    role: &'static str,
) -> anyhow::Result<()> {
    let bound = longhaul_forward::dashboard::serve(addr, metrics, role)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics {addr}: {e}"))?;
    tracing::info!("metrics on http://{bound}/metrics, a dashboard on http://{bound}/");
    Ok(())
}
