//! Striping: one session's sequenced bytes spread over several carriers
//! ("lanes"), seed 003's inverse multiplexer.
//!
//! The link layer numbers the bytes of the frames each side sends
//! (`link`). In a striped session each lane's writer, whenever its
//! socket has room, takes the next run of whole frames and sends it as a
//! chunk: a CHUNK header (offset, length) and those bytes. A lane whose path
//! is slow or lossy drains slowly and so takes fewer chunks; the chunk size
//! follows the lane's delivery rate ([`chunk_target`]). The receiver puts
//! chunks back in order ([`Reorder`]) and hands their frames to the
//! multiplexer as if from one carrier. ACKs ride on any lane.
//!
//! The sender remembers which lane carries each unacknowledged chunk
//! ([`Flight`]): the chunks of a lane that died, or of one that holds the
//! oldest unacknowledged chunk far longer than the path's round trip, are
//! sent again on another lane from the replay buffer. Chunk boundaries are
//! kept, so the receiver recognises the copy it already has and drops it.
//!
//! Bounds: a chunk carries at most [`CHUNK_MAX`] bytes; the receiver holds
//! out-of-order chunks only within its own replay bound past the next byte
//! it needs (the sender keeps no more than that unacknowledged), so the
//! reorder buffer holds at most that bound plus one chunk.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::{Buf, BytesMut};

/// Most lanes one session may have.
pub const MAX_LANES: usize = 16;
/// Largest chunk. Also what one lane's reader may read ahead of the
/// reorder buffer.
pub const CHUNK_MAX: usize = 512 << 10;
/// Smallest chunk the sizing aims for (a chunk can be smaller when there is
/// less to send).
pub const CHUNK_MIN: usize = 4 << 10;
/// Chunk size before a lane has measured its rate.
pub const CHUNK_START: usize = 64 << 10;
/// A chunk is sized to this much time at its lane's delivery rate: small
/// enough that a slow lane does not hold the session's next bytes for long,
/// large enough that a fast lane's per-chunk costs stay small.
pub const CHUNK_TIME: Duration = Duration::from_millis(4);
/// A chunk is sent again on another lane once it has waited this many of
/// its lane's round trips beyond the lane's retransmission timeout (a lane
/// repairing a loss with a fast retransmit or one timeout is left to it;
/// one backing off, or silent, is not)…
pub const STALL_RTTS: u32 = 2;
/// …and at least this long.
pub const STALL_MIN: Duration = Duration::from_millis(250);

/// How big a chunk a lane delivering `rate` bytes/s should take.
pub fn chunk_target(rate: u64) -> usize {
    if rate == 0 {
        return CHUNK_START;
    }
    ((rate as f64 * CHUNK_TIME.as_secs_f64()) as usize).clamp(CHUNK_MIN, CHUNK_MAX)
}

/// How long a chunk may wait on a lane with round trip `rtt` and
/// retransmission timeout `rto` before it is sent again elsewhere; `queued`:
/// how long the lane needs to send what is queued in its socket ahead.
pub fn stall_timeout(rtt: Duration, rto: Duration, queued: Duration) -> Duration {
    (rto + rtt * STALL_RTTS + queued).max(STALL_MIN)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StripeError {
    #[error("chunk of {0} bytes (1..={CHUNK_MAX} allowed)")]
    BadLength(usize),
    #[error(
        "chunk at byte {offset} lies beyond the reorder window (next byte {next}, window {window})"
    )]
    BeyondWindow { offset: u64, next: u64, window: u64 },
    #[error("reorder buffer over its bound of {0} bytes")]
    Overfull(usize),
}

/// What holding one out-of-order chunk costs beyond its bytes (its own
/// allocation's header, the `BytesMut`, the map's node): charged against
/// the bound, so that a peer sending 1-byte chunks past a gap fills the
/// bound with what it really costs, not with 1 B each.
pub const CHUNK_ENTRY_COST: usize = 128;

