//! A hostile authenticated peer opens a stream to a target that does not
//! read, fills the stream's window, then sends CLOSE — again and again.
//! The closed streams' bytes still wait for their targets: they must keep
//! their share of the session budget and a stream slot until written, so
//! the server's memory and descriptors stay within `--session-budget`,
//! `--max-streams` and the documented allowance, and it keeps serving.

use crate::common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_proto::frame::{self, write_data_header, DecodeLimits, Frame, DATA_HEADER_LEN};
use longhaul_proto::window::WindowConfig;
use longhaul_session::SessionConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BUDGET: u64 = 64 << 20;
// More than the kernel takes into a socket towards a target that never
// reads (its send buffer grows to 4 MiB by default): the rest stays with the
// stream's downlink, blocked on the full socket.
const WINDOW: u32 = 7 << 20;
const MAX_STREAMS: usize = 8;
const ROUNDS: u32 = 60;
/// docs/SECURITY.md's fixed allowance (read buffers, control lane, slack).
const ALLOWANCE: u64 = 24 << 20;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The next frame from the server.
async fn next_frame(s: &mut TcpStream, buf: &mut BytesMut) -> Frame {
    loop {
        if let Some(f) = frame::decode(buf, DecodeLimits::default()).unwrap() {
            return f;
        }
        let n = within(20, s.read_buf(buf)).await.unwrap();
        assert!(n > 0, "server closed the session");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_streams_with_stuck_bytes_keep_their_budget_and_slot() {
    if !common::alone(
        module_path!(),
        "closed_streams_with_stuck_bytes_keep_their_budget_and_slot",
    ) {
        return;
    }
    logs();
    let _dump = DumpLogsOnPanic;
    let stuck = never_reading_target(1024);
    let cfg = SessionConfig {
        budget: BUDGET,
        max_streams: MAX_STREAMS,
        window: WindowConfig {
            initial: WINDOW,
            max: WINDOW,
        },
        ..SessionConfig::default()
    };
    let rules = Rules::new(vec![stuck.to_string().parse().unwrap()], false);
    let server = start_server_with(rules, BindRules::default(), cfg).await;
    let mut s = native_peer(server).await;
    let mut buf = BytesMut::new();
    let payload = Bytes::from(vec![7u8; frame::MAX_DATA_PAYLOAD]);
    let fds_before = open_fds();
    let rss_before = status_bytes("VmRSS:");
    let (mut accepted, mut refused) = (0, 0);
    for round in 0..ROUNDS {
        let open = Frame::Open {
            sender: round,
            window: 0,
            max_packet: u16::MAX,
            dest: format!("tcp://{stuck}"),
        };
        s.write_all(&open.to_bytes().unwrap()).await.unwrap();
        let (ours, window) = loop {
            match next_frame(&mut s, &mut buf).await {
                Frame::OpenSuccess {
                    recipient,
                    sender,
                    window,
                    ..
                } if recipient == round => break (Some(sender), window),
                Frame::OpenFailure { recipient, .. } if recipient == round => break (None, 0),
                _ => {}
            }
        };
        let Some(ours) = ours else {
            refused += 1;
            continue;
        };
        accepted += 1;
        // Fill the window: the target reads nothing, so the bytes wait in
        // the server (its socket buffers hold only a little).
        let mut left = window as usize;
        while left > 0 {
            let n = left.min(payload.len());
            let mut head = [0u8; DATA_HEADER_LEN];
            write_data_header(&mut head, ours, n);
            s.write_all(&head).await.unwrap();
            s.write_all(&payload[..n]).await.unwrap();
            left -= n;
        }
        let close = Frame::Close { recipient: ours };
        s.write_all(&close.to_bytes().unwrap()).await.unwrap();
    }
    // The session is still served: a PING is answered.
    let ping = Frame::Ping { nonce: 99 };
    s.write_all(&ping.to_bytes().unwrap()).await.unwrap();
    while next_frame(&mut s, &mut buf).await != (Frame::Pong { nonce: 99 }) {}
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fds = open_fds().saturating_sub(fds_before);
    let grew = status_bytes("VmRSS:").saturating_sub(rss_before);
    eprintln!(
        "{accepted} streams accepted, {refused} refused; +{fds} fds, RSS +{} KiB",
        grew >> 10
    );
    // Each stuck stream holds its socket and the target's end (this
    // process): at most max_streams of them.
    assert!(
        fds <= 2 * MAX_STREAMS + 8,
        "{fds} more descriptors after {ROUNDS} stuck streams"
    );
    assert!(refused > 0, "stuck streams did not hold their slots");
    assert!(
        grew < BUDGET + ALLOWANCE,
        "RSS grew by {} MiB (budget {} MiB)",
        grew >> 20,
        BUDGET >> 20
    );
    // The session ends (its carrier dropped, no resume): the stuck
    // streams' sockets and tasks go with it, whatever they still held;
    // only the target's own ends (this process) stay.
    drop(s);
    let mut left = usize::MAX;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = open_fds().saturating_sub(fds_before);
        if left <= MAX_STREAMS + 2 {
            break;
        }
    }
    assert!(
        left <= MAX_STREAMS + 2,
        "{left} descriptors left after the session ended"
    );
}
