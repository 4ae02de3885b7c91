//! A single carrier's datagram path (QUIC DATAGRAM frames): UDP flows'
//! datagrams go there, one DATAGRAM frame per message, instead of into
//! the byte stream where a lost segment would hold them up. Messages are
//! not sequenced, so they never touch the link layer's counts or replay.
//!
//! A QUIC stack sends queued datagrams ahead of stream data in every
//! packet, so a datagram path fed as fast as datagrams come would starve
//! the byte stream (a UDP flood through a `-L udp:` forward would stall
//! every TCP forward, and the session's PINGs). While the stream is
//! backed up (DATA waiting for the carrier, or more than [`PATH_BURST`]
//! sent and not yet acknowledged), datagrams may take as many bytes as the
//! stream had delivered since (an equal share, whatever the congestion
//! control makes of the path's rate), plus a burst of [`PATH_BURST`];
//! otherwise (a trickle of control frames, or nothing) all they want.

use bytes::{Bytes, BytesMut};

use super::{Connection, Received};

/// Bytes of datagrams that may go ahead of a busy stream's at once: a
/// voice flow's (8 KB/s) never waits for the share.
pub const PATH_BURST: u64 = 64 * 1024;

/// The most the datagrams may have in hand while the stream is busy.
pub const PATH_TOKENS_MAX: u64 = 8 * PATH_BURST;

/// However little the stream delivers, the datagrams get [`PATH_BURST`]
/// this often (≈ 2 Mbit/s): a peer that acknowledges only when it next
/// writes (after an upload ends, up to a PING interval later) must not
/// stall a voice flow meanwhile, and a flood gets no more than that while
/// the stream is stuck.
pub const PATH_FLOOR_EVERY_NS: u64 = 250_000_000;

/// The datagrams' share of the path (see the module docs).
#[derive(Debug, Default)]
pub(super) struct PathShare {
    tokens: u64,
    /// What the stream had delivered when last looked at.
    delivered: u64,
    /// When the floor last topped the tokens up.
    floor_at: u64,
    /// Bytes of datagrams moved into the stream (too large for the path):
    /// without a link layer, what the writer took counts them, and they
    /// are no share the stream earned.
    moved: u64,
}
use crate::frame::{self, Frame};
use crate::link::CarrierId;

impl Connection {
    /// Whether the current single carrier has a datagram path: if so,
    /// datagrams wait for [`Connection::pop_path_datagram`] instead of
    /// going in [`Connection::poll_transmit`]'s batches. (A striped
    /// session's lanes always take them apart.)
    pub fn use_datagram_path(&mut self, on: bool) {
        if !self.is_striped() {
            self.mux_mut().set_datagram_path(on);
        }
        // A resume moves what was acknowledged by a whole replay at once:
        // not a share earned on this path.
        self.path_share.delivered = self.link().map_or(0, |l| l.replay().acked());
        self.path_share.tokens = PATH_BURST;
        self.path_share.moved = 0;
    }

    /// The next datagram for the path, as one message of at most `max`
    /// bytes, within `room` bytes (from [`Connection::path_room`]), which
    /// it takes from. Larger ones go in the byte stream instead, under the
    /// same share: a flood of them must not take the stream's turn there
    /// either.
    pub fn pop_path_datagram(&mut self, max: usize, room: &mut usize) -> Option<Bytes> {
        while *room > 0 {
            let (size, msg) = match self.mux_mut().pop_datagram_within(max)? {
                Ok(f) => {
                    let m = f.to_message();
                    (m.len(), Some(m))
                }
                Err(moved) => {
                    self.path_share.moved += moved as u64;
                    (moved, None)
                }
            };
            *room = room.saturating_sub(size);
            let tokens = &mut self.path_share.tokens;
            *tokens = tokens.saturating_sub(size as u64);
            if msg.is_some() {
                return msg;
            }
        }
        None
    }

    /// Bytes of datagrams the path may take now (see the module docs).
    /// The stream's progress is what the peer acknowledged (with a link
    /// layer), else what its writer took: that stops too once the
    /// carrier's buffer is full and nothing of it is delivered.
    pub fn path_room(&mut self, now: u64) -> usize {
        // (The link layer does not count datagrams: they are not replayed.
        // What the writer took does; less those moved into the stream.)
        let (delivered, in_flight) = match self.link() {
            Some(l) => (l.replay().acked(), l.replay().held() as u64 > PATH_BURST),
            None => {
                let sent = self.mux.stats().bytes_sent;
                (sent.saturating_sub(self.path_share.moved), false)
            }
        };
        let busy = in_flight || self.mux.has_stream_data();
        let s = &mut self.path_share;
        let gained = delivered.saturating_sub(s.delivered);
        s.delivered = s.delivered.max(delivered);
        if !busy {
            s.tokens = PATH_BURST;
            return usize::MAX;
        }
        // (Capped: without a link layer, "delivered" is what the writer
        // handed the carrier, which may take megabytes at once.)
        let cap = PATH_BURST.max(gained).min(PATH_TOKENS_MAX);
        s.tokens = s.tokens.saturating_add(gained).min(cap);
        if now.saturating_sub(s.floor_at) >= PATH_FLOOR_EVERY_NS {
            s.floor_at = now;
            s.tokens = s.tokens.max(PATH_BURST);
        }
        s.tokens as usize
    }

    /// One message from `carrier`'s datagram path: exactly one DATAGRAM
    /// frame, or the peer broke the protocol.
    pub fn on_path_datagram(&mut self, carrier: CarrierId, msg: Bytes, now: u64) -> Received {
        if self.mux().dead().is_some() {
            return Received::Ended;
        }
        if self.link().is_some_and(|l| !l.is_current(carrier)) {
            return Received::Stale;
        }
        let mut buf = BytesMut::from(msg);
        let why = match frame::decode(&mut buf, self.limits) {
            Ok(Some(f @ Frame::Datagram { .. })) if buf.is_empty() => {
                // Not taken as a sign of life: a peer whose byte stream
                // is stuck must still be found dead, whatever else it
                // sends (PINGs travel in the stream).
                self.mux.datagram_on_path();
                // Its payload is a slice of a buffer of its own.
                self.may_slice = true;
                return match self.deliver(f, now) {
                    true => Received::Taken { wake: false },
                    false => Received::Ended,
                };
            }
            Ok(Some(f)) if buf.is_empty() => {
                format!("frame type {} on the datagram path", f.type_code())
            }
            Ok(_) => "a message on the datagram path is not one whole frame".to_owned(),
            Err(e) => format!("malformed frame from peer: {e}"),
        };
        self.mux_mut().close(why);
        Received::Ended
    }
}