/// The receiving side: chunks from all lanes, put back in order.
#[derive(Debug)]
pub struct Reorder {
    /// The next byte of the session's stream to hand on.
    next: u64,
    pending: BTreeMap<u64, BytesMut>,
    /// What `pending` costs: its bytes plus [`CHUNK_ENTRY_COST`] each.
    held: usize,
    /// Chunks may end at most this far past `next`.
    window: u64,
    /// Chunks that arrived twice (sent again after a stall), dropped.
    duplicates: u64,
}

impl Reorder {
    /// `window`: this side's replay bound, the most the peer may send
    /// ahead of what it has had acknowledged.
    pub fn new(window: usize) -> Reorder {
        Reorder {
            next: 0,
            pending: BTreeMap::new(),
            held: 0,
            window: (window + CHUNK_MAX) as u64,
            duplicates: 0,
        }
    }

    pub fn next(&self) -> u64 {
        self.next
    }

    /// What the chunks held out of order cost: their bytes, plus
    /// [`CHUNK_ENTRY_COST`] per chunk.
    pub fn held(&self) -> usize {
        self.held
    }

    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Largest cost ([`Reorder::held`]) this buffer may reach.
    pub fn bound(&self) -> usize {
        2 * self.window as usize
    }

    /// A chunk arrived: `data` is the stream from `offset` on.
    pub fn insert(&mut self, offset: u64, data: BytesMut) -> Result<(), StripeError> {
        let len = data.len();
        if len == 0 || len > CHUNK_MAX {
            return Err(StripeError::BadLength(len));
        }
        let beyond = StripeError::BeyondWindow {
            offset,
            next: self.next,
            window: self.window,
        };
        let end = offset.checked_add(len as u64).ok_or(beyond.clone())?;
        if end <= self.next {
            self.duplicates += 1;
            return Ok(());
        }
        if end > self.next + self.window {
            return Err(beyond);
        }
        if let Some(have) = self.pending.get(&offset) {
            if have.len() >= len {
                self.duplicates += 1;
                return Ok(());
            }
            self.held -= have.len() + CHUNK_ENTRY_COST;
        }
        self.held += len + CHUNK_ENTRY_COST;
        self.pending.insert(offset, data);
        // Copies with other boundaries only come from a peer that does not
        // follow the protocol; they still count.
        if self.held > self.bound() {
            return Err(StripeError::Overfull(self.bound()));
        }
        Ok(())
    }

    /// The next run of the stream, if it has arrived.
    pub fn pop(&mut self) -> Option<BytesMut> {
        loop {
            let (&offset, _) = self.pending.first_key_value()?;
            if offset > self.next {
                return None;
            }
            let mut data = self.pending.remove(&offset)?;
            self.held -= data.len() + CHUNK_ENTRY_COST;
            let end = offset + data.len() as u64;
            if end <= self.next {
                self.duplicates += 1;
                continue;
            }
            // An overlap: only the new part (at a frame boundary from an
            // honest peer; the decoder finds out otherwise).
            data.advance((self.next - offset) as usize);
            self.next = end;
            return Some(data);
        }
    }

    /// After a resume the peer sends everything again from `next`, in new
    /// chunks: those held are dropped.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.held = 0;
    }
}

/// One chunk the sender has not had acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sent {
    offset: u64,
    end: u64,
    /// The lane (its id) that carries it now.
    lane: u64,
    /// When that lane took it (ns on the session clock).
    at: u64,
    /// Waiting in the queue to be sent again.
    queued: bool,
    /// Sent more than once: which copy arrived is unknown.
    again: bool,
}

/// The oldest chunk in flight, as [`Flight::oldest`] tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Oldest {
    /// The lane that sent it last, and when.
    pub lane: u64,
    pub at: u64,
    /// Queued to be sent again.
    pub queued: bool,
}

