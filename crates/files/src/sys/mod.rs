//! What differs between operating systems, and nothing else: a folder
//! held open and what is done relative to it (opening beneath it, making,
//! removing and renaming names in it, reading it), a file's kind and owner,
//! locks, positional reads and permissions. The rest of the crate has no
//! `cfg(target_os)` and never names a path from the served root down: it
//! goes through a [`Dir`].
//!
//! `unix.rs`: Linux's `openat2` (`RESOLVE_BENEATH`) and the POSIX `*at`
//! calls, through rustix. `windows.rs`: cap-std, which resolves beneath
//! by itself, and Windows' rules for names.

#[cfg(target_os = "linux")]
mod unix;
#[cfg(target_os = "linux")]
pub use unix::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use self::windows::*;

/// What is at a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Link,
    /// A FIFO, a device, a socket: never opened for reading or writing.
    Other,
}

/// What a copy needs to know of a file or folder.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub kind: FileKind,
    pub size: u64,
    /// Last change of contents, seconds since the epoch.
    pub mtime: i64,
    /// Owned by the user this process runs as.
    pub mine: bool,
    /// Owned by the system's administrator (root).
    pub system: bool,
    /// The owner, for messages.
    pub owner: u32,
    /// Permission bits (Unix: `st_mode & 0o7777`).
    pub mode: u32,
    /// Names this file has (hard links).
    pub links: u64,
    /// Device and file number: the same pair is the same file.
    pub id: (u64, u64),
}

/// Why opening or making a name failed, where callers act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    NotFound,
    Exists,
    /// Resolving it would leave the folder it is resolved beneath.
    Escapes,
    /// It is a symbolic link (or, with no-follow, not a folder).
    LinkOrNotDir,
    Other,
}
