//! Deterministic simulation of two whole `Connection`s (multiplexer over
//! the link layer) joined by K lanes, each with its own delay and rate,
//! that stall for as long as a TCP connection backing off would, lose
//! what is on the wire (ACKs included) and die. The client dials lanes
//! again as the runtime does, and resumes once it has none; lane joins
//! race lane failures, resumes land in the middle of chunks, the replay
//! buffer sits at its bound.
//!
//! Each side is driven as the session runtime drives it: a lane's writer
//! asks `poll_chunk` while its socket has room and waits to be woken when
//! there is nothing (woken one at a time when the multiplexer has new
//! output or a chunk leaves more behind, all of them when an ACK freed
//! room, a lane was lost or the stall check asks); a lane's reader hands
//! in ACKs and chunks by lane id; the multiplexer's and the stall check's
//! timers run on the simulated clock.
//!
//! The client opens streams both bulk and interactive (a few bytes now
//! and then, the traffic a stalled lane must not hold up); both sides send
//! on every stream, half-close and consume at their own pace. Every byte
//! must arrive once and in order, every stream must end on both sides,
//! nothing may stall for longer than a bound, and an interactive message
//! must not wait out a stalled lane. Each seed replays exactly:
//! `STRIPED_SIM_SEED=n` runs one, `STRIPED_SIM_SEEDS=n` runs more.

use crate::common;

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use longhaul_proto::connection::{Connection, LaneOutput, Loss, Received};
use longhaul_proto::frame::{self, DecodeLimits, Frame};
use longhaul_proto::link::{CarrierId, LinkLayer, Lost};
use longhaul_proto::mux::{Event, Mux, MuxConfig};
use longhaul_proto::resume::{Secret, SessionId};
use longhaul_proto::stripe::chunk_target;
use longhaul_proto::window::WindowConfig;

use common::{Dial, Dialer, Lane, Rng, Writer, CLIENT, MS, SERVER};
/// No byte of any stream for this long is a stall (a resume fits well
/// inside; lanes stall for up to 15 s and must not hold the session).
const PATIENCE: u64 = 5_000 * MS;
/// An interactive message may take this long, lane stalls and resumes
/// included (a stall is detected after ≈ 330 ms here).
const INTERACTIVE_BOUND: u64 = 3_000 * MS;

/// The byte at `offset` of stream `index` in direction `dir`.
fn pattern(dir: usize, index: usize, offset: u64) -> u8 {
    (offset.wrapping_mul(31) ^ (offset >> 9)) as u8 ^ (index as u8).wrapping_mul(97) ^ dir as u8
}

fn config() -> MuxConfig {
    MuxConfig {
        window: WindowConfig {
            initial: 64 * 1024,
            max: 1 << 20,
        },
        budget: 8 << 20,
        max_streams: 64,
        send_queue: 256 * 1024,
        send_total: 4 << 20,
        control_limit: 4 << 20,
        keepalive: Duration::from_secs(30),
        dead_after: Duration::from_secs(3600),
        open_timeout: Duration::from_secs(3600),
        idle_timeout: None,
        rtt_floor: Duration::from_millis(1),
        jmux: false,
        extensions: true,
        our_max_packet: 16 * 1024,
        send_max_payload: 16 * 1024,
        resumable: true,
    }
}

/// What one stream carries each way.
#[derive(Clone, Copy)]
struct Plan {
    /// Bytes client → server and server → client.
    sizes: [u64; 2],
    /// A few bytes every 20–200 ms instead of as fast as it can.
    interactive: bool,
}

/// One side's application on one stream.
struct AppStream {
    index: usize,
    /// Direction it sends in (its side).
    dir: usize,
    to_send: u64,
    sent: u64,
    next_send: u64,
    eof_sent: bool,
    /// Received, not yet consumed.
    pending: VecDeque<Bytes>,
    received: u64,
    eof: bool,
    eof_delivered: bool,
    finished: bool,
}

impl AppStream {
    fn new(index: usize, dir: usize, to_send: u64) -> AppStream {
        AppStream {
            index,
            dir,
            to_send,
            sent: 0,
            next_send: 0,
            eof_sent: false,
            pending: VecDeque::new(),
            received: 0,
            eof: false,
            eof_delivered: false,
            finished: false,
        }
    }
}

struct Side {
    conn: Connection,
    streams: HashMap<u32, AppStream>,
    /// A wake stored for the next writer to wait (tokio's `notify_one`).
    permit: bool,
}

