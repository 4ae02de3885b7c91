//! The link layer: what lets a session outlive its carrier, and spread
//! itself over several.
//!
//! Each side numbers the bytes of the frames it sends (from 0 at the start
//! of the session; link frames — ACK — are not counted), acknowledges
//! cumulatively what it has received, and keeps every frame it wrote in a
//! [`Replay`] buffer until the peer has acknowledged it. When a carrier
//! drops, the two sides tell each other what they received and each sends
//! again, from its replay buffer, exactly what the other is missing: nothing
//! lost, nothing twice, and the multiplexer above never sees the drop.
//!
//! Offsets always fall on frame boundaries: a receiver counts only whole
//! frames it decoded, and a partial frame in its buffer when the carrier
//! drops is thrown away and comes again.
//!
//! [`LinkLayer`] is the whole of it as one state machine, with no I/O and
//! no clock: it knows the session's carriers by id ([`CarrierId`]) and
//! decides everything about them — which carrier is current (input from
//! any other is refused, in one place: [`LinkLayer::is_current`]), what a
//! lost carrier means (a lane gone, or the session detached), who may
//! attach the next one ([`LinkLayer::check_resume`],
//! [`LinkLayer::check_lane`]), what to send again after a resume, when an
//! ACK is owed, which chunk a lane takes next and which stalled chunk goes
//! again elsewhere ([`LinkLayer::next_chunk`], [`LinkLayer::on_tick`]).
//! The runtime only moves bytes and tells it what happened; the
//! deterministic simulation (`tests/proto/link_sim.rs`) drives two of them over
//! lanes that delay, drop and die.

mod lanes;
mod layer;
mod replay;

pub use lanes::{Budget, Chunk, StallMark, Tick, CHUNK_FILL, MAX_CHUNK_FRAMES, STALL_MARK_TTL};
pub use layer::{AttachRefused, CarrierId, Input, LinkLayer, Lost};
pub use replay::*;
