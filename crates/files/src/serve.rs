//! The server's side: one thread per stream, plain blocking I/O on the
//! service end of an in-process pipe whose other end the session relays.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use longhaul_session::logs::{escaped, shown, Refusals, Throttle};

/// Lines about transfers that went well, for the whole process: a client
/// asking for many empty files cannot fill the disk with them.
static TRANSFERS: Throttle = Throttle::new();
/// Failed requests logged (a line each), across the process.
static FAILURES: Throttle = Throttle::new();
use longhaul_session::{LocalStream, ServicePipe};

use blake3::Hasher;

use crate::part::Part;
use crate::root::{Refusal, RelPath, Root};
use crate::sys::{self, FileKind};
use crate::transfer::{self, receive_file, send_file, TransferError, Version};
use crate::wire::{self, Kind, Request};
use crate::Access;

/// File streams served at once (each a thread, with its pipe's 2 ×
/// [`longhaul_session::PIPE_QUEUE`] and a block being read); more are
/// refused.
pub const MAX_FILE_STREAMS: usize = 64;
/// How often stale partial uploads are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// A peer that neither sends nor reads for this long loses its stream.
pub const IDLE_LIMIT: Duration = Duration::from_secs(120);

/// Serves one folder to the sessions that may use it.
#[derive(Debug)]
pub struct FileServer {
    root: Root,
    busy: AtomicUsize,
    /// Uploads in progress, by path: a newer upload of the same file ends
    /// the older one, whose client is most likely gone (its session kept
    /// for a resume that will not come) — so that running the same command
    /// again after Ctrl-C or a lost network resumes at once.
    writers: Mutex<HashMap<String, (u64, ServicePipe)>>,
    next_writer: AtomicU64,
}

impl FileServer {
    pub fn open(dir: &Path) -> std::io::Result<Arc<FileServer>> {
        Ok(Arc::new(FileServer {
            root: Root::open(dir)?,
            busy: AtomicUsize::new(0),
            writers: Mutex::default(),
            next_writer: AtomicU64::new(0),
        }))
    }

    /// Removes partial uploads untouched for `max_age` now and every hour,
    /// on a thread that ends with the server.
    pub fn sweep_partial_every_hour(self: &Arc<Self>, max_age: Duration) {
        let me = Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("files-sweep".into())
            .spawn(move || loop {
                let Some(server) = me.upgrade() else { return };
                let n = server.root.sweep_parts(max_age);
                if n > 0 {
                    tracing::info!(
                        "removed {n} partial upload(s) untouched for {}s under {}",
                        max_age.as_secs(),
                        server.root.path.display()
                    );
                }
                drop(server);
                std::thread::sleep(SWEEP_EVERY);
            });
    }

    pub fn path(&self) -> &Path {
        &self.root.path
    }

    /// Starts serving a stream with `access` for the peer of `log` (its
    /// session's refusals, throttled); returns the end the session relays.
    pub fn accept(
        self: &Arc<Self>,
        access: Access,
        log: Arc<Refusals>,
    ) -> Result<LocalStream, String> {
        if self.busy.fetch_add(1, Ordering::AcqRel) >= MAX_FILE_STREAMS {
            self.busy.fetch_sub(1, Ordering::AcqRel);
            return Err(format!("file service busy ({MAX_FILE_STREAMS} streams)"));
        }
        let (ours, theirs) = LocalStream::service(IDLE_LIMIT);
        let me = self.clone();
        let started = std::thread::Builder::new()
            .name("files".into())
            .spawn(move || {
                me.serve(theirs, access, &log);
                me.busy.fetch_sub(1, Ordering::AcqRel);
            })
            .map(|_| ours)
            .map_err(|e| e.to_string());
        if started.is_err() {
            self.busy.fetch_sub(1, Ordering::AcqRel);
        }
        started
    }

