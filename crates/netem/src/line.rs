//! The delay line's arithmetic, with no I/O: when each packet leaves, or
//! whether it is dropped. One instance per direction.
//!
//! A packet arriving at `now` first waits for the link: with a rate cap it
//! is serialised after the packets ahead of it (`busy_until`), and dropped
//! if the bytes waiting for the link would exceed the queue limit (a
//! tail-drop queue, like a router's). Then it spends the one-way delay on
//! the wire. Random loss is applied on arrival.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LineConfig {
    /// One-way delay.
    pub delay: Duration,
    /// Link rate in bits per second (None: unlimited).
    pub rate_bps: Option<u64>,
    /// Loss probability, 0.0–1.0.
    pub loss: f64,
    /// Bytes that may wait for the link (only with a rate cap) and bytes in
    /// flight on the wire (always): a bound on the emulator's memory.
    pub queue_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Release at this time (nanoseconds on the caller's clock).
    Release(u64),
    /// Tail drop: the queue is full.
    QueueDrop,
    /// Random loss.
    Lost,
}

#[derive(Debug, Clone)]
pub struct Line {
    cfg: LineConfig,
    busy_until: u64,
}

impl Line {
    pub fn new(cfg: LineConfig) -> Line {
        Line { cfg, busy_until: 0 }
    }

    /// Decides the fate of a `len`-byte packet arriving at `now_ns`;
    /// `roll` is a uniform random number in [0, 1).
    pub fn arrive(&mut self, now_ns: u64, len: usize, roll: f64) -> Verdict {
        if roll < self.cfg.loss {
            return Verdict::Lost;
        }
        let depart = match self.cfg.rate_bps {
            Some(rate) if rate > 0 => {
                let start = self.busy_until.max(now_ns);
                let backlog_ns = start - now_ns;
                let backlog_bytes = (backlog_ns as u128 * rate as u128 / 8 / 1_000_000_000) as u64;
                if backlog_bytes + len as u64 > self.cfg.queue_bytes {
                    return Verdict::QueueDrop;
                }
                let tx_ns = (len as u128 * 8 * 1_000_000_000 / rate as u128) as u64;
                self.busy_until = start + tx_ns;
                self.busy_until
            }
            _ => now_ns,
        };
        Verdict::Release(depart + self.cfg.delay.as_nanos() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn cfg(delay_ms: u64, rate: Option<u64>, queue: u64) -> LineConfig {
        LineConfig {
            delay: Duration::from_millis(delay_ms),
            rate_bps: rate,
            loss: 0.0,
            queue_bytes: queue,
        }
    }

    #[test]
    fn pure_delay() {
        let mut l = Line::new(cfg(50, None, 1 << 20));
        assert_eq!(l.arrive(10 * MS, 1500, 0.5), Verdict::Release(60 * MS));
        assert_eq!(l.arrive(10 * MS, 1500, 0.5), Verdict::Release(60 * MS));
    }

    #[test]
    fn rate_serialises_and_tail_drops() {
        // 8 Mbit/s: 1000 bytes take 1 ms on the wire.
        let mut l = Line::new(cfg(0, Some(8_000_000), 2500));
        assert_eq!(l.arrive(0, 1000, 0.5), Verdict::Release(MS));
        assert_eq!(l.arrive(0, 1000, 0.5), Verdict::Release(2 * MS));
        // 2000 bytes waiting + 1000 > 2500: dropped.
        assert_eq!(l.arrive(0, 1000, 0.5), Verdict::QueueDrop);
        // Later the backlog has drained.
        assert_eq!(l.arrive(2 * MS, 1000, 0.5), Verdict::Release(3 * MS));
    }

    #[test]
    fn loss_uses_the_roll() {
        let mut l = Line::new(LineConfig {
            loss: 0.01,
            ..cfg(0, None, 1 << 20)
        });
        assert_eq!(l.arrive(0, 100, 0.005), Verdict::Lost);
        assert!(matches!(l.arrive(0, 100, 0.5), Verdict::Release(_)));
    }
}