/// A chunk to send again: `from..to`, on any lane but `avoid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resend {
    pub from: u64,
    pub to: u64,
    pub avoid: u64,
}

/// The sending side: which lane carries each unacknowledged chunk, and
/// what must be sent again.
#[derive(Debug, Default)]
pub struct Flight {
    chunks: VecDeque<Sent>,
    resend: VecDeque<Resend>,
    /// Chunks sent again so far.
    pub resent: u64,
}

impl Flight {
    /// Lane `lane` took the chunk `offset..offset+len` at `now`. The record
    /// stays sorted by offset whatever order chunks are registered in (the
    /// searches below rely on it).
    pub fn sent(&mut self, offset: u64, len: usize, lane: u64, now: u64) {
        let c = Sent {
            offset,
            end: offset + len as u64,
            lane,
            at: now,
            queued: false,
            again: false,
        };
        self.insert(c);
    }

    fn insert(&mut self, c: Sent) -> usize {
        if self.chunks.back().is_none_or(|b| b.offset < c.offset) {
            self.chunks.push_back(c);
            return self.chunks.len() - 1;
        }
        let i = self.chunks.partition_point(|x| x.offset < c.offset);
        if self.chunks.get(i).is_some_and(|x| x.offset == c.offset) {
            self.chunks[i] = c;
        } else {
            self.chunks.insert(i, c);
        }
        i
    }

    /// The chunk `offset..offset+len` must go (again) on some lane other
    /// than `avoid`, from the replay buffer: after a resume, everything the
    /// peer missed.
    pub fn queue_again(&mut self, offset: u64, len: usize, avoid: u64, now: u64) {
        let i = self.insert(Sent {
            offset,
            end: offset + len as u64,
            lane: avoid,
            at: now,
            queued: false,
            again: true,
        });
        self.queue(i);
    }

    /// The oldest chunk not acknowledged: the one every later chunk's
    /// acknowledgement waits for.
    pub fn oldest(&self) -> Option<Oldest> {
        self.chunks.front().map(|c| Oldest {
            lane: c.lane,
            at: c.at,
            queued: c.queued,
        })
    }

    /// Chunks waiting to be acknowledged.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The peer has every byte below `acked`. Tells `delivered` the lane
    /// and send time of each chunk acknowledged that was sent once only
    /// (of one sent again, either copy may be the one that arrived).
    pub fn acked(&mut self, acked: u64, mut delivered: impl FnMut(u64, u64)) {
        while let Some(c) = self.chunks.front().filter(|c| c.end <= acked) {
            if !c.again {
                delivered(c.lane, c.at);
            }
            self.chunks.pop_front();
        }
        self.resend.retain(|r| r.to > acked);
    }

    fn queue(&mut self, i: usize) {
        let c = &mut self.chunks[i];
        if !c.queued {
            c.queued = true;
            self.resend.push_back(Resend {
                from: c.offset,
                to: c.end,
                avoid: c.lane,
            });
        }
    }

    /// Chunks wait to be sent again.
    pub fn has_resend(&self) -> bool {
        !self.resend.is_empty()
    }

    /// Lane `lane` is gone: its chunks go again on the others. Returns how
    /// many.
    pub fn lane_lost(&mut self, lane: u64) -> usize {
        let before = self.resend.len();
        for i in 0..self.chunks.len() {
            if self.chunks[i].lane == lane {
                self.queue(i);
            }
        }
        self.resend.len() - before
    }

    /// Queues every chunk that has waited on its lane longer than that
    /// lane's `timeout` to go again on another. Returns the lanes found
    /// stalled (once each).
    pub fn check_stall(&mut self, now: u64, timeout: impl Fn(u64) -> Duration) -> Vec<u64> {
        let mut stalled: Vec<u64> = Vec::new();
        for i in 0..self.chunks.len() {
            let c = &self.chunks[i];
            if c.queued || now.saturating_sub(c.at) < timeout(c.lane).as_nanos() as u64 {
                continue;
            }
            if !stalled.contains(&c.lane) {
                stalled.push(c.lane);
            }
            self.queue(i);
        }
        stalled
    }

