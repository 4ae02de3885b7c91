//! Keepalive: a side that only answers (a server) sends no PINGs of its
//! own while its peer pings, and starts again once the peer stops.

use std::collections::VecDeque;
use std::time::Duration;

use longhaul_proto::frame::{self, Frame};
use longhaul_proto::mux::{Mux, MuxConfig};
use longhaul_proto::window::WindowConfig;

fn config(jmux: bool) -> MuxConfig {
    MuxConfig {
        window: WindowConfig {
            initial: 4096,
            max: 65536,
        },
        budget: 20_000,
        max_streams: 2,
        send_queue: 8192,
        send_total: 65536,
        control_limit: 1 << 20,
        keepalive: Duration::from_secs(30),
        dead_after: Duration::from_secs(3600),
        open_timeout: Duration::from_secs(5),
        idle_timeout: None,
        rtt_floor: Duration::from_millis(1),
        jmux,
        extensions: !jmux,
        our_max_packet: 4096,
        send_max_payload: 2048,
        resumable: false,
    }
}

/// The control frames `m` would write now, decoded.
fn written(m: &mut Mux) -> Vec<Frame> {
    let mut batch = VecDeque::new();
    m.poll_transmit(&mut batch, usize::MAX, usize::MAX);
    let limits = frame::DecodeLimits {
        max_frame: frame::MAX_FRAME_LEN,
        extensions: true,
    };
    let mut out = vec![];
    for f in batch {
        let mut b = bytes::BytesMut::new();
        b.extend_from_slice(f.head());
        b.extend_from_slice(&f.body);
        while let Some(fr) = frame::decode(&mut b, limits).unwrap() {
            out.push(fr);
        }
    }
    out
}

fn pings(m: &mut Mux) -> usize {
    written(m)
        .iter()
        .filter(|f| matches!(f, Frame::Ping { .. }))
        .count()
}

#[test]
fn an_answering_side_pings_only_when_its_peer_stops() {
    const S: u64 = 1_000_000_000;
    // keepalive 30 s in `config`.
    let mut m = Mux::new(config(false));
    m.set_answer_only(true);
    m.handle_timeout(0);
    assert_eq!(pings(&mut m), 1, "no PING heard yet: it pings");
    // The peer pings every 30 s: we answer, and ping no more.
    for k in 1..=4u64 {
        m.handle_frame(Frame::Ping { nonce: k }, k * 30 * S)
            .unwrap();
        m.handle_timeout(k * 30 * S + S);
        let out = written(&mut m);
        assert!(out.contains(&Frame::Pong { nonce: k }));
        assert!(
            !out.iter().any(|f| matches!(f, Frame::Ping { .. })),
            "round {k}"
        );
    }
    // The next deadline is never in the past while the peer pings (a
    // timer would spin).
    let due = m.poll_timeout().unwrap();
    assert!(due > 4 * 30 * S + S, "deadline {due} already passed");
    // The peer stops pinging: after two of its intervals we ping again.
    m.handle_timeout(4 * 30 * S + 61 * S);
    assert_eq!(pings(&mut m), 1);
    // A side that does not only answer pings whatever the peer does.
    let mut c = Mux::new(config(false));
    c.handle_timeout(0);
    assert_eq!(pings(&mut c), 1);
    c.handle_frame(Frame::Ping { nonce: 9 }, 10 * S).unwrap();
    c.handle_timeout(31 * S);
    assert_eq!(pings(&mut c), 1);
}
