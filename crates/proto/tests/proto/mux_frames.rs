//! DATA frames on a slow path are cut short: a frame once started must be
//! written whole, so whatever is queued behind it (a keystroke, a
//! datagram) waits for all of it.

use crate::mux_common;

use std::collections::VecDeque;

use bytes::Bytes;
use longhaul_proto::frame::{Frame, MAX_DATA_PAYLOAD};
use longhaul_proto::mux::{Event, Mux, MuxConfig, MIN_FRAME_CAP};
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
