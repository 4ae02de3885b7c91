//! `longhaul server`: accepts carriers, connects allowed targets, opens
//! allowed reverse listeners.

use std::net::SocketAddr;
use std::sync::Arc;

use longhaul_carrier::folder::{Admission, FolderListener, FolderUrl};
use longhaul_carrier::{accept_with_backoff, bind_listener, Carrier, ListenUrl, Transport};
use longhaul_session::Resumables;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use crate::drain::SHUTDOWN_GRACE;
use crate::metrics::Refusal;
use crate::pending::Pending;
use crate::policy::{Policy, PolicyCell};
use crate::server_config::Ends;
pub use crate::server_config::{host_instance, ServerConfig};
use crate::server_session::{admit, authenticate, run_admitted, serve_carrier, Admitted, Listed};
use crate::sessions::{Live, Slots};

pub struct Server {
    listeners: Vec<(TcpListener, ListenUrl)>,
    quic: Vec<(longhaul_carrier::quic::QuicListener, ListenUrl)>,
    folders: Vec<FolderListener>,
    /// `--max-sessions`; folder listeners take theirs before they start
    /// anything for a carrier.
    slots: Arc<Semaphore>,
    tls: Option<Arc<rustls::ServerConfig>>,
    config: ServerConfig,
    policy: PolicyCell,
    live: Live,
}

/// Puts a new policy in force in a running server (SIGHUP).
#[derive(Clone)]
pub struct Reloader {
    policy: PolicyCell,
    live: Live,
}

impl Reloader {
    /// Replaces the policy. Surgical: a session whose identity it no
    /// longer admits (or whose file access it narrows, holding a file
    /// stream) ends; otherwise only the streams it no longer allows are
    /// reset, each with a log line, and the rest of the session goes on.
    /// Returns how many sessions were ended.
    pub fn reload(&self, new: Policy) -> usize {
        let old = self.policy.replace(new);
        let now = self.policy.current();
        let mut ended = 0;
        for (h, who) in self.live.all() {
            let streams: Vec<_> = h.streams().into_iter().filter(|t| !t.opened_here).collect();
            let files = streams.iter().any(|t| t.dest == longhaul_files::SERVICE);
            if let Some(why) = now.ends(&old, &who, files) {
                tracing::warn!(peer = %h.peer(), "closing the session after the reload: {why}");
                h.close(&format!("closed by the server's reload: {why}"));
                ended += 1;
                continue;
            }
            for t in streams.iter().filter(|t| t.dest != longhaul_files::SERVICE) {
                let connected = t
                    .local
                    .as_deref()
                    .and_then(|a| a.parse::<SocketAddr>().ok())
                    .map(|a| a.ip());
                if now.refuses(&who, &t.dest, connected) {
                    let dest = longhaul_session::logs::shown(&t.dest);
                    tracing::warn!(peer = %h.peer(), %dest, "resetting a stream after the reload: the rules no longer allow its stream to {dest}");
                    h.reset_stream(t.id);
                }
            }
        }
        ended
    }
}

