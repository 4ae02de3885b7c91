//! [`LinkLayer`]: the session's carriers by id, what losing one means, the
//! rules for attaching the next, and the single-carrier send and receive
//! paths (a striped session's are in `lanes.rs`).

use std::collections::VecDeque;
use std::time::Duration;

use super::lanes::Stripes;
use super::replay::{LinkError, Receipt, Replay, MIN_REPLAY_LIMIT};
use crate::frame::Frame;
use crate::outframe::OutFrame;
use crate::resume::{
    lane_proof, proof, proof_matches, Attach, Binding, Refusal, Secret, SessionId,
};
use crate::stripe::MAX_LANES;

/// A carrier (or lane) of the session, as the link layer names it: never
/// reused within a session, so input from a carrier that is gone can always
/// be told apart from the current one's.
pub type CarrierId = u64;

/// What losing a carrier means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// It was not current (lost before, or replaced): nothing to do.
    Stale,
    /// One lane of several: the session goes on over the `left` others,
    /// which send `resent` of its chunks again.
    Lane { left: usize, resent: usize },
    /// The last (or only) carrier: the session waits for a resume.
    Detached,
}

/// What input from a carrier did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The carrier is not current: its input was not counted (and must not
    /// have been handed on).
    Stale,
    /// Counted; `wake`: a writer has something to send now (replay room
    /// freed, or an ACK due).
    Applied { wake: bool },
}

/// Why an attach (resume or lane) was refused: the refusal for the wire,
/// and the reason for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRefused {
    pub refusal: Refusal,
    pub why: String,
}

fn refused(refusal: Refusal, why: String) -> Result<(), AttachRefused> {
    Err(AttachRefused { refusal, why })
}

#[derive(Debug)]
struct Attached {
    id: CarrierId,
    /// The lane's number as the client named it (0 for a single carrier).
    number: u8,
}

/// The link layer of one resumable session (see the module docs).
#[derive(Debug)]
pub struct LinkLayer {
    pub(super) replay: Replay,
    pub(super) rx: Receipt,
    /// A striped session's chunks (several lanes).
    pub(super) stripes: Option<Stripes>,
    carriers: Vec<Attached>,
    next_id: CarrierId,
    /// A first carrier was attached.
    started: bool,
    /// When the last carrier was lost (ns), until a resume.
    detached_since: Option<u64>,
    /// Frames the last single-carrier writer took and had not started:
    /// written after the replay on the next carrier.
    leftover: VecDeque<OutFrame>,
    id: SessionId,
    secret: Secret,
    /// Client: the last attempt number used. Server: the highest accepted.
    attempt: u64,
    /// Server: who authenticated the session's first carrier.
    owner: String,
    resumes: u64,
    replayed: u64,
}

impl LinkLayer {
    /// `limit`: our replay bound; `peer_limit`: the peer's; `lanes`: lanes
    /// agreed (2 or more: striped). `owner`: who started the session (the
    /// server checks that later carriers come from the same identity).
    pub fn new(
        limit: usize,
        peer_limit: usize,
        lanes: u8,
        id: SessionId,
        secret: Secret,
        owner: String,
    ) -> LinkLayer {
        let mut replay = Replay::new(limit);
        let stripes = (lanes >= 2).then(|| {
            // We keep no more unacknowledged than the peer's reorder
            // window (its replay bound); ours is what we accept.
            replay.cap(peer_limit.max(MIN_REPLAY_LIMIT));
            Stripes::new(lanes.min(MAX_LANES as u8), limit)
        });
        LinkLayer {
            replay,
            rx: Receipt::new(peer_limit),
            stripes,
            carriers: Vec::new(),
            next_id: 1,
            started: false,
            detached_since: None,
            leftover: VecDeque::new(),
            id,
            secret,
            attempt: 0,
            owner,
            resumes: 0,
            replayed: 0,
        }
    }

    pub fn session_id(&self) -> SessionId {
        self.id
    }

    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    pub fn attempt(&self) -> u64 {
        self.attempt
    }

    pub fn is_striped(&self) -> bool {
        self.stripes.is_some()
    }

