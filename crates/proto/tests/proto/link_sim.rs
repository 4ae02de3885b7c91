//! Deterministic simulation of the link layer ([`LinkLayer`]) of two
//! sessions joined by one carrier or by K lanes, each with its own delay
//! and rate, that stall, lose what is on the wire (ACKs included) and die;
//! the client dials lanes again, and resumes when the last one is gone.
//! Lane joins race lane failures; resumes land in the middle of chunks;
//! the replay buffer sits at its bound. Writers run only when woken, the
//! way the runtime wakes them, so a chunk nobody is told about stays
//! unsent here as it would there.
//!
//! Each side sends a stream of DATA frames whose bytes follow a known
//! pattern, and PINGs; every byte must arrive once, in order, and the
//! whole transfer must finish without a stall longer than a bound. Each
//! seed replays exactly: `LINK_SIM_SEED=n` runs one, `LINK_SIM_SEEDS=n`
//! runs more.

use crate::common;

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use longhaul_proto::frame::{self, DecodeLimits, Frame, DATA_HEADER_LEN};
use longhaul_proto::link::{Budget, CarrierId, Input, LinkLayer, Lost};
use longhaul_proto::outframe::OutFrame;
use longhaul_proto::resume::{Secret, SessionId};
use longhaul_proto::stripe::chunk_target;

use common::{Dial, Dialer, Lane, Rng, Writer, CLIENT, MS, SERVER};

/// The byte at `offset` of each side's stream.
fn pattern(offset: u64) -> u8 {
    (offset.wrapping_mul(31) ^ (offset >> 9)) as u8
}

/// One side: its link layer, the stream it sends and the one it checks.
struct Side {
    link: LinkLayer,
    src: Source,
    got: u64,
    /// The peer's EOF arrived (every byte must have come before it).
    eof: bool,
    /// A wake stored for the next writer to wait (tokio's `notify_one`).
    permit: bool,
    /// Single carrier: frames from the replay to write first after a resume.
    resend: VecDeque<OutFrame>,
}

struct Sim {
    rng: Rng,
    now: u64,
    striped: bool,
    wanted: u8,
    sides: [Side; 2],
    lanes: Vec<Lane>,
    dialer: Dialer,
    fail_per_mille: u64,
    stall_per_mille: u64,
    limits: DecodeLimits,
    stats: Stats,
}

#[derive(Default, Debug)]
struct Stats {
    lanes_lost: u64,
    resumes: u64,
    joins_refused: u64,
    stale_refused: u64,
}

/// What the multiplexer would send: a stream of `total` bytes, and PINGs.
struct Source {
    total: u64,
    made: u64,
    next_ping: u64,
    /// The stream's EOF was taken (it goes in the control lane once the
    /// last DATA has left, as the multiplexer does).
    eof_sent: bool,
}

impl Source {
    /// Frames for the multiplexer's place: a PING when due and the EOF once
    /// every byte has left (control, first), then DATA of the pattern while
    /// under `budget` (the last frame may overshoot it, as the
    /// multiplexer's does). Returns whether more waits.
    fn pull(
        &mut self,
        now: u64,
        budget: Budget,
        out: &mut VecDeque<OutFrame>,
        rng: &mut Rng,
    ) -> bool {
        let mut taken = 0;
        if now >= self.next_ping && budget.control >= 16 && budget.frames > 0 {
            self.next_ping = now + 30 * MS;
            let ping = Frame::Ping { nonce: now };
            let b = ping.to_bytes().unwrap();
            taken += b.len();
            out.push_back(OutFrame::encoded(b));
        }
        if self.made == self.total && !self.eof_sent && taken < budget.control {
            self.eof_sent = true;
            let eof = Frame::Eof { recipient: 1 }.to_bytes().unwrap();
            taken += eof.len();
            out.push_back(OutFrame::encoded(eof));
        }
        while taken < budget.bytes && out.len() < budget.frames && self.made < self.total {
            let left = (self.total - self.made).min(16 << 10);
            let n = rng.range(1, left) as usize;
            let payload: Vec<u8> = (self.made..self.made + n as u64).map(pattern).collect();
            let mut h = [0u8; DATA_HEADER_LEN];
            frame::write_data_header(&mut h, 1, n);
            out.push_back(OutFrame::data(h, Bytes::from(payload)));
            self.made += n as u64;
            taken += n + DATA_HEADER_LEN;
        }
        self.made < self.total || !self.eof_sent
    }
}

