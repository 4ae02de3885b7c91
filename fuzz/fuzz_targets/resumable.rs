//! Any bytes as the peer of a resumable session on one carrier: the link
//! layer with resume offered (see `longhaul_session::fuzzing`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    longhaul_session::fuzzing::resumable_peer(data);
});
