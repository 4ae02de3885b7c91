//! Waking the folder carrier's threads: file-change notifications where the
//! file system gives them, polling where it does not.
//!
//! A reader thread waits on its own notifications (inotify on Linux; the `notify` crate elsewhere), watching the one
//! file it follows (and the folder for new files), so that a writer's
//! append wakes exactly the thread that reads it and nothing else; the
//! listener watches the folder for new files. (A writer waits only for the
//! session's bytes, or — rarely — for its reader to delete a segment, which
//! it polls for.) On a share where another host writes (NFS, SMB, a FUSE
//! mount, a VM's shared folder) no event ever comes; a thread that finds
//! new bytes after a timed-out wait counts it as a missed event, and after
//! a few every thread on that folder polls instead.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::sys::DirNotifier;

/// A counter and a condition variable: a thread reads the counter, checks
/// what it waits for, then sleeps until the counter moves (or a timeout).
/// A bump between the read and the sleep is never lost.
#[derive(Default)]
pub struct Wake {
    gen: Mutex<u64>,
    cv: Condvar,
    /// Also wakes a thread that sleeps in a [`FileWait`].
    poll_waker: OnceLock<Arc<mio::Waker>>,
}

impl Wake {
    pub fn current(&self) -> u64 {
        *self.gen.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn bump(&self) {
        *self.gen.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.cv.notify_all();
        if let Some(w) = self.poll_waker.get() {
            let _ = w.wake();
        }
    }

    /// Sleeps until the counter is no longer `seen` or `timeout` passes;
    /// true if it moved.
    pub fn wait(&self, seen: u64, timeout: Duration) -> bool {
        let g = self.gen.lock().unwrap_or_else(|p| p.into_inner());
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |g| *g == seen)
            .unwrap_or_else(|p| p.into_inner());
        *g != seen
    }
}

/// What the threads of this process know about one folder.
#[derive(Default)]
pub struct DirWatch {
    /// Changes were seen here without notifications: every thread on this
    /// folder polls from now on (and writes are not made inline).
    pub missed: AtomicBool,
}

impl DirWatch {
    /// The state of `dir`, shared by every carrier of this process in it.
    pub fn of(dir: &Path) -> Arc<DirWatch> {
        static ALL: OnceLock<Mutex<HashMap<PathBuf, Weak<DirWatch>>>> = OnceLock::new();
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all.retain(|_, w| w.strong_count() > 0);
        if let Some(w) = all.get(dir).and_then(Weak::upgrade) {
            return w;
        }
        let w = Arc::new(DirWatch::default());
        all.insert(dir.to_path_buf(), Arc::downgrade(&w));
        w
    }
}

/// How a thread waits for the next change of the file it follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Notifications, checked by a slow safety poll.
    Auto,
    /// Polling only, backing off to at most this interval when idle.
    Forced(Duration),
}

/// The safety poll while notifications are trusted: how late a missed
/// event can make us, until polling takes over.
pub const SAFETY_POLL: Duration = Duration::from_millis(100);
/// The first poll after traffic, doubling while nothing comes.
pub const POLL_MIN: Duration = Duration::from_micros(50);
/// The longest pause between polls of an idle carrier.
pub const POLL_MAX: Duration = Duration::from_millis(50);
/// Missed events before a thread stops trusting notifications.
const MISSES_TO_POLL: u32 = 2;

/// A thread's wait: its [`DirNotifier`] (if notifications are used) and the
/// [`Wake`] of its carrier half, in one `poll`.
pub struct FileWait {
    poll: mio::Poll,
    events: mio::Events,
    watch: Option<DirNotifier>,
    buf: Vec<u8>,
    /// Events were left queued by the last [`FileWait::wait_names`]: the
    /// next one reads them before it sleeps (edge-triggered: no new wake).
    backlog: bool,
}

/// How a [`FileWait::wait_names`] ended.
#[derive(Default)]
pub struct Woken {
    /// The kernel dropped events (its queue was full): names were lost.
    pub overflowed: bool,
}

/// Reads of queued events per [`FileWait::wait_names`] (each read takes
/// up to 4 KiB, ≈ 100 names): a flood of new files is taken in bounded
/// portions.
const NAME_READS: usize = 16;

const NOTIFIER: mio::Token = mio::Token(0);
const WAKER: mio::Token = mio::Token(1);

