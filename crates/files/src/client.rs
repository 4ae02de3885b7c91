//! The client's side of one stream: requests, and the copies themselves.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use longhaul_session::{LocalStream, ServicePipe, SessionHandle};

use blake3::Hasher;

use crate::local::LocalDest;
use crate::part::Part;
use crate::root::{RelPath, MAX_DEPTH};
use crate::sys::{self, FileKind};
use crate::transfer::{self, receive_file, send_file, TransferError, Version};
use crate::wire::{self, Entry, Kind, ListItem, Request, MAX_LIST_BYTES, MAX_LIST_ENTRIES};
use crate::SERVICE;

/// How a worker thread reaches the server: the session in use now.
#[derive(Clone)]
pub struct Remote {
    pub runtime: tokio::runtime::Handle,
    pub session: Arc<dyn Fn() -> SessionHandle + Send + Sync>,
}

impl Remote {
    /// Opens a stream to the file service (blocking).
    pub fn connect(&self) -> anyhow::Result<Conn> {
        let sock = self.connect_raw()?;
        Ok(Conn {
            out: sock.clone(),
            input: sock,
        })
    }

    /// A stream to the file service, to speak its wire format directly
    /// (tests, tools).
    pub fn connect_raw(&self) -> anyhow::Result<ServicePipe> {
        let session = (self.session)();
        self.runtime.block_on(async move {
            let opened = session
                .open(SERVICE)
                .await
                .map_err(|e| anyhow!("the server refused the file service: {e}"))?;
            let (ours, theirs) = LocalStream::service(crate::serve::IDLE_LIMIT);
            opened.attach(ours);
            anyhow::Ok(theirs)
        })
    }
}

/// Counters the progress display reads.
#[derive(Debug, Default)]
pub struct Counters {
    /// File bytes carried this time.
    pub moved: AtomicU64,
    /// File bytes found already copied (verified) and skipped.
    pub resumed: AtomicU64,
}

/// One file copied.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Copied {
    pub path: String,
    pub size: u64,
    /// Where this run started (bytes already there and verified).
    pub from: u64,
    pub blake3: String,
}

/// One stream to the file service.
pub struct Conn {
    input: ServicePipe,
    out: ServicePipe,
}

fn lost(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("connection to the file service lost ({e}); run the same command again to resume")
}

impl Conn {
    fn request(&mut self, r: &Request) -> anyhow::Result<()> {
        self.out.write_all(&r.encode()).map_err(lost)?;
        match wire::read_status(&mut self.input).map_err(lost)? {
            Ok(()) => Ok(()),
            Err(msg) => bail!("{msg}"),
        }
    }

    pub fn stat(&mut self, path: &[u8]) -> anyhow::Result<(Kind, u64)> {
        self.request(&Request::Stat {
            path: path.to_vec(),
        })?;
        let kind = Kind::from_byte(wire::read_u8(&mut self.input).map_err(lost)?)?;
        Ok((kind, wire::read_u64(&mut self.input).map_err(lost)?))
    }

    pub fn mkdir(&mut self, path: &[u8]) -> anyhow::Result<()> {
        self.request(&Request::Mkdir {
            path: path.to_vec(),
        })
    }

