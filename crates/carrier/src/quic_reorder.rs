//! The carrier's QUIC stream, read as its pieces arrive and put back in
//! order here.
//!
//! quinn-proto (0.11.19) holds what arrived past a lost packet as at most
//! 1 024 separate pieces, and past that ends the whole connection ("too
//! many gaps in stream buffer"). On a fast path with a shallow queue, one
//! burst of tail drops leaves more holes than that within a window: over
//! the emulator at 1 Gbit/s, 100 ms and a 2 MB queue, the carrier died ten
//! times in ten seconds (docs/BENCHMARKS.md). Read unordered, quinn hands
//! each piece over as it arrives; the holes are counted here, against
//! bounds of this crate's own.
//!
//! Read that way, quinn releases flow-control credit for what is read,
//! in order or not, so what waits past holes is bounded here
//! ([`Reorder::insert`]'s `max_held`, [`MAX_RUNS`]): an honest sender
//! repairs a loss within a round trip or two, and one that never fills a
//! hole loses its carrier.

use std::collections::{BTreeMap, VecDeque};

use bytes::{Buf, Bytes};

/// Separate runs past holes at most: a path that drops every other packet
/// of a 32 MiB window makes ≈ 14 000.
pub const MAX_RUNS: usize = 32 * 1024;

/// What one piece held costs beyond its bytes (its allocation's header,
/// its place in a run and the run's in the map), counted in
/// [`Reorder::held`] so that tiny pieces cannot hold many times the bound.
pub const PIECE_COST: usize = 128;

/// In-order pieces smaller than this are copied too: a slice of quinn's
/// receive buffer pins the whole buffer (up to a batch of datagrams),
/// which tiny pieces would multiply.
pub const COPY_BELOW: usize = 1024;

/// Pieces in order, each copied once (a run joins another by moving the
/// pieces of the shorter, never by copying bytes again).
#[derive(Debug, Default)]
struct Run {
    pieces: VecDeque<Bytes>,
    len: usize,
}

impl Run {
    fn cost(&self) -> usize {
        self.len + self.pieces.len() * PIECE_COST
    }

