//! What the simulations share: a seeded random source and a simulated
//! lane (a TCP connection with its own delay and rate, that stalls and
//! dies). Each test crate uses part of it.
#![allow(dead_code)]

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use longhaul_proto::link::CarrierId;

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
