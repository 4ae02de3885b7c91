//! The read half of a folder carrier direction: follows the segment files,
//! checks every record, and hands the payloads over in order.
//!
//! Where notifications work, the async half reads the files itself when
//! the session asks: its own inotify descriptor wakes the session's task
//! directly (no thread between the writer's append and the session), and a
//! safety timer checks anyway. When that timer finds bytes that no
//! notification announced (a share written by another host), the half
//! hands its place in the files to a thread that polls, so that a share's
//! slow reads never block the async runtime.

use std::fs::File;
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

use super::pipe::{
    failure, fresh_len, lock, open_segment, Failure, StreamFiles, CORRUPT_AFTER, INBOX,
};
use super::record::{self, Kind, Parsed, HEADER, MAX_PAYLOAD};
use super::watch::{FileWait, Pacer, PollMode, Wake, POLL_MAX};
use crate::sys::DirNotifier;

/// Where a reader is in its direction's files.
struct ReadCursor {
    files: StreamFiles,
    seg: u64,
    file: Option<File>,
    off: u64,
    seq: u64,
    chunk: Vec<u8>,
    /// Since when the record at `off` has been whole but wrong.
    bad_since: Option<Instant>,
    /// Polling: the file's size when a read last found nothing new, so
    /// that an unchanged size is not read again.
    idle_len: Option<u64>,
}

enum Step {
    Progress,
    Nothing,
    End,
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

impl ReadCursor {
    fn new(files: StreamFiles) -> ReadCursor {
        ReadCursor {
            files,
            seg: 0,
            file: None,
            off: 0,
            seq: 0,
            chunk: vec![0u8; HEADER + MAX_PAYLOAD],
            bad_since: None,
            idle_len: None,
        }
    }

    /// Reads what the files hold now into `out`, while `out` has room for a
    /// whole record within `room`. `follow` is told of each file opened.
    fn step(
        &mut self,
        out: &mut BytesMut,
        room: usize,
        polling: bool,
        follow: &mut dyn FnMut(&Path),
    ) -> io::Result<Step> {
        let path = self.files.path(self.seg);
        if self.file.is_none() {
            match open_segment(&self.files, self.seg)? {
                Some(f) => {
                    // Before the first read: no append after it goes unseen.
                    follow(&path);
                    self.file = Some(f);
                }
                None => {
                    if !self.files.dir.is_dir() {
                        return Err(io::Error::new(
                            io::ErrorKind::NotFound,
                            format!(
                                "folder carrier: the directory {} is gone",
                                self.files.dir.display()
                            ),
                        ));
                    }
                    return Ok(Step::Nothing);
                }
            }
        }
        if polling {
            // A share's client may cache the size (and a held descriptor
            // reads only up to it): ask for it afresh.
            match fresh_len(&path) {
                Ok(Some(len)) if Some(len) == self.idle_len && self.bad_since.is_none() => {
                    return Ok(Step::Nothing)
                }
                Ok(Some(len)) => self.idle_len = Some(len),
                Ok(None) => return Err(gone(&self.files, self.seg)),
                Err(e) => return Err(self.files.err("cannot look at", self.seg, e)),
            }
        }
        let Some(f) = &self.file else {
            return Ok(Step::Nothing);
        };
        let n = crate::sys::read_at(f, &mut self.chunk, self.off)
            .map_err(|e| self.files.err("cannot read", self.seg, e))?;
        let mut at = 0;
        let mut progress = false;
        let mut stuck = None;
        while at < n && out.len() + MAX_PAYLOAD <= room {
            match record::parse(&self.chunk[at..n]) {
                Parsed::Record {
                    kind,
                    seq,
                    payload,
                    size,
                } => {
                    if seq != self.seq {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "folder carrier: record {seq} where {} was due, at offset {} of {}: another writer's file?",
                                self.seq,
                                self.off + at as u64,
                                path.display()
                            ),
                        ));
                    }
                    self.seq += 1;
                    progress = true;
                    at += size;
                    if kind == Kind::Data {
                        out.extend_from_slice(payload);
                        continue;
                    }
                    // NEXT or END: this segment is read. Closed before it
                    // is removed: Windows keeps an open file's name.
                    self.file = None;
                    let _ = std::fs::remove_file(&path);
                    if kind == Kind::End {
                        return Ok(Step::End);
                    }
                    (self.seg, self.off, self.idle_len, self.bad_since) =
                        (self.seg + 1, 0, None, None);
                    return Ok(Step::Progress);
                }
                Parsed::Incomplete => break,
                Parsed::Bad => {
                    stuck = Some(self.off + at as u64);
                    break;
                }
            }
        }
        self.off += at as u64;
        if progress {
            self.idle_len = None;
            self.bad_since = None;
            return Ok(Step::Progress);
        }
        if let Some(at) = stuck {
            let since = *self.bad_since.get_or_insert_with(Instant::now);
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
            self.file = None;
        } else if !polling && std::fs::symlink_metadata(&path).is_err() {
            // Woken for nothing: was it the file going away?
            return Err(gone(&self.files, self.seg));
        }
        Ok(Step::Nothing)
    }

    /// Removes the segment being read: read, or given up on.
    fn remove_current(&mut self) {
        self.file = None;
        let _ = std::fs::remove_file(self.files.path(self.seg));
    }
}

