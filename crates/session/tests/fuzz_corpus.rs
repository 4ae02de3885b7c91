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
