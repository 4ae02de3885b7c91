//! File contents on a stream: the sending and the receiving side, each
//! hashing what it handles, so the two hashes compared at the end cover the
//! file end to end (both sides' disks included).

use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use blake3::Hasher;
use longhaul_session::ServicePipe;

use crate::sys;
use crate::wire::{self, Hash, WireError, MAX_BLOCK};

/// Blocks the sender reads and sends. Large enough that the per-block
/// header and system calls cost nothing; small enough to keep both sides'
/// buffers modest.
pub const SEND_BLOCK: usize = 256 * 1024;

/// What the sender's trailer said, or why the transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The peer stopped with this message.
    #[error("{0}")]
    Peer(String),
    /// Our side's file failed (disk full, read error, changed while read).
    #[error("{0}")]
    Local(String),
    #[error("{0}")]
    Wire(#[from] WireError),
    /// Writing the received data failed (disk full): the sender is still
    /// sending.
    #[error("{0}")]
    Write(String),
    /// The stream to the peer failed.
    #[error("connection to the peer failed: {0}")]
    Stream(io::Error),
}

/// Hashes the first `len` bytes of `file` (a resume's prefix) into a new
/// hasher; `None` if the file is shorter.
pub fn hash_prefix(file: &File, len: u64, done: &AtomicU64) -> io::Result<Option<Hasher>> {
    let mut h = Hasher::new();
    let mut buf = vec![0u8; SEND_BLOCK];
    let mut at = 0u64;
    while at < len {
        let want = (len - at).min(buf.len() as u64) as usize;
        let n = sys::read_at(file, &mut buf[..want], at)?;
        if n == 0 {
            return Ok(None);
        }
        h.update(&buf[..n]);
        at += n as u64;
        done.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(Some(h))
}

pub fn digest(h: &Hasher) -> Hash {
    *h.finalize().as_bytes()
}

/// A file's identity and contents version, to notice a change while it is
/// read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub size: u64,
    /// The file's number, its modification and status-change times.
    marks: (u64, (i64, i64), (i64, i64)),
}

impl Version {
    pub fn of(file: &File) -> io::Result<Version> {
        let m = file.metadata()?;
        Ok(Version {
            size: m.len(),
            marks: sys::change_marks(&m),
        })
    }
}

/// Sends `file` from `start` to `version.size` in blocks, then the
/// trailer: the hash (`hasher` already holds the first `start` bytes), or
/// an error if the file could not be read or changed meanwhile. Returns
/// the hash sent. `sent` counts file bytes as they go.
pub fn send_file(
    out: &mut ServicePipe,
    file: &File,
    start: u64,
    version: Version,
    mut hasher: Hasher,
    sent: &AtomicU64,
) -> Result<Hash, TransferError> {
    let mut at = start;
    let mut failure = None;
    while at < version.size {
        let want = (version.size - at).min(SEND_BLOCK as u64) as usize;
        // A buffer per block: the session sends it as it is (and, with
        // resume, keeps it until the peer has it). Read into its spare
        // capacity (exactly `want`): no pass to zero it first.
        let mut buf: Vec<u8> = Vec::with_capacity(4 + want);
        buf.extend_from_slice(&[0; 4]);
        let n = match sys::read_spare(file, &mut buf, at) {
            Ok(0) => {
                failure = Some(format!(
                    "the file shrank while being read (at byte {at} of {})",
                    version.size
                ));
                break;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                failure = Some(format!("read failed at byte {at}: {e}"));
                break;
            }
        };
        hasher.update(&buf[4..4 + n]);
        buf[..4].copy_from_slice(&(n as u32).to_be_bytes());
        out.send(buf.into()).map_err(TransferError::Stream)?;
        at += n as u64;
        sent.fetch_add(n as u64, Ordering::Relaxed);
    }
    if failure.is_none() {
        match Version::of(file) {
            Ok(v) if v == version => {}
            Ok(_) => failure = Some("the file changed while being read".to_string()),
            Err(e) => failure = Some(format!("cannot check the file after reading: {e}")),
        }
    }
    out.write_all(&0u32.to_be_bytes())
        .map_err(TransferError::Stream)?;
    let hash = digest(&hasher);
    match failure {
        None => {
            let mut t = vec![0u8];
            t.extend_from_slice(&hash);
            out.write_all(&t).map_err(TransferError::Stream)?;
            out.flush().map_err(TransferError::Stream)?;
            Ok(hash)
        }
        Some(msg) => {
            wire::write_err(out, &msg).map_err(TransferError::Stream)?;
            Err(TransferError::Local(msg))
        }
    }
}

/// Receives blocks into `file` from offset `start` until the sender's end,
/// exactly `size - start` bytes, and checks the sender's hash against
/// ours (`hasher` holds the first `start` bytes). Returns the hash.
pub fn receive_file(
    input: &mut ServicePipe,
    file: &File,
    start: u64,
    size: u64,
    mut hasher: Hasher,
    received: &AtomicU64,
) -> Result<Hash, TransferError> {
    let mut at = start;
    loop {
        let n = wire::read_u32(input).map_err(TransferError::Stream)? as usize;
        if n == 0 {
            break;
        }
        if n > MAX_BLOCK {
            return Err(WireError::Bad("data block too large").into());
        }
        if at + n as u64 > size {
            return Err(WireError::Bad("more data than the file's size").into());
        }
        // The block as it arrived, in the session's own buffers.
        let mut left = n;
        while left > 0 {
            let d = input.read_chunk(left).map_err(TransferError::Stream)?;
            if d.is_empty() {
                return Err(TransferError::Stream(io::ErrorKind::UnexpectedEof.into()));
            }
            hasher.update(&d);
            sys::write_all_at(file, &d, at)
                .map_err(|e| TransferError::Write(format!("writing failed at byte {at}: {e}")))?;
            at += d.len() as u64;
            left -= d.len();
            received.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
    }
    if let Err(msg) = wire::read_status(input)? {
        return Err(TransferError::Peer(msg));
    }
    let theirs = wire::read_hash(input).map_err(TransferError::Stream)?;
    if at != size {
        return Err(TransferError::Peer(format!(
            "the sender stopped at byte {at} of {size}"
        )));
    }
    let ours = digest(&hasher);
    if ours != theirs {
        return Err(TransferError::Local(format!(
            "BLAKE3 mismatch: sent {}, received {}",
            hex(&theirs),
            hex(&ours)
        )));
    }
    Ok(ours)
}

pub fn hex(h: &[u8]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}
