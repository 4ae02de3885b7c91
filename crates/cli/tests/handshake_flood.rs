//! Connections that never finish their handshake must not keep an
//! authenticated client out: they wait in a bounded table of their own
//! (per source address and in total), the oldest dropped when it is full,
//! and take a session slot only once authenticated.

mod common;

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

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
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
