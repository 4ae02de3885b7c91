//! A lawful but hostile peer that tries to pin the server's carrier read
//! buffers: it interleaves 1-byte DATA frames on a stream whose target never
//! reads with ~450 KiB on a stream whose target drains, round after round,
//! always within the windows. Each 1-byte payload used to be a slice of a
//! 512 KiB read buffer, keeping it alive while the window counted one byte
//! (1.6 GiB after 3 000 rounds with an 8 MiB budget). The server's peak RSS
//! (this test runs alone in its process) must stay within the session
//! budget plus the documented fixed allowance.

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

const BUDGET: u64 = 8 << 20;
/// docs/SECURITY.md: pinned read buffers (16 × 512 KiB), the reader's own
/// buffer, the control lane, per-stream and allocator slack.
const ALLOWANCE: u64 = 24 << 20;
const ROUNDS: usize = 1500;
const BULK_PER_ROUND: usize = 450 * 1024;

/// Reads frames until `want` more bytes of credit for `recipient` arrived.
async fn wait_credit(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    ours: u32,
    credit: &mut u64,
    want: u64,
) {
    while *credit < want {
        if let Some(f) = frame::decode(buf, DecodeLimits::default()).unwrap() {
            if let Frame::WindowAdjust {
                recipient,
                increment,
            } = f
            {
                if recipient == ours {
                    *credit += increment as u64;
                }
            }
            continue;
        }
        let n = within(20, s.read_buf(buf)).await.unwrap();
        assert!(n > 0, "server closed the session");
    }
}

async fn data(s: &mut TcpStream, recipient: u32, payload: &[u8]) {
    let mut head = [0u8; DATA_HEADER_LEN];
    write_data_header(&mut head, recipient, payload.len());
    s.write_all(&head).await.unwrap();
    s.write_all(payload).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_frames_beside_bulk_do_not_pin_read_buffers() {
    if !common::alone(
        module_path!(),
        "one_byte_frames_beside_bulk_do_not_pin_read_buffers",
    ) {
        return;
    }
    logs();
    let _dump = DumpLogsOnPanic;
    // Target A never reads (tiny receive buffer); target B drains.
    let stuck_addr = never_reading_target(16);
    let drain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let drain_addr = drain.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = drain.accept().await {
            tokio::spawn(async move {
                let mut b = vec![0u8; 1 << 16];
                while matches!(c.read(&mut b).await, Ok(n) if n > 0) {}
            });
        }
    });
    // Windows large enough that A's bytes overflow its target's socket
    // buffers and wait in the server.
    let cfg = SessionConfig {
        budget: BUDGET,
        window: WindowConfig {
            initial: 3 << 20,
            max: 3 << 20,
        },
        ..SessionConfig::default()
    };
    let rules = Rules::new(
        vec![
            stuck_addr.to_string().parse().unwrap(),
            drain_addr.to_string().parse().unwrap(),
        ],
        false,
    );
    let server = start_server_with(rules, BindRules::default(), cfg).await;

    let mut s = native_peer(server).await;
    for (i, t) in [stuck_addr, drain_addr].iter().enumerate() {
        let open = Frame::Open {
            sender: i as u32,
            window: 1 << 20,
            max_packet: u16::MAX,
            dest: format!("tcp://{t}"),
        };
        s.write_all(&open.to_bytes().unwrap()).await.unwrap();
    }
    let mut buf = BytesMut::new();
    let mut streams = [(0u32, 0u64); 2];
    let mut opened = 0;
    while opened < 2 {
        if let Some(f) = frame::decode(&mut buf, DecodeLimits::default()).unwrap() {
            if let Frame::OpenSuccess {
                recipient,
                sender,
                window,
                ..
            } = f
            {
                streams[recipient as usize] = (sender, window as u64);
                opened += 1;
            }
            continue;
        }
        let n = within(10, s.read_buf(&mut buf)).await.unwrap();
        assert!(n > 0, "server closed before answering the OPENs");
    }
    let (a, mut a_credit) = streams[0];
    let (b, mut b_credit) = streams[1];
    // Fill A until its target's socket is full and the rest waits in the
    // server: leave room in A's window for one byte per round.
    let fill = (a_credit as usize).saturating_sub(ROUNDS + 1024);
    let big = Bytes::from(vec![1u8; frame::MAX_DATA_PAYLOAD]);
    let mut left = fill;
    while left > 0 {
        let n = left.min(big.len());
        data(&mut s, a, &big[..n]).await;
        left -= n;
    }
    a_credit -= fill as u64;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = status_bytes("VmRSS:");

    for _ in 0..ROUNDS {
        assert!(a_credit > 0);
        data(&mut s, a, b"x").await;
        a_credit -= 1;
        let mut left = BULK_PER_ROUND;
        while left > 0 {
            if b_credit == 0 {
                // WINDOW_ADJUST comes addressed to our id for B (1).
                wait_credit(&mut s, &mut buf, 1, &mut b_credit, 1).await;
            }
            let n = left.min(big.len()).min(b_credit as usize);
            data(&mut s, b, &big[..n]).await;
            b_credit -= n as u64;
            left -= n;
        }
    }
    // Everything sent was within the windows: the session must still be up.
    let ping = Frame::Ping { nonce: 7 };
    s.write_all(&ping.to_bytes().unwrap()).await.unwrap();
    loop {
        if let Some(f) = frame::decode(&mut buf, DecodeLimits::default()).unwrap() {
            if f == (Frame::Pong { nonce: 7 }) {
                break;
            }
            continue;
        }
        let n = within(20, s.read_buf(&mut buf)).await.unwrap();
        assert!(n > 0, "server dropped a peer that kept to its windows");
    }
    let peak = status_bytes("VmHWM:");
    let grew = peak.saturating_sub(before);
    eprintln!(
        "{ROUNDS} rounds of 1 B + {} KiB: peak RSS grew {} KiB (budget {} KiB, allowance {} KiB)",
        BULK_PER_ROUND >> 10,
        grew >> 10,
        BUDGET >> 10,
        ALLOWANCE >> 10
    );
    assert!(
        grew < BUDGET + ALLOWANCE,
        "peak RSS grew by {} MiB (budget {} MiB)",
        grew >> 20,
        BUDGET >> 20
    );
}
