//! A stream's inbound queue: DATA received from the peer, waiting for the
//! stream's downlink to write it to the local socket.
//!
//! What the queue holds is charged at what it really holds. A payload may be
//! a zero-copy slice of the carrier's read buffer, which keeps that whole
//! buffer (512 KiB) alive however short the slice is; so a slice is kept only
//! while the stream is draining (its downlink is writing, not waiting on a
//! full socket) and only when it is large. Everything else is copied into
//! the queue's own blocks, where small payloads coalesce: a stalled stream
//! holds its queued bytes plus at most one partly filled block, never
//! someone else's buffer.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// Payloads shorter than this are always copied (cheap, and a short slice
/// would pin a whole carrier read buffer for a few bytes).
pub(crate) const COPY_BELOW: usize = 8 * 1024;
/// Largest block copied payloads coalesce into. A new block is sized to a
/// quarter of what the queue holds (at least [`MIN_BLOCK`]), so its unused
/// tail is at most a quarter of the queue (or 256 B): copied data costs at
/// most 1.25 × its bytes, plus 256 B per stream.
const MAX_BLOCK: usize = 64 * 1024;
const MIN_BLOCK: usize = 256;

/// One queued piece of data.
pub(crate) struct Part {
    pub data: Bytes,
    /// In memory of its own (copied), rather than a slice of a carrier
    /// read buffer.
    pub owned: bool,
}

#[derive(Default)]
pub(crate) struct InQueue {
    /// What is queued; none while empty, so an idle stream's queue costs
    /// one pointer (it is in every stream's state).
    held: Option<Box<Held>>,
    /// EOF arrived after everything queued.
    pub eof: bool,
}

#[derive(Default)]
struct Held {
    parts: VecDeque<Part>,
    /// Copied payloads not yet sealed into `parts`.
    tail: BytesMut,
    bytes: usize,
}

impl InQueue {
    /// Bytes queued.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.held.as_ref().map_or(0, |h| h.bytes)
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_none()
    }

    /// Queues a payload, as a slice when `slice_ok` and it is large enough,
    /// otherwise as a copy.
    pub fn push(&mut self, payload: Bytes, slice_ok: bool) {
        if payload.is_empty() {
            return;
        }
        let h = self.held.get_or_insert_with(Default::default);
        h.bytes += payload.len();
        if slice_ok && payload.len() >= COPY_BELOW {
            h.seal();
            h.parts.push_back(Part {
                data: payload,
                owned: false,
            });
        } else {
            h.copy_in(&payload);
        }
    }

    /// Takes what is queued, in order, into `out` (up to `max_parts`
    /// pieces in all); returns the bytes taken.
    pub fn take(&mut self, out: &mut Vec<Part>, max_parts: usize) -> usize {
        let Some(h) = self.held.as_mut() else {
            return 0;
        };
        h.seal();
        let mut taken = 0;
        while out.len() < max_parts {
            let Some(p) = h.parts.pop_front() else {
                break;
            };
            taken += p.data.len();
            out.push(p);
        }
        h.bytes -= taken;
        if h.parts.is_empty() {
            // Emptied: let go of the block's free room and the deque's
            // buffer, so an idle stream holds no memory here.
            self.held = None;
        }
        taken
    }

    /// Replaces every slice still queued with a copy, so the queue pins no
    /// carrier buffer (called when the stream stops draining).
    pub fn compact(&mut self) {
        if let Some(h) = self.held.as_mut() {
            h.compact();
        }
    }

    /// How many queued parts are still slices of carrier read buffers.
    #[cfg(test)]
    fn slices(&self) -> usize {
        self.held
            .as_ref()
            .map_or(0, |h| h.parts.iter().filter(|p| !p.owned).count())
    }
}

