//! The runtime side of the link layer: which carrier a session runs on,
//! what happens when it drops, and attaching the next one.
//!
//! A session's carrier tasks (reader and writer) belong to one carrier
//! "generation". When that carrier fails — read or write error, EOF without
//! GOODBYE, or a silent peer — a resumable session is **detached**: its
//! tasks stop, the multiplexer's timers pause, and every stream stays as it
//! is (pumps stop once windows and queues fill). A new carrier is attached
//! after the resume exchange ([`crate::resume`]): the replay buffer's
//! unacknowledged frames go out first, then what the old writer had taken
//! from the multiplexer but not started. A session without a link layer
//! (JMUX, `--stdio`, a peer without resume) closes on a carrier failure, as
//! before.

use std::collections::VecDeque;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use longhaul_carrier::{Carrier, PathProbe};
use longhaul_proto::frame::DecodeLimits;
use longhaul_proto::link::{Receipt, Replay, DEFAULT_REPLAY_LIMIT};
use longhaul_proto::outframe::OutFrame;
use longhaul_proto::resume::{Secret, SessionId};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::lanes::{LaneTasks, Stripes};
use crate::reader::carrier_reader;
use crate::runtime::Shared;
use crate::writer::carrier_writer;

/// Which end of the session this is: the client dials and resumes, the
/// server waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// The link layer's state, shared by the carrier reader and writer.
pub(crate) struct LinkState {
    pub replay: Replay,
    pub rx: Receipt,
    /// Frames the last writer took from the multiplexer and had not started
    /// when its carrier dropped: written after the replay on the next one.
    pub leftover: VecDeque<OutFrame>,
    pub id: SessionId,
    pub secret: Secret,
    /// Client: the last attempt number used. Server: the highest accepted.
    pub attempt: u64,
    /// Server: who authenticated the session's first carrier.
    pub identity: String,
    /// Carrier drops survived, and bytes sent again after them.
    pub resumes: u64,
    pub replayed: u64,
    /// A striped session's chunks (several lanes).
    pub stripes: Option<Stripes>,
}

impl LinkState {
    pub fn new(
        limit: usize,
        peer_limit: usize,
        id: SessionId,
        secret: Secret,
        identity: String,
    ) -> LinkState {
        LinkState {
            replay: Replay::new(limit),
            rx: Receipt::new(peer_limit),
            leftover: VecDeque::new(),
            id,
            secret,
            attempt: 0,
            identity,
            resumes: 0,
            replayed: 0,
            stripes: None,
        }
    }

    /// Makes this a striped session over `lanes` lanes: the reorder
    /// window is our replay bound, and we keep no more unacknowledged than
    /// the peer's.
    pub fn striped(mut self, lanes: u8, peer_limit: usize) -> LinkState {
        if lanes >= 2 {
            self.stripes = Some(Stripes::new(lanes, self.replay.limit()));
            self.replay
                .cap(peer_limit.max(longhaul_proto::link::MIN_REPLAY_LIMIT));
        }
        self
    }
}

/// The replay bound when none is configured: what the carrier's kernel
/// buffers can hold at most (our send buffer plus the peer's receive
/// buffer, both at their autotuning maximum) with room for ACKs to come
/// back, so the bound never caps a path the TCP buffers allow; between
/// 16 MiB and 256 MiB.
pub fn auto_replay_limit() -> usize {
    fn max_of(path: &str) -> Option<usize> {
        let text = std::fs::read_to_string(path).ok()?;
        text.split_whitespace().last()?.parse().ok()
    }
    match (
        max_of("/proc/sys/net/ipv4/tcp_wmem"),
        max_of("/proc/sys/net/ipv4/tcp_rmem"),
    ) {
        (Some(w), Some(r)) => (2 * (w + r)).clamp(16 << 20, 256 << 20),
        _ => DEFAULT_REPLAY_LIMIT,
    }
}

/// The tasks of the carrier a session runs on.
#[derive(Default)]
pub(crate) struct CarrierSlot {
    /// Generation of the current (or last) carrier.
    pub gen: u64,
    /// No carrier: the last one dropped and no new one is attached yet.
    pub detached: bool,
    pub since: Option<Instant>,
    pub reader: Option<JoinHandle<()>>,
    pub writer: Option<JoinHandle<()>>,
    /// Tells the writer to stop (it saves what it had not started).
    pub stop: Option<Arc<Notify>>,
    pub probe: Option<Arc<dyn PathProbe>>,
    /// A striped session's lanes (the fields above are then unused).
    pub lanes: Vec<LaneTasks>,
    /// Lanes dropped whose tasks may still be ending.
    pub retired: Vec<LaneTasks>,
}

/// Waits this long at most for a stopped carrier's tasks to end.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(2);

