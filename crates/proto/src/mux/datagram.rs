//! Datagrams of UDP flows.
//!
//! A flow is a stream opened to `udp://host:port`: it is opened, answered
//! and closed like any stream, but what it carries are DATAGRAM frames,
//! each one whole UDP payload. They are not flow controlled: they never
//! take or grow a window, and one that cannot be queued is dropped rather
//! than delaying the others (a late voice packet or DNS answer is worth
//! less than a lost one). They go out right behind the control lane, ahead
//! of every stream's DATA, so bulk transfers never hold them up; and they
//! are dropped, not queued, while no carrier is attached.

use bytes::Bytes;

use super::{Mux, Phase};
use crate::frame::{write_datagram_header, DATA_HEADER_LEN, MAX_DATA_PAYLOAD};
use crate::outframe::OutFrame;

/// Bytes of datagrams one session queues for its carrier at most; past it
/// new datagrams are dropped.
pub const DATAGRAM_QUEUE: usize = 256 * 1024;
/// Bytes of datagrams too large for the carrier's datagram path that wait
/// to go in its byte stream instead ([`Mux::pop_datagram_within`]); past
/// it they are dropped. Apart from [`DATAGRAM_QUEUE`], so that large ones
/// held up behind a slow stream never crowd out the small ones the path
/// would carry at once.
pub const INBAND_QUEUE: usize = 64 * 1024;

/// Why a datagram was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// The flow is not open (closed, closing, or not yet answered), or the
    /// session is over.
    NotOpen,
    /// Longer than a frame to this peer can carry.
    TooLarge,
    /// The session has no carrier now (waiting for a resume).
    Detached,
    /// The session's datagram queue is full ([`DATAGRAM_QUEUE`]).
    QueueFull,
}

/// A session's datagram counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatagramStats {
    pub sent: u64,
    pub received: u64,
    /// Not queued here (see [`Dropped`]).
    pub dropped: u64,
    /// Of `sent` and `received`: those that went as messages of the
    /// carrier's datagram path (QUIC datagrams), not in its byte stream.
    pub path_sent: u64,
    pub path_received: u64,
}

/// Datagrams waiting for the carrier.
#[derive(Debug, Default)]
pub(super) struct Datagrams {
    /// Each with its flow's id (ours).
    queue: std::collections::VecDeque<(u32, OutFrame)>,
    bytes: usize,
    /// Too large for the carrier's datagram path ([`Mux::pop_datagram_within`]):
    /// they go in the byte stream after all, as on a carrier without one.
    inband: std::collections::VecDeque<(u32, OutFrame)>,
    inband_bytes: usize,
    pub(super) stats: DatagramStats,
    /// They go apart from the other frames ([`Mux::pop_datagram`]), not
    /// in [`Mux::poll_transmit`]'s batches: a striped session sends them on
    /// its lanes outside chunks.
    pub(super) apart: bool,
    /// They go apart on the single carrier's datagram path, which the
    /// runtime feeds itself: the writer is not woken for them.
    path: bool,
}

impl Datagrams {
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.inband.is_empty()
    }

    /// Whether some wait for a writer (of the carrier or of a lane), not
    /// for the datagram path.
    pub(super) fn wait_for_writer(&self) -> bool {
        !self.inband.is_empty() || (!self.queue.is_empty() && !self.path)
    }

    /// The next datagram for the byte stream: one moved there for its
    /// size, else (unless they go apart) the next queued.
    pub(super) fn pop(&mut self) -> Option<OutFrame> {
        let f = match self.inband.pop_front() {
            Some((_, f)) => {
                self.inband_bytes -= f.remaining();
                f
            }
            None if self.apart => return None,
            None => {
                let (_, f) = self.queue.pop_front()?;
                self.bytes -= f.remaining();
                f
            }
        };
        self.stats.sent += 1;
        Some(f)
    }

    /// The next datagram to go apart from the byte stream.
    fn pop_apart(&mut self) -> Option<(u32, OutFrame)> {
        let (id, f) = self.queue.pop_front()?;
        self.bytes -= f.remaining();
        Some((id, f))
    }

    /// Drops what flow `id` still has queued (it is closing).
    pub(super) fn forget(&mut self, id: u32) {
        let before = self.queue.len() + self.inband.len();
        self.queue.retain(|(flow, _)| *flow != id);
        self.inband.retain(|(flow, _)| *flow != id);
        if self.queue.len() + self.inband.len() != before {
            self.bytes = self.queue.iter().map(|(_, f)| f.remaining()).sum();
            self.inband_bytes = self.inband.iter().map(|(_, f)| f.remaining()).sum();
        }
    }

    /// Drops everything queued, counted as dropped.
    pub(super) fn drop_all(&mut self) {
        self.stats.dropped += (self.queue.len() + self.inband.len()) as u64;
        self.clear();
    }

    pub(super) fn clear(&mut self) {
        self.queue.clear();
        self.inband.clear();
        self.bytes = 0;
        self.inband_bytes = 0;
    }
}

