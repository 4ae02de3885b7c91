//! A striped session's send and receive paths (see [`crate::stripe`] for
//! the chunks, the reorder buffer and the record of chunks in flight).
//!
//! A lane's writer asks for work whenever its socket has room
//! ([`LinkLayer::next_chunk`]): first a chunk some other lane must send
//! again, else the next frames from the multiplexer, recorded in the replay
//! buffer and in the flight record at once, so offsets follow the order the
//! multiplexer produced. An ACK rides in front when one is due or owed.
//! A lane's reader hands each chunk in ([`LinkLayer::on_chunk`]) and takes
//! out the runs now in order ([`LinkLayer::next_run`]).
//!
//! When an ACK is *owed* even though the peer may have been told already:
//! a lane was lost (the ACK it carried may be lost with it), or a chunk
//! arrived twice (the peer sent it again because it did not hear of it).
//! Without that, a sender at its replay bound whose ACK was lost would
//! wait for good.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::layer::{CarrierId, LinkLayer};
use crate::frame::{Frame, DATA_HEADER_LEN, MAX_FRAME_LEN};
use crate::outframe::OutFrame;
use crate::stripe::{Flight, Reorder, StripeError, CHUNK_MAX};

/// Frames one chunk may carry.
pub const MAX_CHUNK_FRAMES: usize = 64;
/// Bytes a chunk is filled to at most before its last frame (which may
/// overshoot by one frame).
pub const CHUNK_FILL: usize = CHUNK_MAX - MAX_FRAME_LEN;
/// Smallest part of a DATA frame cut off to fill a chunk.
const MIN_SPLIT: usize = 1024;
/// Control frames (WINDOW_ADJUST, PONG, CLOSE…) still go while the replay
/// buffer is full, up to this much past its bound: the peer's reorder
/// window has one chunk of slack, and a session whose data waits for an
/// ACK must still answer a PING.
const CONTROL_SLACK: usize = CHUNK_MAX / 2;
/// Stalled lanes are logged at most this often.
const STALL_LOG_EVERY: Duration = Duration::from_secs(5);
/// A lane id no lane has: chunks to send again on any lane.
const ANY_LANE: CarrierId = CarrierId::MAX;

/// How long a lane stays marked as stalled at most: a lane that only
/// lagged is not avoided for long, and one still bad is marked again by
/// its next chunk that stalls.
pub const STALL_MARK_TTL: u64 = 3_000_000_000;

/// A lane found holding the oldest chunk past its stall timeout: the
/// chunk every other is waiting for, so this lane lost it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallMark {
    pub lane: CarrierId,
    /// When the lane sent the chunk it lost: only a chunk it sent later,
    /// and once only, proves it delivers again.
    pub sent: u64,
    pub marked: u64,
}

/// The link layer's extra state in a striped session.
#[derive(Debug)]
pub(super) struct Stripes {
    /// Lanes agreed for the session.
    pub wanted: u8,
    pub reorder: Reorder,
    pub flight: Flight,
    /// The rest of a DATA frame cut to fit the last chunk: the next frame
    /// to send, before anything from the multiplexer (not yet recorded).
    pub carry: Option<OutFrame>,
    /// Lanes that owe the peer an ACK whatever it was told (see the module
    /// docs): every lane, so that one on a stalled or dying lane is not
    /// the only copy.
    pub owed: Vec<CarrierId>,
    /// Datagrams arrived since the last tick: every lane owes an ACK, so
    /// that each healthy lane keeps hearing while datagrams flow (a lane
    /// that hears nothing takes no datagrams, `lane_quiet`).
    pub datagrams_seen: bool,
    pub goodbye_sent: bool,
    /// When a stalled lane may be logged again.
    next_stall_log: u64,
    /// Lanes that lost a chunk (see [`StallMark`]): datagrams avoid them
    /// (a lane may still hear and no longer send, and a datagram written
    /// into it is lost). At most one per lane, lanes gone and marks past
    /// [`STALL_MARK_TTL`] dropped at each tick.
    pub stalled: Vec<StallMark>,
}

impl Stripes {
    /// `own_limit`: this side's replay bound, which the peer's sender
    /// respects: the reorder window.
    pub fn new(wanted: u8, own_limit: usize) -> Stripes {
        Stripes {
            wanted,
            reorder: Reorder::new(own_limit),
            flight: Flight::default(),
            carry: None,
            owed: Vec::new(),
            datagrams_seen: false,
            goodbye_sent: false,
            next_stall_log: 0,
            stalled: Vec::new(),
        }
    }

    /// A resume: the peer has our bytes below `from`; `resend` (the replay
    /// from there) goes again, in new chunks, on whichever lane asks first.
    pub fn resumed(&mut self, from: u64, resend: &[OutFrame], now: u64) {
        self.reorder.reset();
        self.flight.reset();
        self.owed.clear();
        self.stalled.clear();
        let mut at = from;
        let (mut size, mut frames) = (0usize, 0usize);
        for f in resend {
            size += f.remaining();
            frames += 1;
            if size >= CHUNK_FILL || frames >= MAX_CHUNK_FRAMES {
                self.flight.queue_again(at, size, ANY_LANE, now);
                at += size as u64;
                (size, frames) = (0, 0);
            }
        }
        if size > 0 {
            self.flight.queue_again(at, size, ANY_LANE, now);
        }
    }
}