#[derive(Default, Debug)]
struct Stats {
    lanes_lost: u64,
    stalls: u64,
    resumes: u64,
    joins_refused: u64,
    stale_refused: u64,
    /// The longest an interactive message took, in ms.
    worst_interactive_ms: u64,
}

struct Sim {
    seed: u64,
    rng: Rng,
    now: u64,
    wanted: u8,
    sides: [Side; 2],
    lanes: Vec<Lane>,
    plans: Vec<Plan>,
    /// Interactive messages on the way: (dir, stream index) → (end
    /// offset, sent at).
    in_flight: HashMap<(usize, usize), VecDeque<(u64, u64)>>,
    dialer: Dialer,
    fail_per_mille: u64,
    stall_per_mille: u64,
    limits: DecodeLimits,
    stats: Stats,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng::seeded(seed);
        let wanted = rng.range(2, 4) as u8;
        let limit = [256 << 10, 1 << 20, 8 << 20][rng.below(3) as usize];
        // Some sessions carry bulk one way only: the receiver then sends
        // nothing but ACKs, and a lost one is noticed by nothing else.
        let one_way = rng.percent(30);
        let plans = (0..rng.range(1, 6))
            .map(|i| {
                let interactive = i % 2 == 1 && !one_way;
                let most = if interactive { 4 << 10 } else { 1 << 20 };
                let back = if one_way { 0 } else { rng.below(most) };
                Plan {
                    sizes: [rng.below(most), back],
                    interactive,
                }
            })
            .collect();
        let id = SessionId([7; 16]);
        let side = || {
            let link = LinkLayer::new(limit, limit, wanted, id, Secret([3; 32]), "owner".into());
            Side {
                conn: Connection::new(Mux::new(config()), Some(link), DecodeLimits::default()),
                streams: HashMap::new(),
                permit: false,
            }
        };
        let mut sim = Sim {
            seed,
            now: 0,
            wanted,
            sides: [side(), side()],
            lanes: Vec::new(),
            plans,
            in_flight: HashMap::new(),
            dialer: Dialer::default(),
            fail_per_mille: [0, 2, 5, 20][rng.below(4) as usize],
            stall_per_mille: rng.range(1, 4),
            limits: DecodeLimits::default(),
            stats: Stats::default(),
            rng,
        };
        // The first lane: attached on both sides at once.
        let mut lane = Lane::new(0, &mut sim.rng);
        for s in [CLIENT, SERVER] {
            let link = sim.sides[s].conn.link_mut().unwrap();
            lane.ids[s] = Some(link.attach(0).expect("the first lane"));
        }
        sim.lanes.push(lane);
        for (i, plan) in sim.plans.iter().enumerate() {
            let c = &mut sim.sides[CLIENT];
            let id = c.conn.mux_mut().open(&format!("tcp://s{i}"), 0).unwrap();
            c.streams
                .insert(id, AppStream::new(i, CLIENT, plan.sizes[CLIENT]));
        }
        sim.after_input(CLIENT);
        sim
    }

    fn notify_one(&mut self, side: usize) {
        match self
            .lanes
            .iter_mut()
            .find(|l| l.ids[side].is_some() && l.writer[side] == Writer::Idle)
        {
            Some(l) => l.writer[side] = Writer::Ready,
            None => self.sides[side].permit = true,
        }
    }

    fn notify_all(&mut self, side: usize) {
        for l in &mut self.lanes {
            if l.ids[side].is_some() {
                l.writer[side] = Writer::Ready;
            }
        }
    }

    /// What the runtime does after any call into a connection: hand its
    /// events to the streams, wake a writer for new output.
    fn after_input(&mut self, side: usize) {
        let seed = self.seed;
        let s = &mut self.sides[side];
        while let Some(ev) = s.conn.mux_mut().poll_event() {
            match ev {
                Event::Data { id, payload } => {
                    let a = s.streams.get_mut(&id).expect("data for a known stream");
                    assert!(!a.eof, "seed {seed}: data after EOF");
                    a.pending.push_back(payload);
                }
                Event::Eof { id } => s.streams.get_mut(&id).expect("known stream").eof = true,
                Event::Finished {
                    id, discard, reset, ..
                } => {
                    assert!(!discard && !reset, "seed {seed}: stream {id} failed");
                    s.streams.get_mut(&id).expect("known stream").finished = true;
                }
                Event::OpenRequest { open, dest } => {
                    let index: usize = dest.trim_start_matches("tcp://s").parse().unwrap();
                    let id = s.conn.mux_mut().accept_open(open, self.now).unwrap();
                    let size = self.plans[index].sizes[side];
                    s.streams.insert(id, AppStream::new(index, side, size));
                }
                Event::OpenAnswered { result, .. } => {
                    assert!(result.is_ok(), "seed {seed}: open refused: {result:?}")
                }
                Event::Writable { .. } => {}
                e => panic!("seed {seed}: unexpected event {e:?}"),
            }
        }
        assert!(
            s.conn.mux().dead().is_none(),
            "seed {seed}: session closed: {:?}",
            s.conn.mux().dead()
        );
        if s.conn.mux_mut().take_new_output() {
            self.notify_one(side);
        }
    }

    /// Each application sends some and consumes some.
    fn apps(&mut self, side: usize) {
        let (now, seed) = (self.now, self.seed);
        let s = &mut self.sides[side];
        let mux = s.conn.mux_mut();
        let mut ids: Vec<u32> = s.streams.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let a = s.streams.get_mut(&id).unwrap();
            let interactive = self.plans[a.index].interactive;
            if a.sent < a.to_send && now >= a.next_send {
                if let Some(room) = mux.send_room(id) {
                    let most = if interactive { 200 } else { 64 << 10 };
                    let n = (room as u64)
                        .min(a.to_send - a.sent)
                        .min(self.rng.range(1, most));
                    if n > 0 {
                        let bytes: Vec<u8> = (a.sent..a.sent + n)
                            .map(|o| pattern(a.dir, a.index, o))
                            .collect();
                        a.sent += n;
                        mux.send(id, Bytes::from(bytes));
                        if interactive {
                            a.next_send = now + self.rng.range(20, 200) * MS;
                            let q = self.in_flight.entry((a.dir, a.index)).or_default();
                            q.push_back((a.sent, now));
                        }
                    }
                }
            } else if a.sent == a.to_send && !a.eof_sent && mux.send_room(id).is_some() {
                a.eof_sent = true;
                mux.send_eof(id);
            }
            // Bulk consumers keep up or lag; interactive ones read at once.
            while interactive || self.rng.percent(70) {
                let Some(b) = a.pending.pop_front() else {
                    break;
                };
                let from = 1 - a.dir;
                for (i, byte) in b.iter().enumerate() {
                    let at = a.received + i as u64;
                    assert_eq!(
                        *byte,
                        pattern(from, a.index, at),
                        "seed {seed}: stream {} byte {at} wrong (lost or twice)",
                        a.index
                    );
                }
                a.received += b.len() as u64;
                mux.delivered(id, b.len(), now);
                if let Some(q) = self.in_flight.get_mut(&(from, a.index)) {
                    while q.front().is_some_and(|m| m.0 <= a.received) {
                        let (_, at) = q.pop_front().unwrap();
                        let ms = (now - at) / MS;
                        self.stats.worst_interactive_ms = self.stats.worst_interactive_ms.max(ms);
                    }
                }
            }
            if a.eof && a.pending.is_empty() && !a.eof_delivered {
                a.eof_delivered = true;
                mux.eof_delivered(id);
            }
        }
        self.after_input(side);
    }

    /// Side `side` learns lane `i` is gone.
    fn lose(&mut self, side: usize, i: usize) {
        let Some(id) = self.lanes[i].ids[side].take() else {
            return;
        };
        let now = self.now;
        let conn = &mut self.sides[side].conn;
        match conn.carrier_lost(id, now, "lane lost") {
            Loss::Link(Lost::Lane { .. }) => self.notify_all(side),
            Loss::Link(Lost::Detached | Lost::Stale) => {}
            Loss::Closed => panic!("seed {}: the session closed", self.seed),
        }
        // A reader that had not stopped yet hands in what it still holds:
        // refused, since the lane is no longer current.
        if !self.lanes[i].rx[side].is_empty() {
            let conn = &mut self.sides[side].conn;
            let data = BytesMut::from(&b"x"[..]);
            assert_eq!(conn.on_chunk(id, 0, data, now), Received::Stale);
            assert_eq!(conn.on_ack(id, 0, now), Received::Stale);
            self.stats.stale_refused += 1;
        }
    }

    /// Lanes fail and stall; each side notices a failure in its own time.
    fn failures(&mut self) {
        let now = self.now;
        let mut stalled = self.lanes.iter().any(|l| l.stalled_until > now);
        for i in 0..self.lanes.len() {
            let l = &mut self.lanes[i];
            if !l.dead && self.rng.per_mille(self.fail_per_mille) {
                l.kill();
                l.notice = [
                    Some(now + self.rng.range(0, 20) * MS),
                    Some(now + self.rng.range(0, 300) * MS),
                ];
                self.stats.lanes_lost += 1;
            }
            // One lane at a time stalls: the others carry the session.
            if !l.dead && !stalled && self.rng.per_mille(self.stall_per_mille) {
                l.stalled_until = now + self.rng.range(1000, 15_000) * MS;
                stalled = true;
                self.stats.stalls += 1;
            }
            for side in [CLIENT, SERVER] {
                if self.lanes[i].notice[side].is_some_and(|t| t <= now) {
                    self.lanes[i].notice[side] = None;
                    self.lose(side, i);
                }
            }
        }
        self.lanes.retain(|l| l.ids != [None, None]);
    }

    /// The client dials (see `common::Dialer`); a resumed side's writers
    /// all look, and its multiplexer's events are handled.
    fn dial(&mut self) {
        let mut d = std::mem::take(&mut self.dialer);
        let attached = d.dial(self.now, self.seed, self.wanted, self);
        self.dialer = d;
        if let Some(side) = attached {
            self.notify_all(side);
            self.after_input(side);
        }
    }

    /// Every lane's writer of `side` that is awake takes chunks while its
    /// socket has room.
    fn write(&mut self, side: usize) {
        let (now, seed) = (self.now, self.seed);
        for i in 0..self.lanes.len() {
            let Some(id) = self.lanes[i].ids[side] else {
                continue;
            };
            if self.lanes[i].writer[side] == Writer::Idle
                && std::mem::take(&mut self.sides[side].permit)
            {
                self.lanes[i].writer[side] = Writer::Ready;
            }
            while self.lanes[i].writer[side] == Writer::Ready && self.lanes[i].has_room(side) {
                let target = chunk_target(self.lanes[i].rate as u64 * 1000);
                match self.sides[side].conn.poll_chunk(id, target, now) {
                    LaneOutput::Chunk(c) => {
                        for p in c.pieces {
                            self.lanes[i].write(side, p);
                        }
                        if c.more && c.len > 0 {
                            self.notify_one(side);
                        }
                    }
                    LaneOutput::Idle => {
                        if !std::mem::take(&mut self.sides[side].permit) {
                            self.lanes[i].writer[side] = Writer::Idle;
                        }
                    }
                    other => panic!("seed {seed}: a current lane's writer got {other:?}"),
                }
            }
        }
    }

    /// Every lane's reader of `side` hands in what has arrived.
    fn read(&mut self, side: usize) {
        let (now, seed) = (self.now, self.seed);
        for i in 0..self.lanes.len() {
            let Some(id) = self.lanes[i].ids[side] else {
                continue;
            };
            let mut wake = false;
            loop {
                let lane = &mut self.lanes[i];
                let conn = &mut self.sides[side].conn;
                let r = if let Some((offset, len)) = lane.pending[side] {
                    if lane.rx[side].len() < len {
                        break;
                    }
                    lane.pending[side] = None;
                    let data = lane.rx[side].split_to(len);
                    conn.on_chunk(id, offset, data, now)
                } else {
                    match frame::decode(&mut lane.rx[side], self.limits).expect("frames decode") {
                        Some(Frame::Ack { received }) => conn.on_ack(id, received, now),
                        Some(Frame::Chunk { offset, len }) => {
                            lane.pending[side] = Some((offset, len as usize));
                            continue;
                        }
                        Some(f) => panic!("seed {seed}: {f:?} outside a chunk"),
                        None => break,
                    }
                };
                match r {
                    Received::Taken { wake: w } => wake |= w,
                    other => panic!(
                        "seed {seed}: a current lane's input gave {other:?} ({:?})",
                        conn.mux().dead()
                    ),
                }
                self.after_input(side);
            }
            if wake {
                self.notify_all(side);
            }
        }
    }

    /// The housekeeping tick: the stall check, and the multiplexer's timers.
    fn timers(&mut self, side: usize) {
        let now = self.now;
        if now.is_multiple_of(50 * MS) {
            // Patience for a chunk: the slowest lane's round trip, and more.
            let timeout = Duration::from_millis(250 + 2 * 40);
            let link = self.sides[side].conn.link_mut().unwrap();
            if link.on_tick(now, |_| timeout).wake_all {
                self.notify_all(side);
            }
        }
        let conn = &mut self.sides[side].conn;
        if conn.poll_timeout().is_some_and(|t| t <= now) {
            conn.handle_timeout(now);
            self.after_input(side);
        }
    }

    fn done(&self) -> bool {
        self.sides.iter().all(|s| {
            s.streams.len() == self.plans.len()
                && s.streams.values().all(|a| {
                    a.finished
                        && a.eof_delivered
                        && a.received == self.plans[a.index].sizes[1 - a.dir]
                })
                && s.conn.mux().stream_ids().is_empty()
        })
    }

    fn progress(&self) -> u64 {
        let s = self.sides.iter().flat_map(|s| s.streams.values());
        s.map(|a| a.received + a.finished as u64).sum()
    }
}

