//! The replay buffer (what was sent, kept until acknowledged) and the
//! receipt (what arrived, and what the peer has been told).

use std::collections::VecDeque;

use crate::frame::Frame;
use crate::outframe::OutFrame;

/// Default bound of the replay buffer when the path's buffers are unknown.
pub const DEFAULT_REPLAY_LIMIT: usize = 32 << 20;
/// How far an ACK may run ahead of what the replay buffer has recorded:
/// the writer records what a write took right after the write returns, and
/// on another thread the reader may see the peer's ACK for it first. Such
/// an ACK is held until the record catches up; one further ahead than any
/// single write can be is a lie.
pub const ACK_SLACK: u64 = 4 << 20;
/// Unacknowledged bytes that make an ACK worth a write of its own.
pub const ACK_EVERY_MAX: usize = 1 << 20;
/// Smallest replay bound a peer may announce (so it acknowledges often
/// enough without flooding ACKs).
pub const MIN_REPLAY_LIMIT: usize = 256 << 10;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("peer acknowledged byte {acked} of the session, but only {sent} were sent")]
    AckBeyondSent { acked: u64, sent: u64 },
    #[error("peer acknowledged byte {acked}, behind its earlier acknowledgement of {before}")]
    AckBackwards { acked: u64, before: u64 },
    #[error("peer says it received {received} bytes, but {sent} were sent")]
    ResumeBeyondSent { received: u64, sent: u64 },
    #[error("peer says it received {received} bytes, behind its acknowledgement of {acked}")]
    ResumeBehindAck { received: u64, acked: u64 },
    #[error("peer's offset {0} is not at a frame boundary")]
    NotAFrameBoundary(u64),
    #[error("the session has no link layer (resume was not agreed)")]
    NoLinkLayer,
    #[error("the session is over (closed, or not resumed in time)")]
    Ended,
}

/// The sending half: frames written, kept until acknowledged.
#[derive(Debug)]
pub struct Replay {
    /// Pristine copies of the frames written since `acked`, in wire order;
    /// they share their payload with the frame written (no copy).
    frames: VecDeque<OutFrame>,
    /// Sequence number of the first byte of `frames.front()`.
    start: u64,
    /// Sequence number of the next byte to be written.
    sent: u64,
    /// Highest acknowledgement from the peer.
    acked: u64,
    /// An acknowledgement ahead of `sent` (within [`ACK_SLACK`]), applied
    /// once the writer has recorded that far.
    early: u64,
    /// Bytes held in `frames` (header and payload).
    held: usize,
    limit: usize,
}

impl Replay {
    /// `limit`: bytes the buffer may hold before the writer must wait.
    pub fn new(limit: usize) -> Replay {
        Replay {
            frames: VecDeque::new(),
            start: 0,
            sent: 0,
            acked: 0,
            early: 0,
            held: 0,
            limit,
        }
    }

