//! An authenticated peer against the server's log: what it sends is shown
//! escaped (no forged lines, no terminal escapes) and its refusals are
//! throttled (the log cannot fill a disk).

use crate::common;

use std::sync::Arc;

use common::*;
use longhaul_forward::client::{Client, ClientConfig};

/// Destinations named to forge a log line each, in red.
fn hostile(i: usize) -> String {
    format!("tcp://x{i}\nFORGED 2026-01-01T00:00:00Z  INFO \x1b[31mroot logged in\x1b[0m:80")
}

#[test]
fn refused_destinations_are_escaped_and_throttled_in_the_log() {
    let dir = tmpdir("hostile-logs");
    let port = free_port();
    let log = dir.join("server.log");
    let _server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("tcp://127.0.0.1:{port}"),
            "--insecure",
            "--allow",
            // A name rule alone: refused names are never resolved.
            "allowed.invalid:1",
            "--control",
            "none",
        ],
        &log,
    );
    wait_port(port);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut cfg = ClientConfig::new(format!("tcp://127.0.0.1:{port}").parse().unwrap());
        cfg.insecure = true;
        cfg.reconnect = false;
        let client = Client::start(cfg).await.unwrap();
        let session = client.session();
        // 10 000 refusals, 100 asked at a time.
        let gate = Arc::new(tokio::sync::Semaphore::new(100));
        let mut tasks = Vec::new();
        for i in 0..10_000 {
            let (s, permit) = (session.clone(), gate.clone().acquire_owned().await.unwrap());
            tasks.push(tokio::spawn(async move {
                let _permit = permit;
                assert!(s.open(&hostile(i)).await.is_err(), "opened {i}");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // The end of the session says how many were not logged.
        client
            .shutdown("done", std::time::Duration::from_secs(1))
            .await;
    });
    let text = wait_for_log(&log, "more refusals not logged");
    assert!(!text.contains('\x1b'), "a raw ESC in the log");
    let forged: Vec<&str> = text.lines().filter(|l| l.starts_with("FORGED")).collect();
    assert!(forged.is_empty(), "forged lines: {forged:?}");
    // Shown, escaped.
    assert!(text.contains("\\nFORGED"), "{text}");
    let lines = text.lines().count();
    assert!(lines < 300, "{lines} log lines for one session's refusals");
    assert!(text.contains("more refusals not logged"), "no summary");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The log once it contains `what` (within 10 s), or as it is then.
fn wait_for_log(log: &std::path::Path, what: &str) -> String {
    let t = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap();
        if text.contains(what) || t.elapsed() > std::time::Duration::from_secs(10) {
            return text;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn opens_past_the_stream_limit_are_logged_escaped_and_throttled() {
    let dir = tmpdir("hostile-logs-limit");
    let port = free_port();
    let tport = echo_target();
    let log = dir.join("server.log");
    let _server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("tcp://127.0.0.1:{port}"),
            "--insecure",
            "--allow",
            &format!("127.0.0.1:{tport}"),
            "--max-streams",
            "4",
            "--control",
            "none",
        ],
        &log,
    );
    wait_port(port);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut cfg = ClientConfig::new(format!("tcp://127.0.0.1:{port}").parse().unwrap());
        cfg.insecure = true;
        cfg.reconnect = false;
        let client = Client::start(cfg).await.unwrap();
        let session = client.session();
        // The limit's four streams, held open.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(
                session
                    .open(&format!("tcp://127.0.0.1:{tport}"))
                    .await
                    .unwrap(),
            );
        }
        // Then 2 000 OPENs past it, each naming a forged line.
        let gate = Arc::new(tokio::sync::Semaphore::new(100));
        let mut tasks = Vec::new();
        for i in 0..2_000 {
            let (s, permit) = (session.clone(), gate.clone().acquire_owned().await.unwrap());
            tasks.push(tokio::spawn(async move {
                let _permit = permit;
                assert!(s.open(&hostile(i)).await.is_err(), "opened {i}");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        drop(held);
        client
            .shutdown("done", std::time::Duration::from_secs(1))
            .await;
    });
    let text = wait_for_log(&log, "session ended");
    assert!(!text.contains('\x1b'), "a raw ESC in the log");
    let forged: Vec<&str> = text.lines().filter(|l| l.starts_with("FORGED")).collect();
    assert!(forged.is_empty(), "forged lines: {forged:?}");
    assert!(text.contains("\\nFORGED"), "{text}");
    let lines = text.lines().count();
    assert!(lines < 300, "{lines} log lines for 2 000 refused OPENs");
    let _ = std::fs::remove_dir_all(&dir);
}