impl Side {
    /// A frame from the peer, handed on in order.
    fn handle(&mut self, f: Frame, seed: u64) {
        match f {
            Frame::Data { payload, .. } => {
                assert!(!self.eof, "seed {seed}: DATA after EOF");
                for (i, b) in payload.iter().enumerate() {
                    let at = self.got + i as u64;
                    assert_eq!(
                        *b,
                        pattern(at),
                        "seed {seed}: byte {at} wrong (lost or twice)"
                    );
                }
                self.got += payload.len() as u64;
            }
            Frame::Ping { .. } => {}
            Frame::Eof { .. } => {
                assert!(!self.eof, "seed {seed}: EOF twice");
                self.eof = true;
            }
            other => panic!("seed {seed}: unexpected frame {other:?}"),
        }
    }
}

fn bytes_of(f: &OutFrame) -> Bytes {
    let mut v = f.head().to_vec();
    v.extend_from_slice(&f.body);
    Bytes::from(v)
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng::seeded(seed);
        let lanes_n = rng.range(1, 4) as u8;
        let striped = lanes_n >= 2;
        let limit = [256 << 10, 1 << 20, 8 << 20][rng.below(3) as usize];
        let total = rng.range(512 << 10, 4 << 20);
        let wanted = if striped { lanes_n } else { 0 };
        let id = SessionId([7; 16]);
        let side = |rng: &mut Rng| Side {
            link: LinkLayer::new(limit, limit, wanted, id, Secret([3; 32]), "owner".into()),
            src: Source {
                total: rng.range(total / 2, total),
                made: 0,
                next_ping: 0,
                eof_sent: false,
            },
            got: 0,
            eof: false,
            permit: false,
            resend: VecDeque::new(),
        };
        let sides = [side(&mut rng), side(&mut rng)];
        let mut sim = Sim {
            now: 0,
            striped,
            wanted: lanes_n,
            sides,
            lanes: Vec::new(),
            dialer: Dialer::default(),
            fail_per_mille: [0, 2, 5, 20][rng.below(4) as usize],
            stall_per_mille: if striped { rng.below(4) } else { 0 },
            limits: DecodeLimits::default(),
            stats: Stats::default(),
            rng,
        };
        // The first carrier: attached on both sides at once.
        let mut lane = Lane::new(0, &mut sim.rng);
        for s in [CLIENT, SERVER] {
            lane.ids[s] = Some(sim.sides[s].link.attach(0).expect("first carrier"));
        }
        sim.lanes.push(lane);
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

    fn lose(&mut self, side: usize, i: usize) {
        let Some(id) = self.lanes[i].ids[side].take() else {
            return;
        };
        match self.sides[side].link.carrier_lost(id, self.now) {
            Lost::Lane { .. } => self.notify_one(side),
            Lost::Detached | Lost::Stale => {}
        }
        // A reader that had not stopped yet hands in what it still holds:
        // refused, since the lane is no longer current.
        if !self.lanes[i].rx[side].is_empty() {
            let off = 0;
            let data = BytesMut::from(&b"x"[..]);
            if self.striped {
                assert_eq!(self.sides[side].link.on_chunk(id, off, data), Ok(false));
            } else {
                assert_eq!(
                    self.sides[side].link.on_input(id, 1, None),
                    Ok(Input::Stale)
                );
            }
            self.stats.stale_refused += 1;
        }
    }

    fn events(&mut self, seed: u64) {
        let now = self.now;
        // Failures, and when each side notices them.
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
            // One lane at a time stalls, for as long as a TCP connection
            // backing off its retransmissions would: the others must carry
            // the session meanwhile.
            if !l.dead && !stalled && self.rng.per_mille(self.stall_per_mille) {
                l.stalled_until = now + self.rng.range(1000, 15_000) * MS;
                stalled = true;
            }
            for side in [CLIENT, SERVER] {
                if self.lanes[i].notice[side].is_some_and(|t| t <= now) {
                    self.lanes[i].notice[side] = None;
                    self.lose(side, i);
                }
            }
        }
        self.lanes.retain(|l| l.ids != [None, None]);
        self.dial(seed);
    }

    /// The client dials (see `common::Dialer`).
    fn dial(&mut self, seed: u64) {
        let mut d = std::mem::take(&mut self.dialer);
        d.dial(self.now, seed, self.wanted, self);
        self.dialer = d;
    }

    fn write(&mut self, side: usize) {
        if self.now >= self.sides[side].src.next_ping {
            self.notify_one(side);
        }
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
                let more = if self.striped {
                    self.write_chunk(side, i, id)
                } else {
                    self.write_frames(side, i)
                };
                match more {
                    Some(true) => self.notify_one(side),
                    Some(false) => {}
                    None => {
                        if !std::mem::take(&mut self.sides[side].permit) {
                            self.lanes[i].writer[side] = Writer::Idle;
                        }
                    }
                }
            }
        }
    }

    /// A lane's writer takes one chunk. `None`: nothing to do.
    fn write_chunk(&mut self, side: usize, i: usize, id: CarrierId) -> Option<bool> {
        let now = self.now;
        let target = chunk_target(self.lanes[i].rate as u64 * 1000);
        let Sim { sides, rng, .. } = self;
        let Side { link, src, .. } = &mut sides[side];
        let c = link.next_chunk(id, target, now, |b, out| src.pull(now, b, out, rng));
        let c = c?;
        let lane = &mut self.lanes[i];
        for p in c.pieces {
            lane.write(side, p);
        }
        Some(c.more && c.len > 0)
    }

    /// The single carrier's writer: the replay after a resume, what the
    /// last writer left, then a batch from the multiplexer, each frame
    /// recorded as it goes out, an ACK in front.
    fn write_frames(&mut self, side: usize, i: usize) -> Option<bool> {
        let now = self.now;
        let Sim {
            sides, rng, lanes, ..
        } = self;
        let s = &mut sides[side];
        if let Some(f) = s.resend.pop_front() {
            lanes[i].write(side, bytes_of(&f));
            return Some(false);
        }
        let mut batch = s.link.take_leftover();
        let limit = s.link.room().min(64 << 10);
        let budget = Budget {
            control: 64 << 10,
            bytes: limit,
            frames: 32,
        };
        let more = s.src.pull(now, budget, &mut batch, rng);
        if let Some(ack) = s.link.ack_to_send(!batch.is_empty()) {
            lanes[i].write(side, ack.to_bytes().unwrap());
        } else if batch.is_empty() {
            return None;
        }
        for f in batch {
            s.link.record(&f);
            lanes[i].write(side, bytes_of(&f));
        }
        Some(more)
    }

    fn read(&mut self, side: usize, seed: u64) {
        for i in 0..self.lanes.len() {
            let Some(id) = self.lanes[i].ids[side] else {
                continue;
            };
            if self.striped {
                self.read_lane(side, i, id, seed);
            } else {
                self.read_carrier(side, i, id, seed);
            }
        }
    }

    fn read_carrier(&mut self, side: usize, i: usize, id: CarrierId, seed: u64) {
        let (mut got, mut ack) = (0, None);
        let s = &mut self.sides[side];
        assert!(s.link.is_current(id));
        loop {
            let buf = &mut self.lanes[i].rx[side];
            let before = buf.len();
            match frame::decode(buf, self.limits).expect("frames decode") {
                Some(Frame::Ack { received }) => ack = Some(received),
                Some(f) => {
                    got += before - buf.len();
                    s.handle(f, seed);
                }
                None => break,
            }
        }
        let r = s.link.on_input(id, got, ack);
        match r.unwrap_or_else(|e| panic!("seed {seed}: {e}")) {
            Input::Applied { wake: true } => self.notify_one(side),
            Input::Applied { wake: false } => {}
            Input::Stale => panic!("seed {seed}: current carrier refused"),
        }
    }

    fn read_lane(&mut self, side: usize, i: usize, id: CarrierId, seed: u64) {
        let mut wake = false;
        loop {
            let lane = &mut self.lanes[i];
            if let Some((offset, len)) = lane.pending[side] {
                if lane.rx[side].len() < len {
                    break;
                }
                lane.pending[side] = None;
                let data = lane.rx[side].split_to(len);
                let s = &mut self.sides[side];
                let ok = s.link.on_chunk(id, offset, data);
                assert_eq!(ok, Ok(true), "seed {seed}: chunk refused");
                while let Some(mut run) = s.link.next_run() {
                    while let Some(f) = frame::decode(&mut run, self.limits).expect("frames decode")
                    {
                        s.handle(f, seed);
                    }
                    assert!(run.is_empty(), "seed {seed}: a run ends inside a frame");
                }
                wake |= s.link.ack_wanted();
                continue;
            }
            match frame::decode(&mut lane.rx[side], self.limits).expect("frames decode") {
                Some(Frame::Ack { received }) => {
                    let freed = self.sides[side]
                        .link
                        .on_ack(received)
                        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                    wake |= freed;
                }
                Some(Frame::Chunk { offset, len }) => {
                    lane.pending[side] = Some((offset, len as usize))
                }
                Some(f) => panic!("seed {seed}: {f:?} outside a chunk"),
                None => break,
            }
        }
        if wake {
            self.notify_all(side);
        }
    }

    fn tick(&mut self) {
        // Patience for a chunk: the slowest lane's round trip, and more.
        let timeout = Duration::from_millis(250 + 2 * 40);
        for side in [CLIENT, SERVER] {
            let t = self.sides[side].link.on_tick(self.now, |_| timeout);
            if t.wake_all {
                self.notify_all(side);
            }
        }
    }

    fn done(&self) -> bool {
        let [c, s] = &self.sides;
        c.eof && s.eof && c.got == s.src.total && s.got == c.src.total
    }

    fn progress(&self) -> u64 {
        self.sides[CLIENT].got + self.sides[SERVER].got
    }
}

