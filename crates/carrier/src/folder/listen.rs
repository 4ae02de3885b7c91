//! The folder listener: finds the carriers clients open in a shared folder,
//! at a cost that stays bounded whatever else the folder holds.
//!
//! Anyone who can write the folder can fill it with files. So:
//! * a new file is known by its notification's name (no rescan per
//!   event); the folder is read in steps of at most [`SCAN_BATCH`] entries,
//!   continuing where the last step stopped, one step per [`SCAN_WATCHED`]
//!   (a safety net for missed notifications) or per [`SCAN_POLLING`] where
//!   there are none: a folder of N entries is read once per N / 1024 steps;
//! * at most [`DECISIONS_PER_SEC`] carriers are answered or refused per
//!   second (a token bucket, [`DECISIONS_BURST`] at once); the newest
//!   [`QUEUED`] found by notification wait for their turn, newest first,
//!   the others are found again by a later step;
//! * a carrier takes its session slot (`--max-sessions`) and one of
//!   [`MAX_PENDING`] places for carriers still in their handshake before
//!   anything is started for it (a file, a thread). When the places are
//!   taken, a carrier that appeared later (by notification order) than the
//!   earliest one in its handshake ends that one (its first file removed)
//!   to take its place — the earliest whose client has sent nothing, if
//!   there is one — as OpenSSH's MaxStartups drops: forged carriers made
//!   before a real client cannot keep it out (nor empty ones found later
//!   by a scan, which would otherwise count as newer), and no more than
//!   2 × [`MAX_PENDING`] exist at once (beyond, without a slot, or not
//!   newer, a carrier is refused: an END answers it, with no thread);
//! * what the listener remembers is bounded: [`KNOWN_IDS`] ids not to
//!   answer (carriers from before it started, refused ones).

use std::collections::{HashSet, VecDeque};
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use std::sync::Weak;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::pipe::{create_segment, segment_path};
use super::record::{self, Kind};
use super::watch::{DirWatch, FileWait, PollMode, Wake};
use super::{check_dir, start, stream_files, FolderStream, FolderUrl};
use crate::sys::DirNotifier;

/// Files untouched this long are left over from a dead process (live
/// carriers write a keepalive every few seconds): the listener removes them.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);
/// How often a pass over the folder also looks for stale files.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Entries of the folder examined per step.
pub const SCAN_BATCH: usize = 1024;
/// One step this often where notifications work (only a safety net)…
pub const SCAN_WATCHED: Duration = Duration::from_secs(1);
/// …and this often where they do not (how late a new carrier is found in
/// a folder of fewer than [`SCAN_BATCH`] entries).
pub const SCAN_POLLING: Duration = Duration::from_millis(100);
/// Carriers answered or refused per second, at most (token bucket)…
pub const DECISIONS_PER_SEC: u32 = 200;
/// …and at once.
pub const DECISIONS_BURST: u32 = 64;
/// Carriers of one folder started and not yet through their handshake
/// (each ≈ 150 KiB and a thread or two while it lasts).
pub const MAX_PENDING: usize = 32;
/// Carriers found by notification that wait for a decision.
pub const QUEUED: usize = 256;
/// Carrier ids remembered as not to be answered.
pub const KNOWN_IDS: usize = 65_536;
/// Answers to refused carriers (an END only) are removed after this; the
/// client has read its END long before.
const REFUSAL_GRACE: Duration = Duration::from_secs(5);

/// What a started carrier holds until its owner lets go: its session slot
/// (for as long as it is served) and its place among the carriers in their
/// handshake (until the handshake is done).
#[derive(Default)]
pub struct Admission {
    pub slot: Option<OwnedSemaphorePermit>,
    pub pending: Option<Pending>,
}

/// A carrier's place among the handshakes: dropped, the place is free.
pub struct Pending {
    _place: Arc<()>,
}

/// A carrier started and in its handshake, as the listener remembers it.
struct Started {
    id: u64,
    /// When it appeared (notification order).
    seq: u64,
    /// Its place among the handshakes: gone once the handshake is done.
    place: Weak<()>,
    /// Ended to make room for a later one.
    ended: bool,
    /// Its client's first bytes were read.
    heard: Arc<AtomicBool>,
}

/// Server side: finds carriers that clients open in the directory.
pub struct FolderListener {
    rx: tokio::sync::mpsc::Receiver<FolderStream>,
    stop: Arc<AtomicBool>,
    wake: Arc<Wake>,
    url: FolderUrl,
}

impl FolderListener {
    /// Starts watching `url`'s directory, with no session limit of its
    /// own (see [`bind_with_slots`](FolderListener::bind_with_slots)).
    pub fn bind(url: &FolderUrl) -> io::Result<FolderListener> {
        FolderListener::bind_with_slots(url, None)
    }

