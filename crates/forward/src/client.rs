//! `longhaul client`: one session, many listeners.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use longhaul_carrier::{
    accept_with_backoff, bind_listener, CarrierUrl, DialOptions, Fingerprint, Identity, Transport,
};
use longhaul_proto::frame::{format_dest, parse_dest};
use longhaul_proto::Reason;
use longhaul_session::{
    Acceptor, BoxFuture, LocalStream, OpenRefused, SessionConfig, SessionHandle,
};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::connect::connect_host;
use crate::known_hosts::{Known, KnownHosts};
use crate::spec::{listen_addr, ForwardSpec};

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The server's carrier.
    pub server: CarrierUrl,
    /// Our key, shown to the server in TLS (None: authenticate by token).
    pub identity: Option<Identity>,
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
    pub fn new(server: CarrierUrl) -> ClientConfig {
        ClientConfig {
            server,
            identity: None,
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

/// Dials the carrier and checks the server's key (pin or known-hosts)
/// before anything else is sent.
pub(crate) async fn connect(
    config: &ClientConfig,
    bind: Option<std::net::IpAddr>,
) -> anyhow::Result<longhaul_carrier::Carrier> {
    let url = &config.server;
    let use_tls = match url {
        CarrierUrl::Cmd { .. } => false,
        // --insecure alone never takes TLS off a folder.
        CarrierUrl::Dir(d) if !d.tls && !config.insecure => bail!(
            "{url} is unencrypted: the token and all traffic would be written in clear into the folder; add --insecure if that is what you want, or drop ?tls=off"
        ),
        CarrierUrl::Dir(d) => d.tls,
        CarrierUrl::Net { transport, .. } => match transport {
            Transport::Tcp if !config.insecure => bail!(
                "{url} is unencrypted and unauthenticated; use tls:// (the default) or pass --insecure"
            ),
            Transport::Tcp => false,
            Transport::Ws { .. } => !config.insecure,
            Transport::Tls | Transport::Wss { .. } => true,
        },
    };
    let host = match url {
        CarrierUrl::Net { addr, .. } => addr.clone(),
        CarrierUrl::Cmd { .. } => String::new(),
        // Remembered in known_hosts under a form without whitespace or
        // options: one entry per folder.
        CarrierUrl::Dir(d) => d.identity(),
    };
    let mut opts = DialOptions {
        tls: None,
        congestion: config.congestion.clone(),
        bind,
    };
    let mut known = Known::Unknown;
    let mut verifier = None;
    if use_tls {
        if config.pin.is_none() {
            if let Some(kh) = &config.known_hosts {
                known = kh.lookup(&host).map_err(|e| anyhow!(e))?;
            } else {
                tracing::warn!("no --pin and no known-hosts file: the server's key is not checked");
            }
        }
        if matches!(url, CarrierUrl::Dir(_))
            && config.pin.is_none()
            && known == Known::Unknown
            && !config.trust_first_use
        {
            bail!(
                "no key known for the folder {host}: give --pin SHA256:… (the server logs its key when it starts), or --trust-first-use to trust and remember whichever key answers first (anyone who can write the folder could)"
            );
        }
        let expected = config.pin.or(match known {
            Known::Key(fp, _) => Some(fp),
            Known::Unknown => None,
        });
        let (tls, v) = config
            .tls_sessions
            .config(config.identity.as_ref(), expected)
            .context("TLS setup failed")?;
        opts.tls = Some(tls);
        verifier = Some((v, expected));
    } else if !matches!(url, CarrierUrl::Cmd { .. }) {
        // Once per process: the demo and tests make many sessions.
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| tracing::warn!("{url}: carrier is NOT encrypted (--insecure)"));
    }
    let carrier = match longhaul_carrier::dial(url, &opts).await {
        Ok(c) => c,
        Err(e) => {
            if let Some((v, Some(want))) = &verifier {
                if let Some(seen) = v.seen().filter(|s| s != want) {
                    match (&known, &config.known_hosts) {
                        (Known::Key(_, line), Some(kh)) => bail!(
                            "REFUSED: the key of server {host} has CHANGED: it shows {seen}, but {} line {line} says {want}. \
                             Someone may be intercepting the connection. If the server's key was changed on purpose, delete that line.",
                            kh.path().display()
                        ),
                        _ => bail!("REFUSED: server {host} shows key {seen}, not the pinned {want}"),
                    }
                }
            }
            return Err(anyhow!(e)).with_context(|| format!("cannot connect to server {url}"));
        }
    };
    if let (Some((v, None)), Some(kh)) = (&verifier, &config.known_hosts) {
        if let Some(seen) = v.seen() {
            kh.remember(&host, seen).map_err(|e| anyhow!(e))?;
            tracing::warn!(
                "first connection to {host}: trusting its key {seen} from now on (saved in {})",
                kh.path().display()
            );
        }
    }
    Ok(carrier)
}

/// A running client.
pub struct Client {
    /// The session in use (a new one replaces it after a refused resume).
    current: watch::Receiver<SessionHandle>,
    /// Why the client stopped for good (reconnects off, or stopped).
    ended: watch::Receiver<Option<String>>,
    stop: watch::Sender<bool>,
    /// Bound addresses of the `-L` listeners, in order.
    pub local_addrs: Vec<SocketAddr>,
    /// Bound addresses of the `-D` listeners.
    pub socks_addrs: Vec<SocketAddr>,
    /// Bound addresses of the `--http-proxy` listeners.
    pub http_addrs: Vec<SocketAddr>,
    /// Ports the server bound for the `-R` forwards, in order.
    pub remote_ports: Vec<u16>,
}

/// Streams the server opened that were refused, for the log.
static REFUSED: longhaul_session::logs::Throttle = longhaul_session::logs::Throttle::new();

/// Reverse streams may only reach the targets of our own `-R` forwards.
pub(crate) struct ClientAcceptor {
    targets: Mutex<HashSet<String>>,
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
            let (host, port) = parse_dest(&dest).ok_or_else(|| {
                OpenRefused::new(Reason::ADDRESS_TYPE_NOT_SUPPORTED, "bad destination")
            })?;
            connect_host(&host, port).await.map(Into::into)
        })
    }
}

