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

/// Whether the calling test should run here: false in the test binary's
/// ordinary run, which instead runs `test` (its full name, as
/// `module_path!()` and the function name give it) in a process of its own
/// and asserts that it passed. For tests that read this process's own
/// counters (peak RSS, open descriptors, CPU time), which the binary's other
/// tests would disturb: each crate's integration tests share one binary.
pub fn alone(module: &str, test: &str) -> bool {
    const MARK: &str = "LONGHAUL_TEST_ALONE";
    if std::env::var_os(MARK).is_some() {
        return true;
    }
    // Test names leave out the binary's own name.
    let module = module.split_once("::").map_or("", |(_, rest)| rest);
    let name = format!("{module}::{test}");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(MARK, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} failed in its own process");
    assert!(stdout.contains("1 passed"), "{name} did not run: {stdout}");
    false
}
