//! What the multiplexer asks its caller to act on.

use std::time::Duration;

use bytes::Bytes;

use super::{IncomingOpen, Refused};

/// What the caller must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Payload for stream `id`'s local socket, in order (within its window).
    Data { id: u32, payload: Bytes },
    /// The peer sent everything it will on `id`: write what is queued, then
    /// half-close the local socket and call [`Mux::eof_delivered`].
    Eof { id: u32 },
    /// The stream is over: stop reading its local socket. With `discard`
    /// (it failed) drop what is queued for it; otherwise write that first.
    /// With `reset` the stream ended abruptly (its other end was reset or
    /// failed, or the session cut it): close the local socket with a reset
    /// (SO_LINGER 0) once what is queued is written, so the application
    /// sees a failure rather than a clean end of data.
    /// `sent`/`received`: the stream's payload bytes each way, for the log.
    Finished {
        id: u32,
        discard: bool,
        reset: bool,
        sent: u64,
        received: u64,
    },
    /// Stream `id` may send again ([`Mux::send_room`] is no longer 0).
    Writable { id: u32 },
    /// The peer asks for a stream to `dest`: connect, then
    /// [`Mux::accept_open`] or [`Mux::refuse_open`].
    OpenRequest { open: IncomingOpen, dest: String },
    /// Our OPEN for `id` was answered (or expired).
    OpenAnswered {
        id: u32,
        result: Result<(), Refused>,
    },
    /// The peer asks us to listen on `bind` and open streams to `dest`.
    BindRequest {
        request: u32,
        bind: String,
        dest: String,
    },
    /// Our BIND was answered (or expired).
    BindAnswered {
        request: u32,
        result: Result<u16, Refused>,
    },
    /// One datagram for flow `id`'s local socket (see `datagram`).
    Datagram { id: u32, payload: Bytes },
    /// The peer is draining (a server about to restart): open the next
    /// streams through a new session; the open ones go on.
    PeerDraining { reason: String },
    /// We refused the peer's OPEN to `dest` (the peer's choice: escape it).
    RefusedOpen { dest: String, why: &'static str },
    /// Nothing heard for `dead_after` on a resumable session: drop the
    /// carrier and resume on a new one ([`Mux::set_attached`]).
    CarrierSilent { silent: Duration },
}
