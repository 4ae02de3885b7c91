//! Keeping a client's session alive: dialling again when the carrier
//! drops, resuming the session or starting a new one, and the wait between
//! attempts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use longhaul_session::{Session, SessionError, SessionHandle};
use rand::Rng;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use crate::client_config::{ClientAcceptor, ClientConfig};
use crate::dial::connect;
use longhaul_carrier::CarrierUrl;

/// How long a client that stops waits for its GOODBYE to be written.
pub const GOODBYE_GRACE: Duration = Duration::from_secs(2);

/// Dials the server and authenticates: a carrier ready for the hello.
/// `instance`: the server instance holding the session it resumes.
pub(crate) async fn dial(
    config: &ClientConfig,
    instance: Option<&str>,
) -> anyhow::Result<longhaul_carrier::Carrier> {
    dial_lane(config, 0, instance).await
}

/// Dials lane `number` of a striped session: from the `via` address whose
/// turn it is, if any.
async fn dial_lane(
    config: &ClientConfig,
    number: u8,
    instance: Option<&str>,
) -> anyhow::Result<longhaul_carrier::Carrier> {
    let url = &config.server;
    let bind = match config.via.len() {
        0 => None,
        n => Some(config.via[number as usize % n]),
    };
    let mut carrier = connect(config, bind, instance).await?;
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

/// A new session: with the server, or else with each `--failover` server
/// in turn. Returns it and the server it is on (where its resumes and
/// lanes go): the caller makes that its `config.server`.
pub(crate) async fn establish(
    config: &ClientConfig,
    acceptor: Arc<ClientAcceptor>,
) -> anyhow::Result<(SessionHandle, CarrierUrl)> {
    let servers = config.servers();
    let mut failed = None;
    for (i, url) in servers.iter().enumerate() {
        let mut one = config.clone();
        one.server = url.clone();
        // A failover server's key is never trusted on first use: it is
        // dialled when the first one is out of reach, which someone on
        // the path can choose.
        one.no_first_use = i > 0;
        match establish_on(&one, acceptor.clone()).await {
            Ok(s) => return Ok((s, url.clone())),
            // A server whose key is not the pinned one is never passed
            // over for another.
            Err(e) if crate::dial::is_key_mismatch(&e) => return Err(e),
            Err(e) => {
                if let Some(next) = servers.get(i + 1) {
                    tracing::warn!("{e:#}; trying {next}");
                }
                failed = Some(e);
            }
        }
    }
    Err(failed.unwrap_or_else(|| anyhow!("no server to connect to")))
}

/// A new session with `config.server`.
async fn establish_on(
    config: &ClientConfig,
    acceptor: Arc<ClientAcceptor>,
) -> anyhow::Result<SessionHandle> {
    let url = &config.server;
    let limit = config.session.handshake_timeout;
    match url {
        longhaul_carrier::CarrierUrl::Dir(d) => {
            tracing::info!("waiting for a server on the folder {}", d.identity())
        }
        _ => tracing::info!("connecting to {url}"),
    }
    let started = Instant::now();
    let attempt = async {
        let carrier = dial(config, None).await?;
        Session::start(carrier, config.session.clone(), acceptor)
            .await
            .map_err(|e| refused_at_start(config, e))
    };
    // The first dial is bounded like any handshake: a listener that
    // accepts and never answers is reported, not waited on for ever. (Not
    // a command's: ssh may be asking for a password on the terminal.)
    let limit = match url {
        longhaul_carrier::CarrierUrl::Cmd { .. } => Duration::MAX,
        _ => limit,
    };
    let s = tokio::time::timeout(limit, attempt).await.map_err(|_| {
        let what = match url {
            longhaul_carrier::CarrierUrl::Dir(_) => "no longhaul server answered in that folder",
            _ => "no longhaul server answered there",
        };
        anyhow!("{url}: {what} within {limit:?} (--handshake-timeout); check the address and that the server runs")
    })??;
    tracing::info!(
        "session with {url} up in {:.1} ms, authenticated {}",
        started.elapsed().as_secs_f64() * 1e3,
        config.credentials()
    );
    if s.lanes_wanted() > 1 {
        tokio::spawn(keep_lanes(Arc::new(config.clone()), s.clone()));
    } else if config.session.stripes > 1 {
        tracing::warn!("{url} does not stripe sessions: running over one carrier");
    }
    Ok(s)
}

/// [`establish`], again and again until a server answers (`--wait-for-server`:
/// a client started before its server, or at boot): with the reconnect's
/// backoff, each failure logged as reconnects are. A server whose key is
/// not the one pinned is never waited for.
pub(crate) async fn establish_patiently(
    config: &ClientConfig,
    acceptor: Arc<ClientAcceptor>,
) -> anyhow::Result<(SessionHandle, CarrierUrl)> {
    let url = &config.server;
    let mut backoff = Backoff::new();
    loop {
        tokio::time::sleep(backoff.next()).await;
        match establish(config, acceptor.clone()).await {
            Ok(s) => return Ok(s),
            Err(e) if crate::dial::is_key_mismatch(&e) => return Err(e),
            Err(e) => backoff.log(&format!("waiting for {url}: {e:#}")),
        }
    }
}

/// A first session that failed, in one line that says who refused what
/// and what to do; the transport's own words only at `-v`.
fn refused_at_start(config: &ClientConfig, e: SessionError) -> anyhow::Error {
    let url = &config.server;
    let closed = match &e {
        SessionError::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
        ),
        _ => false,
    };
    if !closed {
        return anyhow!("session with {url} failed: {e}");
    }
    tracing::debug!("the carrier ended during the hello: {e}");
    let fix = match (&config.identity, &config.token, &config.server) {
        (_, _, longhaul_carrier::CarrierUrl::Cmd { .. }) => {
            "the command's server ended; run the command by hand to see why".to_string()
        }
        (Some(id), _, _) => format!(
            "add our key {} ({}) to the server's --authorized-keys file",
            id.fingerprint,
            match &config.identity_file {
                Some(p) => format!("the line in {}.pub", p.display()),
                None => "`longhaul fingerprint` of our key file".into(),
            }
        ),
        (None, Some(_), _) => {
            "check that our token (LONGHAUL_TOKEN or --token) is the server's".into()
        }
        (None, None, _) => {
            "give --key FILE (its fingerprint listed in the server's --authorized-keys) or --token"
                .into()
        }
    };
    anyhow!(
        "{url} did not let us in ({}): {fix}. (Or it had no session slot free: the server's log says which.)",
        config.credentials()
    )
}

