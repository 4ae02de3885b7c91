//! Property test of the stream state machine: random frames from the peer
//! (any type, any stream id, in any order) mixed with random local events.
//! The core must never panic; a frame a state does not allow ends the
//! session with a reason; and once every stream is driven to its end, no
//! entry is left and the whole budget is back.

use std::time::Duration;

use bytes::Bytes;
use longhaul_proto::frame::{Frame, Reason};
use longhaul_proto::mux::{Event, IncomingOpen, Mux, MuxConfig, Phase, Refused};
use longhaul_proto::window::WindowConfig;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Peer(Frame),
    Open,
    Send(u32, usize),
    SendDatagram(u32, usize),
    SendEof(u32),
    Delivered(u32, usize),
    EofDelivered(u32),
    Abort(u32),
    Abandon(u32),
    LocalOpened(u32),
    LocalClosed(u32),
    AcceptNext,
    RefuseNext,
    Tick(u64),
}

fn frame() -> impl Strategy<Value = Frame> {
    let id = 0u32..6;
    prop_oneof![
        (id.clone(), 0usize..3000).prop_map(|(recipient, n)| Frame::Data {
            recipient,
            payload: Bytes::from(vec![7u8; n]),
        }),
        (id.clone(), any::<u32>()).prop_map(|(recipient, increment)| Frame::WindowAdjust {
            recipient,
            increment,
        }),
        (id.clone(), 0usize..3000).prop_map(|(recipient, n)| Frame::Datagram {
            recipient,
            payload: Bytes::from(vec![9u8; n]),
        }),
        id.clone().prop_map(|recipient| Frame::Eof { recipient }),
        id.clone().prop_map(|recipient| Frame::Close { recipient }),
        (id.clone(), 0u32..100, 0u32..70_000, 1u16..u16::MAX).prop_map(
            |(recipient, sender, window, max_packet)| Frame::OpenSuccess {
                recipient,
                sender,
                window,
                max_packet,
            }
        ),
        id.clone().prop_map(|recipient| Frame::OpenFailure {
            recipient,
            reason: Reason::CONNECTION_REFUSED,
            description: "no".into(),
        }),
        (0u32..100, 0u32..70_000).prop_map(|(sender, window)| Frame::Open {
            sender,
            window,
            max_packet: 1024,
            dest: "tcp://x:1".into(),
        }),
        any::<u64>().prop_map(|nonce| Frame::Pong { nonce }),
        any::<u64>().prop_map(|nonce| Frame::Ping { nonce }),
        (0u32..4).prop_map(|request| Frame::BindSuccess { request, port: 1 }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0u32..6;
    prop_oneof![
        4 => frame().prop_map(Op::Peer),
        1 => Just(Op::Open),
        1 => (id.clone(), 0usize..5000).prop_map(|(i, n)| Op::Send(i, n)),
        1 => (id.clone(), 0usize..70_000).prop_map(|(i, n)| Op::SendDatagram(i, n)),
        1 => id.clone().prop_map(Op::SendEof),
        1 => (id.clone(), 0usize..5000).prop_map(|(i, n)| Op::Delivered(i, n)),
        1 => id.clone().prop_map(Op::EofDelivered),
        1 => id.clone().prop_map(Op::Abort),
        1 => id.clone().prop_map(Op::Abandon),
        1 => id.clone().prop_map(Op::LocalOpened),
        1 => id.clone().prop_map(Op::LocalClosed),
        1 => Just(Op::AcceptNext),
        1 => Just(Op::RefuseNext),
        1 => (0u64..2_000).prop_map(Op::Tick),
    ]
}

fn config() -> MuxConfig {
    MuxConfig {
        window: WindowConfig {
            initial: 4096,
            max: 65536,
        },
        budget: 20_000,
        max_streams: 8,
        send_queue: 8192,
        send_total: 24 * 1024,
        control_limit: 1 << 20,
        keepalive: Duration::from_millis(300),
        dead_after: Duration::from_secs(3600),
        open_timeout: Duration::from_millis(500),
        idle_timeout: None,
        rtt_floor: Duration::from_millis(1),
        jmux: false,
        extensions: true,
        our_max_packet: 2048,
        send_max_payload: 2048,
        resumable: false,
    }
}

/// Takes every event out; keeps the peer's OPEN requests for later answers.
fn drain(m: &mut Mux, requests: &mut Vec<IncomingOpen>) {
    while let Some(e) = m.poll_event() {
        if let Event::OpenRequest { open, .. } = e {
            requests.push(open);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn any_sequence_leaves_no_stream_and_no_budget_behind(ops in proptest::collection::vec(op(), 0..80)) {
        let mut m = Mux::new(config());
        let mut now = 0u64;
        let mut requests: Vec<IncomingOpen> = vec![];
        for op in ops {
            match op {
                Op::Peer(f) => {
                    let r = m.handle_frame(f, now);
                    // A violation always ends the session, with a reason.
                    if r.is_err() {
                        prop_assert!(m.dead().is_some());
                    }
                }
                Op::Open => { let _ = m.open("tcp://y:2", now); }
                Op::Send(id, n) => {
                    if let Some(room) = m.send_room(id) {
                        m.send(id, Bytes::from(vec![1u8; n.min(room)]));
                    }
                }
                Op::SendDatagram(id, n) => {
                    let _ = m.send_datagram(id, Bytes::from(vec![2u8; n]));
                }
                Op::SendEof(id) => m.send_eof(id),
                Op::Delivered(id, n) => m.delivered(id, n, now),
                Op::EofDelivered(id) => m.eof_delivered(id),
                Op::Abort(id) => m.abort(id),
                Op::Abandon(id) => m.abandon(id),
                Op::LocalOpened(id) => m.local_opened(id),
                Op::LocalClosed(id) => m.local_closed(id),
                Op::AcceptNext => {
                    if let Some(o) = requests.pop() {
                        m.accept_open(o, now);
                    }
                }
                Op::RefuseNext => {
                    if let Some(o) = requests.pop() {
                        m.refuse_open(o, Refused::new(Reason::NOT_ALLOWED, "no"));
                    }
                }
                Op::Tick(ms) => {
                    now += ms * 1_000_000;
                    m.handle_timeout(now);
                }
            }
            drain(&mut m, &mut requests);
            let mut batch = std::collections::VecDeque::new();
            m.poll_transmit(&mut batch, 1 << 20, 1 << 10);
            drain(&mut m, &mut requests);
        }
        // Drive every stream to its end as a well-behaved peer would.
        for o in requests.drain(..) {
            m.refuse_open(o, Refused::new(Reason::NOT_ALLOWED, "end"));
        }
        for id in m.stream_ids() {
            match m.phase(id) {
                Some(Phase::Opening { .. }) => {
                    let _ = m.handle_frame(Frame::OpenFailure {
                        recipient: id,
                        reason: Reason::GENERAL_FAILURE,
                        description: String::new(),
                    }, now);
                }
                Some(Phase::Open { .. }) => {
                    m.abort(id);
                    let _ = m.handle_frame(Frame::Close { recipient: id }, now);
                }
                Some(Phase::CloseSent) => {
                    let _ = m.handle_frame(Frame::Close { recipient: id }, now);
                }
                None => {}
            }
            drain(&mut m, &mut requests);
        }
        // Closed streams whose local socket is still open keep their
        // budget until the runtime closes it.
        for id in m.draining_ids() {
            m.local_closed(id);
        }
        prop_assert!(m.stream_ids().is_empty(), "streams left: {:?}", m.stream_ids());
        prop_assert!(m.draining_ids().is_empty());
        prop_assert_eq!(m.stats().budget_used, 0);
    }
}
