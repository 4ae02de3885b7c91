//! Bulk transfers for the carrier tests: streams that send and receive a
//! known amount each way through a client's forward, hashed at both ends,
//! while the test disturbs the carrier.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use longhaul_forward::Client;
use longhaul_session::SessionConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::*;

/// Per stream, each way.
pub const PER_STREAM: usize = 16 << 20;
pub const STREAMS: usize = 4;

/// Per stream: (hash of what the target received, hash of what it sent).
pub type Results = tokio::sync::mpsc::Receiver<([u8; 32], [u8; 32])>;
/// The target's address and its results.
pub type Target = (SocketAddr, Results);

/// A target that, for each connection, sends `PER_STREAM` bytes of its own
/// and hashes what it receives; counts received bytes in `progress`.
pub async fn hashing_target(progress: Arc<AtomicU64>) -> Target {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(STREAMS * 2);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let tx = tx.clone();
            let progress = progress.clone();
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let mine = random_bytes(PER_STREAM);
                let mine_hash = sha(&mine);
                let send = async move {
                    w.write_all(&mine).await.unwrap();
                    w.shutdown().await.unwrap();
                };
                let recv = async move {
                    let mut got = Vec::with_capacity(PER_STREAM);
                    let mut buf = vec![0u8; 256 * 1024];
                    loop {
                        let n = r.read(&mut buf).await.unwrap();
                        if n == 0 {
                            break;
                        }
                        progress.fetch_add(n as u64, Ordering::SeqCst);
                        got.extend_from_slice(&buf[..n]);
                    }
                    sha(&got)
                };
                let ((), got) = tokio::join!(send, recv);
                let _ = tx.send((got, mine_hash)).await;
            });
        }
    });
    (addr, rx)
}

pub fn quick_session() -> SessionConfig {
    SessionConfig {
        // A silent carrier is found within a few seconds in these tests.
        keepalive: Duration::from_millis(500),
        dead_after: Duration::from_secs(2),
        ..SessionConfig::default()
    }
}

/// Runs `STREAMS` streams through `client`'s first forward, each sending
/// and receiving `PER_STREAM` bytes; `disturb` runs meanwhile with the
/// target's progress counter. Checks every hash both ways.
pub async fn transfer_while<F, Fut>(
    client: &Client,
    target: Target,
    progress: Arc<AtomicU64>,
    disturb: F,
) where
    F: FnOnce(Arc<AtomicU64>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (_, mut results) = target;
    let fwd = client.local_addrs[0];
    let mut streams = vec![];
    for i in 0..STREAMS {
        streams.push(tokio::spawn(async move {
            let data = random_bytes(PER_STREAM);
            let h = sha(&data);
            let s = TcpStream::connect(fwd).await.unwrap();
            let got = send_and_collect(s, data).await;
            assert_eq!(got.len(), PER_STREAM, "stream {i}: length");
            (h, sha(&got))
        }));
    }
    disturb(progress).await;
    let mut sent_up = vec![];
    let mut got_down = vec![];
    within(120, async {
        for s in streams {
            let (up, down) = s.await.expect("a stream failed (reset or cut short)");
            sent_up.push(up);
            got_down.push(down);
        }
    })
    .await;
    let mut target_got = vec![];
    let mut target_sent = vec![];
    for _ in 0..STREAMS {
        let (got, sent) = within(30, results.recv()).await.unwrap();
        target_got.push(got);
        target_sent.push(sent);
    }
    sent_up.sort();
    target_got.sort();
    got_down.sort();
    target_sent.sort();
    assert_eq!(sent_up, target_got, "client → target bytes differ");
    assert_eq!(got_down, target_sent, "target → client bytes differ");
}

/// Waits until the target has received `share` of everything.
pub async fn until_progress(p: &AtomicU64, share: f64) {
    let want = (share * (PER_STREAM * STREAMS) as f64) as u64;
    within(120, async {
        while p.load(Ordering::SeqCst) < want {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}
