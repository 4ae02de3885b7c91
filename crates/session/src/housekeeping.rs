//! The session's timer, off the data path: runs the core's deadlines
//! (keepalive PINGs, dead-peer and idle detection, expiry of unanswered
//! OPENs and BINDs, the server's wait for a resume) and samples the path under the carrier; in a striped
//! session also the lanes' stall check and the ACK owed to the peer.

use std::sync::Arc;
use std::time::Duration;

use crate::runtime::Shared;

/// How often the path is sampled (RTT for window growth, the kernel's send
/// queue resized to the delivery rate).
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// Waits this long or longer (keepalive, dead-peer and idle deadlines) end
/// on a process-wide grid of [`GRID`], so that a server's thousands of idle
/// sessions wake together a few times a second rather than each on its own
/// (a wake-up of a sleeping thread costs more than the work it does).
const COALESCE_FROM: Duration = Duration::from_secs(1);
const GRID: Duration = Duration::from_millis(250);
/// Waits this long or longer (a quiet session's keepalive and dead-peer
/// deadlines, tens of seconds) end on a coarser grid: more sessions share
/// each wake-up, and a second is nothing against such a deadline.
const COARSE_FROM: Duration = Duration::from_secs(10);
const COARSE_GRID: Duration = Duration::from_secs(1);
/// How often a striped session looks for a stalled lane and owes an ACK.
const STRIPE_TICK: Duration = Duration::from_millis(50);
/// How often the lanes' counters are logged (`-v`).
const LANE_LOG_EVERY: Duration = Duration::from_secs(10);

pub(crate) async fn housekeeping(shared: Arc<Shared>) {
    let _closes = CloseIfStopped(shared.clone());
    let mut next_probe = 0u64;
    let mut next_tick = 0u64;
    let mut next_log = LANE_LOG_EVERY.as_nanos() as u64;
    // The slowest lane's RTT, for the stall timeout.
    let mut slowest = Duration::ZERO;
    // Bytes moved both ways at the last sample (None: never sampled).
    let mut moved_at_sample: Option<u64> = None;
    loop {
        let now = shared.now_ns();
        let moved = shared.with(|m, _| {
            let s = m.stats();
            s.bytes_sent + s.bytes_received
        });
        // (A striped session's lanes are sampled on every probe: its timer
        // ticks for them anyway.)
        if now >= next_probe && moved_at_sample == Some(moved) && !shared.striped {
            // Idle since the last sample: nothing to learn until data moves
            // again (`Shared::moves_again` wakes this). An idle session's
            // path needs no samples, and thousands of idle sessions must
            // not cost a core.
            next_probe = u64::MAX;
            shared
                .quiet
                .store(true, std::sync::atomic::Ordering::Relaxed);
            // Data counted since the look above found `quiet` unset and
            // woke no one: quiet no longer.
            let now_moved = shared.with(|m, _| {
                let s = m.stats();
                s.bytes_sent + s.bytes_received
            });
            if now_moved != moved {
                shared
                    .quiet
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                next_probe = 0;
            }
        } else if now >= next_probe {
            next_probe = now + PROBE_EVERY.as_nanos() as u64;
            moved_at_sample = Some(moved);
            // The probes of the carrier (or lanes) attached now, if any.
            let probes = match shared.striped {
                true => shared.lane_probes(),
                false => shared.slot().probe.clone().into_iter().collect(),
            };
            // One TCP_INFO read per carrier serves the RTT, the tuning and
            // the delivery rate.
            let sampled: Vec<_> = probes.iter().map(|p| (p, p.path())).collect();
            let rtts: Vec<Duration> = sampled
                .iter()
                .filter_map(|(p, path)| path.as_ref().map_or_else(|| p.rtt(), |x| x.rtt))
                .collect();
            if let Some(r) = rtts.iter().max() {
                shared.with(|m, _| m.set_path_rtt(*r));
                slowest = *r;
            }
            for (p, path) in &sampled {
                match path {
                    Some(x) => p.retune_with(x),
                    None => p.retune(),
                }
            }
            // The delivery rate means something only while the sender has
            // a backlog (otherwise it is the application's rate).
            // A carrier without a probe (a folder, stdio) resets it.
            let paths: Vec<_> = sampled.into_iter().filter_map(|(_, p)| p).collect();
            if paths.is_empty() {
                shared.with(|m, _| m.set_path_rate(0));
            } else if paths.iter().any(|p| p.notsent > 0) {
                let rate = paths.iter().map(|p| p.delivery_rate).sum();
                shared.with(|m, _| m.set_path_rate(rate));
            }
        }
        if shared.striped && now >= next_tick {
            next_tick = now + STRIPE_TICK.as_nanos() as u64;
            shared.stripe_tick(slowest);
        }
        if shared.striped && now >= next_log {
            next_log = now + LANE_LOG_EVERY.as_nanos() as u64;
            for l in shared.lane_stats() {
                tracing::debug!(
                    peer = %shared.peer,
                    lane = l.number,
                    sent = l.bytes_sent,
                    received = l.bytes_received,
                    rtt = ?l.rtt.unwrap_or_default(),
                    rate = l.delivery_rate,
                    retransmits = l.retransmits,
                    chunks_resent = l.chunks_resent,
                    "lane"
                );
            }
        }
        // The connection's deadlines, the server's resume expiry among them.
        let quiet = next_probe == u64::MAX;
        let (dead, next) = shared.with_conn(|c, _| {
            // The keepalive's pace (rarer PINGs while quiet, where both
            // sides offered it).
            c.mux_mut().set_quiet(quiet, now);
            c.handle_timeout(now);
            (c.mux().dead().is_some(), c.poll_timeout())
        });
        if dead {
            return;
        }
        if let Some(silent) = shared.take_silent() {
            let why = format!("nothing heard from the peer for {silent:?}");
            shared.drop_carriers(&why);
        }
        let mut wake = next.map_or(next_probe, |t| t.min(next_probe));
        if shared.striped {
            wake = wake.min(next_tick);
        }
        if let (u64::MAX, Some(idle)) = (next_probe, shared.config.idle_timeout) {
            // Quiet: the idle deadline counts from the last time the core
            // looked (`handle_timeout`), so look often enough that it ends
            // the session near `--idle-timeout` after its last stream.
            wake = wake.min(now.saturating_add(idle.as_nanos() as u64 / 4));
        }
        // A detach (the server's resume timeout starts) and a resume (the
        // new carrier is pinged at once) wake this through `timer_woken`,
        // as data moving again does; any other deadline that appears while
        // this sleeps is seen at the next probe (within PROBE_EVERY) or,
        // while quiet, at the connection's next deadline (a keepalive or
        // dead-peer check: seconds); an OPEN or BIND of ours wakes this
        // through `deadline_added`.
        let wait = Duration::from_nanos(wake.saturating_sub(shared.now_ns()));
        // Timers never fire early; a millisecond more keeps a deadline that
        // falls just after `now` from spinning.
        tokio::select! {
            _ = tokio::time::sleep_until(wake_at(wait.max(Duration::from_millis(1)))) => {}
            _ = shared.timer_woken.notified() => {
                // Quiet no longer: sample at once, then as usual.
                next_probe = 0;
            }
            _ = shared.deadline_added.notified() => {}
        }
    }
}

