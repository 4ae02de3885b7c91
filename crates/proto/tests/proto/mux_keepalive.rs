//! Keepalive: a side that mostly answers (a server) pings only every
//! fourth interval while its peer pings, and every one once the peer is
//! late; a new carrier is pinged at once.

use crate::mux_common;

use longhaul_proto::frame::Frame;
use longhaul_proto::mux::Mux;
use mux_common::{config, written};

fn pings(m: &mut Mux) -> usize {
    written(m)
        .iter()
        .filter(|f| matches!(f, Frame::Ping { .. }))
        .count()
}

#[test]
fn an_answering_side_pings_rarely_while_its_peer_pings() {
    const S: u64 = 1_000_000_000;
    // keepalive 30 s in `config`.
    let mut m = Mux::new(config(false));
    m.set_answer_only(true);
    m.handle_timeout(0);
    assert_eq!(pings(&mut m), 1, "no PING heard yet: it pings");
    // The peer pings every 30 s: we answer, and ping only every fourth
    // interval (for our own RTT).
    for k in 1..=8u64 {
        let t = k * 30 * S;
        m.handle_frame(Frame::Ping { nonce: k }, t).unwrap();
        m.handle_timeout(t + S);
        let out = written(&mut m);
        assert!(out.contains(&Frame::Pong { nonce: k }));
        let ours = out
            .iter()
            .filter(|f| matches!(f, Frame::Ping { .. }))
            .count();
        assert_eq!(ours, usize::from(k % 4 == 0), "round {k}");
        // The next deadline is never in the past (a timer would spin).
        let due = m.poll_timeout().unwrap();
        assert!(due > t + S, "round {k}: deadline {due} already passed");
    }
    // The peer stops pinging: once it is half an interval late, we ping
    // every interval.
    let last = 8 * 30 * S;
    m.handle_timeout(last + 44 * S);
    assert_eq!(pings(&mut m), 0);
    m.handle_timeout(last + 46 * S);
    assert_eq!(pings(&mut m), 1);
    m.handle_timeout(last + 77 * S);
    assert_eq!(pings(&mut m), 1);
    // A new carrier: our PING goes at once.
    m.set_attached(false, last + 80 * S);
    m.handle_frame(Frame::Ping { nonce: 99 }, last + 80 * S)
        .unwrap();
    m.set_attached(true, last + 81 * S);
    m.handle_timeout(last + 81 * S);
    assert_eq!(pings(&mut m), 1);
    // A side that does not only answer pings every interval, whatever the
    // peer does.
    let mut c = Mux::new(config(false));
    c.handle_timeout(0);
    assert_eq!(pings(&mut c), 1);
    c.handle_frame(Frame::Ping { nonce: 9 }, 10 * S).unwrap();
    c.handle_timeout(31 * S);
    assert_eq!(pings(&mut c), 1);
}
