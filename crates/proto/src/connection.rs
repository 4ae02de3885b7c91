//! One session's whole protocol as one state machine: the multiplexer
//! ([`Mux`]) over the link layer ([`LinkLayer`], when both sides offered
//! resume), with no I/O, no clock and no tasks — quinn-proto's
//! `Connection` is the model.
//!
//! The runtime feeds it what its carriers read, by carrier id
//! ([`Connection::on_bytes`] for a single carrier, [`Connection::on_chunk`]
//! and [`Connection::on_ack`] for a striped session's lanes), tells it what
//! happened to a carrier ([`Connection::carrier_lost`],
//! [`Connection::resume`]) and asks it what to write
//! ([`Connection::poll_chunk`] for a lane, [`Connection::poll_transmit`]
//! for a single carrier, which then says what it wrote with
//! [`Connection::on_written`]: frames are recorded for a replay as they
//! start going out, in wire order). Everything else — events for the streams,
//! deadlines — comes out of the multiplexer as before. Input from a
//! carrier that is no longer current is refused in one place (the link
//! layer), before any of it reaches the multiplexer; a frame handed on is
//! always counted, in the same call.
//!
//! Violations close the session with their reason ([`Mux::dead`]); the
//! peer's GOODBYE ends it on purpose ([`Connection::peer_goodbye`]).

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::frame::{self, DecodeLimits, Frame};
use crate::link::{CarrierId, Chunk, Input, LinkError, LinkLayer, Lost};
use crate::mux::Mux;
use crate::outframe::{advance_batch, OutFrame};

/// Retired read buffers that may stay alive through slices of them before
/// payloads are copied instead: 16 × 512 KiB = 8 MiB per session.
pub const MAX_PINNED_CHUNKS: usize = 16;

/// Read buffers (or a striped session's chunk buffers) that are done with
/// but still referenced by payloads queued for streams. DATA payloads
/// leave as slices of the buffer they arrived in (no copy), and a slice
/// keeps its whole buffer alive; past a fixed allowance of such buffers,
/// payloads are copied instead until enough are let go — so what the
/// carrier's buffers hold is bounded whatever frames the peer sends.
#[derive(Debug, Default)]
pub struct Pins {
    /// A zero-length slice of each retired buffer: it is the only reference
    /// left once every payload cut from that buffer is gone.
    retired: VecDeque<Bytes>,
}

impl Pins {
    /// `sentinel`: a zero-length slice of a buffer no longer read into.
    pub fn retire(&mut self, sentinel: Bytes) {
        self.retired.push_back(sentinel);
        self.prune();
    }

    fn prune(&mut self) {
        self.retired.retain(|b| !b.is_unique());
    }

    /// Whether payloads may still be handed out as slices.
    pub fn may_slice(&mut self) -> bool {
        if self.retired.len() >= MAX_PINNED_CHUNKS {
            self.prune();
        }
        self.retired.len() < MAX_PINNED_CHUNKS
    }

    pub fn len(&self) -> usize {
        self.retired.len()
    }

    pub fn is_empty(&self) -> bool {
        self.retired.is_empty()
    }
}

/// What input from a carrier did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// The carrier is not current: nothing was handed on or counted; its
    /// reader should stop.
    Stale,
    /// Handed on; `wake`: a writer has something to send now.
    Taken { wake: bool },
    /// The session ended (a violation, the peer's GOODBYE, or it was over).
    Ended,
}

/// What a lane's writer should do next.
#[derive(Debug)]
pub enum LaneOutput {
    Chunk(Chunk),
    /// Nothing to send: wait to be woken.
    Idle,
    /// The lane is no longer current.
    Stale,
    /// The session is over.
    Dead,
    /// Shutting down and every CLOSE is out: end the session for `why`.
    Goodbye(String),
}

/// What losing a carrier meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// No link layer (or the session is ending): the session is closed.
    Closed,
    /// As the link layer says.
    Link(Lost),
}