impl Mux {
    /// Queues one datagram read from flow `id`'s local socket, or drops it
    /// (counted) and says why.
    pub fn send_datagram(&mut self, id: u32, payload: Bytes) -> Result<(), Dropped> {
        let r = self.queue_datagram(id, payload);
        if r.is_err() {
            self.datagrams.stats.dropped += 1;
        }
        r
    }

    fn queue_datagram(&mut self, id: u32, payload: Bytes) -> Result<(), Dropped> {
        if self.dead.is_some() || self.goodbye.is_some() || !self.cfg.extensions {
            return Err(Dropped::NotOpen);
        }
        let s = self.streams.get(&id).ok_or(Dropped::NotOpen)?;
        if !matches!(s.phase, Phase::Open { .. }) {
            return Err(Dropped::NotOpen);
        }
        // What the peer's frame limit (agreed in the hello) lets through.
        if payload.len() > self.cfg.send_max_payload.min(MAX_DATA_PAYLOAD) {
            return Err(Dropped::TooLarge);
        }
        if !self.attached {
            return Err(Dropped::Detached);
        }
        let size = DATA_HEADER_LEN + payload.len();
        if self.datagrams.bytes + size > DATAGRAM_QUEUE {
            return Err(Dropped::QueueFull);
        }
        let mut head = [0u8; DATA_HEADER_LEN];
        write_datagram_header(&mut head, s.remote, payload.len());
        self.datagrams.bytes += size;
        self.datagrams
            .queue
            .push_back((id, OutFrame::data(head, payload)));
        self.new_output |= !self.datagrams.path;
        Ok(())
    }

    /// A DATAGRAM from the peer for flow `id`: handed on while the flow is
    /// open, else dropped (it crossed our CLOSE, or the flow never was).
    pub(super) fn on_datagram(&mut self, id: u32, payload: Bytes) {
        let open = self
            .streams
            .get(&id)
            .is_some_and(|s| matches!(s.phase, Phase::Open { .. }));
        if !open {
            self.datagrams.stats.dropped += 1;
            return;
        }
        self.datagrams.stats.received += 1;
        self.bytes_received += payload.len() as u64;
        self.events
            .push_back(super::Event::Datagram { id, payload });
    }

    /// Datagrams go apart from the other frames: only
    /// [`Mux::pop_datagram`] takes them.
    pub fn set_datagrams_apart(&mut self, apart: bool) {
        self.datagrams.apart = apart;
        self.datagrams.path = false;
    }

    /// Datagrams go on the single carrier's datagram path, which takes
    /// them with [`Mux::pop_datagram_within`] as they are queued (the
    /// writer is not woken for them), or in the byte stream (`false`).
    pub fn set_datagram_path(&mut self, on: bool) {
        self.datagrams.apart = on;
        self.datagrams.path = on;
    }

    /// Whether datagrams wait to be sent.
    pub fn has_datagrams(&self) -> bool {
        !self.datagrams.is_empty()
    }

    /// Whether datagrams wait for the datagram path (not for the stream).
    pub fn has_path_datagrams(&self) -> bool {
        self.datagrams.path && !self.datagrams.queue.is_empty()
    }

    /// The next datagram to send apart (see [`Mux::set_datagrams_apart`]).
    pub fn pop_datagram(&mut self) -> Option<OutFrame> {
        let (_, f) = self.datagrams.pop_apart()?;
        self.datagrams.stats.sent += 1;
        Some(f)
    }

