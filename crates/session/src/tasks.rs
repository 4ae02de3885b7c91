//! The tasks of a session's carriers: what must be stopped when a carrier
//! or lane goes, and the counters its tasks keep. No protocol here: which
//! carrier is current is the link layer's business.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use longhaul_carrier::quic::DatagramPath;
use longhaul_carrier::PathProbe;
use longhaul_proto::link::CarrierId;
use tokio::sync::Notify;

use crate::driver::Task;

/// The tasks of the carrier (or lanes) a session runs on. Which carrier
/// is current, and what losing one means, is the link layer's business
/// (`longhaul_proto::link::LinkLayer`); this is only what must be stopped.
#[derive(Default)]
pub(crate) struct CarrierSlot {
    /// The single carrier's tasks (its id: the link layer's, 0 without).
    pub id: CarrierId,
    pub reader: Option<Task>,
    pub writer: Option<Task>,
    /// Tells the writer to stop (it saves what it had not started).
    pub stop: Option<Arc<Notify>>,
    pub probe: Option<Arc<dyn PathProbe>>,
    /// The single carrier's datagram path, and its reader: the session's
    /// datagrams go there (see `Shared::dispatch`).
    pub datagrams: Option<DatagramPath>,
    pub datagram_reader: Option<Task>,
    /// Datagrams were left in the session's queue (no room on the path):
    /// the datagram reader tries again shortly.
    pub datagram_retry: Arc<Notify>,
    /// A striped session's lanes (the fields above are then unused).
    pub lanes: Vec<LaneTasks>,
    /// Lanes dropped whose tasks may still be ending.
    pub retired: Vec<LaneTasks>,
}

impl CarrierSlot {
    /// The carrier's datagram path is no longer the session's.
    pub fn forget_datagrams(&mut self) {
        self.datagrams = None;
        if let Some(r) = self.datagram_reader.take() {
            r.abort();
        }
    }
}

/// Waits this long at most for a stopped carrier's tasks to end.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(2);

/// Counters of one lane.
#[derive(Default)]
pub(crate) struct LaneCounters {
    pub sent: AtomicU64,
    pub received: AtomicU64,
    pub chunks_resent: AtomicU64,
}

/// One lane's tasks.
pub(crate) struct LaneTasks {
    pub id: CarrierId,
    pub number: u8,
    pub reader: Task,
    pub writer: Task,
    pub stop: Arc<Notify>,
    /// Wakes this lane's writer in particular (chunks to send again may
    /// avoid the lane a shared wake-up would reach).
    pub kick: Arc<Notify>,
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

/// What the stats and the stall check need of a lane, taken under the
/// session lock so that its probe is read after it is let go.
pub(crate) struct LaneView {
    pub id: CarrierId,
    pub number: u8,
    pub probe: Option<Arc<dyn PathProbe>>,
    pub counters: Arc<LaneCounters>,
}

impl LaneView {
    pub fn of(l: &LaneTasks) -> LaneView {
        LaneView {
            id: l.id,
            number: l.number,
            probe: l.probe.clone(),
            counters: l.counters.clone(),
        }
    }

    pub fn stats(&self) -> LaneStats {
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
}

impl LaneTasks {
    pub fn halt(&self) {
        self.reader.abort();
        self.stop.notify_one();
    }
}
