//! Any bytes as the peer's frames, into the multiplexer core in-process
//! (see `longhaul_session::fuzzing::mux_peer`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    longhaul_session::fuzzing::mux_peer(data);
});