/// Runs one seed to the end; panics with the seed on any failure.
fn run(seed: u64) -> Stats {
    let mut sim = Sim::new(seed);
    let mut last = (0, 0);
    // No progress for this long is a stall: lanes that stall for longer
    // must not hold the session (a resume fits well inside).
    let patience = 5_000 * MS;
    let debug = std::env::var("LINK_SIM_DEBUG").is_ok();
    while !sim.done() {
        sim.now += MS;
        sim.events(seed);
        for side in [CLIENT, SERVER] {
            sim.write(side);
        }
        for l in &mut sim.lanes {
            l.advance(sim.now);
        }
        for side in [CLIENT, SERVER] {
            sim.read(side, seed);
        }
        if sim.now.is_multiple_of(50 * MS) {
            sim.tick();
        }
        for s in &sim.sides {
            let r = s.link.replay();
            assert!(
                r.held() <= r.limit() + (1 << 20),
                "seed {seed}: replay holds {} past its bound {}",
                r.held(),
                r.limit()
            );
        }
        if debug && sim.now.is_multiple_of(500 * MS) {
            for (i, s) in sim.sides.iter().enumerate() {
                let r = s.link.replay();
                eprintln!(
                    "{} ms side {i}: held {} room {} sent {} acked {} received {} made {} got {}",
                    sim.now / MS,
                    r.held(),
                    r.room(),
                    r.sent(),
                    r.acked(),
                    s.link.received(),
                    s.src.made,
                    s.got
                );
            }
        }
        let p = sim.progress();
        if p != last.0 {
            last = (p, sim.now);
        }
        assert!(
            sim.now - last.1 < patience,
            "seed {seed}: stalled at {} ms ({} and {} of {} and {} bytes; {:?}; lanes {:?})",
            sim.now / MS,
            sim.sides[SERVER].got,
            sim.sides[CLIENT].got,
            sim.sides[CLIENT].src.total,
            sim.sides[SERVER].src.total,
            sim.stats,
            sim.lanes
                .iter()
                .map(|l| (l.number, l.ids, l.dead, l.writer))
                .collect::<Vec<_>>(),
        );
    }
    sim.stats.resumes = sim.dialer.resumes;
    sim.stats.joins_refused = sim.dialer.joins_refused;
    sim.stats
}

