//! Tests of a striped session's link layer (`lanes`): control frames at
//! the replay bound, owed ACKs, the order of a cut frame's rest.

use super::*;

#[cfg(test)]
fn test_link(peer_limit: usize) -> LinkLayer {
    LinkLayer::new(
        1 << 20,
        peer_limit,
        2,
        crate::resume::SessionId([0; 16]),
        crate::resume::Secret([0; 32]),
        String::new(),
    )
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::test_link;

    pub(super) fn data(n: usize) -> OutFrame {
        let mut h = [0u8; DATA_HEADER_LEN];
        crate::frame::write_data_header(&mut h, 1, n);
        OutFrame::data(h, Bytes::from(vec![1u8; n]))
    }

    fn pong() -> OutFrame {
        OutFrame::encoded(Frame::Pong { nonce: 7 }.to_bytes().unwrap())
    }

    #[test]
    fn control_frames_still_go_at_the_replay_bound() {
        let mut l = test_link(256 << 10);
        let a = l.attach(0).unwrap();
        l.attach(1).unwrap();
        // Fill the replay bound with data nobody acknowledges.
        while l.replay.room() > 0 {
            l.next_chunk(a, CHUNK_FILL, 0, |b, out| {
                out.push_back(data(b.bytes.clamp(1, 60_000)));
                true
            })
            .unwrap();
        }
        let c = l
            .next_chunk(a, CHUNK_FILL, 0, |b, out| {
                assert_eq!(b.bytes, 0);
                assert!(b.control > 0);
                out.push_back(pong());
                false
            })
            .expect("the PONG goes");
        assert!(c.len > 0);
    }
}

#[cfg(test)]
mod owed {
    use super::super::*;
    use super::test_link;

    fn striped() -> (LinkLayer, CarrierId, CarrierId) {
        let mut l = test_link(1 << 20);
        let a = l.attach(0).unwrap();
        let b = l.attach(1).unwrap();
        (l, a, b)
    }

    fn ping() -> OutFrame {
        OutFrame::encoded(Frame::Ping { nonce: 1 }.to_bytes().unwrap())
    }

    fn has_ack(c: &Chunk) -> bool {
        c.pieces
            .front()
            .is_some_and(|p| p[0] == crate::frame::T_ACK)
    }

    #[test]
    fn an_ack_lost_with_its_lane_is_sent_again() {
        let (mut l, a, b) = striped();
        let body = ping().body;
        assert!(l.on_chunk(a, 0, BytesMut::from(&body[..])).unwrap());
        while l.next_run().is_some() {}
        // The tick owes an ACK for it, on every lane (one might stall)…
        assert!(l.on_tick(0, |_| Duration::from_secs(1)).wake_all);
        let c = l.next_chunk(a, CHUNK_FILL, 0, |_, _| false).unwrap();
        assert!(has_ack(&c) && c.len == 0);
        assert!(l.next_chunk(a, CHUNK_FILL, 0, |_, _| false).is_none());
        assert!(has_ack(
            &l.next_chunk(b, CHUNK_FILL, 0, |_, _| false).unwrap()
        ));
        assert!(l.next_chunk(b, CHUNK_FILL, 0, |_, _| false).is_none());
        // …and when a lane dies, the others owe it again.
        l.carrier_lost(a, 1);
        let c = l.next_chunk(b, CHUNK_FILL, 0, |_, _| false).unwrap();
        assert!(has_ack(&c));
        // A chunk that arrives twice means the peer did not hear the ACK.
        assert!(l.on_chunk(b, 0, BytesMut::from(&body[..])).unwrap());
        assert!(l.ack_wanted());
        assert!(has_ack(
            &l.next_chunk(b, CHUNK_FILL, 0, |_, _| false).unwrap()
        ));
    }

    #[test]
    fn a_stalled_chunk_asks_every_lane_to_look() {
        let (mut l, a, b) = striped();
        let c = l.next_chunk(a, CHUNK_FILL, 0, |_, out| {
            out.push_back(ping());
            false
        });
        assert!(c.is_some_and(|c| c.len > 0));
        let t = l.on_tick(10_000_000_000, |_| Duration::from_millis(300));
        assert_eq!(t.stalled, vec![a]);
        assert!(t.wake_all, "the lane woken might be the one avoided");
        // The stalled lane finds only an ACK to send; the other takes the
        // chunk again, with the ACK.
        let c = l.next_chunk(a, CHUNK_FILL, 1, |_, _| false).unwrap();
        assert_eq!(c.len, 0);
        let c = l.next_chunk(b, CHUNK_FILL, 1, |_, _| false).unwrap();
        assert!(c.resent && c.len > 0 && has_ack(&c));
    }
}

#[cfg(test)]
mod order {
    use super::super::*;
    use super::test_link;
    use super::tests::data;
    use crate::frame::DecodeLimits;

    fn frames_of(c: Chunk) -> Vec<Frame> {
        let mut b = BytesMut::new();
        for p in c.pieces {
            b.extend_from_slice(&p);
        }
        let mut out = Vec::new();
        while let Some(f) = crate::frame::decode(&mut b, DecodeLimits::default()).unwrap() {
            if let Frame::Chunk { len, .. } = f {
                let mut body = b.split_to(len as usize);
                while let Some(g) =
                    crate::frame::decode(&mut body, DecodeLimits::default()).unwrap()
                {
                    out.push(g);
                }
            } else {
                out.push(f);
            }
        }
        out
    }

    #[test]
    fn a_streams_eof_never_overtakes_the_rest_of_its_cut_frame() {
        let mut l = test_link(256 << 10);
        let a = l.attach(0).unwrap();
        l.attach(1).unwrap();
        // Fill the replay bound to 2 112 bytes short…
        l.next_chunk(a, 1 << 20, 0, |_, out| {
            out.extend((0..4).map(|_| data(65_000)));
            true
        })
        .unwrap();
        assert_eq!(l.replay().room(), 2112);
        // …so the next frame is cut: its rest waits, and the room is gone.
        l.next_chunk(a, 1 << 20, 0, |_, out| {
            out.push_back(data(60_000));
            false
        })
        .unwrap();
        assert_eq!(l.replay().room(), 0);
        // The stream's EOF is queued now: it goes after the rest.
        let eof = OutFrame::encoded(Frame::Eof { recipient: 1 }.to_bytes().unwrap());
        let mut eof = Some(eof);
        let c = l
            .next_chunk(a, 1 << 20, 0, |b, out| {
                assert!(b.control > 0);
                out.extend(eof.take());
                false
            })
            .unwrap();
        let kinds: Vec<u8> = frames_of(c)
            .iter()
            .map(Frame::type_code)
            .filter(|&k| k != crate::frame::T_ACK)
            .collect();
        assert_eq!(kinds, vec![crate::frame::T_DATA, crate::frame::T_EOF]);
    }
}
