//! The carrier writer: the only task that writes to the carrier.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::FutureExt;
use longhaul_carrier::{BoxWrite, UrgentFlag, UrgentSend};
use longhaul_proto::frame::Frame;
use longhaul_proto::link::CarrierId;
use longhaul_proto::outframe::{advance_batch, OutFrame};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use crate::runtime::Shared;

/// How long the GOODBYE of a closing session may wait for the carrier.
const GOODBYE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);
/// Largest batch the writer hands to one vectored write.
const WRITE_BATCH_BYTES: usize = 1024 * 1024;
/// Batch size while the carrier is backed up (its last write was partial):
/// frames taken out of the scheduler can no longer be overtaken, so take
/// only what is about to fit.
const BACKLOG_BATCH_BYTES: usize = 64 * 1024;
/// Largest number of buffers in one vectored write (well under IOV_MAX).
const MAX_IOV: usize = 64;
/// Frames an idle writer's queue keeps room for.
const IDLE_BATCH: usize = 8;

/// How a writer's run ended.
enum End {
    /// The session is over (the carrier is shut down).
    Closed,
    /// The carrier failed: detach (or close) the session.
    Failed(String),
}

pub(crate) async fn carrier_writer(
    shared: Arc<Shared>,
    mut w: BoxWrite,
    urgent: Option<Box<dyn UrgentSend>>,
    flag: Option<UrgentFlag>,
    id: CarrierId,
    stop: Arc<Notify>,
    resend: Vec<OutFrame>,
) {
    let urgent = Urgency { send: urgent, flag };
    let mut batch: VecDeque<OutFrame> = VecDeque::new();
    let end = tokio::select! {
        biased;
        _ = stop.notified() => None,
        end = write_loop(&shared, &mut w, &urgent, &mut batch, id, resend) => Some(end),
    };
    match end {
        Some(End::Closed) => {
            if shared.resumable {
                // However the session ended here (shutdown, idle timeout, a
                // violation), the peer must not wait for a resume. A frame
                // cut short by the close is finished first, or the GOODBYE
                // would land inside it.
                let bye = Frame::Goodbye.to_bytes().expect("an empty frame");
                let rest: Vec<OutFrame> = batch.drain(..).take_while(|f| f.started).collect();
                let _ = tokio::time::timeout(GOODBYE_GRACE, async {
                    write_frames(&mut w, rest).await?;
                    w.write_all(&bye).await?;
                    w.flush().await
                })
                .await;
            }
            let _ = w.shutdown().await;
        }
        Some(End::Failed(why)) => {
            save_leftover(&shared, batch);
            shared.carrier_failed(id, why);
        }
        // Stopped: the carrier is being replaced or the session closed.
        None => save_leftover(&shared, batch),
    }
}

/// Keeps what the writer took from the multiplexer and had not started,
/// for the next carrier. A started frame is in the replay buffer already;
/// ACKs are made afresh.
fn save_leftover(shared: &Shared, batch: VecDeque<OutFrame>) {
    if let Some(mut l) = shared.link() {
        l.save_leftover(batch);
    }
}

/// Writes `frames` whole (already recorded in the replay buffer).
async fn write_frames(w: &mut BoxWrite, frames: Vec<OutFrame>) -> io::Result<()> {
    let mut frames: VecDeque<OutFrame> = frames.into();
    while !frames.is_empty() {
        let n = w.write_vectored(&iovecs(&frames, usize::MAX)).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        advance_batch(&mut frames, n, |_| {});
    }
    Ok(())
}

