//! What the simulations share: a seeded random source and a simulated
//! lane (a TCP connection with its own delay and rate, that stalls and
//! dies). Each test crate uses part of it.
#![allow(dead_code)]

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use longhaul_proto::link::{CarrierId, LinkLayer};
use longhaul_proto::resume::Attach;

/// One tick of the simulated clock.
pub const MS: u64 = 1_000_000;
pub const CLIENT: usize = 0;
pub const SERVER: usize = 1;

/// The seeds a simulation runs: the one named by the environment variable
/// `one` (to replay a failure), else `0..n` with `n` from `many` or
/// `default`.
pub fn seeds(one: &str, many: &str, default: u64) -> std::ops::Range<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    match var(one) {
        Some(seed) => seed..seed + 1,
        None => 0..var(many).unwrap_or(default),
    }
}

/// xorshift64*: small, fast, and the same on every machine.
pub struct Rng(pub u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    pub fn per_mille(&mut self, n: u64) -> bool {
        self.below(1000) < n
    }
    pub fn percent(&mut self, n: u64) -> bool {
        self.below(100) < n
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// One direction of a lane: the sender's socket buffer, then the wire.
#[derive(Default)]
pub struct Pipe {
    backlog: VecDeque<Bytes>,
    backlog_len: usize,
    wire: VecDeque<(u64, Bytes)>,
}

/// A lane's writer, as woken by the runtime.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Writer {
    /// Waits to be woken.
    Idle,
    /// Has work or was woken: asks for chunks while its socket has room.
    Ready,
}

pub struct Lane {
    pub number: u8,
    /// Each side's id for it; `None` once that side dropped it.
    pub ids: [Option<CarrierId>; 2],
    /// `dir[s]`: written by side `s`.
    dir: [Pipe; 2],
    /// Side `s`'s read buffer, and a chunk header waiting for its bytes.
    pub rx: [BytesMut; 2],
    pub pending: [Option<(u64, usize)>; 2],
    pub writer: [Writer; 2],
    pub delay: u64,
    /// Bytes per tick.
    pub rate: usize,
    /// No byte moves on the wire before this tick (a stalled path).
    pub stalled_until: u64,
    pub dead: bool,
    /// When each side learns that the lane died.
    pub notice: [Option<u64>; 2],
}

impl Lane {
    /// Delay 1–40 ticks, rate 1–32 KiB a tick.
    pub fn new(number: u8, rng: &mut Rng) -> Lane {
        Lane {
            number,
            ids: [None, None],
            dir: [Pipe::default(), Pipe::default()],
            rx: [BytesMut::new(), BytesMut::new()],
            pending: [None, None],
            writer: [Writer::Ready, Writer::Ready],
            delay: rng.range(1, 40),
            rate: rng.range(1, 32) as usize * 1024,
            stalled_until: 0,
            dead: false,
            notice: [None, None],
        }
    }

    pub fn write(&mut self, side: usize, b: Bytes) {
        if self.dead || b.is_empty() {
            return;
        }
        let p = &mut self.dir[side];
        p.backlog_len += b.len();
        p.backlog.push_back(b);
    }

    /// The sender's socket takes more (a few ticks' worth are queued at most).
    pub fn has_room(&self, side: usize) -> bool {
        self.dir[side].backlog_len < 4 * self.rate
    }

    /// Moves one tick's worth of bytes onto the wire, and what has crossed
    /// it into the reader's buffer.
    pub fn advance(&mut self, now: u64) {
        if self.dead {
            return;
        }
        for side in [CLIENT, SERVER] {
            let p = &mut self.dir[side];
            let mut budget = if now < self.stalled_until {
                0
            } else {
                self.rate
            };
            while budget > 0 {
                let Some(front) = p.backlog.front_mut() else {
                    break;
                };
                let n = budget.min(front.len());
                let piece = front.split_to(n);
                if front.is_empty() {
                    p.backlog.pop_front();
                }
                p.backlog_len -= n;
                budget -= n;
                p.wire.push_back((now + self.delay, piece));
            }
            while p.wire.front().is_some_and(|(t, _)| *t <= now) {
                let (_, b) = p.wire.pop_front().unwrap();
                self.rx[1 - side].extend_from_slice(&b);
            }
        }
    }

    /// The connection breaks: what is on the wire and in the sockets is lost.
    pub fn kill(&mut self) {
        self.dead = true;
        self.dir = [Pipe::default(), Pipe::default()];
    }
}

const NO_BINDING: [u8; 32] = [0; 32];

/// What a simulation lets the [`Dialer`] reach of its two sides.
pub trait Dial {
    fn link(&mut self, side: usize) -> &mut LinkLayer;
    /// `side` attaches a carrier after the resume exchange (the peer has
    /// `peer_received` of its bytes); its id.
    fn resume(&mut self, side: usize, peer_received: u64, now: u64) -> CarrierId;
    /// `side` learns that carrier `id` is gone.
    fn lost(&mut self, side: usize, id: CarrierId, now: u64);
    fn world(&mut self) -> (&mut Vec<Lane>, &mut Rng);
}

/// The client's dialling, as the runtime does it: a lane more while the
/// session has fewer than it wants, a resume once it has none; the server
/// answers half a round trip later, and attaches a lane a tick after its
/// check (a failure may come in between).
#[derive(Default)]
pub struct Dialer {
    /// The client's next dial (a lane or a resume) may start at this tick.
    pub next_dial: u64,
    /// A lane join in flight: (number, request, server checks at).
    join: Option<(u8, Attach, u64)>,
    /// A resume in flight: (request, server answers at), then the
    /// server's offset for the client, when it arrives, and the lane.
    resume: Option<(Attach, u64)>,
    resumed: Option<(u64, u64, CarrierId)>,
    /// The server's check passed for this lane number: attach it then.
    joining: Option<(u8, u64)>,
    pub resumes: u64,
    pub joins_refused: u64,
}

impl Dialer {
    /// One tick of dialling. `wanted`: lanes of a striped session (0 for a
    /// single carrier). Returns the side that attached a resumed carrier.
    pub fn dial(&mut self, now: u64, seed: u64, wanted: u8, s: &mut impl Dial) -> Option<usize> {
        let rtt = 2 * s.world().1.range(1, 30) * MS;
        if let Some((ask, at)) = self.resume.take() {
            if now < at {
                self.resume = Some((ask, at));
                return None;
            }
            let Attach::Resume {
                attempt,
                received,
                proof,
                ..
            } = ask
            else {
                unreachable!()
            };
            s.link(SERVER)
                .check_resume("owner", attempt, received, &proof, &NO_BINDING)
                .unwrap_or_else(|e| panic!("seed {seed}: resume refused: {e:?}"));
            // The server drops whatever lanes it still had.
            for l in s.world().0.iter_mut() {
                if l.ids[SERVER].take().is_some() {
                    l.kill();
                }
            }
            let id = s.resume(SERVER, received, now);
            let ours = s.link(SERVER).received();
            let (lanes, rng) = s.world();
            let mut lane = Lane::new(0, rng);
            lane.ids[SERVER] = Some(id);
            lanes.push(lane);
            self.resumed = Some((ours, now + rtt / 2, id));
            return Some(SERVER);
        }
        if let Some((ours, at, server_id)) = self.resumed {
            if now < at {
                return None;
            }
            self.resumed = None;
            let id = s.resume(CLIENT, ours, now);
            let lane = s
                .world()
                .0
                .iter_mut()
                .find(|l| l.ids[SERVER] == Some(server_id) && !l.dead);
            match lane {
                Some(lane) => lane.ids[CLIENT] = Some(id),
                // The new carrier died before the answer arrived.
                None => s.lost(CLIENT, id, now),
            }
            self.resumes += 1;
            self.next_dial = now + 10 * MS;
            return Some(CLIENT);
        }
        if let Some((number, ask, at)) = self.join.take() {
            if now < at {
                self.join = Some((number, ask, at));
                return None;
            }
            let Attach::Lane {
                attempt,
                lane,
                proof,
                ..
            } = ask
            else {
                unreachable!()
            };
            match s
                .link(SERVER)
                .check_lane("owner", attempt, lane, &proof, &NO_BINDING)
            {
                Ok(()) => self.joining = Some((number, now + MS)),
                Err(_) => self.joins_refused += 1,
            }
            self.next_dial = now + 20 * MS;
            return None;
        }
        if let Some((number, at)) = self.joining {
            if now < at {
                return None;
            }
            self.joining = None;
            let mut lane = Lane::new(number, s.world().1);
            match s.link(SERVER).attach(number) {
                Ok(id) => lane.ids[SERVER] = Some(id),
                Err(_) => {
                    self.joins_refused += 1;
                    return None;
                }
            }
            // The client learns of it at once, unless it lost its last lane
            // meanwhile (then it resumes, and the server drops this one).
            match s.link(CLIENT).attach(number) {
                Ok(id) => lane.ids[CLIENT] = Some(id),
                Err(_) => {
                    self.joins_refused += 1;
                    lane.kill();
                    lane.notice[SERVER] = Some(now + 50 * MS);
                }
            }
            s.world().0.push(lane);
            return None;
        }
        if now < self.next_dial {
            return None;
        }
        let client = s.link(CLIENT);
        if client.is_detached() {
            let ask = client.resume_request(&NO_BINDING, now / MS);
            self.resume = Some((ask, now + rtt / 2));
        } else if wanted >= 2 && client.carriers().len() < wanted as usize {
            let used: Vec<u8> = client.carriers().iter().map(|c| c.1).collect();
            let number = (0..wanted).find(|n| !used.contains(n)).unwrap();
            let ask = client.lane_request(number, &NO_BINDING, now / MS);
            self.join = Some((number, ask, now + rtt / 2));
        }
        None
    }
}
