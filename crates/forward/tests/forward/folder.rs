//! Sessions through a shared folder: TLS with a pinned key and a token
//! inside the files, on tmpfs (inotify) and through a FUSE mount where no
//! notification ever comes (bindfs: the server writes the backing
//! directory, the client the mount), and a session that resumes when its
//! carrier's files are removed under it. Every stream hashed end to end.

use crate::common;
use crate::common::folder;
use crate::common::transfer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use folder::{folder_client, folder_server, Folder};
use longhaul_carrier::folder::SEGMENT;
use longhaul_carrier::Fingerprint;
use longhaul_forward::Client;
use transfer::*;

/// A folder server, a hashing target, and a client reaching it through
/// the folder at `client_url` (the server's own, or a mount of it).
/// Also the server's key, for more clients.
async fn folder_transfer(
    dir: &Folder,
    client_url: &str,
) -> (Client, Target, Arc<AtomicU64>, Fingerprint) {
    let key = folder_server(&dir.url(), quick_session()).await;
    let progress = Arc::new(AtomicU64::new(0));
    let target = hashing_target(progress.clone()).await;
    let client = Client::start(folder_client(client_url, key, target.0))
        .await
        .unwrap();
    (client, target, progress, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tmpfs_streams_both_ways_within_the_disk_bound() {
    let _dump = DumpLogsOnPanic;
    logs();
    let dir = Folder::new("bulk");
    let (client, target, progress, key) = folder_transfer(&dir, &dir.url()).await;
    let peak = Arc::new(AtomicU64::new(0));
    let (peak2, dir2) = (peak.clone(), &dir);
    transfer_while(&client, target, progress, |p| async move {
        let all = (PER_STREAM * STREAMS) as u64;
        within(120, async {
            while p.load(Ordering::SeqCst) < all {
                peak2.fetch_max(dir2.bytes(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
    })
    .await;
    let peak = peak.load(Ordering::SeqCst);
    // Two segments per direction at most.
    assert!(peak <= 4 * SEGMENT, "peak disk use {peak}");
    // tmpfs raises notifications: a late one (a busy machine) is not
    // taken for a share that never sends them.
    let polled = format!("folder {}: changes arrive without", dir.0.display());
    assert!(!log_contains(&polled), "tmpfs taken for a share");
    // Request/response through the same folder, small and large.
    let echo = echo_server().await;
    let c2 = Client::start(folder_client(&dir.url(), key, echo))
        .await
        .unwrap();
    echo_streams(c2.local_addrs[0], vec![1, 1000, 100_000, 1 << 20]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumes_when_its_files_are_removed() {
    let _dump = DumpLogsOnPanic;
    logs();
    let dir = Folder::new("resume");
    let (client, target, progress, _) = folder_transfer(&dir, &dir.url()).await;
    let before = client.session().resume_id();
    let dir2 = &dir;
    transfer_while(&client, target, progress, |p| async move {
        until_progress(&p, 0.3).await;
        dir2.remove_carrier_files();
        until_progress(&p, 0.7).await;
        dir2.remove_carrier_files();
    })
    .await;
    assert_eq!(
        client.session().resume_id(),
        before,
        "a new session, not a resume"
    );
    // Found missing by the reader ("was removed before its end") or, when
    // the reader held the unlinked file open, by silence: either way the
    // session went on over a new carrier.
    let resumed = format!("session resumed on a new carrier peer={}", dir.url());
    assert!(log_contains(&resumed), "no line '{resumed}'");
}

/// A bindfs mount of `backing` at `mount`, unmounted on drop.
struct Bindfs(PathBuf);

impl Bindfs {
    /// None (with the reason) when bindfs or FUSE is missing.
    fn mount(backing: &Path, mount: &Path) -> Result<Bindfs, String> {
        std::fs::create_dir_all(mount).map_err(|e| e.to_string())?;
        let st = std::process::Command::new("bindfs")
            .arg(backing)
            .arg(mount)
            .status()
            .map_err(|e| format!("bindfs: {e} (apt-get install bindfs)"))?;
        match st.success() {
            true => Ok(Bindfs(mount.to_path_buf())),
            false => Err(format!(
                "bindfs failed ({st}): is /dev/fuse there, and are we root?"
            )),
        }
    }
}

impl Drop for Bindfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fuse_share_without_notifications_is_polled() {
    let _dump = DumpLogsOnPanic;
    logs();
    let dir = Folder::new("fuse-backing");
    let mount_at = std::env::temp_dir().join(format!("lh-fwd-fuse-{}", std::process::id()));
    let _mount = match Bindfs::mount(&dir.0, &mount_at) {
        Ok(m) => m,
        Err(e) if std::env::var_os("CI").is_some() => panic!("FUSE needed under CI: {e}"),
        Err(e) => return eprintln!("skipping: {e}"),
    };
    // The server writes the backing directory; the client works through
    // the mount, where the server's writes raise no event.
    let url = format!("dir://{}", mount_at.display());
    let (client, target, progress, _) = folder_transfer(&dir, &url).await;
    transfer_while(&client, target, progress, |_| async {}).await;
    assert!(
        log_contains("polling instead"),
        "no switch to polling logged"
    );
}