enum Kind {
    Local(String),
    Socks,
    Http,
}

async fn accept_loop(
    listener: TcpListener,
    kind: Kind,
    mut current: watch::Receiver<SessionHandle>,
    mut ended: watch::Receiver<Option<String>>,
    demand: Arc<tokio::sync::Notify>,
) {
    let what = match &kind {
        Kind::Local(dest) => format!("-L to {dest}"),
        Kind::Socks => "-D".into(),
        Kind::Http => "--http-proxy".into(),
    };
    loop {
        // The listener stays open while the session is being resumed or
        // replaced: a stream opened meanwhile waits for the carrier (its
        // OPEN is queued, and refused after the open timeout).
        let (sock, from) = tokio::select! {
            a = accept_with_backoff(&listener, &what) => a,
            _ = ended.wait_for(|e| e.is_some()) => return,
        };
        // No session (the server closed an idle one, or one is being
        // replaced): ask for a new one and wait for it, as long as an OPEN
        // would wait.
        let deadline = tokio::time::Instant::now() + OPEN_WAIT;
        while current.borrow_and_update().is_closed() {
            demand.notify_one();
            match tokio::time::timeout_at(deadline, current.changed()).await {
                Ok(Ok(())) => {}
                _ => break,
            }
        }
        let session = current.borrow().clone();
        match &kind {
            Kind::Local(dest) => {
                let dest = dest.clone();
                tokio::spawn(async move {
                    match session.open(&dest).await {
                        Ok(opened) => opened.attach(sock),
                        Err(e) => {
                            // Dropping `sock` closes it: a prompt, clear failure.
                            // The server's words, escaped.
                            let e = longhaul_session::logs::escaped(&e);
                            tracing::info!(%from, %dest, "forward failed: {e}");
                        }
                    }
                });
            }
            Kind::Socks => {
                tokio::spawn(crate::socks5::serve(sock, session));
            }
            Kind::Http => {
                tokio::spawn(crate::http_connect::serve(sock, session));
            }
        }
    }
}

fn listen(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    bind_listener(addr).with_context(|| format!("cannot listen on {addr} for {what}"))
}

