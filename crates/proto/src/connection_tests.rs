//! Unit tests of `Connection`'s rules.

use super::datagrams::PATH_BURST;
use super::*;
use crate::mux::MuxConfig;
use crate::resume::{Secret, SessionId};
use crate::window::WindowConfig;

fn resumable() -> (Connection, CarrierId) {
    let (c, ids) = with_lanes(1);
    (c, ids[0])
}

/// A resumable connection with `lanes` carriers attached (striped from 2).
fn with_lanes(lanes: u8) -> (Connection, Vec<CarrierId>) {
    with_replay(lanes, 1 << 20)
}

/// The same, keeping at most `replay` bytes unacknowledged.
fn with_replay(lanes: u8, replay: usize) -> (Connection, Vec<CarrierId>) {
    let mux = Mux::new(MuxConfig {
        window: WindowConfig {
            initial: 4096,
            max: 65536,
        },
        budget: 1 << 20,
        max_streams: 4,
        send_queue: 8192,
        send_total: 65536,
        control_limit: 1 << 20,
        keepalive: Duration::from_secs(30),
        dead_after: Duration::from_secs(3600),
        open_timeout: Duration::from_secs(5),
        idle_timeout: None,
        rtt_floor: Duration::from_millis(1),
        jmux: false,
        extensions: true,
        our_max_packet: 4096,
        send_max_payload: 4096,
        resumable: true,
    });
    let mut link = LinkLayer::new(
        replay,
        1 << 20,
        lanes,
        SessionId([0; 16]),
        Secret([0; 32]),
        String::new(),
    );
    let ids = (0..lanes.max(1)).map(|n| link.attach(n).unwrap()).collect();
    let limits = DecodeLimits {
        max_frame: 65535,
        extensions: true,
    };
    (Connection::new(mux, Some(link), limits), ids)
}

/// Everything `from` has for single carrier `id`, written in full.
fn transmit(from: &mut Connection, id: CarrierId) -> BytesMut {
    let mut batch = VecDeque::new();
    from.poll_transmit(id, &mut batch, 1 << 20, 1024);
    let total: usize = batch.iter().map(OutFrame::remaining).sum();
    let mut wire = BytesMut::new();
    for f in &batch {
        wire.extend_from_slice(f.head());
        wire.extend_from_slice(&f.body);
    }
    from.on_written(&mut batch, total);
    wire
}

/// What `from`'s writer of `lane` sends until it has nothing more.
fn lane_bytes(from: &mut Connection, lane: CarrierId) -> BytesMut {
    let mut wire = BytesMut::new();
    while let LaneOutput::Chunk(c) = from.poll_chunk(lane, 1 << 20, 0) {
        for p in c.pieces {
            wire.extend_from_slice(&p);
        }
    }
    wire
}

/// A lane's reader: hands what `wire` holds to `to` as the runtime does.
fn lane_read(to: &mut Connection, lane: CarrierId, mut wire: BytesMut) {
    while let Some(f) = frame::decode(&mut wire, DecodeLimits::default()).unwrap() {
        let r = match f {
            Frame::Ack { received } => to.on_ack(lane, received, 0),
            Frame::Chunk { len, .. } if wire.len() < len as usize => panic!("a chunk cut short"),
            Frame::Chunk { offset, len } => {
                let data = wire.split_to(len as usize);
                to.on_chunk(lane, offset, data, 0)
            }
            f => to.on_lane_datagram(lane, f, 0),
        };
        assert!(matches!(r, Received::Taken { .. }), "{r:?}");
    }
}

/// Opens a flow from `a` to `b` over a single carrier each way; returns
/// each side's id for it.
fn open_flow(a: &mut Connection, ia: CarrierId, b: &mut Connection, ib: CarrierId) -> (u32, u32) {
    let id = a.mux_mut().open("udp://dns:53", 0).unwrap();
    let mut w = transmit(a, ia);
    b.on_bytes(ib, &mut w, true, 0);
    let open = open_request(b.mux_mut());
    let theirs = b.mux_mut().accept_open(open, 0).unwrap();
    let mut w = transmit(b, ib);
    a.on_bytes(ia, &mut w, true, 0);
    (id, theirs)
}

/// The peer's OPEN that `m` was handed.
fn open_request(m: &mut Mux) -> crate::mux::IncomingOpen {
    loop {
        match m.poll_event() {
            Some(crate::mux::Event::OpenRequest { open, .. }) => return open,
            Some(_) => {}
            None => panic!("no OPEN arrived"),
        }
    }
}

fn datagram_event(c: &mut Connection) -> Option<(u32, Bytes)> {
    while let Some(e) = c.mux_mut().poll_event() {
        if let crate::mux::Event::Datagram { id, payload } = e {
            return Some((id, payload));
        }
    }
    None
}

