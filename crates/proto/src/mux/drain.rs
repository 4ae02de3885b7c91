//! Going away. Draining: a side about to go away (a server stopping for
//! a restart) tells its peer to open the next streams through a new
//! session — which a load balancer sends to another server — while the
//! streams open now go on until they end. Like HTTP/2's GOAWAY, without
//! its last-stream id: OPENs keep being accepted, so one that crossed the
//! DRAIN never fails. Then the polite end ([`Mux::shutdown`]): CLOSE for
//! every stream.

use crate::frame::Frame;

use super::stream::Phase;
use super::{truncate_utf8, Event, Mux};

/// Longest drain reason kept or sent (bytes): it is only logged.
pub const MAX_DRAIN_REASON: usize = 200;

impl Mux {
    /// Ends the session politely: CLOSE for every open stream, new OPENs
    /// refused; once the writer has written everything ([`Mux::goodbye_done`])
    /// the caller closes the carrier.
    pub fn shutdown(&mut self, why: impl Into<String>) {
        if self.dead.is_some() || self.goodbye.is_some() {
            return;
        }
        self.goodbye = Some(why.into());
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.streams.get(&id) {
                if matches!(s.phase, Phase::Open { .. }) {
                    self.send_close(id, false, true);
                }
            }
        }
    }

    /// Shutting down, and nothing is left to write: the reason.
    pub fn goodbye_done(&self) -> Option<&str> {
        if self.control.is_empty() && self.data.is_empty() {
            self.goodbye.as_deref()
        } else {
            None
        }
    }

    /// Both sides offered `FEATURE_DRAIN` in their hello: only then may a
    /// DRAIN be sent (a peer without it would take it for a protocol
    /// error). Off until said.
    pub fn set_drain_negotiated(&mut self, yes: bool) {
        self.drain_negotiated = yes && self.cfg.extensions;
    }

    /// Tells the peer, once, that this side is draining (nothing if the
    /// peer cannot hear it).
    pub fn drain(&mut self, why: &str) {
        if self.drain_sent
            || !self.drain_negotiated
            || self.dead.is_some()
            || self.goodbye.is_some()
        {
            return;
        }
        self.drain_sent = true;
        let mut reason = why.to_owned();
        truncate_utf8(&mut reason, MAX_DRAIN_REASON);
        self.send_control(Frame::Drain { reason });
    }

    /// Whether streams are open or being opened (an OPEN of the peer's
    /// still connecting to its target counts): a draining side waits for
    /// none to be left.
    pub fn has_streams(&self) -> bool {
        !self.streams.is_empty() || self.connecting > 0 || !self.draining.is_empty()
    }

    /// Whether a DRAIN may be sent on this session (see
    /// [`Mux::set_drain_negotiated`]).
    pub fn drain_negotiated(&self) -> bool {
        self.drain_negotiated
    }

    /// The peer said it is draining: its reason.
    pub fn peer_drain(&self) -> Option<&str> {
        self.peer_drain.as_deref()
    }

    /// A DRAIN from the peer: the first one counts, repeats change nothing.
    pub(super) fn on_drain(&mut self, mut reason: String) {
        if self.peer_drain.is_none() {
            truncate_utf8(&mut reason, MAX_DRAIN_REASON);
            self.peer_drain = Some(reason.clone());
            self.events.push_back(Event::PeerDraining { reason });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_cut_on_a_character_boundary() {
        let mut s = "é".repeat(150);
        truncate_utf8(&mut s, MAX_DRAIN_REASON);
        assert_eq!(s.len(), MAX_DRAIN_REASON);
        let mut s = format!("a{}", "é".repeat(150));
        truncate_utf8(&mut s, MAX_DRAIN_REASON);
        assert_eq!(s.len(), MAX_DRAIN_REASON - 1);
    }
}
