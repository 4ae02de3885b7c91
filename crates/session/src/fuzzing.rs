//! Harnesses shared by the cargo-fuzz targets (`fuzz/`) and by the tests
//! that replay their corpus on every CI run.
//!
//! * [`frame_decoder`]: any bytes through the frame decoder; every frame it
//!   accepts must re-encode to bytes that decode to the same frame.
//! * [`session_peer`]: any bytes as the peer's side of a live session (after
//!   a valid hello in native mode), against a real session with real
//!   loopback sockets for the streams either side opens. The session must
//!   neither panic nor hang: once the peer's bytes end, it must close
//!   within a deadline, and everything it wrote must be well-formed frames.
//! * [`lane_peer`]: any bytes as the lane of a striped session (after a
//!   valid hello and attach granting two lanes): CHUNK and ACK messages
//!   with any offsets and lengths, whatever they carry. The session must
//!   neither panic nor hang: once the bytes end it must be closed or
//!   waiting for a resume within a deadline.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::BytesMut;
use longhaul_carrier::Carrier;
use longhaul_proto::frame::{self, DecodeLimits};
use longhaul_proto::handshake::Hello;
use longhaul_proto::Reason;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{Acceptor, BoxFuture, Mode, OpenRefused, Session, SessionConfig};

/// Decodes `data` as a frame stream under limits chosen by its first byte.
pub fn frame_decoder(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let limits = DecodeLimits {
        max_frame: if sel & 1 == 0 {
            u16::MAX as usize
        } else {
            4096
        },
        extensions: sel & 2 == 0,
    };
    let mut buf = BytesMut::from(rest);
    while let Ok(Some(f)) = frame::decode(&mut buf, limits) {
        let bytes = f.to_bytes().expect("a decoded frame re-encodes");
        let mut again = BytesMut::from(&bytes[..]);
        let back = frame::decode(&mut again, limits)
            .expect("re-encoded frame decodes")
            .expect("re-encoded frame is complete");
        assert_eq!(back, f);
        assert!(again.is_empty());
    }
}

/// A loopback listener that accepts and drains, standing in for targets.
fn sink() -> SocketAddr {
    static SINK: OnceLock<SocketAddr> = OnceLock::new();
    *SINK.get_or_init(|| {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind sink");
        let addr = l.local_addr().expect("sink addr");
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s, &mut std::io::sink());
                });
            }
        });
        addr
    })
}

/// Connects every stream the fuzzed peer opens to the sink, except the
/// destination `tcp://refused:1`, which is refused.
struct SinkAcceptor;

impl Acceptor for SinkAcceptor {
    fn connect(&self, dest: String) -> BoxFuture<Result<crate::LocalStream, OpenRefused>> {
        Box::pin(async move {
            if dest == "tcp://refused:1" {
                return Err(OpenRefused::new(Reason::NOT_ALLOWED, "not allowed"));
            }
            TcpStream::connect(sink())
                .await
                .map(Into::into)
                .map_err(|e| OpenRefused::new(Reason::GENERAL_FAILURE, e.to_string()))
        })
    }
}

/// How long the peer stays connected after its last byte.
const PEER_LINGER: Duration = Duration::from_millis(5);

/// Splits session input into bursts at [`PAUSE`] (at most 8 bursts).
pub const PAUSE: &[u8; 4] = b"\xfe\xfePS";

fn split_pauses(input: &[u8]) -> Vec<&[u8]> {
    let mut parts = vec![];
    let mut rest = input;
    while parts.len() < 7 {
        match rest.windows(PAUSE.len()).position(|w| w == PAUSE) {
            Some(i) => {
                parts.push(&rest[..i]);
                rest = &rest[i + PAUSE.len()..];
            }
            None => break,
        }
    }
    parts.push(rest);
    parts
}

/// Most time one input may take; longer is a hang.
pub const SESSION_DEADLINE: Duration = Duration::from_secs(5);

/// Runs one session against `data` as its peer's bytes. The first byte
/// picks the mode and how many streams our side opens first (their OPENs
/// use ids 0.., so the input can answer them).
pub fn session_peer(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    within_deadline(run_session(sel, rest));
}