    /// Lanes agreed (1 for a single carrier).
    pub fn lanes_wanted(&self) -> usize {
        self.stripes.as_ref().map_or(1, |s| s.wanted as usize)
    }

    /// Carriers attached now, with their lane numbers.
    pub fn carriers(&self) -> Vec<(CarrierId, u8)> {
        self.carriers.iter().map(|c| (c.id, c.number)).collect()
    }

    /// Lane `lane`'s chunks stalled, and nothing it sent since was
    /// acknowledged (striped sessions; see `lane_quiet`).
    pub fn lane_stalled(&self, lane: CarrierId) -> bool {
        self.stripes
            .as_ref()
            .is_some_and(|s| s.stalled.iter().any(|m| m.lane == lane))
    }

    /// The one check of every input and every take: is `carrier` attached
    /// now? Whatever a carrier that is gone still reads is not counted,
    /// and nothing more is given to it to write.
    pub fn is_current(&self, carrier: CarrierId) -> bool {
        self.carriers.iter().any(|c| c.id == carrier)
    }

    pub fn is_detached(&self) -> bool {
        self.detached_since.is_some()
    }

    /// Carrier drops survived, and bytes sent again after them.
    pub fn resumes(&self) -> u64 {
        self.resumes
    }

    pub fn replayed(&self) -> u64 {
        self.replayed
    }

    pub fn replay(&self) -> &Replay {
        &self.replay
    }

    pub fn received(&self) -> u64 {
        self.rx.received()
    }

    /// Chunks sent again on another lane, and chunks that arrived twice.
    pub fn stripe_counters(&self) -> (u64, u64) {
        self.stripes
            .as_ref()
            .map_or((0, 0), |s| (s.flight.resent, s.reorder.duplicates()))
    }

    fn add(&mut self, number: u8) -> CarrierId {
        let id = self.next_id;
        self.next_id += 1;
        self.carriers.push(Attached { id, number });
        self.started = true;
        self.detached_since = None;
        id
    }

    /// Attaches the session's first carrier, or one more lane of a striped
    /// session. Refused once the session is detached (only a resume
    /// attaches then: a lane joining as the last one fails would skip the
    /// replay) or has its lanes.
    pub fn attach(&mut self, number: u8) -> Result<CarrierId, AttachRefused> {
        if self.started {
            self.lane_room()?;
        }
        Ok(self.add(number))
    }

    fn lane_room(&self) -> Result<(), AttachRefused> {
        let wanted = self.lanes_wanted();
        if self.stripes.is_none() {
            refused(Refusal::Denied, "the session is not striped".into())
        } else if self.is_detached() {
            refused(
                Refusal::Denied,
                "the session has no lane left: it must be resumed first".into(),
            )
        } else if self.carriers.len() >= wanted {
            refused(
                Refusal::LanesFull,
                format!("the session has its {wanted} lanes already (a lane more is refused)"),
            )
        } else {
            Ok(())
        }
    }

    /// `carrier` failed (read or write error, EOF, silence) or was stopped.
    pub fn carrier_lost(&mut self, carrier: CarrierId, now: u64) -> Lost {
        let Some(i) = self.carriers.iter().position(|c| c.id == carrier) else {
            return Lost::Stale;
        };
        self.carriers.remove(i);
        if self.carriers.is_empty() {
            self.detached_since = Some(now);
            return Lost::Detached;
        }
        let live: Vec<CarrierId> = self.carriers.iter().map(|c| c.id).collect();
        let s = self.stripes.as_mut().expect("only lanes come several");
        // Whatever ACK it carried may be lost with it.
        s.owed = live;
        Lost::Lane {
            left: self.carriers.len(),
            resent: s.flight.lane_lost(carrier),
        }
    }

    /// Every carrier is lost now (before a resume, or a silent peer).
    pub fn lose_all(&mut self, now: u64) {
        for (id, _) in self.carriers() {
            self.carrier_lost(id, now);
        }
    }

