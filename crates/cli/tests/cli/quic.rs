//! `quic://` between real processes: bytes and datagrams intact, a wrong
//! pin refused, a client whose address changes keeps its session without
//! a resume (QUIC migration), and a QUIC connection that dies is resumed
//! on a new one. Between client and server, a UDP relay of the test's
//! own that can move the client to another source port or drop a flow.

use crate::common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// One client flow through the relay: its socket towards the server.
struct Flow {
    up: Arc<UdpSocket>,
    mute: Arc<AtomicBool>,
}

/// A UDP relay to a server, one upstream socket per client address.
struct UdpRelay {
    port: u16,
    to: SocketAddr,
    front: Arc<UdpSocket>,
    flows: Arc<Mutex<HashMap<SocketAddr, Flow>>>,
    /// Bytes the server sent to upstream sockets made by [`Self::rebind`].
    after_rebind: Arc<AtomicU64>,
}

impl UdpRelay {
    fn to(server: SocketAddr) -> UdpRelay {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let relay = UdpRelay {
            port: front.local_addr().unwrap().port(),
            to: server,
            front: front.clone(),
            flows: Arc::default(),
            after_rebind: Arc::default(),
        };
        let flows = relay.flows.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, client)) = front.recv_from(&mut buf) {
                let mut f = flows.lock().unwrap();
                let flow = f.entry(client).or_insert_with(|| {
                    let mute = Arc::new(AtomicBool::new(false));
                    let up = upstream(server, &front, client, &mute, None);
                    Flow { up, mute }
                });
                if !flow.mute.load(Ordering::SeqCst) {
                    let _ = flow.up.send(&buf[..n]);
                }
            }
        });
        relay
    }

    /// Every client now reaches the server from a new source port, as
    /// after a NAT rebinding.
    fn rebind(&self) {
        for (client, flow) in self.flows.lock().unwrap().iter_mut() {
            let counter = Some(self.after_rebind.clone());
            flow.up = upstream(self.to, &self.front, *client, &flow.mute, counter);
        }
    }

    /// The flows open now forward nothing more either way (new ones do).
    fn blackhole(&self) {
        for flow in self.flows.lock().unwrap().values() {
            flow.mute.store(true, Ordering::SeqCst);
        }
    }
}

/// A socket towards the server whose replies go back to `client`.
fn upstream(
    server: SocketAddr,
    front: &Arc<UdpSocket>,
    client: SocketAddr,
    mute: &Arc<AtomicBool>,
    counter: Option<Arc<AtomicU64>>,
) -> Arc<UdpSocket> {
    let up = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    up.connect(server).unwrap();
    let (rx, front, mute) = (up.clone(), front.clone(), mute.clone());
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = rx.recv(&mut buf) {
            if let Some(c) = &counter {
                c.fetch_add(n as u64, Ordering::SeqCst);
            }
            if !mute.load(Ordering::SeqCst) {
                let _ = front.send_to(&buf[..n], client);
            }
        }
    });
    up
}

/// A UDP echo; its port.
fn udp_echo() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = s.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(&buf[..n], from);
        }
    });
    port
}

