//! The WAN emulator needs Linux (network namespaces, TUN devices): on any
//! other system each of its calls says so in one line.

use std::fs::File;
use std::io;

fn needs_linux() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "the WAN emulator (netem, bench matrix --delay, doctor's emulated checks) needs Linux network namespaces",
    )
}

pub fn open_tun(_: &str, _: bool) -> io::Result<File> {
    Err(needs_linux())
}

pub fn enter_netns(_: &str) -> io::Result<()> {
    Err(needs_linux())
}

pub fn tune_forwarding_thread() {}

pub fn has_net_admin() -> bool {
    false
}

pub fn own_process_group(_: &mut std::process::Command) {}
