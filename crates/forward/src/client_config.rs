//! What a client is configured with, and what it accepts from the server
//! (streams to its own `-R` targets only).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use longhaul_carrier::{CarrierUrl, Fingerprint, Identity};
use longhaul_proto::frame::{parse_target, Transport};
use longhaul_proto::Reason;
use longhaul_session::{Acceptor, BoxFuture, LocalStream, OpenRefused, SessionConfig};

use crate::connect::{connect_host, connect_udp, resolve_host};
use crate::known_hosts::KnownHosts;
use crate::spec::ForwardSpec;

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The server's carrier.
    pub server: CarrierUrl,
    /// Our key, shown to the server in TLS (None: authenticate by token).
    pub identity: Option<Identity>,
    /// Where that key was read from, for the messages that name it.
    pub identity_file: Option<std::path::PathBuf>,
    /// The server's key must be this one.
    pub pin: Option<Fingerprint>,
    /// Without a pin: trust on first use, remembered here.
    pub known_hosts: Option<KnownHosts>,
    /// Over a folder, trust on first use only when asked (anyone who can
    /// write the folder can answer a client's first file before the server
    /// does); without it a folder needs `pin` or a key in `known_hosts`.
    pub trust_first_use: bool,
    pub token: Option<String>,
    /// Allow unencrypted carriers (tcp://, plain ws://, and a folder that
    /// says `?tls=off`: never a folder by this alone).
    pub insecure: bool,
    pub local: Vec<ForwardSpec>,
    pub remote: Vec<ForwardSpec>,
    pub socks: Vec<SocketAddr>,
    pub http: Vec<SocketAddr>,
    pub session: SessionConfig,
    /// Congestion control for the carrier (None: the system default).
    pub congestion: Option<String>,
    /// Dial again when the carrier drops: resume the session, or start a
    /// fresh one when the server no longer has it. Off in JMUX mode and
    /// for `cmd://` (see [`ClientConfig::reconnects`]).
    pub reconnect: bool,
    /// Keep trying the first connection until a server answers, instead
    /// of failing at once (`--wait-for-server`).
    pub wait_for_server: bool,
    /// Servers tried in turn, after `server`, when a new session cannot
    /// start there (`--failover`); a session resumes where it is.
    pub failover: Vec<CarrierUrl>,
    /// The server as configured (`server` becomes the one a session is
    /// on): new sessions try it first again.
    pub home: Option<CarrierUrl>,
    /// Refuse a server whose key is not known yet (set for failover
    /// servers, see `reconnect::establish`).
    pub no_first_use: bool,
    /// TLS sessions to resume: the lanes of a striped session and redials
    /// skip the full handshake.
    pub tls_sessions: longhaul_carrier::tls::SessionCache,
    /// Local addresses the lanes of a striped session leave from, in turn
    /// (bonding uplinks; empty: the system chooses).
    pub via: Vec<std::net::IpAddr>,
    /// What the client counts (shown with `--metrics`).
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl ClientConfig {
    /// The servers a new session is tried on, in order.
    pub fn servers(&self) -> Vec<CarrierUrl> {
        let mut v = vec![self.home.clone().unwrap_or_else(|| self.server.clone())];
        for u in &self.failover {
            if !v.contains(u) {
                v.push(u.clone());
            }
        }
        v
    }

    /// How this client shows who it is, for its log lines.
    pub fn credentials(&self) -> String {
        match (&self.identity, &self.token, &self.server) {
            (_, _, CarrierUrl::Cmd { .. }) => "by the command's own login".into(),
            (Some(id), Some(_), _) => format!("with our key {} and the token", id.fingerprint),
            (Some(id), None, _) => format!("with our key {}", id.fingerprint),
            (None, Some(_), _) => "with the token".into(),
            (None, None, _) => "anonymously (no key, no token)".into(),
        }
    }

    pub fn new(server: CarrierUrl) -> ClientConfig {
        ClientConfig {
            server,
            identity: None,
            identity_file: None,
            pin: None,
            known_hosts: None,
            trust_first_use: false,
            token: None,
            insecure: false,
            local: vec![],
            remote: vec![],
            socks: vec![],
            http: vec![],
            session: SessionConfig::default(),
            congestion: None,
            reconnect: true,
            wait_for_server: false,
            failover: Vec::new(),
            home: None,
            no_first_use: false,
            tls_sessions: Default::default(),
            via: Vec::new(),
            metrics: crate::metrics::Metrics::new(),
        }
    }

    /// Whether this client reconnects: asked for, native mode, and a
    /// carrier that can be dialled again.
    pub fn reconnects(&self) -> bool {
        self.reconnect
            && self.session.mode == longhaul_session::Mode::Native
            && !matches!(self.server, CarrierUrl::Cmd { .. })
    }
}

/// Streams the server opened that were refused, for the log.
static REFUSED: longhaul_session::logs::Throttle = longhaul_session::logs::Throttle::new();

/// Reverse streams may only reach the targets of our own `-R` forwards.
pub(crate) struct ClientAcceptor {
    pub targets: Mutex<HashSet<String>>,
}

impl Acceptor for ClientAcceptor {
    fn connect(&self, dest: String) -> BoxFuture<Result<LocalStream, OpenRefused>> {
        let allowed = self
            .targets
            .lock()
            .map(|t| t.contains(&dest))
            .unwrap_or(false);
        Box::pin(async move {
            if !allowed {
                // The server chooses how often: throttled, escaped.
                if REFUSED.pass("refused streams opened by the server") {
                    let dest = longhaul_session::logs::shown(&dest);
                    tracing::warn!(%dest, "refused stream opened by server: not one of our -R targets");
                }
                return Err(OpenRefused::new(
                    Reason::NOT_ALLOWED,
                    "not a reverse-forward target",
                ));
            }
            let (t, host, port) = parse_target(&dest).ok_or_else(|| {
                OpenRefused::new(Reason::ADDRESS_TYPE_NOT_SUPPORTED, "bad destination")
            })?;
            match t {
                Transport::Tcp => connect_host(&host, port).await.map(Into::into),
                Transport::Udp => {
                    let addrs = resolve_host(&host, port).await?;
                    connect_udp(&addrs).await.map(LocalStream::Udp)
                }
            }
        })
    }
}
