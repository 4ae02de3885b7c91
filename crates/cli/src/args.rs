//! Command-line arguments.

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand};
use longhaul_carrier::folder::FolderUrl;
use longhaul_carrier::ListenUrl;
use longhaul_forward::rules::{BindRule, BindRules, Rule, Rules};
use longhaul_forward::spec::{parse_forward, parse_listen, ForwardSpec};

pub use crate::bench_args::*;
pub use crate::conn_args::*;
pub use crate::values::*;

#[derive(Parser, Debug)]
#[command(
    name = "longhaul",
    version = crate::VERSION,
    about = "Carries TCP connections over one multiplexed carrier, at the speed the path can give, and measures it."
)]
pub struct Cli {
    /// More logging (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = "Global options")]
    pub verbose: u8,
    /// Only warnings and errors.
    #[arg(short, long, global = true, help_heading = "Global options")]
    pub quiet: bool,
    /// Worker threads: 1 runs everything on one thread (the default of the
    /// client and of a server that serves only folders: few sessions, no
    /// hand-offs between threads), 0 one per CPU (the default of every
    /// other command).
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=1024), help_heading = "Global options")]
    pub threads: Option<u16>,
    /// Options from a TOML file (keys: the command's long options); the command line overrides it. See contrib/server.toml.
    #[arg(
        long = "config",
        id = "config_file",
        global = true,
        value_name = "FILE",
        help_heading = "Global options"
    )]
    pub config_file: Option<std::path::PathBuf>,
    /// Log lines as text (colours only on a terminal) or as JSON objects, one per line.
    #[arg(
        long,
        global = true,
        value_name = "text|json",
        default_value = "text",
        help_heading = "Global options"
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl Cli {
    /// `--threads`, or the command's default.
    pub fn threads(&self) -> usize {
        match (self.threads, &self.cmd) {
            (Some(n), _) => n as usize,
            (None, Cmd::Client(_) | Cmd::Cp(_)) => 1,
            // A shared folder serves a few hosts: one thread answers
            // sooner and carries more (docs/BENCHMARKS.md).
            (None, Cmd::Server(s))
                if !s.listen.is_empty() && s.listen.iter().all(|l| matches!(l, Listen::Dir(_))) =>
            {
                1
            }
            (None, _) => 0,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Accept carriers and connect the targets the rules allow.
    Server(ServerArgs),
    /// Connect to a server and forward ports through it, ssh-style.
    Client(ClientArgs),
    /// Copy files to or from a server's --files folder, scp-style: verified, resumable.
    Cp(CpArgs),
    /// Sessions and streams of the servers and clients running here (like ss for the tunnel).
    Status(StatusArgs),
    /// Make the servers running here read their configuration again (rules, keys, token), and say how it went.
    Reload(ReloadArgs),
    /// Run a server or a client as a Windows service: install, uninstall.
    Service(ServiceArgs),
    /// Measure the path to a server and explain what limits it, with what to change.
    Doctor(DoctorArgs),
    /// Measuring kit: bench server, tput, rr.
    Bench(BenchArgs),
    /// Start a bench server, a longhaul server and client on loopback and
    /// print a short direct-vs-tunnel comparison.
    Demo(DemoArgs),
    /// Make a key pair (Ed25519) and print its fingerprint.
    Keygen(KeygenArgs),
    /// Print the fingerprint of a key file.
    Fingerprint {
        /// A key written by 'longhaul keygen'.
        file: std::path::PathBuf,
    },
    /// WAN emulator: two namespaces (a = 198.18.0.1, b = 198.18.0.2) joined
    /// by a userspace delay line. Needs root or CAP_NET_ADMIN.
    Netem(NetemArgs),
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell
    /// (e.g. `longhaul completions bash > /etc/bash_completion.d/longhaul`).
    Completions {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), or with --dir write one page per
    /// command there (longhaul.1, longhaul-server.1, …).
    Man {
        /// A folder to write every page into.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

#[derive(Args, Debug)]
pub struct NetemArgs {
    /// Instance name, to run several emulators side by side.
    #[arg(long, global = true, default_value = "default")]
    pub name: String,
    #[command(subcommand)]
    pub cmd: NetemCmd,
}

#[derive(Args, Debug)]
pub struct KeygenArgs {
    /// Where to write the private key (PATH.pub gets the fingerprint). Default: ~/.config/longhaul/key.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// `~/.config/longhaul/NAME`.
pub fn config_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".config/longhaul").join(name))
}

#[derive(Subcommand, Debug)]
pub enum NetemCmd {
    /// Create the namespaces and start the delay line.
    Up {
        /// One-way delay in each direction (RTT = 2 × delay).
        #[arg(long, default_value = "0ms", value_parser = parse_delay)]
        delay: std::time::Duration,
        /// Rate cap, e.g. 1gbit (default: none).
        #[arg(long, value_parser = parse_rate)]
        rate: Option<u64>,
        /// Random loss, e.g. 0.5%, each way (turns GSO offload off so loss hits single packets).
        #[arg(long, value_parser = parse_loss, default_value = "0")]
        loss: f64,
        /// Random loss b→a when it differs from a→b (then --loss is a→b only).
        #[arg(long, value_name = "LOSS", value_parser = parse_loss)]
        loss_back: Option<f64>,
        /// A second link, e.g. 30ms,200mbit[,0.1%]: a sends from 198.18.1.1 over it, b answers on 198.18.1.2.
        #[arg(long, value_name = "DELAY[,RATE[,LOSS]]", value_parser = parse_link2)]
        link2: Option<longhaul_netem::Link2>,
        /// Tail-drop queue in bytes (default: one BDP at the rate cap).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        queue: Option<u64>,
        /// Raise the namespaces' TCP buffer maximum (tcp_rmem/tcp_wmem), e.g. 64m.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        tcp_buffers: Option<u64>,
    },
    /// Remove everything `up` created (safe to run twice).
    Down,
    /// Show settings and counters (late releases, drops).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Run a command in side a or b: `netem exec a -- CMD...`.
    Exec {
        #[arg(value_parser = ["a", "b"])]
        side: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    #[command(hide = true)]
    Daemon { config: String },
}

pub(crate) fn parse_l(s: &str) -> Result<ForwardSpec, String> {
    parse_forward(s, "-L")
}
pub(crate) fn parse_r(s: &str) -> Result<ForwardSpec, String> {
    parse_forward(s, "-R")
}
pub(crate) fn parse_d(s: &str) -> Result<SocketAddr, String> {
    parse_listen(s, "-D")
}
pub(crate) fn parse_h(s: &str) -> Result<SocketAddr, String> {
    parse_listen(s, "--http-proxy")
}
pub(crate) fn parse_rule(s: &str) -> Result<Rule, String> {
    s.parse()
}
pub(crate) fn parse_bind_rule(s: &str) -> Result<BindRule, String> {
    s.parse()
}

/// What `--listen` names: a network listener or a shared folder.
#[derive(Debug, Clone)]
pub enum Listen {
    Net(ListenUrl),
    Dir(FolderUrl),
}

pub(crate) fn parse_listen_url(s: &str) -> Result<Listen, String> {
    match s.starts_with("dir://") {
        true => s.parse().map(Listen::Dir),
        false => s.parse().map(Listen::Net),
    }
}
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Carrier listener: [tls://]IP:PORT, tcp://IP:PORT, ws://IP:PORT/PATH, wss://IP:PORT/PATH or dir://PATH (a shared folder, TLS inside; dir://PATH?tls=off with --insecure: none). Repeatable.
    #[arg(long, value_name = "URL", value_parser = parse_listen_url, required_unless_present = "stdio")]
    pub listen: Vec<Listen>,
    /// Serve one session on stdin/stdout (for cmd:// clients, e.g. over ssh). The pipe's owner authenticates.
    #[arg(long, conflicts_with = "listen")]
    pub stdio: bool,
    /// The server's key (from 'longhaul keygen'), for TLS listeners.
    #[arg(long, value_name = "FILE")]
    pub key: Option<std::path::PathBuf>,
    /// Client keys allowed in, one per line: SHA256:… [allow=RULE,…] [bind=RULE,…] [# comment].
    #[arg(long, value_name = "FILE")]
    pub authorized_keys: Option<std::path::PathBuf>,
    /// Shared secret clients may authenticate with instead of a key.
    #[arg(long, env = "LONGHAUL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Let in clients without key or token, and allow unencrypted tcp:// and plain ws:// listeners. dir:// stays TLS: a folder is unencrypted only as dir://PATH?tls=off, with --insecure.
    #[arg(long)]
    pub insecure: bool,
    /// Allow streams to HOST:PORT (HOST: IP, CIDR, name, *.suffix or *; PORT: n, a-b or *); udp:HOST:PORT allows UDP flows instead. Repeatable.
    #[arg(long = "allow", value_name = "RULE", value_parser = parse_rule)]
    pub allow: Vec<Rule>,
    /// Allow every target (an open relay: only when you mean it).
    #[arg(long)]
    pub allow_all: bool,
    /// Allow reverse forwards (-R) to bind [ADDR:]PORT (no ADDR: loopback only; udp:[ADDR:]PORT for -R udp:). Repeatable.
    #[arg(long = "allow-bind", value_name = "[ADDR:]PORT", value_parser = parse_bind_rule)]
    pub allow_bind: Vec<BindRule>,
    /// Plain JMUX framing (no handshake), to interoperate with jetsocat jmux-proxy.
    #[arg(long)]
    pub jmux: bool,
    /// Carriers served at once; a session waiting for its client to resume
    /// counts. Default: an eighth of the open-files limit (raised to its
    /// hard limit at start), from 64 to 16384.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sessions: Option<u32>,
    /// This server's name in a fleet behind a load balancer, told to each client: its later carriers of a session (resumes, lanes) carry it as the TLS server name and in a Longhaul-Instance header, for the balancer to send them here (default: the host name; "" for none).
    #[arg(long, value_name = "NAME")]
    pub instance: Option<String>,
    /// On SIGTERM or Ctrl-C, keep sessions with open streams this long while their clients open new ones elsewhere (a second signal stops at once; 0: close every stream at once).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_span)]
    pub drain_timeout: std::time::Duration,
    /// Offer this folder to 'longhaul cp' (per key: files=ro|rw in --authorized-keys; nothing by default).
    #[arg(long, value_name = "DIR")]
    pub files: Option<std::path::PathBuf>,
    /// What clients authenticated by --token (or anyone, with --insecure) may do in --files: ro or rw (default: nothing).
    #[arg(long, value_name = "ro|rw", requires = "files")]
    pub files_for_token: Option<longhaul_files::Access>,
    /// Remove partial uploads in --files left untouched this long (checked hourly; 0: keep them).
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = parse_span)]
    pub files_keep_partial: std::time::Duration,
    /// Serve Prometheus metrics on http://ADDR/metrics (e.g. 127.0.0.1:9090).
    #[arg(long, value_name = "ADDR", value_parser = parse_addr)]
    pub metrics: Option<SocketAddr>,
    /// Control socket for 'longhaul status' (default: /run/longhaul/ROLE-PID.sock for root, else under $XDG_RUNTIME_DIR; 'none': no socket).
    #[arg(long, value_name = "PATH|none")]
    pub control: Option<std::path::PathBuf>,
    /// Most lanes one striped session may have (clients asking more get this many).
    #[arg(long, value_name = "K", default_value = "8", value_parser = parse_stripes)]
    pub max_stripes: u8,
    /// UDP flows open at once on this server, each holding one of the host's ports (default: half its ephemeral port range).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_flows: Option<u32>,
    /// UDP flows open at once per client key, for the token, or for anonymous clients (default: an eighth of the ephemeral port range).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_flows_per_client: Option<u32>,
    /// A UDP flow a client opened ends after this long without a datagram either way.
    #[arg(long, value_name = "DURATION", default_value = "180s", value_parser = parse_span)]
    pub flow_idle: std::time::Duration,
    #[command(flatten)]
    pub session: SessionArgs,
}

impl ServerArgs {
    pub fn rules(&self) -> Rules {
        Rules::new(self.allow.clone(), self.allow_all)
    }
    pub fn bind_rules(&self) -> BindRules {
        BindRules::new(self.allow_bind.clone(), false)
    }
}

#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The server: [tls://]HOST:PORT, tcp://HOST:PORT, ws://HOST:PORT/PATH, wss://HOST:PORT/PATH, cmd://COMMAND or dir://PATH (a shared folder, TLS inside).
    /// Append ?stripes=K to stripe the session over K connections (or use --stripes).
    #[arg(value_parser = parse_server_url)]
    pub server: ServerUrl,
    #[command(flatten)]
    pub conn: ConnectArgs,
    /// Local forward [BIND:]PORT:HOST:HOSTPORT (ssh -L); udp:[BIND:]PORT:HOST:HOSTPORT forwards UDP datagrams. Repeatable.
    #[arg(short = 'L', long = "local", value_name = "SPEC", value_parser = parse_l)]
    pub local: Vec<ForwardSpec>,
    /// Remote forward [BIND:]PORT:HOST:HOSTPORT (ssh -R): the server listens, we connect; udp:… for UDP. Repeatable.
    #[arg(short = 'R', long = "remote", value_name = "SPEC", value_parser = parse_r)]
    pub remote: Vec<ForwardSpec>,
    /// SOCKS5 listener [BIND:]PORT (ssh -D). Repeatable.
    #[arg(short = 'D', long = "dynamic", value_name = "[BIND:]PORT", value_parser = parse_d)]
    pub socks: Vec<SocketAddr>,
    /// HTTP CONNECT proxy listener [BIND:]PORT. Repeatable.
    #[arg(long, value_name = "[BIND:]PORT", value_parser = parse_h)]
    pub http_proxy: Vec<SocketAddr>,
    /// Plain JMUX framing (no handshake), to interoperate with jetsocat jmux-proxy.
    #[arg(long)]
    pub jmux: bool,
    /// Serve Prometheus metrics on http://ADDR/metrics (e.g. 127.0.0.1:9091).
    #[arg(long, value_name = "ADDR", value_parser = parse_addr)]
    pub metrics: Option<SocketAddr>,
    /// Control socket for 'longhaul status' (default: /run/longhaul/ROLE-PID.sock for root, else under $XDG_RUNTIME_DIR; 'none': no socket).
    #[arg(long, value_name = "PATH|none")]
    pub control: Option<std::path::PathBuf>,
    /// Do not dial again when the carrier drops (the client exits instead; the default resumes the session, or starts a new one if the server lost it).
    #[arg(long)]
    pub no_reconnect: bool,
    /// Keep trying the first connection until a server answers (with the reconnect's backoff), instead of exiting: for a client started before its server, or at boot.
    #[arg(long, conflicts_with = "no_reconnect")]
    pub wait_for_server: bool,
    /// Another server, tried when SERVER (and the --failover servers before it) does not start a session; repeatable, tried in order. A session resumes on the server it is on.
    #[arg(long, value_name = "SERVER", value_parser = parse_server_url)]
    pub failover: Vec<ServerUrl>,
    #[command(flatten)]
    pub session: SessionArgs,
}

