//! The doctor's direct measurement: the server listens for it only on the
//! address the client's carrier came in on, for the client's address, and
//! not at all where it does not know the client's address (stdio, folder).

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use longhaul_forward::client::{Client, ClientConfig};
use longhaul_session::local::{pair_end_async, PairStream};
use longhaul_session::LocalStream;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpSocket;

/// A doctor stream over `url`, and its answer to `DIRECT 3`.
async fn ask_direct(url: &str) -> (Client, BufReader<PairStream>, String) {
    let mut cfg = ClientConfig::new(url.parse().unwrap());
    cfg.insecure = true;
    cfg.reconnect = false;
    let client = Client::start(cfg).await.unwrap();
    let opened = client.session().open("longhaul://doctor").await.unwrap();
    let (ours, theirs) = LocalStream::pair().unwrap();
    opened.attach(ours);
    let mut sock = BufReader::new(pair_end_async(theirs).unwrap());
    sock.get_mut().write_all(b"DIRECT 3\n").await.unwrap();
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(10), sock.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    (client, sock, line)
}

/// Connects to `to` from `from` (None: any): what arrives in a second,
/// or None if the connection is refused.
async fn take(from: Option<&str>, to: SocketAddr) -> Option<usize> {
    let s = TcpSocket::new_v4().unwrap();
    if let Some(ip) = from {
        s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    }
    let mut c = s.connect(to).await.ok()?;
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Ok(k @ 1..) = c.read(&mut buf).await {
            n += k;
        }
    })
    .await;
    Some(n)
}

#[test]
fn direct_is_refused_where_the_clients_address_is_unknown() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = format!("cmd://{BIN} server --stdio --allow-all --control none");
        let (client, _sock, line) = ask_direct(&url).await;
        // It used to listen on every address and send to whoever came.
        if let Some(port) = line.trim().strip_prefix("PORT ") {
            let to = SocketAddr::from(([127, 0, 0, 1], port.parse().unwrap()));
            let got = take(None, to).await;
            panic!("a listener for anyone over stdio: port {port}, {got:?} bytes sent");
        }
        assert!(
            line.starts_with("REFUSED") && line.contains("address"),
            "{line:?}"
        );
        client.shutdown("done", Duration::from_secs(1)).await;
    });
}

#[test]
fn direct_listens_where_the_client_came_in_and_serves_only_it() {
    let port = free_port();
    let dir = tmpdir("doctor-direct");
    let _gone = RemovedOnDrop(dir.clone());
    let _server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("tcp://127.0.0.2:{port}"),
            "--insecure",
            "--control",
            "none",
        ],
        &dir.join("server.log"),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let t = std::time::Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.2", port))
            .await
            .is_err()
        {
            assert!(t.elapsed() < Duration::from_secs(10), "no server");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (client, _sock, line) = ask_direct(&format!("tcp://127.0.0.2:{port}")).await;
        let direct: u16 = line
            .trim()
            .strip_prefix("PORT ")
            .unwrap_or_else(|| panic!("{line:?}"))
            .parse()
            .unwrap();
        // Not on the server's other addresses…
        let elsewhere = SocketAddr::from(([127, 0, 0, 1], direct));
        assert_eq!(
            take(None, elsewhere).await,
            None,
            "listening on {elsewhere}"
        );
        let there = SocketAddr::from(([127, 0, 0, 2], direct));
        // …nothing for another address…
        assert_eq!(take(Some("127.0.0.3"), there).await, Some(0));
        // …the bytes for the client's, once.
        assert!(take(None, there).await.is_some_and(|n| n > 0));
        assert_eq!(take(None, there).await, None, "a second connection");
        client.shutdown("done", Duration::from_secs(1)).await;
    });
}