    /// Starts watching `url`'s directory. Carriers whose files are already
    /// there are an earlier run's and are ignored (a client still waiting
    /// on one gives up after its handshake timeout and dials again). A
    /// carrier is started only with a permit of `slots` (the server's
    /// `--max-sessions`), held by the stream.
    pub fn bind_with_slots(
        url: &FolderUrl,
        slots: Option<Arc<Semaphore>>,
    ) -> io::Result<FolderListener> {
        check_dir(&url.dir)?;
        let started = probe(&url.dir)?;
        let watch = DirWatch::of(&url.dir);
        let wake = Arc::new(Wake::default());
        let notes = match url.poll {
            PollMode::Auto => match DirNotifier::watch_dir(&url.dir, "") {
                Ok(n) => Some(n),
                Err(e) => {
                    tracing::info!(dir = %url.dir.display(), "no file-change notifications ({e}): the listener polls");
                    if e.kind() == io::ErrorKind::Unsupported {
                        watch.missed.store(true, Ordering::Relaxed);
                    }
                    None
                }
            },
            PollMode::Forced(_) => None,
        };
        let watched = notes.is_some();
        let waiter = FileWait::new(notes, &wake)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let mut state = Listening {
            url: url.clone(),
            watch,
            started,
            slots,
            pending: VecDeque::new(),
            queued: VecDeque::new(),
            appeared: 0,
            known: HashSet::new(),
            scan: None,
            sweeping: false,
            last_sweep: None,
            tokens: DECISIONS_BURST as f64,
            refill: Instant::now(),
            answers: VecDeque::new(),
            refused: Throttle::default(),
            tx,
        };
        let s2 = stop.clone();
        std::thread::Builder::new()
            .name("lh-dir-listen".into())
            .spawn(move || state.run(waiter, watched, &s2))?;
        Ok(FolderListener {
            rx,
            stop,
            wake,
            url: url.clone(),
        })
    }

    pub fn url(&self) -> &FolderUrl {
        &self.url
    }

    /// The next carrier a client opened.
    pub async fn accept(&mut self) -> io::Result<FolderStream> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| io::Error::other(format!("folder listener on {} stopped", self.url)))
    }
}

impl Drop for FolderListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.wake.bump();
    }
}

/// Fails now, not on the first client, if we cannot write in `dir`; and
/// returns the folder's own time now (a file's mtime, from the same clock
/// as the clients' files: no skew between hosts).
fn probe(dir: &Path) -> io::Result<SystemTime> {
    let path = dir.join(format!("lh-probe-{:016x}", rand::random::<u64>()));
    let cannot = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("folder carrier: cannot write in {} ({e})", dir.display()),
        )
    };
    // create_new: never through whatever might be there already.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(cannot)?;
    let t = f.metadata().and_then(|m| m.modified());
    drop(f);
    let _ = std::fs::remove_file(&path);
    t.map_err(cannot)
}

/// The id of a client's first file `lh-<16 hex digits>.c.0`.
fn first_file_id(name: &OsStr) -> Option<u64> {
    let id = name.to_str()?.strip_prefix("lh-")?.strip_suffix(".c.0")?;
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(id, 16).ok()
}

/// What became of a carrier found.
enum Decided {
    /// Answered, refused, or not to be answered.
    Done,
    /// No decision may be made now (the token bucket is empty).
    Later,
    /// The server takes no more carriers.
    Stop,
}

/// Logs a refusal at most every 10 s, with how many there were since.
#[derive(Default)]
struct Throttle {
    last: Option<Instant>,
    since: u64,
}

impl Throttle {
    fn note(&mut self, dir: &Path, why: &str) {
        self.since += 1;
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            return;
        }
        tracing::warn!(
            folder = %dir.display(),
            "refusing {} carrier(s): {why} (logged at most every 10 s)",
            self.since
        );
        (self.last, self.since) = (Some(Instant::now()), 0);
    }
}

struct Listening {
    url: FolderUrl,
    watch: Arc<DirWatch>,
    /// The folder's time when we started: older first files are ignored.
    started: SystemTime,
    slots: Option<Arc<Semaphore>>,
    /// Carriers started and (while their [`Pending`] lives) in their
    /// handshake.
    pending: VecDeque<Started>,
    /// Ids found by notification, waiting for a decision (newest last),
    /// with when they appeared.
    queued: VecDeque<(u64, u64)>,
    /// Notifications of first files so far: the order they appeared in
    /// (0: found by reading the folder, older than any notified).
    appeared: u64,
    /// Ids not to answer (older than us, refused), at most [`KNOWN_IDS`].
    known: HashSet<u64>,
    /// The pass over the folder in progress.
    scan: Option<std::fs::ReadDir>,
    /// The current pass also removes stale files.
    sweeping: bool,
    last_sweep: Option<Instant>,
    /// Decisions that may be made now (token bucket).
    tokens: f64,
    refill: Instant,
    /// Refusals' answer files, removed after [`REFUSAL_GRACE`].
    answers: VecDeque<(Instant, PathBuf)>,
    refused: Throttle,
    tx: tokio::sync::mpsc::Sender<FolderStream>,
}

