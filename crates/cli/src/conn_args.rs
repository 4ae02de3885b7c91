//! Arguments every command that reaches a server shares (client, cp,
//! doctor, bench sessions): the server's address, how to reach and trust
//! it, and the session's flow-control settings. Apart from `args`, so that
//! `bench_args` needs only this, not the whole command line.

use clap::Args;
use longhaul_carrier::{CarrierUrl, Fingerprint};
use longhaul_proto::window::WindowConfig;
use longhaul_session::{Mode, SessionConfig};

use crate::values::{parse_size, parse_span};

/// Flow-control and limit options shared by server and client.
#[derive(Args, Debug, Clone)]
pub struct SessionArgs {
    /// Initial per-stream receive window.
    #[arg(long, value_name = "SIZE", default_value = "256k", value_parser = parse_size)]
    pub window: u64,
    /// Largest a per-stream window may grow to.
    #[arg(long, value_name = "SIZE", default_value = "64m", value_parser = parse_size)]
    pub max_window: u64,
    /// Sum of all receive windows of one session.
    #[arg(long, value_name = "SIZE", default_value = "512m", value_parser = parse_size)]
    pub session_budget: u64,
    /// Streams open at once in one session.
    #[arg(long, value_name = "N", default_value_t = 16384)]
    pub max_streams: usize,
    /// Congestion control for the carrier: TCP's (e.g. cubic, bbr; default: the system's); over quic:// bbr (the default), cubic or reno.
    #[arg(long, value_name = "ALGO")]
    pub congestion: Option<String>,
    /// Time allowed for a carrier's TLS, WebSocket upgrade, authentication and hello.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_span)]
    pub handshake_timeout: std::time::Duration,
    /// Close a session with no stream open and no data moving for this long (0: never; default: 1h on a server in native mode, where clients come back on demand; never otherwise).
    #[arg(long, value_name = "DURATION", value_parser = parse_span)]
    pub idle_timeout: Option<std::time::Duration>,
    /// Bytes sent and not yet acknowledged kept for a replay after a carrier drop; the sender waits when it is full (auto: twice this machine's largest TCP send plus receive buffer, 16m to 256m).
    #[arg(long, value_name = "SIZE", default_value = "auto", value_parser = parse_replay_size)]
    pub replay_buffer: u64,
    /// How long a session whose carrier dropped is kept for a resume (server), or tried (client, then a new session starts).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_span)]
    pub resume_timeout: std::time::Duration,
    /// Nothing heard from the peer for this long: the carrier is dead (a resumable session moves to a new one). While no data moves, --quiet-keepalive is allowed on top (the kernel's TCP keepalive finds a dead first hop within this long meanwhile; a dead peer behind a proxy takes up to the sum).
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_span)]
    pub dead_after: std::time::Duration,
    /// While no data moves, PING this rarely, so idle sessions cost a server almost nothing (both sides must offer it, and the shorter of the two is used; TCP carriers only, whose kernel keepalive watches the first hop meanwhile); lower it if a proxy or NAT on the path drops connections idle for less (0: PING at the usual pace; at most 120s).
    #[arg(long, value_name = "DURATION", default_value = "25s", value_parser = parse_quiet_keepalive)]
    pub quiet_keepalive: std::time::Duration,
}

fn parse_quiet_keepalive(s: &str) -> Result<std::time::Duration, String> {
    let d = parse_span(s)?;
    let max = longhaul_proto::handshake::MAX_QUIET_KEEPALIVE_SECS;
    if d > std::time::Duration::from_secs(max.into()) {
        return Err(format!(
            "--quiet-keepalive {s} is too long: give at most {max}s (or 0 to PING at the usual pace)"
        ));
    }
    Ok(d)
}

pub(crate) fn parse_replay_size(s: &str) -> Result<u64, String> {
    if s == "auto" {
        return Ok(0);
    }
    let n = parse_size(s)?;
    if n < 256 * 1024 {
        return Err(format!(
            "--replay-buffer {s} is too small: give at least 256k (or auto)"
        ));
    }
    Ok(n)
}

