//! A single carrier's datagram path (QUIC DATAGRAM frames): UDP flows'
//! datagrams go there, one DATAGRAM frame per message, instead of into
//! the byte stream where a lost segment would hold them up. Messages are
//! not sequenced, so they never touch the link layer's counts or replay.

use bytes::{Bytes, BytesMut};

use super::{Connection, Received};
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
    }

    /// The next datagram for the path, as one message of at most `max`
    /// bytes; larger ones go in the byte stream instead.
    pub fn pop_path_datagram(&mut self, max: usize) -> Option<Bytes> {
        let f = self.mux_mut().pop_datagram_within(max)?;
        Some(f.to_message())
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
