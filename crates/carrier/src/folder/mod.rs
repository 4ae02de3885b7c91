//! The folder carrier: a byte stream through a shared directory, for two
//! hosts that share nothing but a folder (a VM's shared folder, an SMB or
//! NFS share, a synced mount).
//!
//! Each carrier has an id (16 hex digits, chosen by the client) and two
//! chains of append-only segment files, one per direction:
//! `lh-<id>.c.<n>` (client to server) and `lh-<id>.s.<n>` (server to
//! client), made of CRC-checked records (see [`record`]). The client makes
//! `lh-<id>.c.0`; the server, watching the directory, answers with
//! `lh-<id>.s.0`. Whatever runs over the carrier (TLS and the session's own
//! authentication, as on a socket) starts at once.
//!
//! What seed 000's file tunnel lacked, and how this does it:
//! * no locks and no truncation while the peer reads: one writer per file,
//!   appending; a reader that finds a short or CRC-failing record reads the
//!   same offset again later;
//! * bounded disk: a segment holds [`SEGMENT`] bytes; the writer starts
//!   segment n+1 only after the reader has deleted n-1 (a handshake through
//!   the directory), so a direction never has more than two segments;
//! * woken by notifications (inotify), not by a polling timer, where the
//!   file system gives them; polling (fast after traffic, backing off when
//!   idle) where it does not — detected by itself, or forced with
//!   `?poll=on`;
//! * stale caches of a share: while polling, the reader asks for the file's
//!   size with `statx(AT_STATX_FORCE_SYNC)` before reading (a FUSE or NFS
//!   client otherwise answers from its attribute cache for a second or
//!   more, and a held descriptor reads only up to the cached size), and
//!   opens the file afresh while a torn record is being rewritten (a page
//!   already cached is not read again otherwise).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

mod listen;
mod pipe;
mod read;
pub mod record;
mod watch;
mod write;

pub use listen::{
    Admission, FolderListener, DECISIONS_BURST, DECISIONS_PER_SEC, KNOWN_IDS, MAX_PENDING,
    SCAN_BATCH, SCAN_POLLING, SCAN_WATCHED, STALE_AFTER,
};
pub use pipe::{CORRUPT_AFTER, INBOX, OUTBOX, SEGMENT};
pub use read::FolderRead;
pub use watch::{PollMode, POLL_MAX, POLL_MIN, SAFETY_POLL};
pub use write::FolderWrite;

use pipe::{create_segment, StreamFiles};
use read::start_reader;
use watch::DirWatch;
use write::start_writer;

/// A shared directory to carry sessions through: `dir://PATH[?poll=…]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FolderUrl {
    pub dir: PathBuf,
    pub poll: PollMode,
    /// TLS inside the files (the default). Off only when the URL says
    /// `?tls=off`: a server's or client's `--insecure` alone never turns
    /// it off (the token would be written in clear into the folder).
    pub tls: bool,
}

const USAGE: &str = "use dir://PATH, dir://PATH?poll=on or dir://PATH?poll=DURATION (e.g. 20ms: poll, idling at most that long); &tls=off (with --insecure) for no TLS";

fn parse_duration(s: &str) -> Option<Duration> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = num.parse().ok()?;
    match unit {
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        _ => None,
    }
}

impl std::str::FromStr for FolderUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<FolderUrl, String> {
        let rest = s
            .strip_prefix("dir://")
            .ok_or_else(|| format!("'{s}' is not a folder address ({USAGE})"))?;
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        if path.is_empty() {
            return Err(format!("'{s}' names no directory ({USAGE})"));
        }
        let mut poll = PollMode::Auto;
        let mut tls = true;
        for kv in query.into_iter().flat_map(|q| q.split('&')) {
            match kv.split_once('=') {
                Some(("tls", "on")) => tls = true,
                Some(("tls", "off")) => tls = false,
                Some(("tls", v)) => return Err(format!("tls={v}: give on or off ({USAGE})")),
                Some(("poll", "auto")) => poll = PollMode::Auto,
                Some(("poll", "on")) => poll = PollMode::Forced(POLL_MAX),
                Some(("poll", d)) => {
                    poll = match parse_duration(d) {
                        Some(d) if d >= POLL_MIN && d <= Duration::from_secs(10) => {
                            PollMode::Forced(d)
                        }
                        _ => {
                            return Err(format!(
                                "poll={d}: give on, auto, or a duration from 50us to 10s ({USAGE})"
                            ))
                        }
                    }
                }
                _ => return Err(format!("unknown option '{kv}' in '{s}' ({USAGE})")),
            }
        }
        Ok(FolderUrl {
            dir: crate::sys::folder_path(path),
            poll,
            tls,
        })
    }
}

