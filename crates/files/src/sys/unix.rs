//! Linux: a folder is a descriptor; a path beneath the served root is
//! resolved by the kernel (`openat2` with `RESOLVE_BENEATH`, Linux 5.6 or
//! later), a name in a folder with the `*at` calls and `O_NOFOLLOW`.
//! Anything but a folder or a regular file is looked at through `O_PATH`
//! or opened `O_NONBLOCK`, never waited on.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::OnceLock;

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::{FileKind, Stat, Why};

/// A folder held open.
#[derive(Debug)]
pub struct Dir(OwnedFd);

fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

const DIR: OFlags = OFlags::DIRECTORY
    .union(OFlags::RDONLY)
    .union(OFlags::CLOEXEC);
const DIR_NOFOLLOW: OFlags = DIR.union(OFlags::NOFOLLOW).union(OFlags::NONBLOCK);

fn stat_of(st: &rustix::fs::Stat) -> Stat {
    let uid = st.st_uid;
    Stat {
        kind: match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => FileKind::File,
            FileType::Directory => FileKind::Dir,
            FileType::Symlink => FileKind::Link,
            _ => FileKind::Other,
        },
        size: st.st_size as u64,
        mtime: st.st_mtime,
        mine: uid == rustix::process::geteuid().as_raw(),
        system: uid == 0,
        owner: uid,
        mode: st.st_mode & 0o7777,
        links: st.st_nlink,
        id: (st.st_dev, st.st_ino),
    }
}

impl Dir {
    /// A folder the user named, following links as the shell would.
    pub fn open(path: &Path) -> io::Result<Dir> {
        Ok(Dir(rustix::fs::open(path, DIR, Mode::empty())?))
    }

    /// Checks once that the kernel resolves beneath (Linux ≥ 5.6).
    pub fn require_beneath(&self) -> io::Result<()> {
        rustix::fs::openat2(
            &self.0,
            ".",
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            beneath(),
        )
        .map(drop)
        .map_err(|e| {
            io::Error::other(format!(
                "openat2 is needed to serve files safely (Linux 5.6 or later): {e}"
            ))
        })
    }

    /// This folder again, with a descriptor of its own.
    pub fn reopen(&self) -> io::Result<Dir> {
        Ok(Dir(rustix::fs::openat(&self.0, ".", DIR, Mode::empty())?))
    }

    fn beneath(&self, rel: &Path, flags: OFlags, how: ResolveFlags) -> io::Result<OwnedFd> {
        Ok(rustix::fs::openat2(
            &self.0,
            rel,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            how,
        )?)
    }

    /// The folder `rel` beneath this one (links followed while they stay
    /// beneath).
    pub fn dir_beneath(&self, rel: &Path) -> io::Result<Dir> {
        self.beneath(rel, DIR, beneath()).map(Dir)
    }

    /// The folder `rel` beneath this one, through no link at all.
    pub fn dir_beneath_nofollow(&self, rel: &Path) -> io::Result<Dir> {
        self.beneath(rel, DIR_NOFOLLOW, beneath() | ResolveFlags::NO_SYMLINKS)
            .map(Dir)
    }

    /// What is at `rel` beneath this folder, without opening it.
    pub fn stat_beneath(&self, rel: &Path) -> io::Result<Stat> {
        let fd = self.beneath(rel, OFlags::PATH, beneath())?;
        Ok(stat_of(&rustix::fs::fstat(&fd)?))
    }

    /// Opens `rel` beneath this folder for reading, `O_NONBLOCK` (a FIFO
    /// swapped in cannot block): the caller checks it is a regular file.
    pub fn file_beneath(&self, rel: &Path) -> io::Result<File> {
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
        self.beneath(rel, flags, beneath()).map(File::from)
    }

