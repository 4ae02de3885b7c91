//! Self-tuning receive windows.
//!
//! A stream's receive window is how many bytes the peer may send before it
//! must wait for credit. Too small and it caps the stream at window / RTT
//! (seed 001's 64 KiB story); too large and a slow consumer ties up memory.
//! So a window starts small and doubles while it is what limits the stream:
//! if a quarter of it was delivered to the destination within one RTT, the
//! sender was running at more than window / (4·RTT) and is likely blocked on
//! credit. Growth stops at a per-stream cap and when the session-wide budget
//! (shared by all streams) is spent.
//!
//! Credit is returned only for bytes *delivered* (written to the destination
//! socket), never for bytes merely queued, so a consumer that stops reading
//! stalls only its own stream.

/// Window sizes, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowConfig {
    /// Window granted when a stream opens (default 256 KiB).
    pub initial: u32,
    /// Largest a window may grow to (default 64 MiB).
    pub max: u32,
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig {
            initial: 256 * 1024,
            max: 64 * 1024 * 1024,
        }
    }
}

/// The peer sent more than the window allows: a protocol violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("peer sent {got} bytes with only {allowed} bytes of window left")]
pub struct WindowOverrun {
    pub got: usize,
    pub allowed: u64,
}

/// Receive side of one stream's flow control.
#[derive(Debug, Clone)]
pub struct RecvWindow {
    size: u32,
    max: u32,
    /// Delivered but not yet credited back.
    unreturned: u64,
    /// What the peer may still send.
    allowance: u64,
    /// When credit was last returned (caller's clock, nanoseconds).
    epoch_ns: u64,
}

impl RecvWindow {
    pub fn new(initial: u32, max: u32, now_ns: u64) -> RecvWindow {
        RecvWindow {
            size: initial,
            max: max.max(initial),
            unreturned: 0,
            allowance: initial as u64,
            epoch_ns: now_ns,
        }
    }

    /// Current window size.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Bytes the peer may still send right now.
    pub fn allowance(&self) -> u64 {
        self.allowance
    }

    /// Bytes received and not yet delivered (the window, less what the
    /// peer may still send and what was delivered but not yet credited).
    pub fn held(&self) -> u64 {
        (self.size as u64).saturating_sub(self.allowance + self.unreturned)
    }

    /// Accounts `n` bytes of DATA received from the peer.
    pub fn on_data(&mut self, n: usize) -> Result<(), WindowOverrun> {
        if n as u64 > self.allowance {
            return Err(WindowOverrun {
                got: n,
                allowed: self.allowance,
            });
        }
        self.allowance -= n as u64;
        Ok(())
    }

    /// Accounts `n` bytes delivered to the destination. Returns the credit to
    /// send back in a WINDOW_ADJUST, if it is time to send one.
    ///
    /// `grow(extra)` asks the session budget for `extra` more bytes and says
    /// whether it granted them.
    pub fn on_delivered(
        &mut self,
        n: usize,
        now_ns: u64,
        rtt_ns: u64,
        grow: impl FnOnce(u32) -> bool,
    ) -> Option<u32> {
        self.unreturned += n as u64;
        if self.unreturned < (self.size / 4).max(1) as u64 {
            return None;
        }
        let elapsed = now_ns.saturating_sub(self.epoch_ns);
        let mut extra = 0u32;
        if elapsed < rtt_ns && self.size < self.max {
            let want = self.size.min(self.max - self.size);
            if grow(want) {
                extra = want;
                self.size += want;
            }
        }
        // unreturned ≤ size ≤ max < 2^32, so this fits.
        let credit = (self.unreturned + extra as u64).min(u32::MAX as u64) as u32;
        self.unreturned = 0;
        self.allowance += credit as u64;
        self.epoch_ns = now_ns;
        Some(credit)
    }
}

/// Send side of one stream's flow control: credit granted by the peer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendCredit {
    credit: u64,
}

impl SendCredit {
    pub fn new(initial: u32) -> SendCredit {
        SendCredit {
            credit: initial as u64,
        }
    }

    pub fn available(&self) -> u64 {
        self.credit
    }

    /// Adds a WINDOW_ADJUST. JMUX forbids windows above 2^32 − 1; a peer that
    /// exceeds it is clamped rather than trusted.
    pub fn add(&mut self, increment: u32) {
        self.credit = (self.credit + increment as u64).min(u32::MAX as u64);
    }

