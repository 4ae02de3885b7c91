//! The server runs a bounded number of connects per session at once; the
//! bound must not let targets that never answer hold up the session's
//! other OPENs.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_targets_do_not_hold_up_other_opens() {
    // A target that never answers: a listener that never accepts, with a
    // backlog of 1. Once its queue is full the kernel drops further SYNs,
    // so connects to it hang until the server's connect timeout (10 s).
    let hole = TcpSocket::new_v4().unwrap();
    hole.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let hole = hole.listen(1).unwrap();
    let hole_addr = hole.local_addr().unwrap();
    let echo = echo_server().await;
    let rules = Rules::new(
        [hole_addr.to_string(), echo.to_string()]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect(),
        false,
    );
    let server = start_server(rules, BindRules::default()).await;
    let client = start_client(server, &[hole_addr, echo]).await;

    // More OPENs to the silent target than the server connects at once
    // (64), all held open.
    let mut held = Vec::new();
    for _ in 0..100 {
        held.push(TcpStream::connect(client.local_addrs[0]).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A stream to a target that answers still opens at once, not after
    // the silent ones' 10 s connect timeout.
    let t = Instant::now();
    let mut s = TcpStream::connect(client.local_addrs[1]).await.unwrap();
    s.write_all(b"still served").await.unwrap();
    let mut got = [0u8; 12];
    within(20, s.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"still served");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "an OPEN behind 100 silent ones took {:?}",
        t.elapsed()
    );
    drop((held, hole));
}