    /// Every entry under a remote folder, given to `each` as it arrives;
    /// each path checked, since the server's answers become local paths,
    /// and the listing bounded ([`MAX_LIST_ENTRIES`], [`MAX_LIST_BYTES`],
    /// [`MAX_DEPTH`] folders). If `each` fails, the stream is out of step:
    /// drop it.
    pub fn list_each(
        &mut self,
        path: &[u8],
        mut each: impl FnMut(Entry, RelPath) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.out
            .write_all(
                &Request::List {
                    path: path.to_vec(),
                }
                .encode(),
            )
            .map_err(lost)?;
        match wire::read_status(&mut self.input) {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => bail!("{msg}"),
            // An older server ends a stream that asks what it does not know.
            Err(wire::WireError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => bail!(
                "the server ended the stream when asked for a listing: an older longhaul? \
                 (copying folders needs the same version on both sides)"
            ),
            Err(e) => return Err(lost(e)),
        }
        let (mut entries, mut bytes) = (0u32, 0u64);
        loop {
            let e = match wire::read_item(&mut self.input).map_err(lost)? {
                ListItem::Entry(e) => e,
                ListItem::End => return Ok(()),
                ListItem::Failed(msg) => bail!("{msg}"),
            };
            entries += 1;
            bytes += e.path.len() as u64;
            if entries > MAX_LIST_ENTRIES || bytes > MAX_LIST_BYTES {
                bail!(
                    "the server listed more than {MAX_LIST_ENTRIES} entries or {} MiB of paths",
                    MAX_LIST_BYTES >> 20
                );
            }
            let rel = RelPath::parse(&e.path)
                .map_err(|r| anyhow!("the server listed a bad path: {r}"))?;
            if rel.components().is_empty() || e.kind == Kind::Missing {
                bail!("the server listed a bad entry");
            }
            if rel.components().len() > MAX_DEPTH + 1 {
                bail!("the server listed a path deeper than {MAX_DEPTH} folders");
            }
            each(e, rel)?;
        }
    }

    /// Every entry under a remote folder (see [`Conn::list_each`]).
    pub fn list(&mut self, path: &[u8]) -> anyhow::Result<Vec<Entry>> {
        let mut out = vec![];
        self.list_each(path, |e, _| {
            out.push(e);
            Ok(())
        })?;
        Ok(out)
    }

    /// Downloads `src` to `dest`, through a partial copy beside it
    /// (`.longhaul-partial/NAME`) renamed only once the hashes agree.
    pub fn get(&mut self, src: &[u8], dest: &LocalDest, c: &Counters) -> anyhow::Result<Copied> {
        let shown = dest.shown.display();
        let (dir, name) = dest.open_parent()?;
        let part = Part::open(dir, name).with_context(|| format!("cannot write {shown}"))?;
        if !sys::try_lock(&part.file) {
            bail!("{shown}: another copy to this file is in progress");
        }
        let file = &part.file;
        let have = file.metadata()?.len();
        let mut hasher = Hasher::new();
        let mut have_hash = transfer::digest(&hasher);
        if have > 0 {
            let scratch = AtomicU64::new(0);
            match transfer::hash_prefix(file, have, &scratch)? {
                Some(h) => {
                    have_hash = transfer::digest(&h);
                    hasher = h;
                }
                None => hasher = Hasher::new(),
            }
        }
        self.request(&Request::Get {
            path: src.to_vec(),
            have,
            have_hash,
        })?;
        let size = wire::read_u64(&mut self.input).map_err(lost)?;
        let start = wire::read_u64(&mut self.input).map_err(lost)?;
        let mode = wire::read_u32(&mut self.input).map_err(lost)?;
        if start != 0 && start != have {
            bail!("the server answered a bad start offset");
        }
        if start == 0 {
            hasher = Hasher::new();
        }
        file.set_len(start)?;
        c.resumed.fetch_add(start, Ordering::Relaxed);
        match receive_file(&mut self.input, file, start, size, hasher, &c.moved) {
            Ok(hash) => {
                part.finish(mode)
                    .with_context(|| format!("cannot put the copy at {shown}"))?;
                Ok(Copied {
                    path: shown.to_string(),
                    size,
                    from: start,
                    blake3: transfer::hex(&hash),
                })
            }
            Err(TransferError::Stream(e)) => Err(lost(e)),
            Err(e) => {
                // Nothing unverified stays, under any name.
                part.remove();
                Err(anyhow!("{e}"))
            }
        }
    }

    /// Uploads `src` to the remote `dest` (into it under the name `into`
    /// if it is a folder and `into` is not empty).
    pub fn put(
        &mut self,
        src: &Path,
        dest: &[u8],
        into: &[u8],
        found: Option<(u64, u64)>,
        c: &Counters,
    ) -> anyhow::Result<Copied> {
        // Non-blocking: a FIFO swapped in since the plan cannot block us.
        // A file found inside a folder: no link followed, and still the
        // file that was found there.
        let file = sys::open_source(src, found.is_some())
            .with_context(|| format!("cannot open {}", src.display()))?;
        let meta = sys::file_stat(&file)?;
        if meta.kind != FileKind::File {
            bail!("{}: not a regular file", src.display());
        }
        if found.is_some_and(|f| f != meta.id) {
            bail!(
                "{} changed since the folder was read: not sent",
                src.display()
            );
        }
        let version = Version::of(&file)?;
        let mode = meta.mode;
        self.request(&Request::Put {
            path: dest.to_vec(),
            size: version.size,
            mode,
            into: into.to_vec(),
        })?;
        let have = wire::read_u64(&mut self.input).map_err(lost)?;
        let have_hash = wire::read_hash(&mut self.input).map_err(lost)?;
        let scratch = AtomicU64::new(0);
        let (start, hasher) = match have {
            0 => (0, Hasher::new()),
            n if n <= version.size => match transfer::hash_prefix(&file, n, &scratch)? {
                Some(h) if transfer::digest(&h) == have_hash => (n, h),
                _ => (0, Hasher::new()),
            },
            _ => (0, Hasher::new()),
        };
        c.resumed.fetch_add(start, Ordering::Relaxed);
        // Sends on a thread of its own while this one waits for the answer:
        // a server that fails half-way (disk full) says so at once.
        let mut out = self.out.clone();
        let sent = std::thread::scope(|s| {
            let sender = s.spawn(|| -> Result<wire::Hash, TransferError> {
                out.write_all(&start.to_be_bytes())
                    .map_err(TransferError::Stream)?;
                send_file(&mut out, &file, start, version, hasher, &c.moved)
            });
            // The read timeout only guards a silent server, not a long send.
            let answer = loop {
                match self.input.wait_readable() {
                    Err(e) if is_timeout(&e) && !sender.is_finished() => continue,
                    Err(e) => break Err(wire::WireError::Io(e)),
                    Ok(()) => break wire::read_status(&mut self.input),
                }
            };
            if !matches!(answer, Ok(Ok(()))) && !sender.is_finished() {
                // Answered early: stop sending.
                self.out.shutdown(true);
            }
            (sender.join(), answer)
        });
        let hash = match sent {
            (_, Ok(Err(msg))) => bail!("the server did not store it: {msg}"),
            (Ok(Err(TransferError::Local(msg))), _) => bail!("{}: {msg}", src.display()),
            (Ok(Ok(h)), Ok(Ok(()))) => h,
            (Ok(Err(e)), _) => return Err(lost(e)),
            (_, Err(e)) => return Err(lost(e)),
            (Err(_), _) => bail!("the sending thread failed"),
        };
        Ok(Copied {
            path: src.display().to_string(),
            size: version.size,
            from: start,
            blake3: transfer::hex(&hash),
        })
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}
