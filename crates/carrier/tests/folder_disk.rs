//! The folder carrier's disk bound under load: 1 GiB through one carrier
//! never has more than two segments of a direction on disk.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use longhaul_carrier::folder::{dial, FolderListener, SEGMENT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::{within, TempDir};

#[tokio::test]
async fn disk_use_stays_within_two_segments_per_direction() {
    let dir = TempDir::new("cap");
    let mut listener = FolderListener::bind(&dir.url()).unwrap();
    let mut client = dial(&dir.url()).unwrap();
    let mut server = within(5, listener.accept()).await.unwrap();
    const TOTAL: usize = 1 << 30;
    let writer = tokio::spawn(async move {
        let block = vec![0x5au8; 1 << 20];
        for _ in 0..TOTAL / block.len() {
            client.write_all(&block).await.unwrap();
        }
        client.shutdown().await.unwrap();
        client
    });
    let (dir2, stop) = (dir.0.clone(), Arc::new(AtomicBool::new(false)));
    let stop2 = stop.clone();
    let sampler = std::thread::spawn(move || {
        let mut peak = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            let now: u64 = std::fs::read_dir(&dir2)
                .map(|rd| {
                    rd.flatten()
                        .filter_map(|e| e.metadata().ok())
                        .map(|m| m.len())
                        .sum()
                })
                .unwrap_or(0);
            peak = peak.max(now);
            std::thread::sleep(Duration::from_millis(2));
        }
        peak
    });
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    within(120, async {
        loop {
            let n = server.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            assert!(buf[..n].iter().all(|&b| b == 0x5a));
            got += n;
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    assert_eq!(got, TOTAL);
    // One direction carried it all; the other holds an empty first segment.
    assert!(
        peak <= 2 * SEGMENT,
        "peak disk use {peak} over 2 × {SEGMENT}"
    );
    drop(writer.await.unwrap());
    drop(server);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(dir.bytes(), 0, "files left behind");
}
