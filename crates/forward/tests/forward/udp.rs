//! UDP forwards over real sockets: datagrams keep their boundaries, each
//! source gets its own answers, the rules refuse what they do not allow,
//! `-R udp:` reaches back, and JMUX mode refuses UDP with one line.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_forward::spec::{parse_forward, ForwardSpec};
use longhaul_forward::Client;
use tokio::net::UdpSocket;

fn allow(rules: &[&str]) -> Rules {
    Rules::new(rules.iter().map(|r| r.parse().unwrap()).collect(), false)
}

/// A UDP service that answers each datagram with its SHA-256 and then the
/// datagram itself (so a reply proves which datagram it answers, whole);
/// counts what it got.
async fn udp_echo() -> (SocketAddr, Arc<AtomicU64>) {
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = s.local_addr().unwrap();
    let got = Arc::new(AtomicU64::new(0));
    let count = got.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        loop {
            let Ok((n, from)) = s.recv_from(&mut buf).await else {
                continue;
            };
            count.fetch_add(1, Ordering::Relaxed);
            let mut reply = sha(&buf[..n]).to_vec();
            // Room for the hash: the largest datagrams are answered with it alone.
            if n + 32 <= 65_507 {
                reply.extend_from_slice(&buf[..n]);
            }
            let _ = s.send_to(&reply, from).await;
        }
    });
    (addr, got)
}

fn udp_fwd(spec: &str, flag: &str) -> ForwardSpec {
    parse_forward(spec, flag).unwrap()
}

/// Sends `d` from `s` to `to` and waits for its answer (retrying a few
/// times: UDP may drop, even on loopback, while a flow opens).
async fn ask(s: &UdpSocket, to: SocketAddr, d: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 65_535];
    for _ in 0..5 {
        s.send_to(d, to).await.unwrap();
        if let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_secs(2), s.recv_from(&mut buf)).await
        {
            return buf[..n].to_vec();
        }
    }
    panic!("no answer through the UDP forward");
}

