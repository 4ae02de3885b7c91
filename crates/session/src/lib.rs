//! The session runtime: runs the protocol (`longhaul_proto::connection::
//! Connection`, the multiplexer over the link layer) over one carrier or
//! several lanes on tokio. The connection makes every protocol decision;
//! the tasks here only move bytes and wake each other.
//!
//! Tasks of one session, all run as futures of one tokio task, the
//! session's [`driver`]: a hand-off between them (an uplink waking the
//! carrier writer, the reader waking a downlink) is a push on the driver's
//! ready queue, run in the same turn on the same thread, never a trip
//! through the runtime's scheduler or a wake-up of another thread.
//! Sessions are spread over the runtime's threads; one session runs on one
//! thread at a time.
//!
//! * the **carrier reader** ([`reader`]) hands each read to the connection
//!   under the session lock ([`runtime`]), which decodes the frames,
//!   refuses them if the carrier is no longer current, and counts what it
//!   takes; it never waits on a stream (DATA goes into the stream's inbound
//!   queue, which the receive window bounds), so a stalled consumer stalls
//!   only its own stream;
//! * the **carrier writer** ([`writer`]) is the only task that writes to the
//!   carrier: it drains the control lane first (OPEN, WINDOW_ADJUST, EOF,
//!   CLOSE, PING…), then takes DATA frames from streams in deficit
//!   round-robin order, and sends each batch with one vectored write as soon
//!   as it has anything; with a link layer each frame is recorded for a
//!   replay as it starts going out;
//! * per stream ([`stream`], [`pump`]), an **uplink** (local socket →
//!   frames, limited by the peer's credit) and a **downlink** (inbound queue
//!   → local socket, returning credit only once bytes are written);
//! * the **link layer**'s tasks ([`link`], [`resume`]): a resumable session
//!   whose carrier drops is detached rather than closed, and resumes on a
//!   new carrier with nothing lost or repeated;
//! * a striped session's **lanes** ([`lanes`], [`lane_io`]): each lane's
//!   writer asks the connection for a chunk when its socket has room, its
//!   reader hands chunks in; the connection puts them back in order and
//!   sends a lost or stalled lane's chunks again on the others;
//! * a **housekeeping** tick (not on the data path): keepalive PINGs, RTT
//!   sampling, dead-peer and idle detection, a striped session's stall
//!   checks.
//!
//! Modules form layers with no import cycles: [`config`] and [`tasks`]
//! at the bottom, then [`runtime`], the byte pumps, the link and lane task
//! management, and [`start`] / [`handle`] on top.
//!
//! Memory: every queue is bounded (see [`SessionConfig`] and docs/SECURITY.md),
//! and what a queue holds is charged at what it really holds ([`inbound`],
//! [`reader`]).
#![forbid(unsafe_code)]

mod config;
mod driver;
mod flow;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod handle;
mod housekeeping;
mod inbound;
mod kex;
mod lane_io;
mod lanes;
mod link;
pub mod local;
pub mod logs;
mod pipe;
mod pipe_pumps;
mod pump;
mod reader;
mod requests;
mod resume;
mod runtime;
mod start;
mod stream;
mod stream_io;
mod sys;
mod tasks;
mod writer;

pub use config::{
    BoxFuture, Mode, OpenRefused, Role, SessionConfig, SessionError, SessionStats, StreamStats,
};
pub use flow::{DatagramSink, Flow, DELIVERY_DROPS, MAX_DATAGRAM};
pub use handle::{Opened, Session};
pub use link::auto_replay_limit;
pub use local::LocalStream;
pub use longhaul_proto::mux::Dropped;
pub use longhaul_proto::stripe::MAX_LANES;
pub use pipe::{PumpEnd, ServicePipe, PIPE_QUEUE};
pub use resume::{NewSession, Resumables, Served};
pub use runtime::{Acceptor, SessionHandle};
pub use tasks::LaneStats;