/// Runs `f` on a fresh single-threaded runtime; more than
/// [`SESSION_DEADLINE`] is a hang.
fn within_deadline(f: impl std::future::Future<Output = ()>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let done = rt.block_on(async { tokio::time::timeout(SESSION_DEADLINE, f).await });
    assert!(
        done.is_ok(),
        "session did not finish within {SESSION_DEADLINE:?}"
    );
}

/// Our side of an in-memory carrier, and the peer's end of it.
fn duplex_carrier() -> (Carrier, tokio::io::DuplexStream) {
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (r, w) = tokio::io::split(ours);
    let carrier = Carrier {
        reader: Box::new(r),
        writer: Box::new(w),
        probe: None,
        urgent: None,
        urgent_flag: None,
        datagrams: None,
        binding: None,
        peer: "fuzz".into(),
    };
    (carrier, theirs)
}

async fn run_session(sel: u8, peer_bytes: &[u8]) {
    let native = sel & 1 == 0;
    let our_streams = ((sel >> 1) & 3) as usize;
    let (carrier, theirs) = duplex_carrier();
    let config = SessionConfig {
        mode: if native { Mode::Native } else { Mode::Jmux },
        max_streams: 16,
        budget: 4 << 20,
        handshake_timeout: Duration::from_secs(2),
        open_timeout: Duration::from_secs(2),
        ..SessionConfig::default()
    };
    let (mut peer_r, mut peer_w) = tokio::io::split(theirs);
    // The peer: hello, then (once our side has sent its OPENs, so the
    // input can answer them) the fuzz bytes, a moment for the session to
    // act on them (connect targets, move data), then EOF.
    let input = peer_bytes.to_vec();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(async move {
        if native {
            peer_w.write_all(&Hello::ours(u16::MAX).encode()).await?;
        }
        let _ = go_rx.await;
        // PAUSE markers split the input into bursts with a moment between
        // them, so an input can wait for an OPEN to be answered.
        for part in split_pauses(&input) {
            peer_w.write_all(part).await?;
            tokio::time::sleep(PEER_LINGER).await;
        }
        peer_w.shutdown().await
    });
    // Everything the session writes must be valid frames.
    let reader = tokio::spawn(async move {
        let mut out = Vec::new();
        let _ = peer_r.read_to_end(&mut out).await;
        out
    });
    let Ok(handle) = Session::start(carrier, config, Arc::new(SinkAcceptor)).await else {
        let _ = writer.await;
        return;
    };
    for i in 0..our_streams {
        let h = handle.clone();
        tokio::spawn(async move {
            if let Ok(opened) = h.open(&format!("tcp://target-{i}:80")).await {
                if let Ok(sock) = TcpStream::connect(sink()).await {
                    opened.attach(sock);
                }
            }
        });
    }
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    let _ = go_tx.send(());
    let _ = writer.await;
    // The peer's bytes have ended: the session must notice and close.
    handle.closed().await;
    let out = reader.await.unwrap_or_default();
    let mut buf = BytesMut::from(&out[..]);
    if native {
        if buf.len() < longhaul_proto::handshake::HELLO_LEN {
            return;
        }
        let _ = buf.split_to(longhaul_proto::handshake::HELLO_LEN);
    }
    let limits = DecodeLimits {
        max_frame: u16::MAX as usize,
        extensions: native,
    };
    while !buf.is_empty() {
        match frame::decode(&mut buf, limits) {
            Ok(Some(f)) => {
                if std::env::var_os("LH_FUZZ_DEBUG").is_some() {
                    eprintln!("out: {f:?}");
                }
            }
            Ok(None) => break, // cut off by the close
            Err(e) => panic!("session wrote an invalid frame: {e}"),
        }
    }
}

