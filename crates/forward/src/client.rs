//! `longhaul client`: one session, many listeners.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context};
use longhaul_carrier::tls::PinVerifier;
use longhaul_carrier::{
    accept_with_backoff, bind_listener, CarrierUrl, DialOptions, Fingerprint, Identity, Transport,
};
use longhaul_proto::frame::{format_dest, parse_dest};
use longhaul_proto::Reason;
use longhaul_session::{Acceptor, BoxFuture, OpenRefused, Session, SessionConfig, SessionHandle};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

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
    pub token: Option<String>,
    /// Allow unencrypted carriers (tcp://, plain ws://).
    pub insecure: bool,
    pub local: Vec<ForwardSpec>,
    pub remote: Vec<ForwardSpec>,
    pub socks: Vec<SocketAddr>,
    pub http: Vec<SocketAddr>,
    pub session: SessionConfig,
    /// Congestion control for the carrier (None: the system default).
    pub congestion: Option<String>,
}

impl ClientConfig {
    pub fn new(server: CarrierUrl) -> ClientConfig {
        ClientConfig {
            server,
            identity: None,
            pin: None,
            known_hosts: None,
            token: None,
            insecure: false,
            local: vec![],
            remote: vec![],
            socks: vec![],
            http: vec![],
            session: SessionConfig::default(),
            congestion: None,
        }
    }
}

/// Dials the carrier and checks the server's key (pin or known-hosts)
/// before anything else is sent.
async fn connect(config: &ClientConfig) -> anyhow::Result<longhaul_carrier::Carrier> {
    let url = &config.server;
    let use_tls = match url {
        CarrierUrl::Cmd { .. } => false,
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
    };
    let mut opts = DialOptions {
        tls: None,
        congestion: config.congestion.clone(),
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
        let expected = config.pin.or(match known {
            Known::Key(fp, _) => Some(fp),
            Known::Unknown => None,
        });
        let v = PinVerifier::new(expected);
        opts.tls = Some(
            longhaul_carrier::tls::client_config(config.identity.as_ref(), v.clone())
                .context("TLS setup failed")?,
        );
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
    pub session: SessionHandle,
    /// Bound addresses of the `-L` listeners, in order.
    pub local_addrs: Vec<SocketAddr>,
    /// Bound addresses of the `-D` listeners.
    pub socks_addrs: Vec<SocketAddr>,
    /// Bound addresses of the `--http-proxy` listeners.
    pub http_addrs: Vec<SocketAddr>,
    /// Ports the server bound for the `-R` forwards, in order.
    pub remote_ports: Vec<u16>,
}

/// Reverse streams may only reach the targets of our own `-R` forwards.
struct ClientAcceptor {
    targets: Mutex<HashSet<String>>,
}

impl Acceptor for ClientAcceptor {
    fn connect(&self, dest: String) -> BoxFuture<Result<TcpStream, OpenRefused>> {
        let allowed = self
            .targets
            .lock()
            .map(|t| t.contains(&dest))
            .unwrap_or(false);
        Box::pin(async move {
            if !allowed {
                tracing::warn!(%dest, "refused stream opened by server: not one of our -R targets");
                return Err(OpenRefused::new(
                    Reason::NOT_ALLOWED,
                    "not a reverse-forward target",
                ));
            }
            let (host, port) = parse_dest(&dest).ok_or_else(|| {
                OpenRefused::new(Reason::ADDRESS_TYPE_NOT_SUPPORTED, "bad destination")
            })?;
            connect_host(&host, port).await
        })
    }
}

enum Kind {
    Local(String),
    Socks,
    Http,
}

async fn accept_loop(listener: TcpListener, kind: Kind, session: SessionHandle) {
    let what = match &kind {
        Kind::Local(dest) => format!("-L to {dest}"),
        Kind::Socks => "-D".into(),
        Kind::Http => "--http-proxy".into(),
    };
    loop {
        let (sock, from) = tokio::select! {
            a = accept_with_backoff(&listener, &what) => a,
            _ = session.closed() => return,
        };
        let session = session.clone();
        match &kind {
            Kind::Local(dest) => {
                let dest = dest.clone();
                tokio::spawn(async move {
                    match session.open(&dest).await {
                        Ok(opened) => opened.attach(sock),
                        Err(e) => {
                            // Dropping `sock` closes it: a prompt, clear failure.
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

impl Client {
    /// Connects the carrier, opens every listener and asks for every reverse
    /// forward. Any failure is an error (ssh's ExitOnForwardFailure).
    pub async fn start(config: ClientConfig) -> anyhow::Result<Client> {
        let url = &config.server;
        let mut carrier = connect(&config).await?;
        if config.session.mode == longhaul_session::Mode::Native {
            let p = crate::auth::preamble(config.token.as_deref()).map_err(|e| anyhow!(e))?;
            carrier
                .writer
                .write_all(&p)
                .await
                .with_context(|| format!("cannot authenticate to {url}"))?;
        }
        let targets: HashSet<String> = config
            .remote
            .iter()
            .map(|r| format_dest(&r.host, r.host_port))
            .collect();
        let acceptor = Arc::new(ClientAcceptor {
            targets: Mutex::new(targets),
        });
        let session = Session::start(carrier, config.session.clone(), acceptor)
            .await
            .with_context(|| {
                format!("session with {url} failed (a server that closes at once did not accept our key or token)")
            })?;

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
            let port = session
                .bind(&r.bind_addr(), &dest)
                .await
                .map_err(|e| anyhow!("server refused -R {}: {e}", r.bind_addr()))?;
            tracing::info!("-R {}:{port} -> {}:{} open", r.bind, r.host, r.host_port);
            remote_ports.push(port);
        }
        for (lst, kind) in listeners {
            tokio::spawn(accept_loop(lst, kind, session.clone()));
        }
        Ok(Client {
            session,
            local_addrs,
            socks_addrs,
            http_addrs,
            remote_ports,
        })
    }

    /// Waits for the session to end; returns why.
    pub async fn wait(&self) -> String {
        self.session.closed().await
    }
}
