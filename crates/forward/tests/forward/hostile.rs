//! Hostile peers against a live server: each must lose its session (with a
//! log line saying why) while a well-behaved client keeps working.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_proto::frame::{self, DecodeLimits, Frame};
use longhaul_session::SessionConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The server must drop the connection: EOF or reset, within a few seconds.
async fn assert_dropped(mut s: TcpStream) {
    let mut buf = vec![0u8; 1 << 16];
    let r = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(r.is_ok(), "server kept the hostile session open");
}

async fn read_frame(s: &mut TcpStream, buf: &mut BytesMut) -> Frame {
    loop {
        if let Some(f) = frame::decode(buf, DecodeLimits::default()).unwrap() {
            return f;
        }
        let n = s.read_buf(buf).await.unwrap();
        assert!(n > 0, "server closed unexpectedly");
    }
}

async fn good_client_works(server: SocketAddr, echo: SocketAddr) {
    let client = start_client(server, &[echo]).await;
    let data = random_bytes(1 << 20);
    let h = sha(&data);
    let s = TcpStream::connect(client.local_addrs[0]).await.unwrap();
    let got = within(20, send_and_collect(s, data)).await;
    assert_eq!(sha(&got), h);
}

async fn setup(session: SessionConfig) -> (SocketAddr, SocketAddr) {
    logs();
    let echo = echo_server().await;
    let rules = Rules::new(vec![echo.to_string().parse().unwrap()], false);
    let server = start_server_with(rules, BindRules::default(), session).await;
    (server, echo)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_for_unknown_channel() {
    let (server, echo) = setup(SessionConfig::default()).await;
    let mut s = native_peer(server).await;
    let f = Frame::Data {
        recipient: 4242,
        payload: bytes::Bytes::from_static(b"boo"),
    };
    s.write_all(&f.to_bytes().unwrap()).await.unwrap();
    assert_dropped(s).await;
    wait_log("DATA for unknown stream 4242").await;
    good_client_works(server, echo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_overrun() {
    logs();
    // A target that never reads, so the server returns no credit at all.
    let sink = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink_addr = sink.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = vec![];
        while let Ok((c, _)) = sink.accept().await {
            held.push(c);
        }
    });
    let echo = echo_server().await;
    let rules = Rules::new(
        vec![
            echo.to_string().parse().unwrap(),
            sink_addr.to_string().parse().unwrap(),
        ],
        false,
    );
    let server = start_server_with(rules, BindRules::default(), SessionConfig::default()).await;
    let good = start_client(server, &[echo]).await;
    let mut s = native_peer(server).await;
    let open = Frame::Open {
        sender: 1,
        window: 1 << 20,
        max_packet: u16::MAX,
        dest: format!("tcp://{sink_addr}"),
    };
    s.write_all(&open.to_bytes().unwrap()).await.unwrap();
    let mut buf = BytesMut::new();
    let (remote, window) = loop {
        match read_frame(&mut s, &mut buf).await {
            Frame::OpenSuccess { sender, window, .. } => break (sender, window),
            Frame::Ping { .. } => continue,
            other => panic!("expected OPEN_SUCCESS, got {other:?}"),
        }
    };
    // Send more than the window (plus what the target's socket buffers can
    // absorb, which earns honest credit) without waiting for credit.
    let mut sent = 0usize;
    let chunk = bytes::Bytes::from(vec![1u8; frame::MAX_DATA_PAYLOAD]);
    while sent <= window as usize + (64 << 20) {
        let f = Frame::Data {
            recipient: remote,
            payload: chunk.clone(),
        };
        if s.write_all(&f.to_bytes().unwrap()).await.is_err() {
            break;
        }
        sent += chunk.len();
    }
    assert_dropped(s).await;
    wait_log("window overrun").await;
    // The client that was connected all along still works.
    let data = random_bytes(1 << 20);
    let h = sha(&data);
    let c = TcpStream::connect(good.local_addrs[0]).await.unwrap();
    assert_eq!(sha(&within(20, send_and_collect(c, data)).await), h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_larger_than_allowed() {
    let cfg = SessionConfig {
        max_frame: 16 * 1024,
        ..SessionConfig::default()
    };
    let (server, echo) = setup(cfg).await;
    let mut s = native_peer(server).await;
    // Header declaring a 40 000-byte DATA frame; the body never needs to come.
    s.write_all(&[104, 0x9c, 0x40, 0, 0, 0, 0, 1])
        .await
        .unwrap();
    assert_dropped(s).await;
    wait_log("exceeds the limit of 16384").await;
    good_client_works(server, echo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_frame_and_garbage() {
    let (server, echo) = setup(SessionConfig::default()).await;
    let mut s = native_peer(server).await;
    // WINDOW_ADJUST whose declared size leaves no room for its fields.
    s.write_all(&[103, 0, 6, 0, 0, 0]).await.unwrap();
    assert_dropped(s).await;
    wait_log("WINDOW_ADJUST message truncated").await;

    // Random bytes: more than the largest frame, so whatever sizes they
    // declare, frames complete and an invalid one soon follows (4 KiB could
    // leave the server rightly waiting for the rest of a declared frame).
    let mut s = native_peer(server).await;
    s.write_all(&random_bytes(256 * 1024)).await.ok();
    assert_dropped(s).await;

    // Not even the authentication preamble: refused before anything else.
    let mut s = TcpStream::connect(server).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_dropped(s).await;
    wait_log("bad authentication preamble").await;

    // A preamble but no hello: refused at the handshake.
    let mut s = TcpStream::connect(server).await.unwrap();
    s.write_all(&longhaul_forward::auth::preamble(None).unwrap())
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_dropped(s).await;
    wait_log("not a longhaul native peer").await;
    good_client_works(server, echo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_flood_beyond_stream_limit_is_refused() {
    let cfg = SessionConfig {
        max_streams: 8,
        ..SessionConfig::default()
    };
    let (server, echo) = setup(cfg).await;
    let mut s = native_peer(server).await;
    for i in 0..20u32 {
        let open = Frame::Open {
            sender: i,
            window: 1 << 16,
            max_packet: u16::MAX,
            dest: format!("tcp://{echo}"),
        };
        s.write_all(&open.to_bytes().unwrap()).await.unwrap();
    }
    let mut buf = BytesMut::new();
    let (mut ok, mut refused) = (0, 0);
    while ok + refused < 20 {
        match within(10, read_frame(&mut s, &mut buf)).await {
            Frame::OpenSuccess { .. } => ok += 1,
            Frame::OpenFailure { description, .. } => {
                assert_eq!(description, "too many streams");
                refused += 1
            }
            _ => {}
        }
    }
    assert_eq!((ok, refused), (8, 12));
    wait_log("stream limit reached").await;
    good_client_works(server, echo).await;
}
