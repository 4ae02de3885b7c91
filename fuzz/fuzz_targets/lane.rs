//! Any bytes as the lane of a striped session (see `longhaul_session::fuzzing`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    longhaul_session::fuzzing::lane_peer(data);
});
