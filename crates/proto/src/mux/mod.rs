//! The multiplexer as a state machine: one session's streams, windows,
//! control lane, scheduling and OPEN/EOF/CLOSE rules, with no I/O.
//!
//! In the spirit of quinn-proto's `Connection`: the caller feeds it frames
//! from the peer ([`Mux::handle_frame`]), local events (a stream opened,
//! data read from a local socket, bytes written to one, a timer) and the
//! current time, and takes out frames to write ([`Mux::poll_transmit`]),
//! [`Event`]s to act on, and the next deadline ([`Mux::poll_timeout`]). The
//! tokio runtime (`longhaul-session`) only moves bytes and wakes tasks; the
//! simulation test (`tests/proto/connection_sim.rs`) joins two of these, each in
//! a `Connection`, through an in-memory pipe instead.
//!
//! Time is the caller's clock in nanoseconds since the session started.

mod datagram;
mod drain;
mod event;
mod local;
mod rules;
pub mod stream;
mod timers;

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;

use crate::drr::Drr;
use crate::frame::{Frame, Reason, DATA_HEADER_LEN, MAX_FRAME_LEN};
use crate::outframe::OutFrame;
use crate::window::{Budget, RecvWindow, SendCredit, WindowConfig};
pub use datagram::{DatagramStats, Dropped, DATAGRAM_QUEUE};
pub use drain::MAX_DRAIN_REASON;
pub use event::Event;
pub use stream::Phase;

/// Smallest window granted to a new stream when the budget is spent.
pub const MIN_WINDOW: u64 = 16 * 1024;
/// On a slow path a DATA frame is cut to about this much time at the
/// path's delivery rate: a frame once started must be written whole, so a
/// keystroke or a datagram queued behind it waits for all of it (64 KiB
/// is 0.35 s at 1.5 Mbit/s).
pub const FRAME_TIME: Duration = Duration::from_millis(10);
/// The smallest that cut makes a frame.
pub const MIN_FRAME_CAP: usize = 4 * 1024;
/// Smallest maximum packet size a peer may announce (in OPEN or
/// OPEN_SUCCESS). Below it every DATA frame would be mostly header: a 1-byte
/// packet size turns a 512 KiB send queue into 28 MiB of frames.
pub const MIN_PEER_PACKET: u16 = 1024;
/// Reverse-forward listeners one session may ask for.
pub const MAX_BINDS: usize = 256;
/// PINGs awaiting their PONG; only these nonces are accepted back.
pub const MAX_PINGS: usize = 8;

/// Limits and tuning of one session's multiplexer.
#[derive(Debug, Clone)]
pub struct MuxConfig {
    pub window: WindowConfig,
    /// Sum of all receive windows (bytes the peer may have in flight to us).
    pub budget: u64,
    /// Streams at once, including ones still connecting.
    pub max_streams: usize,
    /// Bytes from one local socket waiting for the carrier.
    pub send_queue: usize,
    /// Bytes from all local sockets waiting for the carrier: a peer that
    /// stops reading holds at most this much of ours, however many streams.
    pub send_total: usize,
    /// Control messages waiting for a peer that does not read them.
    pub control_limit: usize,
    pub keepalive: Duration,
    pub dead_after: Duration,
    /// How long an OPEN or BIND of ours waits for its answer.
    pub open_timeout: Duration,
    pub idle_timeout: Option<Duration>,
    /// Lower bound on the RTT used for window growth.
    pub rtt_floor: Duration,
    /// Plain JMUX peer (jetsocat): its maximum packet size counts the DATA
    /// header, and it sends stray frames for channels it closed.
    pub jmux: bool,
    /// PING/PONG and BIND negotiated (native mode).
    pub extensions: bool,
    /// Largest DATA payload we accept (advertised in OPEN/OPEN_SUCCESS).
    pub our_max_packet: u16,
    /// Largest DATA payload the carrier's frame limit lets us send.
    pub send_max_payload: usize,
    /// A link layer can resume the session on a new carrier: a silent peer
    /// means a dead carrier ([`Event::CarrierSilent`]), not a dead session.
    pub resumable: bool,
}

/// Longest refusal description sent to the peer, in bytes; longer ones
/// are cut at a character and end in "…".
pub const MAX_DESCRIPTION: usize = 1024;

/// Cuts `s` to at most `max` bytes, at a character.
fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// Cuts `s` to at most `max` bytes (≥ 3), ending in "…" when cut.
fn shorten(s: &mut String, max: usize) {
    if s.len() > max {
        truncate_utf8(s, max - '…'.len_utf8());
        s.push('…');
    }
}

/// Why an OPEN or BIND was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub reason: Reason,
    pub description: String,
}

