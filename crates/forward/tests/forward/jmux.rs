//! JMUX compatibility at the byte level, against a raw peer that behaves
//! like jetsocat: it counts its maximum packet size over the whole DATA
//! message (header included) and drops anything larger, it sends
//! WINDOW_ADJUST after its own CLOSE, CLOSE twice, and reuses a channel id
//! at once. None of that may corrupt data or end the session.
//! (scripts/interop-jetsocat.sh runs the same against a real jetsocat.)

use crate::common;

use bytes::BytesMut;
use common::*;
use longhaul_forward::{Client, ClientConfig};
use longhaul_proto::frame::{self, DecodeLimits, Frame};
use longhaul_session::Mode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PEER_MAX_PACKET: u16 = 4096;

struct RawPeer {
    s: TcpStream,
    buf: BytesMut,
}

impl RawPeer {
    /// The next frame, and the length of its whole message on the wire.
    async fn next(&mut self) -> (Frame, usize) {
        let jmux = DecodeLimits {
            max_frame: u16::MAX as usize,
            extensions: false,
        };
        loop {
            let before = self.buf.len();
            if let Some(f) = frame::decode(&mut self.buf, jmux).unwrap() {
                return (f, before - self.buf.len());
            }
            let n = within(10, self.s.read_buf(&mut self.buf)).await.unwrap();
            assert!(n > 0, "longhaul closed the JMUX session");
        }
    }

    async fn send(&mut self, f: Frame) {
        self.s.write_all(&f.to_bytes().unwrap()).await.unwrap();
    }

    /// Answers the next OPEN with our channel `ours`; returns longhaul's id.
    async fn accept_open(&mut self, ours: u32) -> u32 {
        loop {
            if let (Frame::Open { sender, .. }, _) = self.next().await {
                self.send(Frame::OpenSuccess {
                    recipient: sender,
                    sender: ours,
                    window: 64 << 20,
                    max_packet: PEER_MAX_PACKET,
                })
                .await;
                return sender;
            }
        }
    }

    /// Reads DATA for `ours` until EOF; every whole message must fit the
    /// maximum packet size we advertised.
    async fn collect(&mut self, ours: u32) -> Vec<u8> {
        let mut got = vec![];
        loop {
            match self.next().await {
                (Frame::Data { recipient, payload }, wire) if recipient == ours => {
                    assert!(
                        wire <= PEER_MAX_PACKET as usize,
                        "DATA message of {wire} bytes exceeds the peer's maximum packet size {PEER_MAX_PACKET}"
                    );
                    got.extend_from_slice(&payload);
                }
                (Frame::Eof { recipient }, _) if recipient == ours => return got,
                _ => {}
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_messages_fit_a_jmux_peers_maximum_and_its_quirks_are_survived() {
    // It asserts what the log does not say: other tests would say it.
    if !common::alone(
        module_path!(),
        "data_messages_fit_a_jmux_peers_maximum_and_its_quirks_are_survived",
    ) {
        return;
    }
    logs();
    let _dump = DumpLogsOnPanic;
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer_addr = l.local_addr().unwrap();
    let mut cfg = ClientConfig::new(format!("tcp://{peer_addr}").parse().unwrap());
    cfg.insecure = true;
    cfg.session.mode = Mode::Jmux;
    cfg.local = vec![fwd("127.0.0.1", 9)];
    let (client, accepted) = tokio::join!(Client::start(cfg), l.accept());
    let client = client.unwrap();
    let mut peer = RawPeer {
        s: accepted.unwrap().0,
        buf: BytesMut::new(),
    };

    // One stream: 1 MiB up, every message within 4096 bytes, intact.
    let data = random_bytes(1 << 20);
    let app = TcpStream::connect(client.local_addrs[0]).await.unwrap();
    let (_r1, mut w1) = app.into_split();
    let d = data.clone();
    let up = tokio::spawn(async move {
        w1.write_all(&d).await.unwrap();
        w1.shutdown().await.unwrap();
        w1
    });
    let theirs = peer.accept_open(77).await;
    let got = peer.collect(77).await;
    assert_eq!(sha(&got), sha(&data), "stream corrupted");

    // jetsocat's habits: CLOSE, then WINDOW_ADJUST and a second CLOSE for
    // the same channel, then the same channel id again at once.
    peer.send(Frame::Close { recipient: theirs }).await;
    peer.send(Frame::WindowAdjust {
        recipient: theirs,
        increment: 4096,
    })
    .await;
    peer.send(Frame::Close { recipient: theirs }).await;
    let _w1 = up.await.unwrap();
    let app2 = TcpStream::connect(client.local_addrs[0]).await.unwrap();
    let theirs2 = peer.accept_open(77).await;
    assert!(
        !client.session().is_closed(),
        "{:?}",
        client.session().close_reason()
    );
    let (mut r2, mut w2) = app2.into_split();
    w2.write_all(b"still here").await.unwrap();
    w2.shutdown().await.unwrap();
    assert_eq!(peer.collect(77).await, b"still here");
    // And downstream, split into messages of at most 4096 bytes by us.
    peer.send(Frame::Data {
        recipient: theirs2,
        payload: bytes::Bytes::from_static(b"pong"),
    })
    .await;
    peer.send(Frame::Eof { recipient: theirs2 }).await;
    let mut back = vec![];
    within(10, r2.read_to_end(&mut back)).await.unwrap();
    assert_eq!(back, b"pong");
    assert!(!log_contains("closing session"), "the session was closed");
}
