//! Which lanes of a striped session datagrams should avoid: a lane that
//! has heard nothing for [`QUIET`] while another has heard something, and
//! a lane whose chunks stalled with nothing it sent acknowledged since
//! (it may still hear, and no longer send) while another is free of
//! both. A datagram is never resent, so one written into such a lane (a
//! NAT that forgot the flow, a dead path without a reset, one direction
//! black-holed) is lost; bytes in chunks are resent, datagrams only avoid
//! the lane. While every lane is quiet (an idle session), or every lane
//! stalled, none is avoided.
//!
//! Not seen: a lane that hears and cannot send while it carries no
//! chunks (only datagrams and ACKs flow): nothing it sends is
//! acknowledged, so nothing stalls.

use crate::link::{CarrierId, LinkLayer};

/// Whether datagrams should avoid lane `lane` of `link` now (see the
/// module docs).
pub fn datagrams_avoid(
    heard: &mut LanesHeard,
    link: &LinkLayer,
    lane: CarrierId,
    now: u64,
) -> bool {
    let current = |c| link.is_current(c);
    if heard.avoid(lane, now, current) {
        return true;
    }
    link.lane_stalled(lane)
        && link
            .carriers()
            .iter()
            .any(|&(c, _)| c != lane && !link.lane_stalled(c) && !heard.avoid(c, now, current))
}

/// How long a lane may hear nothing before datagrams avoid it (when
/// another lane has heard something meanwhile).
pub const QUIET: u64 = 500_000_000;

/// When each lane last heard from the peer (at most 16 lanes).
#[derive(Debug, Default)]
pub struct LanesHeard(Vec<(CarrierId, u64)>);

impl LanesHeard {
    /// Lane `lane` read something at `now`.
    pub fn heard(&mut self, lane: CarrierId, now: u64) {
        match self.0.iter_mut().find(|(l, _)| *l == lane) {
            Some(e) => e.1 = now,
            None => self.0.push((lane, now)),
        }
    }

