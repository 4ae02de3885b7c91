//! Time: keepalive PINGs, dead-peer and idle detection, and expiry of
//! unanswered OPENs and BINDs, all against the caller's clock.

use std::time::Duration;

use super::stream::Phase;
use super::{Event, Mux, Refused, MAX_BINDS, MAX_PINGS};
use crate::frame::{Frame, Reason};

/// While its peer pings, a mostly answering side pings once in this many
/// intervals.
pub const ANSWERING_PING_EVERY: u64 = 4;

/// The keepalive of a session while no data moves ("quiet"), when both
/// sides offered it in their hellos: PINGs every `ours` instead of every
/// keepalive interval (each PING wakes a sleeping peer; a server holding
/// thousands of idle sessions pays for every one), the kernel's TCP
/// keepalive watching the carrier meanwhile. Both sides use the same
/// interval (the shorter offered), so the peer pings at least every `peer`
/// while quiet, and its silence counts as death only after that much more.
/// Data moving again ends it at once on both sides (the session tells the
/// core, [`Mux::set_quiet`]).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct QuietKeepalive {
    ours: Option<u64>,
    peer: Option<u64>,
    /// The session is quiet now.
    on: bool,
    /// When it was last quiet no more (the peer may still be).
    left_at: u64,
}

impl Mux {
    /// Keepalive mostly by answering (a server: its clients ping): while
    /// the peer pings, a PING of our own only every [`ANSWERING_PING_EVERY`]
    /// intervals, for our own RTT (window growth needs it); every
    /// interval once the peer stops. Off by default.
    /// Whether this side only answers PINGs (a server).
    pub fn is_answer_only(&self) -> bool {
        self.answer_only
    }

    pub fn set_answer_only(&mut self, yes: bool) {
        self.answer_only = yes;
    }

    /// Both hellos offered the quiet keepalive and agreed on `every`
    /// (None: not both; see [`QuietKeepalive`]).
    pub fn set_quiet_keepalive(&mut self, every: Option<Duration>) {
        let ns = every.map(|d| d.as_nanos() as u64);
        // Never rarer than the usual pace: then the usual one.
        self.quiet.ours = ns.filter(|&q| q > self.cfg.keepalive.as_nanos() as u64);
        self.quiet.peer = ns;
    }

    /// PINGs may be rare while quiet (the kernel's keepalive is then asked
    /// to watch the carrier).
    pub fn has_quiet_keepalive(&self) -> bool {
        self.quiet.ours.is_some()
    }

    /// No data moves (`true`) or it moves again (`false`): the session's
    /// timer tells. Only the keepalive's pace changes.
    pub fn set_quiet(&mut self, quiet: bool, now: u64) {
        if self.quiet.on && !quiet {
            self.quiet.left_at = now;
        }
        self.quiet.on = quiet;
    }

    /// From when, and for how long, silence from the peer is allowed.
    fn silence_allowed(&self) -> (u64, u64) {
        let dead_after = self.cfg.dead_after.as_nanos() as u64;
        match (self.quiet.on, self.quiet.peer) {
            // The peer may be quiet too: its next PING may be that far off.
            (true, Some(peer)) => (self.last_rx, dead_after.saturating_add(peer)),
            // Quiet no more: the peer learns it from our data and pings at
            // once; until then it may still be on its quiet pace.
            (false, Some(_)) => (self.last_rx.max(self.quiet.left_at), dead_after),
            (_, None) => (self.last_rx, dead_after),
        }
    }

    // ---- time -------------------------------------------------------

    /// The peer was heard from (any bytes).
    pub fn heard(&mut self, now: u64) {
        self.last_rx = now;
    }

    /// The carrier is gone (`false`): keepalive, dead-peer and idle timers
    /// stop while the session waits for a new one. A new carrier (`true`)
    /// counts as hearing from the peer, and is probed at once.
    pub fn set_attached(&mut self, attached: bool, now: u64) {
        self.attached = attached;
        if attached {
            self.last_rx = now;
            self.busy_at = now;
            self.last_ping = None;
            // A new carrier: our own PING goes at once, whatever the peer
            // did on the old one.
            self.peer_pinged = None;
            // Answers to PINGs sent on the old carrier would time the outage.
            self.pings.clear();
            self.silent_reported = false;
        } else {
            // Stale by the time a carrier comes back: dropped, not kept.
            self.datagrams.drop_all();
        }
    }

    pub fn is_attached(&self) -> bool {
        self.attached
    }

