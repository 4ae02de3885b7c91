//! A server's sessions: the live ones (so that shutdown can close them
//! and a reload end those it no longer admits), and the slots new ones
//! take under `--max-sessions`.

use std::collections::HashMap;
use std::sync::Arc;

use longhaul_session::SessionHandle;
use tokio::sync::Semaphore;

use crate::metrics::Refusal;
use crate::policy::Who;
use crate::server_config::ServerConfig;

/// The sessions a server is running, so that shutdown can close them
/// (and a reload end those it no longer admits).
#[derive(Clone, Default)]
pub(crate) struct Live(Arc<std::sync::Mutex<LiveTable>>);

/// The last id given, and each session with who it was admitted as.
type LiveTable = (u64, HashMap<u64, (SessionHandle, Who)>);

impl Live {
    pub(crate) fn add(&self, h: SessionHandle, who: Who) -> u64 {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        let id = g.0;
        g.1.insert(id, (h, who));
        id
    }

    pub(crate) fn all(&self) -> Vec<(SessionHandle, Who)> {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.1.values().cloned().collect()
    }

    pub(crate) fn remove(&self, id: u64) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .remove(&id);
    }

    /// The sessions running now, by id (ended ones leave the table).
    pub(crate) fn handles(&self) -> Vec<(u64, SessionHandle)> {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.1.iter().map(|(id, (h, _))| (*id, h.clone())).collect()
    }
}

/// The slots under `--max-sessions`.
#[derive(Clone)]
pub(crate) struct Slots {
    pub sem: Arc<Semaphore>,
    pub config: Arc<ServerConfig>,
}

impl Slots {
    /// A slot for a new session, or a log line (and a counted refusal).
    pub(crate) fn take(
        &self,
        from: &dyn std::fmt::Display,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let permit = self.sem.clone().try_acquire_owned().ok();
        // At most 10 lines a second: a client may ask again and again.
        static LOGGED: longhaul_session::logs::Throttle = longhaul_session::logs::Throttle::new();
        if permit.is_none() {
            self.config.metrics.refused(Refusal::SessionLimit);
        }
        if permit.is_none() && LOGGED.pass("refusals for the session limit") {
            tracing::warn!(%from, limit = self.config.max_sessions, "refusing carrier: session limit reached (--max-sessions)");
        }
        permit
    }
}
