//! The session runtime: runs the protocol core over a carrier on tokio.
//!
//! Tasks of one session:
//!
//! * the **carrier reader** decodes frames and routes them; it never waits on
//!   a stream (DATA goes into the stream's inbound queue, which the receive
//!   window bounds), so a stalled consumer stalls only its own stream;
//! * the **carrier writer** is the only task that writes to the carrier: it
//!   drains the control lane first (OPEN, WINDOW_ADJUST, EOF, CLOSE, PING…),
//!   then takes DATA frames from streams in deficit round-robin order, and
//!   sends each batch with one vectored write as soon as it has anything;
//! * per stream, an **uplink** (local socket → frames, limited by the peer's
//!   credit) and a **downlink** (frames → local socket, returning credit only
//!   once bytes are written);
//! * a **housekeeping** tick (not on the data path): keepalive PINGs, RTT
//!   sampling, dead-peer detection.

#[doc(hidden)]
pub mod fuzzing;
mod outframe;
mod runtime;
mod stream;

pub use runtime::{
    Acceptor, BoxFuture, Mode, OpenRefused, Opened, Session, SessionConfig, SessionError,
    SessionHandle, SessionStats,
};