impl Held {
    fn copy_in(&mut self, mut src: &[u8]) {
        while !src.is_empty() {
            if self.tail.capacity() == self.tail.len() {
                self.seal();
                let size = (self.bytes / 4).clamp(MIN_BLOCK, MAX_BLOCK);
                self.tail = BytesMut::with_capacity(size);
            }
            let room = self.tail.capacity() - self.tail.len();
            let n = room.min(src.len());
            self.tail.extend_from_slice(&src[..n]);
            src = &src[n..];
        }
    }

    /// Moves the copied bytes gathered so far into `parts`. The block's free
    /// room stays with `tail` (same allocation), so later copies fill it.
    fn seal(&mut self) {
        if !self.tail.is_empty() {
            self.parts.push_back(Part {
                data: self.tail.split().freeze(),
                owned: true,
            });
        }
    }

    fn compact(&mut self) {
        if self.parts.iter().all(|p| p.owned) {
            return;
        }
        self.seal();
        self.tail = BytesMut::new();
        for p in std::mem::take(&mut self.parts) {
            if p.owned {
                self.seal();
                self.parts.push_back(p);
            } else {
                self.copy_in(&p.data);
            }
        }
        self.seal();
    }
}

/// Copies every slice in `parts` into one owned buffer, in place, keeping
/// the order (the downlink's own pending data, when its socket is full).
pub(crate) fn compact_parts(parts: &mut Vec<Part>) {
    if parts.iter().all(|p| p.owned) {
        return;
    }
    let mut out: Vec<Part> = Vec::with_capacity(parts.len());
    let mut run = BytesMut::new();
    for p in parts.drain(..) {
        if p.owned {
            if !run.is_empty() {
                out.push(Part {
                    data: run.split().freeze(),
                    owned: true,
                });
            }
            out.push(p);
        } else {
            run.extend_from_slice(&p.data);
        }
    }
    if !run.is_empty() {
        out.push(Part {
            data: run.freeze(),
            owned: true,
        });
    }
    *parts = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut InQueue) -> Vec<u8> {
        let mut parts = vec![];
        q.take(&mut parts, usize::MAX);
        parts.iter().flat_map(|p| p.data.to_vec()).collect()
    }

    #[test]
    fn order_is_kept_across_slices_and_copies() {
        let mut q = InQueue::default();
        let mut want = vec![];
        for i in 0..200usize {
            let n = if i % 3 == 0 { 10_000 } else { i };
            let b: Vec<u8> = (0..n).map(|k| (k + i) as u8).collect();
            want.extend_from_slice(&b);
            q.push(Bytes::from(b), i % 2 == 0);
        }
        assert_eq!(q.len(), want.len());
        q.compact();
        assert_eq!(q.slices(), 0);
        assert_eq!(q.len(), want.len());
        assert_eq!(drain(&mut q), want);
        assert!(q.is_empty());
    }

    #[test]
    fn small_payloads_coalesce_into_few_blocks() {
        let mut q = InQueue::default();
        for _ in 0..100_000 {
            q.push(Bytes::from_static(b"x"), true);
        }
        let mut parts = vec![];
        q.take(&mut parts, usize::MAX);
        // 100 000 bytes in blocks sized to a quarter of the queue: a few
        // dozen parts, never one per payload.
        assert!(parts.len() < 64, "{} parts", parts.len());
        let held: usize = parts.iter().map(|p| p.data.len()).sum();
        assert_eq!(held, 100_000);
    }

    #[test]
    fn compacting_pending_parts_keeps_order() {
        let mut parts = vec![
            Part {
                data: Bytes::from_static(b"ab"),
                owned: false,
            },
            Part {
                data: Bytes::from_static(b"cd"),
                owned: true,
            },
            Part {
                data: Bytes::from_static(b"ef"),
                owned: false,
            },
            Part {
                data: Bytes::from_static(b"gh"),
                owned: false,
            },
        ];
        compact_parts(&mut parts);
        assert!(parts.iter().all(|p| p.owned));
        let all: Vec<u8> = parts.iter().flat_map(|p| p.data.to_vec()).collect();
        assert_eq!(all, b"abcdefgh");
        assert_eq!(parts.len(), 3);
    }
}
