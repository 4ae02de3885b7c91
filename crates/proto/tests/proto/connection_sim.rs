//! Deterministic simulation: two multiplexer cores joined by an in-memory
//! pipe with random partial writes, random chunking on the way, random
//! delays and a simulated clock. One side opens many streams; both sides
//! send random amounts of random bytes on every stream, half-close, and
//! consume at random pace. Every byte is checked at the far end, every
//! stream must end on both sides, and the budgets must be back to zero.
//! Each seed replays exactly.
//!
//! Each side is a whole `Connection` (the multiplexer over the link layer),
//! driven as the session runtime drives a single carrier: frames from
//! `poll_transmit`, written in random partial writes and reported with
//! `on_written`, bytes read handed to `on_bytes` by carrier id. With the
//! link layer on, the pipe also drops at random points: both directions
//! lose what is on the wire and each reader's unfinished frame, both sides
//! lose the carrier (`carrier_lost`), keep what their writer had not
//! started, and resume on a new one from the other's received offset
//! (`resume`), writing the replay first. Every byte must still arrive
//! exactly once.

use crate::common;

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use longhaul_proto::connection::{Connection, Loss, Received};
use longhaul_proto::frame::DecodeLimits;
use longhaul_proto::link::{CarrierId, LinkLayer, Lost, MIN_REPLAY_LIMIT};
use longhaul_proto::mux::{Event, Mux, MuxConfig};
use longhaul_proto::outframe::{advance_batch, OutFrame};
use longhaul_proto::resume::{Secret, SessionId};
use longhaul_proto::window::WindowConfig;

use common::Rng;

fn config(jmux: bool) -> MuxConfig {
    MuxConfig {
        // Small windows and queues, so flow control and growth are exercised.
        window: WindowConfig {
            initial: 16 * 1024,
            max: 256 * 1024,
        },
        budget: 1 << 20,
        max_streams: 1024,
        send_queue: 64 * 1024,
        send_total: 1 << 20,
        control_limit: 4 << 20,
        keepalive: Duration::from_millis(50),
        dead_after: Duration::from_secs(3600),
        open_timeout: Duration::from_secs(3600),
        idle_timeout: None,
        rtt_floor: Duration::from_millis(1),
        jmux,
        extensions: !jmux,
        our_max_packet: 16 * 1024,
        send_max_payload: 16 * 1024,
        resumable: false,
    }
}

#[derive(Default)]
struct AppStream {
    index: usize,
    to_send: Vec<u8>,
    sent: usize,
    eof_sent: bool,
    /// Received, not yet "written" by the app.
    pending: VecDeque<Bytes>,
    received: Vec<u8>,
    eof: bool,
    eof_delivered: bool,
    finished: bool,
}

struct Side {
    name: &'static str,
    conn: Connection,
    /// The carrier now attached (0 without a link layer).
    carrier: CarrierId,
    /// After a resume: the replay, written before anything else (already
    /// recorded).
    resend: VecDeque<OutFrame>,
    /// Frames taken from the connection, partly written.
    outgoing: VecDeque<OutFrame>,
    /// Bytes received, not yet decoded.
    inbox: BytesMut,
    streams: HashMap<u32, AppStream>,
}

/// Bytes on the wire, each chunk with the time it arrives.
type Wire = VecDeque<(u64, Vec<u8>)>;

struct Sim {
    rng: Rng,
    now: u64,
    a: Side,
    b: Side,
    a_to_b: Wire,
    b_to_a: Wire,
    /// Payloads per stream index: (a → b, b → a).
    payloads: Vec<(Vec<u8>, Vec<u8>)>,
    /// Carrier drops still to make (link layer on).
    drops_left: u32,
    drops: u32,
}

impl Side {
    fn new(name: &'static str, jmux: bool, link: bool) -> Side {
        let mut cfg = config(jmux);
        cfg.resumable = link;
        // The smallest replay bound, so that waiting for ACKs is exercised.
        let mut link = link.then(|| {
            let owner = String::new();
            LinkLayer::new(
                MIN_REPLAY_LIMIT,
                MIN_REPLAY_LIMIT,
                1,
                SessionId([1; 16]),
                Secret([2; 32]),
                owner,
            )
        });
        let carrier = link
            .as_mut()
            .map_or(0, |l| l.attach(0).expect("the first carrier"));
        Side {
            name,
            conn: Connection::new(Mux::new(cfg), link, DecodeLimits::default()),
            carrier,
            resend: VecDeque::new(),
            outgoing: VecDeque::new(),
            inbox: BytesMut::new(),
            streams: HashMap::new(),
        }
    }
}