impl Server {
    pub async fn bind(config: ServerConfig) -> std::io::Result<Server> {
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        config.check().map_err(invalid)?;
        if let Some(cc) = &config.congestion {
            // Each kind of listener its own names: QUIC's are quinn's.
            let quic = |l: &ListenUrl| l.transport == Transport::Quic;
            if !config.listen.iter().all(quic) {
                longhaul_carrier::check_congestion(cc)?;
            }
            if config.listen.iter().any(quic) {
                longhaul_carrier::quic::check_congestion(cc)?;
            }
        }
        let tls = match &config.identity {
            Some(id) => Some(
                longhaul_carrier::tls::server_config(id)
                    .map_err(|e| invalid(format!("TLS setup failed: {e}")))?,
            ),
            None => None,
        };
        let mut listeners = vec![];
        let mut quic = vec![];
        let cannot = |l: &ListenUrl, e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("cannot listen on {l}: {e}"))
        };
        for l in &config.listen {
            if l.transport == Transport::Quic {
                let tls = tls
                    .clone()
                    .ok_or_else(|| invalid(format!("{l} needs --key")))?;
                let cc = config.congestion.as_deref();
                let lst = longhaul_carrier::quic::QuicListener::bind(l.addr, tls, cc)
                    .map_err(|e| cannot(l, e))?;
                quic.push((lst, l.clone()));
                continue;
            }
            let lst = bind_listener(l.addr).map_err(|e| cannot(l, e))?;
            listeners.push((lst, l.clone()));
        }
        let slots = Arc::new(Semaphore::new(config.max_sessions));
        let folders = config
            .folders
            .iter()
            .map(|f| FolderListener::bind_with_slots(f, Some(slots.clone())))
            .collect::<std::io::Result<Vec<_>>>()?;
        let policy = PolicyCell::new(Policy {
            auth: config.auth.clone(),
            rules: config.rules.clone(),
            bind_rules: config.bind_rules.clone(),
            files_without_key: config.files_without_key,
        });
        Ok(Server {
            listeners,
            quic,
            folders,
            slots,
            tls,
            config,
            policy,
            live: Live::default(),
        })
    }

    /// The first listener's address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match (self.listeners.first(), self.quic.first()) {
            (Some((l, _)), _) => l.local_addr(),
            (None, Some((q, _))) => q.local_addr(),
            (None, None) => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    /// Every listener with its bound address (port 0 resolved).
    pub fn listening(&self) -> Vec<ListenUrl> {
        self.listeners
            .iter()
            .map(|(l, u)| ListenUrl {
                transport: u.transport.clone(),
                addr: l.local_addr().unwrap_or(u.addr),
            })
            .chain(self.quic.iter().map(|(q, u)| ListenUrl {
                transport: u.transport.clone(),
                addr: q.local_addr().unwrap_or(u.addr),
            }))
            .collect()
    }

    /// The folders served.
    pub fn folders(&self) -> Vec<FolderUrl> {
        self.folders.iter().map(|f| f.url().clone()).collect()
    }

    /// A handle to reload the policy while the server runs.
    pub fn reloader(&self) -> Reloader {
        Reloader {
            policy: self.policy.clone(),
            live: self.live.clone(),
        }
    }

    /// Serves carriers until the task is dropped.
    pub async fn run(self) {
        self.run_until(std::future::pending()).await
    }

    /// Serves carriers until `stop` completes, then stops (see
    /// [`Server::run_draining`]; no second signal).
    pub async fn run_until(self, stop: impl std::future::Future<Output = ()>) {
        self.run_draining(stop, std::future::pending()).await
    }

    /// Serves carriers until `stop` completes, then stops accepting and
    /// drains: each session is told to open its next streams through a new
    /// session (elsewhere, behind a load balancer) and ends once it has no
    /// stream open; at [`ServerConfig::drain_timeout`], or when `hurry`
    /// completes, the sessions left are closed (CLOSE for every stream,
    /// the carrier ended within [`SHUTDOWN_GRACE`]). See `drain`.
    pub async fn run_draining(
        self,
        stop: impl std::future::Future<Output = ()>,
        hurry: impl std::future::Future<Output = ()>,
    ) {
        let live = self.live.clone();
        let serving = Serving {
            slots: self.slots,
            pending: Pending::new(self.config.max_pending, self.config.max_pending_per_source),
            config: Arc::new(self.config),
            policy: self.policy.clone(),
            live: live.clone(),
            resumables: Resumables::new(),
        };
        let mut tasks = tokio::task::JoinSet::new();
        for folder in self.folders {
            // Off only where the listener says ?tls=off (checked: with --insecure).
            let tls = match folder.url().tls {
                true => self.tls.clone(),
                false => None,
            };
            tasks.spawn(folder_accept_loop(folder, tls, serving.clone()));
        }
        for (listener, url) in self.listeners {
            let use_tls = serving.config.uses_tls(&url.transport);
            let tls = if use_tls { self.tls.clone() } else { None };
            tasks.spawn(accept_loop(listener, url, tls, serving.clone()));
        }
        for (listener, url) in self.quic {
            tasks.spawn(quic_accept_loop(listener, url, serving.clone()));
        }
        tokio::select! {
            _ = async { while tasks.join_next().await.is_some() {} } => return,
            _ = stop => {}
        }
        // Listeners close with their tasks: nothing new gets in.
        tasks.shutdown().await;
        crate::drain::stop_sessions(live, serving.config.drain_timeout, hurry).await;
    }

    /// Serves one session on this process's stdin/stdout (`--stdio`). The
    /// pipe's owner (an ssh login, a parent process) has authenticated the
    /// peer, so keys and tokens are not asked for.
    pub async fn serve_stdio(config: ServerConfig) -> Result<String, String> {
        let carrier = longhaul_carrier::stdio();
        // A pipe cannot be dialled again: no resume.
        let mut config = config;
        config.session.resume = false;
        let resumables = Resumables::new();
        let policy = PolicyCell::new(Policy {
            auth: config.auth.clone(),
            rules: config.rules.clone(),
            bind_rules: config.bind_rules.clone(),
            files_without_key: config.files_without_key,
        });
        serve_carrier(
            carrier,
            None,
            "stdio".into(),
            Arc::new(config),
            &policy,
            None,
            &resumables,
        )
        .await
    }
}

