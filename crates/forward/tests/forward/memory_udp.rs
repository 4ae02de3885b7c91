//! What UDP flows can make the server hold (peak RSS; this test runs alone
//! in its process): an authenticated peer that floods datagrams to a
//! destination that never reads, a destination that floods datagrams
//! back to a peer that never reads its carrier, and thousands of idle
//! flows. Datagrams are never queued at the far side, and at most
//! `DATAGRAM_QUEUE` of them towards the peer: nothing grows with what is
//! sent.

use crate::common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_proto::frame::{self, DecodeLimits, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a flood may leave behind at most: allocator slack, buffers of
/// fixed size (carrier reads, 64 KiB per flow reading), the 256 KiB
/// datagram queue.
const ALLOWANCE: u64 = 32 << 20;
/// Bytes of datagrams the peer pushes.
const FLOOD: usize = 256 << 20;
/// Idle flows opened at the end, and what each may cost.
const IDLE_FLOWS: u32 = 2_000;
const PER_IDLE_FLOW: u64 = 8 << 10;

/// Opens `n` flows to `dest` from id `first` on; returns the server's ids.
async fn open_flows(s: &mut TcpStream, dest: &str, first: u32, n: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for i in first..first + n {
        let open = Frame::Open {
            sender: i,
            window: 64 << 10,
            max_packet: u16::MAX,
            dest: dest.into(),
        };
        out.extend_from_slice(&open.to_bytes().unwrap());
    }
    s.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let mut ids = Vec::new();
    while ids.len() < n as usize {
        if let Some(f) = frame::decode(&mut buf, DecodeLimits::default()).unwrap() {
            match f {
                Frame::OpenSuccess { sender, .. } => ids.push(sender),
                Frame::OpenFailure { description, .. } => panic!("refused: {description}"),
                _ => {}
            }
            continue;
        }
        let r = within(20, s.read_buf(&mut buf)).await.unwrap();
        assert!(r > 0, "server closed");
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagram_floods_and_idle_flows_stay_within_their_bounds() {
    if !common::alone(
        module_path!(),
        "datagram_floods_and_idle_flows_stay_within_their_bounds",
    ) {
        return;
    }
    logs();
    // One socket per flow: more than a default soft limit of 1 024.
    let _ = longhaul_files::raise_nofile_limit();
    // A destination that never reads, with a small receive buffer; and one
    // that answers every datagram with 64 of 60 000 bytes.
    let deaf = {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        s.set_recv_buffer_size(64 << 10).unwrap();
        s.bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        std::net::UdpSocket::from(s)
    };
    let deaf_addr = deaf.local_addr().unwrap();
    let loud = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let loud_addr = loud.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        let big = vec![3u8; 60_000];
        while let Ok((_, from)) = loud.recv_from(&mut buf).await {
            for _ in 0..64 {
                let _ = loud.send_to(&big, from).await;
            }
        }
    });
    let rules = Rules::new(
        vec![
            format!("udp:{deaf_addr}").parse().unwrap(),
            format!("udp:{loud_addr}").parse().unwrap(),
        ],
        false,
    );
    let server = start_server(rules, BindRules::default()).await;
    let before = status_bytes("VmRSS:");

    // The peer floods 256 MiB of datagrams over 16 flows to the deaf one.
    let mut s = native_peer(server).await;
    let flows = open_flows(&mut s, &format!("udp://{deaf_addr}"), 0, 16).await;
    let payload = Bytes::from(vec![9u8; 60_000]);
    let mut sent = 0;
    'flood: loop {
        for &r in &flows {
            let f = Frame::Datagram {
                recipient: r,
                payload: payload.clone(),
            };
            within(30, s.write_all(&f.to_bytes().unwrap()))
                .await
                .unwrap();
            sent += payload.len();
            if sent >= FLOOD {
                break 'flood;
            }
        }
    }
    // And asks the loud one for floods it never reads.
    let loud_flows = open_flows(&mut s, &format!("udp://{loud_addr}"), 100, 16).await;
    for _ in 0..20 {
        for &r in &loud_flows {
            let f = Frame::Datagram {
                recipient: r,
                payload: Bytes::from_static(b"go"),
            };
            within(30, s.write_all(&f.to_bytes().unwrap()))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let peak = status_bytes("VmHWM:").saturating_sub(before);
    eprintln!(
        "flood: {} MiB sent, peak RSS grew {} KiB",
        sent >> 20,
        peak >> 10
    );
    assert!(
        peak < ALLOWANCE,
        "peak RSS grew by {} MiB under datagram floods",
        peak >> 20
    );

    // Idle flows: each one socket, a task and its entries at the server.
    let idle_before = status_bytes("VmRSS:");
    let mut s2 = native_peer(server).await;
    let ids = open_flows(&mut s2, &format!("udp://{deaf_addr}"), 0, IDLE_FLOWS).await;
    assert_eq!(ids.len(), IDLE_FLOWS as usize);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let per = status_bytes("VmRSS:").saturating_sub(idle_before) / IDLE_FLOWS as u64;
    eprintln!("{IDLE_FLOWS} idle flows: {per} bytes each");
    assert!(per < PER_IDLE_FLOW, "an idle flow costs {per} bytes");
    drop(deaf);
}