impl Refused {
    pub fn new(reason: Reason, description: impl Into<String>) -> Refused {
        Refused {
            reason,
            description: description.into(),
        }
    }
}

/// A stream the peer asked for, until the caller accepts or refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncomingOpen {
    sender: u32,
    window: u32,
    max_packet: u16,
}

/// An OPEN we stopped waiting for: its slot and budget are released and
/// only this marker stays, so a late answer is handled rather than taken
/// for a protocol violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expired {
    Unanswered,
    /// It succeeded late; we sent CLOSE and wait for the peer's.
    Closing,
}

struct Stream {
    /// The peer's id (valid once open).
    remote: u32,
    phase: Phase,
    credit: SendCredit,
    max_packet: usize,
    recv: RecvWindow,
    /// Budget held by `recv`.
    reserved: u64,
    /// Closed with its queued data dropped: nothing more will be delivered.
    discarded: bool,
    /// The runtime has a local socket for it ([`Mux::local_opened`]) that
    /// it has not closed yet ([`Mux::local_closed`]).
    local_open: bool,
    /// The uplink found no room: tell it when there is.
    waiting: bool,
    tx_bytes: u64,
    rx_bytes: u64,
    credit_stalls: u64,
}

/// A snapshot of one stream's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamCounters {
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    /// Our receive window.
    pub window: u32,
    /// What the peer lets us send.
    pub credit: u64,
    pub credit_stalls: u64,
}

/// A snapshot of a session's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MuxStats {
    pub streams: usize,
    pub budget_used: u64,
    pub rtt_ns: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

pub struct Mux {
    cfg: MuxConfig,
    control: VecDeque<Bytes>,
    control_bytes: usize,
    data: Drr<OutFrame>,
    datagrams: datagram::Datagrams,
    /// Boxed: a table of 10 000 idle streams holds about 1.6 slots per
    /// stream, and an empty slot costs a pointer rather than a `Stream`.
    streams: crate::StreamMap<Box<Stream>>,
    /// Closed streams whose local socket is still open (its last bytes on
    /// their way, or a reset waiting for them to be taken): their receive
    /// budget and their slot stay taken until the runtime closes it
    /// ([`Mux::local_closed`]), so a peer cannot pile up data, sockets or
    /// tasks behind closed streams whose consumer does not read.
    draining: crate::StreamMap<u64>,
    expired: crate::StreamMap<Expired>,
    next_id: u32,
    /// Peer OPENs handed to the caller and not yet answered.
    connecting: usize,
    budget: Budget,
    /// Our BINDs waiting, with their deadlines.
    binds_out: crate::StreamMap<u64>,
    binds_expired: VecDeque<u32>,
    next_bind: u32,
    binds_in: usize,
    pings: VecDeque<u64>,
    last_ping: Option<u64>,
    ping_rtt_ns: u64,
    path_rtt_ns: u64,
    /// DATA payloads are cut to this (see [`FRAME_TIME`]).
    frame_cap: usize,
    last_rx: u64,
    busy_at: u64,
    last_bytes: u64,
    dead: Option<String>,
    goodbye: Option<String>,
    /// We told the peer we are draining (once).
    drain_sent: bool,
    /// Ping only when the peer does not (see [`Mux::set_answer_only`]).
    answer_only: bool,
    /// When the peer's last PING came.
    peer_pinged: Option<u64>,
    /// The peer can hear a DRAIN (see [`Mux::set_drain_negotiated`]).
    drain_negotiated: bool,
    /// The peer is draining: why (see [`Mux::drain`]).
    peer_drain: Option<String>,
    bytes_sent: u64,
    bytes_received: u64,
    events: VecDeque<Event>,
    /// A stream found no room because of `send_total`: wake the waiting
    /// streams once the session's queue has half drained.
    total_blocked: bool,
    /// Something was queued for the writer since [`Mux::take_new_output`].
    new_output: bool,
    /// A carrier is attached (keepalive and dead-peer timers run).
    attached: bool,
    /// [`Event::CarrierSilent`] was raised for the current carrier.
    silent_reported: bool,
    quiet: timers::QuietKeepalive,
}

impl Mux {
    pub fn new(cfg: MuxConfig) -> Mux {
        Mux {
            budget: Budget::new(cfg.budget),
            cfg,
            control: VecDeque::new(),
            control_bytes: 0,
            data: Drr::new(MAX_FRAME_LEN),
            datagrams: datagram::Datagrams::default(),
            streams: Default::default(),
            draining: Default::default(),
            expired: Default::default(),
            next_id: 1,
            connecting: 0,
            binds_out: Default::default(),
            binds_expired: VecDeque::new(),
            next_bind: 1,
            binds_in: 0,
            pings: VecDeque::new(),
            last_ping: None,
            ping_rtt_ns: 0,
            path_rtt_ns: 0,
            frame_cap: usize::MAX,
            last_rx: 0,
            busy_at: 0,
            last_bytes: 0,
            dead: None,
            goodbye: None,
            drain_sent: false,
            answer_only: false,
            peer_pinged: None,
            drain_negotiated: false,
            peer_drain: None,
            bytes_sent: 0,
            bytes_received: 0,
            events: VecDeque::new(),
            total_blocked: false,
            new_output: false,
            attached: true,
            silent_reported: false,
            quiet: Default::default(),
        }
    }

