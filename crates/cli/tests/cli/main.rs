//! The cli crate's integration tests, one binary (each binary links the
//! whole tree, so one per crate keeps the build short).

mod common;

mod cli;
// The file service is built for Linux only so far.
#[cfg(target_os = "linux")]
mod cp;
#[cfg(target_os = "linux")]
mod cp_hostile;
mod doctor;
mod doctor_direct;
mod fleet;
mod folder_hostile;
mod handshake_flood;
mod hostile_logs;
mod idle_sessions;
mod idle_streams;
mod lifecycle;
mod local_user;
mod netem;
mod ops;
mod quic;
mod quiet_keepalive;
mod reload_revokes;
mod reset;
mod setup;
mod udp;
