//! A lane's reader and writer (striped sessions, see `lanes`).
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
use longhaul_proto::connection::{Connection, LaneOutput, Received};
use longhaul_proto::frame::{self, DecodeLimits, Frame};
use longhaul_proto::link::CarrierId;
use longhaul_proto::stripe::{chunk_target, CHUNK_MAX};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

use crate::requests::start_work;
use crate::runtime::Shared;
use crate::tasks::LaneCounters;

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

/// Asks the connection for this lane's next chunk.
fn take_job(shared: &Arc<Shared>, id: CarrierId, target: usize) -> LaneOutput {
    let (out, takers) = shared.with_conn(|c, clock| {
        let now = clock.ns();
        let out = c.poll_chunk(id, target, now);
        (out, c.datagram_takers(id, now))
    });
    if !takers.is_empty() {
        // This lane is silent or stalled: the queued datagrams are for the
        // lanes that are not (never one that avoids them too: no kicking
        // back and forth).
        shared.wake_lanes_of(&takers);
    }
    if let LaneOutput::Chunk(c) = &out {
        if c.more && c.len > 0 {
            // Another lane may take the rest. (Only after taking some: a
            // lane that could take nothing must not wake the others into
            // finding nothing either, round and round.)
            shared.wake_writer.notify_one();
        }
    }
    out
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
            LaneOutput::Chunk(mut c) => {
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
            LaneOutput::Idle if dirty => {
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
            LaneOutput::Idle => {
                tokio::select! {
                    _ = shared.wake_writer.notified() => {}
                    _ = kick.notified() => {}
                }
            }
            LaneOutput::Stale => return End::Stopped,
            LaneOutput::Dead => return End::Closed,
            LaneOutput::Goodbye(why) => {
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
                    if !lane_input(&shared, |c, now| c.on_ack(id, received, now)) {
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
                    if !lane_input(&shared, |c, now| c.on_chunk(id, offset, chunk, now)) {
                        return;
                    }
                }
                Ok(Some(f @ Frame::Datagram { .. })) => {
                    if !lane_input(&shared, |c, now| c.on_lane_datagram(id, f, now)) {
                        return;
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

/// Hands what a lane read to the connection (`f`), then starts the work
/// the peer's frames asked for. `false`: stop reading (the lane was
/// replaced, or the session ended).
fn lane_input(shared: &Arc<Shared>, f: impl FnOnce(&mut Connection, u64) -> Received) -> bool {
    let (r, work) = shared.input(f);
    start_work(shared, work);
    match r {
        Received::Taken { wake } => {
            if wake {
                // An ACK is due or owed on every lane (one may be stalled),
                // or room was freed: every lane looks.
                shared.wake_lanes();
            }
            true
        }
        Received::Stale | Received::Ended => false,
    }
}