fn check_answer(d: &[u8], answer: &[u8]) {
    assert_eq!(&answer[..32], &sha(d)[..], "an answer to another datagram");
    if d.len() + 32 <= 65_507 {
        assert_eq!(&answer[32..], d, "datagram changed on its way");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_cross_a_udp_forward_whole_and_answers_go_to_their_source() {
    let (echo, _) = udp_echo().await;
    let server = start_server(
        allow(&[&format!("udp:127.0.0.1:{}", echo.port())]),
        BindRules::default(),
    )
    .await;
    let mut cfg = client_config(server);
    cfg.local = vec![udp_fwd(&format!("udp:0:127.0.0.1:{}", echo.port()), "-L")];
    let client = Client::start(cfg).await.unwrap();
    let fwd = client.local_addrs[0];
    // Three sources, each its own flow; sizes from empty to the largest
    // datagram IPv4 carries.
    let sources = [
        UdpSocket::bind("127.0.0.1:0").await.unwrap(),
        UdpSocket::bind("127.0.0.1:0").await.unwrap(),
        UdpSocket::bind("127.0.0.1:0").await.unwrap(),
    ];
    for size in [0usize, 1, 512, 1400, 9000, 65_507] {
        for (k, s) in sources.iter().enumerate() {
            let d = random_bytes(size.saturating_sub(k));
            let answer = within(20, ask(s, fwd, &d)).await;
            check_answer(&d, &answer);
        }
    }
    // Many at once from one source, answered in any order but every one
    // whole.
    let s = &sources[0];
    let mut sent = std::collections::HashSet::new();
    for _ in 0..50 {
        let d = random_bytes(200);
        s.send_to(&d, fwd).await.unwrap();
        sent.insert(sha(&d));
    }
    let mut buf = vec![0u8; 65_535];
    let mut answered = 0;
    while let Ok(Ok((n, _))) =
        tokio::time::timeout(Duration::from_secs(2), s.recv_from(&mut buf)).await
    {
        let hash: [u8; 32] = buf[..32].try_into().unwrap();
        assert!(sent.contains(&hash), "an answer to nothing sent");
        assert_eq!(sha(&buf[32..n]), hash);
        answered += 1;
        if answered == sent.len() {
            break;
        }
    }
    // Loopback drops nothing at this rate.
    assert_eq!(answered, sent.len());
    // The session counts them (`status`, metrics).
    let d = client.session().stats().datagrams;
    assert!(d.sent >= 68 && d.received >= 68, "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_refuse_a_udp_destination_they_do_not_allow() {
    logs();
    let (echo, got) = udp_echo().await;
    // TCP to the same port is allowed, and UDP to another: neither lets
    // this flow through.
    let server = start_server(
        allow(&[
            &format!("127.0.0.1:{}", echo.port()),
            &format!("udp:127.0.0.1:{}", echo.port().wrapping_add(1)),
        ]),
        BindRules::default(),
    )
    .await;
    let mut cfg = client_config(server);
    cfg.local = vec![udp_fwd(&format!("udp:0:127.0.0.1:{}", echo.port()), "-L")];
    let client = Client::start(cfg).await.unwrap();
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut buf = [0u8; 100];
    for _ in 0..3 {
        s.send_to(b"let me in", client.local_addrs[0])
            .await
            .unwrap();
        let r = tokio::time::timeout(Duration::from_millis(700), s.recv_from(&mut buf)).await;
        assert!(r.is_err(), "a refused flow was answered");
    }
    assert_eq!(got.load(Ordering::Relaxed), 0, "the target got a datagram");
    // The refusal is logged, once for a while.
    wait_log("UDP flow refused").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reverse_udp_forward_reaches_back_to_the_client_side() {
    let (echo, _) = udp_echo().await;
    let port = {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        s.local_addr().unwrap().port()
    };
    // A TCP bind rule for the port does not let a UDP listener bind it.
    let server = start_server(
        Rules::default(),
        BindRules::new(vec![port.to_string().parse().unwrap()], false),
    )
    .await;
    let mut cfg = client_config(server);
    let spec = udp_fwd(&format!("udp:{port}:127.0.0.1:{}", echo.port()), "-R");
    cfg.remote = vec![spec.clone()];
    let err = Client::start(cfg)
        .await
        .err()
        .expect("a TCP rule bound UDP");
    assert!(err.to_string().contains("not allowed"), "{err}");
    let server = start_server(
        Rules::default(),
        BindRules::new(vec![format!("udp:{port}").parse().unwrap()], false),
    )
    .await;
    let mut cfg = client_config(server);
    cfg.remote = vec![spec];
    let client = Client::start(cfg).await.unwrap();
    assert_eq!(client.remote_ports, vec![port]);
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for size in [1usize, 1200, 30_000] {
        let d = random_bytes(size);
        let answer = within(20, ask(&s, ([127, 0, 0, 1], port).into(), &d)).await;
        check_answer(&d, &answer);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jmux_mode_refuses_udp_forwards_with_one_line() {
    let server = start_server(Rules::default(), BindRules::default()).await;
    let mut cfg = client_config(server);
    cfg.session.mode = longhaul_session::Mode::Jmux;
    cfg.local = vec![udp_fwd("udp:0:127.0.0.1:53", "-L")];
    let err = Client::start(cfg).await.err().expect("refused");
    let e = err.to_string();
    assert!(
        e.contains("UDP") && e.contains("--jmux") && !e.contains('\n'),
        "{e}"
    );
}

/// A SOCKS5 client's UDP ASSOCIATE: the control connection and the relay
/// address the proxy answered with.
async fn associate(proxy: SocketAddr) -> (tokio::net::TcpStream, SocketAddr) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(proxy).await.unwrap();
    c.write_all(&[5, 1, 0]).await.unwrap();
    let mut m = [0u8; 2];
    c.read_exact(&mut m).await.unwrap();
    assert_eq!(m, [5, 0]);
    c.write_all(&[5, 3, 0, 1, 0, 0, 0, 0, 0, 0]).await.unwrap();
    let mut r = [0u8; 10];
    c.read_exact(&mut r).await.unwrap();
    assert_eq!(&r[..4], &[5, 0, 0, 1], "UDP ASSOCIATE refused");
    let ip = std::net::Ipv4Addr::new(r[4], r[5], r[6], r[7]);
    (
        c,
        SocketAddr::new(ip.into(), u16::from_be_bytes([r[8], r[9]])),
    )
}

/// A SOCKS5 UDP request header for `host:port` (a name or an IPv4).
fn socks_header(frag: u8, host: &str, port: u16) -> Vec<u8> {
    let mut h = vec![0, 0, frag];
    match host.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => {
            h.push(1);
            h.extend_from_slice(&ip.octets());
        }
        Err(_) => {
            h.push(3);
            h.push(host.len() as u8);
            h.extend_from_slice(host.as_bytes());
        }
    }
    h.extend_from_slice(&port.to_be_bytes());
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_udp_associate_relays_datagrams_and_ends_with_its_connection() {
    let (echo, got) = udp_echo().await;
    let (other, other_got) = udp_echo().await;
    let server = start_server(
        allow(&[
            &format!("udp:127.0.0.1:{}", echo.port()),
            &format!("udp:localhost:{}", echo.port()),
        ]),
        BindRules::default(),
    )
    .await;
    let mut cfg = client_config(server);
    cfg.socks = vec!["127.0.0.1:0".parse().unwrap()];
    let client = Client::start(cfg).await.unwrap();
    let (ctl, relay) = within(10, associate(client.socks_addrs[0])).await;
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // By address and by name: the answer comes back with the header of
    // the destination it came from.
    for host in ["127.0.0.1", "localhost"] {
        for size in [0usize, 700, 30_000] {
            let d = random_bytes(size);
            let header = socks_header(0, host, echo.port());
            let mut q = header.clone();
            q.extend_from_slice(&d);
            let answer = within(20, ask(&s, relay, &q)).await;
            assert_eq!(&answer[..header.len()], &header[..], "the answer's header");
            check_answer(&d, &answer[header.len()..]);
        }
    }
    // A fragment is dropped; a destination the rules refuse gets nothing.
    let mut buf = [0u8; 100];
    let before = got.load(Ordering::Relaxed);
    let mut frag = socks_header(1, "127.0.0.1", echo.port());
    frag.extend_from_slice(b"part");
    let mut refused = socks_header(0, "127.0.0.1", other.port());
    refused.extend_from_slice(b"let me in");
    for q in [frag, refused] {
        s.send_to(&q, relay).await.unwrap();
        let r = tokio::time::timeout(Duration::from_millis(700), s.recv_from(&mut buf)).await;
        assert!(r.is_err(), "answered");
    }
    assert_eq!(
        got.load(Ordering::Relaxed),
        before,
        "a fragment went through"
    );
    assert_eq!(
        other_got.load(Ordering::Relaxed),
        0,
        "a refused flow went through"
    );
    // Another socket than the client's first is not the client.
    let stranger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut q = socks_header(0, "127.0.0.1", echo.port());
    q.extend_from_slice(b"me too");
    stranger.send_to(&q, relay).await.unwrap();
    let r = tokio::time::timeout(Duration::from_millis(700), stranger.recv_from(&mut buf)).await;
    assert!(r.is_err(), "a stranger was relayed");
    // Closing the control connection ends the association.
    drop(ctl);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = got.load(Ordering::Relaxed);
    s.send_to(&q, relay).await.unwrap();
    let r = tokio::time::timeout(Duration::from_millis(700), s.recv_from(&mut buf)).await;
    assert!(r.is_err(), "relayed after the association ended");
    assert_eq!(got.load(Ordering::Relaxed), before);
}

/// Asks for a UDP association naming `0.0.0.0:port` as where the client
/// will send from.
async fn associate_from(proxy: SocketAddr, port: u16) -> (tokio::net::TcpStream, SocketAddr) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(proxy).await.unwrap();
    c.write_all(&[5, 1, 0]).await.unwrap();
    let mut m = [0u8; 2];
    c.read_exact(&mut m).await.unwrap();
    let p = port.to_be_bytes();
    c.write_all(&[5, 3, 0, 1, 0, 0, 0, 0, p[0], p[1]])
        .await
        .unwrap();
    let mut r = [0u8; 10];
    c.read_exact(&mut r).await.unwrap();
    assert_eq!(&r[..4], &[5, 0, 0, 1], "UDP ASSOCIATE refused");
    let ip = std::net::Ipv4Addr::new(r[4], r[5], r[6], r[7]);
    (
        c,
        SocketAddr::new(ip.into(), u16::from_be_bytes([r[8], r[9]])),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socks5_association_is_not_taken_by_another_local_program() {
    let (echo, _got) = udp_echo().await;
    let server = start_server(
        allow(&[&format!("udp:127.0.0.1:{}", echo.port())]),
        BindRules::default(),
    )
    .await;
    let mut cfg = client_config(server);
    cfg.socks = vec!["127.0.0.1:0".parse().unwrap()];
    let client = Client::start(cfg).await.unwrap();
    let proxy = client.socks_addrs[0];
    let mut query = socks_header(0, "127.0.0.1", echo.port());
    query.extend_from_slice(b"mine");
    let mut buf = [0u8; 100];

    // The client named 0.0.0.0:0: junk sent first by another program on
    // the same address does not take the association.
    let (_ctl, relay) = within(10, associate(proxy)).await;
    let intruder = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    intruder.send_to(b"junk", relay).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let answer = within(20, ask(&s, relay, &query)).await;
    check_answer(b"mine", &answer[query.len() - 4..]);
    // Bound to the client now: the intruder's well-formed datagram gets
    // nothing.
    intruder.send_to(&query, relay).await.unwrap();
    let r = tokio::time::timeout(Duration::from_millis(700), intruder.recv_from(&mut buf)).await;
    assert!(r.is_err(), "the intruder was answered");

    // The client named the port it sends from: a well-formed datagram
    // from another port, sent first, gets nothing and takes nothing.
    let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = s.local_addr().unwrap().port();
    let (_ctl2, relay) = within(10, associate_from(proxy, port)).await;
    intruder.send_to(&query, relay).await.unwrap();
    let r = tokio::time::timeout(Duration::from_millis(700), intruder.recv_from(&mut buf)).await;
    assert!(r.is_err(), "the intruder was answered");
    let answer = within(20, ask(&s, relay, &query)).await;
    check_answer(b"mine", &answer[query.len() - 4..]);
}
