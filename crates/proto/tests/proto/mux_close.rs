//! How a stream's end reaches the runtime: a CLOSE that cuts the peer's
//! data short is a reset (native mode), a CLOSE after EOF is not; and a
//! closed stream whose bytes are still being written keeps its budget and
//! its slot until they are.

use crate::mux_common;

use bytes::Bytes;
use longhaul_proto::frame::Frame;
use longhaul_proto::mux::{Event, Mux};
use mux_common::{accepted, config};

fn finished(m: &mut Mux) -> (bool, bool) {
    while let Some(e) = m.poll_event() {
        if let Event::Finished { discard, reset, .. } = e {
            return (discard, reset);
        }
    }
    panic!("no Finished event");
}

#[test]
fn close_without_eof_is_a_reset_in_native_mode_only() {
    for (jmux, want) in [(false, true), (true, false)] {
        let mut m = Mux::new(config(jmux));
        let id = accepted(&mut m, 7);
        m.handle_frame(Frame::Close { recipient: id }, 0).unwrap();
        assert_eq!(finished(&mut m), (false, want), "jmux {jmux}");
    }
}

#[test]
fn close_after_eof_is_a_clean_end() {
    let mut m = Mux::new(config(false));
    let id = accepted(&mut m, 7);
    m.handle_frame(Frame::Eof { recipient: id }, 0).unwrap();
    m.handle_frame(Frame::Close { recipient: id }, 0).unwrap();
    assert_eq!(finished(&mut m), (false, false));
}

#[test]
fn our_local_failure_resets_the_peer_side() {
    let mut m = Mux::new(config(false));
    let id = accepted(&mut m, 7);
    m.abort(id);
    assert_eq!(finished(&mut m), (true, true));
}

#[test]
fn a_closed_stream_keeps_budget_and_slot_until_its_socket_is_closed() {
    let mut m = Mux::new(config(false));
    let id = accepted(&mut m, 7);
    m.local_opened(id);
    let before = m.stats().budget_used;
    m.handle_frame(
        Frame::Data {
            recipient: id,
            payload: Bytes::from(vec![1u8; 3000]),
        },
        0,
    )
    .unwrap();
    m.handle_frame(Frame::Close { recipient: id }, 0).unwrap();
    while m.poll_event().is_some() {}
    // The stream is closed, its socket still open (its 3000 bytes on their
    // way): its budget and slot stay taken (max_streams is 2: one more
    // stream, not two).
    assert!(m.stream_ids().is_empty());
    assert_eq!(m.draining_ids(), vec![id]);
    assert_eq!(m.stats().budget_used, before);
    assert_eq!(m.stats().streams, 1);
    m.open("tcp://y:1", 0).unwrap();
    assert!(
        m.open("tcp://y:2", 0).is_err(),
        "the draining stream holds a slot"
    );
    // Written, but the socket still open (a reset waits for the bytes to
    // be taken): still held.
    m.delivered(id, 3000, 0);
    assert_eq!(m.draining_ids(), vec![id]);
    m.local_closed(id);
    assert!(m.draining_ids().is_empty());
    assert_eq!(m.stats().streams, 1);
    m.open("tcp://y:3", 0).unwrap();
}

#[test]
fn a_stream_without_a_socket_or_closed_by_us_holds_nothing_after_close() {
    // No local socket yet.
    let mut m = Mux::new(config(false));
    let id = accepted(&mut m, 7);
    m.handle_frame(Frame::Close { recipient: id }, 0).unwrap();
    assert!(m.draining_ids().is_empty());
    assert_eq!(m.stats().budget_used, 0);
    // Our socket failed (its data dropped): the peer's CLOSE frees it.
    let mut m = Mux::new(config(false));
    let id = accepted(&mut m, 7);
    m.local_opened(id);
    m.abort(id);
    m.handle_frame(Frame::Close { recipient: id }, 0).unwrap();
    assert!(m.draining_ids().is_empty());
    assert_eq!(m.stats().budget_used, 0);
}

#[test]
fn a_tiny_maximum_packet_size_is_refused() {
    // In an OPEN…
    let mut m = Mux::new(config(false));
    let r = m.handle_frame(
        Frame::Open {
            sender: 1,
            window: 4096,
            max_packet: 1,
            dest: "tcp://x:1".into(),
        },
        0,
    );
    assert!(r.is_err());
    assert!(
        m.dead().unwrap().contains("maximum packet size 1"),
        "{:?}",
        m.dead()
    );
    // …and in an OPEN_SUCCESS (JMUX counts the header: 9 is still tiny).
    let mut m = Mux::new(config(true));
    let id = m.open("tcp://y:1", 0).unwrap();
    let r = m.handle_frame(
        Frame::OpenSuccess {
            recipient: id,
            sender: 5,
            window: 4096,
            max_packet: 9,
        },
        0,
    );
    assert!(r.is_err());
}

#[test]
fn what_a_session_queues_outbound_is_bounded_across_streams() {
    let mut cfg = config(false);
    cfg.max_streams = 64;
    cfg.send_queue = 16 << 10;
    cfg.send_total = 40 << 10;
    let mut m = Mux::new(cfg);
    let mut ids = vec![];
    for k in 0..8 {
        m.handle_frame(
            Frame::Open {
                sender: k,
                window: 1 << 20,
                max_packet: 4096,
                dest: "tcp://x:1".into(),
            },
            0,
        )
        .unwrap();
        let open = loop {
            if let Some(Event::OpenRequest { open, .. }) = m.poll_event() {
                break open;
            }
        };
        ids.push(m.accept_open(open, 0).unwrap());
    }
    // Every stream sends as much as it may: the session holds ≤ 40 KiB.
    let mut queued = 0;
    for &id in &ids {
        let n = m.send_room(id).unwrap();
        m.send(id, Bytes::from(vec![0u8; n]));
        queued += n;
    }
    assert!(queued <= 40 << 10, "{queued} bytes queued");
    assert_eq!(m.send_room(ids[7]), Some(0));
    // Once the carrier takes them, the waiting streams may send again.
    let mut batch = std::collections::VecDeque::new();
    m.poll_transmit(&mut batch, 1 << 20, 1 << 10);
    let mut writable = 0;
    while let Some(e) = m.poll_event() {
        if matches!(e, Event::Writable { .. }) {
            writable += 1;
        }
    }
    assert!(writable >= 1);
    assert!(m.send_room(ids[7]).unwrap() > 0);
}
