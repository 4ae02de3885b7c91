//! Helpers for the folder carrier's tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use longhaul_carrier::folder::FolderUrl;

/// A fresh directory on tmpfs (where inotify works), removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!("lh-folder-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    pub fn url(&self) -> FolderUrl {
        format!("dir://{}", self.0.display()).parse().unwrap()
    }
    pub fn bytes(&self) -> u64 {
        std::fs::read_dir(&self.0)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("timed out")
}

/// Shared by every crate's tests: [`alone::alone`].
#[path = "../../../../../tests/support/alone.rs"]
mod alone;
pub use alone::alone;