/// Runs one seed to the end; panics with the seed on any failure.
fn run(seed: u64) -> Stats {
    let mut sim = Sim::new(seed);
    let mut last = (0, 0);
    while !sim.done() {
        sim.now += MS;
        sim.failures();
        sim.dial();
        for side in [CLIENT, SERVER] {
            sim.timers(side);
            sim.apps(side);
            sim.write(side);
        }
        for l in &mut sim.lanes {
            l.advance(sim.now);
        }
        for side in [CLIENT, SERVER] {
            sim.read(side);
        }
        for s in &sim.sides {
            // The multiplexer's timers run exactly while a lane is attached.
            let link = s.conn.link().unwrap();
            assert_eq!(
                s.conn.mux().is_attached(),
                !link.is_detached(),
                "seed {seed}: a lane attached without a resume, or detached with timers on"
            );
            let r = link.replay();
            assert!(
                r.held() <= r.limit() + (1 << 20),
                "seed {seed}: replay holds {} past its bound {}",
                r.held(),
                r.limit()
            );
        }
        let p = sim.progress();
        if p != last.0 {
            last = (p, sim.now);
        }
        assert!(
            sim.now - last.1 < PATIENCE,
            "seed {seed}: stalled at {} ms ({:?}; lanes {:?})",
            sim.now / MS,
            sim.stats,
            sim.lanes
                .iter()
                .map(|l| (l.number, l.ids, l.dead, l.writer))
                .collect::<Vec<_>>(),
        );
    }
    for s in &sim.sides {
        assert_eq!(
            s.conn.mux().stats().budget_used,
            0,
            "seed {seed}: budget leaked"
        );
    }
    sim.stats.resumes = sim.dialer.resumes;
    sim.stats.joins_refused = sim.dialer.joins_refused;
    assert!(
        sim.stats.worst_interactive_ms * MS < INTERACTIVE_BOUND,
        "seed {seed}: an interactive message took {} ms ({:?})",
        sim.stats.worst_interactive_ms,
        sim.stats
    );
    sim.stats
}