impl FileWait {
    /// Waits on `watch` (None: polling only) and on `wake`.
    pub fn new(watch: Option<DirNotifier>, wake: &Wake) -> std::io::Result<FileWait> {
        let poll = mio::Poll::new()?;
        // One waker per poll (mio's rule): shared with the notifier where
        // it wakes the thread from a thread of its own.
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKER)?);
        wake.poll_waker
            .set(waker.clone())
            .map_err(|_| std::io::Error::other("a wake serves one waiting thread"))?;
        if let Some(n) = &watch {
            n.register(poll.registry(), NOTIFIER, &waker)?;
        }
        Ok(FileWait {
            poll,
            events: mio::Events::with_capacity(4),
            watch,
            buf: vec![0u8; 4096],
            backlog: false,
        })
    }

    pub fn follow(&mut self, path: &Path) {
        if let Some(n) = &mut self.watch {
            n.follow(path);
        }
    }

    /// Sleeps until our stream's files change, the wake is bumped, or the
    /// timeout; true unless it timed out.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        if self.poll.poll(&mut self.events, Some(timeout)).is_err() {
            return true;
        }
        let woke = self.events.iter().any(|e| e.token() == WAKER);
        // Edge-triggered: read every queued event.
        let ours = match &mut self.watch {
            Some(n) => n.drain(&mut self.buf),
            None => false,
        };
        woke || ours
    }
}

impl FileWait {
    /// Sleeps until files are created in (or moved into) the folder, the
    /// wake is bumped, or the timeout, and hands each new file's name to
    /// `found`: the folder is never read for them.
    pub fn wait_names(&mut self, timeout: Duration, found: &mut dyn FnMut(&OsStr)) -> Woken {
        let mut woken = Woken::default();
        if !self.backlog {
            let _ = self.poll.poll(&mut self.events, Some(timeout));
        }
        self.backlog = false;
        let Some(n) = &mut self.watch else {
            return woken;
        };
        for _ in 0..NAME_READS {
            let names = n.read_names(&mut self.buf, found);
            woken.overflowed |= names.overflowed;
            if !names.any {
                return woken;
            }
        }
        self.backlog = true;
        woken
    }
}

/// One thread's waiting strategy: trusts notifications until they are
/// seen to miss changes, then polls — fast right after traffic, slower
/// (doubling, up to the cap) while nothing comes.
pub struct Pacer {
    polling: Option<Duration>,
    interval: Duration,
    misses: u32,
    /// The last wait ended by its timeout: nothing woke it.
    timed_out: bool,
    what: String,
    watch: Arc<DirWatch>,
}

impl Pacer {
    pub fn new(mode: PollMode, watch: &Arc<DirWatch>, what: String) -> Pacer {
        let polling = match mode {
            PollMode::Forced(max) => Some(max.max(POLL_MIN)),
            PollMode::Auto if watch.missed.load(Ordering::Relaxed) => Some(POLL_MAX),
            PollMode::Auto => None,
        };
        Pacer {
            polling,
            interval: POLL_MIN,
            misses: 0,
            timed_out: false,
            what,
            watch: watch.clone(),
        }
    }

    pub fn polling(&self) -> bool {
        self.polling.is_some()
    }

    /// Waits on `wake` (counter value `seen`) for the next chance of news.
    pub fn wait(&mut self, wake: &Wake, seen: u64) {
        self.wait_with(|t| wake.wait(seen, t))
    }

    /// Waits with `sleep` (which says whether something woke it before
    /// the timeout it is given) for the next chance of news.
    pub fn wait_with(&mut self, sleep: impl FnOnce(Duration) -> bool) {
        self.note_wait(!sleep(self.timeout()));
    }

    /// How long the next wait may last before checking anyway.
    pub fn timeout(&self) -> Duration {
        match self.polling {
            Some(_) => self.interval,
            None => SAFETY_POLL,
        }
    }

    /// Records how a wait ended (for a wait made elsewhere: an async one).
    pub fn note_wait(&mut self, timed_out: bool) {
        self.timed_out = timed_out;
        if let Some(max) = self.polling {
            self.interval = (self.interval * 2).min(max);
        }
    }

    /// Called when a check found news that no notification announces (a
    /// writer finding its reader's deletion): polls fast again, judges
    /// nothing.
    pub fn news_unwatched(&mut self) {
        self.interval = POLL_MIN;
        self.timed_out = false;
    }

    /// Whether the last wait ended by its timeout: the caller may look for
    /// a notification that came late (a busy machine) before [`news`]
    /// counts the change as missed.
    ///
    /// [`news`]: Pacer::news
    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    /// Called when a check found news (bytes, a file created or deleted).
    pub fn news(&mut self) {
        self.interval = POLL_MIN;
        if self.polling.is_none() && self.timed_out {
            // The change was there but no notification came for it.
            self.misses += 1;
            if self.misses >= MISSES_TO_POLL {
                self.polling = Some(POLL_MAX);
                if !self.watch.missed.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "{}: changes arrive without file-change notifications (a network or FUSE share?): polling instead",
                        self.what
                    );
                }
            }
        }
        self.timed_out = false;
    }
}
