//! Windows and macOS: a folder carrier's file-change notifications
//! through the `notify` crate — ReadDirectoryChangesW, FSEvents. Its
//! thread hands the name of each file of ours (the followed file, our
//! stream's) to a bounded queue and wakes the waiting thread (a
//! `mio::Waker`) or task; others' files wake no one. On the BSDs the
//! folder is polled: notify's kqueue backend opens every file that
//! appears in the folder (a FIFO there would block it, and each file
//! holds a descriptor), which whoever writes the folder must not cause. Shares that deliver no events (SMB, VM shared folders) are
//! caught as on Linux: a poll that finds what no event announced switches
//! the folder to polling, with a log line.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Context;

use futures_util::task::AtomicWaker;
use notify::{Event, RecursiveMode, Watcher};

/// Names queued at most between two reads; past it they are dropped and
/// the next read says it overflowed (as inotify's queue does).
const MAX_QUEUED: usize = 4096;

/// One reader's or listener's notifications.
pub struct DirNotifier {
    watcher: notify::RecommendedWatcher,
    shared: Arc<Shared>,
    /// The file being followed.
    file: Option<PathBuf>,
}

#[derive(Default)]
struct Shared {
    /// File names of our stream start with this: `lh-<id>.<c|s>.`
    prefix: String,
    /// The followed file's name.
    followed: Mutex<Option<OsString>>,
    queue: Mutex<Queue>,
    thread: OnceLock<Arc<mio::Waker>>,
    task: AtomicWaker,
}

#[derive(Default)]
struct Queue {
    names: VecDeque<OsString>,
    overflowed: bool,
    /// An event about the folder itself (removed, renamed).
    folder: bool,
}

/// What one read of queued names found.
pub struct Names {
    /// Something was read (false: nothing was queued).
    pub any: bool,
    /// Events were dropped (the queue was full): names were lost.
    pub overflowed: bool,
}

impl DirNotifier {
    /// Watches `dir` for new files of stream `key` (`""`: any carrier's)
    /// and for the folder going away.
    pub fn watch_dir(dir: &Path, key: &str) -> io::Result<DirNotifier> {
        if !cfg!(any(windows, target_os = "macos")) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "kqueue watches open every file in the folder",
            ));
        }
        let prefix = match key {
            "" => "lh-".to_string(),
            k => format!("lh-{k}."),
        };
        let shared = Arc::new(Shared {
            prefix,
            ..Shared::default()
        });
        let to = shared.clone();
        let top = dir.to_path_buf();
        let mut watcher =
            notify::recommended_watcher(move |e: notify::Result<Event>| to.push(&top, e))
                .map_err(io::Error::other)?;
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(io::Error::other)?;
        Ok(DirNotifier {
            watcher,
            shared,
            file: None,
        })
    }

    /// Follows `path` from now on (appends to it, its removal) instead of
    /// the file before. (Where the system watches folders only, as
    /// Windows, the folder's own watch reports it too.)
    pub fn follow(&mut self, path: &Path) {
        if self.file.as_deref() == Some(path) {
            return;
        }
        if let Some(old) = self.file.take() {
            let _ = self.watcher.unwatch(&old);
        }
        // A failed watch leaves the folder's: polling catches the rest.
        let _ = self.watcher.watch(path, RecursiveMode::NonRecursive);
        self.file = Some(path.to_path_buf());
        *self
            .shared
            .followed
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = path.file_name().map(OsStr::to_os_string);
    }

    /// Wakes a thread's `mio::Poll` (through its one waker: a wake is
    /// also a check of this queue) when something comes.
    pub fn register(
        &self,
        _: &mio::Registry,
        _: mio::Token,
        waker: &Arc<mio::Waker>,
    ) -> io::Result<()> {
        let queued = !self.shared.lock().names.is_empty();
        let _ = self.shared.thread.set(waker.clone());
        if queued {
            self.shared.wake();
        }
        Ok(())
    }

    /// Takes every queued event; true if one concerns our stream.
    pub fn drain(&mut self, _: &mut [u8]) -> bool {
        // Only names of ours are queued.
        let mut q = self.shared.lock();
        let found = q.folder || q.overflowed || !q.names.is_empty();
        *q = Queue::default();
        found
    }

    /// Takes the queued events, each new file's name handed to `found`.
    pub fn read_names(&mut self, _: &mut [u8], found: &mut dyn FnMut(&OsStr)) -> Names {
        let q = std::mem::take(&mut *self.shared.lock());
        for n in &q.names {
            found(n);
        }
        Names {
            any: !q.names.is_empty() || q.overflowed || q.folder,
            overflowed: q.overflowed,
        }
    }

    /// Nothing to hand over: the crate's thread wakes the task.
    pub fn hand_to_runtime(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// Takes every queued notification: `Ok(true)` if one was about our
    /// files; the task is woken when the next comes.
    pub fn poll_ours(&mut self, cx: &mut Context<'_>) -> io::Result<bool> {
        self.shared.task.register(cx.waker());
        Ok(self.drain(&mut []))
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self) {
        if let Some(w) = self.thread.get() {
            let _ = w.wake();
        }
        self.task.wake();
    }

    fn ours(&self, name: &OsStr) -> bool {
        self.followed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
            == Some(name)
            || name.to_str().is_some_and(|n| n.starts_with(&self.prefix))
    }

    /// On the crate's thread: queues the names of ours an event is about,
    /// and wakes the reader if there were any.
    fn push(&self, dir: &Path, event: notify::Result<Event>) {
        {
            let mut q = self.lock();
            let before = (q.names.len(), q.overflowed, q.folder);
            match event {
                Ok(e) if e.need_rescan() => q.overflowed = true,
                Ok(e) => {
                    for p in &e.paths {
                        match p.file_name() {
                            _ if p == dir => q.folder = true,
                            Some(n) if !self.ours(n) => {}
                            Some(_) if q.names.len() >= MAX_QUEUED => q.overflowed = true,
                            Some(n) => q.names.push_back(n.to_os_string()),
                            None => q.folder = true,
                        }
                    }
                }
                // The watch failed (the folder went away, the system's
                // queue overflowed): the readers look for themselves.
                Err(_) => q.overflowed = true,
            }
            if (q.names.len(), q.overflowed, q.folder) == before {
                return;
            }
        }
        self.wake();
    }
}
