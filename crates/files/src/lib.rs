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

/// The soft limit on open files now (None: unlimited).
#[cfg(target_os = "linux")]
pub fn open_files_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Raises this process's soft limit on open files to its hard limit, once
/// at start: each session, stream, file being copied and folder being
/// listed holds a descriptor, and the soft limit (often 1 024) is reached
/// long before memory or the other bounds. Returns the soft limit before
/// and after. A hard limit of "unlimited" is taken as `fs.nr_open` (above
/// which the kernel refuses; 2²⁰, its default, if it cannot be read).
#[cfg(target_os = "linux")]
pub fn raise_nofile_limit() -> std::io::Result<(u64, u64)> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    let before = now.current.unwrap_or(u64::MAX);
    let want = now.maximum.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20)
    });
    if before >= want {
        return Ok((before, before));
    }
    let new = Rlimit {
        current: Some(want),
        maximum: now.maximum,
    };
    setrlimit(Resource::Nofile, new)?;
    Ok((before, want))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_one() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let hard = getrlimit(Resource::Nofile).maximum;
        let low = hard.unwrap_or(4096).min(256);
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(low),
                maximum: hard,
            },
        )
        .unwrap();
        let (before, after) = super::raise_nofile_limit().unwrap();
        assert_eq!(before, low);
        assert_eq!(Some(after), getrlimit(Resource::Nofile).current);
        assert!(hard.is_none() || Some(after) == hard);
    }
}