impl Shared {
    pub(crate) fn link(&self) -> Option<MutexGuard<'_, LinkState>> {
        self.link
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn slot(&self) -> MutexGuard<'_, CarrierSlot> {
        self.carrier.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the reader and writer of a new carrier generation. `resend`:
    /// frames from the replay buffer to write first.
    pub(crate) fn spawn_carrier(
        self: &Arc<Self>,
        carrier: Carrier,
        limits: DecodeLimits,
        resend: Vec<OutFrame>,
        resend_from: u64,
    ) {
        if self.striped {
            return self.spawn_lane(carrier, limits, resend, resend_from, 0);
        }
        let mut slot = self.slot();
        slot.gen += 1;
        let gen = slot.gen;
        let stop = Arc::new(Notify::new());
        slot.detached = false;
        slot.since = None;
        slot.probe = carrier.probe.map(Arc::from);
        slot.reader = Some(tokio::spawn(carrier_reader(
            self.clone(),
            carrier.reader,
            limits,
            gen,
        )));
        slot.writer = Some(tokio::spawn(carrier_writer(
            self.clone(),
            carrier.writer,
            carrier.urgent,
            carrier.urgent_flag,
            gen,
            stop.clone(),
            resend,
        )));
        slot.stop = Some(stop);
        // Under the slot's lock, so that a failure of this very carrier
        // (which takes the lock) is published after this, never before.
        self.detached_tx.send_replace(false);
    }

    /// The carrier of generation `gen` failed. A resumable session is
    /// detached and waits for a new carrier; any other session closes.
    pub(crate) fn carrier_failed(self: &Arc<Self>, gen: u64, why: String) {
        let resumable = self.link.is_some()
            && self.with(|m, _| m.dead().is_none() && m.goodbye_done().is_none());
        if !resumable {
            tracing::info!(peer = %self.peer, "{why}");
            return self.close(why);
        }
        if self.striped && self.lane_failed(gen, &why) {
            return;
        }
        {
            let mut slot = self.slot();
            if (!self.striped && slot.gen != gen) || slot.detached {
                return;
            }
            slot.detached = true;
            slot.since = Some(Instant::now());
            slot.probe = None;
            if let Some(r) = &slot.reader {
                r.abort();
            }
            if let Some(s) = &slot.stop {
                s.notify_one();
            }
            self.detached_tx.send_replace(true);
        }
        self.with(|m, now| m.set_attached(false, now));
        let (held, sent) = self
            .link()
            .map(|l| (l.replay.held(), l.replay.sent()))
            .unwrap_or_default();
        tracing::warn!(
            peer = %self.peer,
            unacknowledged = held,
            sent,
            "carrier lost ({why}); the session is kept for a resume"
        );
        if self.role == Role::Server {
            let shared = self.clone();
            let grace = self.config.resume_timeout;
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                let expired = {
                    let slot = shared.slot();
                    slot.gen == gen && slot.detached
                };
                if expired {
                    shared.close(format!(
                        "carrier lost and not resumed within {grace:?} (--resume-timeout)"
                    ));
                }
            });
        }
    }

    /// Stops the current carrier, if any (a detached session's last one
    /// may still be finishing), and waits until its tasks are gone: what
    /// the writer had not started is saved, and nothing more is counted as
    /// received. Called before every resume, so the old carrier's tasks
    /// never overlap the new one's. A writer that does not stop in time
    /// would take frames with it: the session is closed instead.
    pub(crate) async fn stop_carrier(self: &Arc<Self>, why: &str) -> Result<(), String> {
        if self.striped {
            for id in self.lane_ids() {
                self.carrier_failed(id, why.to_owned());
            }
            return self.stop_lanes().await;
        }
        let gen = self.slot().gen;
        self.carrier_failed(gen, why.to_owned());
        let (reader, writer) = {
            let mut slot = self.slot();
            (slot.reader.take(), slot.writer.take())
        };
        if let Some(r) = reader {
            // Aborted by `carrier_failed`; wait until it really ended.
            let _ = tokio::time::timeout(STOP_GRACE, r).await;
        }
        if let Some(w) = writer {
            let abort = w.abort_handle();
            if tokio::time::timeout(STOP_GRACE, w).await.is_err() {
                abort.abort();
                let why = "the old carrier's writer did not stop".to_string();
                self.close(why.clone());
                return Err(why);
            }
        }
        Ok(())
    }

    /// Attaches a new carrier to a detached session after the resume
    /// exchange: `peer_received` is what the peer has of ours. Returns the
    /// bytes that will be sent again.
    pub(crate) fn resume_on(
        self: &Arc<Self>,
        carrier: Carrier,
        limits: DecodeLimits,
        peer_received: u64,
    ) -> Result<u64, longhaul_proto::link::LinkError> {
        let outage = self.slot().since.map(|s| s.elapsed());
        let (resend, bytes) = {
            let mut l = self.link().expect("resume needs a link layer");
            let resend = l.replay.rewind(peer_received)?;
            l.rx.resumed();
            if let Some(s) = l.stripes.as_mut() {
                // Everything the peer misses comes again in new chunks.
                s.reorder.reset();
                s.flight.reset();
                s.ack_now = false;
            }
            let bytes: u64 = resend.iter().map(|f| f.remaining() as u64).sum();
            l.resumes += 1;
            l.replayed += bytes;
            (resend, bytes)
        };
        self.with(|m, now| m.set_attached(true, now));
        // A silence found on the old carrier is not this one's.
        let _ = self.take_silent();
        self.spawn_carrier(carrier, limits, resend, peer_received);
        tracing::info!(
            peer = %self.peer,
            outage = ?outage.unwrap_or_default(),
            replayed = bytes,
            "session resumed on a new carrier"
        );
        Ok(bytes)
    }
}