async fn write_loop(
    shared: &Arc<Shared>,
    w: &mut BoxWrite,
    urgent: &Urgency,
    batch: &mut VecDeque<OutFrame>,
    id: CarrierId,
    resend: Vec<OutFrame>,
) -> End {
    let failed = |e: io::Error| End::Failed(format!("carrier write failed: {e}"));
    if let Err(e) = write_frames(w, resend).await {
        return failed(e);
    }
    if let Some(mut l) = shared.link() {
        batch.extend(l.take_leftover());
    }
    let mut backed_up = false;
    let mut drained = true;
    let mut dirty = false;
    loop {
        let limit = if backed_up {
            BACKLOG_BATCH_BYTES
        } else {
            WRITE_BATCH_BYTES
        };
        // Streams waiting for queue room are told (`with_conn` dispatches).
        let (dead, goodbye, closing) = shared.with_conn(|c, _| {
            if c.mux().dead().is_some() {
                return (true, None, false);
            }
            if let (Some(f), true) = (&urgent.flag, c.mux().has_new_data()) {
                // This batch leads with a stream that just became active
                // (an interactive request, most likely): it may use the
                // room the carrier keeps free. Lowered after the batch.
                f.store(true, Ordering::Relaxed);
            }
            // Two iovecs per DATA frame (header, payload).
            c.poll_transmit(id, batch, limit, MAX_IOV / 2);
            let m = c.mux();
            drained = !m.has_output();
            let idle = drained && batch.is_empty() && !dirty;
            let bye = m.goodbye_done();
            (
                false,
                bye.filter(|_| idle).map(str::to_owned),
                bye.is_some(),
            )
        });
        if dead {
            return End::Closed;
        }
        if let Some(why) = goodbye {
            // Shutting down, and every CLOSE has been written.
            shared.close(why);
            return End::Closed;
        }
        if batch.is_empty() {
            if dirty {
                // TLS and WebSocket carriers keep bytes in their own
                // buffers until flushed; flush whenever the queue runs dry,
                // but let new work interrupt (a flush may wait on a full
                // socket, and is resumed the next time round). Most flushes
                // finish at once (plain TCP has nothing to flush): then
                // wait for work straight away, the queues were just looked
                // at (a wake-up given meanwhile is kept by the `Notify`).
                let flushed = match w.flush().now_or_never() {
                    Some(r) => r.map(|()| true),
                    None => tokio::select! {
                        biased;
                        r = w.flush() => r.map(|()| false),
                        _ = shared.wake_writer.notified() => continue,
                    },
                };
                match flushed {
                    Err(e) => return End::Failed(format!("carrier flush failed: {e}")),
                    // A flush that waited: look at the queues again. So does
                    // one shutting down: the GOODBYE waits only for the flush,
                    // and nothing else would wake the writer for it.
                    Ok(at_once) => {
                        dirty = false;
                        if !at_once || closing {
                            continue;
                        }
                    }
                }
            }
            // Nothing to send: an idle session keeps a small queue (a bulk
            // transfer grew it to MAX_IOV / 2 frames).
            batch.shrink_to(IDLE_BATCH);
            shared.wake_writer.notified().await;
            continue;
        }
        dirty = true;
        if batch.iter().any(OutFrame::carries_data) {
            shared.moves_again();
        }
        let wrote = write_batch(shared, w, urgent, batch).await;
        if let Some(f) = &urgent.flag {
            f.store(false, Ordering::Relaxed);
        }
        match wrote {
            // Backed up once the carrier takes less than offered; caught up
            // again only when the scheduler has run dry.
            Ok(partial) => backed_up = partial || (backed_up && !drained),
            Err(e) if shared.with(|m, _| m.dead().is_some()) => {
                tracing::debug!(peer = %shared.peer, "writer stopped: {e}");
                return End::Closed;
            }
            Err(e) => return failed(e),
        }
    }
}

/// How urgent frames get past bulk data in a full carrier.
struct Urgency {
    /// Sent directly on the socket (plain TCP).
    send: Option<Box<dyn UrgentSend>>,
    /// Or, under TLS and WebSocket, moved forward in the batch and let
    /// into the room the carrier keeps free in the kernel for them.
    flag: Option<UrgentFlag>,
}

/// What ended one wait of the writer.
enum Step {
    Wrote(usize),
    /// Something was queued while the carrier was full.
    Woken,
    /// Time to try the stuck urgent frames again.
    Retry,
}

/// While urgent frames wait at the front of a full carrier, how often a
/// direct send is retried. Armed only then: ordinary data never waits on it.
const URGENT_RETRY: std::time::Duration = std::time::Duration::from_millis(1);

fn iovecs(batch: &VecDeque<OutFrame>, upto: usize) -> Vec<IoSlice<'_>> {
    let mut slices = Vec::with_capacity(MAX_IOV);
    for f in batch.iter().take(upto) {
        if slices.len() + 2 > MAX_IOV {
            break;
        }
        let h = f.head();
        if !h.is_empty() {
            slices.push(IoSlice::new(h));
        }
        if !f.body.is_empty() {
            slices.push(IoSlice::new(&f.body));
        }
    }
    slices
}

/// Datagrams waiting in a batch ahead of its data, at most.
const URGENT_DATAGRAMS: usize = 8;
/// Bytes of datagrams a batch may move ahead of its data before it has
/// written anything; then at most half of what it writes.
const DATAGRAM_HEADSTART: usize = 16 * 1024;

