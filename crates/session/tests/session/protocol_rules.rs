//! The session against a raw native peer on a real loopback carrier: frame
//! rules that a careless or hostile peer could otherwise bend.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use longhaul_carrier::Carrier;
use longhaul_proto::frame::{self, DecodeLimits, Frame, Reason};
use longhaul_proto::handshake::{Hello, HELLO_LEN};
use longhaul_session::{Acceptor, BoxFuture, OpenRefused, Session, SessionConfig, SessionHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Connects to nothing: each connect waits forever (a target that never
/// answers), so only the session's own deadline can end it.
struct Hanging;

impl Acceptor for Hanging {
    fn connect(
        &self,
        _dest: String,
    ) -> BoxFuture<Result<longhaul_session::LocalStream, OpenRefused>> {
        Box::pin(std::future::pending())
    }
}

struct Peer {
    s: TcpStream,
    buf: BytesMut,
}

impl Peer {
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = frame::decode(&mut self.buf, DecodeLimits::default()).unwrap() {
                return Some(f);
            }
            let r = tokio::time::timeout(Duration::from_secs(10), self.s.read_buf(&mut self.buf))
                .await
                .expect("session went silent");
            if matches!(r, Ok(0) | Err(_)) {
                return None;
            }
        }
    }

    /// The next frame that is not a PING.
    async fn next_not_ping(&mut self) -> Option<Frame> {
        loop {
            match self.next().await? {
                Frame::Ping { .. } => continue,
                f => return Some(f),
            }
        }
    }

    async fn send(&mut self, f: Frame) {
        self.s.write_all(&f.to_bytes().unwrap()).await.unwrap();
    }
}

/// A session (our side) and a raw peer on the other end of a loopback TCP
/// connection, hello done.
async fn pair(config: SessionConfig) -> (SessionHandle, Peer) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (ours, theirs) = tokio::join!(TcpStream::connect(l.local_addr().unwrap()), l.accept());
    let mut s = theirs.unwrap().0;
    let carrier = Carrier::from_tcp(ours.unwrap()).unwrap();
    let peer_hello = async {
        s.write_all(&Hello::ours(u16::MAX).encode()).await.unwrap();
        let mut h = [0u8; HELLO_LEN];
        s.read_exact(&mut h).await.unwrap();
    };
    let (h, ()) = tokio::join!(
        Session::start(carrier, config, Arc::new(Hanging)),
        peer_hello
    );
    (
        h.unwrap(),
        Peer {
            s,
            buf: BytesMut::new(),
        },
    )
}

#[tokio::test]
async fn a_pong_for_no_ping_of_ours_does_not_fake_the_rtt() {
    let (h, mut peer) = pair(SessionConfig::default()).await;
    // The session's first PING, answered at once: a real sample.
    let nonce = loop {
        if let Some(Frame::Ping { nonce }) = peer.next().await {
            break nonce;
        }
    };
    peer.send(Frame::Pong { nonce }).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Nonces are the session's clock at sending; 0 would claim an RTT of
    // the session's whole age (1 s here), growing every window to its
    // cap. Neither a made-up nonce nor a replayed one may count.
    peer.send(Frame::Pong { nonce: 0 }).await;
    peer.send(Frame::Pong { nonce: 1 }).await;
    peer.send(Frame::Pong { nonce }).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rtt = h.stats().rtt;
    // One forged sample of ≥ 1 s would lift the average (7/8 old + 1/8 new)
    // above 125 ms; the real sample is a loopback round trip.
    assert!(rtt < Duration::from_millis(100), "RTT taken as {rtt:?}");
    assert!(!h.is_closed());
}