    /// When our next keepalive PING is due. A side that mostly answers (a
    /// server) pings every [`ANSWERING_PING_EVERY`] intervals while its
    /// peer pings at least every one and a half of ours (the peer's PINGs
    /// and our PONGs prove both directions alive), and every interval
    /// otherwise.
    fn next_ping(&self) -> u64 {
        let mut keepalive = self.cfg.keepalive.as_nanos() as u64;
        let every = |k: u64| self.last_ping.map_or(0, |p| p.saturating_add(k));
        if let (true, Some(ours)) = (self.quiet.on, self.quiet.ours) {
            keepalive = ours;
        }
        match (self.answer_only, self.peer_pinged) {
            (true, Some(p)) if self.quiet.on && self.quiet.peer.is_some() => {
                // Quiet: the peer's PINGs and our PONGs prove the path, and
                // there is no RTT to learn: no PING of ours until the peer
                // is a usual interval late (then it is asked, before its
                // silence counts as death).
                let peer = self.quiet.peer.unwrap_or(keepalive);
                let usual = self.cfg.keepalive.as_nanos() as u64;
                p.saturating_add(peer.saturating_add(usual))
                    .max(every(keepalive))
            }
            (true, Some(p)) => {
                // Until the peer is late, the rare PING; then the usual.
                let late = p.saturating_add(keepalive + keepalive / 2);
                every(ANSWERING_PING_EVERY * keepalive).min(late.max(every(keepalive)))
            }
            _ => every(keepalive),
        }
    }

    /// When [`Mux::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.dead.is_some() {
            return None;
        }
        let mut next: Option<u64> = None;
        let mut at = |t: u64| next = Some(next.map_or(t, |n| n.min(t)));
        if self.cfg.extensions && self.attached && !self.silent_reported {
            at(self.next_ping());
            let (since, allowed) = self.silence_allowed();
            at(since.saturating_add(allowed));
        }
        if let (Some(idle), true) = (self.cfg.idle_timeout, self.attached) {
            at(self.busy_at + idle.as_nanos() as u64);
        }
        for s in self.streams.values() {
            if let Phase::Opening { deadline } = s.phase {
                at(deadline);
            }
        }
        for &deadline in self.binds_out.values() {
            at(deadline);
        }
        next
    }

    /// Runs what is due: keepalive PINGs, dead-peer and idle detection,
    /// expiry of unanswered OPENs and BINDs.
    pub fn handle_timeout(&mut self, now: u64) {
        if self.dead.is_some() {
            return;
        }
        let bytes = self.bytes_sent + self.bytes_received;
        if !self.streams.is_empty() || bytes != self.last_bytes {
            self.busy_at = now;
            self.last_bytes = bytes;
        }
        if let (Some(idle), true) = (self.cfg.idle_timeout, self.attached) {
            if now.saturating_sub(self.busy_at) >= idle.as_nanos() as u64 {
                return self.close(format!("idle for {idle:?} (no streams; --idle-timeout)"));
            }
        }
        if self.cfg.extensions && self.attached && !self.silent_reported {
            let silent = now.saturating_sub(self.last_rx);
            let (since, allowed) = self.silence_allowed();
            let too_long = now.saturating_sub(since) > allowed;
            if too_long && self.cfg.resumable {
                self.silent_reported = true;
                self.events.push_back(Event::CarrierSilent {
                    silent: Duration::from_nanos(silent),
                });
            } else if too_long {
                return self.close(format!(
                    "peer unresponsive for {:?}",
                    Duration::from_nanos(silent)
                ));
            }
            let due = !self.silent_reported && now >= self.next_ping();
            if due {
                self.last_ping = Some(now);
                if self.pings.len() >= MAX_PINGS {
                    self.pings.pop_front();
                }
                self.pings.push_back(now);
                self.send_control(Frame::Ping { nonce: now });
            }
        }
        let expired: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| matches!(s.phase, Phase::Opening { deadline } if deadline <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.expire_open(id);
        }
        let binds: Vec<u32> = self
            .binds_out
            .iter()
            .filter(|(_, &d)| d <= now)
            .map(|(&r, _)| r)
            .collect();
        for request in binds {
            self.binds_out.remove(&request);
            if self.binds_expired.len() >= MAX_BINDS {
                self.binds_expired.pop_front();
            }
            self.binds_expired.push_back(request);
            self.events.push_back(Event::BindAnswered {
                request,
                result: Err(Refused::new(
                    Reason::TTL_EXPIRED,
                    "no answer to the reverse-forward request",
                )),
            });
        }
    }
}