    fn serve(&self, sock: ServicePipe, access: Access, log: &Refusals) {
        let peer = log.peer();
        let mut conn = Conn {
            out: sock.clone(),
            input: sock,
        };
        loop {
            let req = match Request::read(&mut conn.input) {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(%peer, "file stream ended: {e}");
                    return;
                }
            };
            // The peer's bytes, escaped; requests that fail are logged at
            // most a few a second (the session's throttle).
            let path = shown(&String::from_utf8_lossy(req.path())).to_string();
            match self.handle(&mut conn, req, access, peer) {
                Ok(()) => {}
                Err(Failure::Refused(r)) => {
                    let why = escaped(&r);
                    if log.admit() {
                        if r.is_hostile() {
                            tracing::warn!(%peer, %path, "file request refused: {why}");
                        } else {
                            tracing::info!(%peer, %path, "file request failed: {why}");
                        }
                    }
                    if wire::write_err(&mut conn.out, &r.to_string()).is_err() {
                        return;
                    }
                }
                Err(Failure::Ended(why)) => {
                    if log.admit() {
                        let why = shown(&why);
                        tracing::info!(%peer, %path, "file transfer ended: {why}");
                    }
                    return;
                }
                Err(Failure::Abandon(why)) => {
                    if log.admit() {
                        let why = shown(&why);
                        tracing::warn!(%peer, %path, "file not received: {why}");
                    }
                    // The answer, then the end of our half; what the client
                    // still sends is read and dropped until it stops (a
                    // reset could overtake the answer).
                    let _ = wire::write_err(&mut conn.out, &why);
                    conn.out.shutdown(false);
                    let _ = std::io::copy(&mut conn.input, &mut std::io::sink());
                    return;
                }
            }
        }
    }

    fn handle(
        &self,
        c: &mut Conn,
        req: Request,
        access: Access,
        peer: &str,
    ) -> Result<(), Failure> {
        let rel = RelPath::parse(req.path())?;
        match req {
            Request::Stat { .. } => {
                let (kind, size) = self.root.stat(&rel)?;
                let mut b = vec![0, kind.to_byte()];
                b.extend_from_slice(&size.to_be_bytes());
                c.send(&b)
            }
            Request::List { .. } => {
                let base = self
                    .root
                    .dir_at(&rel)
                    .map_err(|e| Refusal::io("open folder", e))?;
                crate::list::stream(base, &mut c.out).map_err(|e| Failure::Ended(e.to_string()))
            }
            Request::ListCounted { .. } => Err(Refusal::Other(
                "this server sends listings as a stream: use a longhaul cp of the same version"
                    .into(),
            )
            .into()),
            Request::Mkdir { .. } => {
                access.check_write()?;
                self.root.open_dir(&rel, true)?;
                c.send(&[0])
            }
            Request::Get {
                have, have_hash, ..
            } => self.get(c, &rel, have, have_hash, peer),
            Request::Put {
                size, mode, into, ..
            } => {
                access.check_write()?;
                let rel = match into.is_empty() || self.root.stat(&rel)?.0 != Kind::Dir {
                    true => rel,
                    false => rel.join(&into)?,
                };
                self.put(c, &rel, size, mode, peer)
            }
        }
    }

    fn get(
        &self,
        c: &mut Conn,
        rel: &RelPath,
        have: u64,
        have_hash: wire::Hash,
        peer: &str,
    ) -> Result<(), Failure> {
        let file = self.root.open_file(rel)?;
        let version = Version::of(&file).map_err(other)?;
        let none = AtomicU64::new(0);
        let (start, hasher) = match have {
            0 => (0, Hasher::new()),
            n if n <= version.size => {
                match transfer::hash_prefix(&file, n, &none).map_err(other)? {
                    Some(h) if transfer::digest(&h) == have_hash => (n, h),
                    _ => (0, Hasher::new()),
                }
            }
            _ => (0, Hasher::new()),
        };
        let mut b = vec![0];
        b.extend_from_slice(&version.size.to_be_bytes());
        b.extend_from_slice(&start.to_be_bytes());
        b.extend_from_slice(&mode_of(&file).to_be_bytes());
        c.send(&b)?;
        match send_file(&mut c.out, &file, start, version, hasher, &none) {
            Ok(_) => {
                if TRANSFERS.pass("completed transfers") {
                    tracing::info!(%peer, path = %shown(&show(rel)), bytes = version.size - start, from = start, "file sent");
                }
                Ok(())
            }
            // Said in the trailer; the stream goes on.
            Err(TransferError::Local(msg)) => {
                if FAILURES.pass("failed file requests") {
                    tracing::warn!(%peer, path = %shown(&show(rel)), "file not sent: {}", shown(&msg));
                }
                Ok(())
            }
            Err(e) => Err(Failure::Ended(e.to_string())),
        }
    }

    fn put(
        &self,
        c: &mut Conn,
        rel: &RelPath,
        size: u64,
        mode: u32,
        peer: &str,
    ) -> Result<(), Failure> {
        let (dir, name) = self.root.parent_of(rel, false)?;
        // A complete file of the same size already there: offered as the
        // whole "partial" copy, so an identical one is verified by hash
        // and not sent again.
        let mut there = None;
        if let Ok(st) = dir.stat_at(name) {
            if st.kind == FileKind::Dir {
                return Err(Refusal::Other("a folder of that name exists".into()).into());
            }
            if st.kind == FileKind::File && st.size == size && size > 0 {
                there = dir
                    .open_file_at(name)
                    .ok()
                    .filter(|f| f.metadata().is_ok_and(|m| m.is_file() && m.len() == size));
            }
        }
        let part = Part::open(dir, name).map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied
                && FAILURES.pass("failed file requests")
            {
                let (path, why) = (escaped(show(rel)), escaped(&e));
                tracing::warn!(%peer, %path, "partial upload refused: {why}");
            }
            other(e)
        })?;
        let path = show(rel);
        self.lock_part(&part.file, &path, peer)?;
        let _writer = self.register(&path, &c.out);
        let file = &part.file;
        let mut have = file.metadata().map_err(other)?.len();
        let none = AtomicU64::new(0);
        let mut hasher = Hasher::new();
        if have > size {
            have = 0;
        } else if have > 0 {
            match transfer::hash_prefix(file, have, &none).map_err(other)? {
                Some(h) => hasher = h,
                None => have = 0,
            }
        }
        let mut whole = false;
        if let (0, Some(f)) = (have, &there) {
            if let Some(h) = transfer::hash_prefix(f, size, &none).map_err(other)? {
                (hasher, have, whole) = (h, size, true);
            }
        }
        let mut b = vec![0];
        b.extend_from_slice(&have.to_be_bytes());
        b.extend_from_slice(&transfer::digest(&hasher));
        c.send(&b)?;
        let start = wire::read_u64(&mut c.input).map_err(|e| Failure::Ended(e.to_string()))?;
        if start != 0 && start != have {
            return Err(Failure::Ended("protocol error: bad start offset".into()));
        }
        if start == 0 {
            hasher = Hasher::new();
            whole = false;
        }
        if !whole {
            file.set_len(start).map_err(other)?;
        }
        match receive_file(&mut c.input, file, start, size, hasher, &none) {
            // The file there is the one sent (the hashes matched): kept
            // as it is, the empty partial copy goes.
            Ok(_) if whole => {
                part.remove();
                if TRANSFERS.pass("completed transfers") {
                    tracing::info!(%peer, path = %shown(&show(rel)), bytes = 0, "file already there, verified");
                }
                c.send(&[0])
            }
            Ok(_) => {
                part.finish(mode).map_err(other)?;
                if TRANSFERS.pass("completed transfers") {
                    tracing::info!(%peer, path = %shown(&show(rel)), bytes = size - start, from = start, "file received");
                }
                c.send(&[0])
            }
            // The connection went: keep the verified part for a resume.
            Err(TransferError::Stream(e)) => Err(Failure::Ended(e.to_string())),
            // Disk full or failing, half-way: say so while the client is
            // still sending, and nothing of it stays.
            Err(TransferError::Write(msg)) => {
                part.remove();
                Err(Failure::Abandon(msg))
            }
            Err(e) => {
                // Disk full, mismatch, or the sender's file changed: nothing
                // of it stays.
                part.remove();
                Err(Refusal::Other(e.to_string()).into())
            }
        }
    }
}