impl FolderUrl {
    /// The folder's name in known_hosts: `dir://` and its absolute path,
    /// with whitespace, control characters, `%` and bytes that are not
    /// UTF-8 percent-encoded (a known_hosts line splits on whitespace), and
    /// no options (`?poll=` does not change whose folder it is). Decoded by
    /// [`FolderUrl::path_of_identity`].
    pub fn identity(&self) -> String {
        let abs = std::path::absolute(&self.dir).unwrap_or_else(|_| self.dir.clone());
        // Lexically: no `.`, no doubled or trailing `/` (not `..`: a
        // symbolic link may make it mean something else).
        let abs: PathBuf = abs.components().collect();
        let mut out = String::from("dir://");
        let spelled = crate::sys::folder_url_path(&abs);
        let bytes = spelled.as_encoded_bytes();
        for chunk in bytes.utf8_chunks() {
            for c in chunk.valid().chars() {
                if c.is_whitespace() || c.is_control() || c == '%' {
                    let mut b = [0u8; 4];
                    for x in c.encode_utf8(&mut b).bytes() {
                        out.push_str(&format!("%{x:02X}"));
                    }
                } else {
                    out.push(c);
                }
            }
            for x in chunk.invalid() {
                out.push_str(&format!("%{x:02X}"));
            }
        }
        out
    }

    /// The path an [`identity`](FolderUrl::identity) names.
    pub fn path_of_identity(id: &str) -> Option<PathBuf> {
        let rest = id.strip_prefix("dir://")?.as_bytes();
        let mut out = Vec::with_capacity(rest.len());
        let mut i = 0;
        while i < rest.len() {
            if rest[i] == b'%' {
                let hex = std::str::from_utf8(rest.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                out.push(rest[i]);
                i += 1;
            }
        }
        crate::sys::folder_path_from_bytes(out)
    }
}

impl fmt::Display for FolderUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spelled = crate::sys::folder_url_path(&self.dir);
        write!(f, "dir://{}", spelled.to_string_lossy())?;
        match (self.poll, self.tls) {
            (PollMode::Auto, true) => Ok(()),
            (PollMode::Auto, false) => write!(f, "?tls=off"),
            (PollMode::Forced(d), true) => write!(f, "?poll={}us", d.as_micros()),
            (PollMode::Forced(d), false) => write!(f, "?poll={}us&tls=off", d.as_micros()),
        }
    }
}

/// Both directions of one folder carrier.
pub struct FolderStream {
    read: FolderRead,
    write: FolderWrite,
    /// `dir://PATH#ID`, for logs.
    pub peer: String,
    /// What a listener's carrier holds (its session slot, its place among
    /// the handshakes): the server takes it over.
    pub admission: Admission,
    /// A listener's carrier: set once its client's first bytes are read
    /// (the listener ends one that has sent nothing first).
    heard: Option<Arc<AtomicBool>>,
}

impl FolderStream {
    /// Sets `heard` once the client's first bytes are read.
    pub(crate) fn on_first_bytes(&mut self, heard: Arc<AtomicBool>) {
        self.heard = Some(heard);
    }

    pub fn into_split(self) -> (FolderRead, FolderWrite) {
        (self.read, self.write)
    }
}

impl AsyncRead for FolderStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.read).poll_read(cx, buf);
        if buf.filled().len() > before {
            if let Some(h) = self.heard.take() {
                h.store(true, Ordering::Relaxed);
            }
        }
        r
    }
}

impl AsyncWrite for FolderStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.write).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.write).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.write).poll_shutdown(cx)
    }
}

fn check_dir(dir: &Path) -> io::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("folder carrier: {} is not a directory", dir.display()),
        )),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "folder carrier: cannot use {} ({e}); create it or mount the share there",
                dir.display()
            ),
        )),
    }
}

fn stream_files(url: &FolderUrl, watch: &Arc<DirWatch>, id: &str, tag: char) -> StreamFiles {
    StreamFiles {
        dir: url.dir.clone(),
        key: format!("{id}.{tag}"),
        mode: url.poll,
        watch: watch.clone(),
    }
}

fn start(
    url: &FolderUrl,
    watch: &Arc<DirWatch>,
    id: &str,
    out: char,
    first: std::fs::File,
) -> io::Result<FolderStream> {
    let inp = if out == 'c' { 's' } else { 'c' };
    let write = start_writer(stream_files(url, watch, id, out), first)?;
    let read = start_reader(stream_files(url, watch, id, inp))?;
    Ok(FolderStream {
        read,
        write,
        peer: format!("{url}#{id}"),
        admission: Admission::default(),
        heard: None,
    })
}

/// Opens a carrier through the folder: makes this carrier's first file for
/// the server to find. The stream is usable at once; its reads wait for
/// the server's answer (bound them with the handshake's timeout).
pub fn dial(url: &FolderUrl) -> io::Result<FolderStream> {
    check_dir(&url.dir)?;
    let watch = DirWatch::of(&url.dir);
    for _ in 0..4 {
        let id = format!("{:016x}", rand::random::<u64>());
        let files = stream_files(url, &watch, &id, 'c');
        match create_segment(&files, 0) {
            Ok(first) => return start(url, &watch, &id, 'c', first),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("folder carrier: no free carrier id"))
}