/// A quic:// server allowing the TCP and UDP echoes; its port and pin.
fn server(dir: &std::path::Path, allow: &[String], extra: &[&str]) -> (Kill, u16, String) {
    let pin = keygen(&dir.join("s.key"));
    let port = free_port();
    let mut args = vec![
        "server".to_string(),
        "--listen".into(),
        format!("quic://127.0.0.1:{port}"),
        "--key".into(),
        dir.join("s.key").to_str().unwrap().into(),
        "--token".into(),
        "quic-test".into(),
        "--control".into(),
        "none".into(),
    ];
    for a in allow {
        args.extend(["--allow".into(), a.clone()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let log = dir.join("server.log");
    let k = spawn_logged(&args, &log);
    wait_until(10, "the server listens on quic://", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("listening on quic://"))
    });
    (k, port, pin)
}

fn client(dir: &std::path::Path, to: u16, pin: &str, forwards: &[String], extra: &[&str]) -> Kill {
    let mut args = vec![
        "client".to_string(),
        format!("quic://127.0.0.1:{to}"),
        "--pin".into(),
        pin.into(),
        "--token".into(),
        "quic-test".into(),
    ];
    if !extra.contains(&"--control") {
        args.extend(["--control".into(), "none".into()]);
    }
    for f in forwards {
        args.extend(["-L".into(), f.clone()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn_logged(&args, &dir.join("client.log"))
}

/// A client that tries the quic:// server on `port` once, pinning `pin`.
fn one_try(port: u16, pin: &str) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(["client", &format!("quic://127.0.0.1:{port}"), "--pin", pin])
        .args(["--token", "quic-test", "--control", "none"])
        .args(["--no-reconnect", "-L", "0:127.0.0.1:1"])
        .output()
        .unwrap()
}

/// Writes `len` patterned bytes through `s` from a second thread while
/// reading the echo, and checks every byte.
fn echo_bulk(s: &TcpStream, len: usize, seed: u8) {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let mut w = s.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || w.write_all(&sent).unwrap());
    let mut back = vec![0u8; len];
    (&mut &*s).read_exact(&mut back).unwrap();
    writer.join().unwrap();
    assert!(back == data, "the echo differs from what was sent");
}

#[test]
fn tcp_bytes_and_udp_datagrams_cross_quic_intact_and_a_wrong_pin_is_refused() {
    let dir = tmpdir("quic-intact");
    let (tport, uport) = (echo_target(), udp_echo());
    let allow = [
        format!("127.0.0.1:{tport}"),
        format!("udp:127.0.0.1:{uport}"),
    ];
    let (_server, port, pin) = server(&dir, &allow, &[]);
    let (local, ulocal) = (free_port(), free_port());
    let control = dir.join("c.sock");
    let _client = client(
        &dir,
        port,
        &pin,
        &[
            format!("127.0.0.1:{local}:127.0.0.1:{tport}"),
            format!("udp:{ulocal}:127.0.0.1:{uport}"),
        ],
        &["--control", control.to_str().unwrap()],
    );
    wait_port(local);
    let s = TcpStream::connect(("127.0.0.1", local)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    echo_bulk(&s, 16 << 20, 7);
    wait_until(10, "the client forwards UDP", || {
        std::fs::read_to_string(dir.join("client.log")).is_ok_and(|l| l.contains("forwarding udp:"))
    });

    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    u.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    u.connect(("127.0.0.1", ulocal)).unwrap();
    let mut got = 0;
    for i in 0..50u32 {
        let msg = format!("datagram {i} {}", "x".repeat(i as usize * 20));
        let _ = u.send(msg.as_bytes());
        let mut buf = [0u8; 2048];
        // A late echo of an earlier datagram is skipped, not taken for
        // this one's.
        while let Ok(n) = u.recv(&mut buf) {
            let back = String::from_utf8_lossy(&buf[..n]).to_string();
            let number = back.split(' ').nth(1).and_then(|n| n.parse::<u32>().ok());
            let Some(number) = number else {
                panic!("a datagram came back changed: {back:?}");
            };
            let expected = format!("datagram {number} {}", "x".repeat(number as usize * 20));
            assert_eq!(back, expected, "a datagram came back changed");
            if number == i {
                got += 1;
                break;
            }
        }
    }
    assert!(got >= 45, "only {got} of 50 datagrams came back");
    // Those went as QUIC datagrams, both ways; larger ones than a QUIC
    // packet carries (4 000 bytes) go in the stream instead, intact.
    for i in 0..3u8 {
        let big = vec![b'a' + i; 4000];
        u.send(&big).unwrap();
        let mut buf = [0u8; 8192];
        // (A late echo of a small one is skipped.)
        let n = loop {
            match u.recv(&mut buf).expect("a 4 000-byte datagram came back") {
                n if n < 4000 => continue,
                n => break n,
            }
        };
        assert!(buf[..n] == big[..], "a large datagram came back changed");
    }
    let out = std::process::Command::new(BIN)
        .args(["status", "--json"])
        .arg(&control)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &v[0]["sessions"][0]["datagrams"];
    let n = |k: &str| d[k].as_u64().unwrap_or(0);
    assert!(n("path_sent") >= 45 && n("path_received") >= 45, "{d}");
    assert!(n("sent") >= n("path_sent") + 3, "the large ones: {d}");

    // The same server under another key than the client pins: refused
    // before anything is sent, and said so.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let wrong = keygen(&other.join("k"));
    let out = one_try(port, &wrong);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a wrong pin got in:\n{err}");
    assert!(err.contains(&pin) || err.contains("key"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_client_whose_address_changes_keeps_its_session_and_a_dead_connection_resumes() {
    let dir = tmpdir("quic-moves");
    let tport = echo_target();
    let (_server, port, pin) = server(&dir, &[format!("127.0.0.1:{tport}")], &[]);
    let relay = UdpRelay::to(([127, 0, 0, 1], port).into());
    let local = free_port();
    let _client = client(
        &dir,
        relay.port,
        &pin,
        &[format!("127.0.0.1:{local}:127.0.0.1:{tport}")],
        &["--dead-after", "3s"],
    );
    wait_port(local);
    let s = TcpStream::connect(("127.0.0.1", local)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    echo_bulk(&s, 1 << 20, 1);

    // The client's address changes in the middle of a transfer.
    let moved = {
        let s = s.try_clone().unwrap();
        std::thread::spawn(move || echo_bulk(&s, 32 << 20, 2))
    };
    std::thread::sleep(Duration::from_millis(100));
    relay.rebind();
    moved.join().unwrap();
    assert!(
        relay.after_rebind.load(Ordering::SeqCst) > 0,
        "the server never answered the new address"
    );
    let log = dir.join("client.log");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("session resumed") && !text.contains("new session"),
        "a moved client needed a resume:\n{text}"
    );

    // The QUIC connection dies in the middle of a transfer (its packets
    // dropped both ways): the session resumes on a new one, and the
    // stream goes on with every byte.
    let cut = {
        let s = s.try_clone().unwrap();
        std::thread::spawn(move || echo_bulk(&s, 32 << 20, 3))
    };
    std::thread::sleep(Duration::from_millis(100));
    relay.blackhole();
    wait_until(20, "the client resumes on a new QUIC connection", || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("session resumed")
    });
    cut.join().unwrap();
    echo_bulk(&s, 1 << 20, 4);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server that stops keeps its QUIC endpoint for the sessions it
/// drains; a client that comes meanwhile is refused at once (and can go
/// elsewhere), not left waiting for a handshake nobody accepts.
#[test]
fn a_draining_server_refuses_new_quic_clients_at_once() {
    let dir = tmpdir("quic-drain");
    let tport = echo_target();
    let (server, port, pin) = server(&dir, &[format!("127.0.0.1:{tport}")], &[]);
    let local = free_port();
    let _client = client(
        &dir,
        port,
        &pin,
        &[format!("127.0.0.1:{local}:127.0.0.1:{tport}")],
        &[],
    );
    wait_port(local);
    // An open stream keeps the session, so the server drains.
    let s = TcpStream::connect(("127.0.0.1", local)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    echo_bulk(&s, 1 << 10, 1);
    let term = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    wait_until(10, "the server drains", || {
        std::fs::read_to_string(dir.join("server.log")).is_ok_and(|t| t.contains("draining"))
    });
    let started = std::time::Instant::now();
    let out = one_try(port, &pin);
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a draining server let a client in:\n{err}"
    );
    assert!(
        took < Duration::from_millis(2500),
        "refused only after {took:?} (the 3 s wait for a first answer):\n{err}"
    );
    echo_bulk(&s, 1 << 10, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn where_udp_is_blocked_a_client_falls_back_to_tls_soon_and_says_so() {
    let dir = tmpdir("quic-fallback");
    let tport = echo_target();
    let tls_port = free_port();
    let listen_tls = format!("tls://127.0.0.1:{tls_port}");
    let (_server, _, pin) = server(
        &dir,
        &[format!("127.0.0.1:{tport}")],
        &["--listen", &listen_tls],
    );
    // UDP to this port goes nowhere: a socket that never answers.
    let blocked = UdpSocket::bind("127.0.0.1:0").unwrap();
    let local = free_port();
    let started = std::time::Instant::now();
    let _client = client(
        &dir,
        blocked.local_addr().unwrap().port(),
        &pin,
        &[format!("127.0.0.1:{local}:127.0.0.1:{tport}")],
        &["--failover", &listen_tls],
    );
    wait_port(local);
    let took = started.elapsed();
    assert!(
        // Before the 10 s handshake timeout would have ended the QUIC try.
        took < Duration::from_secs(9),
        "fell back only after {took:?}"
    );
    let text = std::fs::read_to_string(dir.join("client.log")).unwrap();
    assert!(text.contains("no answer over UDP"), "{text}");
    assert!(text.contains(&format!("trying {listen_tls}")), "{text}");
    assert!(
        text.contains(&format!("session with {listen_tls} up")),
        "{text}"
    );
    let s = TcpStream::connect(("127.0.0.1", local)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    echo_bulk(&s, 1 << 20, 5);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn jmux_mode_refuses_quic_in_one_line() {
    for args in [
        &[
            "client",
            "quic://127.0.0.1:1",
            "--jmux",
            "--insecure",
            "-L",
            "1:a:1",
        ][..],
        &[
            "server",
            "--listen",
            "quic://127.0.0.1:1",
            "--jmux",
            "--insecure",
        ][..],
    ] {
        let out = std::process::Command::new(BIN).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        let line = err.lines().last().unwrap_or_default();
        assert!(
            line.contains("not QUIC") && line.contains("tls://"),
            "{err}"
        );
    }
}

/// A congestion control QUIC does not have (the system's TCP ones do not
/// apply) is refused at start, in one line that names those it has.
#[test]
fn an_unknown_congestion_control_for_quic_is_refused_in_one_line() {
    let dir = tmpdir("quic-cc");
    let key = dir.join("s.key");
    let keygen = std::process::Command::new(BIN)
        .args(["-q", "keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(keygen.status.success());
    let key = key.to_str().unwrap();
    for args in [
        &[
            "client",
            "quic://127.0.0.1:1",
            "--insecure",
            "-L",
            "1:a:1",
            "--congestion",
            "vegas",
        ][..],
        &[
            "server",
            "--listen",
            "quic://127.0.0.1:1",
            "--key",
            key,
            "--token",
            "t",
            "--allow-all",
            "--congestion",
            "vegas",
        ][..],
    ] {
        let out = std::process::Command::new(BIN).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("\"vegas\"") && err.contains("bbr (the default), cubic or reno"),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