impl SessionArgs {
    /// `idle_default`: the idle timeout when none is given.
    pub fn config(&self, jmux: bool, idle_default: std::time::Duration) -> SessionConfig {
        let idle = self.idle_timeout.unwrap_or(idle_default);
        let clamp = |v: u64| v.clamp(16 * 1024, u32::MAX as u64 / 2) as u32;
        SessionConfig {
            mode: if jmux { Mode::Jmux } else { Mode::Native },
            window: WindowConfig {
                initial: clamp(self.window),
                max: clamp(self.max_window.max(self.window)),
            },
            budget: self.session_budget,
            max_streams: self.max_streams.max(1),
            handshake_timeout: self
                .handshake_timeout
                .max(std::time::Duration::from_millis(100)),
            idle_timeout: (!idle.is_zero()).then_some(idle),
            replay_limit: self.replay_buffer as usize,
            resume_timeout: self.resume_timeout,
            dead_after: self.dead_after.max(std::time::Duration::from_secs(1)),
            // Every third of it, so that two PINGs may be lost; at most
            // 30 s (a long --dead-after is how many idle sessions are
            // kept cheap).
            keepalive: (self.dead_after / 3).clamp(
                std::time::Duration::from_millis(300),
                std::time::Duration::from_secs(30),
            ),
            quiet_keepalive: (!self.quiet_keepalive.is_zero()).then_some(self.quiet_keepalive),
            ..SessionConfig::default()
        }
    }
}

/// The client's server address, with its options (`?stripes=K`).
#[derive(Debug, Clone)]
pub struct ServerUrl {
    pub url: CarrierUrl,
    pub stripes: Option<u8>,
    /// Local addresses the lanes leave from, in turn (`?via=IP1,IP2`).
    pub via: Vec<std::net::IpAddr>,
}

pub(crate) fn parse_server_url(s: &str) -> Result<ServerUrl, String> {
    let (base, query) = match s.split_once('?') {
        // cmd:// and dir:// take their own options.
        Some((b, q)) if !s.starts_with("cmd://") && !s.starts_with("dir://") => (b, Some(q)),
        _ => (s, None),
    };
    let url: CarrierUrl = base.parse()?;
    let mut stripes = None;
    let mut via = Vec::new();
    for kv in query.into_iter().flat_map(|q| q.split('&')) {
        match kv.split_once('=') {
            Some(("stripes", k)) => stripes = Some(parse_stripes(k)?),
            Some(("via", ips)) => {
                for ip in ips.split(',') {
                    via.push(ip.parse().map_err(|_| {
                        format!("via={ips}: '{ip}' is not an IP address (give local addresses, e.g. via=192.0.2.10,198.51.100.7)")
                    })?);
                }
            }
            _ => {
                return Err(format!(
                    "unknown option '{kv}' in the server address; the options are ?stripes=K&via=IP1,IP2"
                ))
            }
        }
    }
    Ok(ServerUrl { url, stripes, via })
}

pub(crate) fn parse_stripes(k: &str) -> Result<u8, String> {
    let max = longhaul_session::MAX_LANES;
    match k.parse::<u8>() {
        Ok(n) if (1..=max as u8).contains(&n) => Ok(n),
        _ => Err(format!(
            "stripes={k}: give a number of lanes from 1 to {max}"
        )),
    }
}
pub(crate) fn parse_fingerprint(s: &str) -> Result<Fingerprint, String> {
    s.parse()
}

/// How to reach and trust a server (`client` and `cp`).
#[derive(Args, Debug)]
pub struct ConnectArgs {
    /// Stripe the session over K parallel connections to the server (1–16): faster than one on long, lossy or buffer-capped paths.
    #[arg(long, value_name = "K", value_parser = parse_stripes)]
    pub stripes: Option<u8>,
    /// Our key (default: ~/.config/longhaul/key if it exists).
    #[arg(long, value_name = "FILE")]
    pub key: Option<std::path::PathBuf>,
    /// The server's key fingerprint (SHA256:…); without it, trust on first use via --known-hosts.
    #[arg(long, value_name = "FINGERPRINT", value_parser = parse_fingerprint)]
    pub pin: Option<Fingerprint>,
    /// Remembered server keys (default: ~/.config/longhaul/known_hosts).
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<std::path::PathBuf>,
    /// Shared secret, if the server takes one instead of a key.
    #[arg(long, env = "LONGHAUL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Allow an unencrypted carrier (tcp://, plain ws://). dir:// stays TLS: a folder is unencrypted only as dir://PATH?tls=off, with --insecure.
    #[arg(long)]
    pub insecure: bool,
    /// Over dir://, trust the key that answers first (and remember it in --known-hosts): anyone who can write the folder could answer. Without it a folder needs --pin or a known key.
    #[arg(long)]
    pub trust_first_use: bool,
}
