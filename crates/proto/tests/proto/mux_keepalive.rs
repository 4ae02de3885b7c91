//! Keepalive: a side that mostly answers (a server) pings only every
//! fourth interval while its peer pings, and every one once the peer is
//! late; a new carrier is pinged at once. While no data moves (quiet) and
//! both sides offered it, PINGs are rarer and silence is allowed longer.

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

const S: u64 = 1_000_000_000;

/// keepalive 5 s, dead after 15 s, resumable (silence is reported).
fn usual() -> longhaul_proto::mux::MuxConfig {
    let mut cfg = config(false);
    cfg.keepalive = std::time::Duration::from_secs(5);
    cfg.dead_after = std::time::Duration::from_secs(15);
    cfg.resumable = true;
    cfg
}

fn silent(m: &mut Mux) -> bool {
    std::iter::from_fn(|| m.poll_event())
        .any(|e| matches!(e, longhaul_proto::mux::Event::CarrierSilent { .. }))
}

#[test]
fn a_quiet_session_pings_rarely_and_waits_longer_for_its_quiet_peer() {
    let thirty = std::time::Duration::from_secs(30);
    let mut c = Mux::new(usual());
    c.set_quiet_keepalive(Some(thirty));
    c.heard(0);
    c.handle_timeout(0);
    assert_eq!(pings(&mut c), 1);
    c.set_quiet(true, S);
    for t in [6, 11, 29] {
        c.handle_timeout(t * S);
        assert_eq!(pings(&mut c), 0, "quiet at {t} s: no PING yet");
    }
    c.handle_timeout(30 * S);
    assert_eq!(pings(&mut c), 1);
    // The peer's quiet PINGs may be 30 s apart: silence counts after 45 s.
    c.handle_timeout(44 * S);
    assert!(!silent(&mut c));
    c.handle_timeout(46 * S);
    assert!(silent(&mut c));

    // Data moves again: the usual pace at once, and the peer (maybe still
    // quiet for a moment) gets the usual 15 s from then.
    let mut c = Mux::new(usual());
    c.set_quiet_keepalive(Some(thirty));
    c.heard(0);
    c.handle_timeout(0);
    assert_eq!(pings(&mut c), 1);
    c.set_quiet(true, S);
    c.heard(20 * S);
    c.set_quiet(false, 40 * S);
    c.handle_timeout(40 * S);
    assert_eq!(pings(&mut c), 1, "a PING as soon as data moves");
    assert!(
        !silent(&mut c),
        "20 s since the peer's quiet PING is no death"
    );
    c.handle_timeout(54 * S);
    assert!(!silent(&mut c));
    c.handle_timeout(56 * S);
    assert!(silent(&mut c));

    // A peer that did not offer it: quiet changes nothing.
    let mut c = Mux::new(usual());
    c.heard(0);
    c.handle_timeout(0);
    c.set_quiet(true, S);
    c.handle_timeout(5 * S);
    assert_eq!(pings(&mut c), 2);
    c.handle_timeout(16 * S);
    assert!(silent(&mut c));
}

#[test]
fn a_quiet_answering_side_only_answers_a_peer_that_pings() {
    let thirty = std::time::Duration::from_secs(30);
    let mut m = Mux::new(usual());
    m.set_answer_only(true);
    m.set_quiet_keepalive(Some(thirty));
    m.handle_timeout(0);
    assert_eq!(pings(&mut m), 1);
    m.set_quiet(true, S);
    for k in 1..=8u64 {
        let t = k * 30 * S;
        m.heard(t);
        m.handle_frame(Frame::Ping { nonce: k }, t).unwrap();
        m.handle_timeout(t + S);
        let out = written(&mut m);
        assert!(out.contains(&Frame::Pong { nonce: k }));
        assert!(
            !out.iter().any(|f| matches!(f, Frame::Ping { .. })),
            "round {k}"
        );
        let due = m.poll_timeout().unwrap();
        assert!(due > t + S, "round {k}: deadline {due} already passed");
    }
    // The peer is late (a usual interval): we ping, before its silence
    // counts (45 s).
    let last = 8 * 30 * S;
    m.handle_timeout(last + 34 * S);
    assert_eq!(pings(&mut m), 0);
    m.handle_timeout(last + 36 * S);
    assert_eq!(pings(&mut m), 1);
    assert!(!silent(&mut m));
    m.handle_timeout(last + 46 * S);
    assert!(silent(&mut m));
}