    /// Bytes that may still be written before an acknowledgement is needed.
    /// The writer takes at most this much from the multiplexer; a batch may
    /// overshoot by its last frame, so the real bound is `limit` plus one
    /// batch.
    pub fn room(&self) -> usize {
        self.limit.saturating_sub(self.held)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held for a possible replay.
    pub fn held(&self) -> usize {
        self.held
    }

    pub fn sent(&self) -> u64 {
        self.sent
    }

    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Records a frame as it starts going out (its first byte is about to be
    /// written). Link frames (ACK) and datagrams are not sequenced and are
    /// ignored.
    pub fn record(&mut self, f: &OutFrame) {
        if f.is_unsequenced() {
            return;
        }
        let copy = f.pristine();
        let n = copy.remaining();
        self.sent += n as u64;
        self.held += n;
        self.frames.push_back(copy);
        if self.early > self.acked && self.early <= self.sent {
            let early = std::mem::take(&mut self.early);
            // Checked when it arrived: ahead of `acked`, now within `sent`.
            let _ = self.ack(early);
        }
    }

    /// The peer has every byte below `acked`: frames wholly below it are let
    /// go. Returns whether room was freed.
    pub fn ack(&mut self, acked: u64) -> Result<bool, LinkError> {
        if acked > self.sent + ACK_SLACK {
            return Err(LinkError::AckBeyondSent {
                acked,
                sent: self.sent,
            });
        }
        if acked > self.sent {
            // Written but not yet recorded (see ACK_SLACK).
            self.early = self.early.max(acked);
            return Ok(false);
        }
        if acked < self.acked {
            return Err(LinkError::AckBackwards {
                acked,
                before: self.acked,
            });
        }
        self.acked = acked;
        let before = self.held;
        while let Some(f) = self.frames.front() {
            let n = f.remaining();
            if self.start + n as u64 > acked {
                break;
            }
            self.start += n as u64;
            self.held -= n;
            self.frames.pop_front();
        }
        Ok(self.held < before)
    }

    /// After a carrier drop: the peer has every byte below `received`.
    /// Returns fresh copies of every frame from there on, to be written
    /// first on the new carrier (they stay recorded: not to be recorded
    /// again).
    pub fn rewind(&mut self, received: u64) -> Result<Vec<OutFrame>, LinkError> {
        if received > self.sent {
            return Err(LinkError::ResumeBeyondSent {
                received,
                sent: self.sent,
            });
        }
        if received < self.acked {
            return Err(LinkError::ResumeBehindAck {
                received,
                acked: self.acked,
            });
        }
        // Check the boundary before letting anything go.
        let mut at = self.start;
        let mut boundary = at == received;
        for f in &self.frames {
            if at >= received {
                break;
            }
            at += f.remaining() as u64;
            boundary = at == received;
        }
        if !boundary {
            return Err(LinkError::NotAFrameBoundary(received));
        }
        self.ack(received)?;
        Ok(self.frames.iter().map(OutFrame::pristine).collect())
    }
}

impl Replay {
    /// Lowers the bound (a striped session keeps no more unacknowledged
    /// than the peer's reorder buffer can take: its announced bound).
    pub fn cap(&mut self, limit: usize) {
        self.limit = self.limit.min(limit);
    }

    /// Fresh copies of the frames that lie wholly in `from..to`, and the
    /// offset of the first: a chunk to send again on another lane of a
    /// striped session. Frames already acknowledged are gone, so the run
    /// may start later than `from`, or be empty.
    pub fn range(&self, from: u64, to: u64) -> (u64, Vec<OutFrame>) {
        let mut at = self.start;
        let mut first = None;
        let mut out = Vec::new();
        for f in &self.frames {
            let end = at + f.remaining() as u64;
            if end > to {
                break;
            }
            if at >= from {
                first.get_or_insert(at);
                out.push(f.pristine());
            }
            at = end;
        }
        (first.unwrap_or(at), out)
    }
}

/// The receiving half: what arrived, and what the peer has been told.
#[derive(Debug)]
pub struct Receipt {
    /// Bytes of whole sequenced frames received.
    received: u64,
    /// Highest acknowledgement sent.
    told: u64,
    /// Send an ACK on its own once this much is unacknowledged.
    ack_every: u64,
}

impl Receipt {
    /// `peer_limit`: the peer's replay bound. An ACK goes out on its own
    /// once a quarter of it, or [`ACK_EVERY_MAX`], is unacknowledged: the
    /// peer's writer never waits for one on a healthy carrier, and the
    /// buffers its replay holds are let go while still warm in its caches.
    pub fn new(peer_limit: usize) -> Receipt {
        Receipt {
            received: 0,
            told: 0,
            ack_every: (peer_limit.max(MIN_REPLAY_LIMIT) / 4).min(ACK_EVERY_MAX) as u64,
        }
    }

    /// A whole frame of `len` encoded bytes arrived (not a link frame).
    pub fn on_frame(&mut self, len: usize) {
        self.received += len as u64;
    }

    pub fn received(&self) -> u64 {
        self.received
    }

    /// The last acknowledgement sent.
    pub fn told(&self) -> u64 {
        self.told
    }

    /// Enough is unacknowledged that an ACK is worth a write of its own.
    pub fn ack_due(&self) -> bool {
        self.received - self.told >= self.ack_every
    }

    /// An ACK for everything received, if anything is unacknowledged: sent
    /// along with whatever the writer writes next.
    pub fn take_ack(&mut self) -> Option<Frame> {
        if self.received == self.told {
            return None;
        }
        self.told = self.received;
        Some(Frame::Ack {
            received: self.received,
        })
    }

    /// An ACK for everything received even if the peer was told it already:
    /// the last one may have been lost with the lane that carried it.
    pub fn take_ack_again(&mut self) -> Frame {
        self.told = self.received;
        Frame::Ack {
            received: self.received,
        }
    }

    /// A new carrier: the peer learns our offset in the resume exchange,
    /// which counts as an acknowledgement.
    pub fn resumed(&mut self) {
        self.told = self.received;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn frame(n: usize) -> OutFrame {
        let mut h = [0u8; crate::frame::DATA_HEADER_LEN];
        crate::frame::write_data_header(&mut h, 1, n);
        OutFrame::data(h, Bytes::from(vec![7u8; n]))
    }

    #[test]
    fn holds_until_acknowledged_and_replays_from_the_peer_offset() {
        let mut r = Replay::new(1000);
        for n in [100, 200, 300] {
            let mut f = frame(n);
            r.record(&f);
            // What is written afterwards does not change the copy.
            f.advance(50);
        }
        assert_eq!(r.sent(), 108 + 208 + 308);
        assert_eq!(r.held(), 624);
        assert_eq!(r.room(), 376);
        // An ACK inside the second frame frees only the first.
        assert!(r.ack(200).unwrap());
        assert_eq!(r.held(), 516);
        assert!(matches!(r.ack(100), Err(LinkError::AckBackwards { .. })));
        assert!(matches!(
            r.ack(10_000_000),
            Err(LinkError::AckBeyondSent { .. })
        ));
        // Resume: the peer got the first two frames.
        assert!(matches!(
            r.rewind(300),
            Err(LinkError::NotAFrameBoundary(300))
        ));
        let again = r.rewind(316).unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].remaining(), 308);
        assert_eq!(again[0].head().len(), 8);
        assert_eq!(r.held(), 308);
        // Everything received: nothing to send again.
        assert!(r.rewind(624).unwrap().is_empty());
        assert!(matches!(
            r.rewind(316),
            Err(LinkError::ResumeBehindAck { .. })
        ));
        assert!(matches!(
            r.rewind(625),
            Err(LinkError::ResumeBeyondSent { .. })
        ));
    }

    #[test]
    fn a_range_of_recorded_frames_comes_back_whole() {
        let mut r = Replay::new(1 << 20);
        for n in [100, 200, 300] {
            r.record(&frame(n));
        }
        let (at, fr) = r.range(108, 624);
        assert_eq!((at, fr.len()), (108, 2));
        let (at, fr) = r.range(108, 600);
        assert_eq!((at, fr.len()), (108, 1));
        r.ack(108).unwrap();
        let (at, fr) = r.range(0, 316);
        assert_eq!((at, fr.len()), (108, 1));
        assert!(r.range(0, 100).1.is_empty());
        r.cap(10);
        assert_eq!(r.limit(), 10);
    }

    #[test]
    fn an_ack_for_bytes_written_but_not_yet_recorded_waits_for_the_record() {
        let mut r = Replay::new(1 << 20);
        r.record(&frame(100));
        // The peer acknowledges the next frame before it is recorded.
        assert!(!r.ack(108 + 58).unwrap());
        assert_eq!(r.acked(), 0);
        r.record(&frame(50));
        assert_eq!(r.acked(), 166);
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn acks_are_not_sequenced_and_go_out_when_due() {
        let mut r = Replay::new(1 << 20);
        let ack = OutFrame::encoded(Frame::Ack { received: 5 }.to_bytes().unwrap());
        r.record(&ack);
        assert_eq!(r.sent(), 0);
        let mut rx = Receipt::new(1 << 20);
        assert_eq!(rx.take_ack(), None);
        rx.on_frame(1000);
        assert!(!rx.ack_due());
        rx.on_frame(256 << 10);
        assert!(rx.ack_due());
        assert_eq!(
            rx.take_ack(),
            Some(Frame::Ack {
                received: 1000 + (256 << 10)
            })
        );
        assert!(!rx.ack_due());
        assert_eq!(rx.take_ack(), None);
    }
}