    /// `self` followed by `after`.
    fn join(mut self, mut after: Run) -> Run {
        if self.pieces.len() >= after.pieces.len() {
            self.len += after.len;
            self.pieces.extend(after.pieces.drain(..));
            self
        } else {
            after.len += self.len;
            while let Some(p) = self.pieces.pop_back() {
                after.pieces.push_front(p);
            }
            after
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Reorder {
    /// Offset of the first byte not yet handed out (`ready` starts here).
    next: u64,
    /// In order, to hand out first.
    ready: Run,
    /// Runs past a hole, by offset: no two touching, all past `ready`.
    runs: BTreeMap<u64, Run>,
    /// The cost of `ready` and `runs`.
    held: usize,
}

impl Reorder {
    /// What is read from quinn and not yet handed out, with each piece's
    /// [`PIECE_COST`].
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// In-order bytes ready to hand out, with each piece's [`PIECE_COST`].
    pub(super) fn ready_cost(&self) -> usize {
        self.ready.cost()
    }

    /// Whether bytes wait past a hole.
    pub(super) fn has_holes(&self) -> bool {
        !self.runs.is_empty()
    }

    /// Takes `data`, which starts at `offset` of the stream. Fails when
    /// more than `max_held` ([`Reorder::held`]), or [`MAX_RUNS`] runs, would
    /// wait.
    pub(super) fn insert(
        &mut self,
        mut offset: u64,
        mut data: Bytes,
        max_held: usize,
    ) -> Result<(), &'static str> {
        while !data.is_empty() {
            // What was handed out, or is ready, already (quinn drops
            // repeats; this does not count on it).
            let ready_end = self.next + self.ready.len as u64;
            if offset < ready_end {
                let seen = (ready_end - offset).min(data.len() as u64);
                data.advance(seen as usize);
                offset += seen;
                continue;
            }
            // Skip what a run before it, or at it, already holds.
            if let Some((&start, run)) = self.runs.range(..=offset).next_back() {
                let end = start + run.len as u64;
                if end > offset {
                    let seen = (end - offset).min(data.len() as u64);
                    data.advance(seen as usize);
                    offset += seen;
                    continue;
                }
            }
            // Up to the next run, the bytes are new.
            let room = match self.runs.range(offset + 1..).next() {
                Some((&start, _)) => start - offset,
                None => u64::MAX,
            };
            let piece = data.split_to(room.min(data.len() as u64) as usize);
            let len = piece.len() as u64;
            self.hold(offset, piece);
            offset += len;
        }
        if self.held - self.ready.cost() > max_held {
            return Err("more held past a gap than the bound allows");
        }
        if self.runs.len() > MAX_RUNS {
            return Err("too many gaps in what arrived");
        }
        Ok(())
    }

    /// Keeps `piece` (new bytes at `offset`): in `ready` if it follows it,
    /// else in a run, joined to the run that ends where it starts and to
    /// the one that starts where it ends.
    fn hold(&mut self, offset: u64, piece: Bytes) {
        let in_order = offset == self.next + self.ready.len as u64;
        // Out of order, a copy of its own: a slice of quinn's receive
        // buffer would pin all of it while it waits (in order, it goes
        // out soon, and the buffer with it).
        let piece = match in_order && piece.len() >= COPY_BELOW {
            true => piece,
            false => Bytes::copy_from_slice(&piece),
        };
        let mut run = Run {
            len: piece.len(),
            pieces: VecDeque::from([piece]),
        };
        self.held += run.cost();
        let end = offset + run.len as u64;
        if let Some(after) = self.runs.remove(&end) {
            run = run.join(after);
        }
        if in_order {
            let ready = std::mem::take(&mut self.ready);
            self.ready = ready.join(run);
            return;
        }
        let before = self
            .runs
            .range(..offset)
            .next_back()
            .filter(|(&start, r)| start + r.len as u64 == offset)
            .map(|(&start, _)| start);
        match before {
            Some(start) => {
                let before = self.runs.remove(&start).expect("just seen");
                self.runs.insert(start, before.join(run));
            }
            None => {
                self.runs.insert(offset, run);
            }
        }
    }

    /// Copies what is in order into `buf`; the number of bytes copied.
    pub(super) fn take_into(&mut self, buf: &mut tokio::io::ReadBuf<'_>) -> usize {
        let mut n = 0;
        while buf.remaining() > 0 {
            let Some(front) = self.ready.pieces.front_mut() else {
                break;
            };
            let k = front.len().min(buf.remaining());
            buf.put_slice(&front[..k]);
            front.advance(k);
            if front.is_empty() {
                self.ready.pieces.pop_front();
                self.held -= PIECE_COST;
            }
            self.ready.len -= k;
            self.held -= k;
            self.next += k as u64;
            n += k;
        }
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

    /// Runs all past `ready`, none touching another; `held` their cost.
    fn check(r: &Reorder) {
        let mut end = r.next + r.ready.len as u64;
        let mut cost = r.ready.cost();
        for (&start, run) in &r.runs {
            assert!(start > end, "run at {start} touches or overlaps {end}");
            assert_eq!(run.len, run.pieces.iter().map(|p| p.len()).sum::<usize>());
            end = start + run.len as u64;
            cost += run.cost();
        }
        assert_eq!(r.held, cost);
    }

    fn xorshift(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    /// Pieces in any order, overlapping and repeated, come out once each,
    /// in order; nothing is handed out across a hole; what is held is
    /// counted back to zero.
    #[test]
    fn pieces_in_any_order_come_out_whole_and_in_order() {
        let stream: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for round in 0..50 {
            let mut pieces = Vec::new();
            let mut at = 0;
            while at < stream.len() {
                let r = xorshift(&mut seed);
                let end = (at + 1 + (r % 1500) as usize).min(stream.len());
                // Some overlap the one before (a repeat with other framing).
                let from = at.saturating_sub(r.is_multiple_of(3) as usize * 100);
                pieces.push((from, end));
                at = end;
            }
            for i in (1..pieces.len()).rev() {
                let j = (xorshift(&mut seed) % (i as u64 + 1)) as usize;
                pieces.swap(i, j);
            }
            let again: Vec<_> = pieces.iter().step_by(5).copied().collect();
            pieces.extend(again);
            let mut r = Reorder::default();
            let mut out = Vec::new();
            for (from, end) in pieces {
                let data = Bytes::copy_from_slice(&stream[from..end]);
                r.insert(from as u64, data, usize::MAX).unwrap();
                check(&r);
                if xorshift(&mut seed).is_multiple_of(2) {
                    out.extend(drain(&mut r));
                }
                assert_eq!(&out[..], &stream[..out.len()], "round {round}");
            }
            out.extend(drain(&mut r));
            assert_eq!(out, stream, "round {round}");
            assert_eq!((r.held(), r.runs.len()), (0, 0));
        }
    }

    /// Pieces in reverse order join into one run without copying the run
    /// again each time (the pieces are moved), and come out in order.
    #[test]
    fn pieces_in_reverse_join_up() {
        let mut r = Reorder::default();
        for i in (1..2000u64).rev() {
            r.insert(i * 10, Bytes::from(vec![i as u8; 10]), usize::MAX)
                .unwrap();
            assert_eq!(r.runs.len(), 1);
        }
        r.insert(0, Bytes::from(vec![0u8; 10]), usize::MAX).unwrap();
        let out = drain(&mut r);
        assert_eq!(out.len(), 20_000);
        assert!(out.chunks(10).enumerate().all(|(i, c)| c == [i as u8; 10]));
    }

    /// Bytes waiting, with what each piece costs, have a bound, and so do
    /// the holes.
    #[test]
    fn what_waits_past_holes_is_bounded() {
        let mut r = Reorder::default();
        r.insert(1, Bytes::from(vec![1u8; 1000]), 1500).unwrap();
        let e = r
            .insert(2000, Bytes::from(vec![2u8; 1000]), 1500)
            .unwrap_err();
        assert!(e.contains("bound"), "{e}");
        // Tiny pieces count their cost: 64 KiB holds ≈ 500, not 65 536.
        let mut r = Reorder::default();
        let mut taken = 0;
        while r
            .insert(1 + 2 * taken, Bytes::from_static(b"x"), 64 * 1024)
            .is_ok()
        {
            taken += 1;
        }
        assert!(taken < 64 * 1024 / PIECE_COST as u64, "{taken}");

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
        assert_eq!(r.held(), 0);
    }
}