/// Writes a random part of what the side has to send onto the wire: the
/// replay first, then what the connection gives its carrier.
fn transmit(rng: &mut Rng, now: u64, side: &mut Side, wire: &mut Wire) {
    if side.outgoing.is_empty() || rng.percent(50) {
        let max_bytes = 1 + rng.below(200_000) as usize;
        let max_frames = 1 + rng.below(32) as usize;
        side.conn
            .poll_transmit(side.carrier, &mut side.outgoing, max_bytes, max_frames);
    }
    // A partial write: up to `budget` bytes of the queued frames.
    let budget = rng.below(100_000) as usize;
    let mut chunk = Vec::new();
    let replay = take_bytes(&side.resend, budget, &mut chunk);
    advance_batch(&mut side.resend, replay, |_| {});
    if side.resend.is_empty() {
        let n = take_bytes(&side.outgoing, budget - replay, &mut chunk);
        side.conn.on_written(&mut side.outgoing, n);
    }
    if !chunk.is_empty() {
        let delay = rng.below(2_000_000); // up to 2 ms
                                          // The pipe keeps order: never earlier than what is already on it.
        let at = wire.back().map_or(0, |(t, _)| *t).max(now + delay);
        wire.push_back((at, chunk));
    }
}

/// Copies up to `budget` bytes from the front of `frames` (what is left of
/// each) into `out`; returns how many.
fn take_bytes(frames: &VecDeque<OutFrame>, budget: usize, out: &mut Vec<u8>) -> usize {
    let mut left = budget;
    for f in frames {
        for part in [f.head(), &f.body[..]] {
            let n = part.len().min(left);
            out.extend_from_slice(&part[..n]);
            left -= n;
        }
        if left == 0 {
            break;
        }
    }
    budget - left
}

/// Delivers what has arrived, in random pieces, and feeds it to the
/// connection by carrier id.
fn receive(rng: &mut Rng, now: u64, side: &mut Side, wire: &mut Wire) {
    while let Some((at, _)) = wire.front() {
        if *at > now {
            break;
        }
        let (at, mut chunk) = wire.pop_front().unwrap();
        // A partial read: take part of the chunk now, leave the rest.
        let k = 1 + rng.below(chunk.len() as u64) as usize;
        if k < chunk.len() {
            let rest = chunk.split_off(k);
            wire.push_front((at, rest));
        }
        side.inbox.extend_from_slice(&chunk);
        match side.conn.on_bytes(side.carrier, &mut side.inbox, true, now) {
            Received::Taken { .. } => {}
            r => panic!(
                "{}: input not taken ({r:?}): {:?}",
                side.name,
                side.conn.mux().dead()
            ),
        }
        if rng.percent(30) {
            break;
        }
    }
}

impl Sim {
    fn new(seed: u64, streams: usize, jmux: bool) -> Sim {
        Sim::with_link(seed, streams, jmux, 0)
    }

    /// `drops`: carrier drops to make (0: no link layer).
    fn with_link(seed: u64, streams: usize, jmux: bool, drops: u32) -> Sim {
        let mut rng = Rng::seeded(seed);
        let payloads = (0..streams)
            .map(|_| {
                let up = rng.below(200_000) as usize;
                let down = rng.below(200_000) as usize;
                (rng.bytes(up), rng.bytes(down))
            })
            .collect();
        Sim {
            rng,
            now: 0,
            a: Side::new("a", jmux, drops > 0),
            b: Side::new("b", jmux, drops > 0),
            a_to_b: VecDeque::new(),
            b_to_a: VecDeque::new(),
            payloads,
            drops_left: drops,
            drops: 0,
        }
    }

