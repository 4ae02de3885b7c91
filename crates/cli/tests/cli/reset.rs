//! A connection that ends with a reset (RST) reaches the other end as a
//! reset, after every byte sent before it; a graceful close stays a clean
//! end of data. Through `-L`, `-R`, SOCKS5 (`-D`) and HTTP CONNECT, with
//! real server and client processes.

use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use common::*;
use sha2::{Digest, Sha256};

const N: usize = 100_000;

fn payload() -> Vec<u8> {
    (0..N).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// How a connection's incoming data ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Clean,
    Reset,
    Other(String),
}

/// Reads until the data ends; the bytes and how they ended.
fn read_all(s: &mut TcpStream) -> (Vec<u8>, End) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let mut b = vec![0u8; 16 * 1024];
    loop {
        match s.read(&mut b) {
            Ok(0) => return (got, End::Clean),
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (got, End::Reset),
            Err(e) => return (got, End::Other(e.to_string())),
        }
    }
}

/// Sends `data`, then ends the connection: with a reset (SO_LINGER 0) or
/// with a normal close. Waits a little first so the bytes leave the socket
/// (a reset discards what is still unsent, direct or not).
fn send_then_end(mut s: TcpStream, data: &[u8], reset: bool) {
    s.write_all(data).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    if reset {
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
    }
    drop(s);
}

/// A target that, per connection, either sends the payload and ends it
/// (`send`), or reads everything it is sent and reports it on the channel.
fn target(send: Option<bool>) -> (u16, std::sync::mpsc::Receiver<(Vec<u8>, End)>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || match send {
                Some(reset) => send_then_end(s, &payload(), reset),
                None => {
                    // Connections that carry nothing are the set-up's
                    // checks that a port listens.
                    let r = read_all(&mut s);
                    if !r.0.is_empty() {
                        let _ = tx.send(r);
                    }
                }
            });
        }
    });
    (port, rx)
}

struct Tunnel {
    _server: Kill,
    _client: Kill,
    local: u16,
    remote: u16,
    socks: u16,
    http: u16,
    _dir: RemovedOnDrop,
}

/// A server and a client with `-L local → target`, `-R remote → target`,
/// `-D socks` and `--http-proxy http`.
fn tunnel(name: &str, tport: u16) -> Tunnel {
    let dir = tmpdir(name);
    let sport = free_port();
    let (local, remote, socks, http) = (free_port(), free_port(), free_port(), free_port());
    let server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("tcp://127.0.0.1:{sport}"),
            "--insecure",
            "--allow",
            &format!("127.0.0.1:{tport}"),
            "--allow-bind",
            &remote.to_string(),
        ],
        &dir.join("server.log"),
    );
    wait_port(sport);
    let client = spawn_logged(
        &[
            "client",
            &format!("tcp://127.0.0.1:{sport}"),
            "--insecure",
            "-L",
            &format!("{local}:127.0.0.1:{tport}"),
            "-R",
            &format!("{remote}:127.0.0.1:{tport}"),
            "-D",
            &socks.to_string(),
            "--http-proxy",
            &http.to_string(),
        ],
        &dir.join("client.log"),
    );
    for p in [local, remote, socks, http] {
        wait_port(p);
    }
    Tunnel {
        _server: server,
        _client: client,
        local,
        remote,
        socks,
        http,
        _dir: RemovedOnDrop(dir),
    }
}

/// A connection to the target through SOCKS5 (no authentication, CONNECT
/// to 127.0.0.1:tport).
fn via_socks(socks: u16, tport: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", socks)).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut b = [0u8; 2];
    s.read_exact(&mut b).unwrap();
    assert_eq!(b, [5, 0]);
    let mut req = vec![5, 1, 0, 1, 127, 0, 0, 1];
    req.extend_from_slice(&tport.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep).unwrap();
    assert_eq!(rep[1], 0, "SOCKS5 reply {rep:?}");
    s
}

/// A connection to the target through HTTP CONNECT.
fn via_http(http: u16, tport: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", http)).unwrap();
    write!(
        s,
        "CONNECT 127.0.0.1:{tport} HTTP/1.1\r\nHost: 127.0.0.1:{tport}\r\n\r\n"
    )
    .unwrap();
    // Read the answer's head byte by byte, so nothing after it is taken.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

/// One way of reaching the target through the tunnel.
type Connect = fn(&Tunnel, u16) -> TcpStream;

/// -L, -R, SOCKS5 and HTTP CONNECT.
fn ways() -> [(&'static str, Connect); 4] {
    [
        ("-L", |t, _| {
            TcpStream::connect(("127.0.0.1", t.local)).unwrap()
        }),
        ("-R", |t, _| {
            TcpStream::connect(("127.0.0.1", t.remote)).unwrap()
        }),
        ("SOCKS5", |t, p| via_socks(t.socks, p)),
        ("HTTP CONNECT", |t, p| via_http(t.http, p)),
    ]
}

fn check(what: &str, (got, end): (Vec<u8>, End), want: End) {
    assert_eq!(got.len(), N, "{what}: bytes before the end");
    assert_eq!(
        Sha256::digest(&got),
        Sha256::digest(payload()),
        "{what}: bytes differ"
    );
    assert_eq!(end, want, "{what}: how the data ended");
}

#[test]
fn a_target_reset_reaches_the_application_as_a_reset() {
    let (tport, _) = target(Some(true));
    let t = tunnel("reset-down", tport);
    let ways = ways();
    for (what, connect) in ways {
        let mut s = connect(&t, tport);
        check(what, read_all(&mut s), End::Reset);
    }
}

#[test]
fn an_application_reset_reaches_the_target_as_a_reset() {
    let (tport, got) = target(None);
    let t = tunnel("reset-up", tport);
    let ways = ways();
    for (what, connect) in ways {
        let s = connect(&t, tport);
        send_then_end(s, &payload(), true);
        let r = got.recv_timeout(Duration::from_secs(20)).unwrap();
        check(what, r, End::Reset);
    }
}

#[test]
fn a_graceful_close_stays_a_clean_end_both_ways() {
    let (tport, _) = target(Some(false));
    let t = tunnel("close-down", tport);
    let mut s = TcpStream::connect(("127.0.0.1", t.local)).unwrap();
    check("-L, target closes", read_all(&mut s), End::Clean);

    let (tport, got) = target(None);
    let t = tunnel("close-up", tport);
    let s = TcpStream::connect(("127.0.0.1", t.local)).unwrap();
    send_then_end(s, &payload(), false);
    let r = got.recv_timeout(Duration::from_secs(20)).unwrap();
    check("-L, application closes", r, End::Clean);
}
