//! The server runs a bounded number of connects per session at once; the
//! bound must not let targets that never answer hold up the session's
//! other OPENs.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_proto::frame::{self, DecodeLimits, Frame, MAX_FRAME_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// A target that never answers: a listener that never accepts, with a
/// backlog of 1. Once its queue is full the kernel drops further SYNs,
/// so connects to it hang until the server's connect timeout (10 s).
fn silent_target() -> TcpListener {
    let hole = TcpSocket::new_v4().unwrap();
    hole.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    hole.listen(1).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_targets_do_not_hold_up_other_opens() {
    let hole = silent_target();
    let hole_addr = hole.local_addr().unwrap();
    let echo = echo_server().await;
    let rules = Rules::new(
        [hole_addr.to_string(), echo.to_string()]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect(),
        false,
    );
    let server = start_server(rules, BindRules::default()).await;
    let client = start_client(server, &[hole_addr, echo]).await;

    // More OPENs to the silent target than the server connects at once
    // (64), all held open.
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(TcpStream::connect(client.local_addrs[0]).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A stream to a target that answers still opens at once, not after
    // the silent ones' 10 s connect timeout.
    let t = Instant::now();
    let mut s = TcpStream::connect(client.local_addrs[1]).await.unwrap();
    s.write_all(b"still served").await.unwrap();
    let mut got = [0u8; 12];
    within(20, s.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"still served");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "an OPEN behind 100 silent ones took {:?}",
        t.elapsed()
    );
    drop((held, hole));
}

/// OPENs in pairs: one to the silent target, one with a frame-long
/// destination (never allowed) queued behind it.
const PAIRS: u32 = 600;
/// Growth of the server's peak memory allowed: the queue's 1 MiB of
/// destinations, the slow connects' tasks and sockets, read buffers and
/// allocator slack: 6 MiB measured; 38 MiB without the cap.
const GROWTH: u64 = 16 << 20;

/// The destinations waiting for a connect are capped per session (1 MiB):
/// a peer that keeps every connect busy with targets that never answer,
/// and queues OPENs with destinations as long as a frame behind them,
/// gets those refused, and the server's memory does not follow what it
/// sent (≈ 39 MB of destinations).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_destinations_stay_within_their_cap() {
    if !common::alone(module_path!(), "queued_destinations_stay_within_their_cap") {
        return;
    }
    // One socket per slow connect.
    let _ = longhaul_files::raise_nofile_limit();
    let hole = silent_target();
    let hole_addr = hole.local_addr().unwrap();
    let rules = Rules::new(vec![hole_addr.to_string().parse().unwrap()], false);
    let server = start_server(rules, BindRules::default()).await;
    let before = status_bytes("VmRSS:");

    let (mut rd, mut wr) = native_peer(server).await.into_split();
    // Answers to the long OPENs (odd ids) so far, and how many of them
    // were refused for the queue's cap.
    let answered = Arc::new(AtomicU32::new(0));
    let seen = answered.clone();
    let answers = tokio::spawn(async move {
        let mut buf = BytesMut::new();
        let mut capped = 0u32;
        while seen.load(Ordering::Relaxed) < PAIRS {
            if let Some(f) = frame::decode(&mut buf, DecodeLimits::default()).unwrap() {
                if let Frame::OpenFailure {
                    recipient,
                    description,
                    ..
                } = f
                {
                    if recipient % 2 == 1 {
                        seen.fetch_add(1, Ordering::Relaxed);
                        capped += u32::from(description == "too many opens waiting to connect");
                    }
                }
                continue;
            }
            if rd.read_buf(&mut buf).await.unwrap() == 0 {
                panic!("the server ended the session after {seen:?} answers");
            }
        }
        capped
    });
    let open = |sender, dest| {
        Frame::Open {
            sender,
            window: 1 << 16,
            max_packet: u16::MAX,
            dest,
        }
        .to_bytes()
        .unwrap()
    };
    let silent = format!("tcp://{hole_addr}");
    // Every connect busy first (64, for 250 ms each), so that the pairs
    // queue however fast the server reads them.
    for i in 0..64 {
        wr.write_all(&open(2 * (PAIRS + i), silent.clone()))
            .await
            .unwrap();
    }
    // Fits a frame (10 bytes of OPEN before it); no port, so it is refused
    // as soon as a connect task looks at it (a name would be looked up).
    let long = format!("tcp://{}", "a".repeat(MAX_FRAME_LEN - 10 - 6 - 16));
    for i in 0..PAIRS {
        wr.write_all(&open(2 * i, silent.clone())).await.unwrap();
        wr.write_all(&open(2 * i + 1, long.clone())).await.unwrap();
    }
    let Ok(capped) = tokio::time::timeout(Duration::from_secs(60), answers).await else {
        panic!("{answered:?} of {PAIRS} long OPENs answered in 60 s");
    };
    let capped = capped.unwrap();
    let growth = status_bytes("VmHWM:").saturating_sub(before);
    assert!(
        growth < GROWTH,
        "the server grew by {} MiB ({capped} OPENs refused for the cap)",
        growth >> 20
    );
    assert!(capped > 0, "no OPEN was refused for the queue's cap");
    drop((wr, hole));
}