/// What a lane may take from the multiplexer for one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Control frames first, while they total less than this…
    pub control: usize,
    /// …then anything (data included) while the total is under this.
    pub bytes: usize,
    /// The batch holds at most this many frames (those in it already
    /// included).
    pub frames: usize,
}

/// One chunk for a lane to write (and the ACK in front of it).
#[derive(Debug)]
pub struct Chunk {
    /// Bytes for one vectored write, in order.
    pub pieces: VecDeque<Bytes>,
    /// Sequenced bytes it carries (0: an ACK alone).
    pub len: usize,
    /// It is a chunk sent again for another lane.
    pub resent: bool,
    /// More is waiting to be sent: another lane may take it.
    pub more: bool,
}

/// What the stall check found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tick {
    /// Lanes holding a chunk far longer than their path needs: their
    /// chunks go again on the others.
    pub stalled: Vec<CarrierId>,
    /// Worth a log line (at most every few seconds).
    pub log: bool,
    /// Chunks wait to be sent again, or an ACK is owed: every lane's
    /// writer should look, not just one (the one woken might be the lane
    /// they avoid, or a stalled one).
    pub wake_all: bool,
}

/// An optional ACK, then a chunk of `frames` from `offset` on.
fn chunk_pieces(
    ack: Option<Frame>,
    offset: u64,
    frames: Vec<OutFrame>,
) -> (VecDeque<Bytes>, usize) {
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

impl LinkLayer {
    /// The next chunk for lane `lane` to write, whose socket has room for
    /// about `target` bytes. `pull` takes frames from the multiplexer
    /// within a [`Budget`] and says whether more output waits. `None`:
    /// nothing to send (or the lane is not current).
    pub fn next_chunk(
        &mut self,
        lane: CarrierId,
        target: usize,
        now: u64,
        pull: impl FnOnce(Budget, &mut VecDeque<OutFrame>) -> bool,
    ) -> Option<Chunk> {
        if !self.is_current(lane) {
            return None;
        }
        let live = self.carriers();
        let s = self.stripes.as_mut()?;
        let mut frames: Vec<OutFrame> = Vec::new();
        let mut offset = 0;
        let mut resent = false;
        let mut more = false;
        let lane_live = |l: CarrierId| live.iter().any(|c| c.0 == l);
        while let Some(r) = s.flight.take_resend(lane, lane_live) {
            let (at, fr) = self.replay.range(r.from, r.to);
            if !fr.is_empty() {
                // The record keys it by where it started (part of it may be
                // acknowledged by now).
                s.flight.resending(r.from, lane, now);
                offset = at;
                frames = fr;
                resent = r.avoid != ANY_LANE;
                more = s.flight.has_resend();
                break;
            }
        }
        if frames.is_empty() {
            // Never more unacknowledged than the peer's reorder window
            // allows, except a little for control frames.
            let limit = target.min(CHUNK_FILL).min(self.replay.room());
            let control = (self.replay.limit() + CONTROL_SLACK)
                .saturating_sub(self.replay.held())
                .min(CHUNK_FILL);
            let mut batch = VecDeque::new();
            // The rest of a frame cut to fit the last chunk goes first, and
            // nothing else goes before it: frames of its stream queued
            // since (its EOF or CLOSE, in the control lane) must follow it.
            // It goes with the data's room, or within the control slack.
            let mut carried = 0;
            let mut blocked = false;
            if let Some(c) = s.carry.take() {
                if limit > 0 || c.remaining() <= control {
                    carried = c.remaining();
                    batch.push_back(c);
                } else {
                    s.carry = Some(c);
                    blocked = true;
                }
            }
            let budget = Budget {
                control: control.saturating_sub(carried),
                bytes: limit.saturating_sub(carried),
                frames: MAX_CHUNK_FRAMES,
            };
            if !blocked {
                more = pull(budget, &mut batch);
            }
            let control_taken: usize = batch
                .iter()
                .filter(|f| f.head().is_empty())
                .map(OutFrame::remaining)
                .sum();
            // Only data taken beyond the room is cut; what went within the
            // control slack (the carry, control frames) stays whole.
            fit_to_chunk(&mut batch, limit.max(control_taken + carried), &mut s.carry);
            more |= s.carry.is_some();
            offset = self.replay.sent();
            for f in &batch {
                self.replay.record(f);
            }
            let len = (self.replay.sent() - offset) as usize;
            if len > 0 {
                s.flight.sent(offset, len, lane, now);
            }
            frames = batch.into();
            more |= s.flight.has_resend();
        }
        // Every chunk carries the latest ACK: one handed to a lane that
        // stalls since is then repeated by whatever lane goes next, and a
        // chunk sent again elsewhere after a stall brings it along.
        let owed = match s.owed.iter().position(|&l| l == lane) {
            Some(i) => {
                s.owed.swap_remove(i);
                true
            }
            None => false,
        };
        let ack = if owed || !frames.is_empty() {
            Some(self.rx.take_ack_again())
        } else if self.rx.ack_due() {
            self.rx.take_ack()
        } else {
            None
        };
        if frames.is_empty() && ack.is_none() {
            return None;
        }
        let (pieces, len) = chunk_pieces(ack, offset, frames);
        Some(Chunk {
            pieces,
            len,
            resent,
            more,
        })
    }

    /// The GOODBYE that ends a striped session, as a chunk after every
    /// other (once: the first lane to ask writes it).
    pub fn goodbye_chunk(&mut self) -> Option<VecDeque<Bytes>> {
        let s = self.stripes.as_mut()?;
        if std::mem::replace(&mut s.goodbye_sent, true) {
            return None;
        }
        let body = Frame::Goodbye.to_bytes().expect("an empty frame");
        let header = Frame::Chunk {
            offset: self.replay.sent(),
            len: body.len() as u32,
        };
        Some([header.to_bytes().expect("a fixed frame"), body].into())
    }

    /// A chunk arrived on `lane`: `data` is the session's byte stream from
    /// `offset`. `Ok(false)`: the lane is not current (nothing counted).
    pub fn on_chunk(
        &mut self,
        lane: CarrierId,
        offset: u64,
        data: BytesMut,
    ) -> Result<bool, StripeError> {
        if !self.is_current(lane) {
            return Ok(false);
        }
        let live: Vec<CarrierId> = self.carriers().iter().map(|c| c.0).collect();
        let Some(s) = self.stripes.as_mut() else {
            return Ok(false);
        };
        let before = s.reorder.duplicates();
        s.reorder.insert(offset, data)?;
        if s.reorder.duplicates() > before {
            // Sent again: the peer did not hear our ACK for it.
            s.owed = live;
        }
        Ok(true)
    }

    /// The next run of the peer's bytes now in order, counted as received:
    /// the caller decodes its frames and hands them on before releasing
    /// the link layer.
    pub fn next_run(&mut self) -> Option<BytesMut> {
        let run = self.stripes.as_mut()?.reorder.pop()?;
        self.rx.on_frame(run.len());
        Some(run)
    }

    /// An ACK should go out now (due by volume, or owed).
    pub fn ack_wanted(&self) -> bool {
        self.rx.ack_due() || self.stripes.as_ref().is_some_and(|s| !s.owed.is_empty())
    }

    /// A datagram arrived on a lane: at the next tick every lane owes an
    /// ACK, so that each healthy lane is heard while datagrams flow.
    pub fn datagram_heard(&mut self) {
        if let Some(s) = self.stripes.as_mut() {
            s.datagrams_seen = true;
        }
    }

    /// The striped session's timer: chunks waiting on a lane longer than
    /// `timeout(lane)` are queued to go again on another; an ACK is owed
    /// for whatever arrived since the last one.
    pub fn on_tick(&mut self, now: u64, timeout: impl Fn(CarrierId) -> Duration) -> Tick {
        let live: Vec<CarrierId> = self.carriers().iter().map(|c| c.0).collect();
        let several = live.len() > 1;
        let received = self.rx.received() > self.rx.told();
        let Some(s) = self.stripes.as_mut() else {
            return Tick::default();
        };
        // Acknowledgements are cumulative: every lane's chunks stall behind
        // one lost chunk, and only the lane that lost the oldest is at
        // fault — when that chunk itself stalled now (not a copy still on
        // its way, sent again by another lane).
        let before = s.flight.oldest().filter(|o| !o.queued);
        let stalled = if several {
            s.flight.check_stall(now, timeout)
        } else {
            Vec::new()
        };
        s.stalled
            .retain(|m| live.contains(&m.lane) && now.saturating_sub(m.marked) < STALL_MARK_TTL);
        let culprit = before.filter(|_| s.flight.oldest().is_some_and(|o| o.queued));
        if let Some(o) = culprit.filter(|o| !s.stalled.iter().any(|m| m.lane == o.lane)) {
            s.stalled.push(StallMark {
                lane: o.lane,
                sent: o.at,
                marked: now,
            });
        }
        let datagrams = std::mem::take(&mut s.datagrams_seen);
        if received || !stalled.is_empty() || datagrams {
            // Something arrived since the last ACK; or a lane stalled, and
            // the last ACK may be waiting on it.
            s.owed = live;
        }
        let log = !stalled.is_empty() && now >= s.next_stall_log;
        if log {
            s.next_stall_log = now + STALL_LOG_EVERY.as_nanos() as u64;
        }
        Tick {
            wake_all: s.flight.has_resend() || !s.owed.is_empty(),
            stalled,
            log,
        }
    }
}

/// A striped session of two lanes with a 1 MiB replay bound, for tests;
/// `peer_limit`: the peer's bound (ours to keep unacknowledged).
#[cfg(test)]
#[path = "lanes_tests.rs"]
mod lanes_tests;
