//! longhaul's protocol core, with no I/O and no runtime.
//!
//! Everything here is a pure function or a state machine driven by its
//! caller, so it can be unit-tested, property-tested and fuzzed without
//! sockets:
//!
//! * [`frame`] — the wire codec: JMUX's 4-byte header and message layout
//!   (types 100–106) plus longhaul's extension messages (PING, BIND, …).
//! * [`handshake`] — the short native-mode hello that negotiates version,
//!   features and the maximum frame size (absent in `--jmux` mode).
//! * [`window`] — per-stream receive windows that grow while they are the
//!   bottleneck, bounded by a per-stream cap and a per-session budget.
//! * [`drr`] — deficit round-robin across streams, so that one writer can be
//!   fair to every stream that has data and credit.
//! * [`mux`] — one session's multiplexer as a state machine: streams (their
//!   lifecycle as explicit states), windows, the control lane, scheduling,
//!   keepalive and expiry; frames and local events in, frames to write,
//!   events and deadlines out.
//! * [`link`] — the link layer under the multiplexer: byte sequence
//!   numbers, cumulative acknowledgements and the replay buffer that let a
//!   session resume on a new carrier with nothing lost or repeated, and
//!   [`link::LinkLayer`], the state machine that knows the session's
//!   carriers (or lanes) by id and makes every decision about them.
//! * [`resume`] — the exchange that attaches a carrier to a new or an
//!   existing session (session id, proof of the session secret, offsets).
//! * [`stripe`] — a striped session's chunks: the reorder buffer that puts
//!   them back in order and the record of which lane carries which, so a
//!   lost or stalled lane's chunks go again on another.
//! * [`connection`] — all of the above for one session as one state
//!   machine: the multiplexer over the link layer, fed by carrier id.
//! * [`outframe`] — a frame waiting for the carrier, header and payload
//!   kept apart so DATA is never copied.
#![forbid(unsafe_code)]

/// A table keyed by stream id. Hashed with foldhash, seeded per table at
/// random like the standard library's SipHash (so a peer choosing ids
/// cannot aim for collisions), at a fraction of its cost: every frame
/// looks its stream up several times.
pub type StreamMap<V> = std::collections::HashMap<u32, V, foldhash::fast::RandomState>;

pub mod connection;
pub mod dest;
pub mod drr;
pub mod frame;
pub mod handshake;
pub mod lane_quiet;
pub mod link;
pub mod mux;
pub mod outframe;
pub mod resume;
pub mod stripe;
pub mod window;

pub use frame::{Frame, FrameError, Reason};
