//! What the multiplexer tests share (`mux_*.rs`): a small configuration, a stream the
//! peer opened, and the frames a multiplexer would write.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::time::Duration;

use longhaul_proto::frame::{self, Frame};
use longhaul_proto::mux::{Event, Mux, MuxConfig};
use longhaul_proto::window::WindowConfig;

/// Small windows and queues; keepalive 30 s. `jmux`: a plain JMUX peer.
pub fn config(jmux: bool) -> MuxConfig {
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
pub fn accepted(m: &mut Mux, sender: u32) -> u32 {
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
pub fn written(m: &mut Mux) -> Vec<Frame> {
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
