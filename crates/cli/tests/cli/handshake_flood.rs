//! Connections that never finish their handshake must not keep an
//! authenticated client out: they wait in a bounded table of their own
//! (per source address and in total), the oldest dropped when it is full,
//! and take a session slot only once authenticated.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;

/// A connection from `from` (another loopback address than the client's)
/// that sends nothing, or the first bytes of a TLS ClientHello.
fn idle_connection(from: &str, to: u16, half_hello: bool) -> Option<TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    sock.bind(&from.parse::<SocketAddr>().unwrap().into())
        .ok()?;
    sock.connect(&SocketAddr::from(([127, 0, 0, 1], to)).into())
        .ok()?;
    let mut s: TcpStream = sock.into();
    if half_hello {
        // A handshake record header announcing 512 bytes, and 5 of them.
        let _ = s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03]);
    }
    Some(s)
}

#[test]
fn a_flood_of_unfinished_handshakes_does_not_keep_a_real_client_out() {
    let dir = tmpdir("flood");
    let fp = keygen(&dir.join("server.key"));
    let ck = keygen(&dir.join("client.key"));
    std::fs::write(dir.join("authorized_keys"), format!("{ck}\n")).unwrap();
    let tport = echo_target();
    let sport = free_port();
    let server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("127.0.0.1:{sport}"),
            "--key",
            dir.join("server.key").to_str().unwrap(),
            "--authorized-keys",
            dir.join("authorized_keys").to_str().unwrap(),
            "--allow",
            &format!("127.0.0.1:{tport}"),
            // Few session slots, so that the flood below would take all
            // of them if handshakes held slots.
            "--max-sessions",
            "64",
            "--handshake-timeout",
            "30s",
            "--control",
            "none",
        ],
        &dir.join("server.log"),
    );
    wait_port(sport);
    // 400 connections from 127.0.0.2 that never finish their handshake,
    // kept open while a real client connects.
    let mut flood: Vec<TcpStream> = (0..400)
        .filter_map(|i| idle_connection("127.0.0.2:0", sport, i % 2 == 0))
        .collect();
    assert!(flood.len() > 300, "only {} connections", flood.len());
    std::thread::sleep(Duration::from_millis(300));
    // The server holds only a bounded number of them: 32 from that
    // address, each a socket and the two duplicates a TLS carrier keeps
    // (path probe, urgent sends), beside its own dozen or so.
    let fds = open_fds(server.pid());
    assert!(fds < 3 * 32 + 40, "server holds {fds} descriptors");

    let lport = free_port();
    let mut client = spawn_logged(
        &[
            "client",
            &format!("127.0.0.1:{sport}"),
            "--key",
            dir.join("client.key").to_str().unwrap(),
            "--pin",
            &fp,
            "--no-reconnect",
            "-L",
            &format!("{lport}:127.0.0.1:{tport}"),
            "--control",
            "none",
        ],
        &dir.join("client.log"),
    );
    wait_port(lport);
    // More of the flood while the session runs.
    flood.extend((0..200).filter_map(|_| idle_connection("127.0.0.2:0", sport, false)));
    let mut s = TcpStream::connect(("127.0.0.1", lport)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"through the flood").unwrap();
    let mut b = [0u8; 17];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"through the flood");
    assert!(
        client.0.try_wait().unwrap().is_none(),
        "{}",
        std::fs::read_to_string(dir.join("client.log")).unwrap()
    );
    drop(flood);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A raw peer of a `tcp://` server: the empty authentication preamble
/// (anonymous, `--insecure`), then `then`.
fn raw_peer(from: &str, to: u16, then: &[u8]) -> Option<TcpStream> {
    let mut s = idle_connection(from, to, false)?;
    let mut first = longhaul_forward::auth::preamble(None).unwrap();
    first.extend_from_slice(then);
    s.write_all(&first).ok()?;
    Some(s)
}

/// Our hello, offering resume (`resume`) or not.
fn hello(resume: bool) -> Vec<u8> {
    use longhaul_proto::handshake::{Hello, FEATURE_INSTANCE, FEATURE_RESUME};
    let mut h = Hello::ours(u16::MAX);
    if resume {
        h.features |= FEATURE_RESUME;
    } else {
        h.features &= !FEATURE_RESUME;
    }
    h.features &= !FEATURE_INSTANCE;
    h.encode().to_vec()
}

fn insecure_server(dir: &std::path::Path, sport: u16, tport: u16, extra: &[&str]) -> Kill {
    let listen = format!("tcp://127.0.0.1:{sport}");
    let allow = format!("127.0.0.1:{tport}");
    let mut args = vec![
        "server",
        "--listen",
        &listen,
        "--insecure",
        "--allow",
        &allow,
        "--control",
        "none",
    ];
    args.extend_from_slice(extra);
    let s = spawn_logged(&args, &dir.join("server.log"));
    wait_port(sport);
    s
}

