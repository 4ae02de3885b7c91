//! Keepalive, RTT sampling, dead-peer and idle detection: off the data path.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use longhaul_carrier::PathProbe;
use longhaul_proto::frame::Frame;

use crate::runtime::{Shared, MAX_PINGS};

pub(crate) async fn housekeeping(shared: Arc<Shared>, probe: Option<Box<dyn PathProbe>>) {
    let tick = Duration::from_millis(500);
    let mut last_ping: Option<Instant> = None;
    let mut busy_at = Instant::now();
    let mut last_bytes = 0u64;
    loop {
        if let Some(limit) = shared.config.idle_timeout {
            let st = shared.lock();
            let bytes = st.bytes_sent + st.bytes_received;
            let busy = !st.streams.is_empty() || bytes != last_bytes;
            drop(st);
            last_bytes = bytes;
            if busy {
                busy_at = Instant::now();
            } else if busy_at.elapsed() >= limit {
                let why = format!("idle for {limit:?} (no streams; --idle-timeout)");
                tracing::info!(peer = %shared.peer, "closing session: {why}");
                shared.close(why);
                return;
            }
        }
        if let Some(p) = &probe {
            if let Some(r) = p.rtt() {
                shared
                    .tcp_rtt_ns
                    .store(r.as_nanos() as u64, Ordering::Relaxed);
            }
            p.retune();
        }
        if shared.ext {
            if last_ping.is_none_or(|t| t.elapsed() >= shared.config.keepalive) {
                last_ping = Some(Instant::now());
                let mut st = shared.lock();
                let nonce = shared.now_ns();
                if st.pings.len() >= MAX_PINGS {
                    st.pings.pop_front();
                }
                st.pings.push_back(nonce);
                shared.send_control(&mut st, Frame::Ping { nonce });
                drop(st);
                shared.wake_writer.notify_one();
            }
            let silent = shared
                .now_ns()
                .saturating_sub(shared.last_rx_ns.load(Ordering::Relaxed));
            if silent > shared.config.dead_after.as_nanos() as u64 {
                let why = format!("peer unresponsive for {:?}", Duration::from_nanos(silent));
                tracing::warn!(peer = %shared.peer, "closing session: {why}");
                shared.close(why);
                return;
            }
        }
        tokio::time::sleep(tick).await;
    }
}
