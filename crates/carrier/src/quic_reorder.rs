//! The carrier's QUIC stream, read as its pieces arrive and put back in
//! order here.
//!
//! quinn-proto (0.11.19) holds what arrived past a lost packet as at most
//! 1 024 separate pieces, and past that ends the whole connection ("too
//! many gaps in stream buffer"). On a fast path with a shallow queue, one
//! burst of tail drops leaves more holes than that within a window: over
//! the emulator at 1 Gbit/s, 100 ms and a 2 MB queue, the carrier died ten
//! times in ten seconds (docs/BENCHMARKS.md). Read unordered, quinn hands
//! each piece over as it arrives and keeps none; the holes are counted
//! here, against bounds of this crate's own ([`MAX_RUNS`], and the bytes
//! the caller allows past a hole).
//!
//! Reading unordered also releases flow-control credit for what is held
//! past a hole, so a peer could keep sending past one it never fills: the
//! bytes held are bounded, and a peer that passes the bound loses its
//! carrier (the session resumes on a new one).

use std::collections::BTreeMap;

use bytes::{Buf, Bytes, BytesMut};

/// Separate runs of bytes held past holes at most: a path that drops
/// every other packet of a 16 MiB window makes ≈ 7 000.
pub const MAX_RUNS: usize = 16 * 1024;

#[derive(Debug, Default)]
pub(super) struct Reorder {
    /// Offset of the first byte not yet handed out (`ready` starts here).
    next: u64,
    /// In order, to hand out first.
    ready: Bytes,
    /// Runs past a hole, by offset: each contiguous, no two touching, all
    /// past `ready`'s end.
    runs: BTreeMap<u64, BytesMut>,
    /// Bytes in `runs`.
    held: usize,
}

impl Reorder {
    /// Bytes held past a hole.
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// Takes `data`, which starts at `offset` of the stream. Fails when more
    /// than `max_held` bytes, or [`MAX_RUNS`] runs, would wait past holes.
    pub(super) fn insert(
        &mut self,
        mut offset: u64,
        mut data: Bytes,
        max_held: usize,
    ) -> Result<(), String> {
        // What was handed out, or is ready, already (quinn drops repeats;
        // this does not count on it).
        let ready_end = self.next + self.ready.len() as u64;
        if offset < ready_end {
            let seen = (ready_end - offset).min(data.len() as u64);
            data.advance(seen as usize);
            offset += seen;
        }
        if data.is_empty() {
            return Ok(());
        }
        if self.ready.is_empty() && offset == self.next {
            // In order: no copy (up to a run already held, if any).
            let upto = match self.runs.first_key_value() {
                Some((&start, _)) => ((start - offset) as usize).min(data.len()),
                None => data.len(),
            };
            self.ready = data.split_to(upto);
            offset += upto as u64;
        }
        while !data.is_empty() {
            // Skip what a run before it, or at it, already holds.
            if let Some((&start, run)) = self.runs.range(..=offset).next_back() {
                let end = start + run.len() as u64;
                if end > offset {
                    let seen = (end - offset).min(data.len() as u64);
                    data.advance(seen as usize);
                    offset += seen;
                    continue;
                }
            }
            // Up to the next run, the bytes are new.
            let upto = match self.runs.range(offset + 1..).next() {
                Some((&start, _)) => ((start - offset) as usize).min(data.len()),
                None => data.len(),
            };
            let piece = data.split_to(upto);
            self.hold(offset, &piece);
            offset += upto as u64;
        }
        if self.held > max_held {
            return Err(format!(
                "QUIC stream: more than {} KiB held past a gap the peer does not fill",
                max_held / 1024
            ));
        }
        if self.runs.len() > MAX_RUNS {
            return Err(format!(
                "QUIC stream: more than {MAX_RUNS} gaps in what arrived"
            ));
        }
        Ok(())
    }

