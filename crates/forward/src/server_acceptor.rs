//! What a server's session may do for its peer: connect a target or a
//! service of this process (files, doctor), or listen for a reverse
//! forward — under the policy in force at that moment.

use std::net::SocketAddr;
use std::sync::Arc;

use longhaul_carrier::{accept_with_backoff, bind_listener};
use longhaul_files::serve::FileServer;
use longhaul_proto::Reason;
use longhaul_session::logs::{escaped, shown, Refusals};
use longhaul_session::{Acceptor, BoxFuture, LocalStream, OpenRefused, SessionHandle};
use tokio::net::TcpListener;

use crate::auth::Authenticated;
use crate::connect::{allowed_addrs, connect_any, connect_udp, target};
use crate::flow_ports::FlowPorts;
use crate::metrics::{Metrics, Refusal};
use crate::policy::{Grants, Policy, PolicyCell, Who};
use crate::rules::Transport;
use crate::server_config::{Ends, ServerConfig};
use crate::spec::loopback;

pub(crate) struct ServerAcceptor {
    /// Read at every stream: a reload applies to running sessions too.
    policy: PolicyCell,
    pub(crate) who: Who,
    files: Option<Arc<FileServer>>,
    metrics: Arc<Metrics>,
    /// The server's UDP flows, and this client's name among them.
    flows: (Arc<FlowPorts>, String),
    peer: String,
    /// The first carrier's TCP ends, if it had any.
    ends: Option<Ends>,
    /// This session's refusals, throttled in the log (the file service's
    /// too).
    refusals: Arc<Refusals>,
}

impl ServerAcceptor {
    pub(crate) fn new(
        config: &ServerConfig,
        policy: &PolicyCell,
        who: &Authenticated,
        peer: String,
        ends: Option<Ends>,
    ) -> ServerAcceptor {
        ServerAcceptor {
            policy: policy.clone(),
            who: who.into(),
            files: config.files.clone(),
            metrics: config.metrics.clone(),
            flows: (config.flows.clone(), flow_client(who)),
            refusals: Arc::new(Refusals::new(peer.clone())),
            peer,
            ends,
        }
    }

    /// The global rules and this client's grants now (None: no longer let in).
    fn now(&self) -> Result<(Arc<Policy>, Grants), OpenRefused> {
        let p = self.policy.current();
        match p.grants(&self.who) {
            Some(g) => Ok((p, g)),
            None => Err(OpenRefused::new(
                Reason::NOT_ALLOWED,
                "no longer authorized",
            )),
        }
    }
}

/// Whose share of the server's UDP flows a session's flows take.
fn flow_client(who: &Authenticated) -> String {
    match who {
        Authenticated::Key(fp, _) => format!("key {fp}"),
        Authenticated::Token => "token".into(),
        Authenticated::Anonymous => "anonymous".into(),
    }
}

/// The global rules and `who`'s grants in the policy in force now.
fn cell_now(cell: &PolicyCell, who: &Who) -> Option<(Arc<Policy>, Grants)> {
    let p = cell.current();
    let g = p.grants(who)?;
    Some((p, g))
}