#[tokio::test]
async fn frames_for_a_stream_still_opening_are_a_protocol_error() {
    for bad in ["close", "eof", "adjust", "data"] {
        let (h, mut peer) = pair(SessionConfig::default()).await;
        let h2 = h.clone();
        let open = tokio::spawn(async move { h2.open("tcp://example.test:1").await });
        let Some(Frame::Open { sender, .. }) = peer.next_not_ping().await else {
            panic!("no OPEN");
        };
        let f = match bad {
            "close" => Frame::Close { recipient: sender },
            "eof" => Frame::Eof { recipient: sender },
            "adjust" => Frame::WindowAdjust {
                recipient: sender,
                increment: 1,
            },
            _ => Frame::Data {
                recipient: sender,
                payload: bytes::Bytes::from_static(b"x"),
            },
        };
        peer.send(f).await;
        let why = tokio::time::timeout(Duration::from_secs(5), h.closed())
            .await
            .unwrap_or_else(|_| panic!("{bad}: session not closed"));
        assert!(why.contains("before it was open"), "{bad}: {why}");
        let r = tokio::time::timeout(Duration::from_secs(5), open)
            .await
            .unwrap()
            .unwrap();
        let err = r.err().expect("the open must fail");
        assert!(!err.description.is_empty(), "{bad}: empty error");
        // Nothing was sent to stream 0 on the way out.
        while let Some(f) = peer.next().await {
            assert!(
                !matches!(f, Frame::Close { recipient: 0 }),
                "{bad}: CLOSE sent to id 0"
            );
        }
    }
}

#[tokio::test]
async fn unanswered_opens_and_binds_give_back_their_slots() {
    let config = SessionConfig {
        open_timeout: Duration::from_millis(200),
        max_streams: 2,
        ..SessionConfig::default()
    };
    let (h, mut peer) = pair(config).await;
    // Two opens the peer never answers: both time out...
    let (a, b) = tokio::join!(h.open("tcp://a.test:1"), h.open("tcp://b.test:1"));
    assert_eq!(a.err().unwrap().reason, Reason::TTL_EXPIRED);
    assert_eq!(b.err().unwrap().reason, Reason::TTL_EXPIRED);
    let mut senders = vec![];
    while senders.len() < 2 {
        if let Some(Frame::Open { sender, .. }) = peer.next_not_ping().await {
            senders.push(sender);
        }
    }
    // ...and their slots and budget are free again.
    let st = h.stats();
    assert_eq!(st.streams, 0);
    assert_eq!(st.budget_used, 0);
    let h2 = h.clone();
    let third = tokio::spawn(async move { h2.open("tcp://c.test:1").await });
    let Some(Frame::Open { .. }) = peer.next_not_ping().await else {
        panic!("the third open was not sent (slots still held)");
    };
    // Late answers: a success is closed at once, a failure ignored.
    peer.send(Frame::OpenSuccess {
        recipient: senders[0],
        sender: 500,
        window: 1 << 16,
        max_packet: 1024,
    })
    .await;
    peer.send(Frame::OpenFailure {
        recipient: senders[1],
        reason: Reason::CONNECTION_REFUSED,
        description: "late".into(),
    })
    .await;
    assert_eq!(
        peer.next_not_ping().await,
        Some(Frame::Close { recipient: 500 })
    );
    peer.send(Frame::Close {
        recipient: senders[0],
    })
    .await;
    // A BIND nobody answers times out and frees its slot; a late answer is ignored.
    let bind = h.bind("8080", "tcp://localhost:80").await;
    assert_eq!(bind.err().unwrap().reason, Reason::TTL_EXPIRED);
    let request = loop {
        if let Some(Frame::Bind { request, .. }) = peer.next_not_ping().await {
            break request;
        }
    };
    peer.send(Frame::BindSuccess {
        request,
        port: 8080,
    })
    .await;
    let _ = third.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!h.is_closed(), "{:?}", h.close_reason());
}

#[tokio::test]
async fn an_open_whose_target_never_answers_fails_in_time() {
    let config = SessionConfig {
        open_timeout: Duration::from_millis(300),
        ..SessionConfig::default()
    };
    let (h, mut peer) = pair(config).await;
    peer.send(Frame::Open {
        sender: 9,
        window: 1 << 16,
        max_packet: 1024,
        dest: "tcp://hangs.test:1".into(),
    })
    .await;
    let t = std::time::Instant::now();
    match peer.next_not_ping().await {
        Some(Frame::OpenFailure {
            recipient: 9,
            reason,
            ..
        }) => assert_eq!(reason, Reason::TTL_EXPIRED),
        f => panic!("expected OPEN_FAILURE, got {f:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(!h.is_closed());
}
