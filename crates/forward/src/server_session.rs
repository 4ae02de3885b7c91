//! A server's carrier once its own handshake is done: who the peer is (the
//! authentication preamble), then its session — a new one (which takes a
//! slot under `--max-sessions`), or a resume or a lane of one it has.

use std::sync::Arc;

use longhaul_carrier::Carrier;
use longhaul_session::{Resumables, Served, Session, SessionHandle};
use tokio::sync::OwnedSemaphorePermit;

use crate::auth::{read_preamble, Authenticated};
use crate::metrics::Refusal;
use crate::policy::{Policy, PolicyCell, Who};
use crate::server_acceptor::ServerAcceptor;
use crate::server_config::{Ends, ServerConfig};
use crate::sessions::{Live, Slots};

/// Authenticates a carrier and runs its session to the end.
pub(crate) async fn serve_carrier(
    mut carrier: Carrier,
    key: Option<longhaul_carrier::Fingerprint>,
    from: String,
    config: Arc<ServerConfig>,
    policy: &PolicyCell,
    // None for the trusted pipe of `--stdio`, whose owner authenticated
    // the peer; the server's table of sessions otherwise.
    live: Option<&Live>,
    resumables: &Arc<Resumables>,
) -> Result<String, String> {
    let deadline = tokio::time::Instant::now() + config.session.handshake_timeout;
    let (who, under) =
        authenticate(&mut carrier, key, &config, policy, live.is_some(), deadline).await?;
    let named = (from.clone(), None);
    let pipe = live.is_none();
    match admit(
        carrier, key, who, named, &config, policy, pipe, resumables, None,
    )
    .await?
    {
        Admitted::New { handle, who, .. } => {
            let listed = Listed {
                live,
                policy,
                under,
            };
            Ok(run_admitted(handle, &who, &from, &config, listed).await)
        }
        Admitted::Attached(what) => Ok(what.into()),
    }
}

/// Reads the preamble and decides who the peer is (`checked`: false for
/// the trusted pipe of `--stdio`, whose peer is anonymous).
pub(crate) async fn authenticate(
    carrier: &mut Carrier,
    key: Option<longhaul_carrier::Fingerprint>,
    config: &ServerConfig,
    policy: &PolicyCell,
    checked: bool,
    // Shared with the carrier's own handshake: one limit for both.
    deadline: tokio::time::Instant,
) -> Result<(Authenticated, Arc<Policy>), String> {
    // Native clients send the preamble (even over a trusted pipe); JMUX
    // peers have none and can only authenticate by key.
    let token = if config.session.mode == longhaul_session::Mode::Native {
        let limit = config.session.handshake_timeout;
        match tokio::time::timeout_at(deadline, read_preamble(&mut carrier.reader)).await {
            Ok(Ok(t)) => Some(t),
            Ok(Err(e)) => {
                config.metrics.refused(Refusal::Handshake);
                return Err(format!("refused carrier: {e}"));
            }
            Err(_) => {
                config.metrics.refused(Refusal::Handshake);
                return Err(format!(
                    "refused carrier: no authentication within {limit:?}"
                ));
            }
        }
    } else {
        None
    };
    // The policy it is decided under: a reload that comes before the
    // session is listed is checked against it (see `run_admitted`).
    let under = policy.current();
    if !checked {
        return Ok((Authenticated::Anonymous, under));
    }
    let who = under.auth.decide(key, token.as_deref()).map_err(|e| {
        config.metrics.refused(Refusal::NotAuthenticated);
        format!("refused carrier: not authenticated: {e}")
    })?;
    Ok((who, under))
}

