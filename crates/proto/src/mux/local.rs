//! Local events: what the runtime tells the core (streams opened, data
//! read from or written to local sockets, answers to the peer's requests),
//! and the frames it takes out for the carrier.

use std::collections::VecDeque;

use bytes::Bytes;

use super::stream::{Down, Phase, Up};
use super::{Event, IncomingOpen, Mux, Refused, MAX_BINDS};
use crate::frame::{write_data_header, Frame, Reason, DATA_HEADER_LEN, MAX_FRAME_LEN};
use crate::outframe::OutFrame;

/// Whether an OPEN to `dest` fits a frame.
pub(super) fn open_fits(dest: &str) -> bool {
    let empty = Frame::Open {
        sender: 0,
        window: 0,
        max_packet: 0,
        dest: String::new(),
    };
    empty.encoded_len() + dest.len() <= MAX_FRAME_LEN
}

/// What `open` and `bind` say of strings too long for a frame.
pub(super) fn too_long(what: &str) -> Refused {
    Refused::new(
        Reason::GENERAL_FAILURE,
        format!("{what} too long: a frame holds at most {MAX_FRAME_LEN} bytes"),
    )
}

impl Mux {
    // ---- local events ------------------------------------------------

    /// Opens a stream to `dest`; the answer comes as [`Event::OpenAnswered`].
    pub fn open(&mut self, dest: &str, now: u64) -> Result<u32, Refused> {
        if let Some(why) = &self.dead {
            return Err(Refused::new(
                Reason::GENERAL_FAILURE,
                format!("session closed: {why}"),
            ));
        }
        if self.goodbye.is_some() {
            return Err(Refused::new(
                Reason::GENERAL_FAILURE,
                "session shutting down",
            ));
        }
        if self.slots_used() >= self.cfg.max_streams {
            return Err(Refused::new(Reason::GENERAL_FAILURE, "too many streams"));
        }
        // A frame too long to encode would never be sent (a `-R` peer's
        // destination comes back to it in our OPENs): refuse it here.
        if !open_fits(dest) {
            return Err(too_long("destination"));
        }
        let deadline = now + self.cfg.open_timeout.as_nanos() as u64;
        let id = self.new_stream(0, 0, 0, Phase::Opening { deadline }, now);
        let window = self.streams.get(&id).map_or(0, |s| s.recv.size());
        self.send_control(Frame::Open {
            sender: id,
            window,
            max_packet: self.cfg.our_max_packet,
            dest: dest.to_owned(),
        });
        Ok(id)
    }

    /// The opener of `id` stopped waiting (gave up or went away): an
    /// unanswered OPEN expires, an open stream is closed.
    pub fn abandon(&mut self, id: u32) {
        match self.streams.get(&id).map(|s| s.phase) {
            Some(Phase::Opening { .. }) => self.expire_open(id),
            Some(Phase::Open { .. }) => self.abort(id),
            _ => {}
        }
    }

    /// Accepts a stream the peer asked for; returns its id.
    pub fn accept_open(&mut self, open: IncomingOpen, now: u64) -> Option<u32> {
        self.connecting = self.connecting.saturating_sub(1);
        if self.dead.is_some() {
            return None;
        }
        let phase = Phase::Open {
            up: Up::Open,
            down: Down::Open,
        };
        let id = self.new_stream(open.sender, open.window, open.max_packet, phase, now);
        let window = self.streams.get(&id).map_or(0, |s| s.recv.size());
        self.send_control(Frame::OpenSuccess {
            recipient: open.sender,
            sender: id,
            window,
            max_packet: self.cfg.our_max_packet,
        });
        Some(id)
    }

    /// Refuses a stream the peer asked for.
    pub fn refuse_open(&mut self, open: IncomingOpen, refused: Refused) {
        self.connecting = self.connecting.saturating_sub(1);
        if self.dead.is_some() {
            return;
        }
        self.send_control(Frame::OpenFailure {
            recipient: open.sender,
            reason: refused.reason,
            description: refused.description,
        });
    }

    /// Asks the peer to listen on `bind` and open streams back to `dest`;
    /// the answer comes as [`Event::BindAnswered`].
    pub fn bind(&mut self, bind: &str, dest: &str, now: u64) -> Result<u32, Refused> {
        if !self.cfg.extensions {
            return Err(Refused::new(
                Reason::GENERAL_FAILURE,
                "reverse forwards need longhaul's native mode (not --jmux)",
            ));
        }
        if self.dead.is_some() || self.binds_out.len() >= MAX_BINDS {
            return Err(Refused::new(
                Reason::GENERAL_FAILURE,
                "session closed or too many binds",
            ));
        }
        // The peer sends `dest` back in its OPENs: that frame must fit too.
        let empty = Frame::Bind {
            request: 0,
            bind: String::new(),
            dest: String::new(),
        };
        if empty.encoded_len() + bind.len() + dest.len() > MAX_FRAME_LEN || !open_fits(dest) {
            return Err(too_long("reverse forward"));
        }
        let request = self.next_bind;
        self.next_bind = self.next_bind.wrapping_add(1);
        self.binds_out
            .insert(request, now + self.cfg.open_timeout.as_nanos() as u64);
        self.send_control(Frame::Bind {
            request,
            bind: bind.to_owned(),
            dest: dest.to_owned(),
        });
        Ok(request)
    }