    pub fn config(&self) -> &MuxConfig {
        &self.cfg
    }

    /// The next thing to act on.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Why the session is over, once it is.
    pub fn dead(&self) -> Option<&str> {
        self.dead.as_deref()
    }

    /// Ends the session: every stream is finished (queued data still goes
    /// to the local sockets), nothing more is sent.
    pub fn close(&mut self, why: impl Into<String>) {
        if self.dead.is_none() {
            self.dead = Some(why.into());
        }
        let jmux = self.cfg.jmux;
        for (id, s) in self.streams.drain() {
            if s.phase.is_opening() {
                self.events.push_back(Event::OpenAnswered {
                    id,
                    result: Err(Refused::new(Reason::GENERAL_FAILURE, "session closed")),
                });
            } else {
                // Cut short: the local socket is reset, not closed as if
                // the data had ended.
                self.events.push_back(Event::Finished {
                    id,
                    discard: false,
                    reset: !s.phase.finished() && !jmux,
                    sent: s.tx_bytes,
                    received: s.rx_bytes,
                });
            }
        }
        self.draining.clear();
        for (request, _) in self.binds_out.drain() {
            self.events.push_back(Event::BindAnswered {
                request,
                result: Err(Refused::new(Reason::GENERAL_FAILURE, "session closed")),
            });
        }
        self.budget = Budget::new(self.cfg.budget);
        self.control.clear();
        self.control_bytes = 0;
        self.data = Drr::new(MAX_FRAME_LEN);
        self.datagrams.clear();
    }

    /// Ids of the streams it keeps (any state), sorted.
    pub fn stream_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.streams.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Ids of closed streams whose received bytes are still being
    /// delivered (they hold budget and a slot), sorted.
    pub fn draining_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.draining.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// A stream's state, if it is kept.
    pub fn phase(&self, id: u32) -> Option<Phase> {
        self.streams.get(&id).map(|s| s.phase)
    }

    pub fn stats(&self) -> MuxStats {
        MuxStats {
            streams: self.streams.len() + self.draining.len(),
            budget_used: self.budget.used(),
            // The round trip PINGs measure, else the kernel's (no floor).
            rtt_ns: match self.ping_rtt_ns {
                0 => self.path_rtt_ns,
                ping => ping,
            },
            bytes_sent: self.bytes_sent,
            bytes_received: self.bytes_received,
        }
    }

    /// One stream's counters, if it exists.
    pub fn stream_stats(&self, id: u32) -> Option<StreamCounters> {
        let s = self.streams.get(&id)?;
        Some(StreamCounters {
            tx_bytes: s.tx_bytes,
            rx_bytes: s.rx_bytes,
            window: s.recv.size(),
            credit: s.credit.available(),
            credit_stalls: s.credit_stalls,
        })
    }

    /// Round-trip time of the path under the carrier (TCP_INFO), if known.
    pub fn set_path_rtt(&mut self, rtt: Duration) {
        self.path_rtt_ns = rtt.as_nanos() as u64;
    }

    /// The path's delivery rate in bytes per second (TCP_INFO; 0 when not
    /// known): on a slow path, DATA frames queued from now on are smaller
    /// (see [`FRAME_TIME`]).
    pub fn set_path_rate(&mut self, bytes_per_sec: u64) {
        if bytes_per_sec == 0 {
            self.frame_cap = usize::MAX;
            return;
        }
        let cap = bytes_per_sec.saturating_mul(FRAME_TIME.as_millis() as u64) / 1000;
        self.frame_cap = usize::try_from(cap)
            .unwrap_or(usize::MAX)
            .max(MIN_FRAME_CAP);
    }

    /// RTT used for window growth decisions.
    pub fn window_rtt_ns(&self) -> u64 {
        self.ping_rtt_ns
            .max(self.path_rtt_ns)
            .max(self.cfg.rtt_floor.as_nanos() as u64)
    }

    // ---- internals ---------------------------------------------------

