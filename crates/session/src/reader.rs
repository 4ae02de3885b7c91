//! The carrier reader: decodes frames and hands each to the session core.
//!
//! DATA payloads leave as slices of the reader's buffer (no copy), and a
//! slice keeps its whole buffer alive. So the reader counts the buffers it
//! has retired that are still held by someone ([`Pins`]); past a fixed
//! allowance it stops handing out slices (payloads are copied) until enough
//! of them have been let go. Together with the inbound queues' own rule (a
//! stalled stream holds copies, not slices), the memory the carrier's
//! buffers take is bounded whatever frames the peer sends.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use longhaul_carrier::BoxRead;
use longhaul_proto::frame::{self, DecodeLimits, Frame};
use longhaul_proto::link::{CarrierId, Input};
use tokio::io::AsyncReadExt;

use crate::requests::{connect_for_peer, serve_bind};
use crate::runtime::{Shared, Work};

/// Carrier read buffer size.
pub(crate) const READ_CHUNK: usize = 512 * 1024;
/// Retired read buffers that may stay alive through slices before payloads
/// are copied instead: 16 × 512 KiB = 8 MiB per session.
pub(crate) const MAX_PINNED_CHUNKS: usize = 16;

/// Retired read buffers still referenced by queued payloads.
#[derive(Default)]
pub(crate) struct Pins {
    /// A zero-length slice of each retired buffer: it is the only reference
    /// left once every payload cut from that buffer is gone.
    retired: VecDeque<Bytes>,
}

impl Pins {
    pub(crate) fn retire(&mut self, sentinel: Bytes) {
        self.retired.push_back(sentinel);
        self.prune();
    }

    fn prune(&mut self) {
        self.retired.retain(|b| !b.is_unique());
    }

    /// Whether payloads may still be handed out as slices.
    pub(crate) fn may_slice(&mut self) -> bool {
        if self.retired.len() >= MAX_PINNED_CHUNKS {
            self.prune();
        }
        self.retired.len() < MAX_PINNED_CHUNKS
    }
}

/// A fresh read buffer holding `carry` (an unfinished frame), and its sentinel.
fn fresh_buffer(carry: &[u8]) -> (BytesMut, Bytes) {
    let mut b = BytesMut::with_capacity(READ_CHUNK + carry.len());
    let sentinel = b.split_to(0).freeze();
    b.extend_from_slice(carry);
    (b, sentinel)
}

pub(crate) async fn carrier_reader(
    shared: Arc<Shared>,
    mut r: BoxRead,
    limits: DecodeLimits,
    id: CarrierId,
) {
    let (mut buf, mut sentinel) = fresh_buffer(&[]);
    let mut pins = Pins::default();
    loop {
        match decode_batch(&shared, &mut buf, limits, pins.may_slice(), id) {
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

/// Hands every whole frame in `buf` to the core. With a link layer, all of
/// it happens under the link lock, after checking that carrier `id` is
/// still current, and the bytes are counted before the lock is let go: a
/// carrier replaced meanwhile has nothing handed on, and nothing handed on
/// goes uncounted (the peer would send it again after a resume).
fn decode_batch(
    shared: &Arc<Shared>,
    buf: &mut BytesMut,
    limits: DecodeLimits,
    may_slice: bool,
    id: CarrierId,
) -> Batch {
    let mut link = shared.link();
    if link.as_ref().is_some_and(|l| !l.is_current(id)) {
        return Batch::End;
    }
    // Link layer: bytes of whole frames handed to the core, and the peer's
    // latest ACK.
    let mut got = 0usize;
    let mut acked = None;
    let mut ended = false;
    loop {
        let before = buf.len();
        match frame::decode(buf, limits) {
            Ok(Some(Frame::Ack { received })) if link.is_some() => acked = Some(received),
            Ok(Some(Frame::Goodbye)) if link.is_some() => {
                drop(link.take());
                tracing::info!(peer = %shared.peer, "peer ended the session");
                shared
                    .peer_goodbye
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                shared.close("peer ended the session".into());
                return Batch::End;
            }
            Ok(Some(f)) => {
                got += before - buf.len();
                let (end, work) = shared.handle_frame(f, may_slice);
                for w in work {
                    match w {
                        Work::Connect(open, dest) => connect_for_peer(shared, open, dest),
                        Work::Bind(request, bind, dest) => serve_bind(shared, request, bind, dest),
                    }
                }
                if end {
                    ended = true;
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => {
                drop(link.take());
                let why = format!("malformed frame from peer: {e}");
                tracing::warn!(peer = %shared.peer, "closing session: {why}");
                shared.close(why);
                return Batch::End;
            }
        }
    }
    if let Some(mut l) = link {
        match l.on_input(id, got, acked) {
            Ok(Input::Applied { wake }) => {
                drop(l);
                if wake {
                    shared.wake_writer.notify_one();
                }
            }
            Ok(Input::Stale) => return Batch::End,
            Err(e) => {
                drop(l);
                let why = format!("bad acknowledgement from peer: {e}");
                tracing::warn!(peer = %shared.peer, "closing session: {why}");
                shared.close(why);
                return Batch::End;
            }
        }
    }
    if ended {
        Batch::End
    } else {
        Batch::More
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
        assert_eq!(pins.retired.len(), MAX_PINNED_CHUNKS - 1);
    }
}