    /// Answers a BIND the peer sent.
    pub fn answer_bind(&mut self, request: u32, result: Result<u16, Refused>) {
        let f = match result {
            Ok(port) => Frame::BindSuccess { request, port },
            Err(e) => {
                self.binds_in = self.binds_in.saturating_sub(1);
                Frame::BindFailure {
                    request,
                    reason: e.reason,
                    description: e.description,
                }
            }
        };
        if self.dead.is_none() {
            self.send_control(f);
        }
    }

    /// How many bytes stream `id` may send now (credit and queue room);
    /// `None` once it may send no more. At 0, [`Event::Writable`] follows
    /// when that changes.
    pub fn send_room(&mut self, id: u32) -> Option<usize> {
        if self.dead.is_some() {
            return None;
        }
        let queued = self.data.queued(id);
        let s = self.streams.get_mut(&id)?;
        if !s.phase.can_send() {
            return None;
        }
        let room = self.cfg.send_queue.saturating_sub(queued);
        let total_room = self.cfg.send_total.saturating_sub(self.data.total_queued());
        if total_room == 0 {
            self.total_blocked = true;
        }
        let n = (s.credit.available() as usize).min(room).min(total_room);
        if n == 0 {
            s.waiting = true;
            if s.credit.available() == 0 {
                s.credit_stalls += 1;
            }
        }
        Some(n)
    }