/// On a single carrier with a link layer, a datagram is neither counted
/// nor recorded for a replay (a resume would bring it back stale), and
/// one the writer had taken when the carrier dropped is not kept.
#[test]
fn a_datagram_is_not_sequenced_on_a_single_carrier() {
    let (mut a, ia) = resumable();
    let (mut b, ib) = resumable();
    let (flow, theirs) = open_flow(&mut a, ia, &mut b, ib);
    let sent = a.link().unwrap().replay().sent();
    let received = b.link().unwrap().received();
    a.mux_mut()
        .send_datagram(flow, Bytes::from_static(b"query"))
        .unwrap();
    let mut w = transmit(&mut a, ia);
    assert_eq!(a.link().unwrap().replay().sent(), sent, "recorded");
    b.on_bytes(ib, &mut w, true, 0);
    assert_eq!(
        datagram_event(&mut b),
        Some((theirs, Bytes::from_static(b"query")))
    );
    assert_eq!(b.link().unwrap().received(), received, "counted");

    // Taken by the writer, not written, carrier lost: not kept.
    a.mux_mut()
        .send_datagram(flow, Bytes::from_static(b"stale"))
        .unwrap();
    let mut batch = VecDeque::new();
    a.poll_transmit(ia, &mut batch, 1 << 20, 64);
    assert!(batch.iter().any(OutFrame::is_datagram));
    a.link_mut().unwrap().save_leftover(batch);
    let _ = a.carrier_lost(ia, 1, "test");
    assert!(a.link_mut().unwrap().take_leftover().is_empty());
}

/// On a striped session a datagram goes on the lane that asks, outside
/// any chunk, and is handed on at once even while the peer's reorder
/// buffer waits for a chunk stuck on another lane.
#[test]
fn a_striped_datagram_does_not_wait_behind_a_stalled_lane() {
    let (mut a, la) = with_lanes(2);
    let (mut b, lb) = with_lanes(2);
    let id = a.mux_mut().open("udp://dns:53", 0).unwrap();
    lane_read(&mut b, lb[0], lane_bytes(&mut a, la[0]));
    let open = open_request(b.mux_mut());
    let theirs = b.mux_mut().accept_open(open, 0).unwrap();
    lane_read(&mut a, la[0], lane_bytes(&mut b, lb[0]));
    // Lane 0 stalls with a keepalive PING in it: b's reorder buffer waits
    // for it.
    a.handle_timeout(31_000_000_000);
    let stuck = lane_bytes(&mut a, la[0]);
    assert!(!stuck.is_empty());
    let sent = a.link().unwrap().replay().sent();
    a.mux_mut()
        .send_datagram(id, Bytes::from_static(b"voice"))
        .unwrap();
    let wire = lane_bytes(&mut a, la[1]);
    assert_eq!(
        wire[0],
        crate::frame::T_DATAGRAM,
        "outside any chunk, first"
    );
    assert_eq!(a.link().unwrap().replay().sent(), sent, "sequenced");
    lane_read(&mut b, lb[1], wire);
    assert_eq!(
        datagram_event(&mut b),
        Some((theirs, Bytes::from_static(b"voice")))
    );
}

/// The single carrier's writer gets the owed ACK first and then what
/// the multiplexer has; what it writes is recorded in wire order
/// (ACKs are not: they are never replayed); a carrier no longer
/// current gets nothing.
#[test]
fn a_single_carrier_transmits_the_ack_first_and_records_what_it_writes() {
    let (mut c, id) = resumable();
    let mut input = BytesMut::from(&Frame::Ping { nonce: 9 }.to_bytes().unwrap()[..]);
    assert!(matches!(
        c.on_bytes(id, &mut input, true, 0),
        Received::Taken { .. }
    ));
    let mut batch = VecDeque::new();
    c.poll_transmit(id, &mut batch, 1 << 20, 32);
    assert!(batch.len() >= 2, "an ACK and the PONG");
    assert!(batch[0].is_link(), "the ACK leads");
    assert!(batch.iter().skip(1).all(|f| !f.is_link()));
    let replayable: usize = batch.iter().skip(1).map(OutFrame::remaining).sum();
    let total: usize = batch.iter().map(OutFrame::remaining).sum();
    // Written in two parts: a frame is recorded once, when it starts.
    c.on_written(&mut batch, total - 1);
    c.on_written(&mut batch, 1);
    assert!(batch.is_empty());
    assert_eq!(c.link().unwrap().replay().sent(), replayable as u64);

    // Output waiting (a PONG, an ACK owed) when the carrier is lost:
    // its writer gets none of it; it waits for the next carrier.
    let mut ping = BytesMut::from(&Frame::Ping { nonce: 10 }.to_bytes().unwrap()[..]);
    let _ = c.on_bytes(id, &mut ping, true, 2);
    assert!(c.mux().has_output());
    let _ = c.carrier_lost(id, 3, "test");
    assert_eq!(c.poll_transmit(id, &mut batch, 1 << 20, 32), 0);
    assert!(batch.is_empty(), "nothing for a carrier no longer current");
    assert!(c.mux().has_output());
}