impl Listening {
    fn run(&mut self, mut waiter: FileWait, watched: bool, stop: &AtomicBool) {
        let every = if watched { SCAN_WATCHED } else { SCAN_POLLING };
        let mut next_step = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            // Those found by notification first: newest first.
            while let Some(&(id, seq)) = self.queued.back() {
                match self.consider(id, Some(seq)) {
                    Decided::Later => break,
                    Decided::Stop => return,
                    Decided::Done => {}
                }
                self.queued.pop_back();
            }
            if Instant::now() >= next_step {
                if !self.step() {
                    return;
                }
                next_step = Instant::now() + every;
            }
            self.forget_answers();
            let mut timeout = next_step.saturating_duration_since(Instant::now());
            if !self.queued.is_empty() {
                // The next decision's token.
                timeout = timeout.min(Duration::from_secs(1) / DECISIONS_PER_SEC);
            }
            let (queued, appeared) = (&mut self.queued, &mut self.appeared);
            let w = waiter.wait_names(timeout.max(Duration::from_millis(1)), &mut |n| {
                if let Some(id) = first_file_id(n) {
                    if queued.len() >= QUEUED {
                        queued.pop_front();
                    }
                    *appeared += 1;
                    queued.push_back((id, *appeared));
                }
            });
            if w.overflowed {
                // Names were lost: read the folder now.
                next_step = Instant::now();
            }
        }
    }

    /// Reads up to [`SCAN_BATCH`] entries of the folder; false once the
    /// server no longer takes carriers.
    fn step(&mut self) -> bool {
        if self.scan.is_none() {
            self.sweeping = self.last_sweep.is_none_or(|t| t.elapsed() > SWEEP_EVERY);
            if self.sweeping {
                self.last_sweep = Some(Instant::now());
            }
            self.scan = std::fs::read_dir(&self.url.dir).ok();
        }
        let Some(rd) = &mut self.scan else {
            return true;
        };
        let mut batch = Vec::new();
        let mut stale = Vec::new();
        let now = SystemTime::now();
        for _ in 0..SCAN_BATCH {
            let Some(e) = rd.next() else {
                self.scan = None;
                break;
            };
            let Ok(e) = e else { continue };
            let name = e.file_name();
            if let Some(id) = first_file_id(&name) {
                batch.push(id);
            }
            if self.sweeping && name.to_str().is_some_and(|n| n.starts_with("lh-")) {
                // The entry's own lstat: never through a link.
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| now.duration_since(t).ok())
                    .is_some_and(|age| age > STALE_AFTER);
                if old {
                    stale.push(e.path());
                }
            }
        }
        for p in stale {
            // Debug formatting: a name a folder writer chose, escaped.
            tracing::info!(file = ?p, "removing a stale folder-carrier file");
            let _ = std::fs::remove_file(p);
        }
        batch
            .into_iter()
            .all(|id| !matches!(self.consider(id, None), Decided::Stop))
    }

    fn path(&self, id: u64, side: char) -> PathBuf {
        segment_path(&self.url.dir, &format!("{id:016x}.{side}"), 0)
    }

    fn remember(&mut self, id: u64) {
        if self.known.len() < KNOWN_IDS {
            self.known.insert(id);
        }
    }

    /// A client's first file was seen: answers it, refuses it or leaves it
    /// (`Later`: no decision may be made now). `queued`: when it appeared,
    /// if it was found by notification (and waits in the queue).
    fn consider(&mut self, id: u64, queued: Option<u64>) -> Decided {
        if self.known.contains(&id) {
            return Decided::Done;
        }
        let c0 = self.path(id, 'c');
        let Ok(meta) = std::fs::symlink_metadata(&c0) else {
            return Decided::Done;
        };
        if meta.modified().is_ok_and(|t| t < self.started) {
            // An earlier run's.
            self.remember(id);
            return Decided::Done;
        }
        if std::fs::symlink_metadata(self.path(id, 's')).is_ok() {
            // Answered already (by us, or another server on this folder).
            return Decided::Done;
        }
        // Those waiting in the queue go first; the token bucket bounds the
        // rate of everything below.
        if (queued.is_none() && !self.queued.is_empty()) || !self.take_token() {
            return Decided::Later;
        }
        let slot = match &self.slots {
            None => None,
            Some(s) => match s.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    self.refuse(id, "session limit reached (--max-sessions)");
                    return Decided::Done;
                }
            },
        };
        // Found by reading the folder (a share without notifications): in
        // the order found, so that a later carrier can still end an earlier
        // one that never finishes.
        let seq = queued.unwrap_or_else(|| {
            self.appeared += 1;
            self.appeared
        });
        if !self.make_room(seq) {
            let why = format!("{MAX_PENDING} carriers of this folder are in their handshake");
            self.refuse(id, &why);
            return Decided::Done;
        }
        let key = format!("{id:016x}");
        let files = stream_files(&self.url, &self.watch, &key, 's');
        let stream =
            create_segment(&files, 0).and_then(|f| start(&self.url, &self.watch, &key, 's', f));
        match stream {
            Ok(mut s) => {
                let place = Arc::new(());
                let heard = Arc::new(AtomicBool::new(false));
                s.on_first_bytes(heard.clone());
                self.pending.push_back(Started {
                    id,
                    seq,
                    place: Arc::downgrade(&place),
                    ended: false,
                    heard,
                });
                s.admission = Admission {
                    slot,
                    pending: Some(Pending { _place: place }),
                };
                match self.tx.blocking_send(s) {
                    Ok(()) => Decided::Done,
                    Err(_) => Decided::Stop,
                }
            }
            // Another server took it first.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Decided::Done,
            Err(e) => {
                tracing::warn!("{e}");
                Decided::Done
            }
        }
    }

    /// Makes a place among the handshakes for a carrier that appeared at
    /// `seq`: if all [`MAX_PENDING`] are taken, ends the earliest whose
    /// client has written nothing yet, else the earliest, if that appeared
    /// before `seq` (its reader finds its first file gone). False if there
    /// is no place for it.
    fn make_room(&mut self, seq: u64) -> bool {
        self.pending.retain(|p| p.place.strong_count() > 0);
        if self.pending.len() >= 2 * MAX_PENDING {
            return false;
        }
        let live = self.pending.iter().filter(|p| !p.ended).count();
        if live < MAX_PENDING {
            return true;
        }
        // The earliest that has sent nothing yet (a client writes its
        // first message as soon as its file exists: one that has not is
        // most likely forged), else the earliest of all. (At most
        // 2 × MAX_PENDING lengths looked at, only when the places are full.)
        // Heard: its reader has read from it, or its first file holds
        // something (written, not yet read).
        let dir = &self.url.dir;
        let silent = |p: &Started| {
            !p.heard.load(Ordering::Relaxed)
                && std::fs::symlink_metadata(segment_path(dir, &format!("{:016x}.c", p.id), 0))
                    .is_ok_and(|m| m.len() == 0)
        };
        let victim = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.ended && p.seq < seq && silent(p))
            .min_by_key(|(_, p)| p.seq)
            .or_else(|| {
                self.pending
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| !p.ended)
                    .min_by_key(|(_, p)| p.seq)
            })
            .map(|(i, _)| i);
        let Some(first) = victim.and_then(|i| self.pending.get_mut(i)) else {
            return true;
        };
        if first.seq >= seq {
            return false;
        }
        first.ended = true;
        let path = segment_path(&self.url.dir, &format!("{:016x}.c", first.id), 0);
        let _ = std::fs::remove_file(path);
        let why = format!("{MAX_PENDING} carriers were in their handshake: ended the earliest");
        self.refused.note(&self.url.dir, &why);
        true
    }

    /// Answers with an END and removes the client's first file: no thread,
    /// nothing held (the answer goes after [`REFUSAL_GRACE`]).
    fn refuse(&mut self, id: u64, why: &str) {
        self.refused.note(&self.url.dir, why);
        self.remember(id);
        let key = format!("{id:016x}");
        let files = stream_files(&self.url, &self.watch, &key, 's');
        if let Ok(f) = create_segment(&files, 0) {
            let _ = crate::sys::write_all_at(&f, &record::encode(Kind::End, 0, &[]), 0);
            if self.answers.len() >= KNOWN_IDS {
                if let Some((_, p)) = self.answers.pop_front() {
                    let _ = std::fs::remove_file(p);
                }
            }
            self.answers.push_back((Instant::now(), self.path(id, 's')));
        }
        let _ = std::fs::remove_file(self.path(id, 'c'));
    }

    fn forget_answers(&mut self) {
        while let Some((t, p)) = self.answers.front() {
            if t.elapsed() < REFUSAL_GRACE {
                break;
            }
            let _ = std::fs::remove_file(p);
            self.answers.pop_front();
        }
    }

    fn take_token(&mut self) -> bool {
        let now = Instant::now();
        let add = now.duration_since(self.refill).as_secs_f64() * DECISIONS_PER_SEC as f64;
        self.tokens = (self.tokens + add).min(DECISIONS_BURST as f64);
        self.refill = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