    /// Whether datagrams should avoid `lane` now; `current` says which
    /// lanes are still the session's (the others are forgotten).
    pub fn avoid(
        &mut self,
        lane: CarrierId,
        now: u64,
        current: impl Fn(CarrierId) -> bool,
    ) -> bool {
        self.0.retain(|(l, _)| current(*l));
        if !current(lane) {
            return false;
        }
        let recent = |t: u64| now.saturating_sub(t) < QUIET;
        // A lane never heard yet counts as heard when it joined: not here.
        let mine = self.0.iter().find(|(l, _)| *l == lane).map(|e| e.1);
        let Some(mine) = mine else {
            self.heard(lane, now);
            return false;
        };
        !recent(mine) && self.0.iter().any(|(l, t)| *l != lane && recent(*t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Frame;
    use crate::link::STALL_MARK_TTL;
    use crate::outframe::OutFrame;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    /// A striped link layer of `wanted` lanes, two of them attached.
    fn striped(wanted: u8) -> (LinkLayer, CarrierId, CarrierId) {
        let mut l = LinkLayer::new(
            1 << 20,
            1 << 20,
            wanted,
            crate::resume::SessionId([0; 16]),
            crate::resume::Secret([0; 32]),
            String::new(),
        );
        let (a, b) = (l.attach(0).unwrap(), l.attach(1).unwrap());
        (l, a, b)
    }

    /// Lane `lane` sends a chunk holding a PING at time 0; its length.
    fn ping_on(l: &mut LinkLayer, lane: CarrierId) -> u64 {
        let ping = OutFrame::encoded(Frame::Ping { nonce: 1 }.to_bytes().unwrap());
        let c = l.next_chunk(lane, 64 << 10, 0, |_, out| {
            out.push_back(ping);
            false
        });
        c.unwrap().len as u64
    }

    #[test]
    fn a_lane_whose_chunks_stall_is_avoided_until_it_delivers() {
        let (mut l, a, b) = striped(2);
        let mut h = LanesHeard::default();
        // Lane a carries a chunk that is never acknowledged, while both
        // lanes keep hearing the peer.
        let len = ping_on(&mut l, a);
        assert!(!datagrams_avoid(&mut h, &l, a, 0));
        let t = l.on_tick(1000 * MS, |_| Duration::from_millis(300));
        assert_eq!(t.stalled, vec![a]);
        h.heard(a, 1000 * MS);
        h.heard(b, 1000 * MS);
        assert!(datagrams_avoid(&mut h, &l, a, 1000 * MS));
        assert!(!datagrams_avoid(&mut h, &l, b, 1000 * MS));
        // Lane a's chunk arrives after all: it delivers, and takes
        // datagrams again.
        l.on_ack(len).unwrap();
        assert!(!datagrams_avoid(&mut h, &l, a, 1000 * MS));
    }

    #[test]
    fn the_lane_sending_the_lost_chunk_again_is_not_blamed_and_marks_expire() {
        let (mut l, a, b) = striped(3);
        for lane in [a, b] {
            ping_on(&mut l, lane);
        }
        let patience = |_| Duration::from_millis(300);
        l.on_tick(1000 * MS, patience);
        assert!(l.lane_stalled(a) && !l.lane_stalled(b));
        // b sends a's chunk again; while that copy travels, b's own chunk
        // (waiting behind it) stalling is not b's fault.
        assert!(
            l.next_chunk(b, 64 << 10, 1000 * MS, |_, _| false)
                .unwrap()
                .resent
        );
        l.on_tick(1100 * MS, patience);
        assert!(!l.lane_stalled(b));
        // A mark lasts a few seconds at most.
        assert!(l.lane_stalled(a));
        l.on_tick(1000 * MS + STALL_MARK_TTL, patience);
        assert!(!l.lane_stalled(a));
    }

    #[test]
    fn when_every_lane_stalled_none_is_avoided() {
        let (mut l, a, b) = striped(2);
        for lane in [a, b] {
            ping_on(&mut l, lane);
        }
        // Both lanes' chunks wait, but only the lane holding the oldest is
        // at fault (the other's wait behind it, acknowledgements being
        // cumulative).
        let t = l.on_tick(1000 * MS, |_| Duration::from_millis(300));
        assert_eq!(t.stalled.len(), 2);
        assert!(l.lane_stalled(a) && !l.lane_stalled(b));
        // Lane b sends a's chunk again, and that stalls too.
        let c = l.next_chunk(b, 64 << 10, 1000 * MS, |_, _| false).unwrap();
        assert!(c.resent);
        l.on_tick(2000 * MS, |_| Duration::from_millis(300));
        assert!(l.lane_stalled(a) && l.lane_stalled(b));
        let mut h = LanesHeard::default();
        assert!(!datagrams_avoid(&mut h, &l, a, 2000 * MS));
        assert!(!datagrams_avoid(&mut h, &l, b, 2000 * MS));
    }

    #[test]
    fn a_lane_silent_while_another_hears_is_avoided() {
        let (a, b): (CarrierId, CarrierId) = (1, 2);
        let mut h = LanesHeard::default();
        let all = |_| true;
        assert!(!h.avoid(a, 0, all));
        assert!(!h.avoid(b, 0, all));
        // Both quiet: neither avoided.
        assert!(!h.avoid(a, 2000 * MS, all));
        // b hears, a does not: a is avoided, b is not.
        h.heard(b, 2100 * MS);
        assert!(h.avoid(a, 2200 * MS, all));
        assert!(!h.avoid(b, 2200 * MS, all));
        // a hears again: no longer avoided.
        h.heard(a, 2300 * MS);
        assert!(!h.avoid(a, 2300 * MS, all));
        // b is gone: a is alone, never avoided.
        assert!(!h.avoid(a, 9000 * MS, |l| l == a));
    }
}