    /// Takes up to `want` bytes of credit.
    pub fn take(&mut self, want: usize) -> usize {
        let n = (want as u64).min(self.credit) as usize;
        self.credit -= n as u64;
        n
    }
}

/// A session-wide memory budget for receive windows. Plain counter: the
/// runtime keeps it under its own lock.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    limit: u64,
    used: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget { limit, used: 0 }
    }

    pub fn try_reserve(&mut self, n: u64) -> bool {
        if self.used + n <= self.limit {
            self.used += n;
            true
        } else {
            false
        }
    }

    /// Reserves up to `want`, but at least `floor` even past the limit, so a
    /// new stream can always make progress. Returns what was reserved.
    pub fn reserve_with_floor(&mut self, want: u64, floor: u64) -> u64 {
        let n = want.min(self.limit.saturating_sub(self.used)).max(floor);
        self.used += n;
        n
    }

    pub fn release(&mut self, n: u64) {
        self.used = self.used.saturating_sub(n);
    }

    pub fn used(&self) -> u64 {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn overrun_is_detected() {
        let mut w = RecvWindow::new(1000, 1000, 0);
        assert!(w.on_data(600).is_ok());
        assert_eq!(
            w.on_data(401),
            Err(WindowOverrun {
                got: 401,
                allowed: 400
            })
        );
        assert!(w.on_data(400).is_ok());
    }

    #[test]
    fn credit_only_after_delivery_threshold() {
        let mut w = RecvWindow::new(1000, 1000, 0);
        w.on_data(1000).unwrap();
        assert_eq!(w.on_delivered(100, 10 * MS, MS, |_| true), None);
        assert_eq!(w.on_delivered(150, 20 * MS, MS, |_| true), Some(250));
        assert_eq!(w.allowance(), 250);
    }

    #[test]
    fn grows_when_window_is_the_bottleneck() {
        let mut w = RecvWindow::new(1 << 18, 1 << 26, 0);
        let mut now = 0;
        // Deliver a quarter-window every 0.1 ms with an RTT of 10 ms: window-limited.
        for _ in 0..100 {
            let n = (w.size() / 4) as usize;
            w.on_data(n).unwrap();
            now += MS / 10;
            w.on_delivered(n, now, 10 * MS, |_| true);
        }
        assert_eq!(w.size(), 1 << 26, "reached the cap");
    }

    #[test]
    fn does_not_grow_when_consumer_is_slow_or_budget_spent() {
        let mut w = RecvWindow::new(1 << 18, 1 << 26, 0);
        let mut now = 0;
        for _ in 0..50 {
            let n = (w.size() / 4) as usize;
            w.on_data(n).unwrap();
            now += 50 * MS; // far slower than one quarter per RTT
            w.on_delivered(n, now, 10 * MS, |_| true);
        }
        assert_eq!(w.size(), 1 << 18);
        let mut budget = Budget::new(1 << 19);
        assert!(budget.try_reserve(1 << 18));
        let mut w = RecvWindow::new(1 << 18, 1 << 26, 0);
        for i in 1..50u64 {
            let n = (w.size() / 4) as usize;
            w.on_data(n).unwrap();
            w.on_delivered(n, i * 1000, 10 * MS, |extra| {
                budget.try_reserve(extra as u64)
            });
        }
        assert_eq!(w.size(), 1 << 19, "one doubling, then the budget is spent");
        assert_eq!(budget.used(), 1 << 19);
    }

    #[test]
    fn send_credit_is_clamped() {
        let mut c = SendCredit::new(u32::MAX);
        c.add(u32::MAX);
        assert_eq!(c.available(), u32::MAX as u64);
        assert_eq!(c.take(10), 10);
        let mut z = SendCredit::new(5);
        assert_eq!(z.take(10), 5);
        assert_eq!(z.take(10), 0);
    }

    #[test]
    fn budget_floor() {
        let mut b = Budget::new(100);
        assert_eq!(b.reserve_with_floor(80, 10), 80);
        assert_eq!(b.reserve_with_floor(80, 10), 20);
        assert_eq!(b.reserve_with_floor(80, 10), 10);
        b.release(110);
        assert_eq!(b.used(), 0);
    }
}