/// What every accept loop shares: the configuration, the session slots,
/// the live sessions and the resumable ones.
#[derive(Clone)]
pub(crate) struct Serving {
    config: Arc<ServerConfig>,
    policy: PolicyCell,
    slots: Arc<Semaphore>,
    pending: Arc<Pending>,
    live: Live,
    resumables: Arc<Resumables>,
}

impl Serving {
    /// A slot under `--max-sessions` for a new carrier, or a log line.
    pub(crate) fn slot(
        &self,
        from: &dyn std::fmt::Display,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        Slots {
            sem: self.slots.clone(),
            config: self.config.clone(),
        }
        .take(from)
    }

    /// Runs a carrier's own handshake (TLS, WebSocket upgrade), its
    /// authentication, the hello and the attach exchange under one
    /// deadline (`--handshake-timeout` from accept to a running session),
    /// then its session. `gate`: the carrier's place until it is a session
    /// or part of one — a pending ticket (which a flood may take away; a
    /// new session takes a slot under `--max-sessions` before the ticket
    /// goes, a resume or a lane none), or a slot it already holds.
    async fn handshake_and_serve(
        self,
        from: String,
        ends: Option<Ends>,
        setup: impl std::future::Future<
            Output = std::io::Result<(Carrier, Option<longhaul_carrier::Fingerprint>)>,
        >,
        gate: Gate,
    ) {
        let limit = self.config.session.handshake_timeout;
        let deadline = tokio::time::Instant::now() + limit;
        let config = self.config.clone();
        let policy = self.policy.clone();
        let slots = Slots {
            sem: self.slots.clone(),
            config: self.config.clone(),
        };
        let slots = match gate {
            Gate::Pending(_) => Some(&slots),
            Gate::Slot(_) => None,
        };
        let admitted = async {
            let (mut carrier, key) = match tokio::time::timeout_at(deadline, setup).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) if is_unheard(&e) => return Err(UNHEARD.to_string()),
                Ok(Err(e)) => {
                    config.metrics.refused(Refusal::Handshake);
                    return Err(format!("refused carrier: handshake failed: {e}"));
                }
                Err(_) => {
                    config.metrics.refused(Refusal::Handshake);
                    return Err(format!(
                        "refused carrier: handshake not finished within {limit:?}"
                    ));
                }
            };
            let (who, under) =
                authenticate(&mut carrier, key, &config, &policy, true, deadline).await?;
            if let Some(p) = &carrier.probe {
                p.admitted();
            }
            let named = (from.clone(), ends);
            let asked = admit(
                carrier,
                key,
                who,
                named,
                &config,
                &policy,
                false,
                &self.resumables,
                slots,
            );
            match tokio::time::timeout_at(deadline, asked).await {
                Ok(r) => r.map(|a| (a, under)),
                Err(_) => {
                    config.metrics.refused(Refusal::Handshake);
                    Err(format!(
                        "refused carrier: no session within {limit:?} of its connection (--handshake-timeout)"
                    ))
                }
            }
        };
        let (admitted, gate_slot) = match gate {
            Gate::Slot(permit) => (admitted.await, permit),
            Gate::Pending(ticket) => {
                let Some(admitted) = ticket.run(admitted).await else {
                    self.config.metrics.refused(Refusal::Handshake);
                    return tracing::debug!(%from, "dropped a pending handshake to make room");
                };
                (admitted, None)
            }
        };
        match admitted {
            Ok((Admitted::New { handle, slot, who }, under)) => {
                // The session is listed, tracked and holds its slot until it
                // ends, in a task of its own: this one's future (every
                // state of the handshake, ≈ 60 KiB) is let go now. (Awaited
                // apart from the log line: inside `info!` it ran only when
                // info lines were on, so with -q no slot was held.)
                tokio::spawn(async move {
                    // Its slot: taken at admission, or (a folder's carrier)
                    // by the listener before the handshake.
                    let _slots = (slot, gate_slot);
                    let listed = Listed {
                        live: Some(&self.live),
                        policy: &self.policy,
                        under,
                    };
                    let line = run_admitted(handle, &who, &from, &self.config, listed).await;
                    tracing::info!(%from, "{line}");
                });
            }
            Ok((Admitted::Attached(what), _)) => tracing::info!(%from, "{what}"),
            Err(e) if e == UNHEARD => tracing::debug!(%from, "{e} (a check?)"),
            Err(e) => {
                // Failed authentications apart: a flood of cheap failures
                // must not hide them (with their source) from the log.
                let throttle = match e.contains("not authenticated") {
                    true => &UNAUTHENTICATED,
                    false => &REFUSED,
                };
                if throttle.pass("refused carriers") {
                    tracing::warn!(%from, "{e}");
                }
            }
        }
    }
}

