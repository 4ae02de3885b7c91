//! A lane's reader and writer (striped sessions, see [`crate::lanes`]).
//!
//! The writer of a lane takes work when its socket has room (the kernel's
//! unsent queue is kept to a few ms of the lane's rate), so lanes that
//! drain faster take more: first a chunk some other lane must send again,
//! else the next frames from the multiplexer, recorded in the replay buffer
//! and in the record of chunks in flight at once, under the link lock, so
//! offsets follow the order the multiplexer produced. The reader reads a
//! chunk's bytes straight into a buffer of their own and hands them to the
//! reorder buffer; whichever lane completes the next run decodes its
//! frames.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use longhaul_carrier::{BoxRead, BoxWrite, PathProbe};
use longhaul_proto::frame::{self, DecodeLimits, Frame, DATA_HEADER_LEN, MAX_FRAME_LEN};
use longhaul_proto::outframe::OutFrame;
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
/// Frames one chunk may carry.
const MAX_CHUNK_FRAMES: usize = 64;
/// Bytes a chunk is filled to at most before its last frame (which may
/// overshoot by one frame).
const CHUNK_FILL: usize = CHUNK_MAX - MAX_FRAME_LEN;
/// Smallest part of a DATA frame cut off to fill a chunk.
const MIN_SPLIT: usize = 1024;
/// How long the GOODBYE of a closing session may wait for the lane.
const GOODBYE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

enum End {
    Closed,
    Failed(String),
    /// The lane is no longer live (replaced): nothing to do.
    Stopped,
}

/// Bytes ready for a vectored write, in order.
type Pieces = VecDeque<Bytes>;

/// An optional ACK, then a chunk of `frames` from `offset` on.
fn chunk_pieces(ack: Option<Frame>, offset: u64, frames: Vec<OutFrame>) -> (Pieces, usize) {
    let len: usize = frames.iter().map(OutFrame::remaining).sum();
    let mut pieces = VecDeque::with_capacity(2 * frames.len() + 2);
    if let Some(a) = ack {
        pieces.push_back(a.to_bytes().expect("a fixed frame"));
    }
    if len > 0 {
        let header = Frame::Chunk {
            offset,
            len: len as u32,
        };
        pieces.push_back(header.to_bytes().expect("a fixed frame"));
        for f in frames {
            if !f.head().is_empty() {
                pieces.push_back(Bytes::copy_from_slice(f.head()));
            }
            if !f.body.is_empty() {
                pieces.push_back(f.body);
            }
        }
    }
    (pieces, len)
}

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
    /// Pieces to write, and the chunk bytes among them.
    Job(Pieces, usize, bool),
    Idle,
    Stop,
    Closed,
    Goodbye(String),
}