/// Keeps the session in use counted, through replacements.
async fn track_sessions(
    metrics: Arc<crate::metrics::Metrics>,
    mut current: watch::Receiver<SessionHandle>,
    server: String,
) {
    loop {
        let h = current.borrow_and_update().clone();
        let tracked = metrics.track(&server, &h);
        let replaced = tokio::select! {
            r = current.changed() => r.is_ok(),
            _ = h.closed() => false,
        };
        drop(tracked);
        if !replaced && current.changed().await.is_err() {
            return;
        }
    }
}

/// How long a new local connection waits for a session to exist.
const OPEN_WAIT: Duration = Duration::from_secs(30);

impl Client {
    /// Connects the carrier, opens every listener and asks for every reverse
    /// forward. Any failure is an error (ssh's ExitOnForwardFailure).
    pub async fn start(mut config: ClientConfig) -> anyhow::Result<Client> {
        if !config.reconnects() {
            // Nothing would dial again: do not offer resume.
            config.session.resume = false;
        }
        let targets: HashSet<String> = config
            .remote
            .iter()
            .map(|r| format_dest(&r.host, r.host_port))
            .collect();
        let acceptor = Arc::new(ClientAcceptor {
            targets: Mutex::new(targets),
        });
        let session = crate::reconnect::establish(&config, acceptor.clone()).await?;

        let mut listeners = vec![];
        let mut local_addrs = vec![];
        for l in &config.local {
            let addr = listen_addr(&l.bind, l.port).map_err(|e| anyhow!("-L: {e}"))?;
            let lst = listen(addr, &format!("-L {}:{}", l.host, l.host_port))?;
            local_addrs.push(lst.local_addr()?);
            listeners.push((lst, Kind::Local(format_dest(&l.host, l.host_port))));
        }
        let mut socks_addrs = vec![];
        for a in &config.socks {
            let lst = listen(*a, "-D")?;
            socks_addrs.push(lst.local_addr()?);
            listeners.push((lst, Kind::Socks));
        }
        let mut http_addrs = vec![];
        for a in &config.http {
            let lst = listen(*a, "--http-proxy")?;
            http_addrs.push(lst.local_addr()?);
            listeners.push((lst, Kind::Http));
        }
        let mut remote_ports = vec![];
        for r in &config.remote {
            let dest = format_dest(&r.host, r.host_port);
            let port = session.bind(&r.bind_addr(), &dest).await.map_err(|e| {
                let e = longhaul_session::logs::escaped(&e);
                anyhow!("server refused -R {}: {e}", r.bind_addr())
            })?;
            tracing::info!("-R {}:{port} -> {}:{} open", r.bind, r.host, r.host_port);
            remote_ports.push(port);
        }
        let (current_tx, current) = watch::channel(session);
        let (ended_tx, ended) = watch::channel(None);
        let (stop, stop_rx) = watch::channel(false);
        let demand = Arc::new(tokio::sync::Notify::new());
        tokio::spawn(track_sessions(
            config.metrics.clone(),
            current.clone(),
            config.server.to_string(),
        ));
        for (lst, kind) in listeners {
            tokio::spawn(accept_loop(
                lst,
                kind,
                current.clone(),
                ended.clone(),
                demand.clone(),
            ));
        }
        tokio::spawn(crate::reconnect::supervise(
            Arc::new(config),
            acceptor,
            current_tx,
            ended_tx,
            stop_rx,
            remote_ports.clone(),
            demand,
        ));
        Ok(Client {
            current,
            ended,
            stop,
            local_addrs,
            socks_addrs,
            http_addrs,
            remote_ports,
        })
    }

    /// The session in use now.
    pub fn session(&self) -> SessionHandle {
        self.current.borrow().clone()
    }

    /// Waits until the client stops for good (with reconnects, only when
    /// [`Client::stop`] is called); returns why.
    pub async fn wait(&self) -> String {
        let mut ended = self.ended.clone();
        let why = match ended.wait_for(|e| e.is_some()).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => "client gone".into(),
        };
        why
    }

    /// Stops reconnecting, closes the listeners and the session.
    pub fn stop(&self, why: &str) {
        self.stop.send_replace(true);
        self.session().close(why);
    }

    /// Stops reconnecting and ends the session politely: what is queued is
    /// written and the server forgets the session (within `grace`).
    pub async fn shutdown(&self, why: &str, grace: Duration) {
        self.stop.send_replace(true);
        self.session().shutdown(why, grace).await;
    }
}
