//! A server's stop, in two steps. First it drains: each session is told
//! (DRAIN) to open its next streams through a new session — which a load
//! balancer sends to another server — and its reverse listeners close;
//! a session ends once it has no stream open, or when the drain timeout
//! passes, or at a second stop signal. Then the graceful end of each
//! session: CLOSE for every stream left, the carrier ended within
//! [`SHUTDOWN_GRACE`].

use std::future::Future;
use std::time::Duration;

use longhaul_session::SessionHandle;
use tokio::sync::watch;

/// How long an ending session's CLOSEs and GOODBYE may take to be written.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// After DRAIN is sent, how long a session with no stream is kept: its
/// client may be opening one through it before it has its new session.
const DRAIN_SETTLE: Duration = Duration::from_secs(1);

/// How often a draining session's streams are counted.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// Drains `sessions` for at most `timeout` (or until `hurry`), then ends
/// them all.
pub(crate) async fn stop_sessions(
    sessions: Vec<SessionHandle>,
    timeout: Duration,
    hurry: impl Future<Output = ()>,
) {
    let (now_tx, now) = watch::channel(timeout.is_zero());
    if !timeout.is_zero() && !sessions.is_empty() {
        let busy = sessions.iter().filter(|h| h.stats().streams > 0).count();
        tracing::info!(
            "draining {} session(s), {busy} with open streams, for up to {timeout:?}: \
             clients open their next streams elsewhere (a second stop signal ends them now)",
            sessions.len()
        );
        for h in &sessions {
            h.drain("the server is draining (stopping or restarting)");
        }
    } else {
        tracing::info!("shutting down: closing {} session(s)", sessions.len());
    }
    let mut ending = tokio::task::JoinSet::new();
    for h in sessions {
        let mut now = now.clone();
        ending.spawn(async move {
            tokio::select! {
                _ = until_idle(&h) => {}
                _ = now.wait_for(|n| *n) => {}
            }
            h.shutdown("server shutting down", SHUTDOWN_GRACE).await
        });
    }
    let all = async { while ending.join_next().await.is_some() {} };
    tokio::pin!(all);
    tokio::select! {
        _ = &mut all => return,
        _ = tokio::time::sleep(timeout) => {
            tracing::info!("drain timeout: closing the sessions left");
        }
        _ = hurry => tracing::info!("second stop signal: closing the sessions left"),
    }
    now_tx.send_replace(true);
    all.await;
}

/// Resolves once `h` has had no stream for a moment after the DRAIN (or
/// has ended).
async fn until_idle(h: &SessionHandle) {
    tokio::time::sleep(DRAIN_SETTLE).await;
    while !h.is_closed() && h.stats().streams > 0 {
        tokio::time::sleep(DRAIN_POLL).await;
    }
}
