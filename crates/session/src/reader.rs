//! The carrier reader: decodes frames and hands each to the session core.
//!
//! DATA payloads leave as slices of the reader's buffer (no copy), and a
//! slice keeps its whole buffer alive. So the reader counts the buffers it
//! has retired that are still held by someone ([`Pins`]); past a fixed
//! allowance it stops handing out slices (payloads are copied) until enough
//! of them have been let go. Together with the inbound queues' own rule (a
//! stalled stream holds copies, not slices), the memory the carrier's
//! buffers take is bounded whatever frames the peer sends.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use longhaul_carrier::cushion::PAUSED;
use longhaul_carrier::quic::DatagramPath;
use longhaul_carrier::BoxRead;
#[cfg(test)]
use longhaul_proto::connection::MAX_PINNED_CHUNKS;
use longhaul_proto::connection::{Pins, Received};
use longhaul_proto::frame;
use longhaul_proto::link::CarrierId;
use tokio::io::AsyncReadExt;

use crate::requests::start_work;
use crate::runtime::Shared;

/// Carrier read buffer size while data streams in.
pub(crate) const READ_CHUNK: usize = 512 * 1024;
/// Read buffer size while the carrier idles or trickles: what an idle
/// session keeps (at most, and only the pages its reads touched).
const QUIET_CHUNK: usize = 8 * 1024;
/// This many small reads in a row (each under half of [`QUIET_CHUNK`])
/// and the big buffer is let go; or one small read after a pause of
/// [`PAUSED`] (a quiet session's keepalives come tens of seconds apart).
const QUIET_AFTER: u32 = 8;

/// A fresh read buffer of `size` bytes more than `carry` (an unfinished
/// frame), holding `carry`, and its sentinel.
fn fresh_buffer(carry: &[u8], size: usize) -> (BytesMut, Bytes) {
    let mut b = BytesMut::with_capacity(size + carry.len());
    let sentinel = b.split_to(0).freeze();
    b.extend_from_slice(carry);
    (b, sentinel)
}

pub(crate) async fn carrier_reader(shared: Arc<Shared>, mut r: BoxRead, id: CarrierId) {
    let (mut buf, mut sentinel) = fresh_buffer(&[], QUIET_CHUNK);
    let mut size = QUIET_CHUNK;
    // Reads come in big (one filled the buffer's room); small reads in a row.
    let mut streaming = false;
    let mut small_reads = 0u32;
    let mut pins = Pins::default();
    // The last read was big: data moves (told once it is decoded and
    // counted, so the timer sees it).
    let mut moving = false;
    let mut last_read = std::time::Instant::now();
    loop {
        match decode_batch(&shared, &mut buf, pins.may_slice(), id) {
            Batch::More => {}
            Batch::End => return,
        }
        if std::mem::take(&mut moving) {
            shared.moves_again();
        }
        let want = if streaming { READ_CHUNK } else { QUIET_CHUNK };
        let room = buf.capacity() - buf.len();
        let low = room
            < if streaming {
                2 * frame::MAX_FRAME_LEN
            } else {
                QUIET_CHUNK / 4
            };
        // A big buffer is read into up to a frame's length short of its
        // end; near that, only up to the end of the unfinished frame (which
        // then fits: a frame is at most MAX_FRAME_LEN), so that the next
        // buffer starts on a frame and nothing is copied over (the copy was
        // ≈ 6 % of a bulk receiver's bytes, a memmove in its profile). The
        // room left unread is never touched: it costs no memory.
        let finish = match (low && size == want && streaming, frame::declared_len(&buf)) {
            (true, Some(len)) if len > buf.len() && len - buf.len() <= room => len - buf.len(),
            _ => 0,
        };
        if finish == 0 && (low || size != want) {
            // Start a fresh buffer holding only the unfinished frame at the
            // tail (< 64 KiB); growing the old one would copy the frames
            // already handed out of it as well. A quiet carrier's buffer is
            // small: an idle session holds no big one.
            let (b, s) = fresh_buffer(&buf, want);
            buf = b;
            size = want;
            pins.retire(std::mem::replace(&mut sentinel, s));
        }
        let room = buf.capacity() - buf.len();
        if finish > 0 {
            match r.read_buf(&mut (&mut buf).limit(finish)).await {
                Ok(0) => return shared.carrier_failed(id, "carrier closed by peer".into()),
                // Counted neither big nor small: the read was cut short.
                // Nor as moving: a trickled unfinished frame would wake a
                // quiet timer for every piece.
                Ok(_) => {}
                Err(e) => {
                    return shared.carrier_failed(id, format!("carrier read failed: {e}"));
                }
            }
            continue;
        }
        let ask = match size == READ_CHUNK {
            // A big buffer that is not low has at least two frames' room.
            true => {
                debug_assert!(room > frame::MAX_FRAME_LEN);
                room.saturating_sub(frame::MAX_FRAME_LEN)
            }
            false => room,
        };
        let read = r.read_buf(&mut (&mut buf).limit(ask)).await;
        let now = std::time::Instant::now();
        let paused = now.duration_since(last_read) >= PAUSED;
        last_read = now;
        match read {
            Ok(0) => {
                return shared.carrier_failed(id, "carrier closed by peer".into());
            }
            Ok(n) if n >= ask => (streaming, small_reads, moving) = (true, 0, true),
            Ok(n) if n < QUIET_CHUNK / 2 => {
                small_reads += 1;
                if small_reads >= QUIET_AFTER || paused {
                    streaming = false;
                }
            }
            Ok(_) => (small_reads, moving) = (0, true),
            Err(e) => {
                return shared.carrier_failed(id, format!("carrier read failed: {e}"));
            }
        }
    }
}

