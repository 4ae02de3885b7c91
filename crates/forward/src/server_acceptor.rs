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
use crate::connect::{allowed_addrs, connect_any, target};
use crate::metrics::{Metrics, Refusal};
use crate::policy::{Grants, Policy, PolicyCell, Who};
use crate::server::{Ends, ServerConfig};
use crate::spec::loopback;

pub(crate) struct ServerAcceptor {
    /// Read at every stream: a reload applies to running sessions too.
    policy: PolicyCell,
    pub(crate) who: Who,
    files: Option<Arc<FileServer>>,
    metrics: Arc<Metrics>,
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
                        "no file access for this client",
                    ))
                }
            };
            return Box::pin(async move { r });
        }
        let refusals = self.refusals.clone();
        Box::pin(async move {
            let allowed = async {
                let (host, port) = target(&dest)?;
                let mut sets = vec![&rules];
                sets.extend(key_rules.as_ref());
                allowed_addrs(&sets, &host, port).await
            };
            let addrs = match allowed.await {
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
            connect_any(&addrs).await.map(Into::into)
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
        let bind_rules = policy.bind_rules.clone();
        let key_bind_rules = grants.bind;
        let peer = self.peer.clone();
        let metrics = self.metrics.clone();
        let refusals = self.refusals.clone();
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
            let key_ok = key_bind_rules
                .as_ref()
                .is_none_or(|r| r.allows(addr.ip(), addr.port()));
            if !key_ok || !bind_rules.allows(addr.ip(), addr.port()) {
                metrics.refused(Refusal::BindNotAllowed);
                if refusals.admit() {
                    let bind = shown(&bind);
                    tracing::warn!(%peer, %bind, "refused reverse bind: not allowed (see --allow-bind)");
                }
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
            tracing::info!(%peer, listen = %addr, dest = %shown(&dest), "reverse forward open");
            tokio::spawn(reverse_accept_loop(listener, dest, session));
            Ok(port)
        })
    }
}

/// Accepts on a reverse-forward listener until the session ends.
async fn reverse_accept_loop(listener: TcpListener, dest: String, session: SessionHandle) {
    let what = format!("reverse forward to {}", shown(&dest));
    loop {
        let (sock, from) = tokio::select! {
            a = accept_with_backoff(&listener, &what) => a,
            _ = session.closed() => return,
        };
        let session = session.clone();
        let dest = dest.clone();
        tokio::spawn(async move {
            match session.open(&dest).await {
                Ok(opened) => opened.attach(sock),
                Err(e) => {
                    let (dest, why) = (shown(&dest), escaped(&e));
                    tracing::info!(%from, %dest, "reverse stream failed: {why}")
                }
            }
        });
    }
}