/// Any bytes as the peer's frames, straight into the multiplexer core: no
/// runtime, no sockets, no sleeps (thousands of inputs a second). The first
/// byte picks the mode and how many streams our side opens (ids 1..). A
/// small app answers what the core asks: accepts every other OPEN, consumes
/// all data, sends a little on streams it opened, binds. The core must not
/// panic, every frame it writes must decode, and the receive windows it
/// grants must stay within the budget plus the per-stream floor.
pub fn mux_peer(data: &[u8]) {
    use longhaul_proto::mux::{Event, Mux, MuxConfig, MIN_WINDOW};
    use longhaul_proto::window::WindowConfig;
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let jmux = sel & 1 == 1;
    let config = MuxConfig {
        window: WindowConfig {
            initial: 8 * 1024,
            max: 64 * 1024,
        },
        budget: 64 * 1024,
        max_streams: 16,
        send_queue: 16 * 1024,
        send_total: 1 << 20,
        control_limit: 64 * 1024,
        keepalive: Duration::from_millis(3),
        dead_after: Duration::from_secs(1),
        open_timeout: Duration::from_millis(20),
        idle_timeout: None,
        rtt_floor: Duration::from_millis(1),
        jmux,
        extensions: !jmux,
        our_max_packet: 4096,
        send_max_payload: 4096,
        resumable: false,
    };
    let limits = DecodeLimits {
        max_frame: u16::MAX as usize,
        extensions: !jmux,
    };
    let mut m = Mux::new(config);
    let mut now = 0u64;
    for _ in 0..((sel >> 1) & 3) {
        let _ = m.open("tcp://target:1", now);
    }
    let mut input = BytesMut::from(rest);
    let mut out = std::collections::VecDeque::new();
    let mut accept = true;
    loop {
        let f = match frame::decode(&mut input, limits) {
            Ok(Some(f)) => f,
            _ => break,
        };
        now += 1_000_000;
        m.heard(now);
        if m.handle_frame(f, now).is_err() {
            assert!(m.dead().is_some(), "a violation must end the session");
            break;
        }
        while let Some(e) = m.poll_event() {
            match e {
                Event::OpenRequest { open, .. } => {
                    accept = !accept;
                    if accept {
                        m.accept_open(open, now);
                    } else {
                        m.refuse_open(
                            open,
                            longhaul_proto::mux::Refused::new(Reason::NOT_ALLOWED, "no"),
                        );
                    }
                }
                Event::Data { id, payload } => m.delivered(id, payload.len(), now),
                Event::Eof { id } => m.eof_delivered(id),
                Event::OpenAnswered { id, result: Ok(()) } => {
                    if let Some(room) = m.send_room(id) {
                        m.send(id, bytes::Bytes::from(vec![9u8; room.min(5000)]));
                    }
                    m.send_eof(id);
                }
                Event::BindRequest { request, .. } => m.answer_bind(request, Ok(1)),
                _ => {}
            }
        }
        m.handle_timeout(now);
        let st = m.stats();
        assert!(
            st.budget_used <= m.config().budget + st.streams as u64 * MIN_WINDOW,
            "windows beyond the budget: {st:?}"
        );
        // Everything written must be well-formed frames.
        m.poll_transmit(&mut out, 1 << 20, 1 << 10);
        let mut wire = BytesMut::new();
        for f in out.drain(..) {
            wire.extend_from_slice(f.head());
            wire.extend_from_slice(&f.body);
        }
        let ours = DecodeLimits {
            max_frame: u16::MAX as usize,
            extensions: !jmux,
        };
        while !wire.is_empty() {
            match frame::decode(&mut wire, ours) {
                Ok(Some(_)) => {}
                other => panic!("the core wrote a malformed frame: {other:?}"),
            }
        }
    }
}

/// Runs one striped session whose only lane carries `data` from the peer.
/// The first byte picks how many streams our side opens first.
pub fn lane_peer(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    within_deadline(run_lane(sel, rest, 2));
}

/// Any bytes as the peer of a resumable session on one carrier, after a
/// well-formed hello and attach: the link layer (ACKs, GOODBYE, frames
/// counted in its byte sequence) with resume offered. The first byte
/// picks how many streams our side opens first.
pub fn resumable_peer(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    within_deadline(run_lane(sel, rest, 1));
}

