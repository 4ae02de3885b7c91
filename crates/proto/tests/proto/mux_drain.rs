//! Draining: a DRAIN goes out once, only where it was negotiated;
//! the peer hears it once, and streams (open ones and new OPENs) go on.

use crate::mux_common;

use longhaul_proto::frame::Frame;
use longhaul_proto::mux::{Event, Mux};
use mux_common::{accepted, config, written};

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
