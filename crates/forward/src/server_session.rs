//! A server's carrier once its own handshake is done: who the peer is (the
//! authentication preamble), then its session — a new one (which takes a
//! slot under `--max-sessions`), or a resume or a lane of one it has.

use std::sync::Arc;

use longhaul_carrier::Carrier;
use longhaul_session::{Resumables, Served, Session};

use crate::auth::{read_preamble, Authenticated};
use crate::metrics::Refusal;
use crate::policy::{PolicyCell, Who};
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
    let who = authenticate(&mut carrier, key, &config, policy, live.is_some(), deadline).await?;
    let named = (from, None);
    run_session(
        carrier, key, who, named, config, policy, live, resumables, None,
    )
    .await
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
) -> Result<Authenticated, String> {
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
    if !checked {
        return Ok(Authenticated::Anonymous);
    }
    policy
        .current()
        .auth
        .decide(key, token.as_deref())
        .map_err(|e| {
            config.metrics.refused(Refusal::NotAuthenticated);
            format!("refused carrier: not authenticated: {e}")
        })
}

/// Runs an authenticated carrier's session (new, resumed or joined).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_session(
    carrier: Carrier,
    key: Option<longhaul_carrier::Fingerprint>,
    who: Authenticated,
    // Its name for the log, and its TCP ends if it has them.
    (from, ends): (String, Option<Ends>),
    config: Arc<ServerConfig>,
    policy: &PolicyCell,
    live: Option<&Live>,
    resumables: &Arc<Resumables>,
    // Where a new session takes its slot under --max-sessions (None: the
    // carrier holds one already, or is the trusted pipe).
    slots: Option<&Slots>,
) -> Result<String, String> {
    let mut acceptor = ServerAcceptor::new(&config, policy, &who, from.clone(), ends);
    if live.is_none() {
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
        Ok(Served::New(h)) => {
            let _permit = match slots.map(|s| s.take(&from)) {
                Some(None) => {
                    h.close("session limit reached (--max-sessions)");
                    return Err("session refused: session limit reached".into());
                }
                Some(Some(p)) => Some(p),
                None => None,
            };
            tracing::info!(%from, who = %who.who(), resumable = h.is_resumable(), "session started");
            let id = live.map(|l| l.add(h.clone(), Who::from(&who)));
            let _tracked = config.metrics.track(&from, &h);
            // A detached session keeps this task, and so its slot under
            // --max-sessions, until it ends.
            let why = h.closed().await;
            if let (Some(l), Some(id)) = (live, id) {
                l.remove(id);
            }
            Ok(format!("session ended: {why}"))
        }
        Ok(Served::Resumed(_)) => Ok("carrier handed to the session it resumed".into()),
        Ok(Served::Joined(_)) => Ok("carrier added as a lane of a striped session".into()),
        Err(e) => Err(format!("session refused: {e}")),
    }
}
