//! A peer that pushes far more than its windows allow, on many streams at
//! once, towards targets that never read: the server must drop it, and its
//! memory (peak RSS, this test runs alone in its process) must stay within
//! the session budget plus a fixed allowance.

use crate::common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_proto::frame::{self, DecodeLimits, Frame};
use longhaul_session::SessionConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BUDGET: u64 = 8 << 20;
/// Buffers that exist regardless of the budget: the carrier's 512 KiB read
/// buffers, per-stream 256 KiB uplink reads, allocator slack.
const ALLOWANCE: u64 = 48 << 20;
const STREAMS: u32 = 128;
const ATTEMPT: usize = 512 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrunning_peer_is_dropped_and_memory_stays_under_the_budget() {
    if !common::alone(
        module_path!(),
        "overrunning_peer_is_dropped_and_memory_stays_under_the_budget",
    ) {
        return;
    }
    logs();
    // Targets that never read, with tiny receive buffers.
    let sink_addr = never_reading_target(1024);
    let cfg = SessionConfig {
        budget: BUDGET,
        ..SessionConfig::default()
    };
    let rules = Rules::new(vec![sink_addr.to_string().parse().unwrap()], false);
    let server = start_server_with(rules, BindRules::default(), cfg).await;

    let before = status_bytes("VmRSS:");
    let mut s = native_peer(server).await;
    for i in 0..STREAMS {
        let open = Frame::Open {
            sender: i,
            window: 1 << 20,
            max_packet: u16::MAX,
            dest: format!("tcp://{sink_addr}"),
        };
        s.write_all(&open.to_bytes().unwrap()).await.unwrap();
    }
    let mut buf = BytesMut::new();
    let mut remotes: Vec<(u32, u32)> = vec![];
    let mut granted = 0u64;
    while remotes.len() < STREAMS as usize {
        if let Some(f) = frame::decode(&mut buf, DecodeLimits::default()).unwrap() {
            if let Frame::OpenSuccess { sender, window, .. } = f {
                remotes.push((sender, window));
                granted += window as u64;
            }
            continue;
        }
        let n = within(10, s.read_buf(&mut buf)).await.unwrap();
        assert!(n > 0, "server closed before answering the OPENs");
    }
    // The budget caps what the server grants in total (new streams get only
    // a small floor once it is spent).
    assert!(
        granted <= BUDGET + STREAMS as u64 * 64 * 1024,
        "granted {granted} bytes of window"
    );
    // First fill every window to the brim, as a greedy but lawful peer may.
    let chunk = Bytes::from(vec![7u8; frame::MAX_DATA_PAYLOAD]);
    let mut sent = 0usize;
    for &(r, window) in &remotes {
        let mut left = window as usize;
        while left > 0 {
            let n = left.min(chunk.len());
            let f = Frame::Data {
                recipient: r,
                payload: chunk.slice(..n),
            };
            s.write_all(&f.to_bytes().unwrap()).await.unwrap();
            left -= n;
            sent += n;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lawful_peak = status_bytes("VmHWM:");
    // Then ignore the windows and push round-robin on every stream.
    'push: while sent < ATTEMPT {
        for &(r, _) in &remotes {
            let f = Frame::Data {
                recipient: r,
                payload: chunk.clone(),
            };
            let bytes = f.to_bytes().unwrap();
            let w = tokio::time::timeout(Duration::from_secs(5), s.write_all(&bytes));
            match w.await {
                Ok(Ok(())) => sent += chunk.len(),
                _ => break 'push,
            }
        }
    }
    assert!(
        sent < ATTEMPT,
        "the server took {sent} bytes without dropping us"
    );
    wait_log("window overrun").await;
    let peak = status_bytes("VmHWM:");
    let grew = peak.saturating_sub(before);
    eprintln!(
        "granted {} KiB of window, pushed {} KiB before the drop, peak RSS grew {} KiB ({} KiB with every window full)",
        granted >> 10,
        sent >> 10,
        grew >> 10,
        lawful_peak.saturating_sub(before) >> 10
    );
    assert!(
        grew < BUDGET + ALLOWANCE,
        "peak RSS grew by {} MiB (budget {} MiB)",
        grew >> 20,
        BUDGET >> 20
    );
}