/// An ACK that frees replay room wakes the single carrier's writer only
/// when output waits for that room: otherwise a request answered at once
/// would wake it twice per round trip.
#[test]
fn an_ack_wakes_the_writer_only_for_output_waiting_on_replay_room() {
    let (mut a, ids) = with_replay(1, 256);
    let ia = ids[0];
    let (mut b, ib) = resumable();
    let wake = |r: Received| match r {
        Received::Taken { wake } => wake,
        r => panic!("{r:?}"),
    };
    let id = a.mux_mut().open("tcp://example:1", 0).unwrap();
    let mut w = transmit(&mut a, ia);
    let _ = b.on_bytes(ib, &mut w, true, 0);
    let open = open_request(b.mux_mut());
    let theirs = b.mux_mut().accept_open(open, 0).unwrap();
    let mut w = transmit(&mut b, ib);
    let _ = a.on_bytes(ia, &mut w, true, 0);
    // DATA beyond the replay bound waits for the peer's ACK.
    // (A frame taken may overshoot the room; the next one waits.)
    a.mux_mut().send(id, Bytes::from(vec![7u8; 1000]));
    let mut to_b = transmit(&mut a, ia);
    a.mux_mut().send(id, Bytes::from(vec![8u8; 1000]));
    to_b.extend_from_slice(&transmit(&mut a, ia));
    assert_eq!(a.link().unwrap().room(), 0);
    assert!(a.mux().has_output(), "DATA waits for replay room");
    // The ACK comes in front of what `b` sends next.
    let _ = b.on_bytes(ib, &mut to_b, true, 0);
    b.mux_mut().send(theirs, Bytes::from_static(b"x"));
    let mut from_b = transmit(&mut b, ib);
    assert!(
        wake(a.on_bytes(ia, &mut from_b, true, 0)),
        "output waits for the room freed"
    );
    // Once everything is sent, an ACK that frees room for nothing waiting
    // wakes no writer.
    for _ in 0..100 {
        let mut to_b = transmit(&mut a, ia);
        let _ = b.on_bytes(ib, &mut to_b, true, 0);
        b.mux_mut().send(theirs, Bytes::from_static(b"x"));
        let mut from_b = transmit(&mut b, ib);
        let woke = wake(a.on_bytes(ia, &mut from_b, true, 0));
        assert!(!woke || a.mux().has_output(), "a wake with nothing waiting");
        if !a.mux().has_output() && a.link().unwrap().replay().held() == 0 {
            return;
        }
    }
    panic!("the stream's data never all went");
}

/// The server's resume expiry is a deadline of the connection: none
/// while attached, `--resume-timeout` after the carrier was lost, the
/// session closed with that reason when it passes, and kept when a
/// resume came first.
#[test]
fn a_detached_session_expires_at_its_resume_timeout() {
    const S: u64 = 1_000_000_000;
    let (mut c, id) = resumable();
    c.set_resume_timeout(Some(Duration::from_secs(30)));
    assert_eq!(
        c.carrier_lost(id, 10 * S, "test"),
        Loss::Link(Lost::Detached)
    );
    assert_eq!(
        c.poll_timeout(),
        Some(40 * S),
        "the resume's deadline comes first"
    );
    c.handle_timeout(40 * S - 1);
    assert!(c.mux().dead().is_none());
    c.handle_timeout(40 * S);
    let why = c.mux().dead().expect("closed at its deadline");
    assert!(why.contains("--resume-timeout"), "{why}");

    // Resumed in time: no deadline of the resume's any more.
    let (mut c, id) = resumable();
    c.set_resume_timeout(Some(Duration::from_secs(30)));
    let _ = c.carrier_lost(id, 10 * S, "test");
    let (id, _) = c
        .resume(0, 0, 20 * S)
        .expect("a resume of a detached session");
    c.handle_timeout(45 * S);
    assert!(c.mux().dead().is_none());
    assert_ne!(c.poll_timeout(), Some(40 * S));
    // Lost again: the deadline runs from the latest loss.
    let _ = c.carrier_lost(id, 50 * S, "test");
    assert_eq!(c.poll_timeout(), Some(80 * S));
    // A resume that comes after the deadline is refused, even before
    // the timer has run.
    assert!(c.is_over(80 * S));
    assert!(matches!(c.resume(0, 0, 81 * S), Err(LinkError::Ended)));

    // Without a timeout (the client), a detached session waits.
    let (mut c, id) = resumable();
    let _ = c.carrier_lost(id, 10 * S, "test");
    c.handle_timeout(10_000 * S);
    assert!(c.mux().dead().is_none() && !c.is_over(10_000 * S));
}

