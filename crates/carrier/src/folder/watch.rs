//! Waking the folder carrier's threads: file-change notifications where the
//! file system gives them, polling where it does not.
//!
//! One notification watcher per directory per process (inotify through the
//! `notify` crate) wakes the threads of the carriers whose files changed,
//! by carrier id, and the listener when a new carrier appears. On a share
//! where another host writes (NFS, SMB, a FUSE mount, a VM's shared folder)
//! no event ever comes; a thread that finds new bytes after a timed-out
//! wait counts it as a missed event, and after a few it polls instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

use notify::Watcher;

/// A counter and a condition variable: a thread reads the counter, checks
/// what it waits for, then sleeps until the counter moves (or a timeout).
/// A bump between the read and the sleep is never lost.
#[derive(Default)]
pub struct Wake {
    gen: Mutex<u64>,
    cv: Condvar,
}

impl Wake {
    pub fn current(&self) -> u64 {
        *self.gen.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn bump(&self) {
        *self.gen.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.cv.notify_all();
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

/// Who to wake for changes in one directory.
#[derive(Default)]
struct Subscribers {
    /// By stream (`<id>.<c|s>`): the thread reading or writing it.
    carriers: HashMap<String, Vec<Weak<Wake>>>,
    /// The listener, for any new file.
    listener: Option<Weak<Wake>>,
}

/// The notification watcher of one directory, shared by every carrier of
/// this process in it.
pub struct DirWatch {
    subs: Arc<Mutex<Subscribers>>,
    /// Changes were seen here without notifications: every thread on this
    /// folder polls from now on (and writes are not made inline).
    pub missed: AtomicBool,
    _watcher: Option<notify::RecommendedWatcher>,
}

/// The stream a file belongs to: `<id>.<c|s>` of a file `lh-<id>.<c|s>.<n>`
/// (one direction of one carrier).
pub fn stream_key(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("lh-")?;
    let (key, _) = rest.rsplit_once('.')?;
    Some(key)
}

impl DirWatch {
    /// The watcher of `dir`, started on first use.
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
        let w = Arc::new(DirWatch::start(dir));
        all.insert(dir.to_path_buf(), Arc::downgrade(&w));
        w
    }

    fn start(dir: &Path) -> DirWatch {
        let subs: Arc<Mutex<Subscribers>> = Arc::default();
        let s2 = subs.clone();
        let handler = move |ev: notify::Result<notify::Event>| {
            let Ok(ev) = ev else { return };
            // Opening or reading a file is no news (and is what the
            // waiting threads do themselves).
            if matches!(ev.kind, notify::EventKind::Access(_)) {
                return;
            }
            let mut wake = Vec::new();
            {
                let s = s2.lock().unwrap_or_else(|p| p.into_inner());
                for p in &ev.paths {
                    let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
                        continue;
                    };
                    if let Some(list) = stream_key(name).and_then(|k| s.carriers.get(k)) {
                        wake.extend(list.iter().filter_map(Weak::upgrade));
                    }
                    // The listener cares only for new carriers, not for
                    // every write.
                    if matches!(ev.kind, notify::EventKind::Create(_)) && name.ends_with(".c.0") {
                        wake.extend(s.listener.as_ref().and_then(Weak::upgrade));
                    }
                }
            }
            for w in wake {
                w.bump();
            }
        };
        let watcher = notify::recommended_watcher(handler).and_then(|mut w| {
            w.watch(dir, notify::RecursiveMode::NonRecursive)?;
            Ok(w)
        });
        match watcher {
            Ok(w) => DirWatch {
                subs,
                missed: AtomicBool::new(false),
                _watcher: Some(w),
            },
            Err(e) => {
                tracing::info!(dir = %dir.display(), "no file-change notifications ({e}): polling");
                DirWatch {
                    subs,
                    missed: AtomicBool::new(true),
                    _watcher: None,
                }
            }
        }
    }

    /// Wakes `wake` whenever a file of stream `key` (`<id>.<c|s>`) changes.
    pub fn subscribe(&self, key: &str, wake: &Arc<Wake>) {
        let mut s = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        let list = s.carriers.entry(key.to_string()).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(wake));
    }

    /// Forgets the subscriptions of `key` whose threads are gone.
    pub fn unsubscribe(&self, key: &str) {
        let mut s = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(list) = s.carriers.get_mut(key) {
            list.retain(|w| w.strong_count() > 0);
            if list.is_empty() {
                s.carriers.remove(key);
            }
        }
    }

    /// Wakes `wake` for any change in the directory.
    pub fn subscribe_listener(&self, wake: &Arc<Wake>) {
        self.subs.lock().unwrap_or_else(|p| p.into_inner()).listener = Some(Arc::downgrade(wake));
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

/// One thread's waiting strategy: trusts notifications until they are
/// seen to miss changes, then polls — fast right after traffic, slower
/// (doubling, up to the cap) while nothing comes.
pub struct Pacer {
    polling: Option<Duration>,
    interval: Duration,
    misses: u32,
    /// The wake counter when the last wait ended by its timeout (nothing
    /// woke it), until news or a wake-up.
    timed_out_at: Option<u64>,
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
            timed_out_at: None,
            what,
            watch: watch.clone(),
        }
    }

    pub fn polling(&self) -> bool {
        self.polling.is_some()
    }

    /// Waits on `wake` (counter value `seen`) for the next chance of news.
    pub fn wait(&mut self, wake: &Wake, seen: u64) {
        let timeout = match self.polling {
            Some(_) => self.interval,
            None => SAFETY_POLL,
        };
        self.timed_out_at = match wake.wait(seen, timeout) {
            true => None,
            false => Some(seen),
        };
        if let Some(max) = self.polling {
            self.interval = (self.interval * 2).min(max);
        }
    }

    /// Called when a check found news (bytes, a file created or deleted).
    pub fn news(&mut self, wake: &Wake) {
        self.interval = POLL_MIN;
        if self.polling.is_none() && self.timed_out_at == Some(wake.current()) {
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
        self.timed_out_at = None;
    }
}