/// What an authenticated carrier became.
pub(crate) enum Admitted {
    /// A new session, running, with the slot it holds under
    /// `--max-sessions` (None: the carrier held one already, or is the
    /// trusted pipe).
    New {
        handle: SessionHandle,
        slot: Option<OwnedSemaphorePermit>,
        who: Authenticated,
    },
    /// A resume or a lane of a session that runs already.
    Attached(&'static str),
}

/// Runs the hello and the attach exchange of an authenticated carrier;
/// a new session takes its slot (`slots`) before it starts, so nothing a
/// refused one pipelined is acted on. The caller bounds this by the
/// carrier's one handshake deadline.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn admit(
    carrier: Carrier,
    key: Option<longhaul_carrier::Fingerprint>,
    who: Authenticated,
    // Its name for the log, and its TCP ends if it has them.
    (from, ends): (String, Option<Ends>),
    config: &Arc<ServerConfig>,
    policy: &PolicyCell,
    // The trusted pipe of `--stdio`.
    pipe: bool,
    resumables: &Arc<Resumables>,
    // Where a new session takes its slot under --max-sessions (None: the
    // carrier holds one already, or is the trusted pipe).
    slots: Option<&Slots>,
) -> Result<Admitted, String> {
    let mut acceptor = ServerAcceptor::new(config, policy, &who, from.clone(), ends);
    if pipe {
        acceptor.who = Who::Pipe;
    }
    let acceptor = Arc::new(acceptor);
    // A resume must come from the same identity as the session's start:
    // the same authorized key, or for token and --insecure carriers the
    // same TLS client key (or none).
    let identity = match (&who, key) {
        (Authenticated::Key(fp, _), _) => format!("key {fp}"),
        (_, Some(fp)) => format!("{} with key {fp}", who.who()),
        (_, None) => who.who(),
    };
    let served = Session::serve(
        carrier,
        config.session.clone(),
        acceptor,
        resumables,
        identity,
    )
    .await;
    match served {
        Ok(Served::New(asked)) => {
            let slot = match slots.map(|s| s.take(&from)) {
                Some(None) => {
                    asked.refuse_busy().await;
                    return Err("session refused: session limit reached".into());
                }
                Some(Some(p)) => Some(p),
                None => None,
            };
            let handle = asked
                .start()
                .await
                .map_err(|e| format!("session refused: {e}"))?;
            Ok(Admitted::New { handle, slot, who })
        }
        Ok(Served::Resumed(_)) => Ok(Admitted::Attached(
            "carrier handed to the session it resumed",
        )),
        Ok(Served::Joined(_)) => Ok(Admitted::Attached(
            "carrier added as a lane of a striped session",
        )),
        Err(e) => Err(format!("session refused: {e}")),
    }
}

/// Where a new session is listed, and the policy it was let in under.
pub(crate) struct Listed<'a> {
    pub live: Option<&'a Live>,
    pub policy: &'a PolicyCell,
    pub under: Arc<Policy>,
}

/// Runs an admitted new session to its end (its slot held by the
/// caller); returns the line to log.
pub(crate) async fn run_admitted(
    h: SessionHandle,
    who: &Authenticated,
    from: &str,
    config: &ServerConfig,
    listed: Listed<'_>,
) -> String {
    tracing::info!(%from, who = %who.who(), resumable = h.is_resumable(), "session started");
    let live = listed.live;
    let id = live.map(|l| l.add(h.clone(), Who::from(who)));
    // A reload after its authentication and before it was listed did not
    // see it: it is held to that reload now (a reload after this sees it).
    let now = listed.policy.current();
    if live.is_some() && !Arc::ptr_eq(&now, &listed.under) {
        if let Some(why) = now.ends(&listed.under, &Who::from(who), false) {
            tracing::warn!(%from, "closing the session after the reload: {why}");
            h.close(&format!("closed by the server's reload: {why}"));
        }
    }
    let _tracked = config.metrics.track(from, &h);
    // A detached session keeps this task, and so its slot under
    // --max-sessions, until it ends.
    let why = h.closed().await;
    if let (Some(l), Some(id)) = (live, id) {
        l.remove(id);
    }
    format!("session ended: {why}")
}