/// Keeps a striped session at its number of lanes: dials the missing ones
/// (at the start, and whenever one is lost) while the session has at least
/// one; a session with none is resumed by [`supervise`] first.
async fn keep_lanes(config: Arc<ClientConfig>, session: SessionHandle) {
    let url = &config.server;
    let wanted = session.lanes_wanted();
    let mut number = 0u8;
    let mut backoff = Backoff::new();
    loop {
        if session.is_closed() {
            return;
        }
        let missing = wanted.saturating_sub(session.lanes());
        if missing == 0 || session.is_detached() {
            session.lanes_changed().await;
            backoff = Backoff::new();
            continue;
        }
        tokio::time::sleep(backoff.next()).await;
        // Dial the missing lanes at once; join them one by one (each join
        // proves the session secret with the next attempt number).
        let mut dials = tokio::task::JoinSet::new();
        for _ in 0..missing {
            let c = config.clone();
            number = number.wrapping_add(1);
            let n = number;
            let instance = session.instance().map(str::to_owned);
            dials.spawn(async move { (n, dial_lane(&c, n, instance.as_deref()).await) });
        }
        let limit = config.session.handshake_timeout;
        while let Some(d) = dials.join_next().await {
            let (n, carrier) = match d {
                Ok((n, Ok(c))) => (n, c),
                Ok((_, Err(e))) => {
                    backoff.log(&format!("adding a lane to {url}: {e:#}"));
                    continue;
                }
                Err(_) => continue,
            };
            match tokio::time::timeout(limit, session.join_lane(carrier, n)).await {
                Ok(Ok(())) => {
                    tracing::debug!(lane = n, lanes = session.lanes(), "lane to {url} added")
                }
                Ok(Err(e)) => backoff.log(&format!("adding a lane to {url}: {e}")),
                Err(_) => backoff.log(&format!(
                    "adding a lane to {url}: no answer within {limit:?}"
                )),
            }
        }
    }
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

    /// A failed attempt: logged at the 1st, 2nd, 3rd, 4th, 8th, 16th… (the
    /// rest at debug level), so a long outage does not flood the log.
    fn log(&self, what: &str) {
        if self.attempts <= 3 || self.attempts.is_power_of_two() {
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
pub(crate) async fn supervise(
    config: Arc<ClientConfig>,
    acceptor: Arc<ClientAcceptor>,
    current: watch::Sender<SessionHandle>,
    ended: watch::Sender<Option<String>>,
    mut stop: watch::Receiver<bool>,
    remote_ports: Vec<u16>,
    demand: Arc<tokio::sync::Notify>,
) {
    let mut config = config;
    loop {
        // The server the session is on (a --failover one, maybe).
        let url = &config.server.clone();
        let session = current.borrow().clone();
        if !config.reconnects() {
            let why = tokio::select! {
                why = session.closed() => why,
                _ = stop.wait_for(|s| *s) => "client stopped".into(),
            };
            ended.send_replace(Some(why));
            return;
        }
        let (detached, draining) = tokio::select! {
            d = session.detached() => (d, None),
            why = session.peer_draining() => (false, Some(why)),
            _ = stop.wait_for(|s| *s) => (false, None),
        };
        if *stop.borrow() {
            // `Client::stop` closes the session, `Client::shutdown` says
            // GOODBYE on it: not a loss to repair, nor ours to cut short.
            ended.send_replace(Some("client stopped".into()));
            return;
        }
        let mut backoff = Backoff::new();
        if let Some(why) = draining {
            // The server is going away: new connections go through a new
            // session (a load balancer sends it to another server) once
            // there is one; until then, and for the streams open now, the
            // old one serves.
            let why = longhaul_session::logs::escaped(&why);
            let idle = !session.has_streams() && config.remote.is_empty();
            tracing::info!(
                streams = session.stats().streams,
                "{url} is draining ({why}): {}",
                if idle {
                    "a new session starts with the next connection"
                } else {
                    "starting a new session for new connections; the open ones stay on the old session"
                }
            );
            tokio::spawn(retire(session.clone(), stop.clone(), current.subscribe()));
            // Not all clients of a server at the same instant, and not in
            // a loop with a server that drains every session it starts.
            let settle = DRAIN_MIN_AGE.saturating_sub(session.stats().age)
                + DRAIN_JITTER.mul_f64(rand::thread_rng().gen_range(0.0..1.0));
            tokio::select! {
                _ = tokio::time::sleep(settle) => {}
                _ = stop.wait_for(|s| *s) => {
                    ended.send_replace(Some("client stopped".into()));
                    return;
                }
            }
            if idle {
                // Nothing needs a session until a local connection comes.
                tokio::select! {
                    _ = demand.notified() => {}
                    _ = stop.wait_for(|s| *s) => {
                        ended.send_replace(Some("client stopped".into()));
                        return;
                    }
                }
            }
        } else if detached {
            let lost = Instant::now();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next()) => {}
                    _ = stop.wait_for(|s| *s) => {
                        // Detached: nothing can be said to the server.
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
                    let carrier = dial(&config, session.instance()).await?;
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
        // A fresh session (the old one's streams were reset, or stay on it
        // while its server drains).
        loop {
            tokio::select! {
                _ = tokio::time::sleep(backoff.next()) => {}
                _ = stop.wait_for(|s| *s) => {
                    ended.send_replace(Some("client stopped".into()));
                    return;
                }
            }
            match establish(&config, acceptor.clone()).await {
                Ok((s, _)) if *stop.borrow() => {
                    // Stopped while it was being made: it ends at once,
                    // and the server knows.
                    s.shutdown("client stopped", GOODBYE_GRACE).await;
                    ended.send_replace(Some("client stopped".into()));
                    return;
                }
                Ok((s, on)) => {
                    tracing::info!("new session with {on}");
                    if on != config.server {
                        let mut c = (*config).clone();
                        c.server = on;
                        config = Arc::new(c);
                    }
                    rebind(&config, &s, &remote_ports).await;
                    current.send_replace(s);
                    break;
                }
                Err(e) => backoff.log(&format!("reconnecting to {url}: {e:#}")),
            }
        }
    }
}

/// A session whose server is draining: it serves its open streams until
/// they end (then it is closed here, once a new session has replaced it)
/// or until the server ends it. A carrier lost
/// meanwhile is not resumed (the server takes no new carriers while it
/// drains): its streams are reset, never left hanging.
async fn retire(
    session: SessionHandle,
    mut stop: watch::Receiver<bool>,
    current: watch::Receiver<SessionHandle>,
) {
    // Unused: replaced as the client's session (no new stream can come to
    // it), and its last stream ended.
    let unused = async {
        loop {
            tokio::time::sleep(RETIRE_POLL).await;
            if !current.borrow().is(&session) && !session.has_streams() {
                return;
            }
        }
    };
    let stopped = async { stop.wait_for(|s| *s).await.is_ok() };
    tokio::select! {
        lost = session.detached() => if lost {
            tracing::warn!(
                streams = session.stats().streams,
                "carrier to a draining server lost: the streams left on it are reset"
            );
            session.close("carrier lost while the server was draining");
        },
        // Its last stream ended: the server need not wait for it.
        _ = unused => session.shutdown("its server is draining", RETIRE_GRACE).await,
        _ = stopped => session.close("client stopped"),
    }
}

/// How often a retired session is checked for streams left.
const RETIRE_POLL: Duration = Duration::from_millis(500);
/// How long a retired session's goodbye may take to be written.
const RETIRE_GRACE: Duration = Duration::from_secs(3);
/// A session drained younger than this is replaced only once it is this
/// old: a server that drains every session it starts gets a new one
/// every 2 s, not in a loop.
const DRAIN_MIN_AGE: Duration = Duration::from_secs(2);
/// Up to this much more, at random, before a drained session is replaced:
/// the clients of one server do not all dial the others at once.
const DRAIN_JITTER: Duration = Duration::from_millis(500);

/// Asks a fresh session for the reverse forwards again, on the ports the
/// first session got.
async fn rebind(config: &ClientConfig, session: &SessionHandle, ports: &[u16]) {
    for (r, &port) in config.remote.iter().zip(ports) {
        let dest = r.dest();
        let bind = match r.bind_addr().rsplit_once(':') {
            Some((host, _)) => format!("{host}:{port}"),
            None => port.to_string(),
        };
        match session.bind(&bind, &dest).await {
            Ok(p) => tracing::info!("-R {}:{p} -> {}:{} open again", r.bind, r.host, r.host_port),
            Err(e) => {
                let e = longhaul_session::logs::escaped(&e);
                // not peer text: the -R the user gave
                tracing::error!("server refused -R {bind} on the new session: {e}")
            }
        }
    }
}