#[test]
fn two_connections_carry_every_stream_over_lanes_that_stall_and_fail() {
    let seeds = common::seeds("STRIPED_SIM_SEED", "STRIPED_SIM_SEEDS", 1000);
    let (n, one) = (seeds.end - seeds.start, seeds.end - seeds.start == 1);
    let mut total = Stats::default();
    for seed in seeds {
        let s = run(seed);
        total.lanes_lost += s.lanes_lost;
        total.stalls += s.stalls;
        total.resumes += s.resumes;
        total.joins_refused += s.joins_refused;
        total.stale_refused += s.stale_refused;
        total.worst_interactive_ms = total.worst_interactive_ms.max(s.worst_interactive_ms);
    }
    eprintln!("{n} seeds: {total:?}");
    // The seeds reach what they are for.
    assert!(one || (total.resumes > 0 && total.lanes_lost > 0 && total.stalls > 0));
    assert!(one || (total.stale_refused > 0 && total.joins_refused > 0));
}

impl Dial for Sim {
    fn link(&mut self, side: usize) -> &mut LinkLayer {
        self.sides[side].conn.link_mut().unwrap()
    }

    fn resume(&mut self, side: usize, peer_received: u64, now: u64) -> CarrierId {
        let seed = self.seed;
        let conn = &mut self.sides[side].conn;
        let (id, _) = conn
            .resume(0, peer_received, now)
            .unwrap_or_else(|e| panic!("seed {seed}: resume of side {side}: {e}"));
        id
    }

    fn lost(&mut self, side: usize, id: CarrierId, now: u64) {
        let _ = self.sides[side].conn.carrier_lost(id, now, "lane lost");
    }

    fn world(&mut self) -> (&mut Vec<Lane>, &mut Rng) {
        (&mut self.lanes, &mut self.rng)
    }
}
