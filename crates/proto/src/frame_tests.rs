//! Codec tests: round trips, limits and hostile input.

use super::*;
use proptest::prelude::*;

fn roundtrip(f: Frame) {
    let mut b = BytesMut::new();
    f.encode(&mut b).unwrap();
    assert_eq!(b.len(), f.encoded_len());
    let got = decode(&mut b, DecodeLimits::default()).unwrap().unwrap();
    assert_eq!(got, f);
    assert!(b.is_empty());
}

#[test]
fn jmux_byte_layout() {
    // OPEN as the JMUX specification lays it out.
    let f = Frame::Open {
        sender: 1,
        window: 1024,
        max_packet: 1024,
        dest: "tcp://google.com:443".into(),
    };
    let b = f.to_bytes().unwrap();
    let mut expect = vec![100, 0, 34, 0, 0, 0, 0, 1, 0, 0, 4, 0, 4, 0];
    expect.extend_from_slice(b"tcp://google.com:443");
    assert_eq!(&b[..], &expect[..]);
    let eof = Frame::Eof { recipient: 1 }.to_bytes().unwrap();
    assert_eq!(&eof[..], &[105, 0, 8, 0, 0, 0, 0, 1]);
}

#[test]
fn partial_input_waits() {
    let b = Frame::WindowAdjust {
        recipient: 7,
        increment: 9,
    }
    .to_bytes()
    .unwrap();
    for cut in 0..b.len() {
        let mut part = BytesMut::from(&b[..cut]);
        assert_eq!(decode(&mut part, DecodeLimits::default()), Ok(None));
        assert_eq!(part.len(), cut, "nothing consumed");
    }
}

#[test]
fn rejects_bad_frames() {
    let mut tiny = BytesMut::from(&[104u8, 0, 3, 0][..]);
    assert_eq!(
        decode(&mut tiny, DecodeLimits::default()),
        Err(FrameError::TooSmall(3))
    );
    let mut big = BytesMut::from(&[104u8, 0x40, 0, 0][..]);
    let lim = DecodeLimits {
        max_frame: 4096,
        extensions: true,
    };
    assert!(matches!(
        decode(&mut big, lim),
        Err(FrameError::TooLarge { .. })
    ));
    let mut ext = Frame::Ping { nonce: 1 }.to_bytes().unwrap().into();
    let jmux = DecodeLimits {
        max_frame: MAX_FRAME_LEN,
        extensions: false,
    };
    assert_eq!(decode(&mut ext, jmux), Err(FrameError::UnknownType(110)));
    let mut short = BytesMut::from(&[103u8, 0, 8, 0, 0, 0, 0, 1][..]);
    assert_eq!(
        decode(&mut short, DecodeLimits::default()),
        Err(FrameError::Truncated("WINDOW_ADJUST"))
    );
}

#[test]
fn oversized_data_is_refused_by_encoder() {
    let f = Frame::Data {
        recipient: 1,
        payload: Bytes::from(vec![0; MAX_DATA_PAYLOAD + 1]),
    };
    assert!(matches!(f.to_bytes(), Err(FrameError::Oversized(_))));
    roundtrip(Frame::Data {
        recipient: 1,
        payload: Bytes::from(vec![7; MAX_DATA_PAYLOAD]),
    });
}

#[test]
fn data_header_matches_encoder() {
    let payload = Bytes::from_static(b"hello");
    let f = Frame::Data {
        recipient: 42,
        payload: payload.clone(),
    }
    .to_bytes()
    .unwrap();
    let mut h = [0u8; 8];
    write_data_header(&mut h, 42, payload.len());
    assert_eq!(&f[..8], &h);
}

#[test]
fn dest_urls() {
    assert_eq!(parse_dest("tcp://[::1]:80"), Some(("::1".to_string(), 80)));
    assert_eq!(parse_dest("tcp://a.b:1"), Some(("a.b".to_string(), 1)));
    assert_eq!(parse_dest("udp://a.b:1"), None);
    assert_eq!(parse_dest("tcp://:1"), None);
    assert_eq!(format_dest("::1", 5), "tcp://[::1]:5");
    assert_eq!(
        parse_target("udp://[::1]:53"),
        Some((Transport::Udp, "::1".to_string(), 53))
    );
    assert_eq!(parse_target("sctp://a:1"), None);
    assert_eq!(format_target(Transport::Udp, "a.b", 53), "udp://a.b:53");
}