    /// The next datagram to send apart, if its frame is at most `max`
    /// bytes (what the carrier's datagram path carries now); a larger one
    /// is moved to the byte stream, in which it goes as on any carrier (a
    /// DNS answer of 4 KiB arrives late rather than never), and its size
    /// is returned instead (or 0: dropped, the in-stream queue was full).
    pub fn pop_datagram_within(&mut self, max: usize) -> Option<Result<OutFrame, usize>> {
        let (id, f) = self.datagrams.pop_apart()?;
        let d = &mut self.datagrams;
        let size = f.remaining();
        if size <= max {
            d.stats.sent += 1;
            d.stats.path_sent += 1;
            return Some(Ok(f));
        }
        if d.inband_bytes + size > INBAND_QUEUE {
            d.stats.dropped += 1;
            return Some(Err(0));
        }
        d.inband_bytes += size;
        d.inband.push_back((id, f));
        self.new_output = true;
        Some(Err(size))
    }

    /// A datagram taken by [`Mux::pop_datagram_within`] that the carrier
    /// did not take after all (its path shrank, or it is going): counted
    /// as dropped.
    pub fn datagram_not_sent(&mut self) {
        let stats = &mut self.datagrams.stats;
        stats.sent = stats.sent.saturating_sub(1);
        stats.path_sent = stats.path_sent.saturating_sub(1);
        stats.dropped += 1;
    }

    /// A message read from the carrier's datagram path (counted whatever
    /// becomes of it).
    pub fn datagram_on_path(&mut self) {
        self.datagrams.stats.path_received += 1;
    }

    /// The next datagram, to move ahead of frames a writer has already
    /// taken, once the control lane is empty (a flow's OPEN_SUCCESS must
    /// reach the peer before its datagrams).
    pub fn pop_urgent_datagram(&mut self) -> Option<OutFrame> {
        if !self.control.is_empty() {
            return None;
        }
        let f = self.datagrams.pop()?;
        self.bytes_sent += f.remaining() as u64;
        Some(f)
    }

