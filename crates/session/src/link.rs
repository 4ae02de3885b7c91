//! The runtime side of the link layer: the tasks of the carrier a session
//! runs on, stopping them when it drops, and starting the next one's.
//!
//! Every decision is the link layer's (`longhaul_proto::link::LinkLayer`):
//! it names each carrier by an id, refuses input from one that is no
//! longer current, and says what a loss means. When the last carrier fails
//! — read or write error, EOF without GOODBYE, or a silent peer — a
//! resumable session is **detached**: its tasks stop, the multiplexer's
//! timers pause, and every stream stays as it is (pumps stop once windows
//! and queues fill). A new carrier is attached after the resume exchange
//! (`resume`): the replay buffer's unacknowledged frames go out
//! first, then what the old writer had taken from the multiplexer but not
//! started. A session without a link layer (JMUX, `--stdio`, a peer
//! without resume) closes on a carrier failure, as before.

use std::sync::{Arc, MutexGuard};

use longhaul_carrier::Carrier;
use longhaul_proto::connection::Loss;
use longhaul_proto::frame::DecodeLimits;
use longhaul_proto::link::{CarrierId, LinkLayer, Lost, DEFAULT_REPLAY_LIMIT};
use longhaul_proto::outframe::OutFrame;
use tokio::sync::Notify;

use crate::reader::{carrier_reader, datagram_reader};
use crate::runtime::{Shared, State};
use crate::tasks::{CarrierSlot, STOP_GRACE};
use crate::writer::carrier_writer;

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

/// The carrier's tasks, under the session lock.
pub(crate) struct SlotGuard<'a>(MutexGuard<'a, State>);

impl std::ops::Deref for SlotGuard<'_> {
    type Target = CarrierSlot;
    fn deref(&self) -> &CarrierSlot {
        &self.0.slot
    }
}

impl std::ops::DerefMut for SlotGuard<'_> {
    fn deref_mut(&mut self) -> &mut CarrierSlot {
        &mut self.0.slot
    }
}

/// The link layer of a resumable session, held under the session lock.
pub(crate) struct LinkGuard<'a>(MutexGuard<'a, State>);

impl std::ops::Deref for LinkGuard<'_> {
    type Target = LinkLayer;
    fn deref(&self) -> &LinkLayer {
        self.0.conn().link().expect("checked when made")
    }
}

impl std::ops::DerefMut for LinkGuard<'_> {
    fn deref_mut(&mut self) -> &mut LinkLayer {
        self.0.conn_mut().link_mut().expect("checked when made")
    }
}

/// Whether carrier `id` is still current (always, without a link layer):
/// asked under the session lock before a carrier's tasks start, so that
/// one lost between its attach and this point (a silence found meanwhile)
/// gets no tasks, and the session stays detached for a resume, as the
/// link layer says.
pub(crate) fn still_current(st: &State, id: CarrierId) -> bool {
    st.conn().link().is_none_or(|l| l.is_current(id))
}

