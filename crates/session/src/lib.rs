//! The session runtime: runs the protocol core over a carrier on tokio.
//!
//! Tasks of one session:
//!
//! * the **carrier reader** ([`reader`]) decodes frames and hands them to
//!   the protocol core ([`longhaul_proto::mux::Mux`], under the session
//!   lock in [`runtime`]); it never waits on a stream (DATA goes into the
//!   stream's inbound queue, which the receive window bounds), so a stalled
//!   consumer stalls only its own stream;
//! * the **carrier writer** ([`writer`]) is the only task that writes to the
//!   carrier: it drains the control lane first (OPEN, WINDOW_ADJUST, EOF,
//!   CLOSE, PING…), then takes DATA frames from streams in deficit
//!   round-robin order, and sends each batch with one vectored write as soon
//!   as it has anything;
//! * per stream ([`stream`]), an **uplink** (local socket → frames, limited
//!   by the peer's credit) and a **downlink** (inbound queue → local socket,
//!   returning credit only once bytes are written);
//! * the **link layer** ([`link`], [`resume`]): with resume negotiated,
//!   every frame written is kept until the peer acknowledges it, so that
//!   when the carrier drops the session is detached rather than closed,
//!   and resumes on a new carrier with nothing lost or repeated;
//! * a striped session's **lanes** ([`lanes`], [`lane_io`]): several
//!   carriers under one link layer; each lane's writer takes chunks when
//!   its socket has room, readers put chunks back in order, and a lost or
//!   stalled lane's chunks go again on the others;
//! * a **housekeeping** tick (not on the data path): keepalive PINGs, RTT
//!   sampling, dead-peer and idle detection.
//!
//! Memory: every queue is bounded (see [`SessionConfig`] and docs/SECURITY.md),
//! and what a queue holds is charged at what it really holds ([`inbound`],
//! [`reader`]).
#![forbid(unsafe_code)]

mod config;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod handle;
mod housekeeping;
mod inbound;
mod kex;
mod lane_io;
mod lanes;
mod link;
mod local;
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
mod tasks;
mod writer;

pub use config::{
    BoxFuture, Mode, OpenRefused, Role, SessionConfig, SessionError, SessionStats, StreamStats,
};
pub use handle::{Opened, Session};
pub use link::auto_replay_limit;
pub use local::LocalStream;
pub use longhaul_proto::stripe::MAX_LANES;
pub use pipe::{PumpEnd, ServicePipe, PIPE_QUEUE};
pub use resume::{Resumables, Served};
pub use runtime::{Acceptor, SessionHandle};
pub use tasks::LaneStats;
