//! Frames the core writes: DATA frames on a slow path are cut short (a
//! frame once started must be written whole, so whatever is queued behind
//! it, a keystroke or a datagram, waits for all of it); a refusal that
//! quotes a frame-long destination is cut to fit.

use crate::mux_common;

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use longhaul_proto::frame::{self, DecodeLimits, Frame, Reason, MAX_DATA_PAYLOAD, MAX_FRAME_LEN};
use longhaul_proto::mux::{Event, Mux, MuxConfig, Refused, MAX_DESCRIPTION, MIN_FRAME_CAP};
use longhaul_proto::window::WindowConfig;

/// Large windows and queues, frames as large as the protocol allows.
fn mux() -> Mux {
    Mux::new(MuxConfig {
        window: WindowConfig {
            initial: 1 << 20,
            max: 1 << 20,
        },
        budget: 1 << 24,
        send_queue: 1 << 22,
        send_total: 1 << 22,
        our_max_packet: u16::MAX,
        send_max_payload: MAX_DATA_PAYLOAD,
        ..mux_common::config(false)
    })
}

/// Payload sizes of the DATA frames `m` writes for `len` bytes.
fn frames_for(m: &mut Mux, id: u32, len: usize) -> Vec<usize> {
    m.send(id, Bytes::from(vec![7u8; len]));
    let mut batch = VecDeque::new();
    m.poll_transmit(&mut batch, usize::MAX, usize::MAX);
    batch
        .iter()
        .filter(|f| !f.head().is_empty())
        .map(|f| f.body.len())
        .collect()
}

#[test]
fn a_slow_path_gets_smaller_data_frames() {
    let mut m = mux();
    m.handle_frame(
        Frame::Open {
            sender: 9,
            window: 1 << 30,
            max_packet: u16::MAX,
            dest: "tcp://x:1".into(),
        },
        0,
    )
    .unwrap();
    let open = match m.poll_event() {
        Some(Event::OpenRequest { open, .. }) => open,
        e => panic!("{e:?}"),
    };
    let id = m.accept_open(open, 0).unwrap();
    let mut batch = VecDeque::new();
    m.poll_transmit(&mut batch, usize::MAX, usize::MAX);

    // Rate unknown: frames as large as the peer takes.
    let sizes = frames_for(&mut m, id, 200_000);
    assert_eq!(sizes.iter().sum::<usize>(), 200_000);
    assert_eq!(sizes[0], MAX_DATA_PAYLOAD);

    // 1.4 Mbit/s: 10 ms is 1 750 bytes, so the floor.
    m.set_path_rate(175_000);
    let sizes = frames_for(&mut m, id, 20_000);
    assert_eq!(sizes.iter().sum::<usize>(), 20_000);
    assert!(sizes.iter().all(|&n| n <= MIN_FRAME_CAP), "{sizes:?}");

    // 40 Mbit/s: 50 000 bytes.
    m.set_path_rate(5_000_000);
    let sizes = frames_for(&mut m, id, 120_000);
    assert_eq!(sizes, vec![50_000, 50_000, 20_000]);

    // A fast path: whole frames again.
    m.set_path_rate(1_000_000_000);
    let sizes = frames_for(&mut m, id, 70_000);
    assert_eq!(sizes, vec![MAX_DATA_PAYLOAD, 70_000 - MAX_DATA_PAYLOAD]);
}

/// The peer's OPEN names a destination as long as a frame, and the refusal
/// quotes it: the OPEN_FAILURE still goes out (an over-long frame used to
/// be dropped, leaving the OPEN unanswered), its description cut.
#[test]
fn a_refusal_quoting_a_long_destination_still_goes_out() {
    let mut m = mux();
    // The cut falls inside an "é" (the quote's prefix has an even length).
    let dest = format!("tcp://x{}", "é".repeat((MAX_FRAME_LEN - 32) / 2));
    m.handle_frame(
        Frame::Open {
            sender: 9,
            window: 1 << 16,
            max_packet: u16::MAX,
            dest: dest.clone(),
        },
        0,
    )
    .unwrap();
    let open = match m.poll_event() {
        Some(Event::OpenRequest { open, .. }) => open,
        e => panic!("{e:?}"),
    };
    let why = format!("unsupported destination '{dest}'");
    m.refuse_open(open, Refused::new(Reason::ADDRESS_TYPE_NOT_SUPPORTED, why));
    match &sent(&mut m)[..] {
        [Frame::OpenFailure {
            recipient: 9,
            description,
            ..
        }] => {
            assert!(
                description.len() <= MAX_DESCRIPTION,
                "{}",
                description.len()
            );
            assert!(description.starts_with("unsupported destination 'tcp://xéé"));
            assert!(description.ends_with('…'));
        }
        f => panic!("expected the OPEN_FAILURE, got {f:?}"),
    }
}

/// Our own OPEN or BIND too long for a frame is refused at once (it would
/// never be sent, and its opener would wait out the open timeout); one
/// that just fits goes out. A peer's BIND whose destination our OPENs
/// could not carry back is refused.
#[test]
fn an_open_too_long_for_a_frame_is_refused_at_once() {
    let mut m = mux();
    // An OPEN is 4 bytes of header and 10 of fields before its destination.
    let fits = "y".repeat(MAX_FRAME_LEN - 14);
    let over = format!("{fits}y");
    let e = m.open(&over, 0).unwrap_err();
    assert!(e.description.contains("too long"), "{e:?}");
    let e = m.bind("0", &over, 0).unwrap_err();
    assert!(e.description.contains("too long"), "{e:?}");
    m.open(&fits, 0).unwrap();
    m.bind("0", &fits, 0).unwrap();
    match &sent(&mut m)[..] {
        [Frame::Open { dest, .. }, Frame::Bind { dest: back, .. }] => {
            assert_eq!(dest, &fits);
            assert_eq!(back, &fits);
        }
        f => panic!("expected the OPEN and the BIND, got {f:?}"),
    }

    // The peer's BIND fits a frame, an OPEN back to its destination would not.
    m.handle_frame(
        Frame::Bind {
            request: 7,
            bind: "0".into(),
            dest: over,
        },
        0,
    )
    .unwrap();
    match &sent(&mut m)[..] {
        [Frame::BindFailure {
            request: 7,
            description,
            ..
        }] => assert!(description.contains("too long"), "{description}"),
        f => panic!("expected the BIND_FAILURE, got {f:?}"),
    }
}

/// The frames `m` has to send, decoded.
fn sent(m: &mut Mux) -> Vec<Frame> {
    let mut batch = VecDeque::new();
    m.poll_transmit(&mut batch, usize::MAX, usize::MAX);
    let mut wire = BytesMut::new();
    for f in batch {
        wire.extend_from_slice(f.head());
        wire.extend_from_slice(&f.body);
    }
    std::iter::from_fn(|| frame::decode(&mut wire, DecodeLimits::default()).unwrap()).collect()
}
