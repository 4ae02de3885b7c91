//! One direction of a folder carrier: a writer thread appending records to
//! segment files, a reader thread following them, and the async halves the
//! session sees.
//!
//! Each direction is a chain of segment files `lh-<id>.<c|s>.<n>`. The
//! writer appends records at its own offset (one writer per file, so no
//! locks); when a segment is full it waits until segment n-1 is gone,
//! creates n+1, and ends n with a NEXT record. The reader deletes a segment
//! once it has read its NEXT (or END) record. So at most two segments per
//! direction exist: [`SEGMENT`] × 2 on disk, whatever the traffic.
//!
//! File I/O runs on two plain threads per carrier, not on the async
//! runtime: a share can block a read or write for as long as it likes
//! without stalling other sessions.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::record::{self, Kind, Parsed, HEADER, MAX_PAYLOAD};
use super::watch::{DirWatch, FileWait, Pacer, PollMode, Wake, POLL_MAX};

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
    fn path(&self, n: u64) -> PathBuf {
        segment_path(&self.dir, &self.key, n)
    }

    fn pacer(&self) -> Pacer {
        Pacer::new(
            self.mode,
            &self.watch,
            format!("folder {}", self.dir.display()),
        )
    }

    /// An error that names the file and says what went wrong.
    fn err(&self, what: &str, n: u64, e: io::Error) -> io::Error {
        io::Error::new(
            e.kind(),
            format!("folder carrier: {what} {}: {e}", self.path(n).display()),
        )
    }
}

/// Creates segment `n` (it must not exist: another carrier's, or stale).
pub fn create_segment(files: &StreamFiles, n: u64) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(files.path(n))
        .map_err(|e| files.err("cannot create", n, e))
}

