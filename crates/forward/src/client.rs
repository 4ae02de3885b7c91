//! `longhaul client`: one session, many listeners.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Context};
use longhaul_carrier::{bind_listener, Carrier};
use longhaul_proto::frame::{format_dest, parse_dest};
use longhaul_proto::Reason;
use longhaul_session::{Acceptor, BoxFuture, OpenRefused, Session, SessionConfig, SessionHandle};
use tokio::net::{TcpListener, TcpStream};

use crate::connect::connect_host;
use crate::spec::{listen_addr, ForwardSpec};

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` of the server's carrier listener.
    pub server: String,
    pub local: Vec<ForwardSpec>,
    pub remote: Vec<ForwardSpec>,
    pub socks: Vec<SocketAddr>,
    pub http: Vec<SocketAddr>,
    pub session: SessionConfig,
    /// Congestion control for the carrier (None: the system default).
    pub congestion: Option<String>,
}

impl ClientConfig {
    pub fn new(server: impl Into<String>) -> ClientConfig {
        ClientConfig {
            server: server.into(),
            local: vec![],
            remote: vec![],
            socks: vec![],
            http: vec![],
            session: SessionConfig::default(),
            congestion: None,
        }
    }
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
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = session.closed() => return,
        };
        let (sock, from) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
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
        let carrier = Carrier::connect_tcp(&config.server, config.congestion.as_deref())
            .await
            .with_context(|| format!("cannot connect to server {}", config.server))?;
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
            .with_context(|| format!("session with {} failed", config.server))?;

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
