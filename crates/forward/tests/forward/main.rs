//! The forward crate's integration tests, one binary (each binary links the
//! whole tree, so one per crate keeps the build short).

mod common;
mod connects;

mod drain;
mod folder;
mod hostile;
mod hostile_harness;
mod jmux;
mod memory;
// The file service is built for Linux only so far.
#[cfg(target_os = "linux")]
mod memory_files;
mod memory_folder;
mod memory_pinning;
mod memory_replay;
mod memory_stripes;
mod memory_udp;
mod resume;
mod secure;
mod stripes;
mod stuck_downlinks;
mod tunnel;
mod udp;
