//! A striped session's lanes: several carriers under one link layer
//! (see `longhaul_proto::stripe` for the chunks and the reorder buffer).
//!
//! Each lane has its own reader and writer ([`crate::lane_io`]). A lane
//! that fails is dropped and its unacknowledged chunks go again on the
//! others; the client dials a replacement. Only when the last lane fails is
//! the session detached and resumed as a whole, like a single carrier.
//!
//! A lane's tasks act only while its id is in [`Stripes::live`], checked
//! under the link lock: once a lane is dropped, nothing it still reads is
//! counted and nothing more is taken for it to write, whatever its tasks
//! are doing at that moment.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use longhaul_carrier::{Carrier, PathProbe};
use longhaul_proto::frame::DecodeLimits;
use longhaul_proto::outframe::OutFrame;
use longhaul_proto::stripe::{Flight, Reorder};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::lane_io::{lane_reader, lane_writer};
use crate::reader::Pins;
use crate::runtime::Shared;

/// The link layer's extra state in a striped session.
pub(crate) struct Stripes {
    /// Lanes agreed for the session.
    pub wanted: u8,
    pub reorder: Reorder,
    pub flight: Flight,
    /// Chunk buffers still referenced by queued payloads (one allowance
    /// for the whole session, whatever the number of lanes).
    pub pins: Pins,
    /// Ids of the lanes whose tasks may act.
    pub live: HashSet<u64>,
    /// An ACK is owed even though little arrived (the sender's stall
    /// detection needs to hear progress).
    pub ack_now: bool,
    /// The GOODBYE chunk was written by one of the lanes.
    pub goodbye_sent: bool,
    /// When a stalled lane may be logged again.
    pub next_stall_log: u64,
    /// The rest of a DATA frame cut to fit the last chunk: the next frame
    /// to send, before anything from the multiplexer.
    pub carry: Option<OutFrame>,
}

/// Stalled lanes are logged at most this often.
const STALL_LOG_EVERY: Duration = Duration::from_secs(5);

impl Stripes {
    /// `own_limit`: this side's replay bound, which the peer's sender
    /// respects, so the reorder window.
    pub fn new(wanted: u8, own_limit: usize) -> Stripes {
        Stripes {
            wanted,
            reorder: Reorder::new(own_limit),
            flight: Flight::default(),
            pins: Pins::default(),
            live: HashSet::new(),
            ack_now: false,
            goodbye_sent: false,
            next_stall_log: 0,
            carry: None,
        }
    }
}

/// Counters of one lane.
#[derive(Default)]
pub(crate) struct LaneCounters {
    pub sent: AtomicU64,
    pub received: AtomicU64,
    pub chunks_resent: AtomicU64,
}

/// One lane's tasks.
pub(crate) struct LaneTasks {
    pub id: u64,
    pub number: u8,
    pub reader: JoinHandle<()>,
    pub writer: JoinHandle<()>,
    pub stop: Arc<Notify>,
    pub probe: Option<Arc<dyn PathProbe>>,
    pub counters: Arc<LaneCounters>,
}

/// What one lane has done, for `-v` logs and the stats.
#[derive(Debug, Clone, Default)]
pub struct LaneStats {
    pub number: u8,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Chunks this lane sent again for another one.
    pub chunks_resent: u64,
    pub rtt: Option<Duration>,
    pub delivery_rate: u64,
    pub retransmits: u32,
}

impl LaneTasks {
    fn stats(&self) -> LaneStats {
        let path = self.probe.as_ref().and_then(|p| p.path());
        LaneStats {
            number: self.number,
            bytes_sent: self.counters.sent.load(Ordering::Relaxed),
            bytes_received: self.counters.received.load(Ordering::Relaxed),
            chunks_resent: self.counters.chunks_resent.load(Ordering::Relaxed),
            rtt: path.as_ref().and_then(|p| p.rtt),
            delivery_rate: path.as_ref().map_or(0, |p| p.delivery_rate),
            retransmits: path.map_or(0, |p| p.retransmits),
        }
    }

    fn halt(&self) {
        self.reader.abort();
        self.stop.notify_one();
    }
}

impl Shared {
    /// Starts the tasks of a new lane. `resend`: frames from the replay
    /// buffer to send first, from byte `resend_from` (after a resume).
    pub(crate) fn spawn_lane(
        self: &Arc<Self>,
        carrier: Carrier,
        limits: DecodeLimits,
        resend: Vec<OutFrame>,
        resend_from: u64,
        number: u8,
    ) {
        let mut slot = self.slot();
        slot.gen += 1;
        let id = slot.gen;
        if let Some(mut l) = self.link() {
            if let Some(s) = l.stripes.as_mut() {
                s.live.insert(id);
            }
        }
        let stop = Arc::new(Notify::new());
        let probe: Option<Arc<dyn PathProbe>> = carrier.probe.map(Arc::from);
        if let Some(p) = &probe {
            p.set_floor(longhaul_carrier::LANE_NOTSENT_MIN);
        }
        let counters = Arc::new(LaneCounters::default());
        let reader = tokio::spawn(lane_reader(
            self.clone(),
            carrier.reader,
            limits,
            id,
            counters.clone(),
        ));
        let writer = tokio::spawn(lane_writer(
            self.clone(),
            carrier.writer,
            id,
            stop.clone(),
            probe.clone(),
            counters.clone(),
            (resend, resend_from),
        ));
        slot.lanes.push(LaneTasks {
            id,
            number,
            reader,
            writer,
            stop,
            probe,
            counters,
        });
        slot.detached = false;
        slot.since = None;
        self.lanes_tx.send_replace(slot.lanes.len());
        self.detached_tx.send_replace(false);
        tracing::debug!(peer = %self.peer, lane = number, lanes = slot.lanes.len(), "lane attached");
    }

