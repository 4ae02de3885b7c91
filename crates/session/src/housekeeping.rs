//! The session's timer, off the data path: runs the core's deadlines
//! (keepalive PINGs, dead-peer and idle detection, expiry of unanswered
//! OPENs and BINDs) and samples the path under the carrier.

use std::sync::Arc;
use std::time::Duration;

use crate::runtime::Shared;

/// How often the path is sampled (RTT for window growth, the kernel's send
/// queue resized to the delivery rate).
const PROBE_EVERY: Duration = Duration::from_millis(500);

pub(crate) async fn housekeeping(shared: Arc<Shared>) {
    let mut next_probe = 0u64;
    loop {
        let now = shared.now_ns();
        if now >= next_probe {
            next_probe = now + PROBE_EVERY.as_nanos() as u64;
            // The probe of the carrier attached now, if any.
            let probe = shared.slot().probe.clone();
            if let Some(p) = &probe {
                if let Some(r) = p.rtt() {
                    shared.with(|m, _| m.set_path_rtt(r));
                }
                p.retune();
            }
        }
        let (dead, next) = shared.with(|m, _| {
            m.handle_timeout(now);
            (m.dead().is_some(), m.poll_timeout())
        });
        if dead {
            return;
        }
        if let Some(silent) = shared.take_silent() {
            let gen = shared.slot().gen;
            shared.carrier_failed(gen, format!("nothing heard from the peer for {silent:?}"));
        }
        let wake = next.map_or(next_probe, |t| t.min(next_probe));
        let wait = Duration::from_nanos(wake.saturating_sub(shared.now_ns()));
        // Timers never fire early; a millisecond more keeps a deadline that
        // falls just after `now` from spinning.
        tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
    }
}
