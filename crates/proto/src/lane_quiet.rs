//! Which lanes of a striped session datagrams should avoid: a lane that
//! has heard nothing for [`QUIET`] while another has heard something. A
//! datagram is never resent, so one written into a lane that went silent
//! (a NAT that forgot the flow, a dead path without a reset) is lost;
//! bytes in chunks are resent, datagrams only avoid such a lane. While
//! every lane is quiet (an idle session), none is avoided.

use crate::link::CarrierId;

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

    const MS: u64 = 1_000_000;

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
