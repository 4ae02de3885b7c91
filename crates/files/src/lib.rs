//! `longhaul cp`: files copied through a session at the speed of its path,
//! hashed end to end, resumable.
//!
//! A client opens streams to [`SERVICE`]; the server answers them from the
//! folder it was told to serve ([`serve::FileServer`]), read-only or
//! read-write per client ([`Access`]). Every path is resolved beneath that
//! folder by the kernel ([`root`]). Contents go in blocks chosen by the
//! sender with no per-block round trip — the session's windows keep the
//! path full — and are hashed (BLAKE3) on both sides ([`transfer`]). The
//! receiver writes to a partial file and renames it only once the hashes
//! agree; a copy that was interrupted continues from the part whose hash
//! both sides agree on ([`client`]). The wire format is in [`wire`].
#![forbid(unsafe_code)]

// Every path is resolved beneath the served folder with Linux's openat2 and
// POSIX `*at` calls; their counterparts elsewhere (FreeBSD's and macOS's
// beneath-flags, Windows' name rules; cap-std) are not written yet, and
// there `cp` and `--files` say so.
#[cfg(target_os = "linux")]
pub mod client;
#[cfg(target_os = "linux")]
pub mod list;
#[cfg(target_os = "linux")]
pub mod local;
#[cfg(target_os = "linux")]
pub mod part;
#[cfg(target_os = "linux")]
pub mod plan;
#[cfg(target_os = "linux")]
pub mod progress;
#[cfg(target_os = "linux")]
pub mod root;
#[cfg(target_os = "linux")]
pub mod serve;
#[cfg(target_os = "linux")]
mod sys;
#[cfg(target_os = "linux")]
pub mod transfer;
#[cfg(not(target_os = "linux"))]
mod unbuilt;
#[cfg(not(target_os = "linux"))]
pub use unbuilt::*;
pub mod wire;

/// The destination a client opens for the file service.
pub const SERVICE: &str = "longhaul://files";

/// What a client may do with the served folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

impl std::str::FromStr for Access {
    type Err = String;
    fn from_str(s: &str) -> Result<Access, String> {
        match s {
            "ro" => Ok(Access::ReadOnly),
            "rw" => Ok(Access::ReadWrite),
            _ => Err(format!("'{s}': give ro (read-only) or rw (read-write)")),
        }
    }
}

#[cfg(target_os = "linux")]
pub use sys::{open_files_limit, raise_nofile_limit};
