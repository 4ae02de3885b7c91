//! The fuzz targets' committed corpus, replayed as tests on every run, plus
//! fresh random inputs through the same harnesses.

use longhaul_session::fuzzing;
use proptest::prelude::*;

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {} missing: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    files
        .into_iter()
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect()
}

#[test]
fn frame_decoder_corpus() {
    for (_name, data) in corpus("frame_decoder") {
        fuzzing::frame_decoder(&data);
    }
}

#[test]
fn session_corpus() {
    for (name, data) in corpus("session") {
        eprintln!("{name}");
        fuzzing::session_peer(&data);
    }
}

#[test]
fn lane_corpus() {
    for (name, data) in corpus("lane") {
        eprintln!("{name}");
        fuzzing::lane_peer(&data);
    }
}

#[test]
fn resumable_corpus() {
    // The lane corpus is the same format (a selector byte, then the
    // peer's bytes after the attach).
    for target in ["lane", "resumable"] {
        for (name, data) in corpus(target) {
            eprintln!("{name}");
            fuzzing::resumable_peer(&data);
        }
    }
}

#[test]
fn mux_corpus() {
    // The session corpus is the same format (mode byte, then the peer's
    // bytes); the mux target's own corpus grows from it.
    for target in ["session", "mux"] {
        for (_name, data) in corpus(target) {
            fuzzing::mux_peer(&data);
        }
    }
}

/// Well-formed frames of every type, small ids, so inputs get past the
/// decoder and into the core's rules.
fn frames() -> impl Strategy<Value = Vec<u8>> {
    use longhaul_proto::frame::{Frame, Reason};
    let f = (0u8..12, 1u32..6, 0u32..70_000, 0usize..5000).prop_map(|(t, id, n, len)| {
        let f = match t {
            0 | 1 => Frame::Data {
                recipient: id,
                payload: bytes::Bytes::from(vec![3u8; len]),
            },
            2 => Frame::WindowAdjust {
                recipient: id,
                increment: n,
            },
            3 => Frame::Eof { recipient: id },
            4 => Frame::Close { recipient: id },
            5 => Frame::OpenSuccess {
                recipient: id,
                sender: n % 50,
                window: n,
                max_packet: 4096,
            },
            6 => Frame::OpenFailure {
                recipient: id,
                reason: Reason::CONNECTION_REFUSED,
                description: "x".into(),
            },
            7 | 8 => Frame::Open {
                sender: n % 50,
                window: n,
                max_packet: 4096,
                dest: "tcp://a:1".into(),
            },
            9 => Frame::Ping { nonce: n as u64 },
            10 => Frame::Pong { nonce: n as u64 },
            _ => Frame::Bind {
                request: id,
                bind: "1".into(),
                dest: "tcp://a:1".into(),
            },
        };
        f.to_bytes().unwrap().to_vec()
    });
    proptest::collection::vec(f, 0..60).prop_map(|fs| {
        // Native mode, our side opens streams 1..=3; the peer answers them
        // and opens two of its own (our ids 4 and 5 if accepted), so most
        // random frames that follow address streams that exist.
        let mut v = vec![0b110];
        for id in 1..=3u32 {
            let ok = Frame::OpenSuccess {
                recipient: id,
                sender: 100 + id,
                window: 65536,
                max_packet: 4096,
            };
            v.extend_from_slice(&ok.to_bytes().unwrap());
        }
        for sender in [200u32, 201] {
            let open = Frame::Open {
                sender,
                window: 65536,
                max_packet: 4096,
                dest: "tcp://a:1".into(),
            };
            v.extend_from_slice(&open.to_bytes().unwrap());
        }
        for f in fs {
            v.extend_from_slice(&f);
        }
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn mux_survives_random_frames(data in frames()) {
        fuzzing::mux_peer(&data);
    }

    #[test]
    fn mux_survives_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        fuzzing::mux_peer(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn session_survives_random_peers(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        fuzzing::session_peer(&data);
    }

    #[test]
    fn frame_decoder_survives_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        fuzzing::frame_decoder(&data);
    }
}
