//! A server's stop, in two steps. First it drains: each session is told
//! (DRAIN) to open its next streams through a new session — which a load
//! balancer sends to another server — and its reverse listeners close;
//! a session ends once it has no stream open, or when the drain timeout
//! passes, or at a second stop signal. Then the graceful end of each
//! session: CLOSE for every stream left, the carrier ended within
//! [`SHUTDOWN_GRACE`].

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use crate::sessions::Live;

/// How long an ending session's CLOSEs and GOODBYE may take to be written.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// After DRAIN is sent, how long a session with no stream is kept: its
/// client may be opening one through it before it has its new session.
const DRAIN_SETTLE: Duration = Duration::from_secs(1);

/// How often a draining session's streams are counted.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// Why the server tells its clients to move.
const DRAIN_REASON: &str = "the server is draining (stopping or restarting)";

/// Drains the sessions in `live` for at most `timeout` (or until `hurry`),
/// then ends them all. Sessions that finish their handshake meanwhile
/// (accepted just before the listeners closed) are drained as they come.
pub(crate) async fn stop_sessions(live: Live, timeout: Duration, hurry: impl Future<Output = ()>) {
    let first = live.handles();
    let mut ending = tokio::task::JoinSet::new();
    let mut ended: HashSet<u64> = HashSet::new();
    if timeout.is_zero() || first.is_empty() {
        tracing::info!("shutting down: closing {} session(s)", first.len());
    } else {
        let busy = first.iter().filter(|(_, h)| h.has_streams()).count();
        tracing::info!(
            "draining {} session(s), {busy} with open streams, for up to {timeout:?}: \
             clients open their next streams elsewhere (a second stop signal ends them now)",
            first.len()
        );
        let deadline = tokio::time::Instant::now() + timeout;
        let mut told: HashMap<u64, Instant> = HashMap::new();
        tokio::pin!(hurry);
        loop {
            let now = Instant::now();
            let sessions = live.handles();
            if sessions.is_empty() {
                break;
            }
            for (id, h) in sessions {
                if ended.contains(&id) {
                    continue;
                }
                let since = *told.entry(id).or_insert_with(|| {
                    h.drain(DRAIN_REASON);
                    now
                });
                if h.is_closed() {
                    ended.insert(id);
                } else if h.is_detached() {
                    // Its listener is closed: it cannot be resumed here.
                    ended.insert(id);
                    h.close("server stopped while the session had no carrier");
                } else if now.duration_since(since) >= DRAIN_SETTLE && !h.has_streams() {
                    ended.insert(id);
                    ending.spawn(async move {
                        h.shutdown("server shutting down", SHUTDOWN_GRACE).await
                    });
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(DRAIN_POLL) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::info!("drain timeout: closing the sessions left");
                    break;
                }
                _ = &mut hurry => {
                    tracing::info!("second stop signal: closing the sessions left");
                    break;
                }
            }
        }
    }
    for (id, h) in live.handles() {
        if ended.insert(id) {
            ending.spawn(async move { h.shutdown("server shutting down", SHUTDOWN_GRACE).await });
        }
    }
    while ending.join_next().await.is_some() {}
}