#[derive(Args, Debug)]
#[command(override_usage = "longhaul cp [OPTIONS] SOURCE... DEST")]
pub struct CpArgs {
    /// Sources, then the destination: FILE… SERVER:/DIR/ uploads, SERVER:/PATH… DEST downloads.
    /// SERVER as for 'client' (e.g. tls://host:4433, host:4433?stripes=4, dir:///mnt/share); /PATH is inside the server's --files folder (scp's HOST:PORT:PATH works too).
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    pub paths: Vec<String>,
    /// Copy folders and what they hold.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Files copied at once, each on its own stream.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=32))]
    pub jobs: u8,
    /// Print the outcome as JSON on stdout (no progress bar).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: ConnectArgs,
    #[command(flatten)]
    pub session: SessionArgs,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// One control socket (default: every one in the default folder).
    pub socket: Option<std::path::PathBuf>,
    /// Print the snapshots as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ReloadArgs {
    /// One server's control socket (default: every server's in the default folder).
    pub socket: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct ServiceArgs {
    #[command(subcommand)]
    pub cmd: ServiceCmd,
}

#[derive(Subcommand, Debug)]
pub enum ServiceCmd {
    /// Register a server or client command as a Windows service that starts with the system
    /// (e.g. `longhaul service install server --config C:\longhaul\server.toml`).
    /// Relative paths are taken from the folder this is run in.
    Install {
        /// The service's name (letters, digits, '-', '_', '.'; its log files are named after it).
        #[arg(long, default_value = "longhaul", value_parser = crate::values::parse_service_name)]
        name: String,
        /// The command the service runs: `server …` or `client …`, as typed to run it here.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, num_args = 1..)]
        command: Vec<std::ffi::OsString>,
    },
    /// Ask a service to read its configuration again (as `sc.exe control NAME paramchange`); its log says how it went.
    Reload {
        /// The service's name (letters, digits, '-', '_', '.'; its log files are named after it).
        #[arg(long, default_value = "longhaul", value_parser = crate::values::parse_service_name)]
        name: String,
    },
    /// Stop a service `install` registered (a server drains first) and remove it.
    Uninstall {
        /// The service's name (letters, digits, '-', '_', '.'; its log files are named after it).
        #[arg(long, default_value = "longhaul", value_parser = crate::values::parse_service_name)]
        name: String,
    },
    /// What the service manager starts (not for people).
    #[command(hide = true)]
    Run {
        #[arg(long)]
        name: String,
        /// The folder relative paths are taken from (where `install` ran).
        #[arg(long)]
        dir: std::path::PathBuf,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, num_args = 1..)]
        command: Vec<std::ffi::OsString>,
    },
}

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The server, as for 'client'.
    #[arg(value_parser = parse_server_url)]
    pub server: ServerUrl,
    /// Also explain what an application with socket buffers of SIZE gets (e.g. 64k).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub app_buffer: Option<u64>,
    /// Seconds each throughput is measured for.
    #[arg(short = 't', long = "time", value_name = "SECS", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=20))]
    pub time: u64,
    /// Print the diagnosis as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: ConnectArgs,
    #[command(flatten)]
    pub session: SessionArgs,
}