/// Takes this lane's next work under the link lock (see the module notes).
fn take_job(shared: &Arc<Shared>, id: u64, target: usize) -> Take {
    let Some(mut g) = shared.link() else {
        return Take::Stop;
    };
    let l = &mut *g;
    let Some(s) = l.stripes.as_mut() else {
        return Take::Stop;
    };
    if !s.live.contains(&id) {
        return Take::Stop;
    }
    let now = shared.now_ns();
    let mut frames = Vec::new();
    let mut offset = 0;
    let mut resent = false;
    while let Some(r) = s.flight.take_resend(id) {
        let (at, fr) = l.replay.range(r.from, r.to);
        if !fr.is_empty() {
            s.flight.resending(at, id, now);
            offset = at;
            frames = fr;
            resent = true;
            break;
        }
    }
    if frames.is_empty() {
        // Never more unacknowledged than the peer's reorder window.
        let limit = target.min(CHUNK_FILL).min(l.replay.room());
        let mut batch = VecDeque::new();
        let mut goodbye = None;
        let mut more = false;
        let mut bytes = 0;
        if limit > 0 {
            if let Some(c) = s.carry.take() {
                bytes = c.remaining();
                batch.push_back(c);
            }
        }
        let carried = !batch.is_empty();
        let dead = shared.with(|m, _| {
            if m.dead().is_some() {
                return true;
            }
            if limit > bytes {
                let mut control_left = true;
                while bytes < limit && batch.len() < MAX_CHUNK_FRAMES {
                    match m.pop_control_if(|_| true) {
                        Some(f) => {
                            bytes += f.remaining();
                            batch.push_back(f);
                        }
                        None => {
                            control_left = false;
                            break;
                        }
                    }
                }
                if !control_left {
                    m.poll_transmit(&mut batch, limit - bytes.min(limit), MAX_CHUNK_FRAMES);
                }
            }
            more = m.has_output();
            goodbye = m
                .goodbye_done()
                .filter(|_| batch.is_empty() && !more && !carried)
                .map(str::to_owned);
            false
        });
        if dead {
            return Take::Closed;
        }
        fit_to_chunk(&mut batch, limit, &mut s.carry);
        more |= s.carry.is_some();
        if let Some(why) = goodbye {
            return Take::Goodbye(why);
        }
        offset = l.replay.sent();
        for f in &batch {
            l.replay.record(f);
        }
        let len = (l.replay.sent() - offset) as usize;
        if len > 0 {
            s.flight.sent(offset, len, id, now);
        }
        frames = batch.into();
        if !frames.is_empty() && (more || s.flight.has_resend()) {
            // Another lane may take the rest. (Only after taking some: a
            // lane that could take nothing must not wake the others into
            // finding nothing either, round and round.)
            shared.wake_writer.notify_one();
        }
    }
    let ack = if !frames.is_empty() || l.rx.ack_due() || s.ack_now {
        s.ack_now = false;
        l.rx.take_ack()
    } else {
        None
    };
    if frames.is_empty() && ack.is_none() {
        return Take::Idle;
    }
    let (pieces, len) = chunk_pieces(ack, offset, frames);
    Take::Job(pieces, len, resent)
}

/// Cuts the chunk at `limit` bytes: a DATA frame reaching past it is split
/// there (a 64 KiB frame would otherwise hold a slow lane for a long time),
/// the rest kept in `carry` for the next chunk.
fn fit_to_chunk(batch: &mut VecDeque<OutFrame>, limit: usize, carry: &mut Option<OutFrame>) {
    let total: usize = batch.iter().map(OutFrame::remaining).sum();
    if total <= limit {
        return;
    }
    let Some(last) = batch.back_mut() else {
        return;
    };
    let before = total - last.remaining();
    let keep = limit.saturating_sub(before + DATA_HEADER_LEN);
    if keep >= MIN_SPLIT {
        if let Some(first) = last.split_data(keep) {
            *carry = batch.pop_back();
            batch.push_back(first);
        }
    } else if before > 0 && !last.started {
        // Too little room left to be worth a frame: all of it next time.
        *carry = batch.pop_back();
    }
}