/// `lanes`: 2, a striped session's lane; 1, a resumable single carrier.
async fn run_lane(sel: u8, peer_bytes: &[u8], lanes: u8) {
    use longhaul_proto::handshake::FEATURE_RESUME;
    use longhaul_proto::resume::{Attached, SessionId, ATTACH_LEN};
    let (carrier, theirs) = duplex_carrier();
    let config = SessionConfig {
        max_streams: 16,
        budget: 4 << 20,
        handshake_timeout: Duration::from_secs(2),
        open_timeout: Duration::from_secs(2),
        replay_limit: 1 << 20,
        stripes: lanes,
        ..SessionConfig::default()
    };
    let (mut peer_r, mut peer_w) = tokio::io::split(theirs);
    let input = peer_bytes.to_vec();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(async move {
        let mut hello = Hello::ours(u16::MAX);
        hello.features |= FEATURE_RESUME;
        // The bare answer, without an instance name behind it.
        hello.features &= !longhaul_proto::handshake::FEATURE_INSTANCE;
        peer_w.write_all(&hello.encode()).await?;
        let granted = Attached::New {
            id: SessionId([1; 16]),
            // X25519's base point: a valid key share.
            share: {
                let mut b = [0u8; 32];
                b[0] = 9;
                b
            },
            replay_limit: 1 << 20,
            lanes: if lanes > 1 { lanes } else { 0 },
        };
        peer_w.write_all(&granted.encode()).await?;
        let _ = go_rx.await;
        for part in split_pauses(&input) {
            peer_w.write_all(part).await?;
            tokio::time::sleep(PEER_LINGER).await;
        }
        peer_w.shutdown().await
    });
    // Our side's hello and attach, then what the lane writes.
    let reader = tokio::spawn(async move {
        let mut out = Vec::new();
        let _ = peer_r.read_to_end(&mut out).await;
        out
    });
    let Ok(handle) = Session::start(carrier, config, Arc::new(SinkAcceptor)).await else {
        let _ = writer.await;
        return;
    };
    for i in 0..((sel >> 1) & 3) {
        let h = handle.clone();
        tokio::spawn(async move {
            if let Ok(opened) = h.open(&format!("tcp://target-{i}:80")).await {
                if let Ok(sock) = TcpStream::connect(sink()).await {
                    opened.attach(sock);
                }
            }
        });
    }
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    let _ = go_tx.send(());
    let _ = writer.await;
    // The lane has ended: closed, or waiting for a resume.
    let _ = handle.detached().await;
    handle.close("fuzz input done");
    handle.closed().await;
    let out = reader.await.unwrap_or_default();
    let skip = longhaul_proto::handshake::HELLO_LEN + ATTACH_LEN;
    if out.len() < skip {
        return;
    }
    // Everything the lane wrote: ACK and CHUNK messages, each chunk's
    // bytes well-formed frames.
    let mut buf = BytesMut::from(&out[skip..]);
    let limits = DecodeLimits {
        max_frame: u16::MAX as usize,
        extensions: true,
    };
    loop {
        if lanes < 2 {
            // One carrier: frames as they are (the link layer counts them).
            match frame::decode(&mut buf, limits) {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(e) => panic!("the session wrote an invalid message: {e}"),
            }
        }
        match frame::decode(&mut buf, limits) {
            Ok(Some(frame::Frame::Ack { .. })) => {}
            Ok(Some(frame::Frame::Chunk { len, .. })) => {
                if buf.len() < len as usize {
                    break; // cut off by the close
                }
                let mut chunk = buf.split_to(len as usize);
                while !chunk.is_empty() {
                    match frame::decode(&mut chunk, limits) {
                        Ok(Some(_)) => {}
                        other => panic!("the lane wrote a malformed chunk: {other:?}"),
                    }
                }
            }
            Ok(Some(f)) => panic!("the lane wrote {f:?} outside a chunk"),
            Ok(None) => break,
            Err(e) => panic!("the lane wrote an invalid message: {e}"),
        }
    }
}