/// The timer ends only with its session; should it end otherwise (a
/// panic), nothing would expire the session or detect a dead peer: close
/// it rather than keep it for ever.
struct CloseIfStopped(Arc<Shared>);

impl Drop for CloseIfStopped {
    fn drop(&mut self) {
        if !self.0.is_dead() {
            self.0.close("the session's timer stopped".into());
        }
    }
}

/// How the rest of the session wakes a quiet timer.
impl Shared {
    /// Data moves (the writer sends DATA, the reader took a read bigger
    /// than a keepalive or DATA in any read): a quiet session's path is
    /// worth sampling again, and its PINGs go at the usual pace.
    /// PINGs and their answers do not count: they keep a session alive,
    /// not busy.
    pub fn moves_again(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.quiet.load(Relaxed) && self.quiet.swap(false, Relaxed) {
            self.timer_woken.notify_one();
        }
    }

    /// A timer that is not quiet wakes within PROBE_EVERY anyway (and
    /// `quiet` is set before the timer looks at the deadlines, under the
    /// session lock this is called under).
    pub(crate) fn deadline_added_if_quiet(&self) {
        if self.quiet.load(std::sync::atomic::Ordering::Relaxed) {
            self.deadline_added.notify_one();
        }
    }
}

/// When a wait of `wait` from now ends: at once for a short one, on the
/// next point of the process-wide [`GRID`] for a long one.
fn wake_at(wait: Duration) -> tokio::time::Instant {
    static EPOCH: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    let now = tokio::time::Instant::now();
    let exact = now + wait.min(Duration::from_secs(1 << 30));
    if wait < COALESCE_FROM {
        return exact;
    }
    let epoch = *EPOCH.get_or_init(|| now);
    let grid = match wait < COARSE_FROM {
        true => GRID.as_nanos(),
        false => COARSE_GRID.as_nanos(),
    };
    let since = exact.duration_since(epoch).as_nanos();
    let rounded = since.div_ceil(grid) * grid;
    epoch + Duration::from_nanos(rounded.min(u64::MAX as u128) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_waits_end_on_a_shared_grid_short_ones_exactly() {
        let now = tokio::time::Instant::now();
        let a = wake_at(Duration::from_millis(1300));
        let b = wake_at(Duration::from_millis(1310));
        assert!(a >= now + Duration::from_millis(1300));
        // On the grid: deadlines wake in whole slots of each other.
        let (apart, slot) = (b.duration_since(a).as_nanos(), GRID.as_nanos());
        assert!(b >= a && apart / slot * slot == apart);
        // Long ones on a coarser grid.
        let c = wake_at(Duration::from_millis(12_300));
        let d = wake_at(Duration::from_millis(14_100));
        let (apart, slot) = (d.duration_since(c).as_nanos(), COARSE_GRID.as_nanos());
        assert!(d > c && apart / slot * slot == apart);
        let short = wake_at(Duration::from_millis(20));
        assert!(short <= tokio::time::Instant::now() + Duration::from_millis(20));
        // Never earlier than asked, however far.
        assert!(wake_at(Duration::MAX) > now);
    }
}