/// The read half of a direction.
pub struct FolderRead {
    side: Side,
}

enum Side {
    Inline(Box<Inline>),
    Thread(Arc<ReaderShared>),
    /// Only while handing over.
    Moving,
}

/// Starts reading a direction from segment 0 (it waits for the file to
/// appear).
pub fn start_reader(mut files: StreamFiles) -> io::Result<FolderRead> {
    let pacer = files.pacer();
    if !pacer.polling() {
        match DirNotifier::watch_dir(&files.dir, &files.key) {
            Ok(notes) => {
                return Ok(FolderRead {
                    side: Side::Inline(Box::new(Inline {
                        cursor: ReadCursor::new(files),
                        buf: BytesMut::new(),
                        notes,
                        on_runtime: false,
                        timer: None,
                        pacer,
                        eof: false,
                        failed: None,
                    })),
                })
            }
            // Out of inotify instances (fs.inotify.max_user_instances, 128
            // by default): this carrier polls.
            Err(e) => {
                tracing::info!(dir = %files.dir.display(), "no file-change notifications ({e}): this carrier polls");
                files.mode = PollMode::Forced(POLL_MAX);
                // None on this system at all: every carrier on the folder
                // polls, and writes go through their threads (on a share
                // an append may block).
                if e.kind() == io::ErrorKind::Unsupported {
                    files
                        .watch
                        .missed
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
    }
    let pacer = files.pacer();
    Ok(FolderRead {
        side: start_thread(ReadCursor::new(files), BytesMut::new(), pacer)?,
    })
}

// ------------------------------------------------------------ inline

struct Inline {
    cursor: ReadCursor,
    /// Payloads read and not yet taken.
    buf: BytesMut,
    /// File-change notifications, handed to the runtime on first use (the
    /// carrier may be made outside it).
    notes: DirNotifier,
    on_runtime: bool,
    /// The safety check's deadline while waiting.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    pacer: Pacer,
    eof: bool,
    failed: Option<Failure>,
}

/// What one inline read attempt came to.
enum Inlined {
    Ready(io::Result<()>),
    Pending,
    /// Notifications miss changes here: poll on a thread instead.
    HandOver,
}

impl Inline {
    /// Reads every queued notification; true if one was about our files.
    fn drain_events(&mut self, cx: &mut Context<'_>) -> bool {
        match self.notes.poll_ours(cx) {
            Ok(woke) => woke,
            Err(e) => {
                self.failed = Some(failure(&e));
                false
            }
        }
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Inlined {
        loop {
            if !self.buf.is_empty() {
                let n = self.buf.len().min(out.remaining());
                out.put_slice(&self.buf[..n]);
                self.buf.advance(n);
                return Inlined::Ready(Ok(()));
            }
            if self.eof {
                return Inlined::Ready(Ok(()));
            }
            if let Some((kind, msg)) = &self.failed {
                return Inlined::Ready(Err(io::Error::new(*kind, msg.clone())));
            }
            if !self.on_runtime {
                match self.notes.hand_to_runtime() {
                    Ok(()) => self.on_runtime = true,
                    Err(_) => return Inlined::HandOver,
                }
            }
            let notes = &mut self.notes;
            let step = self
                .cursor
                .step(&mut self.buf, INBOX, false, &mut |p| notes.follow(p));
            match step {
                Ok(Step::Progress) => {
                    // A notification that came after the timeout (a busy
                    // machine) is late, not missing.
                    if self.pacer.timed_out() && self.drain_events(cx) {
                        self.pacer.note_wait(false);
                    }
                    self.pacer.news();
                    if self.pacer.polling() {
                        return Inlined::HandOver;
                    }
                    continue;
                }
                Ok(Step::End) => {
                    self.eof = true;
                    continue;
                }
                Ok(Step::Nothing) => {}
                Err(e) => {
                    tracing::warn!("{e}");
                    self.failed = Some(failure(&e));
                    self.cursor.remove_current();
                    continue;
                }
            }
            // Nothing yet: a notification, or the safety check.
            if self.drain_events(cx) || self.failed.is_some() {
                self.pacer.note_wait(false);
                self.timer = None;
                continue;
            }
            let timeout = self.pacer.timeout();
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
            match timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.pacer.note_wait(true);
                    self.timer = None;
                }
                Poll::Pending => return Inlined::Pending,
            }
        }
    }
}

// ------------------------------------------------------------ thread

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

fn start_thread(cursor: ReadCursor, buf: BytesMut, pacer: Pacer) -> io::Result<Side> {
    let sh = Arc::new(ReaderShared {
        st: Mutex::new(InState {
            buf,
            ..InState::default()
        }),
        wake: Arc::default(),
    });
    // Set up before the thread runs, so that no wake-up is missed.
    let waiter = FileWait::new(None, &sh.wake)?;
    let s2 = sh.clone();
    std::thread::Builder::new()
        .name("lh-dir-read".into())
        .spawn(move || {
            let mut cursor = cursor;
            let r = read_loop(&s2, &mut cursor, waiter, pacer);
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
            cursor.remove_current();
        })?;
    Ok(Side::Thread(sh))
}

fn read_loop(
    sh: &ReaderShared,
    cursor: &mut ReadCursor,
    mut waiter: FileWait,
    mut pacer: Pacer,
) -> io::Result<()> {
    let mut got = BytesMut::new();
    loop {
        let room = {
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
            INBOX - st.buf.len()
        };
        let step = cursor.step(&mut got, room, pacer.polling(), &mut |p| waiter.follow(p))?;
        if !got.is_empty() {
            let w = {
                let mut st = lock(&sh.st);
                st.buf.extend_from_slice(&got);
                st.waker.take()
            };
            got.clear();
            if let Some(w) = w {
                w.wake();
            }
        }
        match step {
            Step::Progress => pacer.news(),
            Step::End => return Ok(()),
            Step::Nothing => pacer.wait_with(|t| waiter.wait(t)),
        }
    }
}

impl AsyncRead for FolderRead {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Side::Inline(inline) = &mut self.side {
            match inline.poll_read(cx, out) {
                Inlined::Ready(r) => return Poll::Ready(r),
                Inlined::Pending => return Poll::Pending,
                Inlined::HandOver => {
                    let Side::Inline(inline) = std::mem::replace(&mut self.side, Side::Moving)
                    else {
                        return Poll::Ready(Err(io::Error::other(
                            "folder carrier: lost its reader",
                        )));
                    };
                    let Inline {
                        mut cursor,
                        buf,
                        mut pacer,
                        ..
                    } = *inline;
                    // Polling from now on (a thread cannot wait on the
                    // runtime's notifications).
                    if !pacer.polling() {
                        cursor.files.mode = PollMode::Forced(POLL_MAX);
                        pacer = cursor.files.pacer();
                    }
                    match start_thread(cursor, buf, pacer) {
                        Ok(side) => self.side = side,
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
            }
        }
        let Side::Thread(sh) = &self.side else {
            return Poll::Ready(Err(io::Error::other("folder carrier: lost its reader")));
        };
        let mut st = lock(&sh.st);
        if !st.buf.is_empty() {
            let n = st.buf.len().min(out.remaining());
            out.put_slice(&st.buf[..n]);
            st.buf.advance(n);
            let wake = st.wants_room && st.buf.len() + MAX_PAYLOAD <= INBOX;
            if wake {
                st.wants_room = false;
                drop(st);
                sh.wake.bump();
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
        match &mut self.side {
            Side::Inline(inline) => inline.cursor.remove_current(),
            Side::Thread(sh) => {
                lock(&sh.st).dropped = true;
                sh.wake.bump();
            }
            Side::Moving => {}
        }
    }
}
