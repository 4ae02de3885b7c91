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

pub mod client;
pub mod plan;
pub mod progress;
pub mod root;
pub mod serve;
pub mod transfer;
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