    pub fn datagram_stats(&self) -> DatagramStats {
        self.datagrams.stats
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use bytes::BytesMut;

    use super::*;
    use crate::frame::{decode, DecodeLimits, Frame};
    use crate::mux::{Event, MuxConfig};
    use crate::window::WindowConfig;

    fn mux() -> Mux {
        Mux::new(MuxConfig {
            window: WindowConfig {
                initial: 4096,
                max: 65536,
            },
            budget: 1 << 20,
            max_streams: 8,
            send_queue: 1 << 20,
            send_total: 1 << 20,
            control_limit: 1 << 20,
            keepalive: Duration::from_secs(30),
            dead_after: Duration::from_secs(3600),
            open_timeout: Duration::from_secs(5),
            idle_timeout: None,
            rtt_floor: Duration::from_millis(1),
            jmux: false,
            extensions: true,
            our_max_packet: 4096,
            send_max_payload: MAX_DATA_PAYLOAD,
            resumable: false,
        })
    }

    /// Moves everything `from` has to send into `to`.
    fn pump(from: &mut Mux, to: &mut Mux) -> Vec<Frame> {
        let mut batch = VecDeque::new();
        from.poll_transmit(&mut batch, usize::MAX, usize::MAX);
        let mut wire = BytesMut::new();
        for f in batch {
            wire.extend_from_slice(f.head());
            wire.extend_from_slice(&f.body);
        }
        let mut seen = Vec::new();
        while let Some(f) = decode(&mut wire, DecodeLimits::default()).unwrap() {
            seen.push(f.clone());
            to.handle_frame(f, 0).unwrap();
        }
        seen
    }

    /// The peer's OPEN that `b` was handed.
    fn open_request(b: &mut Mux) -> crate::mux::IncomingOpen {
        loop {
            match b.poll_event() {
                Some(Event::OpenRequest { open, .. }) => return open,
                Some(_) => {}
                None => panic!("no open request"),
            }
        }
    }

    /// A TCP-like stream opened and answered: our id.
    fn stream(a: &mut Mux, b: &mut Mux) -> u32 {
        let id = a.open("tcp://bulk:1", 0).unwrap();
        pump(a, b);
        let open = open_request(b);
        b.accept_open(open, 0).unwrap();
        pump(b, a);
        while a.poll_event().is_some() {}
        id
    }

    /// A flood of small datagrams takes at most half of each batch while a
    /// stream has data waiting; it alone may take a whole batch.
    #[test]
    fn a_datagram_flood_does_not_starve_the_streams() {
        let (mut a, mut b) = (mux(), mux());
        let (flow_a, _) = flow(&mut a, &mut b);
        let id = stream(&mut a, &mut b);
        let fill =
            |a: &mut Mux| while a.send_datagram(flow_a, Bytes::from(vec![5u8; 100])).is_ok() {};
        fill(&mut a);
        let mut batch = VecDeque::new();
        a.poll_transmit(&mut batch, 64 << 10, 32);
        assert_eq!(batch.len(), 32, "datagrams alone fill a batch");
        fill(&mut a);
        a.send(id, Bytes::from(vec![1u8; 4000]));
        let mut batch = VecDeque::new();
        a.poll_transmit(&mut batch, 64 << 10, 32);
        let datagrams = batch.iter().filter(|f| f.is_datagram()).count();
        assert!(
            datagrams <= 16 && datagrams > 0,
            "{datagrams} datagrams of 32 frames"
        );
        assert!(batch.iter().any(|f| !f.is_datagram()), "no DATA went");
        // A full replay buffer (no room for sequenced bytes): datagrams
        // still go, DATA waits.
        let mut batch = VecDeque::new();
        a.poll_transmit(&mut batch, 0, 32);
        assert!(!batch.is_empty() && batch.iter().all(|f| f.is_datagram()));
    }

    /// A flow opened and answered, as both sides see it: (ours, theirs).
    fn flow(a: &mut Mux, b: &mut Mux) -> (u32, u32) {
        let id = a.open("udp://dns:53", 0).unwrap();
        pump(a, b);
        let open = open_request(b);
        let theirs = b.accept_open(open, 0).unwrap();
        pump(b, a);
        while !matches!(a.poll_event(), Some(Event::OpenAnswered { .. })) {}
        (id, theirs)
    }

    /// Datagrams arrive whole and go ahead of DATA queued before them; a
    /// full queue, a detached session, an unopened flow drop them and say
    /// why; what a closing flow had queued is dropped, and one that crosses
    /// the CLOSE is no violation.
    #[test]
    fn datagrams_arrive_whole_ahead_of_data_and_are_dropped_when_they_cannot_go() {
        let (mut a, mut b) = (mux(), mux());
        let (flow_a, flow_b) = flow(&mut a, &mut b);
        let stream = a.open("tcp://bulk:1", 0).unwrap();
        pump(&mut a, &mut b);
        let Some(Event::OpenRequest { open, .. }) = b.poll_event() else {
            panic!("no open request");
        };
        b.accept_open(open, 0).unwrap();
        pump(&mut b, &mut a);
        while a.poll_event().is_some() {}
        a.send(stream, Bytes::from(vec![1u8; 4000]));
        a.send_datagram(flow_a, Bytes::from_static(b"query"))
            .unwrap();
        let seen = pump(&mut a, &mut b);
        assert!(
            matches!(&seen[0], Frame::Datagram { payload, .. } if &payload[..] == b"query"),
            "the datagram leads: {seen:?}"
        );
        assert_eq!(
            b.poll_event(),
            Some(Event::Datagram {
                id: flow_b,
                payload: Bytes::from_static(b"query")
            })
        );
        // Back the other way.
        b.send_datagram(flow_b, Bytes::from_static(b"answer"))
            .unwrap();
        pump(&mut b, &mut a);
        assert!(matches!(a.poll_event(), Some(Event::Datagram { id, .. }) if id == flow_a));

        // The queue's bound.
        let big = Bytes::from(vec![0u8; 60_000]);
        let mut queued = 0;
        while a.send_datagram(flow_a, big.clone()).is_ok() {
            queued += 1;
        }
        assert_eq!(queued, DATAGRAM_QUEUE / (60_000 + DATA_HEADER_LEN));
        assert_eq!(
            a.send_datagram(flow_a, big.clone()),
            Err(Dropped::QueueFull)
        );
        assert_eq!(
            a.send_datagram(flow_a, Bytes::from(vec![0u8; MAX_DATA_PAYLOAD + 1])),
            Err(Dropped::TooLarge)
        );
        assert_eq!(a.send_datagram(999, big.clone()), Err(Dropped::NotOpen));

        // Closing the flow drops what it had queued; the peer's datagram
        // crossing our CLOSE is dropped, not a violation.
        a.abort(flow_a);
        let seen = pump(&mut a, &mut b);
        assert!(seen.iter().all(|f| !matches!(f, Frame::Datagram { .. })));
        assert_eq!(a.send_datagram(flow_a, big.clone()), Err(Dropped::NotOpen));
        a.handle_frame(
            Frame::Datagram {
                recipient: flow_a,
                payload: Bytes::from_static(b"late"),
            },
            0,
        )
        .unwrap();
        assert!(a.dead().is_none());

        // Detached: dropped at once, and what was queued is dropped too.
        let (flow_a, _) = flow(&mut a, &mut b);
        a.send_datagram(flow_a, Bytes::from_static(b"x")).unwrap();
        a.set_attached(false, 0);
        assert_eq!(
            a.send_datagram(flow_a, Bytes::from_static(b"y")),
            Err(Dropped::Detached)
        );
        assert!(
            !a.has_output()
                || pump(&mut a, &mut b)
                    .iter()
                    .all(|f| !matches!(f, Frame::Datagram { .. }))
        );
        assert!(a.datagram_stats().dropped >= 5);
    }

    /// With a datagram path, datagrams wait for it and stay out of the
    /// byte stream's batches, except one too large for the path: that one
    /// goes in the stream after all and arrives whole. A message the path
    /// refuses counts as dropped, not sent.
    #[test]
    fn datagrams_go_apart_and_one_too_large_for_the_path_goes_in_the_stream() {
        let (mut a, mut b) = (mux(), mux());
        let (flow_a, flow_b) = flow(&mut a, &mut b);
        a.set_datagram_path(true);
        a.take_new_output();
        a.send_datagram(flow_a, Bytes::from_static(b"small"))
            .unwrap();
        assert!(!a.take_new_output(), "the path's own: no writer woken");
        assert!(!a.has_output());
        a.send_datagram(flow_a, Bytes::from(vec![9u8; 3000]))
            .unwrap();
        a.send_datagram(flow_a, Bytes::from_static(b"tiny"))
            .unwrap();
        assert!(pump(&mut a, &mut b).is_empty(), "apart: not in the stream");
        let small = a.pop_datagram_within(1200).unwrap().unwrap();
        assert_eq!(&small.body[..], b"small");
        let large = a.pop_datagram_within(1200).unwrap();
        assert_eq!(
            large.err(),
            Some(DATA_HEADER_LEN + 3000),
            "moved, its size said"
        );
        let tiny = a.pop_datagram_within(1200).unwrap().unwrap();
        assert_eq!(&tiny.body[..], b"tiny");
        assert!(a.pop_datagram_within(1200).is_none());
        assert!(a.take_new_output(), "the large one wakes the writer");
        let seen = pump(&mut a, &mut b);
        assert!(
            matches!(&seen[..], [Frame::Datagram { recipient, payload }]
                if *recipient == flow_b && payload.len() == 3000),
            "{seen:?}"
        );
        a.datagram_not_sent();
        let st = a.datagram_stats();
        assert_eq!((st.sent, st.path_sent, st.dropped), (2, 1, 1));
        // Without the path (a resume onto TCP), queued ones go in the stream.
        a.send_datagram(flow_a, Bytes::from_static(b"later"))
            .unwrap();
        a.set_datagram_path(false);
        assert_eq!(pump(&mut a, &mut b).len(), 1);
        // Large ones waiting for the stream have a bound of their own.
        a.set_datagram_path(true);
        let mut moved = 0;
        for _ in 0..INBAND_QUEUE / 4000 + 2 {
            a.send_datagram(flow_a, Bytes::from(vec![1u8; 4000]))
                .unwrap();
            moved += a.pop_datagram_within(1200).unwrap().unwrap_err();
            assert!(a.pop_datagram_within(1200).is_none());
        }
        assert!(moved <= INBAND_QUEUE);
        assert_eq!(a.datagram_stats().dropped, 1 + 2);
        a.send_datagram(flow_a, Bytes::from_static(b"small"))
            .unwrap();
        assert!(
            matches!(a.pop_datagram_within(1200), Some(Ok(_))),
            "small ones still go"
        );
    }
}
