//! A writer of the shared folder against real `longhaul` processes: FIFOs
//! and symbolic links named like carrier files, and a folder full of junk.
//! Each check is bounded in time: a process that hangs fails the test, it
//! never hangs the test.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// A fresh folder on tmpfs (where there is one), removed on drop.
struct Share(PathBuf);

impl Share {
    fn new(name: &str) -> Share {
        let base = match Path::new("/dev/shm").is_dir() {
            true => PathBuf::from("/dev/shm"),
            false => std::env::temp_dir(),
        };
        let d = base.join(format!("lh-hostile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Share(d)
    }
    fn url(&self) -> String {
        format!("dir://{}", self.0.display())
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mkfifo(p: &Path) {
    let ok = Command::new("mkfifo").arg(p).status().unwrap();
    assert!(ok.success(), "mkfifo {}", p.display());
}

fn sigterm(k: &Kill) {
    let ok = Command::new("kill")
        .args(["-TERM", &k.pid().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Waits at most `secs` for the process to exit.
fn exits_within(k: &mut Kill, secs: u64) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        if let Some(st) = k.0.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Runs `longhaul ARGS` to its end, killed after `secs`: None if it had
/// not ended by then.
fn run_bounded(args: &[&str], secs: u64) -> Option<Output> {
    let mut child = Kill(
        Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    exits_within(&mut child, secs)?;
    let Kill(c) = &mut child;
    let mut stderr = String::new();
    c.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let st = c.wait().unwrap();
    Some(Output {
        status: st,
        stdout: vec![],
        stderr: stderr.into_bytes(),
    })
}

#[test]
fn a_fifo_or_a_symlink_named_like_a_carrier_file_does_not_hang_the_server() {
    let share = Share::new("fifo-srv");
    let work = tmpdir("fifo-srv");
    let target = echo_target();
    let (mut srv, fp) = server_on(&share.url(), &work, "s", target, &[]);
    // A FIFO named like a client's first file, and a symbolic link to a
    // FIFO outside the folder (the server must not follow it).
    mkfifo(&share.0.join("lh-0123456789abcdef.c.0"));
    let outside = work.join("outside.fifo");
    mkfifo(&outside);
    std::os::unix::fs::symlink(&outside, share.0.join("lh-0123456789abcde0.c.0")).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let served = live_client(&share.url(), &["--pin", &fp], target, &work).map(drop);
    sigterm(&srv);
    let st = exits_within(&mut srv, 5);
    let log = std::fs::read_to_string(work.join("s.log")).unwrap_or_default();
    served.unwrap_or_else(|e| panic!("{e}\nserver log:\n{log}"));
    assert!(
        st.is_some(),
        "SIGTERM did not end the server within 5 s:\n{log}"
    );
    assert!(log.contains("not a regular file"), "{log}");
    let _ = std::fs::remove_dir_all(&work);
}

/// Makes `lh-ID.s.0` a FIFO as soon as a client's `lh-ID.c.0` appears.
fn answer_with_fifos(dir: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut made = 0;
        while !stop.load(Ordering::Relaxed) {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(id) = name.strip_suffix(".c.0") {
                    let s0 = dir.join(format!("{id}.s.0"));
                    if !s0.exists() && Command::new("mkfifo").arg(&s0).status().is_ok() {
                        made += 1;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        made
    })
}

#[test]
fn a_fifo_answer_does_not_hang_a_client_or_cp() {
    let share = Share::new("fifo-cli");
    let work = tmpdir("fifo-cli");
    let stop = Arc::new(AtomicBool::new(false));
    let answerer = answer_with_fifos(share.0.clone(), stop.clone());
    let url = share.url();
    let pin = "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU";
    let src = work.join("src.txt");
    std::fs::write(&src, b"data").unwrap();
    let remote = format!("{url}:/x.txt");
    let lport = free_port().to_string();
    let fwd = format!("{lport}:127.0.0.1:1");
    let runs: [(&str, Vec<&str>); 2] = [
        (
            "client",
            vec![
                "client",
                &url,
                "--pin",
                pin,
                "--token",
                TOKEN,
                "--no-reconnect",
                "--handshake-timeout",
                "3s",
                "-L",
                &fwd,
            ],
        ),
        (
            "cp",
            vec![
                "cp",
                "--pin",
                pin,
                "--token",
                "tok",
                "--handshake-timeout",
                "3s",
                src.to_str().unwrap(),
                &remote,
            ],
        ),
    ];
    for (what, args) in runs {
        let out = run_bounded(&args, 15);
        let out = out.unwrap_or_else(|| panic!("{what} hung on a FIFO answer"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: {err}");
        assert!(err.contains("not a regular file"), "{what}: {err}");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(answerer.join().unwrap() >= 2);
    let _ = std::fs::remove_dir_all(&work);
}

/// A client through the folder that stays up: its process and its -L port,
/// after one echo round trip.
fn live_client(url: &str, args: &[&str], target: u16, work: &Path) -> Result<(Kill, u16), String> {
    let lport = free_port();
    let fwd = format!("{lport}:127.0.0.1:{target}");
    let log = work.join(format!("client-{lport}.log"));
    let mut all = vec![
        "client",
        url,
        "--token",
        TOKEN,
        "--no-reconnect",
        "-L",
        &fwd,
    ];
    all.extend_from_slice(args);
    let mut client = spawn_logged(&all, &log);
    let t = Instant::now();
    let mut s = loop {
        if let Some(st) = client.0.try_wait().unwrap() {
            let l = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("client exited ({st}): {l}"));
        }
        if let Ok(s) = TcpStream::connect(("127.0.0.1", lport)) {
            break s;
        }
        if t.elapsed() > Duration::from_secs(15) {
            let l = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("the client never connected: {l}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).map_err(|e| format!("no echo: {e}"))?;
    Ok((client, lport))
}

const TOKEN: &str = "a-token-nobody-may-read-0123456789";

/// `longhaul server` on `url` with a fresh key and TOKEN; waits until it
/// serves the folder.
fn server_on(url: &str, work: &Path, name: &str, target: u16, more: &[&str]) -> (Kill, String) {
    let key = work.join(format!("{name}.key"));
    let fp = keygen(&key);
    let log = work.join(format!("{name}.log"));
    let allow = format!("127.0.0.1:{target}");
    let mut args = vec![
        "server",
        "--listen",
        url,
        "--key",
        key.to_str().unwrap(),
        "--token",
        TOKEN,
        "--allow",
        &allow,
        // SIGTERM ends these servers at once: a client killed without a
        // word leaves a session the server cannot see gone (the drain is
        // tested in lifecycle.rs and fleet.rs).
        "--drain-timeout",
        "0",
    ];
    args.extend_from_slice(more);
    let k = spawn_logged(&args, &log);
    wait_until(10, "the server serves the folder", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("serving the folder"))
    });
    (k, fp)
}

#[test]
fn known_hosts_pins_a_folder_whose_path_has_a_space_and_first_use_is_asked_for() {
    let share = Share::new("kh");
    let folder = share.0.join("My Share");
    std::fs::create_dir_all(&folder).unwrap();
    let url = format!("dir://{}", folder.display());
    let work = tmpdir("kh");
    let kh = work.join("known_hosts");
    let kh_arg = kh.to_str().unwrap();
    let target = echo_target();
    let (mut a, _) = server_on(&url, &work, "a", target, &[]);
    // First use over a folder: refused unless asked for, in one line.
    let err = live_client(&url, &["--known-hosts", kh_arg], target, &work)
        .err()
        .expect("first use over a folder was trusted without --trust-first-use");
    assert!(
        err.contains("--trust-first-use") && err.contains("--pin"),
        "{err}"
    );
    let refusal: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("--trust-first-use"))
        .collect();
    assert_eq!(refusal.len(), 1, "{err}");
    // Asked for: trusted and remembered, once.
    let args = ["--known-hosts", kh_arg, "--trust-first-use"];
    drop(live_client(&url, &args, target, &work).unwrap());
    let text = std::fs::read_to_string(&kh).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    // Known now: no flag needed, and ?poll= is the same folder.
    let polled = format!("{url}?poll=20ms");
    drop(live_client(&polled, &["--known-hosts", kh_arg], target, &work).unwrap());
    let text = std::fs::read_to_string(&kh).unwrap();
    assert_eq!(text.lines().count(), 1, "a second entry: {text}");
    // Another key answers in that folder: refused, loudly.
    sigterm(&a);
    assert!(exits_within(&mut a, 5).is_some());
    let (_b, _) = server_on(&url, &work, "b", target, &[]);
    let err = live_client(&url, &args, target, &work)
        .err()
        .expect("a changed key was trusted");
    assert!(err.contains("CHANGED"), "{err}");
    let _ = std::fs::remove_dir_all(&work);
}

/// Every byte the folder's files hold now.
fn folder_bytes(dir: &Path) -> Vec<u8> {
    let mut all = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if let Ok(b) = std::fs::read(e.path()) {
            all.extend(b);
        }
    }
    all
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn insecure_alone_keeps_a_folder_encrypted() {
    let share = Share::new("insecure");
    let work = tmpdir("insecure");
    let target = echo_target();
    let url = share.url();
    // --insecure on both sides: still TLS, the token unreadable in the files.
    let (_s, fp) = server_on(&url, &work, "s", target, &["--insecure"]);
    let (_c, _) = live_client(&url, &["--insecure", "--pin", &fp], target, &work).unwrap();
    let seen = folder_bytes(&share.0);
    assert!(!seen.is_empty());
    assert!(
        !contains(&seen, TOKEN.as_bytes()),
        "the token is readable in the folder's files"
    );
    // An unencrypted folder is asked for per listener, and with --insecure.
    let plain = format!("{url}?tls=off");
    let out = run_bounded(
        &[
            "server",
            "--listen",
            &plain,
            "--token",
            TOKEN,
            "--allow-all",
        ],
        10,
    )
    .expect("server hung");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("unencrypted") && err.contains("--insecure"),
        "{err}"
    );
    let out = run_bounded(
        &["client", &plain, "--token", TOKEN, "-L", "0:127.0.0.1:1"],
        10,
    )
    .expect("client hung");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("unencrypted") && err.contains("--insecure"),
        "{err}"
    );
    // The help says so.
    for cmd in ["server", "client"] {
        let out = Command::new(BIN).args([cmd, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("dir://PATH?tls=off"), "{cmd} --help: {help}");
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// Threads of a process now.
fn threads(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with("Threads:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Makes `n` files named `lh-…` of every kind a junk writer might, starting
/// at `from`: a third named like clients' first files.
fn junk(dir: &Path, from: u64, n: u64) {
    for i in from..from + n {
        let name = match i % 3 {
            0 => format!("lh-{:016x}.c.0", 0xdead_0000_0000 + i),
            1 => format!("lh-{:016x}.s.7", 0xbeef_0000_0000 + i),
            _ => format!("lh-junk-{i}"),
        };
        std::fs::write(dir.join(name), b"").unwrap();
    }
}

#[test]
fn a_folder_full_of_junk_costs_bounded_threads_memory_and_cpu() {
    let share = Share::new("junk");
    let work = tmpdir("junk");
    let target = echo_target();
    // 100 000 files before the server starts, 3 000 more (1 000 like
    // clients' first files) while it runs.
    junk(&share.0, 0, 100_000);
    let url = share.url();
    let (mut srv, fp) = server_on(&url, &work, "s", target, &["--handshake-timeout", "3s"]);
    let pid = srv.pid();
    let base_rss = status_kib(pid, "VmRSS:");
    let cpu0 = cpu_time(pid);
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (stop2, pid2) = (stop.clone(), pid);
    let sampler = std::thread::spawn(move || {
        let mut most = 0;
        while !stop2.load(Ordering::Relaxed) {
            most = most.max(threads(pid2));
            std::thread::sleep(Duration::from_millis(10));
        }
        most
    });
    junk(&share.0, 100_000, 3_000);
    // A real client is served meanwhile.
    let served = live_client(&url, &["--pin", &fp], target, &work);
    // Then, with the junk still there, the server rests.
    std::thread::sleep(Duration::from_secs(4));
    let cpu1 = cpu_time(pid);
    std::thread::sleep(Duration::from_secs(4));
    let resting = cpu_time(pid) - cpu1;
    stop.store(true, Ordering::Relaxed);
    let most_threads = sampler.join().unwrap();
    let busy = cpu1 - cpu0;
    let peak = status_kib(pid, "VmHWM:");
    let log = std::fs::read_to_string(work.join("s.log")).unwrap_or_default();
    eprintln!(
        "junk: threads ≤ {most_threads}, RSS {base_rss} KiB at start, peak {peak} KiB, CPU {busy:?} in the first {:?}, {resting:?} in 4 s at rest",
        t0.elapsed() - Duration::from_secs(4)
    );
    served.unwrap_or_else(|e| panic!("{e}\nserver log:\n{log}"));
    // 2 × MAX_PENDING carriers in their handshake at most, a thread or
    // two each, plus the runtime's; each ≤ ≈ 1 MiB (two record buffers
    // of 256 KiB, TLS state; measured ≈ 0.9 MiB) over ≈ 10 MiB at start.
    assert!(most_threads <= 160, "{most_threads} threads");
    assert!(peak < 96 << 10, "peak RSS {peak} KiB");
    assert!(
        resting < Duration::from_millis(400),
        "{resting:?} of CPU in 4 s with the junk at rest"
    );
    assert!(
        busy < Duration::from_secs(3),
        "{busy:?} of CPU while junk arrived"
    );
    sigterm(&srv);
    assert!(
        exits_within(&mut srv, 5).is_some(),
        "SIGTERM did not end the server"
    );
    let _ = std::fs::remove_dir_all(&work);
}
