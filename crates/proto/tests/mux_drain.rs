//! Draining: a DRAIN goes out once, only where it was negotiated;
//! the peer hears it once, and streams (open ones and new OPENs) go on.

use std::collections::VecDeque;
use std::time::Duration;

use longhaul_proto::frame::{self, Frame};
use longhaul_proto::mux::{Event, Mux, MuxConfig};
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

/// The peer opens stream `sender`; we accept: our id for it.
fn accepted(m: &mut Mux, sender: u32) -> u32 {
    m.handle_frame(
        Frame::Open {
            sender,
            window: 4096,
            max_packet: 2048,
            dest: "tcp://x:1".into(),
        },
        0,
    )
    .unwrap();
    let open = match m.poll_event() {
        Some(Event::OpenRequest { open, .. }) => open,
        e => panic!("{e:?}"),
    };
    m.accept_open(open, 0).unwrap()
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

#[test]
fn a_drain_is_sent_once_and_only_with_extensions() {
    let mut m = Mux::new(config(false));
    m.drain("not negotiated");
    assert!(
        written(&mut m).is_empty(),
        "a peer without the feature got a DRAIN"
    );
    m.set_drain_negotiated(true);
    m.drain("restarting");
    m.drain("again");
    let drains: Vec<_> = written(&mut m)
        .into_iter()
        .filter(|f| matches!(f, Frame::Drain { .. }))
        .collect();
    assert_eq!(
        drains,
        vec![Frame::Drain {
            reason: "restarting".into()
        }]
    );
    let mut j = Mux::new(config(true));
    j.set_drain_negotiated(true);
    j.drain("restarting");
    assert!(written(&mut j).is_empty(), "a JMUX peer got a DRAIN");
}

#[test]
fn the_peer_hears_a_drain_once_and_its_streams_go_on() {
    let mut m = Mux::new(config(false));
    let id = accepted(&mut m, 7);
    for _ in 0..3 {
        m.handle_frame(
            Frame::Drain {
                reason: "x".repeat(1000),
            },
            0,
        )
        .unwrap();
    }
    let mut heard = 0;
    while let Some(e) = m.poll_event() {
        if let Event::PeerDraining { reason } = e {
            assert_eq!(reason.len(), longhaul_proto::mux::MAX_DRAIN_REASON);
            heard += 1;
        }
    }
    assert_eq!(heard, 1);
    assert!(m.peer_drain().is_some());
    // The open stream still takes data, and a new OPEN is still accepted.
    assert!(m.send_room(id).unwrap_or(0) > 0);
    accepted(&mut m, 9);
}
