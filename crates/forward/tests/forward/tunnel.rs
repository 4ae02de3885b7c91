//! End-to-end forwarding over real loopback sockets.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_forward::spec::ForwardSpec;
use longhaul_forward::Client;
use longhaul_session::{Mode, SessionConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn allow(rules: &[&str]) -> Rules {
    Rules::new(rules.iter().map(|r| r.parse().unwrap()).collect(), false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_mib_both_ways_at_once() {
    const N: usize = 64 << 20;
    // Target: sends its own 64 MiB while hashing what it receives.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap();
    let down = random_bytes(N);
    let down_hash = sha(&down);
    let server_side = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        send_and_collect(s, down).await
    });
    let server = start_server(allow(&[&target.to_string()]), BindRules::default()).await;
    let client = start_client(server, &[target]).await;
    let up = random_bytes(N);
    let up_hash = sha(&up);
    let s = TcpStream::connect(client.local_addrs[0]).await.unwrap();
    let got_down = within(120, send_and_collect(s, up)).await;
    let got_up = within(30, server_side).await.unwrap();
    assert_eq!(got_down.len(), N);
    assert_eq!(sha(&got_down), down_hash, "server→client bytes differ");
    assert_eq!(got_up.len(), N);
    assert_eq!(sha(&got_up), up_hash, "client→server bytes differ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_streams_stay_intact() {
    let echo = echo_server().await;
    let server = start_server(allow(&[&echo.to_string()]), BindRules::default()).await;
    let client = start_client(server, &[echo]).await;
    let sizes = (0..100).map(|i| 64 * 1024 + i * 1000).collect();
    echo_streams(client.local_addrs[0], sizes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_keeps_the_other_direction() {
    // Target reads the whole request to EOF, then answers 1 MiB.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap();
    let reply = random_bytes(1 << 20);
    let reply_hash = sha(&reply);
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut req = Vec::new();
        s.read_to_end(&mut req).await.unwrap();
        assert_eq!(req, b"request, then EOF");
        s.write_all(&reply).await.unwrap();
    });
    let server = start_server(allow(&[&target.to_string()]), BindRules::default()).await;
    let client = start_client(server, &[target]).await;
    let mut s = TcpStream::connect(client.local_addrs[0]).await.unwrap();
    s.write_all(b"request, then EOF").await.unwrap();
    s.shutdown().await.unwrap();
    let mut got = Vec::new();
    within(20, s.read_to_end(&mut got)).await.unwrap();
    assert_eq!(sha(&got), reply_hash);
}

/// A port with nothing listening.
async fn closed_port() -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_target_closes_promptly_and_socks_says_refused() {
    let dead = closed_port().await;
    let server = start_server(allow(&[&dead.to_string()]), BindRules::default()).await;
    let mut cfg = client_config(server);
    cfg.local = vec![fwd("127.0.0.1", dead.port())];
    cfg.socks = vec!["127.0.0.1:0".parse().unwrap()];
    let client = Client::start(cfg).await.unwrap();

    let t0 = Instant::now();
    let mut s = TcpStream::connect(client.local_addrs[0]).await.unwrap();
    let mut b = [0u8; 16];
    let n = within(5, s.read(&mut b)).await.unwrap_or(0);
    assert_eq!(n, 0, "the forwarded socket must be closed");
    assert!(t0.elapsed() < Duration::from_secs(5));

    let mut s = TcpStream::connect(client.socks_addrs[0]).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut m = [0u8; 2];
    s.read_exact(&mut m).await.unwrap();
    assert_eq!(m, [5, 0]);
    let mut req = vec![5, 1, 0, 1, 127, 0, 0, 1];
    req.extend_from_slice(&dead.port().to_be_bytes());
    s.write_all(&req).await.unwrap();
    let mut rep = [0u8; 10];
    within(5, s.read_exact(&mut rep)).await.unwrap();
    assert_eq!(rep[1], 5, "SOCKS5 reply must say connection refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_consumer_stalls_only_itself() {
    // A target that accepts and never reads.
    let stall = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stall_addr = stall.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let (s, _) = stall.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(120)).await;
        drop(s);
    });
    let echo = echo_server().await;
    let server = start_server(
        allow(&[&stall_addr.to_string(), &echo.to_string()]),
        BindRules::default(),
    )
    .await;
    let client = start_client(server, &[stall_addr, echo]).await;

    // Fill the stalled stream: write until it stops accepting.
    let mut stuck = TcpStream::connect(client.local_addrs[0]).await.unwrap();
    let pushed = Arc::new(AtomicUsize::new(0));
    let p = pushed.clone();
    let writer = tokio::spawn(async move {
        let chunk = vec![7u8; 64 * 1024];
        loop {
            if stuck.write_all(&chunk).await.is_err() {
                return;
            }
            p.fetch_add(chunk.len(), Ordering::Relaxed);
        }
    });
    // Wait until it is really stuck (no progress for a while).
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = pushed.load(Ordering::Relaxed);
        if now == last && now > 0 {
            break;
        }
        last = now;
    }
    // Window + queues bound what one stalled stream can hold.
    assert!(last < 64 << 20, "stalled stream absorbed {last} bytes");

    echo_streams(client.local_addrs[1], vec![4 << 20; 10]).await;
    writer.abort();
    hold.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_by_default_contacts_nothing() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = l.local_addr().unwrap();
    let server = start_server(Rules::default(), BindRules::default()).await;
    let mut cfg = client_config(server);
    cfg.local = vec![fwd("127.0.0.1", target.port())];
    cfg.http = vec!["127.0.0.1:0".parse().unwrap()];
    let client = Client::start(cfg).await.unwrap();

    let mut s = TcpStream::connect(client.local_addrs[0]).await.unwrap();
    let mut b = [0u8; 1];
    assert_eq!(within(5, s.read(&mut b)).await.unwrap_or(0), 0);

    let mut h = TcpStream::connect(client.http_addrs[0]).await.unwrap();
    h.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut resp = String::new();
    within(5, h.read_to_string(&mut resp)).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");

    let accepted = tokio::time::timeout(Duration::from_millis(500), l.accept()).await;
    assert!(
        accepted.is_err(),
        "the refused target received a connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_forward_reaches_back_to_the_client_side() {
    let echo = echo_server().await;
    let free = closed_port().await.port();
    let server = start_server(
        Rules::default(),
        BindRules::new(vec![free.to_string().parse().unwrap()], false),
    )
    .await;
    let mut cfg = client_config(server);
    cfg.remote = vec![ForwardSpec {
        transport: longhaul_forward::spec::Transport::Tcp,
        bind: "127.0.0.1".into(),
        port: free,
        host: "127.0.0.1".into(),
        host_port: echo.port(),
    }];
    let client = Client::start(cfg).await.unwrap();
    assert_eq!(client.remote_ports, vec![free]);
    let data = random_bytes(3 << 20);
    let h = sha(&data);
    let s = TcpStream::connect(("127.0.0.1", free)).await.unwrap();
    let got = within(30, send_and_collect(s, data)).await;
    assert_eq!(sha(&got), h);

    // A port the server's rules do not allow is refused, and start fails.
    let mut cfg = client_config(server);
    cfg.remote = vec![ForwardSpec {
        transport: longhaul_forward::spec::Transport::Tcp,
        bind: "127.0.0.1".into(),
        port: free.wrapping_add(1).max(1),
        host: "127.0.0.1".into(),
        host_port: echo.port(),
    }];
    let err = Client::start(cfg)
        .await
        .err()
        .expect("bind must be refused");
    assert!(err.to_string().contains("not allowed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_domain_and_http_connect_work() {
    let echo = echo_server().await;
    let server = start_server(
        allow(&[&format!("localhost:{}", echo.port()), &echo.to_string()]),
        BindRules::default(),
    )
    .await;
    let mut cfg = client_config(server);
    cfg.socks = vec!["127.0.0.1:0".parse().unwrap()];
    cfg.http = vec!["127.0.0.1:0".parse().unwrap()];
    let client = Client::start(cfg).await.unwrap();

    let mut s = TcpStream::connect(client.socks_addrs[0]).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut m = [0u8; 2];
    s.read_exact(&mut m).await.unwrap();
    let mut req = vec![5, 1, 0, 3, 9];
    req.extend_from_slice(b"localhost");
    req.extend_from_slice(&echo.port().to_be_bytes());
    s.write_all(&req).await.unwrap();
    let mut rep = [0u8; 10];
    s.read_exact(&mut rep).await.unwrap();
    assert_eq!(rep[1], 0, "SOCKS5 CONNECT by name should succeed");
    let got = send_and_collect(s, b"through socks".to_vec()).await;
    assert_eq!(got, b"through socks");

    let mut h = TcpStream::connect(client.http_addrs[0]).await.unwrap();
    h.write_all(format!("CONNECT {echo} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = vec![0u8; 39];
    h.read_exact(&mut head).await.unwrap();
    assert_eq!(&head[..], b"HTTP/1.1 200 Connection established\r\n\r\n");
    let got = send_and_collect(h, b"through http".to_vec()).await;
    assert_eq!(got, b"through http");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jmux_mode_carries_data() {
    let echo = echo_server().await;
    let jmux = SessionConfig {
        mode: Mode::Jmux,
        ..SessionConfig::default()
    };
    let server = longhaul_forward_server_jmux(echo).await;
    let mut cfg = client_config(server);
    cfg.local = vec![fwd("127.0.0.1", echo.port())];
    cfg.session = jmux;
    let client = Client::start(cfg).await.unwrap();
    let data = random_bytes(8 << 20);
    let h = sha(&data);
    let s = TcpStream::connect(client.local_addrs[0]).await.unwrap();
    let got = within(30, send_and_collect(s, data)).await;
    assert_eq!(sha(&got), h);
}

async fn longhaul_forward_server_jmux(target: std::net::SocketAddr) -> std::net::SocketAddr {
    start_server_with(
        allow(&[&target.to_string()]),
        BindRules::default(),
        SessionConfig {
            mode: Mode::Jmux,
            ..SessionConfig::default()
        },
    )
    .await
}