pub(crate) async fn lane_writer(
    shared: Arc<Shared>,
    mut w: BoxWrite,
    id: u64,
    stop: Arc<Notify>,
    probe: Option<Arc<dyn PathProbe>>,
    counters: Arc<LaneCounters>,
    resend: (Vec<OutFrame>, u64),
) {
    let end = tokio::select! {
        biased;
        _ = stop.notified() => End::Stopped,
        end = lane_loop(&shared, &mut w, id, probe.as_deref(), &counters, resend) => end,
    };
    match end {
        End::Closed => {
            // One lane tells the peer the session is over, in sequence:
            // after every chunk before it.
            let bye = shared.link().and_then(|mut l| {
                let sent = l.replay.sent();
                let s = l.stripes.as_mut()?;
                (!std::mem::replace(&mut s.goodbye_sent, true)).then_some(sent)
            });
            if let Some(offset) = bye {
                let body = Frame::Goodbye.to_bytes().expect("an empty frame");
                let mut pieces: Pieces = [
                    Frame::Chunk {
                        offset,
                        len: body.len() as u32,
                    }
                    .to_bytes()
                    .expect("a fixed frame"),
                    body,
                ]
                .into();
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
    id: u64,
    probe: Option<&dyn PathProbe>,
    counters: &LaneCounters,
    (resend, from): (Vec<OutFrame>, u64),
) -> End {
    let failed = |e: io::Error| End::Failed(format!("lane write failed: {e}"));
    // After a resume: what the peer missed, in new chunks.
    let mut at = from;
    let mut group: Vec<OutFrame> = Vec::new();
    let mut size = 0;
    let mut resend = resend.into_iter().peekable();
    while let Some(f) = resend.next() {
        size += f.remaining();
        group.push(f);
        let full = size >= CHUNK_FILL || group.len() >= MAX_CHUNK_FRAMES;
        if !full && resend.peek().is_some() {
            continue;
        }
        {
            let Some(mut l) = shared.link() else {
                return End::Stopped;
            };
            let Some(s) = l.stripes.as_mut().filter(|s| s.live.contains(&id)) else {
                return End::Stopped;
            };
            s.flight.sent(at, size, id, shared.now_ns());
        }
        let (mut pieces, len) = chunk_pieces(None, at, std::mem::take(&mut group));
        if let Err(e) = write_pieces(w, &mut pieces).await {
            return failed(e);
        }
        counters.sent.fetch_add(len as u64, Ordering::Relaxed);
        at += size as u64;
        size = 0;
    }
    let mut dirty = false;
    loop {
        let rate = probe.and_then(|p| p.path()).map_or(0, |p| p.delivery_rate);
        match take_job(shared, id, chunk_target(rate)) {
            Take::Job(mut pieces, len, resent) => {
                if let Err(e) = write_pieces(w, &mut pieces).await {
                    if shared.is_dead() {
                        return End::Closed;
                    }
                    return failed(e);
                }
                counters.sent.fetch_add(len as u64, Ordering::Relaxed);
                if resent {
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
                }
            }
            Take::Idle => shared.wake_writer.notified().await,
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
    id: u64,
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
    let freed = {
        let Some(mut g) = shared.link() else {
            return true;
        };
        let l = &mut *g;
        if received <= l.replay.acked() {
            // ACKs on different lanes overtake each other: an older one is
            // no news.
            return true;
        }
        match l.replay.ack(received) {
            Ok(freed) => {
                if let Some(s) = l.stripes.as_mut() {
                    s.flight.acked(l.replay.acked());
                }
                freed
            }
            Err(e) => {
                drop(g);
                let why = format!("bad acknowledgement from peer: {e}");
                tracing::warn!(peer = %shared.peer, "closing session: {why}");
                shared.close(why);
                return false;
            }
        }
    };
    if freed {
        shared.wake_writer.notify_one();
    }
    true
}

/// Puts a chunk in the reorder buffer and hands on every run now in order.
/// `Ok(false)`: stop reading (the lane was replaced, or the session
/// ended); `Err`: the peer broke the protocol.
fn deliver(
    shared: &Arc<Shared>,
    id: u64,
    offset: u64,
    chunk: BytesMut,
    limits: DecodeLimits,
) -> Result<bool, String> {
    shared.with(|m, now| m.heard(now));
    let mut g = shared.link().ok_or("no link layer")?;
    let l = &mut *g;
    let s = l.stripes.as_mut().ok_or("no stripes")?;
    if !s.live.contains(&id) {
        return Ok(false);
    }
    s.reorder
        .insert(offset, chunk)
        .map_err(|e| format!("bad chunk from peer: {e}"))?;
    while let Some(mut run) = s.reorder.pop() {
        let len = run.len();
        let may_slice = s.pins.may_slice();
        let sentinel = run.split_to(0).freeze();
        loop {
            match frame::decode(&mut run, limits) {
                Ok(Some(Frame::Goodbye)) => {
                    drop(g);
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
        l.rx.on_frame(len);
        s.pins.retire(sentinel);
    }
    let due = l.rx.ack_due();
    drop(g);
    if due {
        shared.wake_writer.notify_one();
    }
    Ok(true)
}
