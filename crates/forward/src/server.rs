//! `longhaul server`: accepts carriers, connects allowed targets, opens
//! allowed reverse listeners.

use std::net::SocketAddr;
use std::sync::Arc;

use longhaul_carrier::{bind_listener, Carrier};
use longhaul_proto::Reason;
use longhaul_session::{Acceptor, BoxFuture, OpenRefused, Session, SessionConfig, SessionHandle};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::connect::{allowed_addrs, connect_any, target};
use crate::rules::{BindRules, Rules};
use crate::spec::loopback;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub rules: Rules,
    pub bind_rules: BindRules,
    pub session: SessionConfig,
    /// Carriers served at once; more are closed at accept. Default 1024.
    pub max_sessions: usize,
    /// Congestion control for carriers (None: the system default).
    pub congestion: Option<String>,
}

impl ServerConfig {
    pub fn new(listen: SocketAddr) -> ServerConfig {
        ServerConfig {
            listen,
            rules: Rules::default(),
            bind_rules: BindRules::default(),
            session: SessionConfig::default(),
            max_sessions: 1024,
            congestion: None,
        }
    }
}

pub struct Server {
    listener: TcpListener,
    config: ServerConfig,
}

struct ServerAcceptor {
    rules: Rules,
    bind_rules: BindRules,
    peer: String,
}

impl Acceptor for ServerAcceptor {
    fn connect(&self, dest: String) -> BoxFuture<Result<TcpStream, OpenRefused>> {
        let rules = self.rules.clone();
        let peer = self.peer.clone();
        Box::pin(async move {
            let (host, port) = target(&dest)?;
            let addrs = match allowed_addrs(&rules, &host, port).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(%peer, %dest, "refused: {e}");
                    return Err(e);
                }
            };
            connect_any(&addrs).await
        })
    }

    fn bind(
        &self,
        bind: String,
        dest: String,
        session: SessionHandle,
    ) -> BoxFuture<Result<u16, OpenRefused>> {
        let bind_rules = self.bind_rules.clone();
        let peer = self.peer.clone();
        Box::pin(async move {
            let addr: SocketAddr = match bind.parse() {
                Ok(a) => a,
                Err(_) => {
                    // "PORT" alone or "localhost:PORT" mean loopback.
                    let port = bind
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.parse().ok())
                        .ok_or_else(|| {
                            OpenRefused::new(
                                Reason::ADDRESS_TYPE_NOT_SUPPORTED,
                                format!("bad bind address '{bind}'"),
                            )
                        })?;
                    SocketAddr::new(loopback(), port)
                }
            };
            if !bind_rules.allows(addr.ip(), addr.port()) {
                tracing::warn!(%peer, %bind, "refused reverse bind: not allowed (see --allow-bind)");
                return Err(OpenRefused::new(
                    Reason::NOT_ALLOWED,
                    format!("binding {addr} is not allowed"),
                ));
            }
            let listener = bind_listener(addr).map_err(|e| {
                OpenRefused::new(
                    Reason::GENERAL_FAILURE,
                    format!("cannot listen on {addr}: {e}"),
                )
            })?;
            let port = listener
                .local_addr()
                .map(|a| a.port())
                .unwrap_or(addr.port());
            tracing::info!(%peer, listen = %addr, %dest, "reverse forward open");
            tokio::spawn(reverse_accept_loop(listener, dest, session));
            Ok(port)
        })
    }
}

/// Accepts on a reverse-forward listener until the session ends.
async fn reverse_accept_loop(listener: TcpListener, dest: String, session: SessionHandle) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = session.closed() => return,
        };
        let Ok((sock, from)) = accepted else { continue };
        let session = session.clone();
        let dest = dest.clone();
        tokio::spawn(async move {
            match session.open(&dest).await {
                Ok(opened) => opened.attach(sock),
                Err(e) => tracing::info!(%from, %dest, "reverse stream failed: {e}"),
            }
        });
    }
}

impl Server {
    pub async fn bind(config: ServerConfig) -> std::io::Result<Server> {
        if let Some(cc) = &config.congestion {
            longhaul_carrier::check_congestion(cc)?;
        }
        let listener = bind_listener(config.listen)?;
        Ok(Server { listener, config })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves carriers until the task is dropped.
    pub async fn run(self) {
        let slots = Arc::new(Semaphore::new(self.config.max_sessions));
        let config = Arc::new(self.config);
        loop {
            let (sock, from) = match self.listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                tracing::warn!(%from, limit = config.max_sessions, "refusing carrier: session limit reached");
                continue;
            };
            let config = config.clone();
            tokio::spawn(async move {
                let _permit = permit;
                if let Some(cc) = &config.congestion {
                    if let Err(e) = longhaul_carrier::set_congestion(&sock, cc) {
                        return tracing::warn!(%from, "{e}");
                    }
                }
                let carrier = match Carrier::from_tcp(sock) {
                    Ok(c) => c,
                    Err(e) => return tracing::info!(%from, "carrier setup failed: {e}"),
                };
                let acceptor = Arc::new(ServerAcceptor {
                    rules: config.rules.clone(),
                    bind_rules: config.bind_rules.clone(),
                    peer: from.to_string(),
                });
                match Session::start(carrier, config.session.clone(), acceptor).await {
                    Ok(h) => {
                        tracing::info!(%from, "session started");
                        let why = h.closed().await;
                        tracing::info!(%from, "session ended: {why}");
                    }
                    Err(e) => tracing::warn!(%from, "session refused: {e}"),
                }
            });
        }
    }
}
