//! The client's side of one stream: requests, and the copies themselves.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use longhaul_session::{LocalStream, ServicePipe, SessionHandle};
use rustix::fs::FlockOperation;

use blake3::Hasher;

use crate::root::{part_name, RelPath};
use crate::transfer::{self, receive_file, send_file, TransferError, Version};
use crate::wire::{self, Entry, Kind, Request, MAX_LIST_ENTRIES};
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
        let session = (self.session)();
        let sock = self.runtime.block_on(async move {
            let opened = session
                .open(SERVICE)
                .await
                .map_err(|e| anyhow!("the server refused the file service: {e}"))?;
            let (ours, theirs) = LocalStream::service(crate::serve::IDLE_LIMIT);
            opened.attach(ours);
            anyhow::Ok(theirs)
        })?;
        Ok(Conn {
            out: sock.clone(),
            input: sock,
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

    /// Every entry under a remote folder; each path checked, since the
    /// server's answers become local paths.
    pub fn list(&mut self, path: &[u8]) -> anyhow::Result<Vec<Entry>> {
        self.request(&Request::List {
            path: path.to_vec(),
        })?;
        let n = wire::read_u32(&mut self.input).map_err(lost)?;
        if n > MAX_LIST_ENTRIES {
            bail!("the server listed {n} entries (at most {MAX_LIST_ENTRIES})");
        }
        let mut out = Vec::with_capacity(n.min(1024) as usize);
        for _ in 0..n {
            let e = wire::read_entry(&mut self.input)?;
            let rel = RelPath::parse(&e.path)
                .map_err(|r| anyhow!("the server listed a bad path: {r}"))?;
            if rel.components().is_empty() || e.kind == Kind::Missing {
                bail!("the server listed a bad entry");
            }
            out.push(e);
        }
        Ok(out)
    }

    /// Downloads `src` to `dest` through `.NAME.longhaul-part` beside it.
    pub fn get(&mut self, src: &[u8], dest: &Path, c: &Counters) -> anyhow::Result<Copied> {
        let part = part_path(dest)?;
        let file = open_part(&part)?;
        let have = file.metadata()?.len();
        let mut hasher = Hasher::new();
        let mut have_hash = transfer::digest(&hasher);
        if have > 0 {
            let scratch = AtomicU64::new(0);
            match transfer::hash_prefix(&file, have, &scratch)? {
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
        match receive_file(&mut self.input, &file, start, size, hasher, &c.moved) {
            Ok(hash) => {
                let perms = 0o644 | (mode & 0o111);
                let _ = file.set_permissions(std::fs::Permissions::from_mode(perms));
                std::fs::rename(&part, dest).with_context(|| {
                    format!("cannot rename {} to {}", part.display(), dest.display())
                })?;
                Ok(Copied {
                    path: dest.display().to_string(),
                    size,
                    from: start,
                    blake3: transfer::hex(&hash),
                })
            }
            Err(TransferError::Stream(e)) => Err(lost(e)),
            Err(e) => {
                // Nothing unverified stays, under any name.
                let _ = std::fs::remove_file(&part);
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
        c: &Counters,
    ) -> anyhow::Result<Copied> {
        let file = File::open(src).with_context(|| format!("cannot open {}", src.display()))?;
        let version = Version::of(&file)?;
        let mode = file.metadata()?.permissions().mode();
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

fn part_path(dest: &Path) -> anyhow::Result<PathBuf> {
    let name = dest
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a file name", dest.display()))?;
    let part = OsStr::from_bytes(&part_name(name.as_bytes())).to_owned();
    Ok(dest.with_file_name(part))
}

/// Opens (or makes) a partial file, locked so two copies cannot mix.
fn open_part(part: &Path) -> anyhow::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(part)
        .with_context(|| format!("cannot write {}", part.display()))?;
    rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive).map_err(|_| {
        anyhow!(
            "{}: another copy to this file is in progress",
            part.display()
        )
    })?;
    Ok(file)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}