/// A datagram path's message is one whole DATAGRAM frame, handed on and
/// neither counted nor recorded; a message from a carrier no longer
/// current is refused; anything else on the path (another frame, a frame
/// with bytes after it, garbage) ends the session.
#[test]
fn the_datagram_path_takes_one_whole_datagram_frame_per_message() {
    let (mut a, ia) = resumable();
    let (mut b, ib) = resumable();
    let (flow, theirs) = open_flow(&mut a, ia, &mut b, ib);
    a.use_datagram_path(true);
    a.mux_mut()
        .send_datagram(flow, Bytes::from_static(b"voice"))
        .unwrap();
    assert!(transmit(&mut a, ia).is_empty(), "in the byte stream");
    let msg = a.pop_path_datagram(1200, &mut usize::MAX.clone()).unwrap();
    let received = b.link().unwrap().received();
    let r = b.on_path_datagram(ib, msg.clone(), 0);
    assert_eq!(r, Received::Taken { wake: false });
    assert_eq!(
        datagram_event(&mut b),
        Some((theirs, Bytes::from_static(b"voice")))
    );
    assert_eq!(b.link().unwrap().received(), received, "counted");
    assert_eq!(b.mux().datagram_stats().path_received, 1);

    let stale = ib + 1;
    assert_eq!(b.on_path_datagram(stale, msg.clone(), 0), Received::Stale);
    let ping = Frame::Ping { nonce: 1 }.to_bytes().unwrap();
    let mut two = BytesMut::from(&msg[..]);
    two.extend_from_slice(&msg);
    for bad in [ping, two.freeze(), Bytes::from_static(&[0xff; 9])] {
        let (mut c, ic) = resumable();
        assert_eq!(c.on_path_datagram(ic, bad, 0), Received::Ended);
        assert!(c.mux().dead().is_some());
    }
}

/// While the byte stream has bytes waiting (or unacknowledged), the
/// datagram path gets a burst and then only what the stream delivers;
/// idle, all it wants.
#[test]
fn a_busy_stream_leaves_the_datagram_path_a_burst_and_an_equal_share() {
    let (mut a, ia) = resumable();
    let (mut b, ib) = resumable();
    let (flow, _) = open_flow(&mut a, ia, &mut b, ib);
    a.use_datagram_path(true);
    // Whatever the flow's opening left unacknowledged is acknowledged.
    let mut w = transmit(&mut b, ib);
    a.on_bytes(ia, &mut w, true, 0);
    let idle = a.path_room(0);
    assert!(
        idle == usize::MAX || a.link().unwrap().replay().held() > 0,
        "idle: {idle}"
    );
    // A trickle of control frames is no backlog.
    let id = a.mux_mut().open("tcp://bulk:1", 0).unwrap();
    assert!(a.path_room(0) > PATH_BURST as usize);
    let mut w = transmit(&mut a, ia);
    let _ = b.on_bytes(ib, &mut w, true, 0);
    let open = open_request(b.mux_mut());
    b.mux_mut().accept_open(open, 0).unwrap();
    let mut w = transmit(&mut b, ib);
    let _ = a.on_bytes(ia, &mut w, true, 0);
    a.mux_mut().send(id, Bytes::from(vec![1u8; 4000]));
    let room = a.path_room(0);
    assert!(room <= PATH_BURST as usize, "busy: {room}");
    let mut taken = 0;
    for _ in 0..200 {
        a.mux_mut()
            .send_datagram(flow, Bytes::from(vec![3u8; 1000]))
            .unwrap();
        let mut room = a.path_room(0);
        if room < 1100 {
            break;
        }
        taken += a.pop_path_datagram(1200, &mut room).unwrap().len();
    }
    assert!(taken <= PATH_BURST as usize && taken > 0, "{taken}");
    assert!(a.path_room(0) < 1100, "nothing delivered, no more room");
    // One too large for the path would go in the stream: under the same
    // share, so it waits too.
    a.mux_mut().pop_datagram_within(1200).unwrap().unwrap();
    a.mux_mut()
        .send_datagram(flow, Bytes::from(vec![4u8; 3000]))
        .unwrap();
    assert!(a.pop_path_datagram(1200, &mut 0).is_none());
    assert!(a.mux().has_path_datagrams(), "still waiting for a share");
    // However stuck the stream, a burst again every quarter second.
    let floor = super::datagrams::PATH_FLOOR_EVERY_NS;
    let mut room = a.path_room(floor);
    assert_eq!(room, PATH_BURST as usize);
    assert!(a.pop_path_datagram(1200, &mut room).is_none());
    assert!(
        room <= PATH_BURST as usize - 3000,
        "the large one took its share"
    );
    assert!(!a.mux().has_path_datagrams());
}