enum Batch {
    More,
    End,
}

/// How soon datagrams left in the session's queue (no room on the path)
/// are tried again, when nothing else comes first.
const DATAGRAM_RETRY: std::time::Duration = std::time::Duration::from_millis(2);

/// Reads carrier `id`'s datagram path: each message is one DATAGRAM
/// frame of a UDP flow. Ends with the path (the carrier's reader reports
/// why) or once the carrier is no longer current. Also tries again to
/// send what had no room on the path when `retry` is told.
pub(crate) async fn datagram_reader(
    shared: Arc<Shared>,
    path: DatagramPath,
    retry: Arc<tokio::sync::Notify>,
    id: CarrierId,
) {
    // The retry's wait runs beside the reads, never instead of them.
    let mut retry_at: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        // (A read cancelled by the retry takes nothing.)
        let msg = tokio::select! {
            m = path.recv() => m,
            _ = retry.notified(), if retry_at.is_none() => {
                retry_at = Some(Box::pin(tokio::time::sleep(DATAGRAM_RETRY)));
                continue;
            }
            _ = async { retry_at.as_mut().expect("guarded").await }, if retry_at.is_some() => {
                retry_at = None;
                // Any call under the session lock sends what has room.
                shared.with_conn_quiet(|_, _| ());
                continue;
            }
        };
        let Some(msg) = msg else {
            return;
        };
        let (r, work) = shared.input(|c, now| c.on_path_datagram(id, msg, now));
        debug_assert!(work.is_empty(), "a DATAGRAM asks for no work");
        match r {
            Received::Taken { .. } => shared.moves_again(),
            Received::Stale | Received::Ended => return,
        }
    }
}

/// Hands every whole frame in `buf` to the connection, which refuses it
/// all if carrier `id` is no longer current and counts what it hands on
/// in the same call; then starts the work the frames asked for.
fn decode_batch(shared: &Arc<Shared>, buf: &mut BytesMut, may_slice: bool, id: CarrierId) -> Batch {
    let mut data = false;
    let (r, work) = shared.input(|c, now| {
        let before = c.mux().stats().bytes_received;
        let r = c.on_bytes(id, buf, may_slice, now);
        data = c.mux().stats().bytes_received != before;
        r
    });
    if data {
        // Even a byte of DATA ends a quiet session's rare PINGs at once:
        // the peer that sent it counts on our PINGs at the usual pace.
        shared.moves_again();
    }
    start_work(shared, work);
    match r {
        Received::Taken { wake } => {
            if wake {
                shared.wake_writer.notify_one();
            }
            Batch::More
        }
        Received::Stale | Received::Ended => Batch::End,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retired_buffer_counts_until_its_last_slice_is_gone() {
        let mut pins = Pins::default();
        let mut held = vec![];
        for _ in 0..MAX_PINNED_CHUNKS {
            let (mut b, s) = fresh_buffer(b"abc", READ_CHUNK);
            held.push(b.split_to(1).freeze());
            drop(b);
            pins.retire(s);
        }
        assert!(!pins.may_slice());
        held.pop();
        assert!(pins.may_slice());
        let (b, s) = fresh_buffer(&[], READ_CHUNK);
        drop(b);
        pins.retire(s);
        assert_eq!(pins.len(), MAX_PINNED_CHUNKS - 1);
    }
}
