//! `longhaul client`: one session, many listeners.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use longhaul_carrier::tls::PinVerifier;
use longhaul_carrier::{
    accept_with_backoff, bind_listener, CarrierUrl, DialOptions, Fingerprint, Identity, Transport,
};
use longhaul_proto::frame::{format_dest, parse_dest};
use longhaul_proto::Reason;
use longhaul_session::{
    Acceptor, BoxFuture, OpenRefused, Session, SessionConfig, SessionError, SessionHandle,
};
use rand::Rng;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
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
    /// Dial again when the carrier drops: resume the session, or start a
    /// fresh one when the server no longer has it. Off in JMUX mode and
    /// for `cmd://` (see [`ClientConfig::reconnects`]).
    pub reconnect: bool,
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
            reconnect: true,
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

/// Dials the server and authenticates: a carrier ready for the hello.
async fn dial(config: &ClientConfig) -> anyhow::Result<longhaul_carrier::Carrier> {
    let url = &config.server;
    let mut carrier = connect(config).await?;
    if config.session.mode == longhaul_session::Mode::Native {
        let p = crate::auth::preamble(config.token.as_deref()).map_err(|e| anyhow!(e))?;
        carrier
            .writer
            .write_all(&p)
            .await
            .with_context(|| format!("cannot authenticate to {url}"))?;
    }
    Ok(carrier)
}

/// How long a new local connection waits for a session to exist.
const OPEN_WAIT: Duration = Duration::from_secs(30);

/// A new session with the server.
async fn establish(
    config: &ClientConfig,
    acceptor: Arc<ClientAcceptor>,
) -> anyhow::Result<SessionHandle> {
    let url = &config.server;
    let carrier = dial(config).await?;
    Session::start(carrier, config.session.clone(), acceptor)
        .await
        .with_context(|| {
            format!("session with {url} failed (a server that closes at once did not accept our key or token)")
        })
}

/// Waits between reconnection attempts. The first comes at once (a reset
/// carrier is usually back on the next dial); then every ≈ 100 ms for the
/// first few seconds, so that a short outage costs little more than itself;
/// then doubling up to a cap. ±25 % jitter, so that many clients cut off at
/// once do not all come back in the same instant.
struct Backoff {
    started: Instant,
    attempts: u32,
    slow: Duration,
}

/// Retries this often during the first [`RECONNECT_FAST_FOR`].
const RECONNECT_FAST: Duration = Duration::from_millis(100);
const RECONNECT_FAST_FOR: Duration = Duration::from_secs(5);
/// Longest wait between attempts.
pub const RECONNECT_MAX: Duration = Duration::from_secs(10);

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            started: Instant::now(),
            attempts: 0,
            slow: RECONNECT_FAST * 2,
        }
    }

    /// A failed attempt: logged at the 1st, 2nd, 4th, 8th… (the rest at
    /// debug level), so a long outage does not flood the log.
    fn log(&self, what: &str) {
        if self.attempts.is_power_of_two() {
            tracing::warn!(attempt = self.attempts, "{what}");
        } else {
            tracing::debug!(attempt = self.attempts, "{what}");
        }
    }

    fn next(&mut self) -> Duration {
        self.attempts += 1;
        let d = if self.attempts == 1 {
            return Duration::ZERO;
        } else if self.started.elapsed() < RECONNECT_FAST_FOR {
            RECONNECT_FAST
        } else {
            let d = self.slow;
            self.slow = (self.slow * 2).min(RECONNECT_MAX);
            d
        };
        d.mul_f64(rand::thread_rng().gen_range(0.75..1.25))
    }
}