    /// The carrier drops: what is on the wire and each reader's unfinished
    /// frame are lost, and both sides lose the carrier; each writer keeps
    /// what it had taken and not started (a started frame is in the replay
    /// buffer). Then the resume exchange on a new carrier: each side
    /// replays from the other's received offset.
    fn drop_and_resume(&mut self) {
        self.drops += 1;
        self.a_to_b.clear();
        self.b_to_a.clear();
        let now = self.now;
        for side in [&mut self.a, &mut self.b] {
            side.inbox.clear();
            side.resend.clear();
            let left = std::mem::take(&mut side.outgoing);
            let l = side.conn.link_mut().unwrap();
            l.save_leftover(left);
            let loss = side.conn.carrier_lost(side.carrier, now, "dropped");
            assert_eq!(loss, Loss::Link(Lost::Detached), "{}", side.name);
        }
        let a_got = self.a.conn.link().unwrap().received();
        let b_got = self.b.conn.link().unwrap().received();
        for (side, peer_got) in [(&mut self.a, b_got), (&mut self.b, a_got)] {
            let (id, resend) = side.conn.resume(0, peer_got, now).expect("offsets fit");
            side.carrier = id;
            side.resend = resend.into();
            side.outgoing = side.conn.link_mut().unwrap().take_leftover();
        }
    }

    fn events(&mut self, which: char) {
        let (side, payloads) = match which {
            'a' => (&mut self.a, &self.payloads),
            _ => (&mut self.b, &self.payloads),
        };
        while let Some(ev) = side.conn.mux_mut().poll_event() {
            match ev {
                Event::Data { id, payload } => {
                    let s = side
                        .streams
                        .get_mut(&id)
                        .expect("data for a stream we know");
                    assert!(!s.eof, "{}: data after EOF", side.name);
                    s.pending.push_back(payload);
                }
                Event::Eof { id } => {
                    side.streams.get_mut(&id).expect("known stream").eof = true;
                }
                Event::Finished {
                    id, discard, reset, ..
                } => {
                    assert!(!discard, "{}: stream {id} failed", side.name);
                    assert!(!reset, "{}: stream {id} was reset", side.name);
                    if let Some(s) = side.streams.get_mut(&id) {
                        s.finished = true;
                    }
                }
                Event::Writable { .. } => {}
                Event::OpenRequest { open, dest } => {
                    let index: usize = dest.trim_start_matches("tcp://s").parse().unwrap();
                    let id = side
                        .conn
                        .mux_mut()
                        .accept_open(open, self.now)
                        .expect("accepted");
                    side.streams.insert(
                        id,
                        AppStream {
                            index,
                            to_send: payloads[index].1.clone(),
                            ..AppStream::default()
                        },
                    );
                }
                Event::OpenAnswered { id, result } => {
                    assert!(
                        result.is_ok(),
                        "{}: open {id} refused: {result:?}",
                        side.name
                    );
                }
                e => panic!("unexpected event {e:?}"),
            }
        }
    }

    /// The apps on one side: send some, consume some.
    fn apps(&mut self, which: char) {
        let rng = &mut self.rng;
        let now = self.now;
        let side = if which == 'a' {
            &mut self.a
        } else {
            &mut self.b
        };
        let ids: Vec<u32> = side.streams.keys().copied().collect();
        for id in ids {
            let s = side.streams.get_mut(&id).unwrap();
            if s.sent < s.to_send.len() && rng.percent(60) {
                if let Some(room) = side.conn.mux_mut().send_room(id) {
                    let n = room
                        .min(s.to_send.len() - s.sent)
                        .min(1 + rng.below(70_000) as usize);
                    if n > 0 {
                        let chunk = Bytes::copy_from_slice(&s.to_send[s.sent..s.sent + n]);
                        s.sent += n;
                        side.conn.mux_mut().send(id, chunk);
                    }
                }
            } else if s.sent == s.to_send.len()
                && !s.eof_sent
                && side.conn.mux_mut().send_room(id).is_some()
            {
                s.eof_sent = true;
                side.conn.mux_mut().send_eof(id);
            }
            // Consume at a random pace.
            while rng.percent(70) {
                let Some(b) = s.pending.pop_front() else {
                    break;
                };
                s.received.extend_from_slice(&b);
                side.conn.mux_mut().delivered(id, b.len(), now);
            }
            if s.eof && s.pending.is_empty() && !s.eof_delivered {
                s.eof_delivered = true;
                side.conn.mux_mut().eof_delivered(id);
            }
        }
    }

