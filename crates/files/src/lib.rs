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

// Every path is resolved beneath the served folder ([`sys`]: Linux's
// openat2, cap-std on Windows); macOS and the BSDs are not ported yet, and
// there `cp` and `--files` say so.
#[cfg(any(target_os = "linux", windows))]
pub mod client;
#[cfg(any(target_os = "linux", windows))]
pub mod list;
#[cfg(any(target_os = "linux", windows))]
pub mod local;
#[cfg(any(target_os = "linux", windows))]
pub mod part;
#[cfg(any(target_os = "linux", windows))]
pub mod plan;
#[cfg(any(target_os = "linux", windows))]
pub mod progress;
#[cfg(any(target_os = "linux", windows))]
pub mod root;
#[cfg(any(target_os = "linux", windows))]
pub mod serve;
#[cfg(any(target_os = "linux", windows))]
mod sys;
#[cfg(any(target_os = "linux", windows))]
pub mod transfer;
#[cfg(not(any(target_os = "linux", windows)))]
mod unbuilt;
#[cfg(not(any(target_os = "linux", windows)))]
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

#[cfg(any(target_os = "linux", windows))]
pub use sys::{open_files_limit, raise_nofile_limit};