impl FileServer {
    /// Locks an upload's partial file, ending an earlier upload of it.
    fn lock_part(&self, fd: &File, path: &str, peer: &str) -> Result<(), Refusal> {
        let try_lock = || sys::try_lock(fd);
        if try_lock() {
            return Ok(());
        }
        if let Some((_, old)) = self.writers().get(path) {
            if TRANSFERS.pass("completed transfers") {
                tracing::info!(%peer, path = %shown(path), "a new upload of this file ends the earlier one");
            }
            old.shutdown(true);
        }
        let deadline = std::time::Instant::now() + TAKEOVER_WAIT;
        while std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            if try_lock() {
                return Ok(());
            }
        }
        Err(Refusal::Other(
            "another copy to this file is in progress".into(),
        ))
    }

    fn writers(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, ServicePipe)>> {
        self.writers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn register(&self, path: &str, sock: &ServicePipe) -> Registered<'_> {
        let id = self.next_writer.fetch_add(1, Ordering::Relaxed);
        self.writers().insert(path.to_string(), (id, sock.clone()));
        Registered {
            server: self,
            path: path.to_string(),
            id,
        }
    }
}

/// Takes an upload out of the table when it ends.
struct Registered<'a> {
    server: &'a FileServer,
    path: String,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut w = self.server.writers();
        if w.get(&self.path).is_some_and(|(id, _)| *id == self.id) {
            w.remove(&self.path);
        }
    }
}

/// How long a new upload waits for an earlier one of the same file to end.
const TAKEOVER_WAIT: Duration = Duration::from_secs(5);

fn mode_of(f: &File) -> u32 {
    sys::file_stat(f).map(|st| st.mode).unwrap_or(0o644)
}

fn show(rel: &RelPath) -> String {
    let parts: Vec<String> = rel
        .components()
        .iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    parts.join("/")
}

struct Conn {
    input: ServicePipe,
    out: ServicePipe,
}

impl Conn {
    fn send(&mut self, b: &[u8]) -> Result<(), Failure> {
        self.out
            .write_all(b)
            .map_err(|e| Failure::Ended(e.to_string()))
    }
}

enum Failure {
    /// Answered with an error; the stream goes on.
    Refused(Refusal),
    /// The stream cannot go on.
    Ended(String),
    /// The stream cannot go on, and the peer is told why.
    Abandon(String),
}

impl From<Refusal> for Failure {
    fn from(r: Refusal) -> Failure {
        Failure::Refused(r)
    }
}

fn other(e: std::io::Error) -> Failure {
    Failure::Refused(Refusal::Other(e.to_string()))
}

impl Access {
    fn check_write(self) -> Result<(), Refusal> {
        match self {
            Access::ReadWrite => Ok(()),
            Access::ReadOnly => Err(Refusal::ReadOnly),
        }
    }
}