#[test]
fn every_byte_once_in_order_over_lanes_that_fail() {
    let seeds = common::seeds("LINK_SIM_SEED", "LINK_SIM_SEEDS", 1000);
    let (n, one) = (seeds.end - seeds.start, seeds.end - seeds.start == 1);
    let mut total = Stats::default();
    for seed in seeds {
        let s = run(seed);
        total.lanes_lost += s.lanes_lost;
        total.resumes += s.resumes;
        total.joins_refused += s.joins_refused;
        total.stale_refused += s.stale_refused;
    }
    eprintln!("{n} seeds: {total:?}");
    // The seeds reach what they are for.
    assert!(one || (total.resumes > 0 && total.lanes_lost > 0 && total.stale_refused > 0));
}

impl Dial for Sim {
    fn link(&mut self, side: usize) -> &mut LinkLayer {
        &mut self.sides[side].link
    }

    fn resume(&mut self, side: usize, peer_received: u64, now: u64) -> CarrierId {
        let s = &mut self.sides[side];
        let (id, frames) = s
            .link
            .resume(0, peer_received, now)
            .unwrap_or_else(|e| panic!("resume of side {side}: {e}"));
        s.resend = frames.into();
        id
    }

    fn lost(&mut self, side: usize, id: CarrierId, now: u64) {
        self.sides[side].link.carrier_lost(id, now);
    }

    fn world(&mut self) -> (&mut Vec<Lane>, &mut Rng) {
        (&mut self.lanes, &mut self.rng)
    }
}
