//! The replay buffer's bound, as memory: a peer that reads everything but
//! never acknowledges must not make the server hold more than the bound.
//! Alone in its binary, so the process's resident memory is this test's.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_session::SessionConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_acknowledges_gets_no_more_than_the_replay_bound() {
    if !common::alone(
        module_path!(),
        "a_peer_that_never_acknowledges_gets_no_more_than_the_replay_bound",
    ) {
        return;
    }
    use longhaul_proto::frame::{self, DecodeLimits, Frame};
    use longhaul_proto::resume::{Attach, Attached};

    /// X25519's base point: a valid key share.
    const BASE_POINT: [u8; 32] = {
        let mut b = [0u8; 32];
        b[0] = 9;
        b
    };
    logs();
    // A target that sends without end.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let chunk = vec![5u8; 256 * 1024];
                while s.write_all(&chunk).await.is_ok() {}
            });
        }
    });
    const LIMIT: usize = 1 << 20;
    let session = SessionConfig {
        replay_limit: LIMIT,
        ..SessionConfig::default()
    };
    let server = start_server_with(
        Rules::new(vec![target.to_string().parse().unwrap()], false),
        BindRules::default(),
        session,
    )
    .await;
    let base = status_bytes("VmRSS:");
    let mut c = dial_raw(&format!("tcp://{server}"), None).await;
    let answer = raw_attach(
        &mut c,
        Attach::New {
            replay_limit: LIMIT as u32,
            lanes: 0,
            share: BASE_POINT,
        },
    )
    .await;
    assert!(matches!(answer, Attached::New { .. }), "{answer:?}");
    // One stream with a window far beyond the bound: only the replay
    // buffer can stop the server.
    let open = Frame::Open {
        sender: 1,
        window: 1 << 30,
        max_packet: 65000,
        dest: format!("tcp://{target}"),
    };
    c.writer.write_all(&open.to_bytes().unwrap()).await.unwrap();
    c.writer.flush().await.unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let r2 = received.clone();
    let mut reader = c.reader;
    let reading = tokio::spawn(async move {
        let mut buf = bytes::BytesMut::with_capacity(1 << 20);
        loop {
            if reader.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
            while let Ok(Some(f)) = frame::decode(&mut buf, DecodeLimits::default()) {
                if let Frame::Data { payload, .. } = f {
                    r2.fetch_add(payload.len() as u64, Ordering::SeqCst);
                }
            }
            if buf.capacity() - buf.len() < 128 * 1024 {
                let rest = buf.split();
                buf = bytes::BytesMut::with_capacity(1 << 20);
                buf.extend_from_slice(&rest);
            }
        }
    });
    // Data flows, then stops short of the bound plus one writer batch.
    within(10, async {
        while received.load(Ordering::SeqCst) < (LIMIT / 2) as u64 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let plateau = received.load(Ordering::SeqCst);
    let grown = status_bytes("VmHWM:").saturating_sub(base);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = received.load(Ordering::SeqCst);
    assert_eq!(plateau, later, "the server kept sending without ACKs");
    assert!(
        later <= (LIMIT + (1 << 20) + 65536) as u64,
        "{later} bytes sent unacknowledged, bound {LIMIT} + one batch"
    );
    // What the server really holds for the peer (replay, stream queue,
    // carrier buffers) as resident memory, not as a counter: the target
    // sends gigabytes meanwhile, all of which an unbounded replay would keep.
    assert!(
        grown < 48 << 20,
        "peak RSS grew by {} MiB while the peer never acknowledged",
        grown >> 20
    );
    reading.abort();
}
