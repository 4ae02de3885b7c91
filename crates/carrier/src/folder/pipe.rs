//! One direction of a folder carrier: what its writer (`write.rs`) and
//! reader (`read.rs`) share.
//!
//! Each direction is a chain of segment files `lh-<id>.<c|s>.<n>`. The
//! writer appends records at its own offset (one writer per file, so no
//! locks); when a segment is full it waits until segment n-1 is gone,
//! creates n+1, and ends n with a NEXT record. The reader deletes a segment
//! once it has read its NEXT (or END) record. So at most two segments per
//! direction exist: [`SEGMENT`] × 2 on disk, whatever the traffic.
//!
//! Where notifications work (a local file system: appends and reads are
//! copies to and from the page cache) the async halves do the file I/O
//! themselves, with no thread to wake on the way. Where they do not (a
//! share, which may block a read or write for as long as it likes) plain
//! threads do it, so that a stalled share never stalls the async runtime.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::watch::{DirWatch, Pacer, PollMode};
use crate::sys;

/// Bytes in one segment file: the disk bound is twice this per direction.
pub const SEGMENT: u64 = 8 * 1024 * 1024;
/// Bytes written by the session and not yet in the file (per carrier).
pub const OUTBOX: usize = 1024 * 1024;
/// Bytes read from the file and not yet taken by the session.
pub const INBOX: usize = 1024 * 1024;
/// How long a record may stay whole-but-wrong (bad CRC, or a header no
/// writer makes) before the carrier gives up on the file as corrupt.
pub const CORRUPT_AFTER: Duration = Duration::from_secs(2);

/// The file of segment `n` of stream `key` (`<id>.<c|s>`).
pub fn segment_path(dir: &Path, key: &str, n: u64) -> PathBuf {
    dir.join(format!("lh-{key}.{n}"))
}

/// Where one direction's files are and how to wait for them.
#[derive(Clone)]
pub struct StreamFiles {
    pub dir: PathBuf,
    /// `<id>.<c|s>`
    pub key: String,
    pub mode: PollMode,
    pub watch: Arc<DirWatch>,
}

impl StreamFiles {
    pub(super) fn path(&self, n: u64) -> PathBuf {
        segment_path(&self.dir, &self.key, n)
    }

    pub(super) fn pacer(&self) -> Pacer {
        Pacer::new(
            self.mode,
            &self.watch,
            format!("folder {}", self.dir.display()),
        )
    }

    /// How a writer waits for its reader to delete a segment: by polling
    /// (rarely needed: by the time a segment is full, the reader has long
    /// deleted the one before).
    pub(super) fn deletion_pacer(&self) -> Pacer {
        Pacer::new(
            PollMode::Forced(super::watch::POLL_MAX),
            &self.watch,
            format!("folder {}", self.dir.display()),
        )
    }

    /// An error that names the file and says what went wrong.
    pub(super) fn err(&self, what: &str, n: u64, e: io::Error) -> io::Error {
        io::Error::new(
            e.kind(),
            format!("folder carrier: {what} {}: {e}", self.path(n).display()),
        )
    }
}

/// Creates segment `n` (it must not exist: another carrier's, or stale).
/// O_EXCL never opens what is already there (a FIFO, a symbolic link).
pub fn create_segment(files: &StreamFiles, n: u64) -> io::Result<File> {
    sys::no_surprises(OpenOptions::new().write(true).create_new(true))
        .open(files.path(n))
        .map_err(|e| files.err("cannot create", n, e))
}

/// Opens segment `n` for reading; None while it does not exist. Anyone who
/// can write the folder can put a FIFO, a device or a symbolic link under a
/// carrier's name: only a regular file is opened (checked before, so that
/// a device is never opened, and after, on the descriptor, against a swap
/// in between), without blocking and without following links.
pub fn open_segment(files: &StreamFiles, n: u64) -> io::Result<Option<File>> {
    let path = files.path(n);
    let not_regular = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "folder carrier: {} is not a regular file (a FIFO, device or symbolic link made by someone who can write the folder?): ending the carrier",
                path.display()
            ),
        )
    };
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(_) => return Err(not_regular()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(files.err("cannot look at", n, e)),
    }
    let f = match sys::no_surprises(OpenOptions::new().read(true)).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if sys::not_a_regular_file(&e) => return Err(not_regular()),
        Err(e) => return Err(files.err("cannot open", n, e)),
    };
    if !f
        .metadata()
        .map_err(|e| files.err("cannot look at", n, e))?
        .file_type()
        .is_file()
    {
        return Err(not_regular());
    }
    sys::blocking_again(&f).map_err(|e| files.err("cannot open", n, e))?;
    Ok(Some(f))
}

pub(super) use crate::sys::fresh_len;

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What ended a thread, for the async side (io::Error is not Clone).
pub(super) type Failure = (io::ErrorKind, String);

pub(super) fn failure(e: &io::Error) -> Failure {
    (e.kind(), e.to_string())
}