    /// How long the session has been without a carrier.
    pub fn detached_for(&self, now: u64) -> Option<Duration> {
        self.detached_since
            .map(|t| Duration::from_nanos(now.saturating_sub(t)))
    }

    /// Server: when a detached session is given up (`timeout`: how long it
    /// waits for a resume).
    pub fn poll_timeout(&self, timeout: Duration) -> Option<u64> {
        self.detached_since
            .map(|t| t.saturating_add(timeout.as_nanos() as u64))
    }

    /// Server: a detached session waited longer than `timeout`.
    pub fn resume_expired(&self, now: u64, timeout: Duration) -> bool {
        self.poll_timeout(timeout).is_some_and(|t| now >= t)
    }

    /// Client: an attempt number larger than any used before, even by a
    /// client that lost count (`wall_ms`: milliseconds since the epoch).
    fn next_attempt(&mut self, wall_ms: u64) -> u64 {
        self.attempt = (self.attempt + 1).max(wall_ms);
        self.attempt
    }

    /// Client: the request that resumes the session on a carrier whose TLS
    /// exporter value is `binding`.
    pub fn resume_request(&mut self, binding: &Binding, wall_ms: u64) -> Attach {
        let attempt = self.next_attempt(wall_ms);
        let received = self.rx.received();
        Attach::Resume {
            id: self.id,
            attempt,
            received,
            proof: proof(&self.secret, &self.id, attempt, received, binding),
            replay_limit: self.replay.limit() as u32,
        }
    }

    /// Client: the request that adds lane `number`.
    pub fn lane_request(&mut self, number: u8, binding: &Binding, wall_ms: u64) -> Attach {
        let attempt = self.next_attempt(wall_ms);
        Attach::Lane {
            id: self.id,
            attempt,
            lane: number,
            proof: lane_proof(&self.secret, &self.id, attempt, number, binding),
        }
    }

    /// Checks who asks and their proof (the caller then spends the
    /// attempt number).
    fn check_proof(
        &self,
        owner: &str,
        attempt: u64,
        expected: [u8; 32],
        shown: &[u8; 32],
    ) -> Result<(), AttachRefused> {
        let id = self.id;
        if owner != self.owner {
            refused(
                Refusal::Denied,
                format!("session {id} belongs to {}, not to {owner}", self.owner),
            )
        } else if !proof_matches(&expected, shown) {
            refused(
                Refusal::Denied,
                format!("wrong proof of the secret of session {id}"),
            )
        } else if attempt <= self.attempt {
            refused(
                Refusal::Denied,
                format!("attempt {attempt} for session {id} was already used (replayed?)"),
            )
        } else {
            Ok(())
        }
    }

    /// Server: may `owner` resume the session with this proof, made on a
    /// carrier bound to `binding`? Uses up the attempt number if so.
    pub fn check_resume(
        &mut self,
        owner: &str,
        attempt: u64,
        received: u64,
        shown: &[u8; 32],
        binding: &Binding,
    ) -> Result<(), AttachRefused> {
        let expected = proof(&self.secret, &self.id, attempt, received, binding);
        self.check_proof(owner, attempt, expected, shown)?;
        // A proof shown is spent, whatever else is wrong.
        self.attempt = attempt;
        self.check_offset(received)
    }

    /// Whether the peer's offset fits what was sent and acknowledged.
    pub fn check_offset(&self, received: u64) -> Result<(), AttachRefused> {
        let (sent, acked) = (self.replay.sent(), self.replay.acked());
        if received > sent || received < acked {
            return refused(
                Refusal::BadOffset,
                format!(
                    "session {}: the peer has {received} bytes, but {acked}..={sent} is possible",
                    self.id
                ),
            );
        }
        Ok(())
    }

    /// Server: may `owner` add lane `lane` with this proof? Uses up the
    /// attempt number if so.
    pub fn check_lane(
        &mut self,
        owner: &str,
        attempt: u64,
        lane: u8,
        shown: &[u8; 32],
        binding: &Binding,
    ) -> Result<(), AttachRefused> {
        let expected = lane_proof(&self.secret, &self.id, attempt, lane, binding);
        self.check_proof(owner, attempt, expected, shown)?;
        self.attempt = attempt;
        self.lane_room()
    }