    /// Copies `piece` (new bytes at `offset`) into the runs, joining the
    /// run that ends where it starts and the one that starts where it ends.
    fn hold(&mut self, offset: u64, piece: &[u8]) {
        self.held += piece.len();
        let end = offset + piece.len() as u64;
        let after = self.runs.remove(&end);
        let key = self
            .runs
            .range(..offset)
            .next_back()
            .filter(|(&start, run)| start + run.len() as u64 == offset)
            .map_or(offset, |(&start, _)| start);
        let run = self.runs.entry(key).or_default();
        run.extend_from_slice(piece);
        if let Some(after) = after {
            run.extend_from_slice(&after);
        }
    }

    /// Copies what is in order into `buf`; the number of bytes copied.
    pub(super) fn take_into(&mut self, buf: &mut tokio::io::ReadBuf<'_>) -> usize {
        if self.ready.is_empty() {
            match self.runs.first_key_value() {
                Some((&start, _)) if start == self.next => {
                    let run = self.runs.remove(&start).expect("just seen");
                    self.held -= run.len();
                    self.ready = run.freeze();
                }
                _ => return 0,
            }
        }
        let n = self.ready.len().min(buf.remaining());
        buf.put_slice(&self.ready[..n]);
        self.ready.advance(n);
        self.next += n as u64;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(r: &mut Reorder) -> Vec<u8> {
        let mut out = Vec::new();
        let mut space = [0u8; 700];
        loop {
            let mut buf = tokio::io::ReadBuf::new(&mut space);
            if r.take_into(&mut buf) == 0 {
                return out;
            }
            out.extend_from_slice(buf.filled());
        }
    }

    /// Pieces in any order, overlapping and repeated, come out once each,
    /// in order; nothing is handed out across a hole.
    #[test]
    fn pieces_in_any_order_come_out_whole_and_in_order() {
        let stream: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for round in 0..50 {
            let mut pieces = Vec::new();
            let mut at = 0;
            while at < stream.len() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let len = (1 + seed % 1500) as usize;
                let end = (at + len).min(stream.len());
                // Some pieces overlap the one before (a repeat with other
                // framing).
                let from = at.saturating_sub(seed.is_multiple_of(3) as usize * 100);
                pieces.push((from, end));
                at = end;
            }
            // Shuffle, and repeat a few.
            for i in (1..pieces.len()).rev() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                pieces.swap(i, (seed % (i as u64 + 1)) as usize);
            }
            let again: Vec<_> = pieces.iter().step_by(5).copied().collect();
            pieces.extend(again);
            let mut r = Reorder::default();
            let mut out = Vec::new();
            for (from, end) in pieces {
                let data = Bytes::copy_from_slice(&stream[from..end]);
                r.insert(from as u64, data, usize::MAX).unwrap();
                out.extend(drain(&mut r));
                assert_eq!(&out[..], &stream[..out.len()], "round {round}");
            }
            assert_eq!(out, stream, "round {round}");
            assert_eq!((r.held(), r.runs.len()), (0, 0));
        }
    }

    /// Bytes past a hole have a bound, and so do the holes.
    #[test]
    fn what_waits_past_holes_is_bounded() {
        let mut r = Reorder::default();
        r.insert(1, Bytes::from(vec![1u8; 1000]), 1500).unwrap();
        let e = r
            .insert(2000, Bytes::from(vec![2u8; 1000]), 1500)
            .unwrap_err();
        assert!(e.contains("held past a gap"), "{e}");

        let mut r = Reorder::default();
        for i in 0..MAX_RUNS as u64 {
            r.insert(1 + 2 * i, Bytes::from_static(b"x"), usize::MAX)
                .unwrap();
        }
        let e = r
            .insert(
                1 + 2 * MAX_RUNS as u64,
                Bytes::from_static(b"x"),
                usize::MAX,
            )
            .unwrap_err();
        assert!(e.contains("gaps"), "{e}");
        // Filled, the holes join up and everything comes out.
        let mut r = Reorder::default();
        for i in 0..100u64 {
            r.insert(1 + 2 * i, Bytes::from_static(b"b"), usize::MAX)
                .unwrap();
        }
        for i in 0..100u64 {
            r.insert(2 * i, Bytes::from_static(b"a"), usize::MAX)
                .unwrap();
        }
        assert_eq!(drain(&mut r), b"ab".repeat(100));
    }
}