#[test]
fn datagrams_keep_their_bytes_and_need_extensions() {
    let f = Frame::Datagram {
        recipient: 3,
        payload: Bytes::from_static(b"\x00dns query"),
    };
    roundtrip(f.clone());
    let mut b = BytesMut::from(&f.to_bytes().unwrap()[..]);
    let jmux = DecodeLimits {
        max_frame: MAX_FRAME_LEN,
        extensions: false,
    };
    assert_eq!(
        decode(&mut b, jmux),
        Err(FrameError::UnknownType(T_DATAGRAM))
    );
}

fn any_string() -> impl Strategy<Value = String> {
    // Trailing NULs are stripped by design, so generate strings without them.
    "[a-z0-9.:/\\[\\]-]{0,40}"
}

pub(crate) fn any_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (any::<u32>(), any::<u32>(), any::<u16>(), any_string()).prop_map(
            |(sender, window, max_packet, dest)| Frame::Open {
                sender,
                window,
                max_packet,
                dest
            }
        ),
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u16>()).prop_map(
            |(recipient, sender, window, max_packet)| Frame::OpenSuccess {
                recipient,
                sender,
                window,
                max_packet
            }
        ),
        (any::<u32>(), any::<u32>(), any_string()).prop_map(|(r, c, d)| {
            Frame::OpenFailure {
                recipient: r,
                reason: Reason(c),
                description: d,
            }
        }),
        (any::<u32>(), any::<u32>()).prop_map(|(recipient, increment)| {
            Frame::WindowAdjust {
                recipient,
                increment,
            }
        }),
        (
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..2000)
        )
            .prop_map(|(recipient, p)| Frame::Data {
                recipient,
                payload: p.into()
            }),
        (
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..2000)
        )
            .prop_map(|(recipient, p)| Frame::Datagram {
                recipient,
                payload: p.into()
            }),
        any::<u32>().prop_map(|recipient| Frame::Eof { recipient }),
        any::<u32>().prop_map(|recipient| Frame::Close { recipient }),
        any::<u64>().prop_map(|nonce| Frame::Ping { nonce }),
        any::<u64>().prop_map(|nonce| Frame::Pong { nonce }),
        any::<u64>().prop_map(|received| Frame::Ack { received }),
        Just(Frame::Goodbye),
        any_string().prop_map(|reason| Frame::Drain { reason }),
        (any::<u64>(), any::<u32>()).prop_map(|(offset, len)| Frame::Chunk { offset, len }),
        (any::<u32>(), any_string(), any_string()).prop_map(|(request, bind, dest)| {
            Frame::Bind {
                request,
                bind,
                dest,
            }
        }),
        (any::<u32>(), any::<u16>())
            .prop_map(|(request, port)| Frame::BindSuccess { request, port }),
        (any::<u32>(), any::<u32>(), any_string()).prop_map(|(request, c, description)| {
            Frame::BindFailure {
                request,
                reason: Reason(c),
                description,
            }
        }),
    ]
}

proptest! {
    #[test]
    fn every_valid_message_roundtrips(f in any_frame()) {
        roundtrip(f);
    }

    #[test]
    fn a_stream_of_messages_decodes_in_order(frames in proptest::collection::vec(any_frame(), 0..20)) {
        let mut b = BytesMut::new();
        for f in &frames { f.encode(&mut b).unwrap(); }
        let mut out = vec![];
        while let Some(f) = decode(&mut b, DecodeLimits::default()).unwrap() { out.push(f); }
        prop_assert_eq!(out, frames);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300), ext in any::<bool>(), max in 4usize..70000) {
        let mut b = BytesMut::from(&data[..]);
        let lim = DecodeLimits { max_frame: max.min(MAX_FRAME_LEN), extensions: ext };
        // Decode until error or need-more; every consumed frame must shrink the buffer.
        loop {
            let before = b.len();
            match decode(&mut b, lim) {
                Ok(Some(_)) => prop_assert!(b.len() < before),
                Ok(None) | Err(_) => break,
            }
        }
    }
}
