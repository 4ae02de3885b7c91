//! Any bytes as the peer of a live session (see `longhaul_session::fuzzing`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    longhaul_session::fuzzing::session_peer(data);
});
