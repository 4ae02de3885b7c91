//! Linux: a folder carrier's file-change notifications through its own
//! inotify descriptor, watching the folder (new files of one stream) and
//! the one file it follows, so a writer's append wakes exactly its reader.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use inotify::{EventMask, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};

/// One reader's or listener's notifications.
pub struct DirNotifier {
    /// The descriptor until it is handed to the runtime ([`Self::poll_ours`]).
    ino: Option<Inotify>,
    stream: Option<EventStream<Vec<u8>>>,
    watches: Watches,
    /// The file being followed, and its watch.
    file: Option<(PathBuf, WatchDescriptor)>,
    /// File names of our stream start with this: `lh-<id>.<c|s>.`
    prefix: String,
}

/// What one read of queued names found.
pub struct Names {
    /// Something was read (false: nothing was queued).
    pub any: bool,
    /// The kernel dropped events (its queue was full): names were lost.
    pub overflowed: bool,
}

impl DirNotifier {
    /// Watches `dir` for new files of stream `key` (`""`: any carrier's)
    /// and for the folder going away.
    pub fn watch_dir(dir: &Path, key: &str) -> io::Result<DirNotifier> {
        let ino = Inotify::init()?;
        let mask =
            WatchMask::CREATE | WatchMask::MOVED_TO | WatchMask::DELETE_SELF | WatchMask::MOVE_SELF;
        let mut watches = ino.watches();
        watches.add(dir, mask)?;
        let prefix = match key {
            "" => "lh-".to_string(),
            k => format!("lh-{k}."),
        };
        Ok(DirNotifier {
            ino: Some(ino),
            stream: None,
            watches,
            file: None,
            prefix,
        })
    }

    /// Follows `path` from now on (appends to it, its removal) instead of
    /// the file before.
    pub fn follow(&mut self, path: &Path) {
        // The same file opened afresh keeps its watch (removing a watch
        // makes the descriptor readable with nothing to read: a spin).
        if self.file.as_ref().is_some_and(|(p, _)| p == path) {
            return;
        }
        if let Some((_, old)) = self.file.take() {
            let _ = self.watches.remove(old);
        }
        // ATTRIB: an unlink while we hold the file open.
        let mask = WatchMask::MODIFY | WatchMask::ATTRIB | WatchMask::DELETE_SELF;
        self.file = self
            .watches
            .add(path, mask)
            .ok()
            .map(|wd| (path.to_path_buf(), wd));
    }

    /// Registers the descriptor with a thread's `mio::Poll`.
    pub fn register(
        &self,
        registry: &mio::Registry,
        token: mio::Token,
        _: &std::sync::Arc<mio::Waker>,
    ) -> io::Result<()> {
        let Some(ino) = &self.ino else {
            return Err(io::Error::other(
                "notifications already handed to the runtime",
            ));
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(ino);
        registry.register(
            &mut mio::unix::SourceFd(&fd),
            token,
            mio::Interest::READABLE,
        )
    }

    /// Reads every queued event (non-blocking); true if one concerns our
    /// stream.
    pub fn drain(&mut self, buf: &mut [u8]) -> bool {
        let Some(ino) = &mut self.ino else {
            return false;
        };
        let mut found = false;
        loop {
            let Ok(evs) = ino.read_events(buf) else {
                return found;
            };
            let mut any = false;
            for e in evs {
                any = true;
                found |= ours(&self.file, &self.prefix, &e.wd, e.mask, e.name);
            }
            if !any {
                return found;
            }
        }
    }

    /// One read of queued events (non-blocking), each new file's name
    /// handed to `found`.
    pub fn read_names(&mut self, buf: &mut [u8], found: &mut dyn FnMut(&OsStr)) -> Names {
        let mut names = Names {
            any: false,
            overflowed: false,
        };
        let Some(Ok(evs)) = self.ino.as_mut().map(|i| i.read_events(buf)) else {
            return names;
        };
        for e in evs {
            names.any = true;
            names.overflowed |= e.mask.contains(EventMask::Q_OVERFLOW);
            if let Some(n) = e.name {
                found(n);
            }
        }
        names
    }

    /// Hands the descriptor to the runtime (on first use: a carrier may
    /// be made outside one); an error: the runtime cannot take it.
    pub fn hand_to_runtime(&mut self) -> io::Result<()> {
        if self.stream.is_none() {
            let ino = self
                .ino
                .take()
                .ok_or_else(|| io::Error::other("notifications are gone"))?;
            self.stream = Some(ino.into_event_stream(vec![0u8; 4096])?);
        }
        Ok(())
    }

    /// Reads every notification queued on the runtime: `Ok(true)` if one
    /// was about our files.
    pub fn poll_ours(&mut self, cx: &mut Context<'_>) -> io::Result<bool> {
        let Some(stream) = &mut self.stream else {
            return Ok(false);
        };
        let mut woke = false;
        loop {
            match Pin::new(&mut *stream).poll_next(cx) {
                Poll::Ready(Some(Ok(e))) => {
                    woke |= ours(&self.file, &self.prefix, &e.wd, e.mask, e.name.as_deref())
                }
                Poll::Ready(Some(Err(e))) => return Err(e),
                Poll::Ready(None) | Poll::Pending => return Ok(woke),
            }
        }
    }
}

/// Whether an event concerns our stream: the file we follow, the folder
/// itself, or a new file whose name starts with `prefix`.
fn ours(
    file: &Option<(PathBuf, WatchDescriptor)>,
    prefix: &str,
    wd: &WatchDescriptor,
    mask: EventMask,
    name: Option<&OsStr>,
) -> bool {
    match name {
        None => file.as_ref().is_some_and(|(_, f)| f == wd) || !mask.contains(EventMask::IGNORED),
        Some(n) => n.to_str().is_some_and(|n| n.starts_with(prefix)),
    }
}