/// Keeps the client's session alive: resumes it on a new carrier when the
/// old one drops, and starts a fresh one when the server refuses the
/// resume or ends the session.
async fn supervise(
    config: Arc<ClientConfig>,
    acceptor: Arc<ClientAcceptor>,
    current: watch::Sender<SessionHandle>,
    ended: watch::Sender<Option<String>>,
    mut stop: watch::Receiver<bool>,
    remote_ports: Vec<u16>,
    demand: Arc<tokio::sync::Notify>,
) {
    let url = &config.server;
    loop {
        let session = current.borrow().clone();
        if !config.reconnects() {
            let why = tokio::select! {
                why = session.closed() => why,
                _ = stop.wait_for(|s| *s) => "client stopped".into(),
            };
            ended.send_replace(Some(why));
            return;
        }
        let detached = tokio::select! {
            d = session.detached() => d,
            _ = stop.wait_for(|s| *s) => false,
        };
        if *stop.borrow() {
            // `Client::stop` closed the session: not a loss to repair.
            ended.send_replace(Some("client stopped".into()));
            return;
        }
        let mut backoff = Backoff::new();
        if detached {
            let lost = Instant::now();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next()) => {}
                    _ = stop.wait_for(|s| *s) => {
                        session.close("client stopped");
                        ended.send_replace(Some("client stopped".into()));
                        return;
                    }
                }
                if session.is_closed() {
                    break;
                }
                if lost.elapsed() > config.session.resume_timeout {
                    // The server has given the session up by now too.
                    tracing::warn!(
                        "no carrier to {url} for {:?} (--resume-timeout): the session's streams are reset, starting a new session",
                        lost.elapsed()
                    );
                    session.close("not resumed within the resume timeout");
                    break;
                }
                let attempt = async {
                    let carrier = dial(&config).await?;
                    session.resume(carrier).await.map_err(anyhow::Error::from)
                };
                // A dial into a black hole must not hold up the next one.
                let limit = config.session.handshake_timeout;
                let attempt = async {
                    tokio::time::timeout(limit, attempt)
                        .await
                        .unwrap_or_else(|_| Err(anyhow!("no answer within {limit:?}")))
                };
                match attempt.await {
                    Ok(replayed) => {
                        tracing::info!(
                            outage = ?lost.elapsed(),
                            replayed,
                            "carrier to {url} back: session resumed, no stream lost"
                        );
                        break;
                    }
                    Err(e) => match e.downcast_ref::<SessionError>() {
                        Some(SessionError::NoResume) => {
                            tracing::warn!(
                                "{url} no longer offers session resume: the session's streams are reset, starting a new session"
                            );
                            session.close("the server no longer offers resume");
                            break;
                        }
                        Some(SessionError::ResumeRefused(r)) => {
                            tracing::warn!(
                                "{url} refused to resume the session ({}): its streams are reset, starting a new session",
                                r.as_str()
                            );
                            session.close(&format!("resume refused: {}", r.as_str()));
                            break;
                        }
                        Some(SessionError::Closed(why)) => {
                            session.close(why);
                            break;
                        }
                        _ => backoff.log(&format!("reconnecting to {url}: {e:#}")),
                    },
                }
            }
            if !session.is_closed() {
                continue;
            }
        } else if session.ended_by_peer() && config.remote.is_empty() {
            // Closed on purpose (the server's idle timeout, or its
            // shutdown): nothing needs a session until a local connection
            // comes, and no -R waits for the server's side.
            let why = session.close_reason().unwrap_or_default();
            tracing::info!(
                "{url} ended the session ({why}); a new one starts with the next connection"
            );
            tokio::select! {
                _ = demand.notified() => {}
                _ = stop.wait_for(|s| *s) => {
                    ended.send_replace(Some("client stopped".into()));
                    return;
                }
            }
        } else {
            let why = session.close_reason().unwrap_or_default();
            tracing::warn!("session with {url} ended ({why}); starting a new one");
        }
        // A fresh session: the old one's streams were reset.
        loop {
            tokio::select! {
                _ = tokio::time::sleep(backoff.next()) => {}
                _ = stop.wait_for(|s| *s) => {
                    ended.send_replace(Some("client stopped".into()));
                    return;
                }
            }
            match establish(&config, acceptor.clone()).await {
                Ok(s) => {
                    tracing::info!("new session with {url}");
                    rebind(&config, &s, &remote_ports).await;
                    current.send_replace(s);
                    break;
                }
                Err(e) => backoff.log(&format!("reconnecting to {url}: {e:#}")),
            }
        }
    }
}

/// Asks a fresh session for the reverse forwards again, on the ports the
/// first session got.
async fn rebind(config: &ClientConfig, session: &SessionHandle, ports: &[u16]) {
    for (r, &port) in config.remote.iter().zip(ports) {
        let dest = format_dest(&r.host, r.host_port);
        let bind = match r.bind_addr().rsplit_once(':') {
            Some((host, _)) => format!("{host}:{port}"),
            None => port.to_string(),
        };
        match session.bind(&bind, &dest).await {
            Ok(p) => tracing::info!("-R {}:{p} -> {}:{} open again", r.bind, r.host, r.host_port),
            Err(e) => tracing::error!("server refused -R {bind} on the new session: {e}"),
        }
    }
}

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
        let session = establish(&config, acceptor.clone()).await?;

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
        let (current_tx, current) = watch::channel(session);
        let (ended_tx, ended) = watch::channel(None);
        let (stop, stop_rx) = watch::channel(false);
        let demand = Arc::new(tokio::sync::Notify::new());
        for (lst, kind) in listeners {
            tokio::spawn(accept_loop(
                lst,
                kind,
                current.clone(),
                ended.clone(),
                demand.clone(),
            ));
        }
        tokio::spawn(supervise(
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
}