impl Acceptor for ServerAcceptor {
    fn connect(&self, dest: String) -> BoxFuture<Result<LocalStream, OpenRefused>> {
        let peer = self.peer.clone();
        let metrics = self.metrics.clone();
        let (policy, grants) = match self.now() {
            Ok(x) => x,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let rules = policy.rules.clone();
        let key_rules = grants.allow;
        let (cell, who) = (self.policy.clone(), self.who.clone());
        let checked_under = policy.clone();
        if dest == crate::doctor::SERVICE {
            let r = crate::doctor::accept(self.ends)
                .map_err(|e| OpenRefused::new(Reason::GENERAL_FAILURE, e));
            return Box::pin(async move { r });
        }
        if dest == longhaul_files::SERVICE {
            let r = match self.files.clone().zip(grants.files) {
                Some((server, access)) => server
                    .accept(access, self.refusals.clone())
                    .map_err(|e| OpenRefused::new(Reason::GENERAL_FAILURE, e)),
                None => {
                    self.metrics.refused(Refusal::FilesNotAllowed);
                    if self.refusals.admit() {
                        tracing::warn!(%peer, "refused the file service: no --files folder, or no files= access for this client");
                    }
                    Err(OpenRefused::new(
                        Reason::NOT_ALLOWED,
                        "no file access for this client: the server needs --files DIR, and files=ro or files=rw for this key in its authorized_keys (or --files-for-token)",
                    ))
                }
            };
            return Box::pin(async move { r });
        }
        let refusals = self.refusals.clone();
        let (ports, client) = self.flows.clone();
        Box::pin(async move {
            let allowed = async {
                let (t, host, port) = target(&dest)?;
                let mut sets = vec![&rules];
                sets.extend(key_rules.as_ref());
                let addrs = allowed_addrs(&sets, t, &host, port).await?;
                Ok::<_, OpenRefused>((addrs, t, host, port))
            };
            let (addrs, t, host, port) = match allowed.await {
                Ok(a) => a,
                Err(e) => {
                    if e.reason == Reason::NOT_ALLOWED {
                        metrics.refused(Refusal::TargetNotAllowed);
                    }
                    if refusals.admit() {
                        let (dest, why) = (shown(&dest), escaped(&e));
                        tracing::warn!(%peer, %dest, "refused: {why}");
                    }
                    return Err(e);
                }
            };
            let sock: LocalStream = match t {
                Transport::Tcp => connect_any(&addrs).await?.into(),
                Transport::Udp => {
                    // A port of the host's for as long as the flow lives.
                    let lease = ports.lease(&client).map_err(|why| {
                        metrics.refused(Refusal::FlowLimit);
                        OpenRefused::new(Reason::GENERAL_FAILURE, why)
                    })?;
                    let sock = LocalStream::Udp(connect_udp(&addrs).await?);
                    LocalStream::Leased(Box::new(sock), Box::new(lease))
                }
            };
            // A reload during the connect (up to its timeout) must not let
            // through what it now refuses: if the policy changed, its rules
            // once more.
            if Arc::ptr_eq(&cell.current(), &checked_under) {
                return Ok(sock);
            }
            let Some((policy, grants)) = cell_now(&cell, &who) else {
                return Err(OpenRefused::new(
                    Reason::NOT_ALLOWED,
                    "no longer authorized",
                ));
            };
            let mut sets = vec![&policy.rules];
            sets.extend(grants.allow.as_ref());
            if allowed_addrs(&sets, t, &host, port).await.is_err() {
                let dest = shown(&dest);
                tracing::warn!(%peer, %dest, "refused: the rules changed while connecting");
                return Err(OpenRefused::new(Reason::NOT_ALLOWED, "no longer allowed"));
            }
            Ok(sock)
        })
    }

    fn bind(
        &self,
        bind: String,
        dest: String,
        session: SessionHandle,
    ) -> BoxFuture<Result<u16, OpenRefused>> {
        let (policy, grants) = match self.now() {
            Ok(x) => x,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        drop(grants);
        let cell = self.policy.clone();
        let who = self.who.clone();
        let peer = self.peer.clone();
        let metrics = self.metrics.clone();
        let refusals = self.refusals.clone();
        Box::pin(async move {
            if session.is_draining() {
                // Its listener would close at once: the client binds again
                // on its next session, on another server.
                return Err(OpenRefused::new(
                    Reason::GENERAL_FAILURE,
                    "the server is draining: bind on a new session",
                ));
            }
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
            let transport = match target(&dest) {
                Ok((t, ..)) => t,
                Err(_) => Transport::Tcp,
            };
            if !policy.allows_bind(&who, transport, addr) {
                metrics.refused(Refusal::BindNotAllowed);
                if refusals.admit() {
                    let bind = shown(&bind);
                    tracing::warn!(%peer, %bind, "refused reverse bind: not allowed (see --allow-bind)");
                }
                return Err(OpenRefused::new(
                    Reason::NOT_ALLOWED,
                    format!(
                        "binding {}{addr} is not allowed: the server needs --allow-bind {}{} (or bind= for this key in its authorized_keys)",
                        if transport == Transport::Udp { "udp:" } else { "" },
                        if transport == Transport::Udp { "udp:" } else { "" },
                        if addr.ip().is_loopback() { addr.port().to_string() } else { addr.to_string() }
                    ),
                ));
            }
            let cannot = |e: std::io::Error| {
                OpenRefused::new(
                    Reason::GENERAL_FAILURE,
                    format!("cannot listen on {addr}: {e}"),
                )
            };
            let grant = BindGrant {
                policy: cell,
                who,
                transport,
                addr,
                peer: peer.clone(),
            };
            let port = if transport == Transport::Udp {
                let sock = crate::udp::bind(addr).map_err(cannot)?;
                let port = sock.local_addr().map_err(cannot)?.port();
                tokio::spawn(reverse_udp(sock, dest.clone(), session, grant));
                port
            } else {
                let listener = bind_listener(addr).map_err(cannot)?;
                let port = listener.local_addr().map_err(cannot)?.port();
                tokio::spawn(reverse_accept_loop(listener, dest.clone(), session, grant));
                port
            };
            tracing::info!(%peer, listen = %addr, dest = %shown(&dest), "reverse forward open");
            Ok(port)
        })
    }
}

/// A reverse listener's grant, checked again whenever the policy changes.
struct BindGrant {
    policy: PolicyCell,
    who: Who,
    transport: Transport,
    /// What was asked for (the port before any `0` was chosen).
    addr: SocketAddr,
    peer: String,
}

impl BindGrant {
    /// Resolves once a reload no longer allows the bind (never otherwise).
    async fn revoked(&self) -> String {
        let mut rx = self.policy.watch();
        loop {
            // The policy in force now first: a reload between the bind's
            // check and this watch is not missed.
            let p = rx.borrow_and_update().clone();
            if !p.allows_bind(&self.who, self.transport, self.addr) {
                return format!(
                    "the rules no longer allow its reverse bind on {}",
                    self.addr
                );
            }
            if rx.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

/// Serves a `-R udp:` listener until the session ends, or until a reload
/// no longer allows the bind (then the listener alone closes, as for TCP).
async fn reverse_udp(
    sock: tokio::net::UdpSocket,
    dest: String,
    session: SessionHandle,
    grant: BindGrant,
) {
    let current = session.clone();
    let stop = async move {
        tokio::select! {
            _ = session.closed() => {}
            // Draining: the client binds again on its next session.
            _ = session.drain_started() => {}
            // Only this listener ends; the session goes on.
            why = grant.revoked() => {
                tracing::warn!(peer = %grant.peer, "closing a reverse listener after the reload: {why}");
            }
        }
    };
    let session = move || (!current.is_closed()).then(|| current.clone());
    crate::udp::serve(sock, dest, session, stop).await;
}

/// Accepts on a reverse-forward listener until the session ends, or until
/// a reload no longer allows the bind: then the listener alone closes.
async fn reverse_accept_loop(
    listener: TcpListener,
    dest: String,
    session: SessionHandle,
    grant: BindGrant,
) {
    let what = format!("reverse forward to {}", shown(&dest));
    let revoked = grant.revoked();
    tokio::pin!(revoked);
    // The streams this listener opened: a revocation resets them too.
    let opened_here = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    loop {
        let (sock, from) = tokio::select! {
            a = accept_with_backoff(&listener, &what) => a,
            _ = session.closed() => return,
            // Draining: the client binds again on its next session (on
            // another server); connections accepted so far go on.
            _ = session.drain_started() => return,
            // Only this listener ends (its port is free at once); the
            // session and its other listeners go on.
            why = &mut revoked => {
                tracing::warn!(peer = %grant.peer, "closing a reverse listener and its connections after the reload: {why}");
                let ids = std::mem::take(&mut *opened_here.lock().unwrap_or_else(|p| p.into_inner()));
                for id in ids {
                    session.reset_stream(id);
                }
                return;
            }
        };
        let session = session.clone();
        let dest = dest.clone();
        let ids = opened_here.clone();
        tokio::spawn(async move {
            match session.open(&dest).await {
                Ok(opened) => {
                    {
                        let mut ids = ids.lock().unwrap_or_else(|p| p.into_inner());
                        // Bounded: ended streams are forgotten now and then.
                        if ids.len() >= 1024 {
                            let live: std::collections::HashSet<u32> =
                                session.streams().iter().map(|t| t.id).collect();
                            ids.retain(|id| live.contains(id));
                        }
                        ids.push(opened.id());
                    }
                    opened.attach(sock)
                }
                Err(e) => {
                    // The client answers each connection: a line each, throttled.
                    static FAILED: longhaul_session::logs::Throttle =
                        longhaul_session::logs::Throttle::new();
                    if FAILED.pass("failed reverse streams") {
                        let (dest, why) = (shown(&dest), escaped(&e));
                        tracing::info!(%from, %dest, "reverse stream failed: {why}")
                    }
                }
            }
        });
    }
}