    /// Attaches a carrier to the detached session after the resume
    /// exchange: `peer_received` is what the peer has of ours. Returns the
    /// carrier's id and, for a single carrier, the frames to write first
    /// (a striped session's lanes take them as chunks to send again).
    pub fn resume(
        &mut self,
        number: u8,
        peer_received: u64,
        now: u64,
    ) -> Result<(CarrierId, Vec<OutFrame>), LinkError> {
        self.lose_all(now);
        let resend = self.replay.rewind(peer_received)?;
        self.rx.resumed();
        let bytes: u64 = resend.iter().map(|f| f.remaining() as u64).sum();
        self.resumes += 1;
        self.replayed += bytes;
        let resend = match self.stripes.as_mut() {
            Some(s) => {
                s.resumed(peer_received, &resend, now);
                Vec::new()
            }
            None => resend,
        };
        Ok((self.add(number), resend))
    }

    /// The peer acknowledged every byte below `received`. Returns whether
    /// replay room was freed.
    pub fn on_ack(&mut self, received: u64) -> Result<bool, LinkError> {
        let Some(s) = self.stripes.as_mut() else {
            return self.replay.ack(received);
        };
        if received <= self.replay.acked() {
            // ACKs on different lanes overtake each other: an older one is
            // no news.
            return Ok(false);
        }
        let freed = self.replay.ack(received)?;
        let stalled = &mut s.stalled;
        s.flight.acked(self.replay.acked(), |lane, at| {
            // The chunk it was blamed for, or one it sent after, arrived
            // as it sent it (TCP keeps a connection's order): it delivers.
            stalled.retain(|m| m.lane != lane || at < m.sent);
        });
        Ok(freed)
    }

    /// Enough arrived since the last ACK that one must go now.
    pub fn ack_due(&self) -> bool {
        self.rx.ack_due()
    }

    /// Single carrier: bytes `room` that may be taken from the multiplexer
    /// before an ACK is needed.
    pub fn room(&self) -> usize {
        self.replay.room()
    }

    /// Single carrier: a frame starts going out (recorded for a replay).
    pub fn record(&mut self, f: &OutFrame) {
        self.replay.record(f);
    }

    /// Single carrier: the ACK to put in front of what goes out now, if
    /// any (`sending`: the writer has frames to send anyway).
    pub fn ack_to_send(&mut self, sending: bool) -> Option<Frame> {
        if sending || self.rx.ack_due() {
            self.rx.take_ack()
        } else {
            None
        }
    }

    /// Single carrier: `frames` bytes of whole frames arrived on `carrier`
    /// and were handed on, with the peer's latest ACK.
    pub fn on_input(
        &mut self,
        carrier: CarrierId,
        frames: usize,
        ack: Option<u64>,
    ) -> Result<Input, LinkError> {
        if !self.is_current(carrier) {
            return Ok(Input::Stale);
        }
        self.rx.on_frame(frames);
        let freed = match ack {
            Some(a) => self.on_ack(a)?,
            None => false,
        };
        Ok(Input::Applied {
            wake: freed || self.rx.ack_due(),
        })
    }

    /// Single carrier: what a stopped writer had taken and not started
    /// (started frames are recorded already; ACKs are made afresh).
    pub fn save_leftover(&mut self, mut batch: VecDeque<OutFrame>) {
        if batch.front().is_some_and(|f| f.started) {
            batch.pop_front();
        }
        // ACKs are made afresh; datagrams are stale by the next carrier.
        batch.retain(|f| !f.is_unsequenced());
        self.leftover.extend(batch);
    }