    fn alloc_id(&mut self) -> u32 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            if !self.streams.contains_key(&id)
                && !self.expired.contains_key(&id)
                && !self.draining.contains_key(&id)
            {
                return id;
            }
        }
    }

    fn new_stream(
        &mut self,
        remote: u32,
        peer_window: u32,
        peer_max_packet: u16,
        phase: Phase,
        now: u64,
    ) -> u32 {
        let id = self.alloc_id();
        let want = self.cfg.window.initial as u64;
        let reserved = self.budget.reserve_with_floor(want, MIN_WINDOW.min(want));
        let max_packet = self.clamp_packet(peer_max_packet);
        self.streams.insert(
            id,
            Box::new(Stream {
                remote,
                phase,
                credit: SendCredit::new(peer_window),
                max_packet,
                recv: RecvWindow::new(reserved as u32, self.cfg.window.max, now),
                reserved,
                discarded: false,
                local_open: false,
                waiting: false,
                tx_bytes: 0,
                rx_bytes: 0,
                credit_stalls: 0,
            }),
        );
        id
    }

    /// Largest DATA payload to send to a peer that advertised
    /// `peer_max_packet`. JMUX peers (jetsocat) count the whole DATA
    /// message, header included, and drop larger ones; longhaul peers count
    /// the payload.
    fn clamp_packet(&self, peer_max_packet: u16) -> usize {
        let allowed = if self.cfg.jmux {
            (peer_max_packet as usize).saturating_sub(DATA_HEADER_LEN)
        } else {
            peer_max_packet as usize
        };
        allowed.clamp(1, self.cfg.send_max_payload)
    }

    fn send_control(&mut self, mut f: Frame) {
        // A refusal may quote what the peer asked for, which can be as long
        // as a frame: cut, the answer still fits and still goes out.
        if let Frame::OpenFailure { description, .. } | Frame::BindFailure { description, .. } =
            &mut f
        {
            shorten(description, MAX_DESCRIPTION);
        }
        let Ok(b) = f.to_bytes() else {
            // Only an over-long string could fail: descriptions are cut
            // above, `open` and `bind` refuse strings that do not fit.
            return;
        };
        self.control_bytes += b.len();
        self.control.push_back(b);
        self.new_output = true;
        if self.control_bytes > self.cfg.control_limit && self.dead.is_none() {
            // The peer keeps causing replies (PONGs, adjusts) but does not
            // read them: not a well-behaved peer.
            self.close("peer is not reading its control messages");
        }
    }

    /// EOF/CLOSE go behind the stream's own queued data, ahead of others'.
    fn send_stream_control(&mut self, id: u32, f: Frame) {
        if self.data.queued(id) > 0 {
            if let Ok(b) = f.to_bytes() {
                self.data.push(id, OutFrame::encoded(b));
                self.new_output = true;
            }
        } else {
            self.send_control(f);
        }
    }

    /// Sends CLOSE for an open stream and waits for the peer's. `reset`:
    /// the stream is cut short (see [`Event::Finished`]).
    fn send_close(&mut self, id: u32, discard: bool, reset: bool) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.phase = Phase::CloseSent;
        s.discarded |= discard;
        self.datagrams.forget(id);
        let (remote, sent, received) = (s.remote, s.tx_bytes, s.rx_bytes);
        // jetsocat never resets a local socket; in JMUX mode neither do we.
        let reset = reset && !self.cfg.jmux;
        self.events.push_back(Event::Finished {
            id,
            discard,
            reset,
            sent,
            received,
        });
        self.send_stream_control(id, Frame::Close { recipient: remote });
    }

    fn close_if_finished(&mut self, id: u32) {
        if self.streams.get(&id).is_some_and(|s| s.phase.finished()) {
            self.send_close(id, false, false);
        }
    }

    /// Forgets a stream. One whose local socket is still open (and not
    /// dropping what it holds) keeps its budget and its slot until the
    /// runtime closes the socket ([`Mux::local_closed`]).
    fn remove(&mut self, id: u32) {
        if let Some(s) = self.streams.remove(&id) {
            if s.local_open && !s.discarded && self.dead.is_none() {
                self.draining.insert(id, s.reserved);
            } else {
                self.budget.release(s.reserved);
            }
        }
    }

    /// Streams counted against `max_streams`: open, connecting, and closed
    /// ones still writing to their local sockets.
    fn slots_used(&self) -> usize {
        self.streams.len() + self.connecting + self.draining.len()
    }

    fn expire_open(&mut self, id: u32) {
        if !self.streams.get(&id).is_some_and(|s| s.phase.is_opening()) {
            return;
        }
        self.remove(id);
        self.expired.insert(id, Expired::Unanswered);
        self.events.push_back(Event::OpenAnswered {
            id,
            result: Err(Refused::new(
                Reason::TTL_EXPIRED,
                "the peer did not answer the open in time",
            )),
        });
        if self.expired.len() > self.cfg.max_streams {
            self.close(format!(
                "peer left more than {} stream opens unanswered",
                self.cfg.max_streams
            ));
        }
    }
}