/// One session's protocol (see the module docs).
pub struct Connection {
    mux: Mux,
    link: Option<LinkLayer>,
    limits: DecodeLimits,
    /// A striped session's chunk buffers held by queued payloads.
    lane_pins: Pins,
    /// DATA from the last input may be queued as slices of its buffer.
    may_slice: bool,
    peer_goodbye: bool,
    /// When each lane last heard from the peer: datagrams avoid a silent
    /// one (see `lane_quiet`).
    lanes_heard: crate::lane_quiet::LanesHeard,
    /// Server: how long a detached session waits for a resume.
    resume_timeout: Option<Duration>,
    /// What a datagram path may take beside the byte stream.
    path_share: datagrams::PathShare,
}

impl Connection {
    /// `limits`: what the peer's frames may be.
    pub fn new(mut mux: Mux, link: Option<LinkLayer>, limits: DecodeLimits) -> Connection {
        // A striped session's datagrams go on the lanes outside chunks.
        mux.set_datagrams_apart(link.as_ref().is_some_and(LinkLayer::is_striped));
        Connection {
            mux,
            link,
            limits,
            lane_pins: Pins::default(),
            may_slice: true,
            peer_goodbye: false,
            lanes_heard: Default::default(),
            resume_timeout: None,
            path_share: Default::default(),
        }
    }

    /// Server: a detached session is closed once it has waited `timeout`
    /// for a resume (`--resume-timeout`). Without one (the client) it
    /// waits until the runtime gives up.
    pub fn set_resume_timeout(&mut self, timeout: Option<Duration>) {
        self.resume_timeout = timeout;
    }