    fn done(&self) -> bool {
        let side_done = |s: &Side| {
            s.streams.len() == self.payloads.len()
                && s.streams.values().all(|a| a.finished && a.eof_delivered)
                && s.conn.mux().stream_ids().is_empty()
                && !s.conn.mux().has_output()
                && s.outgoing.is_empty()
        };
        let resent = |s: &Side| s.resend.is_empty();
        side_done(&self.a)
            && side_done(&self.b)
            && resent(&self.a)
            && resent(&self.b)
            && self.a_to_b.is_empty()
            && self.b_to_a.is_empty()
    }

    /// Runs to the end; returns the bytes carried.
    fn run(&mut self) -> usize {
        for i in 0..self.payloads.len() {
            let id = self
                .a
                .conn
                .mux_mut()
                .open(&format!("tcp://s{i}"), 0)
                .unwrap();
            self.a.streams.insert(
                id,
                AppStream {
                    index: i,
                    to_send: self.payloads[i].0.clone(),
                    ..AppStream::default()
                },
            );
        }
        let mut steps = 0u64;
        while !self.done() {
            steps += 1;
            assert!(steps < 2_000_000, "no progress: a deadlock");
            self.now += self.rng.below(200_000); // up to 0.2 ms a step
            for which in ['a', 'b'] {
                let now = self.now;
                let side = if which == 'a' {
                    &mut self.a
                } else {
                    &mut self.b
                };
                if side.conn.poll_timeout().is_some_and(|t| t <= now) {
                    side.conn.handle_timeout(now);
                }
                self.events(which);
                self.apps(which);
                self.events(which);
            }
            if self.drops_left > 0 && self.rng.percent(1) {
                self.drops_left -= 1;
                self.drop_and_resume();
            }
            transmit(&mut self.rng, self.now, &mut self.a, &mut self.a_to_b);
            transmit(&mut self.rng, self.now, &mut self.b, &mut self.b_to_a);
            receive(&mut self.rng, self.now, &mut self.b, &mut self.a_to_b);
            receive(&mut self.rng, self.now, &mut self.a, &mut self.b_to_a);
        }
        for (side, dir) in [(&self.a, 1), (&self.b, 0)] {
            for s in side.streams.values() {
                let want = if dir == 1 {
                    &self.payloads[s.index].1
                } else {
                    &self.payloads[s.index].0
                };
                assert_eq!(
                    s.received.len(),
                    want.len(),
                    "{}: stream {} length",
                    side.name,
                    s.index
                );
                assert!(
                    s.received == *want,
                    "{}: stream {} corrupted",
                    side.name,
                    s.index
                );
            }
            assert_eq!(
                side.conn.mux().stats().budget_used,
                0,
                "{}: budget leaked",
                side.name
            );
            assert!(side.conn.mux().dead().is_none());
        }
        self.payloads.iter().map(|(u, d)| u.len() + d.len()).sum()
    }
}

#[test]
fn two_cores_carry_every_byte_of_many_streams_over_a_messy_pipe() {
    let mut bytes = 0;
    for seed in 0..160 {
        // Native mode and plain JMUX (no PINGs; header counted in packets).
        let mut sim = Sim::new(seed, 1 + (seed as usize % 6) * 4, seed % 2 == 1);
        bytes += sim.run();
    }
    eprintln!("160 seeds, {} MiB checked", bytes >> 20);
}

#[test]
fn the_link_layer_carries_every_byte_exactly_once_across_random_carrier_drops() {
    let (mut bytes, mut drops) = (0, 0);
    for seed in 0..200 {
        let mut sim = Sim::with_link(
            1000 + seed,
            1 + (seed as usize % 5) * 3,
            false,
            1 + seed as u32 % 6,
        );
        bytes += sim.run();
        drops += sim.drops;
    }
    assert!(drops > 300, "only {drops} drops were made");
    eprintln!(
        "200 seeds, {drops} carrier drops, {} MiB checked",
        bytes >> 20
    );
}