    /// Makes folder `name` here, mode 0700 (a folder's mode is not carried
    /// by a copy, and a new one must never be wider than its source was);
    /// one already there is fine.
    pub fn make_dir(&self, name: &[u8]) -> io::Result<()> {
        match rustix::fs::mkdirat(&self.0, os(name), Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The folder `name` here, never through a link.
    pub fn subdir(&self, name: &[u8]) -> io::Result<Dir> {
        Ok(Dir(rustix::fs::openat(
            &self.0,
            os(name),
            DIR_NOFOLLOW,
            Mode::empty(),
        )?))
    }

    /// The folder `name` here, through a link if it is one.
    pub fn subdir_following(&self, name: &[u8]) -> io::Result<Dir> {
        Ok(Dir(rustix::fs::openat(
            &self.0,
            os(name),
            DIR,
            Mode::empty(),
        )?))
    }

    /// What `name` here is (a link as a link).
    pub fn stat_at(&self, name: &[u8]) -> io::Result<Stat> {
        let st = rustix::fs::statat(&self.0, os(name), AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(stat_of(&st))
    }

    /// What this folder is.
    pub fn stat(&self) -> io::Result<Stat> {
        Ok(stat_of(&rustix::fs::fstat(&self.0)?))
    }

    /// The names in this folder (not `.` and `..`), read as they are
    /// asked for.
    pub fn entries(&self) -> io::Result<Entries> {
        Ok(Entries(rustix::fs::Dir::read_from(&self.0)?))
    }

    pub fn remove_file(&self, name: &[u8]) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&self.0, os(name), AtFlags::empty())?)
    }

    /// Removes folder `name` if it is empty.
    pub fn remove_dir(&self, name: &[u8]) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&self.0, os(name), AtFlags::REMOVEDIR)?)
    }

    /// Renames `name` here to `to_name` in `to`, replacing what is there.
    pub fn rename(&self, name: &[u8], to: &Dir, to_name: &[u8]) -> io::Result<()> {
        Ok(rustix::fs::renameat(&self.0, os(name), &to.0, os(to_name))?)
    }

    /// Only this user may list or place files here (0700).
    pub fn make_private(&self) -> io::Result<()> {
        Ok(rustix::fs::fchmod(&self.0, Mode::from_raw_mode(0o700))?)
    }

    /// Opens file `name` here for reading, never through a link and
    /// `O_NONBLOCK` (the caller checks it is a regular file).
    pub fn open_file_at(&self, name: &[u8]) -> io::Result<File> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
        let fd = rustix::fs::openat(&self.0, os(name), flags | OFlags::CLOEXEC, Mode::empty())?;
        Ok(File::from(fd))
    }

    /// Opens file `name` here to read and write, making it (0600) if it is
    /// missing; never through a link. Opened `O_NONBLOCK` (a FIFO put there
    /// answers at once), then blocking: the caller checks what it is
    /// before any I/O.
    pub fn open_part(&self, name: &[u8]) -> io::Result<File> {
        let flags = OFlags::RDWR
            | OFlags::CREATE
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::NOCTTY
            | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.0, os(name), flags, Mode::from_raw_mode(0o600))?;
        let now = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, now.difference(OFlags::NONBLOCK))?;
        Ok(File::from(fd))
    }
}

/// A folder's names, read as they are asked for.
pub struct Entries(rustix::fs::Dir);

impl Iterator for Entries {
    type Item = io::Result<Vec<u8>>;

    fn next(&mut self) -> Option<io::Result<Vec<u8>>> {
        loop {
            return match self.0.read()? {
                Ok(e) => match e.file_name().to_bytes() {
                    b"." | b".." => continue,
                    name => Some(Ok(name.to_vec())),
                },
                Err(e) => Some(Err(e.into())),
            };
        }
    }
}

fn os(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}

/// A name as bytes (Unix names are bytes).
pub fn name_bytes(name: &OsStr) -> Option<&[u8]> {
    Some(name.as_bytes())
}

/// Bytes as a name (to join to a path for messages or opening).
pub fn name_os(name: &[u8]) -> std::borrow::Cow<'_, OsStr> {
    std::borrow::Cow::Borrowed(os(name))
}

/// Only `/` and `.` start what is surely a local path.
pub fn is_local_spelling(_: &str) -> bool {
    false
}

