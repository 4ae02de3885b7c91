//! Helpers for tests that run the `longhaul` binary as a user would.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_longhaul");

/// A child process killed (and reaped) when the test ends, pass or fail.
pub struct Kill(pub Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Kill {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

/// A port free now for TCP and UDP, never one handed out before in this
/// process: two asked for in a row (a server's two listeners) must not be
/// the same once both are closed again.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // Free for UDP as well: QUIC carriers and UDP forwards take the
        // same number there.
        let udp_free = match std::net::UdpSocket::bind(("127.0.0.1", port)) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => false,
            Err(e) => panic!("cannot bind UDP on 127.0.0.1: {e}"),
        };
        if udp_free && !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Waits until something listens on `port` (connects once to find out).
/// A connection to itself does not count: while nothing listens, a
/// connect from an ephemeral port that happens to be `port` succeeds on
/// its own (TCP simultaneous open).
pub fn wait_port(port: u16) {
    let t = Instant::now();
    let listening = || {
        TcpStream::connect(("127.0.0.1", port))
            .is_ok_and(|s| s.local_addr().ok() != s.peer_addr().ok())
    };
    while !listening() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "port {port} never opened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes a test's folder when dropped: declared right after the folder,
/// it goes after the processes declared later, which may write there.
pub struct RemovedOnDrop(pub std::path::PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("lh-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Starts `longhaul ARGS` with stderr piped (read it only after it exits,
/// or the pipe may fill).
pub fn spawn(args: &[&str]) -> Kill {
    Kill(
        Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// Starts `longhaul ARGS` with its log going to `log` (a file the test may
/// read at any time).
pub fn spawn_logged(args: &[&str], log: &std::path::Path) -> Kill {
    let f = std::fs::File::create(log).unwrap();
    Kill(
        Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .unwrap(),
    )
}

/// A field of `/proc/PID/status` in KiB (`VmRSS:`, `VmHWM:`).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// User + system CPU time of a process so far (from `/proc/PID/stat`).
pub fn cpu_time(pid: u32) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// This process's soft limit on open files.
pub fn open_files_limit() -> u64 {
    let s = std::fs::read_to_string("/proc/self/limits").unwrap();
    s.lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

/// Waits for `cond`, failing the test after `secs`.
pub fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(secs), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `longhaul keygen --out PATH`: the new key's fingerprint.
pub fn keygen(path: &std::path::Path) -> String {
    let out = Command::new(BIN)
        .args(["keygen", "--out"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// An echo target on a thread per connection; its port.
pub fn echo_target() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut b = [0u8; 4096];
                while let Ok(n) = std::io::Read::read(&mut s, &mut b) {
                    if n == 0 || std::io::Write::write_all(&mut s, &b[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// Descriptors a process holds now.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}