/// Refused carriers logged, across the server: an authenticated peer (or,
/// before authentication, anyone) can make one per connection.
static REFUSED: longhaul_session::logs::Throttle = longhaul_session::logs::Throttle::new();
/// Carriers refused for their key or token, logged apart.
static UNAUTHENTICATED: longhaul_session::logs::Throttle = longhaul_session::logs::Throttle::new();

/// A connection closed this soon after it was accepted, without a byte,
/// is taken for a check (load balancers close theirs at once).
const CHECK_TIME: std::time::Duration = std::time::Duration::from_secs(1);

/// A connection closed (or reset) at once before its first byte.
#[derive(Debug)]
struct Unheard;

const UNHEARD: &str = "closed before sending anything";

impl std::fmt::Display for Unheard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(UNHEARD)
    }
}

impl std::error::Error for Unheard {}

fn is_unheard(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Unheard>())
}

/// Where a carrier waits while it authenticates.
enum Gate {
    /// In the pending table; a session slot is taken after.
    Pending(crate::pending::Ticket),
    /// Already holding a session slot.
    Slot(Option<tokio::sync::OwnedSemaphorePermit>),
}

async fn accept_loop(
    listener: TcpListener,
    url: ListenUrl,
    tls: Option<Arc<rustls::ServerConfig>>,
    serving: Serving,
) {
    // Behind a reverse proxy (ws, wss) every client has the proxy's
    // address: only the total bound applies there.
    let per_source = matches!(url.transport, Transport::Tcp | Transport::Tls);
    loop {
        let (sock, from) = accept_with_backoff(&listener, &url.to_string()).await;
        let ends = sock.local_addr().ok().map(|local| Ends {
            client: from,
            local,
        });
        let ticket = serving
            .pending
            .admit(per_source.then_some(crate::pending::source_of(from.ip())));
        let (serving, tls, transport) = (serving.clone(), tls.clone(), url.transport.clone());
        tokio::spawn(async move {
            if let Some(cc) = &serving.config.congestion {
                if let Err(e) = longhaul_carrier::set_congestion(&sock, cc) {
                    return tracing::warn!(%from, "{e}");
                }
            }
            let jmux_tcp = transport == Transport::Tcp
                && serving.config.session.mode != longhaul_session::Mode::Native;
            let accepted = tokio::time::Instant::now();
            let setup = async move {
                // A connection that ends at once before its first byte (a
                // load balancer's TCP check, a port scan) is not a carrier
                // that failed: no warning for it, nor a refusal counted.
                // One that held its place for longer is logged as before.
                // (A JMUX peer on plain TCP may say nothing until it has a
                // stream to open: no byte is owed from it.)
                let mut first = [0u8; 1];
                let peeked = match jmux_tcp {
                    true => Ok(1),
                    false => sock.peek(&mut first).await,
                };
                let at_once = accepted.elapsed() < CHECK_TIME;
                match peeked {
                    Ok(0) if at_once => return Err(std::io::Error::other(Unheard)),
                    Err(e) if at_once && e.kind() == std::io::ErrorKind::ConnectionReset => {
                        return Err(std::io::Error::other(Unheard))
                    }
                    Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Err(e) => return Err(e),
                    Ok(_) => {}
                }
                longhaul_carrier::accept(sock, &transport, tls).await
            };
            serving
                .handshake_and_serve(from.to_string(), ends, setup, Gate::Pending(ticket))
                .await;
        });
    }
}

