//! A new session a client asked the server for, held between the ask and
//! its start: the server decides (a slot under `--max-sessions`) before
//! anything the client sent is acted on. Until [`NewSession::start`] no
//! reader runs on the carrier, so OPENs and BINDs the client pipelined
//! behind its hello wait unread, and are dropped with the carrier if the
//! session is refused.

use std::sync::Arc;

use longhaul_carrier::Carrier;
use longhaul_proto::link::LinkLayer;
use longhaul_proto::resume::{Attached, Refusal, SessionId};
use tokio::io::AsyncWriteExt;

use crate::config::{Role, SessionConfig, SessionError};
use crate::resume::{exchange, Resumables};
use crate::runtime::{Acceptor, SessionHandle};
use crate::start::{build, Negotiated};

/// A new session, asked for and not yet answered.
pub struct NewSession {
    pub(crate) carrier: Carrier,
    pub(crate) config: SessionConfig,
    pub(crate) acceptor: Arc<dyn Acceptor>,
    pub(crate) negotiated: Negotiated,
    /// A resumable session's answer (written by `start`), its link layer,
    /// and the table it is filed in.
    pub(crate) resumable: Option<Resumable>,
}

pub(crate) struct Resumable {
    pub answer: Vec<u8>,
    pub link: LinkLayer,
    pub id: SessionId,
    pub table: Arc<Resumables>,
}

impl NewSession {
    /// Answers the client and starts the session's tasks.
    pub async fn start(self) -> Result<SessionHandle, SessionError> {
        let NewSession {
            mut carrier,
            config,
            acceptor,
            negotiated,
            resumable,
        } = self;
        let Some(r) = resumable else {
            return Ok(build(
                carrier,
                config,
                acceptor,
                &negotiated,
                Role::Server,
                None,
            ));
        };
        exchange(&config, async {
            carrier.writer.write_all(&r.answer).await?;
            carrier.writer.flush().await?;
            Ok(())
        })
        .await?;
        let h = build(
            carrier,
            config,
            acceptor,
            &negotiated,
            Role::Server,
            Some(r.link),
        );
        r.table.insert(r.id, &h.shared);
        tracing::debug!(session = %r.id, "resumable session started");
        Ok(h)
    }

    /// Refuses the session: a client that asked for a resumable one is
    /// told the server is full; the carrier is then dropped unread.
    pub async fn refuse_busy(mut self) {
        if self.resumable.is_none() {
            return;
        }
        let answer = Attached::Refused(Refusal::Busy).encode();
        let _ = exchange(&self.config, async {
            self.carrier.writer.write_all(&answer).await?;
            self.carrier.writer.flush().await?;
            Ok(())
        })
        .await;
    }
}
