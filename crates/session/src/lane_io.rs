//! A lane's reader and writer (striped sessions, see [`crate::lanes`]).
//!
//! Both only move bytes; the link layer decides
//! (`longhaul_proto::link::LinkLayer`). The writer of a lane asks for a
//! chunk whenever its socket has room (the kernel's unsent queue is kept
//! to a few ms of the lane's rate), so lanes that drain faster take more;
//! the link layer gives a chunk some other lane must send again, else the
//! next frames from the multiplexer. The reader reads a chunk's bytes
//! straight into a buffer of their own and hands them in; whichever lane
//! completes the next run decodes its frames.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use longhaul_carrier::{BoxRead, BoxWrite, PathProbe};
use longhaul_proto::frame::{self, DecodeLimits, Frame};
use longhaul_proto::link::{CarrierId, Chunk};
use longhaul_proto::stripe::{chunk_target, CHUNK_MAX};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

use crate::lanes::LaneCounters;
use crate::requests::{connect_for_peer, serve_bind};
use crate::runtime::{Shared, Work};

/// A lane's read buffer between chunks (chunk bytes are read into a
/// buffer of their own).
const LANE_READ: usize = 64 * 1024;
const MAX_IOV: usize = 64;
/// How long the GOODBYE of a closing session may wait for the lane.
const GOODBYE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

enum End {
    Closed,
    Failed(String),
    /// The lane is no longer current (replaced): nothing to do.
    Stopped,
}

/// Bytes ready for a vectored write, in order.
type Pieces = VecDeque<Bytes>;