/// A `quic://` listener: each client's first packet becomes a pending
/// handshake, as a TCP connection does, counted per address. Under load
/// (a quarter of the handshake table taken, or half of one address's
/// share) a client's address is checked first with a Retry: packets with
/// forged sources then cost one stateless reply each and take no place.
async fn quic_accept_loop(
    listener: longhaul_carrier::quic::QuicListener,
    url: ListenUrl,
    serving: Serving,
) {
    let local = listener.local_addr().ok();
    while let Some(incoming) = listener.accept().await {
        let source = crate::pending::source_of(incoming.remote_address().ip());
        if !incoming.remote_address_validated() && serving.pending.busy(source) {
            // A Retry can fail only for a packet that already carried a
            // token; such a client is simply not answered.
            if let Err(e) = incoming.retry() {
                e.into_incoming().ignore();
            }
            continue;
        }
        let from = incoming.remote_address();
        let ends = local.map(|local| Ends {
            client: from,
            local,
        });
        let ticket = serving.pending.admit(Some(source));
        let serving = serving.clone();
        tokio::spawn(async move {
            let setup = longhaul_carrier::quic::accept(incoming);
            serving
                .handshake_and_serve(from.to_string(), ends, setup, Gate::Pending(ticket))
                .await;
        });
    }
    tracing::warn!("{url}: the QUIC endpoint closed");
}

/// Serves the carriers clients open in a shared directory.
async fn folder_accept_loop(
    mut folder: FolderListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    serving: Serving,
) {
    loop {
        let mut stream = match folder.accept().await {
            Ok(s) => s,
            Err(e) => return tracing::error!("{e}"),
        };
        let from = stream.peer.clone();
        // The listener took the carrier's slot, and its place among the
        // folder's handshakes, before it started anything for it.
        let Admission { slot, pending } = std::mem::take(&mut stream.admission);
        // Dropping the stream removes its files.
        let Some(permit) = slot.or_else(|| serving.slot(&from)) else {
            continue;
        };
        let (serving, tls) = (serving.clone(), tls.clone());
        tokio::spawn(async move {
            let setup = async move {
                let r = longhaul_carrier::accept_folder(stream, tls).await;
                drop(pending);
                r
            };
            serving
                .handshake_and_serve(from, None, setup, Gate::Slot(Some(permit)))
                .await;
        });
    }
}
