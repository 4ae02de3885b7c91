//! What a server is configured with, and what it knows of a carrier's
//! ends.

use std::sync::Arc;
use std::time::Duration;

use longhaul_carrier::folder::FolderUrl;
use longhaul_carrier::{Identity, ListenUrl, Transport};
use longhaul_files::serve::FileServer;
use longhaul_files::Access;
use longhaul_session::SessionConfig;

use crate::auth::ServerAuth;
use crate::flow_ports::FlowPorts;
use crate::metrics::Metrics;
use crate::rules::{BindRules, Rules};

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Carrier listeners (at least one, unless serving stdio or folders).
    pub listen: Vec<ListenUrl>,
    /// Shared directories to serve folder carriers in (`dir://PATH`).
    pub folders: Vec<FolderUrl>,
    /// The server's key, for TLS listeners.
    pub identity: Option<Identity>,
    pub auth: ServerAuth,
    /// Global ceiling: what any client may reach.
    pub rules: Rules,
    /// Global ceiling: what any client may bind.
    pub bind_rules: BindRules,
    pub session: SessionConfig,
    /// Sessions served at once (a slot is taken once a carrier has
    /// authenticated; more are closed then). Default 1024.
    pub max_sessions: usize,
    /// Carriers not yet authenticated, at once and per source address;
    /// when full the oldest is dropped ([`crate::pending`]).
    pub max_pending: usize,
    pub max_pending_per_source: usize,
    /// Congestion control for carriers (None: the system default).
    pub congestion: Option<String>,
    /// The folder offered to `longhaul cp` (`--files DIR`).
    pub files: Option<Arc<FileServer>>,
    /// What clients authenticated by token (or anyone, with `--insecure`)
    /// may do there; keys say it in authorized_keys.
    pub files_without_key: Option<Access>,
    /// What the server counts (shown with `--metrics`).
    pub metrics: Arc<Metrics>,
    /// UDP flows open at once, in all and per client identity
    /// (`--max-flows`, `--max-flows-per-client`; see `flow_ports`).
    pub flows: Arc<FlowPorts>,
    /// On stop, how long sessions with open streams are kept while their
    /// clients move to other servers (`--drain-timeout`; 0: close at once).
    /// Default 30 s.
    pub drain_timeout: Duration,
}

/// Default of [`ServerConfig::drain_timeout`]: a third of systemd's
/// default stop timeout (90 s), so a restart never ends in SIGKILL.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for ServerConfig {
    /// No listener yet (enough for `--stdio`), nothing allowed.
    fn default() -> ServerConfig {
        ServerConfig {
            listen: vec![],
            folders: vec![],
            identity: None,
            auth: ServerAuth::default(),
            rules: Rules::default(),
            bind_rules: BindRules::default(),
            session: SessionConfig::default(),
            max_sessions: 1024,
            max_pending: crate::pending::MAX_PENDING,
            max_pending_per_source: crate::pending::MAX_PENDING_PER_SOURCE,
            congestion: None,
            files: None,
            files_without_key: None,
            metrics: Metrics::new(),
            flows: FlowPorts::host_defaults(),
            drain_timeout: DRAIN_TIMEOUT,
        }
    }
}

/// This machine's host name as an instance name (None if it cannot be
/// one: see `longhaul_proto::resume::instance::valid`).
pub fn host_instance() -> Option<String> {
    let name = crate::sys::host_name()?;
    longhaul_proto::resume::instance::valid(&name).then_some(name)
}

impl ServerConfig {
    pub fn new(listen: ListenUrl) -> ServerConfig {
        ServerConfig {
            listen: vec![listen],
            ..ServerConfig::default()
        }
    }

    /// Whether TLS runs over this listener's transport.
    pub(crate) fn uses_tls(&self, t: &Transport) -> bool {
        match t {
            Transport::Tcp => false,
            Transport::Ws { .. } => !self.auth.insecure,
            Transport::Tls | Transport::Quic | Transport::Wss { .. } => true,
        }
    }

    /// Refuses settings that would expose an open relay by accident.
    pub fn check(&self) -> Result<(), String> {
        if self.session.mode == longhaul_session::Mode::Jmux {
            if let Some(l) = self.listen.iter().find(|l| l.transport == Transport::Quic) {
                return Err(format!("{l}: JMUX peers speak over TCP, TLS or WebSocket, not QUIC; listen on tls:// or tcp:// with --jmux"));
            }
        }
        for l in &self.listen {
            if matches!(l.transport, Transport::Tcp) && !self.auth.insecure {
                return Err(format!(
                    "{l} is unencrypted and unauthenticated; use tls:// (the default) or pass --insecure"
                ));
            }
            if self.uses_tls(&l.transport) && self.identity.is_none() {
                return Err(format!(
                    "{l} needs the server's key: --key FILE (make one with 'longhaul keygen --out FILE')"
                ));
            }
        }
        for f in &self.folders {
            // --insecure alone never takes TLS off a folder: whoever reads
            // the share would read the token and every byte.
            if !f.tls && !self.auth.insecure {
                return Err(format!(
                    "{f} is unencrypted: the token and all traffic would be written in clear into the folder; add --insecure if that is what you want, or drop ?tls=off"
                ));
            }
            if f.tls && self.identity.is_none() {
                return Err(format!(
                    "{f} needs the server's key: --key FILE (make one with 'longhaul keygen --out FILE'); the folder stays encrypted even with --insecure"
                ));
            }
        }
        if self.auth.is_open() && !self.auth.insecure {
            return Err("no way to authenticate clients: give --authorized-keys FILE or --token (or LONGHAUL_TOKEN), or --insecure to let anyone in".into());
        }
        if self.auth.token.is_some() && self.session.mode == longhaul_session::Mode::Jmux {
            return Err("--token needs longhaul's own protocol; in --jmux mode authenticate with --authorized-keys".into());
        }
        Ok(())
    }
}

/// A TCP carrier's two ends: where its client is, and our address it came
/// in on (for the doctor's direct measurement). None for stdio and folders.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ends {
    pub client: std::net::SocketAddr,
    pub local: std::net::SocketAddr,
}