async fn write_pieces(w: &mut BoxWrite, pieces: &mut Pieces) -> io::Result<()> {
    while !pieces.is_empty() {
        let mut n = {
            let slices: Vec<IoSlice<'_>> = pieces
                .iter()
                .take(MAX_IOV)
                .map(|b| IoSlice::new(b))
                .collect();
            w.write_vectored(&slices).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let Some(front) = pieces.front_mut() else {
                break;
            };
            if front.len() <= n {
                n -= front.len();
                pieces.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
    Ok(())
}

enum Take {
    Job(Chunk),
    Idle,
    Stop,
    Closed,
    Goodbye(String),
}

/// Asks the link layer for this lane's next chunk; the frames come from
/// the multiplexer within the budget it sets (control frames first).
fn take_job(shared: &Arc<Shared>, id: CarrierId, target: usize) -> Take {
    let Some(mut l) = shared.link() else {
        return Take::Stop;
    };
    if !l.is_current(id) {
        return Take::Stop;
    }
    let now = shared.now_ns();
    let mut dead = false;
    let mut goodbye = None;
    let chunk = l.next_chunk(id, target, now, |budget, batch| {
        let carried = !batch.is_empty();
        shared.with(|m, _| {
            if m.dead().is_some() {
                dead = true;
                return false;
            }
            let mut control = 0;
            let mut control_left = true;
            while control < budget.control && batch.len() < budget.frames {
                match m.pop_control_if(|_| true) {
                    Some(f) => {
                        control += f.remaining();
                        batch.push_back(f);
                    }
                    None => {
                        control_left = false;
                        break;
                    }
                }
            }
            if !control_left && budget.bytes > control {
                let frames = budget.frames.saturating_sub(batch.len());
                m.poll_transmit(batch, budget.bytes - control, frames);
            }
            let more = m.has_output();
            goodbye = m
                .goodbye_done()
                .filter(|_| batch.is_empty() && !more && !carried)
                .map(str::to_owned);
            more
        })
    });
    if dead {
        return Take::Closed;
    }
    if let Some(why) = goodbye {
        return Take::Goodbye(why);
    }
    match chunk {
        Some(c) => {
            if c.more && c.len > 0 {
                // Another lane may take the rest. (Only after taking some: a
                // lane that could take nothing must not wake the others into
                // finding nothing either, round and round.)
                shared.wake_writer.notify_one();
            }
            Take::Job(c)
        }
        None => Take::Idle,
    }
}

pub(crate) async fn lane_writer(
    shared: Arc<Shared>,
    mut w: BoxWrite,
    id: CarrierId,
    stop: Arc<Notify>,
    kick: Arc<Notify>,
    probe: Option<Arc<dyn PathProbe>>,
    counters: Arc<LaneCounters>,
) {
    let end = tokio::select! {
        biased;
        _ = stop.notified() => End::Stopped,
        end = lane_loop(&shared, &mut w, id, &kick, probe.as_deref(), &counters) => end,
    };
    match end {
        End::Closed => {
            // One lane tells the peer the session is over, in sequence:
            // after every chunk before it.
            let bye = shared.link().and_then(|mut l| l.goodbye_chunk());
            if let Some(mut pieces) = bye {
                let _ = tokio::time::timeout(GOODBYE_GRACE, async {
                    write_pieces(&mut w, &mut pieces).await?;
                    w.flush().await
                })
                .await;
            }
            let _ = w.shutdown().await;
            // The next lane sees the end too.
            shared.wake_writer.notify_one();
        }
        End::Failed(why) => shared.carrier_failed(id, why),
        End::Stopped => {}
    }
}

async fn lane_loop(
    shared: &Arc<Shared>,
    w: &mut BoxWrite,
    id: CarrierId,
    kick: &Notify,
    probe: Option<&dyn PathProbe>,
    counters: &LaneCounters,
) -> End {
    let failed = |e: io::Error| End::Failed(format!("lane write failed: {e}"));
    let mut dirty = false;
    loop {
        let rate = probe.and_then(|p| p.path()).map_or(0, |p| p.delivery_rate);
        match take_job(shared, id, chunk_target(rate)) {
            Take::Job(mut c) => {
                if let Err(e) = write_pieces(w, &mut c.pieces).await {
                    if shared.is_dead() {
                        return End::Closed;
                    }
                    return failed(e);
                }
                counters.sent.fetch_add(c.len as u64, Ordering::Relaxed);
                if c.resent {
                    counters.chunks_resent.fetch_add(1, Ordering::Relaxed);
                }
                dirty = true;
            }
            Take::Idle if dirty => {
                // TLS and WebSocket keep bytes until flushed; new work may
                // interrupt a flush that waits on a full socket.
                tokio::select! {
                    r = w.flush() => match r {
                        Ok(()) => dirty = false,
                        Err(e) => return End::Failed(format!("lane flush failed: {e}")),
                    },
                    _ = shared.wake_writer.notified() => {}
                    _ = kick.notified() => {}
                }
            }
            Take::Idle => {
                tokio::select! {
                    _ = shared.wake_writer.notified() => {}
                    _ = kick.notified() => {}
                }
            }
            Take::Stop => return End::Stopped,
            Take::Closed => return End::Closed,
            Take::Goodbye(why) => {
                let _ = w.flush().await;
                shared.close(why);
                return End::Closed;
            }
        }
    }
}

pub(crate) async fn lane_reader(
    shared: Arc<Shared>,
    mut r: BoxRead,
    limits: DecodeLimits,
    id: CarrierId,
    counters: Arc<LaneCounters>,
) {
    let mut buf = BytesMut::with_capacity(LANE_READ);
    let violation = |why: String| {
        tracing::warn!(peer = %shared.peer, "closing session: {why}");
        shared.close(why);
    };
    loop {
        loop {
            match frame::decode(&mut buf, limits) {
                Ok(Some(Frame::Ack { received })) => {
                    if !apply_ack(&shared, received) {
                        return;
                    }
                }
                Ok(Some(Frame::Chunk { offset, len })) => {
                    let len = len as usize;
                    if len == 0 || len > CHUNK_MAX {
                        return violation(format!(
                            "chunk of {len} bytes from peer (1..={CHUNK_MAX} allowed)"
                        ));
                    }
                    let mut chunk = BytesMut::with_capacity(len);
                    let have = len.min(buf.len());
                    chunk.extend_from_slice(&buf.split_to(have));
                    while chunk.len() < len {
                        let want = (len - chunk.len()) as u64;
                        match (&mut r).take(want).read_buf(&mut chunk).await {
                            Ok(0) => {
                                return shared.carrier_failed(id, "lane closed by peer".into())
                            }
                            Ok(_) => {}
                            Err(e) => {
                                return shared.carrier_failed(id, format!("lane read failed: {e}"))
                            }
                        }
                    }
                    counters.received.fetch_add(len as u64, Ordering::Relaxed);
                    match deliver(&shared, id, offset, chunk, limits) {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(why) => return violation(why),
                    }
                }
                Ok(Some(f)) => {
                    return violation(format!(
                        "message type {} on a lane outside a chunk",
                        f.type_code()
                    ))
                }
                Ok(None) => break,
                Err(e) => return violation(format!("malformed frame from peer: {e}")),
            }
        }
        if buf.capacity() - buf.len() < LANE_READ / 4 {
            buf.reserve(LANE_READ);
        }
        match r.read_buf(&mut buf).await {
            Ok(0) => return shared.carrier_failed(id, "lane closed by peer".into()),
            Ok(_) => {}
            Err(e) => return shared.carrier_failed(id, format!("lane read failed: {e}")),
        }
    }
}

/// Applies the peer's ACK; `false`: it was impossible and the session is
/// closed.
fn apply_ack(shared: &Arc<Shared>, received: u64) -> bool {
    shared.with(|m, now| m.heard(now));
    let freed = match shared.link().map(|mut l| l.on_ack(received)) {
        None | Some(Ok(false)) => false,
        Some(Ok(true)) => true,
        Some(Err(e)) => {
            let why = format!("bad acknowledgement from peer: {e}");
            tracing::warn!(peer = %shared.peer, "closing session: {why}");
            shared.close(why);
            return false;
        }
    };
    if freed {
        shared.wake_writer.notify_one();
    }
    true
}

/// Hands a chunk to the link layer and the frames of every run now in
/// order to the multiplexer, all under the link lock (so a lane dropped
/// meanwhile cannot have half of it counted). `Ok(false)`: stop reading
/// (the lane was replaced, or the session ended); `Err`: the peer broke
/// the protocol.
fn deliver(
    shared: &Arc<Shared>,
    id: CarrierId,
    offset: u64,
    chunk: BytesMut,
    limits: DecodeLimits,
) -> Result<bool, String> {
    shared.with(|m, now| m.heard(now));
    let mut l = shared.link().ok_or("no link layer")?;
    // Chunk buffers still referenced by queued payloads, for the whole
    // session (one allowance, whatever the number of lanes).
    let mut pins = shared.lane_pins.lock().unwrap_or_else(|p| p.into_inner());
    match l.on_chunk(id, offset, chunk) {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(e) => return Err(format!("bad chunk from peer: {e}")),
    }
    while let Some(mut run) = l.next_run() {
        let may_slice = pins.may_slice();
        let sentinel = run.split_to(0).freeze();
        loop {
            match frame::decode(&mut run, limits) {
                Ok(Some(Frame::Goodbye)) => {
                    drop(pins);
                    drop(l);
                    tracing::info!(peer = %shared.peer, "peer ended the session");
                    shared.peer_goodbye.store(true, Ordering::Relaxed);
                    shared.close("peer ended the session".into());
                    return Ok(false);
                }
                Ok(Some(f @ (Frame::Ack { .. } | Frame::Chunk { .. }))) => {
                    return Err(format!(
                        "link message type {} inside a chunk",
                        f.type_code()
                    ))
                }
                Ok(Some(f)) => {
                    let (end, work) = shared.handle_frame(f, may_slice);
                    for w in work {
                        match w {
                            Work::Connect(open, dest) => connect_for_peer(shared, open, dest),
                            Work::Bind(request, bind, dest) => {
                                serve_bind(shared, request, bind, dest)
                            }
                        }
                    }
                    if end {
                        return Ok(false);
                    }
                }
                Ok(None) => break,
                Err(e) => return Err(format!("malformed frame from peer: {e}")),
            }
        }
        if !run.is_empty() {
            return Err("a chunk from the peer ends inside a frame".into());
        }
        pins.retire(sentinel);
    }
    let due = l.ack_wanted();
    drop(pins);
    drop(l);
    if due {
        shared.wake_writer.notify_one();
    }
    Ok(true)
}