    /// When [`Connection::handle_timeout`] should run next: the
    /// multiplexer's deadlines (keepalive, dead peer, idle, unanswered
    /// OPENs and BINDs) and, while detached, the resume's.
    pub fn poll_timeout(&self) -> Option<u64> {
        let resume = match (&self.link, self.resume_timeout) {
            (Some(l), Some(t)) => l.poll_timeout(t),
            _ => None,
        };
        match (self.mux.poll_timeout(), resume) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The session is over at `now`: closed, or detached past its resume
    /// timeout (even if the timer has not run yet). A resume is refused.
    pub fn is_over(&self, now: u64) -> bool {
        self.mux.dead().is_some()
            || matches!((&self.link, self.resume_timeout), (Some(l), Some(t)) if l.resume_expired(now, t))
    }

    /// Runs what is due at `now`; a detached session whose resume did not
    /// come in time is closed.
    pub fn handle_timeout(&mut self, now: u64) {
        if let (Some(l), Some(t)) = (&self.link, self.resume_timeout) {
            if l.resume_expired(now, t) {
                self.mux.close(format!(
                    "carrier lost and not resumed within {t:?} (--resume-timeout)"
                ));
                return;
            }
        }
        self.mux.handle_timeout(now);
    }

    /// What the peer's frames may be, as the hello on the current carrier
    /// agreed.
    pub fn set_limits(&mut self, limits: DecodeLimits) {
        self.limits = limits;
    }

    pub fn mux(&self) -> &Mux {
        &self.mux
    }

    /// The multiplexer, for everything about streams.
    pub fn mux_mut(&mut self) -> &mut Mux {
        &mut self.mux
    }

    pub fn link(&self) -> Option<&LinkLayer> {
        self.link.as_ref()
    }

    pub fn link_mut(&mut self) -> Option<&mut LinkLayer> {
        self.link.as_mut()
    }

    pub fn is_striped(&self) -> bool {
        self.link.as_ref().is_some_and(LinkLayer::is_striped)
    }

    /// The peer ended the session on purpose (GOODBYE).
    pub fn peer_goodbye(&self) -> bool {
        self.peer_goodbye
    }

    /// Whether DATA events from the last input may hold slices of the
    /// carrier's buffers (else the runtime copies them).
    pub fn may_slice(&self) -> bool {
        self.may_slice
    }

    /// Single carrier: frames for `carrier` into `batch` — at most `limit`
    /// bytes of new frames and `max_frames` frames, within the replay
    /// buffer's room (a full one waits for the peer's ACK like a full
    /// socket; control frames still go) — with the ACK owed to the peer in
    /// front (or alone, when the peer's replay buffer needs it). Nothing
    /// for a carrier that is no longer current. Returns the bytes taken
    /// from the multiplexer.
    pub fn poll_transmit(
        &mut self,
        carrier: CarrierId,
        batch: &mut VecDeque<OutFrame>,
        limit: usize,
        max_frames: usize,
    ) -> usize {
        let Some(link) = &mut self.link else {
            return self.mux.poll_transmit(batch, limit, max_frames);
        };
        if !link.is_current(carrier) {
            return 0;
        }
        let taken = self
            .mux
            .poll_transmit(batch, limit.min(link.room()), max_frames);
        // Not inside a frame cut short: its rest goes first.
        if !batch.front().is_some_and(|f| f.started) {
            if let Some(ack) = link.ack_to_send(!batch.is_empty()) {
                batch.retain(|f| !f.is_link());
                batch.push_front(OutFrame::encoded(
                    ack.to_bytes().expect("an ACK frame encodes"),
                ));
            }
        }
        taken
    }

    /// Single carrier: `n` bytes at the front of `batch` were written. Each
    /// frame is recorded for a replay as its first byte goes out, so that
    /// sequence numbers follow the order on the wire.
    pub fn on_written(&mut self, batch: &mut VecDeque<OutFrame>, n: usize) {
        match &mut self.link {
            Some(l) => advance_batch(batch, n, |f| l.record(f)),
            None => advance_batch(batch, n, |_| {}),
        }
    }

    fn goodbye(&mut self) -> Received {
        self.peer_goodbye = true;
        self.mux.close("peer ended the session");
        Received::Ended
    }

    /// Hands one frame to the multiplexer. `false`: the session ended.
    fn deliver(&mut self, f: Frame, now: u64) -> bool {
        let r = self.mux.handle_frame(f, now);
        r.is_ok() && self.mux.dead().is_none()
    }

    /// Single carrier: every whole frame at the front of `buf`, read from
    /// `carrier`, is taken (an unfinished one stays). `may_slice`: DATA may
    /// be queued as slices of `buf`'s storage.
    pub fn on_bytes(
        &mut self,
        carrier: CarrierId,
        buf: &mut BytesMut,
        may_slice: bool,
        now: u64,
    ) -> Received {
        if self.mux.dead().is_some() {
            return Received::Ended;
        }
        if self.link.as_ref().is_some_and(|l| !l.is_current(carrier)) {
            return Received::Stale;
        }
        self.may_slice = may_slice;
        self.mux.heard(now);
        let link = self.link.is_some();
        // Bytes of whole frames handed on, and the peer's latest ACK:
        // counted before this call returns, whatever happens.
        let mut got = 0usize;
        let mut ack = None;
        let mut ended = false;
        loop {
            let before = buf.len();
            match frame::decode(buf, self.limits) {
                Ok(Some(Frame::Ack { received })) if link => ack = Some(received),
                // Not sequenced on a link layer: not counted.
                Ok(Some(f @ Frame::Datagram { .. })) if link => {
                    if !self.deliver(f, now) {
                        ended = true;
                        break;
                    }
                }
                Ok(Some(Frame::Goodbye)) if link => return self.goodbye(),
                Ok(Some(f)) => {
                    got += before - buf.len();
                    if !self.deliver(f, now) {
                        ended = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    self.mux.close(format!("malformed frame from peer: {e}"));
                    return Received::Ended;
                }
            }
        }
        let Some(l) = self.link.as_mut() else {
            return if ended {
                Received::Ended
            } else {
                Received::Taken { wake: false }
            };
        };
        match l.on_input(carrier, got, ack) {
            Ok(_) if ended => Received::Ended,
            // Room freed by the ACK matters only to output waiting for it
            // (new output wakes the writer through the multiplexer); a due
            // ACK always does. A request answered at once would otherwise
            // wake the writer twice per round trip.
            Ok(Input::Applied { wake }) => Received::Taken {
                wake: wake && (self.mux.has_output() || l.ack_due()),
            },
            Ok(Input::Stale) => Received::Stale,
            Err(e) => {
                self.mux
                    .close(format!("bad acknowledgement from peer: {e}"));
                Received::Ended
            }
        }
    }

    /// Lanes: the peer's ACK, read on `lane` outside a chunk.
    pub fn on_ack(&mut self, lane: CarrierId, received: u64, now: u64) -> Received {
        let Some(l) = self.link.as_mut() else {
            return Received::Ended;
        };
        if !l.is_current(lane) {
            return Received::Stale;
        }
        self.mux.heard(now);
        self.lanes_heard.heard(lane, now);
        match l.on_ack(received) {
            Ok(freed) => Received::Taken { wake: freed },
            Err(e) => {
                self.mux
                    .close(format!("bad acknowledgement from peer: {e}"));
                Received::Ended
            }
        }
    }

    /// Lanes: a DATAGRAM read on `lane` outside a chunk (not sequenced:
    /// handed on at once, whatever the reorder buffer waits for).
    pub fn on_lane_datagram(&mut self, lane: CarrierId, f: Frame, now: u64) -> Received {
        if self.mux.dead().is_some() {
            return Received::Ended;
        }
        if !self.link.as_ref().is_some_and(|l| l.is_current(lane)) {
            return Received::Stale;
        }
        self.mux.heard(now);
        self.lanes_heard.heard(lane, now);
        if let Some(l) = self.link.as_mut() {
            l.datagram_heard();
        }
        // Its payload is a slice of a buffer of its own.
        self.may_slice = true;
        if self.deliver(f, now) {
            Received::Taken { wake: false }
        } else {
            Received::Ended
        }
    }

    /// Lanes: a chunk read on `lane`: `data` is the peer's byte stream
    /// from `offset`. Every run now in order is decoded and handed on.
    pub fn on_chunk(&mut self, lane: CarrierId, offset: u64, data: BytesMut, now: u64) -> Received {
        if self.mux.dead().is_some() {
            return Received::Ended;
        }
        let Some(l) = self.link.as_mut() else {
            return Received::Ended;
        };
        match l.on_chunk(lane, offset, data) {
            Ok(true) => self.lanes_heard.heard(lane, now),
            Ok(false) => return Received::Stale,
            Err(e) => {
                self.mux.close(format!("bad chunk from peer: {e}"));
                return Received::Ended;
            }
        }
        self.mux.heard(now);
        // One answer for every run of this call: the runtime queues their
        // DATA after it returns.
        self.may_slice = true;
        while let Some(mut run) = self.link.as_mut().and_then(LinkLayer::next_run) {
            self.may_slice &= self.lane_pins.may_slice();
            let sentinel = run.split_to(0).freeze();
            loop {
                match frame::decode(&mut run, self.limits) {
                    Ok(Some(Frame::Goodbye)) => return self.goodbye(),
                    Ok(Some(f @ (Frame::Ack { .. } | Frame::Chunk { .. }))) => {
                        self.mux.close(format!(
                            "link message type {} inside a chunk",
                            f.type_code()
                        ));
                        return Received::Ended;
                    }
                    Ok(Some(f)) => {
                        if !self.deliver(f, now) {
                            return Received::Ended;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.mux.close(format!("malformed frame from peer: {e}"));
                        return Received::Ended;
                    }
                }
            }
            if !run.is_empty() {
                self.mux.close("a chunk from the peer ends inside a frame");
                return Received::Ended;
            }
            self.lane_pins.retire(sentinel);
        }
        let wake = self.link.as_ref().is_some_and(LinkLayer::ack_wanted);
        Received::Taken { wake }
    }

    /// Lanes: the next chunk for `lane`, whose socket has room for about
    /// `target` bytes. Frames come from the multiplexer within the link
    /// layer's budget: control frames first (they still go when the replay
    /// buffer is full), then data in the scheduler's order.
    pub fn poll_chunk(&mut self, lane: CarrierId, target: usize, now: u64) -> LaneOutput {
        if self.mux.dead().is_some() {
            return LaneOutput::Dead;
        }
        let Some(l) = self.link.as_mut() else {
            return LaneOutput::Stale;
        };
        if !l.is_current(lane) {
            return LaneOutput::Stale;
        }
        // Datagrams first, outside the chunk: never sequenced, so never
        // waiting in the peer's reorder buffer behind another lane; not on
        // a lane gone silent or stalled (they would be lost there).
        let mut datagrams = VecDeque::new();
        let mut datagram_bytes = 0;
        let avoid = crate::lane_quiet::datagrams_avoid(&mut self.lanes_heard, l, lane, now);
        while datagram_bytes < target && !avoid {
            let Some(f) = self.mux.pop_datagram() else {
                break;
            };
            datagram_bytes += f.remaining();
            datagrams.extend(f.into_pieces());
        }
        let mux = &mut self.mux;
        let mut goodbye = None;
        let chunk = l.next_chunk(lane, target, now, |budget, batch| {
            let carried = !batch.is_empty();
            let mut control = 0;
            let mut control_left = true;
            while control < budget.control && batch.len() < budget.frames {
                match mux.pop_control_if(|_| true) {
                    Some(f) => {
                        control += f.remaining();
                        batch.push_back(f);
                    }
                    None => {
                        control_left = false;
                        break;
                    }
                }
            }
            if !control_left && budget.bytes > control {
                mux.poll_transmit(batch, budget.bytes - control, budget.frames);
            }
            let more = mux.has_output();
            goodbye = mux
                .goodbye_done()
                .filter(|_| batch.is_empty() && !more && !carried)
                .map(str::to_owned);
            more
        });
        if let Some(why) = goodbye.filter(|_| datagrams.is_empty()) {
            return LaneOutput::Goodbye(why);
        }
        match chunk {
            Some(mut c) => {
                for piece in datagrams.into_iter().rev() {
                    c.pieces.push_front(piece);
                }
                LaneOutput::Chunk(c)
            }
            None if !datagrams.is_empty() => LaneOutput::Chunk(Chunk {
                pieces: datagrams,
                len: 0,
                resent: false,
                more: self.mux.has_output(),
            }),
            None => LaneOutput::Idle,
        }
    }

    /// The lanes that should take the queued datagrams when `lane` avoids
    /// them (it has gone silent or stalled, see `lane_quiet`): the caller wakes their
    /// writers. Empty when `lane` takes them itself, or none are queued.
    pub fn datagram_takers(&mut self, lane: CarrierId, now: u64) -> Vec<CarrierId> {
        let Some(l) = self.link.as_ref() else {
            return Vec::new();
        };
        let heard = &mut self.lanes_heard;
        let avoid = |heard: &mut _, c| crate::lane_quiet::datagrams_avoid(heard, l, c, now);
        if !self.mux.has_datagrams() || !avoid(heard, lane) {
            return Vec::new();
        }
        let lanes: Vec<CarrierId> = l.carriers().iter().map(|c| c.0).collect();
        lanes
            .into_iter()
            .filter(|&c| c != lane && !avoid(heard, c))
            .collect()
    }

    /// Carrier (or lane) `carrier` failed or was stopped (`why`). Without a
    /// link layer, or once the session is ending, the session closes; else
    /// the link layer decides, and a detached session's timers pause.
    pub fn carrier_lost(&mut self, carrier: CarrierId, now: u64, why: &str) -> Loss {
        let ending = self.mux.dead().is_some() || self.mux.goodbye_done().is_some();
        let Some(l) = self.link.as_mut().filter(|_| !ending) else {
            self.mux.close(why);
            return Loss::Closed;
        };
        let lost = l.carrier_lost(carrier, now);
        if lost == Lost::Detached {
            self.mux.set_attached(false, now);
        }
        Loss::Link(lost)
    }

    /// Attaches a carrier to the detached session after the resume
    /// exchange (see [`LinkLayer::resume`]); the multiplexer's timers run
    /// again. Refused once the session is over ([`Connection::is_over`]).
    pub fn resume(
        &mut self,
        number: u8,
        peer_received: u64,
        now: u64,
    ) -> Result<(CarrierId, Vec<OutFrame>), LinkError> {
        if self.is_over(now) {
            return Err(LinkError::Ended);
        }
        let Some(l) = self.link.as_mut() else {
            return Err(LinkError::NoLinkLayer);
        };
        let r = l.resume(number, peer_received, now)?;
        self.mux.set_attached(true, now);
        Ok(r)
    }
}

#[path = "connection_datagrams.rs"]
mod datagrams;

#[cfg(test)]
#[path = "connection_tests.rs"]
mod tests;