    /// Lane `id` failed. Returns `true` when that is all (other lanes go
    /// on, or the lane was already gone); `false` when it was the last
    /// lane: the caller detaches the session.
    pub(crate) fn lane_failed(self: &Arc<Self>, id: u64, why: &str) -> bool {
        let mut slot = self.slot();
        let Some(i) = slot.lanes.iter().position(|l| l.id == id) else {
            return true;
        };
        let last = slot.lanes.len() == 1;
        if let Some(mut l) = self.link() {
            if let Some(s) = l.stripes.as_mut() {
                s.live.remove(&id);
            }
        }
        let lane = slot.lanes.remove(i);
        lane.halt();
        let left = slot.lanes.len();
        self.lanes_tx.send_replace(left);
        if last {
            // Kept so that a resume waits for its tasks to end.
            slot.retired.push(lane);
            return false;
        }
        slot.retired.retain(|l| !l.writer.is_finished());
        let number = lane.number;
        slot.retired.push(lane);
        drop(slot);
        let resent = self
            .link()
            .and_then(|mut l| l.stripes.as_mut().map(|s| s.flight.lane_lost(id)))
            .unwrap_or(0);
        self.wake_writer.notify_one();
        tracing::warn!(
            peer = %self.peer,
            lane = number,
            lanes_left = left,
            chunks_resent = resent,
            "lane lost ({why}); the session goes on over the others"
        );
        true
    }

    /// Stops every lane (before a resume) and waits for their tasks.
    pub(crate) async fn stop_lanes(self: &Arc<Self>) -> Result<(), String> {
        let lanes = {
            let mut slot = self.slot();
            let mut all: Vec<LaneTasks> = slot.lanes.drain(..).collect();
            all.append(&mut slot.retired);
            all
        };
        if let Some(mut l) = self.link() {
            if let Some(s) = l.stripes.as_mut() {
                s.live.clear();
            }
        }
        self.lanes_tx.send_replace(0);
        for lane in lanes {
            lane.halt();
            let _ = tokio::time::timeout(super::link::STOP_GRACE, lane.reader).await;
            let abort = lane.writer.abort_handle();
            if tokio::time::timeout(super::link::STOP_GRACE, lane.writer)
                .await
                .is_err()
            {
                // Nothing it writes counts any more (no longer live).
                abort.abort();
            }
        }
        Ok(())
    }

    /// Ids of the lanes now running.
    pub(crate) fn lane_ids(&self) -> Vec<u64> {
        self.slot().lanes.iter().map(|l| l.id).collect()
    }

    pub(crate) fn lane_stats(&self) -> Vec<LaneStats> {
        self.slot().lanes.iter().map(LaneTasks::stats).collect()
    }

    /// The probes of the lanes now running.
    pub(crate) fn lane_probes(&self) -> Vec<Arc<dyn PathProbe>> {
        self.slot()
            .lanes
            .iter()
            .filter_map(|l| l.probe.clone())
            .collect()
    }

    /// On the housekeeping tick: chunks stuck on a stalled lane go on
    /// another, and an ACK is owed for what arrived since the last one.
    /// `slowest_rtt`: for lanes without a TCP socket to ask.
    pub(crate) fn stripe_tick(self: &Arc<Self>, slowest_rtt: Duration) {
        use longhaul_proto::stripe::stall_timeout;
        let now = self.now_ns();
        // Each lane's patience: its RTO, a few RTTs, and what its socket
        // still has to send ahead of a new chunk.
        let fallback = stall_timeout(slowest_rtt, Duration::from_millis(200), Duration::ZERO);
        let timeouts: Vec<(u64, u8, Duration)> = self
            .slot()
            .lanes
            .iter()
            .map(|l| {
                let t = l
                    .probe
                    .as_ref()
                    .and_then(|p| p.path())
                    .map_or(fallback, |p| {
                        let rtt = p.rtt.unwrap_or(slowest_rtt);
                        let queued = match p.delivery_rate {
                            0 => Duration::ZERO,
                            r => Duration::from_secs_f64(p.notsent as f64 / r as f64),
                        };
                        stall_timeout(rtt, p.rto.unwrap_or(fallback), queued)
                    });
                (l.id, l.number, t)
            })
            .collect();
        let (stalled, wake, log) = {
            let Some(mut g) = self.link() else {
                return;
            };
            let l = &mut *g;
            let Some(s) = l.stripes.as_mut() else {
                return;
            };
            let stalled = if s.live.len() > 1 {
                let of = |id: u64| {
                    timeouts
                        .iter()
                        .find(|t| t.0 == id)
                        .map_or(fallback, |t| t.2)
                };
                s.flight.check_stall(now, of)
            } else {
                Vec::new()
            };
            if l.rx.received() > l.rx.told() {
                s.ack_now = true;
            }
            // Logged at most every few seconds: a lossy path stalls often.
            let log = !stalled.is_empty() && now >= s.next_stall_log;
            if log {
                s.next_stall_log = now + STALL_LOG_EVERY.as_nanos() as u64;
            }
            let wake = !stalled.is_empty() || s.ack_now;
            (stalled, wake, log)
        };
        if log {
            let numbers: Vec<u8> = stalled
                .iter()
                .filter_map(|id| timeouts.iter().find(|t| t.0 == *id).map(|t| t.1))
                .collect();
            tracing::info!(
                peer = %self.peer,
                lanes = ?numbers,
                "lane stalled: its chunks waiting too long go again on the others"
            );
        }
        if wake {
            self.wake_writer.notify_one();
        }
    }
}