/// Moves urgent frames queued since the batch was taken to its front:
/// control frames, DATA of streams that just became active, and a few
/// datagrams within `datagram_budget` bytes. Returns how many frames now
/// lead the batch that should go out first, the datagram bytes moved, and
/// whether anything but datagrams moved (only that may use the room the
/// carrier keeps free: a flood of datagrams must not take it).
///
/// Order within a stream is never changed: a frame only moves if no frame
/// of its stream is already in the batch; the first one that cannot move
/// stops the pulling, so the control lane stays first in, first out, and
/// DATA moves only once the control lane is empty. Moved frames go after
/// the control frames and datagrams already at the batch's head, so a
/// flow's datagrams keep their order and follow its OPEN_SUCCESS.
fn pull_urgent(
    shared: &Arc<Shared>,
    batch: &mut VecDeque<OutFrame>,
    datagram_budget: usize,
) -> (usize, usize, bool) {
    let mut urgent: Vec<OutFrame> = Vec::new();
    let mut moved = 0;
    let in_batch = |r: Option<u32>| r.is_some_and(|r| batch.iter().any(|f| f.recipient == Some(r)));
    // Datagrams already waiting in the batch count against the few moved
    // forward: a carrier that takes nothing must not collect them here
    // (the session's queue is their bound).
    let waiting = batch.iter().filter(|f| f.is_datagram()).count();
    shared.with(|m, _| {
        while let Some(f) = m.pop_control_if(|r| !in_batch(r)) {
            urgent.push(f);
        }
        // DATA may only follow the whole control lane (the core checks): an
        // OPEN_SUCCESS still waiting there must reach the peer before its
        // stream's first DATA.
        while urgent.len() < MAX_IOV / 4 {
            let Some(f) = m.pop_new_data_if(|f| !in_batch(f.recipient)) else {
                break;
            };
            urgent.push(f);
        }
        // Datagrams too (never sequenced, never cut): a voice packet must
        // not wait for the bulk data this batch already holds, which on a
        // slow path takes seconds. A few at a time, and no more bytes than
        // the budget, so that a flood of them cannot starve the batch.
        for _ in waiting..URGENT_DATAGRAMS {
            if moved >= datagram_budget {
                break;
            }
            let Some(f) = m.pop_urgent_datagram() else {
                break;
            };
            moved += f.remaining();
            urgent.push(f);
        }
    });
    if urgent.is_empty() {
        return (0, 0, false);
    }
    let control = urgent.iter().any(|f| !f.is_datagram());
    // After a frame already started, and after the control frames and
    // datagrams already leading the batch.
    let started = usize::from(batch.front().is_some_and(|f| f.started));
    let at = started
        + batch
            .iter()
            .skip(started)
            .take_while(|f| f.head().is_empty() || f.is_datagram())
            .count();
    let count = urgent.len();
    for (i, f) in urgent.into_iter().enumerate() {
        batch.insert(at + i, f);
    }
    (at + count, moved, control)
}

/// Writes the whole batch; returns whether the carrier pushed back (some
/// write took less than offered). While the carrier is full, urgent frames
/// queued meanwhile are moved forward and sent directly, without waiting
/// for the runtime to see the socket writable again (or, without a direct
/// path, let into the carrier's reserve with the rest of this batch).
async fn write_batch(
    shared: &Arc<Shared>,
    w: &mut BoxWrite,
    urgency: &Urgency,
    batch: &mut VecDeque<OutFrame>,
) -> io::Result<bool> {
    let urgent = urgency.send.as_deref();
    let watch = urgent.is_some() || urgency.flag.is_some();
    let mut partial = false;
    // Leading frames of the batch that are urgent and not yet fully sent.
    let mut stuck = 0usize;
    // Bytes written, and bytes of datagrams moved ahead of the batch's data
    // (at most half of what is written, past a head start).
    let (mut written, mut moved) = (0usize, 0usize);
    while !batch.is_empty() {
        let step = {
            let slices = iovecs(batch, usize::MAX);
            // Most writes are taken at once: no wait to set up for them (a
            // select arms a timer and a `Notify` wait on every call).
            match w.write_vectored(&slices).now_or_never() {
                Some(r) => Step::Wrote(r?),
                None if !watch => Step::Wrote(w.write_vectored(&slices).await?),
                None => {
                    tokio::select! {
                        biased;
                        r = w.write_vectored(&slices) => Step::Wrote(r?),
                        _ = shared.wake_writer.notified() => Step::Woken,
                        _ = tokio::time::sleep(URGENT_RETRY), if stuck > 0 => Step::Retry,
                    }
                }
            }
        };
        match step {
            Step::Wrote(0) => return Err(io::ErrorKind::WriteZero.into()),
            Step::Wrote(n) => {
                shared.written(batch, n);
                written += n;
                stuck = 0;
            }
            Step::Woken | Step::Retry => {
                let budget = (DATAGRAM_HEADSTART + written / 2).saturating_sub(moved);
                let (pulled, datagrams, control) = pull_urgent(shared, batch, budget);
                moved += datagrams;
                if let (Some(f), true) = (&urgency.flag, control) {
                    // Lowered once this batch is written.
                    f.store(true, Ordering::Relaxed);
                }
                let lead = pulled.max(stuck.min(batch.len()));
                if let (Some(u), true) = (urgent, lead > 0) {
                    let before = batch.len();
                    let sent = u.try_send(&iovecs(batch, lead));
                    match sent {
                        Ok(n) => {
                            shared.written(batch, n);
                            written += n;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    // Frames fully sent left the batch; the rest stay stuck.
                    stuck = lead.saturating_sub(before - batch.len());
                }
                // Wakes from bulk pushes find nothing urgent and just wait
                // again; the outer loop looks at the queues before it sleeps,
                // so consuming the wake here loses no work.
                if shared.with(|m, _| m.dead().is_some()) {
                    return Err(io::Error::other("session closed"));
                }
                continue;
            }
        }
        partial |= !batch.is_empty();
    }
    Ok(partial)
}