    /// Single carrier: what the last writer left, to go after the replay.
    pub fn take_leftover(&mut self) -> VecDeque<OutFrame> {
        std::mem::take(&mut self.leftover)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn link(lanes: u8) -> LinkLayer {
        LinkLayer::new(
            1 << 20,
            1 << 20,
            lanes,
            SessionId([1; 16]),
            Secret([2; 32]),
            "alice".into(),
        )
    }

    fn frame(n: usize) -> OutFrame {
        let mut h = [0u8; crate::frame::DATA_HEADER_LEN];
        crate::frame::write_data_header(&mut h, 1, n);
        OutFrame::data(h, Bytes::from(vec![7u8; n]))
    }

    #[test]
    fn input_from_a_carrier_no_longer_current_is_not_counted() {
        let mut l = link(0);
        let old = l.attach(0).unwrap();
        assert_eq!(
            l.on_input(old, 100, None),
            Ok(Input::Applied { wake: false })
        );
        assert_eq!(l.carrier_lost(old, 5), Lost::Detached);
        // The old reader still hands in what it read: refused, uncounted.
        assert_eq!(l.on_input(old, 50, Some(0)), Ok(Input::Stale));
        assert_eq!(l.received(), 100);
        let (new, again) = l.resume(0, 0, 10).unwrap();
        assert!(again.is_empty());
        assert_ne!(new, old);
        assert_eq!(l.carrier_lost(old, 11), Lost::Stale);
        assert!(l.is_current(new));
    }

    #[test]
    fn a_lane_joining_as_the_last_one_fails_is_refused_until_a_resume() {
        let mut l = link(3);
        let a = l.attach(0).unwrap();
        let b = l.attach(1).unwrap();
        assert_eq!(l.carrier_lost(a, 1), Lost::Lane { left: 1, resent: 0 });
        // The check passes while a lane is left…
        let p = lane_proof(l.secret(), &l.session_id(), 5, 2, &[0; 32]);
        assert!(l.check_lane("alice", 5, 2, &p, &[0; 32]).is_ok());
        // …then the last lane fails before the join attaches.
        assert_eq!(l.carrier_lost(b, 2), Lost::Detached);
        assert!(l.attach(2).is_err());
        let p = lane_proof(l.secret(), &l.session_id(), 6, 2, &[0; 32]);
        assert!(l.check_lane("alice", 6, 2, &p, &[0; 32]).is_err());
        // Only a resume attaches; lanes join after it.
        l.resume(0, 0, 3).unwrap();
        assert!(l.attach(2).is_ok());
        assert!(l.attach(1).is_ok());
        assert!(l.attach(3).is_err(), "a lane more than agreed");
        // A lane more, with a good proof, is told the session is full.
        let p = lane_proof(l.secret(), &l.session_id(), 7, 4, &[0; 32]);
        let e = l.check_lane("alice", 7, 4, &p, &[0; 32]).unwrap_err();
        assert_eq!(e.refusal, Refusal::LanesFull);
        assert!(
            e.refusal.as_str().contains("lane"),
            "{}",
            e.refusal.as_str()
        );
    }

    #[test]
    fn attach_rules_check_owner_proof_attempt_and_offset() {
        let mut l = link(0);
        let c = l.attach(0).unwrap();
        for _ in 0..3 {
            l.record(&frame(100));
        }
        l.carrier_lost(c, 1);
        let (id, s) = (l.session_id(), l.secret().clone());
        let ok = proof(&s, &id, 9, 108, &[4; 32]);
        let e = l
            .check_resume("mallory", 9, 108, &ok, &[4; 32])
            .unwrap_err();
        assert_eq!(e.refusal, Refusal::Denied);
        // Made on another carrier (binding): refused.
        assert!(l.check_resume("alice", 9, 108, &ok, &[5; 32]).is_err());
        assert!(l.check_resume("alice", 9, 108, &ok, &[4; 32]).is_ok());
        // The same attempt again: replayed.
        assert!(l.check_resume("alice", 9, 108, &ok, &[4; 32]).is_err());
        let far = proof(&s, &id, 10, 10_000, &[4; 32]);
        let e = l
            .check_resume("alice", 10, 10_000, &far, &[4; 32])
            .unwrap_err();
        assert_eq!(e.refusal, Refusal::BadOffset);
        let (_, again) = l.resume(0, 108, 2).unwrap();
        assert_eq!(again.len(), 2);
        assert_eq!((l.resumes(), l.replayed()), (1, 216));
    }
}