impl Shared {
    /// The link layer, under the session lock (resumable sessions; takes
    /// the lock: never call it while holding that).
    pub(crate) fn link(&self) -> Option<LinkGuard<'_>> {
        let st = self.lock();
        st.conn().link().is_some().then_some(LinkGuard(st))
    }

    /// The carrier's tasks (takes the session lock: never call it while
    /// holding that).
    pub(crate) fn slot(&self) -> SlotGuard<'_> {
        SlotGuard(self.lock())
    }

    /// Starts the reader and writer of carrier `id` (the link layer's id
    /// for it; 0 without a link layer). `resend`: frames from the replay
    /// buffer to write first.
    pub(crate) fn spawn_carrier(
        self: &Arc<Self>,
        carrier: Carrier,
        id: CarrierId,
        resend: Vec<OutFrame>,
    ) {
        let mut st = self.lock();
        if !still_current(&st, id) {
            return;
        }
        // The kernel watches the carrier while PINGs are rare.
        let watched = st.conn().mux().has_quiet_keepalive();
        let slot = &mut st.slot;
        slot.id = id;
        let stop = Arc::new(Notify::new());
        slot.probe = carrier.probe.map(Arc::from);
        if let (Some(p), true) = (&slot.probe, watched) {
            p.watch(self.config.keepalive, self.config.dead_after);
        }
        // Spawned tasks run only once the driver polls them, never in this
        // call: holding the lock here is safe.
        slot.reader = Some(self.spawn(carrier_reader(self.clone(), carrier.reader, id)));
        slot.writer = Some(self.spawn(carrier_writer(
            self.clone(),
            carrier.writer,
            carrier.urgent,
            carrier.urgent_flag,
            id,
            stop.clone(),
            resend,
        )));
        slot.stop = Some(stop);
        // UDP flows' datagrams go on the carrier's datagram path if it has
        // one, else in the byte stream.
        slot.forget_datagrams();
        if let Some(path) = carrier.datagrams {
            path.claim();
            let retry = slot.datagram_retry.clone();
            let reader = datagram_reader(self.clone(), path.clone(), retry, id);
            slot.datagram_reader = Some(self.spawn(reader));
            slot.datagrams = Some(path);
        }
        let on = slot.datagrams.is_some();
        st.conn_mut().use_datagram_path(on);
        // What was queued while the session had no path goes now.
        send_path_datagrams(&mut st, self.now_ns());
        // Under the session lock, so that a failure of this very carrier
        // (which takes the lock) is published after this, never before.
        self.detached_tx.send_replace(false);
    }

    /// Carrier (or lane) `id` failed. The link layer says what that means:
    /// nothing (it was not current), a lane gone (the others go on), or
    /// the session detached, waiting for a resume. Any session without a
    /// link layer closes.
    pub(crate) fn carrier_failed(self: &Arc<Self>, id: CarrierId, why: String) {
        // One lock for the decision and the tasks it stops: no other
        // carrier's tasks can start or fail in between.
        let mut st = self.lock();
        let now = self.now_ns();
        let loss = st.conn_mut().carrier_lost(id, now, &why);
        let r = st
            .conn()
            .link()
            .map(|l| (l.replay().held(), l.replay().sent()));
        let (held, sent) = r.unwrap_or_default();
        self.dispatch_quiet(&mut st);
        match loss {
            Loss::Closed => {
                drop(st);
                tracing::info!(peer = %self.peer, "{why}");
            }
            Loss::Link(Lost::Stale) => {}
            Loss::Link(Lost::Lane { left, resent }) => {
                let number = self.retire_lane(&mut st.slot, id);
                drop(st);
                // Its chunks wait for the others; every lane looks.
                self.wake_lanes();
                tracing::warn!(
                    peer = %self.peer,
                    lane = number,
                    lanes_left = left,
                    chunks_resent = resent,
                    "lane lost ({why}); the session goes on over the others"
                );
            }
            Loss::Link(Lost::Detached) => {
                let slot = &mut st.slot;
                if self.striped {
                    self.retire_lane(slot, id);
                } else {
                    slot.probe = None;
                    slot.forget_datagrams();
                    st.conn_mut().use_datagram_path(false);
                    let slot = &mut st.slot;
                    if let Some(r) = &slot.reader {
                        r.abort();
                    }
                    if let Some(s) = &slot.stop {
                        s.notify_one();
                    }
                }
                self.detached_tx.send_replace(true);
                // Its deadlines changed (the server's resume timeout).
                self.timer_woken.notify_one();
                drop(st);
                tracing::warn!(
                    peer = %self.peer,
                    unacknowledged = held,
                    sent,
                    "carrier lost ({why}); the session is kept for a resume"
                );
            }
        }
    }

    /// Every carrier (or lane) now attached is lost.
    pub(crate) fn drop_carriers(self: &Arc<Self>, why: &str) {
        let ids: Vec<CarrierId> = {
            let st = self.lock();
            match st.conn().link() {
                Some(l) => l.carriers().into_iter().map(|c| c.0).collect(),
                None => vec![st.slot.id],
            }
        };
        for id in ids {
            self.carrier_failed(id, why.to_owned());
        }
    }

    /// Stops the current carrier, if any (a detached session's last one
    /// may still be finishing), and waits until its tasks are gone: what
    /// the writer had not started is saved. Called before every resume.
    /// (Whatever an old reader still hands in is refused by the link
    /// layer; a writer that does not stop in time would take frames with
    /// it: the session is closed instead.)
    pub(crate) async fn stop_carrier(self: &Arc<Self>, why: &str) -> Result<(), String> {
        self.drop_carriers(why);
        if self.striped {
            return self.stop_lanes().await;
        }
        let (reader, writer) = {
            let mut slot = self.slot();
            (slot.reader.take(), slot.writer.take())
        };
        if let Some(r) = reader {
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
        quiet_keepalive: Option<std::time::Duration>,
        peer_received: u64,
    ) -> Result<u64, longhaul_proto::link::LinkError> {
        let (id, resend, outage, bytes) = self.with_conn(|c, clock| {
            let now = clock.ns();
            let (outage, before) = c
                .link()
                .map(|l| (l.detached_for(now), l.replayed()))
                .unwrap_or_default();
            let (id, resend) = c.resume(0, peer_received, now)?;
            // As the hello on the new carrier agreed.
            c.set_limits(limits);
            c.mux_mut().set_quiet_keepalive(quiet_keepalive);
            let bytes = c.link().map_or(0, |l| l.replayed()) - before;
            Ok::<_, longhaul_proto::link::LinkError>((id, resend, outage, bytes))
        })?;
        // A silence found on the old carrier is not this one's.
        let _ = self.take_silent();
        // The new carrier is pinged and its path sampled at once.
        self.timer_woken.notify_one();
        if self.striped {
            self.spawn_lane(carrier, limits, id, 0);
        } else {
            self.spawn_carrier(carrier, id, resend);
        }
        // A client says it in its own words (the reconnect's line): one
        // line per resume.
        let outage = outage.unwrap_or_default();
        if self.with(|m, _| m.is_answer_only()) {
            tracing::info!(peer = %self.peer, ?outage, replayed = bytes, "session resumed on a new carrier");
        } else {
            tracing::debug!(peer = %self.peer, ?outage, replayed = bytes, "session resumed on a new carrier");
        }
        Ok(bytes)
    }
}

/// Hands the datagrams queued for the carrier's datagram path to it (see
/// `CarrierSlot::datagrams`): at once, whatever the byte stream's writer
/// is waiting for, within the share the byte stream leaves them
/// (`Connection::path_room`) and the room the path has. The rest waits in
/// the session's queue (bounded, drops counted) for the next call: the
/// next input or batch, or the datagram reader's retry. One too large for
/// the path now goes in the stream; one the path refuses is counted as
/// dropped.
pub(crate) fn send_path_datagrams(st: &mut State, now: u64) {
    if st.slot.datagrams.is_none() || !st.conn().mux().has_path_datagrams() {
        return;
    }
    // (A handle: the connection is borrowed mutably below.)
    let Some(path) = st.slot.datagrams.clone() else {
        return;
    };
    let max = path.max_size();
    let mut room = st.conn_mut().path_room(now).min(path.buffer_space());
    while let Some(m) = st.conn_mut().pop_path_datagram(max, &mut room) {
        if !path.send(m) {
            st.conn_mut().mux_mut().datagram_not_sent();
        }
    }
    if st.conn().mux().has_path_datagrams() {
        st.slot.datagram_retry.notify_one();
    }
}