#[test]
fn authenticated_carriers_that_start_no_session_are_bounded_and_timed_from_accept() {
    let dir = tmpdir("flood-authed");
    let tport = echo_target();
    let sport = free_port();
    let server = insecure_server(
        &dir,
        sport,
        tport,
        &["--max-sessions", "64", "--handshake-timeout", "3s"],
    );
    // 300 carriers from 127.0.0.2 that authenticate (the preamble), half
    // of them say hello too, and then nothing: each is pending until it
    // is a session, so they displace one another.
    let flood: Vec<TcpStream> = (0..300)
        .filter_map(|i| {
            let then = if i % 2 == 0 { vec![] } else { hello(true) };
            raw_peer("127.0.0.2:0", sport, &then)
        })
        .collect();
    assert!(flood.len() > 250, "only {} connections", flood.len());
    std::thread::sleep(Duration::from_millis(500));
    let fds = open_fds(server.pid());
    assert!(fds < 3 * 32 + 40, "server holds {fds} descriptors");

    // One deadline from accept to a running session: a carrier that
    // authenticates late and says hello later still is closed when its
    // first --handshake-timeout is over, not a fresh one per stage.
    let accepted = std::time::Instant::now();
    let mut slow = idle_connection("127.0.0.3:0", sport, false).unwrap();
    std::thread::sleep(Duration::from_millis(1800));
    slow.write_all(&longhaul_forward::auth::preamble(None).unwrap())
        .unwrap();
    std::thread::sleep(Duration::from_millis(900));
    let _ = slow.write_all(&hello(true));
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut sink = Vec::new();
    let _ = slow.read_to_end(&mut sink);
    let held = accepted.elapsed();
    assert!(
        held < Duration::from_millis(3800),
        "a carrier was held {held:?} with --handshake-timeout 3s"
    );

    // A real client still gets through.
    let lport = free_port();
    let _client = spawn_logged(
        &[
            "client",
            &format!("tcp://127.0.0.1:{sport}"),
            "--insecure",
            "--no-reconnect",
            "-L",
            &format!("{lport}:127.0.0.1:{tport}"),
            "--control",
            "none",
        ],
        &dir.join("client.log"),
    );
    wait_port(lport);
    let mut s = TcpStream::connect(("127.0.0.1", lport)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"through").unwrap();
    let mut b = [0u8; 7];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"through");
    drop(flood);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_session_refused_for_the_session_limit_acts_on_nothing_it_pipelined() {
    use longhaul_proto::frame::Frame;
    use longhaul_proto::handshake::HELLO_LEN;
    use longhaul_proto::resume::{Attach, Attached, Refusal, ATTACHED_LEN};
    let dir = tmpdir("flood-refused");
    // A target that counts the connections it gets.
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tport = target.local_addr().unwrap().port();
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = reached.clone();
    std::thread::spawn(move || {
        for c in target.incoming() {
            r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::mem::forget(c);
        }
    });
    let sport = free_port();
    let _server = insecure_server(&dir, sport, tport, &["--max-sessions", "1"]);
    // One session holds the only slot.
    let mut holder = raw_peer("127.0.0.1:0", sport, &hello(false)).unwrap();
    let mut h = [0u8; HELLO_LEN];
    holder.read_exact(&mut h).unwrap();
    wait_until(10, "the first session", || {
        std::fs::read_to_string(dir.join("server.log")).is_ok_and(|l| l.contains("session started"))
    });
    // Then sessions that ask and at once pipeline OPENs to the target.
    let mut opens = bytes::BytesMut::new();
    for i in 0..5 {
        Frame::Open {
            sender: i,
            window: 1 << 16,
            max_packet: 4096,
            dest: format!("tcp://127.0.0.1:{tport}"),
        }
        .encode(&mut opens)
        .unwrap();
    }
    let mut refused = 0;
    for i in 0..10 {
        let resume = i % 2 == 0;
        let mut ask = hello(resume);
        if resume {
            let new = Attach::New {
                replay_limit: 1 << 24,
                lanes: 0,
                share: [9; 32],
            };
            ask.extend_from_slice(&new.encode());
        }
        ask.extend_from_slice(&opens);
        let mut s = raw_peer("127.0.0.1:0", sport, &ask).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut h = [0u8; HELLO_LEN];
        s.read_exact(&mut h).unwrap();
        if resume {
            let mut b = [0u8; ATTACHED_LEN];
            s.read_exact(&mut b).unwrap();
            assert_eq!(
                Attached::decode(&b).unwrap(),
                Attached::Refused(Refusal::Busy),
                "a resumable session past --max-sessions is told why"
            );
            refused += 1;
        }
        // Then the carrier is closed, unread.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    assert_eq!(refused, 5);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "refused sessions connected to the target"
    );
    drop(holder);
    let _ = std::fs::remove_dir_all(&dir);
}