    /// The next chunk lane `lane` should send again, if any: one that
    /// avoids another lane, or avoids this one but the lane it avoided is
    /// gone (`live`) — that can happen only to a chunk queued for a lane
    /// that died since.
    pub fn take_resend(&mut self, lane: u64, live: impl Fn(u64) -> bool) -> Option<Resend> {
        let i = self
            .resend
            .iter()
            .position(|r| r.avoid != lane || !live(r.avoid))?;
        self.resend.remove(i)
    }

    /// Lane `lane` sends the chunk at `offset` again now.
    pub fn resending(&mut self, offset: u64, lane: u64, now: u64) {
        let i = self.chunks.partition_point(|c| c.offset < offset);
        if let Some(c) = self.chunks.get_mut(i).filter(|c| c.offset == offset) {
            c.lane = lane;
            c.at = now;
            c.queued = false;
            c.again = true;
        }
        self.resent += 1;
    }

    /// A resume: everything unacknowledged goes again in new chunks.
    pub fn reset(&mut self) {
        self.chunks.clear();
        self.resend.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(b: &[u8]) -> BytesMut {
        BytesMut::from(b)
    }

    #[test]
    fn chunks_come_out_in_order_once() {
        let mut r = Reorder::new(1 << 20);
        r.insert(3, chunk(b"def")).unwrap();
        assert_eq!(r.pop(), None);
        r.insert(0, chunk(b"abc")).unwrap();
        // The same chunk again (sent again after a stall) is dropped.
        r.insert(3, chunk(b"def")).unwrap();
        assert_eq!(r.held(), 6 + 2 * CHUNK_ENTRY_COST);
        assert_eq!(&r.pop().unwrap()[..], b"abc");
        assert_eq!(&r.pop().unwrap()[..], b"def");
        assert_eq!(r.pop(), None);
        r.insert(0, chunk(b"abc")).unwrap();
        assert_eq!(r.duplicates(), 2);
        assert_eq!((r.next(), r.held()), (6, 0));
        // An overlapping copy gives only what is new.
        r.insert(3, chunk(b"defgh")).unwrap();
        assert_eq!(&r.pop().unwrap()[..], b"gh");
    }

    #[test]
    fn tiny_chunks_past_a_gap_are_charged_what_they_cost() {
        // A peer leaves byte 0 missing and sends 1-byte chunks after it:
        // each costs its entry, so the bound is reached after
        // bound / (1 + CHUNK_ENTRY_COST) chunks, not after `bound` of them.
        let mut r = Reorder::new(64 << 10);
        let mut n = 0u64;
        while r.insert(1 + n, chunk(b"x")).is_ok() {
            n += 1;
            assert!(n < 1 << 20, "never refused");
        }
        assert!(
            n as usize <= r.bound() / (1 + CHUNK_ENTRY_COST),
            "{n} chunks held"
        );
    }

    #[test]
    fn bogus_chunks_are_errors() {
        let mut r = Reorder::new(1000);
        assert!(matches!(
            r.insert(u64::MAX - 1, chunk(b"abc")),
            Err(StripeError::BeyondWindow { .. })
        ));
        assert!(matches!(
            r.insert(2_000_000, chunk(b"abc")),
            Err(StripeError::BeyondWindow { .. })
        ));
        assert_eq!(r.insert(0, BytesMut::new()), Err(StripeError::BadLength(0)));
        let big = BytesMut::zeroed(CHUNK_MAX + 1);
        assert!(matches!(r.insert(0, big), Err(StripeError::BadLength(_))));
        // Overlapping copies with shifting boundaries count against the bound.
        let mut r = Reorder::new(CHUNK_MAX);
        let mut failed = false;
        for i in 1..100u64 {
            if r.insert(i, BytesMut::zeroed(CHUNK_MAX - 8)).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed);
        assert!(r.held() <= r.bound() + CHUNK_MAX);
    }

    #[test]
    fn a_lost_or_stalled_lane_has_its_chunks_sent_elsewhere() {
        let mut f = Flight::default();
        f.sent(0, 100, 1, 0);
        f.sent(100, 100, 2, 0);
        f.sent(200, 100, 1, 0);
        let t = |lane: u64| Duration::from_nanos(if lane == 1 { 100 } else { 1000 });
        assert!(f.check_stall(10, t).is_empty());
        assert_eq!(f.check_stall(200, t), vec![1]);
        // Queued once: no second stall for the same chunk.
        assert!(f.check_stall(300, t).is_empty());
        // Lane 1 does not take its own chunks back.
        let live = |_| true;
        assert_eq!(f.take_resend(1, live), None);
        let r = f.take_resend(2, live).unwrap();
        assert_eq!((r.from, r.to, r.avoid), (0, 100, 1));
        f.resending(0, 2, 300);
        f.acked(100, |_, _| {});
        // The second chunk of lane 1 is still queued; acked past it, gone.
        f.acked(300, |_, _| {});
        assert_eq!(f.take_resend(2, live), None);
        assert!(f.is_empty());
        f.sent(300, 10, 3, 400);
        assert_eq!(f.lane_lost(3), 1);
        assert_eq!(f.take_resend(4, live).unwrap().from, 300);
    }

    #[test]
    fn chunk_size_follows_the_rate() {
        assert_eq!(chunk_target(0), CHUNK_START);
        assert_eq!(chunk_target(1000), CHUNK_MIN);
        assert_eq!(chunk_target(10_000_000_000), CHUNK_MAX);
        assert_eq!(chunk_target(25_000_000), 100_000);
        assert_eq!(chunk_target(100_000), CHUNK_MIN);
        let ms = Duration::from_millis;
        assert_eq!(stall_timeout(ms(10), ms(200), ms(0)), STALL_MIN);
        assert_eq!(stall_timeout(ms(100), ms(300), ms(20)), ms(520));
    }

    proptest::proptest! {
        /// Chunks cut anywhere, spread over lanes that deliver in any
        /// order, some sent twice: the stream comes out whole, once.
        #[test]
        fn any_arrival_order_gives_the_stream_back_once(
            cuts in proptest::collection::vec(1usize..5000, 1..60),
            order in proptest::collection::vec(proptest::prelude::any::<u32>(), 60),
            twice in proptest::collection::vec(proptest::prelude::any::<bool>(), 60),
        ) {
            let total: usize = cuts.iter().sum();
            let stream: Vec<u8> = (0..total).map(|i| (i * 7 + i / 251) as u8).collect();
            let mut chunks = vec![];
            let mut at = 0;
            for (i, n) in cuts.iter().enumerate() {
                chunks.push((at as u64, BytesMut::from(&stream[at..at + n])));
                if twice[i] {
                    chunks.push((at as u64, BytesMut::from(&stream[at..at + n])));
                }
                at += n;
            }
            // A random permutation (lanes overtaking each other).
            let mut keyed: Vec<_> = chunks.into_iter().enumerate()
                .map(|(i, c)| (order[i % order.len()].wrapping_mul(i as u32 + 1), c))
                .collect();
            keyed.sort_by_key(|k| k.0);
            let mut r = Reorder::new(1 << 20);
            let mut out = Vec::new();
            for (_, (off, data)) in keyed {
                r.insert(off, data).unwrap();
                while let Some(run) = r.pop() {
                    out.extend_from_slice(&run);
                }
            }
            proptest::prop_assert_eq!(out, stream);
            proptest::prop_assert_eq!(r.held(), 0);
        }
    }
}
