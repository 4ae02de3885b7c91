//! A striped session's lanes: several carriers under one link layer
//! (`longhaul_proto::link::LinkLayer` decides which chunk goes where and
//! what a lost lane means; `longhaul_proto::stripe` has the chunks and the
//! reorder buffer).
//!
//! Each lane has its own reader and writer ([`crate::lane_io`]). A lane
//! that fails is dropped and its unacknowledged chunks go again on the
//! others; the client dials a replacement. Only when the last lane fails is
//! the session detached and resumed as a whole, like a single carrier.
//!
//! A lane's tasks act only while the link layer holds its id as current
//! (checked under the session lock): once a lane is dropped, nothing it still
//! reads is counted and nothing more is taken for it to write, whatever its
//! tasks are doing at that moment.

use std::sync::Arc;
use std::time::Duration;

use longhaul_carrier::{Carrier, PathProbe};
use longhaul_proto::frame::DecodeLimits;
use longhaul_proto::link::CarrierId;
use tokio::sync::Notify;

use crate::lane_io::{lane_reader, lane_writer};
use crate::link::still_current;
use crate::runtime::Shared;
use crate::tasks::{CarrierSlot, LaneCounters, LaneStats, LaneTasks, LaneView, STOP_GRACE};

impl Shared {
    /// Starts the tasks of lane `id` (attached in the link layer already).
    pub(crate) fn spawn_lane(
        self: &Arc<Self>,
        carrier: Carrier,
        limits: DecodeLimits,
        id: CarrierId,
        number: u8,
    ) {
        let mut st = self.lock();
        if !still_current(&st, id) {
            tracing::debug!(peer = %self.peer, lane = number, "lane lost before its tasks started");
            return;
        }
        let slot = &mut st.slot;
        let stop = Arc::new(Notify::new());
        let kick = Arc::new(Notify::new());
        let probe: Option<Arc<dyn PathProbe>> = carrier.probe.map(Arc::from);
        if let Some(p) = &probe {
            p.set_floor(longhaul_carrier::LANE_NOTSENT_MIN);
        }
        let counters = Arc::new(LaneCounters::default());
        // Spawned tasks run only once the driver polls them, never in this
        // call: holding the lock here is safe.
        let reader = self.spawn(lane_reader(
            self.clone(),
            carrier.reader,
            limits,
            id,
            counters.clone(),
        ));
        let writer = self.spawn(lane_writer(
            self.clone(),
            carrier.writer,
            id,
            stop.clone(),
            kick.clone(),
            probe.clone(),
            counters.clone(),
        ));
        slot.lanes.push(LaneTasks {
            id,
            number,
            reader,
            writer,
            stop,
            kick,
            probe,
            counters,
        });
        self.lanes_tx.send_replace(slot.lanes.len());
        self.detached_tx.send_replace(false);
        tracing::debug!(peer = %self.peer, lane = number, lanes = slot.lanes.len(), "lane attached");
    }

    /// Stops lane `id`'s tasks (the link layer has let it go); returns its
    /// number.
    pub(crate) fn retire_lane(&self, slot: &mut CarrierSlot, id: CarrierId) -> u8 {
        let Some(i) = slot.lanes.iter().position(|l| l.id == id) else {
            return 0;
        };
        let lane = slot.lanes.remove(i);
        lane.halt();
        self.lanes_tx.send_replace(slot.lanes.len());
        // Kept so that a resume waits for its tasks to end.
        slot.retired.retain(|l| !l.writer.is_finished());
        let number = lane.number;
        slot.retired.push(lane);
        number
    }

    /// Wakes the writers of lanes `ids`.
    pub(crate) fn wake_lanes_of(&self, ids: &[CarrierId]) {
        for l in self.slot().lanes.iter().filter(|l| ids.contains(&l.id)) {
            l.kick.notify_one();
        }
    }

    /// Wakes every lane's writer.
    pub(crate) fn wake_lanes(&self) {
        for l in &self.slot().lanes {
            l.kick.notify_one();
        }
        self.wake_writer.notify_one();
    }

    /// Stops every lane (before a resume) and waits for their tasks.
    pub(crate) async fn stop_lanes(self: &Arc<Self>) -> Result<(), String> {
        let lanes = {
            let mut slot = self.slot();
            let mut all: Vec<LaneTasks> = slot.lanes.drain(..).collect();
            all.append(&mut slot.retired);
            all
        };
        self.lanes_tx.send_replace(0);
        for lane in lanes {
            lane.halt();
            let _ = tokio::time::timeout(STOP_GRACE, lane.reader).await;
            let abort = lane.writer.abort_handle();
            if tokio::time::timeout(STOP_GRACE, lane.writer).await.is_err() {
                // Nothing it writes counts any more (no longer current).
                abort.abort();
            }
        }
        Ok(())
    }

    pub(crate) fn lane_stats(&self) -> Vec<LaneStats> {
        // The probes' TCP_INFO reads happen after the lock is let go.
        let lanes: Vec<LaneView> = self.slot().lanes.iter().map(LaneView::of).collect();
        lanes.iter().map(LaneView::stats).collect()
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
        // The probes' TCP_INFO reads happen after the lock is let go.
        let lanes: Vec<LaneView> = self.slot().lanes.iter().map(LaneView::of).collect();
        let timeouts: Vec<(CarrierId, u8, Duration)> = lanes
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
        let of = |id: CarrierId| {
            timeouts
                .iter()
                .find(|t| t.0 == id)
                .map_or(fallback, |t| t.2)
        };
        let Some(tick) = self.link().map(|mut l| l.on_tick(now, of)) else {
            return;
        };
        if tick.log {
            let numbers: Vec<u8> = tick
                .stalled
                .iter()
                .filter_map(|id| timeouts.iter().find(|t| t.0 == *id).map(|t| t.1))
                .collect();
            tracing::info!(
                peer = %self.peer,
                lanes = ?numbers,
                "lane stalled: its chunks waiting too long go again on the others"
            );
        }
        // Queued datagrams too: a lane that avoided them may take them
        // again now that time has passed (`lane_quiet`).
        if tick.wake_all || self.with(|m, _| m.has_datagrams()) {
            self.wake_lanes();
        }
    }
}
