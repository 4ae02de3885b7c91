//! The folder carrier under load and at the disk's limits: 1 GiB through
//! one carrier never has more than two segments of a direction on disk; a
//! full disk is an error, not a hang; a half dropped without shutdown still
//! delivers. (Apart from `folder.rs`, whose checks that waiting costs no
//! CPU this load would blur.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use longhaul_carrier::folder::{dial, FolderListener, SEGMENT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common;
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
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .flatten()
        .map(|e| (e.file_name(), e.metadata().map(|m| m.len()).ok()))
        .collect();
    assert_eq!(dir.bytes(), 0, "files left behind: {left:?}");
}

/// A tmpfs of `size` mounted at a fresh directory (root only), unmounted
/// on drop.
#[cfg(target_os = "linux")]
struct SmallTmpfs(std::path::PathBuf);

#[cfg(target_os = "linux")]
impl SmallTmpfs {
    fn mount(name: &str, size: &str) -> Option<SmallTmpfs> {
        let d = std::env::temp_dir().join(format!("lh-folder-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&d)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| SmallTmpfs(d))
    }
}

#[cfg(target_os = "linux")]
impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        // Lazy: a task that still holds a segment open must not leave the
        // mount behind.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

// A small tmpfs is Linux's; a full disk elsewhere is not staged here.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_full_disk_is_a_clear_error_not_a_hang() {
    let Some(fs) = SmallTmpfs::mount("full", "2m") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root: mount must work"
        );
        return eprintln!("skipping: cannot mount a tmpfs (not root?)");
    };
    let url: longhaul_carrier::folder::FolderUrl =
        format!("dir://{}", fs.0.display()).parse().unwrap();
    let mut listener = FolderListener::bind(&url).unwrap();
    let mut client = dial(&url).unwrap();
    let _server = within(5, listener.accept()).await.unwrap();
    // Nobody reads: the first segment grows until the disk is full.
    let block = vec![7u8; 64 * 1024];
    let e = within(10, async {
        loop {
            if let Err(e) = client.write_all(&block).await {
                return e;
            }
        }
    })
    .await;
    assert!(e.to_string().contains("No space left"), "{e}");
    assert!(e.to_string().contains("folder carrier"), "{e}");
}

#[tokio::test]
async fn a_half_dropped_without_shutdown_still_delivers_then_ends() {
    let dir = TempDir::new("drop");
    let mut listener = FolderListener::bind(&dir.url()).unwrap();
    let mut client = dial(&dir.url()).unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut server = within(5, listener.accept()).await.unwrap();
    let d2 = data.clone();
    let sent = tokio::spawn(async move {
        client.write_all(&d2).await.unwrap();
        // As a socket's close: no shutdown, just gone.
        drop(client);
    });
    let mut got = Vec::new();
    within(10, server.read_to_end(&mut got)).await.unwrap();
    sent.await.unwrap();
    assert_eq!(got, data);
}
