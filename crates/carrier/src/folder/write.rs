//! The write half of a folder carrier direction: records appended by
//! `poll_write` itself where appends do not block, by a thread otherwise.

use std::fs::File;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::AsyncWrite;

use super::pipe::{
    create_segment, failure, fresh_len, lock, Failure, StreamFiles, OUTBOX, SEGMENT,
};
use super::record::{self, Kind, HEADER, MAX_PAYLOAD};
use super::watch::{Pacer, PollMode, Wake};

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
    /// None once the stream has ended: closed before waiting for the
    /// reader to remove it (Windows keeps an open file's name).
    file: Option<File>,
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
        let file = self.file.as_ref().ok_or_else(closed)?;
        crate::sys::write_all_at(file, &self.rec[..HEADER + len], self.off)
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
            file: Some(first),
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
            // The reader deletes the last segment once it has read the END;
            // a reader that never comes (a dead or forged peer) must not
            // leave it behind. A stream that carried nothing but its END (a
            // carrier refused at once) has nothing to wait for.
            let (carried, seg) = {
                let mut fs = lock(&s2.file);
                fs.file = None;
                (fs.seq > 1, fs.seg)
            };
            if clean && carried {
                linger(&s2);
            }
            drop(s2);
            remove_stream(&files, seg);
        })?;
    Ok(FolderWrite { sh })
}

/// How long a closed half waits for its reader to take the last segment
/// before removing it itself.
pub const END_GRACE: Duration = Duration::from_secs(5);

/// Waits (at most [`END_GRACE`]) until the reader has deleted the last
/// segment.
fn linger(sh: &WriterShared) {
    let path = sh.files.path(lock(&sh.file).seg);
    let deadline = std::time::Instant::now() + END_GRACE;
    let mut pacer = sh.files.deletion_pacer();
    while std::time::Instant::now() < deadline {
        let g = sh.wake.current();
        if matches!(fresh_len(&path), Ok(None) | Err(_)) {
            return;
        }
        pacer.wait(&sh.wake, g);
    }
}

/// Removes whatever segments of a stream are left: the one it was on
/// (`seg`), the one before (its reader may not have taken it) and the one
/// after (made just before a failure). By name: the folder may hold any
/// number of other files, and is not read.
fn remove_stream(files: &StreamFiles, seg: u64) {
    for n in seg.saturating_sub(1)..=seg + 1 {
        let _ = std::fs::remove_file(files.path(n));
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "folder carrier: closed")
}

fn write_loop(sh: &WriterShared) -> io::Result<()> {
    let files = &sh.files;
    let mut pacer = files.deletion_pacer();
    loop {
        let g = sh.wake.current();
        // The file first, then the queue: bytes taken from the queue are
        // in the file before `poll_write` can append anything after them.
        let mut fs = lock(&sh.file);
        let (kind, len) = {
            let mut st = lock(&sh.st);
            if st.failed.is_some() {
                return Err(closed());
            }
            if !st.buf.is_empty() {
                let n = st.buf.len().min(MAX_PAYLOAD);
                fs.rec[HEADER..HEADER + n].copy_from_slice(&st.buf[..n]);
                st.buf.advance(n);
                (Kind::Data, n)
            } else if st.closing || st.dropped {
                // Dropped without a shutdown: as a socket's close, what
                // was written still arrives, then the end.
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
            crate::sys::write_all_at(fs.file.as_ref().ok_or_else(closed)?, &mark, fs.off)
                .map_err(|e| files.err("cannot write", fs.seg, e))?;
            fs.seq += 1;
            (fs.file, fs.seg, fs.off) = (Some(next), fs.seg + 1, 0);
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
                // No notification tells a writer of this: not a miss.
                pacer.news_unwatched();
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
