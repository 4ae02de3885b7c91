//! `longhaul client`: one session, many listeners.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::anyhow;
use longhaul_carrier::{accept_with_backoff, bind_listener};
use longhaul_proto::frame::Transport;
use longhaul_session::SessionHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::client_config::ClientAcceptor;
pub use crate::client_config::ClientConfig;
use crate::spec::listen_addr;

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

enum Kind {
    Local(String),
    Socks,
    Http,
}

/// A session new streams should not go on: closed, or its server draining.
fn unusable(s: &SessionHandle) -> bool {
    s.is_closed() || s.peer_drain().is_some()
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
        // replaced), or one whose server is draining: ask for a new one
        // and wait for it, as long as an OPEN would wait (then a draining
        // session still serves).
        let deadline = tokio::time::Instant::now() + OPEN_WAIT;
        while unusable(&current.borrow_and_update()) {
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
                            // not peer text: dest is the -L target the user gave
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
    bind_listener(addr).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                ": another program (or another longhaul client) listens there; pick another port"
            }
            std::io::ErrorKind::PermissionDenied => {
                ": ports under 1024 need root (or CAP_NET_BIND_SERVICE); pick a higher one"
            }
            _ => "",
        };
        anyhow!("cannot listen on {addr} for {what}: {e}{hint}")
    })
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

pub use crate::reconnect::GOODBYE_GRACE;

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
        let udp = config.local.iter().chain(&config.remote);
        if config.session.mode == longhaul_session::Mode::Jmux
            && udp.into_iter().any(|f| f.transport == Transport::Udp)
        {
            return Err(anyhow!(
                "UDP forwards need longhaul's native mode: drop --jmux, or forward TCP only"
            ));
        }
        let quic = config.servers().iter().any(|u| u.is_quic());
        if config.session.mode == longhaul_session::Mode::Jmux && quic {
            return Err(anyhow!(
                "JMUX peers speak over TCP, TLS or WebSocket, not QUIC: use tls:// or tcp:// with --jmux"
            ));
        }
        if let (true, Some(cc)) = (quic, &config.congestion) {
            longhaul_carrier::quic::check_congestion(cc)?;
        }
        let targets: HashSet<String> = config.remote.iter().map(|r| r.dest()).collect();
        let acceptor = Arc::new(ClientAcceptor {
            targets: Mutex::new(targets),
        });
        let (session, on) = match config.wait_for_server {
            true => crate::reconnect::establish_patiently(&config, acceptor.clone()).await?,
            false => crate::reconnect::establish(&config, acceptor.clone()).await?,
        };
        // Its resumes and lanes go where it is; new sessions try the
        // configured server first again.
        config.home.get_or_insert_with(|| config.server.clone());
        config.server = on;
        match Client::serve(config, acceptor, session.clone()).await {
            Ok(c) => Ok(c),
            Err(e) => {
                // A process that gives up now can never resume: the server
                // forgets the session (and frees its -R ports) at once.
                let why = format!("client did not start: {e:#}");
                session.shutdown(&why, GOODBYE_GRACE).await;
                Err(e)
            }
        }
    }

    /// Opens every listener and asks for every reverse forward on the new
    /// `session`, then keeps it alive.
    async fn serve(
        config: ClientConfig,
        acceptor: Arc<ClientAcceptor>,
        session: SessionHandle,
    ) -> anyhow::Result<Client> {
        let mut listeners = vec![];
        let mut udp_listeners = vec![];
        let mut local_addrs = vec![];
        for l in &config.local {
            let addr = listen_addr(&l.bind, l.port).map_err(|e| anyhow!("-L: {e}"))?;
            let what = format!("-L {}", l.spelled());
            if l.transport == Transport::Udp {
                let sock = crate::udp::bind(addr)
                    .map_err(|e| anyhow!("cannot listen on {addr} for {what}: {e}"))?;
                local_addrs.push(sock.local_addr()?);
                udp_listeners.push((sock, l.dest()));
                continue;
            }
            let lst = listen(addr, &what)?;
            local_addrs.push(lst.local_addr()?);
            listeners.push((lst, Kind::Local(l.dest())));
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
            let port = session.bind(&r.bind_addr(), &r.dest()).await.map_err(|e| {
                let e = longhaul_session::logs::escaped(&e);
                anyhow!("server refused -R {}{}: {e}", r.prefix(), r.bind_addr())
            })?;
            let (p, b, h, hp) = (r.prefix(), &r.bind, &r.host, r.host_port);
            tracing::info!("-R {p}{b}:{port} -> {h}:{hp} open");
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
        for (sock, dest) in udp_listeners {
            let current = current.clone();
            let demand = demand.clone();
            let session = move || {
                let s = current.borrow().clone();
                if s.is_closed() {
                    // Ask for a new session; this datagram is lost.
                    demand.notify_one();
                    return None;
                }
                if s.peer_drain().is_some() {
                    // Its server is draining: a new flow asks for a new
                    // session, and goes on the old one meanwhile.
                    demand.notify_one();
                }
                Some(s)
            };
            let mut ended = ended.clone();
            let stop = async move {
                let _ = ended.wait_for(|e| e.is_some()).await;
            };
            tokio::spawn(crate::udp::serve(sock, dest, session, stop));
        }
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
    /// written and the server forgets the session (within `grace`), so its
    /// `-R` ports are free again at once.
    pub async fn shutdown(&self, why: &str, grace: Duration) {
        // The supervisor first, so that it dials nothing more (it leaves
        // the session to us); then the GOODBYE.
        self.stop.send_replace(true);
        self.session().shutdown(why, grace).await;
    }
}