/// A file's size as the file system has it now: on a share whose client
/// caches attributes (FUSE keeps them for a second by default; NFS for
/// several), `statx` with AT_STATX_FORCE_SYNC asks the server again, and a
/// held descriptor then reads what is new. None: the file is gone.
fn fresh_len(path: &Path) -> io::Result<Option<u64>> {
    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
    match statx(CWD, path, AtFlags::STATX_FORCE_SYNC, StatxFlags::SIZE) {
        Ok(st) => Ok(Some(st.stx_size)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        // No statx (old kernels, some sandboxes): what stat says.
        Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::PERM) => {
            match std::fs::metadata(path) {
                Ok(m) => Ok(Some(m.len())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e.into()),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What ended a thread, for the async side (io::Error is not Clone).
type Failure = (io::ErrorKind, String);

fn failure(e: &io::Error) -> Failure {
    (e.kind(), e.to_string())
}

// ---------------------------------------------------------------- writing

#[derive(Default)]
struct OutState {
    buf: BytesMut,
    closing: bool,
    dropped: bool,
    /// END written: the half closed cleanly.
    done: bool,
    failed: Option<Failure>,
    waker: Option<Waker>,
}

/// Where the next record goes.
struct FileState {
    file: File,
    seg: u64,
    off: u64,
    seq: u64,
    /// The record being written: header, then payload.
    rec: Vec<u8>,
}

impl FileState {
    /// Appends the record whose payload (`len` bytes) is in `rec` already.
    fn append(&mut self, files: &StreamFiles, kind: Kind, len: usize) -> io::Result<()> {
        let (hdr, payload) = self.rec.split_at_mut(HEADER);
        let hdr: &mut [u8; HEADER] = hdr.try_into().map_err(io::Error::other)?;
        record::encode_header(kind, self.seq, &payload[..len], hdr);
        self.file
            .write_all_at(&self.rec[..HEADER + len], self.off)
            .map_err(|e| files.err("cannot write", self.seg, e))?;
        self.seq += 1;
        self.off += (HEADER + len) as u64;
        Ok(())
    }

    /// Whether a payload of `len` fits with the NEXT that may follow it.
    fn fits(&self, len: usize) -> bool {
        self.off + (2 * HEADER + len) as u64 <= SEGMENT
    }
}

struct WriterShared {
    st: Mutex<OutState>,
    /// Taken by whoever writes a record: the thread, or `poll_write` itself.
    file: Mutex<FileState>,
    files: StreamFiles,
    wake: Arc<Wake>,
}

/// The write half. Where notifications work (a local file system, where
/// an append is a copy into the page cache) `poll_write` appends the record
/// itself when nothing is queued: no thread to wake on the way. Otherwise
/// bytes go to a bounded buffer that the writer thread appends as records
/// as soon as they are there (each record takes whatever has gathered, up
/// to [`MAX_PAYLOAD`]: batching without waiting), so a share that blocks
/// never blocks the async runtime. `flush` has nothing to do.
pub struct FolderWrite {
    sh: Arc<WriterShared>,
}

/// Starts the writer thread on segment 0, already created.
pub fn start_writer(files: StreamFiles, first: File) -> io::Result<FolderWrite> {
    let sh = Arc::new(WriterShared {
        st: Mutex::default(),
        file: Mutex::new(FileState {
            file: first,
            seg: 0,
            off: 0,
            seq: 0,
            rec: vec![0u8; HEADER + MAX_PAYLOAD],
        }),
        files: files.clone(),
        wake: Arc::default(),
    });
    let s2 = sh.clone();
    std::thread::Builder::new()
        .name("lh-dir-write".into())
        .spawn(move || {
            let r = write_loop(&s2);
            let (clean, waker) = {
                let mut st = lock(&s2.st);
                match &r {
                    Ok(()) => st.done = true,
                    Err(e) => {
                        if !st.dropped && st.failed.is_none() {
                            tracing::warn!("{e}");
                        }
                        st.failed.get_or_insert_with(|| failure(e));
                    }
                }
                (r.is_ok(), st.waker.take())
            };
            if let Some(w) = waker {
                w.wake();
            }
            drop(s2);
            if !clean {
                // Nobody will read what is left: take it off the disk.
                remove_stream(&files);
            }
        })?;
    Ok(FolderWrite { sh })
}

/// Removes whatever segments of a stream are left.
fn remove_stream(files: &StreamFiles) {
    let prefix = format!("lh-{}.", files.key);
    if let Ok(rd) = std::fs::read_dir(&files.dir) {
        for e in rd.flatten() {
            if e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "folder carrier: closed")
}

fn write_loop(sh: &WriterShared) -> io::Result<()> {
    let files = &sh.files;
    // Deletions are polled for (rarely needed: by the time a segment is
    // full, the reader has long deleted the one before).
    let mut pacer = Pacer::new(
        PollMode::Forced(POLL_MAX),
        &files.watch,
        format!("folder {}", files.dir.display()),
    );
    loop {
        let g = sh.wake.current();
        // The file first, then the queue: bytes taken from the queue are
        // in the file before `poll_write` can append anything after them.
        let mut fs = lock(&sh.file);
        let (kind, len) = {
            let mut st = lock(&sh.st);
            if st.dropped || st.failed.is_some() {
                return Err(closed());
            }
            if !st.buf.is_empty() {
                let n = st.buf.len().min(MAX_PAYLOAD);
                fs.rec[HEADER..HEADER + n].copy_from_slice(&st.buf[..n]);
                st.buf.advance(n);
                (Kind::Data, n)
            } else if st.closing {
                (Kind::End, 0)
            } else {
                drop((st, fs));
                sh.wake.wait(g, Duration::from_secs(1));
                continue;
            }
        };
        if !fs.fits(len) {
            if fs.seg > 0 {
                wait_gone(sh, &mut pacer, fs.seg - 1)?;
            }
            let next = create_segment(files, fs.seg + 1)?;
            let mark = record::encode(Kind::Next, fs.seq, &[]);
            fs.file
                .write_all_at(&mark, fs.off)
                .map_err(|e| files.err("cannot write", fs.seg, e))?;
            fs.seq += 1;
            (fs.file, fs.seg, fs.off) = (next, fs.seg + 1, 0);
        }
        fs.append(files, kind, len)?;
        drop(fs);
        if kind == Kind::End {
            return Ok(());
        }
        // Room in the buffer again: wake a waiting writer.
        let w = lock(&sh.st).waker.take();
        if let Some(w) = w {
            w.wake();
        }
    }
}

/// Waits until the reader has deleted segment `n` (it read all of it).
fn wait_gone(sh: &WriterShared, pacer: &mut Pacer, n: u64) -> io::Result<()> {
    let path = sh.files.path(n);
    loop {
        let g = sh.wake.current();
        match fresh_len(&path) {
            Ok(None) => {
                pacer.news();
                return Ok(());
            }
            Err(e) => return Err(sh.files.err("cannot look at", n, e)),
            Ok(Some(_)) => {}
        }
        if lock(&sh.st).dropped {
            return Err(closed());
        }
        pacer.wait(&sh.wake, g);
    }
}

impl FolderWrite {
    /// Appends `buf` (up to one record) right here, when nothing is queued
    /// before it, the thread is not busy with the file, and the folder is
    /// one where appends do not block.
    fn write_inline(&self, st: &mut OutState, buf: &[u8]) -> Option<io::Result<usize>> {
        let queue = !st.buf.is_empty()
            || st.closing
            || self.sh.files.mode != PollMode::Auto
            || self.sh.files.watch.missed.load(Ordering::Relaxed);
        if queue {
            return None;
        }
        let mut fs = self.sh.file.try_lock().ok()?;
        let n = buf.len().min(MAX_PAYLOAD);
        if !fs.fits(n) {
            return None;
        }
        fs.rec[HEADER..HEADER + n].copy_from_slice(&buf[..n]);
        Some(match fs.append(&self.sh.files, Kind::Data, n) {
            Ok(()) => Ok(n),
            Err(e) => {
                tracing::warn!("{e}");
                st.failed = Some(failure(&e));
                drop(fs);
                self.sh.wake.bump();
                Err(e)
            }
        })
    }
}

impl AsyncWrite for FolderWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut st = lock(&self.sh.st);
        if let Some((kind, msg)) = &st.failed {
            return Poll::Ready(Err(io::Error::new(*kind, msg.clone())));
        }
        if st.closing {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if let Some(r) = self.write_inline(&mut st, buf) {
            return Poll::Ready(r);
        }
        let room = OUTBOX.saturating_sub(st.buf.len());
        if room == 0 {
            st.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = room.min(buf.len());
        st.buf.extend_from_slice(&buf[..n]);
        drop(st);
        self.sh.wake.bump();
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Waits until everything written and the END record are in the file.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = lock(&self.sh.st);
        if st.done {
            return Poll::Ready(Ok(()));
        }
        if let Some((kind, msg)) = &st.failed {
            return Poll::Ready(Err(io::Error::new(*kind, msg.clone())));
        }
        st.waker = Some(cx.waker().clone());
        if !st.closing {
            st.closing = true;
            drop(st);
            self.sh.wake.bump();
        }
        Poll::Pending
    }
}

impl Drop for FolderWrite {
    fn drop(&mut self) {
        lock(&self.sh.st).dropped = true;
        self.sh.wake.bump();
    }
}

// ---------------------------------------------------------------- reading

#[derive(Default)]
struct InState {
    buf: BytesMut,
    eof: bool,
    failed: Option<Failure>,
    dropped: bool,
    /// The thread waits for room in `buf`.
    wants_room: bool,
    waker: Option<Waker>,
}

struct ReaderShared {
    st: Mutex<InState>,
    wake: Arc<Wake>,
}

/// The read half: what the reader thread found in the files, in order.
pub struct FolderRead {
    sh: Arc<ReaderShared>,
}

/// Starts the reader thread on segment 0 (it waits for the file to appear).
pub fn start_reader(mut files: StreamFiles) -> io::Result<FolderRead> {
    let sh = Arc::new(ReaderShared {
        st: Mutex::default(),
        wake: Arc::default(),
    });
    // Set up before the thread runs, so that no wake-up is missed.
    let notify = files.mode == PollMode::Auto;
    let waiter = match FileWait::new(&files.dir, &files.key, &sh.wake, notify) {
        Ok(w) => w,
        // Out of inotify instances (fs.inotify.max_user_instances, 128 by
        // default): this carrier polls.
        Err(e) => {
            tracing::info!(dir = %files.dir.display(), "no file-change notifications ({e}): this carrier polls");
            files.mode = PollMode::Forced(POLL_MAX);
            FileWait::new(&files.dir, &files.key, &sh.wake, false)?
        }
    };
    let s2 = sh.clone();
    std::thread::Builder::new()
        .name("lh-dir-read".into())
        .spawn(move || {
            let mut seg = 0;
            let r = read_loop(&files, &s2, waiter, &mut seg);
            let waker = {
                let mut st = lock(&s2.st);
                match &r {
                    Ok(()) => st.eof = true,
                    Err(e) => {
                        if !st.dropped {
                            tracing::warn!("{e}");
                        }
                        st.failed = Some(failure(e));
                    }
                }
                st.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
            // Read (or given up on): the segment is ours to delete.
            let _ = std::fs::remove_file(files.path(seg));
        })?;
    Ok(FolderRead { sh })
}

fn read_loop(
    files: &StreamFiles,
    sh: &ReaderShared,
    mut waiter: FileWait,
    seg: &mut u64,
) -> io::Result<()> {
    let mut file: Option<File> = None;
    let mut off = 0u64;
    let mut seq = 0u64;
    let mut chunk = vec![0u8; HEADER + MAX_PAYLOAD];
    let mut pacer = files.pacer();
    // Since when the record at `off` has been whole but wrong.
    let mut bad_since: Option<Instant> = None;
    // Polling: the file's size when a read last found nothing new, so that
    // an unchanged size is not read again.
    let mut idle_len: Option<u64> = None;
    loop {
        {
            let mut st = lock(&sh.st);
            if st.dropped {
                return Ok(());
            }
            if st.buf.len() + MAX_PAYLOAD > INBOX {
                st.wants_room = true;
                drop(st);
                waiter.wait(Duration::from_secs(1));
                continue;
            }
        }
        let path = files.path(*seg);
        if file.is_none() {
            match File::open(&path) {
                Ok(f) => {
                    // Before the first read: no append after it goes unseen.
                    waiter.follow(&path);
                    file = Some(f);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if !files.dir.is_dir() {
                        return Err(io::Error::new(
                            io::ErrorKind::NotFound,
                            format!(
                                "folder carrier: the directory {} is gone",
                                files.dir.display()
                            ),
                        ));
                    }
                    pacer.wait_with(|t| waiter.wait(t));
                    continue;
                }
                Err(e) => return Err(files.err("cannot open", *seg, e)),
            }
        }
        if pacer.polling() {
            // A share's client may cache the size (and a held descriptor
            // reads only up to it): ask for it afresh.
            match fresh_len(&path) {
                Ok(Some(len)) if Some(len) == idle_len && bad_since.is_none() => {
                    pacer.wait_with(|t| waiter.wait(t));
                    continue;
                }
                Ok(Some(len)) => idle_len = Some(len),
                Ok(None) => return Err(gone(files, *seg)),
                Err(e) => return Err(files.err("cannot look at", *seg, e)),
            }
        }
        let Some(f) = &file else { continue };
        let n = f
            .read_at(&mut chunk, off)
            .map_err(|e| files.err("cannot read", *seg, e))?;
        let mut at = 0;
        let mut progress = false;
        let mut stuck = None;
        while at < n {
            match record::parse(&chunk[at..n]) {
                Parsed::Record {
                    kind,
                    seq: s,
                    payload,
                    size,
                } => {
                    if s != seq {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "folder carrier: record {s} where {seq} was due, at offset {} of {}: another writer's file?",
                                off + at as u64,
                                path.display()
                            ),
                        ));
                    }
                    seq += 1;
                    progress = true;
                    at += size;
                    match kind {
                        Kind::Data => {
                            let w = {
                                let mut st = lock(&sh.st);
                                st.buf.extend_from_slice(payload);
                                st.waker.take()
                            };
                            if let Some(w) = w {
                                w.wake();
                            }
                            if lock(&sh.st).buf.len() + MAX_PAYLOAD > INBOX {
                                break;
                            }
                        }
                        Kind::Next | Kind::End => {
                            let _ = std::fs::remove_file(&path);
                            if kind == Kind::End {
                                return Ok(());
                            }
                            (*seg, off, idle_len, file) = (*seg + 1, 0, None, None);
                            at = 0;
                            break;
                        }
                    }
                }
                Parsed::Incomplete => break,
                Parsed::Bad => {
                    stuck = Some(off + at as u64);
                    break;
                }
            }
        }
        off += at as u64;
        if progress {
            idle_len = None;
            bad_since = None;
            pacer.news();
            continue;
        }
        if let Some(at) = stuck {
            let since = *bad_since.get_or_insert_with(Instant::now);
            if since.elapsed() > CORRUPT_AFTER {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "folder carrier: the record at offset {at} of {} fails its check and was not rewritten within {CORRUPT_AFTER:?}: the file is corrupt",
                        path.display()
                    ),
                ));
            }
            // A cache may hold the torn bytes: open afresh next time.
            file = None;
        } else if !pacer.polling() && std::fs::symlink_metadata(&path).is_err() {
            // Woken for nothing: was it the file going away?
            return Err(gone(files, *seg));
        }
        pacer.wait_with(|t| waiter.wait(t));
    }
}

fn gone(files: &StreamFiles, n: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        format!(
            "folder carrier: {} was removed before its end (the peer closed the carrier, or someone cleaned the directory)",
            files.path(n).display()
        ),
    )
}

impl AsyncRead for FolderRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut st = lock(&self.sh.st);
        if !st.buf.is_empty() {
            let n = st.buf.len().min(out.remaining());
            out.put_slice(&st.buf[..n]);
            st.buf.advance(n);
            let wake = st.wants_room && st.buf.len() + MAX_PAYLOAD <= INBOX;
            if wake {
                st.wants_room = false;
                drop(st);
                self.sh.wake.bump();
            }
            return Poll::Ready(Ok(()));
        }
        if st.eof {
            return Poll::Ready(Ok(()));
        }
        if let Some((kind, msg)) = &st.failed {
            return Poll::Ready(Err(io::Error::new(*kind, msg.clone())));
        }
        st.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for FolderRead {
    fn drop(&mut self) {
        lock(&self.sh.st).dropped = true;
        self.sh.wake.bump();
    }
}
