//! While no data moves, a session PINGs rarely (`--quiet-keepalive`, where
//! both sides offer it): a server holding thousands of idle sessions is
//! not woken every few seconds by each. Seen from a relay between client
//! and server that counts the carrier's bytes: few while quiet, the
//! session alive all the while (no resume), and a path that goes silent
//! (the relay stops forwarding: no kernel keepalive sees that, the relay's
//! kernel answers it) still found dead within the allowed silence, the
//! session then resumed.

use crate::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// A relay to `to` counting the bytes it forwards; connections accepted
/// before [`Relay::blackhole`] then swallow what they read.
struct Relay {
    port: u16,
    bytes: Arc<AtomicU64>,
    /// One flag per connection: set, it forwards nothing more.
    conns: Arc<std::sync::Mutex<Vec<Arc<AtomicBool>>>>,
}

impl Relay {
    fn to(port: u16) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay = Relay {
            port: l.local_addr().unwrap().port(),
            bytes: Arc::default(),
            conns: Arc::default(),
        };
        let (bytes, conns) = (relay.bytes.clone(), relay.conns.clone());
        std::thread::spawn(move || {
            for a in l.incoming() {
                let Ok(a) = a else { continue };
                let Ok(b) = TcpStream::connect(("127.0.0.1", port)) else {
                    continue;
                };
                let mute = Arc::new(AtomicBool::new(false));
                conns.lock().unwrap().push(mute.clone());
                for (mut from, mut to) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)]
                {
                    let (bytes, mute) = (bytes.clone(), mute.clone());
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 {
                                let _ = to.shutdown(std::net::Shutdown::Write);
                                break;
                            }
                            if mute.load(Ordering::SeqCst) {
                                continue;
                            }
                            bytes.fetch_add(n as u64, Ordering::SeqCst);
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        relay
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::SeqCst)
    }

    /// The connections open now forward nothing more (new ones do).
    fn blackhole(&self) {
        for c in self.conns.lock().unwrap().iter() {
            c.store(true, Ordering::SeqCst);
        }
    }
}

fn echoes(s: &mut TcpStream, what: &[u8]) {
    s.write_all(what).unwrap();
    let mut back = vec![0u8; what.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, what);
}

#[test]
fn a_quiet_session_pings_rarely_lives_on_and_still_finds_a_dead_path() {
    let tport = echo_target();
    let sport = free_port();
    let dir = tmpdir("quiet-keepalive");
    let _gone = RemovedOnDrop(dir.clone());
    // dead after 3 s: a PING every second while data moves; every 6 s
    // while quiet, so each side allows 3 + 6 s of silence. The client
    // offers a longer quiet interval: the shorter one (the server's) is
    // used, else the server would take the client for dead.
    let timing = ["--dead-after", "3s", "--quiet-keepalive", "6s"];
    let client_timing = ["--dead-after", "3s", "--quiet-keepalive", "20s"];
    let _server = spawn_logged(
        &[
            &["server", "--listen", &format!("tcp://127.0.0.1:{sport}")],
            &["--insecure", "--control", "none", "--allow"][..],
            &[&format!("127.0.0.1:{tport}")],
            &timing,
        ]
        .concat(),
        &dir.join("server.log"),
    );
    wait_port(sport);
    let relay = Relay::to(sport);
    let local = free_port();
    let log = dir.join("client.log");
    let _client = spawn_logged(
        &[
            &["client", &format!("tcp://127.0.0.1:{}", relay.port)],
            &["--insecure", "--control", "none", "-L"][..],
            &[&format!("127.0.0.1:{local}:127.0.0.1:{tport}")],
            &client_timing,
        ]
        .concat(),
        &log,
    );
    wait_port(local);
    let mut s = TcpStream::connect(("127.0.0.1", local)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    echoes(&mut s, b"before the quiet");

    // Quiet within a second or two; then 7 s of it. At the usual pace that
    // is 7 PINGs of the client's with their PONGs (24 bytes a pair) and
    // the server's own; quiet, one or two pairs (each may bring an ACK of
    // the link layer).
    std::thread::sleep(Duration::from_secs(3));
    let before = relay.bytes();
    std::thread::sleep(Duration::from_secs(7));
    let quiet = relay.bytes() - before;
    assert!(
        quiet <= 3 * 24 + 64,
        "{quiet} bytes crossed the carrier in 7 s of quiet: PINGs at the usual pace?"
    );
    // 10 s idle, longer than 3 s of dead-after: the same session, and data
    // moves at once.
    echoes(&mut s, b"after the quiet");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("session resumed") && !text.contains("new session"),
        "the quiet session was taken for dead:\n{text}"
    );

    // The path goes silent while the session is quiet: found within the
    // allowed silence (3 + 6 s) and some, then resumed on a new carrier.
    std::thread::sleep(Duration::from_secs(2));
    relay.blackhole();
    let cut = Instant::now();
    wait_until(20, "the client resumes after the path went silent", || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("session resumed")
    });
    let found = cut.elapsed();
    assert!(
        found < Duration::from_secs(14),
        "a silent path found dead only after {found:?}"
    );
    echoes(&mut s, b"after the resume");
}
