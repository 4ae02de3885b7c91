//! Any bytes through the frame decoder (see `longhaul_session::fuzzing`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    longhaul_session::fuzzing::frame_decoder(data);
});
