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

use bytes::{Bytes, BytesMut};
use longhaul_carrier::BoxRead;
#[cfg(test)]
use longhaul_proto::connection::MAX_PINNED_CHUNKS;
use longhaul_proto::connection::{Pins, Received};
use longhaul_proto::frame;
use longhaul_proto::link::CarrierId;
use tokio::io::AsyncReadExt;

use crate::requests::start_work;
use crate::runtime::Shared;

/// Carrier read buffer size.
pub(crate) const READ_CHUNK: usize = 512 * 1024;
/// A fresh read buffer holding `carry` (an unfinished frame), and its sentinel.
fn fresh_buffer(carry: &[u8]) -> (BytesMut, Bytes) {
    let mut b = BytesMut::with_capacity(READ_CHUNK + carry.len());
    let sentinel = b.split_to(0).freeze();
    b.extend_from_slice(carry);
    (b, sentinel)
}

pub(crate) async fn carrier_reader(shared: Arc<Shared>, mut r: BoxRead, id: CarrierId) {
    let (mut buf, mut sentinel) = fresh_buffer(&[]);
    let mut pins = Pins::default();
    loop {
        match decode_batch(&shared, &mut buf, pins.may_slice(), id) {
            Batch::More => {}
            Batch::End => return,
        }
        if buf.capacity() - buf.len() < frame::MAX_FRAME_LEN {
            // Start a fresh buffer holding only the unfinished frame at the
            // tail (< 64 KiB); growing the old one would copy the frames
            // already handed out of it as well.
            let (b, s) = fresh_buffer(&buf);
            buf = b;
            pins.retire(std::mem::replace(&mut sentinel, s));
        }
        match r.read_buf(&mut buf).await {
            Ok(0) => {
                return shared.carrier_failed(id, "carrier closed by peer".into());
            }
            Ok(_) => {}
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

/// Hands every whole frame in `buf` to the connection, which refuses it
/// all if carrier `id` is no longer current and counts what it hands on
/// in the same call; then starts the work the frames asked for.
fn decode_batch(shared: &Arc<Shared>, buf: &mut BytesMut, may_slice: bool, id: CarrierId) -> Batch {
    let (r, work) = shared.input(|c, now| c.on_bytes(id, buf, may_slice, now));
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
            let (mut b, s) = fresh_buffer(b"abc");
            held.push(b.split_to(1).freeze());
            drop(b);
            pins.retire(s);
        }
        assert!(!pins.may_slice());
        held.pop();
        assert!(pins.may_slice());
        let (b, s) = fresh_buffer(&[]);
        drop(b);
        pins.retire(s);
        assert_eq!(pins.len(), MAX_PINNED_CHUNKS - 1);
    }
}