/// Every name the kernel takes is a name here.
pub fn name_refusal(_: &[u8]) -> Option<&'static str> {
    None
}

/// Why an open or a make failed, as far as callers act on it.
pub fn why(e: &io::Error) -> Why {
    match e.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::NOENT) => Why::NotFound,
        Some(Errno::EXIST) => Why::Exists,
        Some(Errno::XDEV) => Why::Escapes,
        Some(Errno::LOOP | Errno::NOTDIR) => Why::LinkOrNotDir,
        _ => Why::Other,
    }
}

/// What an open file is.
pub fn file_stat(f: &File) -> io::Result<Stat> {
    Ok(stat_of(&rustix::fs::fstat(f)?))
}

/// Takes the file's exclusive lock if no one holds it (`flock`: held until
/// every descriptor of this open file is closed).
pub fn try_lock(f: &File) -> bool {
    rustix::fs::flock(f, FlockOperation::NonBlockingLockExclusive).is_ok()
}

/// Gives an open file permission bits.
pub fn set_mode(f: &File, mode: u32) -> io::Result<()> {
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// Reads at `at` into `buf`'s spare capacity (no pass to zero it first).
pub fn read_spare(f: &File, buf: &mut Vec<u8>, at: u64) -> io::Result<usize> {
    Ok(rustix::io::pread(
        f,
        rustix::buffer::spare_capacity(buf),
        at,
    )?)
}

/// Writes all of `buf` at `at`.
pub fn write_all_at(f: &File, buf: &[u8], at: u64) -> io::Result<()> {
    f.write_all_at(buf, at)
}

/// Reads at `at`.
pub fn read_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    f.read_at(buf, at)
}

/// What changes when a file's contents do: the file's number, its
/// modification and status-change times.
pub fn change_marks(m: &std::fs::Metadata) -> (u64, (i64, i64), (i64, i64)) {
    (
        m.ino(),
        (m.mtime(), m.mtime_nsec()),
        (m.ctime(), m.ctime_nsec()),
    )
}

/// Opens a file the user named for reading, `O_NONBLOCK` (a FIFO swapped
/// in cannot block); `nofollow`: not through a link.
pub fn open_source(path: &Path, nofollow: bool) -> io::Result<File> {
    let mut flags = OFlags::NONBLOCK | OFlags::NOCTTY;
    if nofollow {
        flags |= OFlags::NOFOLLOW;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
}

/// This process's umask, read once (from `/proc/self/status`: setting it to
/// read it back would race with other threads creating files). If it
/// cannot be read, 077: permissions are never widened by a guess.
pub fn umask() -> u32 {
    static UMASK: OnceLock<u32> = OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let l = s.lines().find(|l| l.starts_with("Umask:"))?;
                u32::from_str_radix(l.split_whitespace().nth(1)?, 8).ok()
            })
            .unwrap_or(0o077)
    })
}

/// The soft limit on open files now (None: unlimited).
pub fn open_files_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Raises this process's soft limit on open files to its hard limit, once
/// at start: each session, stream, file being copied and folder being
/// listed holds a descriptor, and the soft limit (often 1 024) is reached
/// long before memory or the other bounds. Returns the soft limit before
/// and after. A hard limit of "unlimited" is taken as `fs.nr_open` (above
/// which the kernel refuses; 2²⁰, its default, if it cannot be read).
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    let before = now.current.unwrap_or(u64::MAX);
    let want = now.maximum.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20)
    });
    if before >= want {
        return Ok((before, before));
    }
    let new = Rlimit {
        current: Some(want),
        maximum: now.maximum,
    };
    setrlimit(Resource::Nofile, new)?;
    Ok((before, want))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_one() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let hard = getrlimit(Resource::Nofile).maximum;
        let low = hard.unwrap_or(4096).min(256);
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(low),
                maximum: hard,
            },
        )
        .unwrap();
        let (before, after) = super::raise_nofile_limit().unwrap();
        assert_eq!(before, low);
        assert_eq!(Some(after), getrlimit(Resource::Nofile).current);
        assert!(hard.is_none() || Some(after) == hard);
    }
}