    /// Queues bytes read from stream `id`'s local socket (at most what
    /// [`Mux::send_room`] allowed); split into DATA frames without copying.
    pub fn send(&mut self, id: u32, mut data: Bytes) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if !s.phase.can_send() || self.dead.is_some() {
            return;
        }
        let n = s.credit.take(data.len());
        data.truncate(n);
        s.tx_bytes += n as u64;
        let (remote, max_packet) = (s.remote, s.max_packet.min(self.frame_cap));
        while !data.is_empty() {
            let piece = data.split_to(data.len().min(max_packet));
            let mut head = [0u8; DATA_HEADER_LEN];
            write_data_header(&mut head, remote, piece.len());
            self.data.push(id, OutFrame::data(head, piece));
            self.new_output = true;
        }
    }

    /// Stream `id`'s local socket reached EOF.
    pub fn send_eof(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let Phase::Open { up: Up::Open, down } = s.phase else {
            return;
        };
        s.phase = Phase::Open {
            up: Up::EofSent,
            down,
        };
        let remote = s.remote;
        self.send_stream_control(id, Frame::Eof { recipient: remote });
        self.close_if_finished(id);
    }

    /// `n` bytes of stream `id` were written to its local socket: credit
    /// goes back to the peer when the window says so.
    pub fn delivered(&mut self, id: u32, n: usize, now: u64) {
        let rtt = self.window_rtt_ns();
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.rx_bytes += n as u64;
        let before = s.recv.size();
        let budget = &mut self.budget;
        let credit = s
            .recv
            .on_delivered(n, now, rtt, |extra| budget.try_reserve(extra as u64));
        s.reserved += (s.recv.size() - before) as u64;
        if let (Some(increment), Phase::Open { .. }) = (credit, s.phase) {
            let remote = s.remote;
            self.send_control(Frame::WindowAdjust {
                recipient: remote,
                increment,
            });
        }
    }

    /// Everything up to the peer's EOF was written and the local socket
    /// half-closed.
    pub fn eof_delivered(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if let Phase::Open {
            up,
            down: Down::EofReceived,
        } = s.phase
        {
            s.phase = Phase::Open {
                up,
                down: Down::EofDelivered,
            };
            self.close_if_finished(id);
        }
    }

    /// Stream `id`'s local socket failed: CLOSE to the peer, drop what is
    /// queued either way. The peer's side is reset (native mode).
    pub fn abort(&mut self, id: u32) {
        match self.streams.get(&id).map(|s| s.phase) {
            Some(Phase::Open { .. }) => self.send_close(id, true, true),
            Some(Phase::Opening { .. }) => self.expire_open(id),
            Some(Phase::CloseSent) => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.discarded = true;
                }
            }
            None => {}
        }
    }

    /// The runtime gave stream `id` a local socket (its pumps started).
    pub fn local_opened(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.local_open = true;
        }
    }

    /// The runtime closed stream `id`'s local socket (its downlink ended):
    /// a closed stream's budget and slot are free again.
    pub fn local_closed(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.local_open = false;
        } else if let Some(reserved) = self.draining.remove(&id) {
            self.budget.release(reserved);
        }
    }

    // ---- output -----------------------------------------------------

    /// Whether anything waits to be written.
    pub fn has_output(&self) -> bool {
        !self.control.is_empty() || !self.data.is_empty() || self.datagrams.wait_for_writer()
    }

    /// Whether streams have DATA waiting for the carrier.
    pub fn has_stream_data(&self) -> bool {
        !self.data.is_empty()
    }

    /// Whether a stream that just became active has DATA waiting: the next
    /// [`Mux::poll_transmit`] starts with it (after the control lane).
    pub fn has_new_data(&self) -> bool {
        self.data.has_new()
    }

    /// Whether frames were queued since the last call: the writer needs a
    /// wake-up (it is not woken for what it already knows about).
    pub fn take_new_output(&mut self) -> bool {
        std::mem::take(&mut self.new_output)
    }

    /// Takes frames to write into `batch`: the whole control lane first,
    /// then datagrams, then DATA in deficit round-robin order, while under
    /// `max_bytes` and `max_frames`. While streams have data waiting,
    /// datagrams take at most half of either, so a flood of them cannot
    /// starve the streams; datagrams are not sequenced, so they still go
    /// when `max_bytes` is 0 (a full replay buffer). Returns the bytes taken; streams that were waiting for
    /// queue room get [`Event::Writable`].
    pub fn poll_transmit(
        &mut self,
        batch: &mut VecDeque<OutFrame>,
        max_bytes: usize,
        max_frames: usize,
    ) -> usize {
        let mut bytes = 0;
        while let Some(f) = self.control.pop_front() {
            self.control_bytes -= f.len();
            bytes += f.len();
            batch.push_back(OutFrame::encoded(f));
        }
        let mut data_bytes = 0;
        // (Datagrams that go apart are not taken here, unless moved back.)
        if !self.datagrams.is_empty() {
            let room = max_frames.saturating_sub(batch.len());
            let (dg_bytes, dg_frames) = if self.data.is_empty() || max_bytes == 0 {
                (super::datagram::DATAGRAM_QUEUE, room)
            } else {
                (max_bytes / 2, room / 2)
            };
            let (mut taken, mut frames) = (0, 0);
            // At least one, whatever the limits: a datagram is never cut.
            while frames == 0 || (taken < dg_bytes && frames < dg_frames) {
                let Some(f) = self.datagrams.pop() else {
                    break;
                };
                taken += f.remaining();
                frames += 1;
                batch.push_back(f);
            }
            bytes += taken;
        }
        while data_bytes < max_bytes && batch.len() < max_frames {
            let Some((id, f)) = self.data.pop() else {
                break;
            };
            data_bytes += f.remaining();
            batch.push_back(f);
            self.room_freed(id);
        }
        self.bytes_sent += (bytes + data_bytes) as u64;
        bytes + data_bytes
    }

    /// The next control frame, if `ok` accepts its stream (for frames sent
    /// ahead of a batch already in progress).
    pub fn pop_control_if(&mut self, ok: impl Fn(Option<u32>) -> bool) -> Option<OutFrame> {
        let front = self.control.front()?;
        if !ok(crate::outframe::stream_recipient(front)) {
            return None;
        }
        let f = self.control.pop_front()?;
        self.control_bytes -= f.len();
        self.bytes_sent += f.len() as u64;
        Some(OutFrame::encoded(f))
    }

    /// The next DATA frame of a stream that just became active, if the
    /// control lane is empty and `ok` accepts the frame.
    pub fn pop_new_data_if(&mut self, ok: impl Fn(&OutFrame) -> bool) -> Option<OutFrame> {
        if !self.control.is_empty() {
            return None;
        }
        let (id, f) = self.data.pop_new_if(ok)?;
        self.bytes_sent += f.remaining() as u64;
        self.room_freed(id);
        Some(f)
    }

    fn room_freed(&mut self, id: u32) {
        if let Some(s) = self.streams.get_mut(&id) {
            if s.waiting {
                s.waiting = false;
                self.events.push_back(Event::Writable { id });
            }
        }
        self.wake_if_total_drained();
    }

    /// Streams that waited for the session's queue to drain (`send_total`)
    /// are woken once it has half drained: once per fill and drain, not
    /// per frame. Called whenever queued DATA leaves the queue (sent, or
    /// dropped with its stream).
    pub(super) fn wake_if_total_drained(&mut self) {
        if self.total_blocked && self.data.total_queued() <= self.cfg.send_total / 2 {
            self.total_blocked = false;
            for (&id, s) in self.streams.iter_mut() {
                if s.waiting {
                    s.waiting = false;
                    self.events.push_back(Event::Writable { id });
                }
            }
        }
    }
}
