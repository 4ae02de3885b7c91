//! A local user against another's control socket (root, to play both): the
//! fallback folder `/tmp/longhaul-UID`, made first by someone else, made a
//! symlink, or open to others, is refused with one line and not used.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

/// Someone else: the owner of the folders we plant.
const OTHER: u32 = 65534;

/// A uid no one uses, for this run.
fn victim() -> u32 {
    3_000_000_000 + std::process::id()
}

fn as_victim(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .uid(victim())
        .gid(victim())
        .env_remove("XDG_RUNTIME_DIR")
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null());
    c
}

/// Runs a server as the victim until it logs where it listens: its log.
fn server_log(name: &str) -> String {
    let dir = tmpdir(&format!("local-user-{name}"));
    let log = dir.join("server.log");
    let port = free_port();
    let f = std::fs::File::create(&log).unwrap();
    let _server = Kill(
        as_victim(&[
            "server",
            "--listen",
            &format!("tcp://127.0.0.1:{port}"),
            "--insecure",
        ])
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap(),
    );
    wait_until(10, "the server listening", || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("listening on")
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    text
}

fn sockets_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default()
}

fn root_or_skip() -> bool {
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return true;
    }
    assert!(std::env::var("CI").is_err(), "CI must run as root");
    eprintln!("SKIPPED: needs root");
    false
}

#[test]
fn a_control_folder_someone_else_controls_is_refused() {
    if !root_or_skip() {
        return;
    }
    let fallback = PathBuf::from(format!("/tmp/longhaul-{}", victim()));
    let decoy = PathBuf::from(format!("/tmp/lh-decoy-{}", victim()));
    let clean = || {
        let _ = std::fs::remove_file(&fallback);
        let _ = std::fs::remove_dir_all(&fallback);
        let _ = std::fs::remove_dir_all(&decoy);
    };
    clean();
    let chown = |p: &Path, uid: u32| std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
    let chmod =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let refused = |log: &str, why: &str| {
        let line = format!("refusing {} for control sockets", fallback.display());
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(&line)).collect();
        assert!(
            lines.len() == 1 && lines[0].contains(why),
            "want one line saying {why}:\n{log}"
        );
    };

    // Made first by another user, open to all.
    std::fs::create_dir(&fallback).unwrap();
    chown(&fallback, OTHER);
    chmod(&fallback, 0o777);
    refused(&server_log("other"), "belongs to uid 65534");
    assert_eq!(sockets_in(&fallback), Vec::<PathBuf>::new());
    // `status` does not ask sockets there either.
    let out = as_victim(&["status"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("belongs to uid 65534"),
        "{err}"
    );
    clean();

    // A symlink to a folder of ours: not followed.
    std::fs::create_dir(&decoy).unwrap();
    chown(&decoy, victim());
    chmod(&decoy, 0o700);
    std::os::unix::fs::symlink(&decoy, &fallback).unwrap();
    std::os::unix::fs::lchown(&fallback, Some(victim()), Some(victim())).unwrap();
    refused(&server_log("symlink"), "symbolic link");
    assert_eq!(sockets_in(&decoy), Vec::<PathBuf>::new());
    clean();

    // Ours, but open to others.
    std::fs::create_dir(&fallback).unwrap();
    chown(&fallback, victim());
    chmod(&fallback, 0o755);
    refused(&server_log("open"), "mode 0755");
    assert_eq!(sockets_in(&fallback), Vec::<PathBuf>::new());
    clean();

    // Missing: made ours alone, and used.
    let log = server_log("fresh");
    assert!(!log.contains("refusing"), "{log}");
    let m = std::fs::symlink_metadata(&fallback).unwrap();
    assert!(m.is_dir() && m.uid() == victim() && m.mode() & 0o777 == 0o700);
    clean();
}
