//! The served folder: every path a client names is resolved beneath it by
//! the kernel (`openat2` with `RESOLVE_BENEATH`), so `..`, absolute paths
//! and symbolic links that lead out are refused however they are spelled.
//! (Linux 5.6 or later.)

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::wire::{Entry, Kind, MAX_LIST_ENTRIES};

/// Suffix of the temporary file a copy is written to until it is verified
/// (`.NAME.longhaul-part`, beside the final name); kept when a copy is
/// interrupted, so that the same command resumes it.
pub const PART_SUFFIX: &str = ".longhaul-part";
/// Deepest folder nesting a listing follows.
pub const MAX_DEPTH: usize = 64;

/// Why a request was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("absolute paths are refused (paths are relative to the served folder)")]
    Absolute,
    #[error("'..' is refused in paths")]
    DotDot,
    #[error("a NUL byte is refused in paths")]
    Nul,
    #[error("the path leads out of the served folder")]
    Escapes,
    #[error("read-only access: writing is not allowed for this client")]
    ReadOnly,
    #[error("{0}")]
    Other(String),
}

impl Refusal {
    /// Refusals worth a warning in the server's log (attempts to get out,
    /// or to write without the right).
    pub fn is_hostile(&self) -> bool {
        !matches!(self, Refusal::Other(_))
    }
    fn io(what: &str, e: Errno) -> Refusal {
        match e {
            Errno::XDEV => Refusal::Escapes,
            e => Refusal::Other(format!("{what}: {}", std::io::Error::from(e))),
        }
    }
}

/// A checked relative path: its components, none empty, `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelPath(Vec<Vec<u8>>);

impl RelPath {
    pub fn parse(p: &[u8]) -> Result<RelPath, Refusal> {
        if p.first() == Some(&b'/') {
            return Err(Refusal::Absolute);
        }
        if p.contains(&0) {
            return Err(Refusal::Nul);
        }
        let mut parts = vec![];
        for c in p.split(|&b| b == b'/') {
            match c {
                b"" | b"." => {}
                b".." => return Err(Refusal::DotDot),
                c => parts.push(c.to_vec()),
            }
        }
        Ok(RelPath(parts))
    }

    /// This path with one more component, checked like the rest.
    pub fn join(&self, name: &[u8]) -> Result<RelPath, Refusal> {
        let more = RelPath::parse(name)?;
        if more.0.len() != 1 {
            return Err(Refusal::Other("a file name must be one component".into()));
        }
        Ok(RelPath([self.0.clone(), more.0].concat()))
    }

    pub fn components(&self) -> &[Vec<u8>] {
        &self.0
    }

    fn as_path(&self) -> PathBuf {
        if self.0.is_empty() {
            return PathBuf::from(".");
        }
        self.0
            .iter()
            .map(|c| OsStr::from_bytes(c))
            .collect::<PathBuf>()
    }

    fn split_last(&self) -> Option<(RelPath, &[u8])> {
        let (last, parent) = self.0.split_last()?;
        Some((RelPath(parent.to_vec()), last))
    }
}

/// The served folder.
#[derive(Debug)]
pub struct Root {
    dir: OwnedFd,
    pub path: PathBuf,
}

fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

impl Root {
    pub fn open(path: &Path) -> std::io::Result<Root> {
        let dir = rustix::fs::open(
            path,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // Checks once that the kernel resolves beneath (Linux ≥ 5.6).
        rustix::fs::openat2(
            &dir,
            ".",
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            beneath(),
        )
        .map_err(|e| {
            std::io::Error::other(format!(
                "openat2 is needed to serve files safely (Linux 5.6 or later): {e}"
            ))
        })?;
        Ok(Root {
            dir,
            path: path.to_path_buf(),
        })
    }

    fn open_at(&self, rel: &RelPath, flags: OFlags) -> Result<OwnedFd, Errno> {
        rustix::fs::openat2(
            &self.dir,
            rel.as_path(),
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            beneath(),
        )
    }

    /// What is at `rel` (a file's size with it).
    pub fn stat(&self, rel: &RelPath) -> Result<(Kind, u64), Refusal> {
        match self.open_at(rel, OFlags::PATH) {
            Ok(fd) => {
                let st = rustix::fs::fstat(&fd).map_err(|e| Refusal::io("stat", e))?;
                Ok(match FileType::from_raw_mode(st.st_mode) {
                    FileType::Directory => (Kind::Dir, 0),
                    FileType::RegularFile => (Kind::File, st.st_size as u64),
                    _ => (Kind::Missing, 0),
                })
            }
            Err(Errno::NOENT) => Ok((Kind::Missing, 0)),
            Err(e) => Err(Refusal::io("stat", e)),
        }
    }

    /// Opens a regular file for reading.
    pub fn open_file(&self, rel: &RelPath) -> Result<File, Refusal> {
        let fd = self
            .open_at(rel, OFlags::RDONLY)
            .map_err(|e| Refusal::io("open", e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| Refusal::io("stat", e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Refusal::Other("not a regular file".into()));
        }
        Ok(File::from(fd))
    }

    /// Opens the folder `rel`, creating it and its parents if `create`.
    pub fn open_dir(&self, rel: &RelPath, create: bool) -> Result<OwnedFd, Refusal> {
        match self.open_at(rel, OFlags::DIRECTORY | OFlags::RDONLY) {
            Err(Errno::NOENT) if create => {}
            r => return r.map_err(|e| Refusal::io("open folder", e)),
        }
        // Walk down, making what is missing, each step resolved beneath.
        let mut at = RelPath(vec![]);
        for c in rel.components() {
            let parent = self
                .open_at(&at, OFlags::DIRECTORY | OFlags::RDONLY)
                .map_err(|e| Refusal::io("open folder", e))?;
            match rustix::fs::mkdirat(&parent, OsStr::from_bytes(c), Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(Refusal::io("make folder", e)),
            }
            at.0.push(c.clone());
        }
        self.open_at(rel, OFlags::DIRECTORY | OFlags::RDONLY)
            .map_err(|e| Refusal::io("open folder", e))
    }

    /// The folder a file at `rel` goes in, and the file's name.
    pub fn parent_of<'a>(
        &self,
        rel: &'a RelPath,
        create: bool,
    ) -> Result<(OwnedFd, &'a [u8]), Refusal> {
        let (parent, name) = rel
            .split_last()
            .ok_or_else(|| Refusal::Other("a file name is needed".into()))?;
        Ok((self.open_dir(&parent, create)?, name))
    }

    /// Every file and folder under `rel` (folder first, then what it holds),
    /// paths relative to `rel`. Symbolic links and special files are left
    /// out, and so are partial copies.
    pub fn list(&self, rel: &RelPath) -> Result<Vec<Entry>, Refusal> {
        let dir = self
            .open_at(rel, OFlags::DIRECTORY | OFlags::RDONLY)
            .map_err(|e| Refusal::io("open folder", e))?;
        let mut out = vec![];
        list_into(dir, &mut Vec::new(), 0, &mut out)?;
        Ok(out)
    }
}

fn list_into(
    dir: OwnedFd,
    prefix: &mut Vec<u8>,
    depth: usize,
    out: &mut Vec<Entry>,
) -> Result<(), Refusal> {
    if depth > MAX_DEPTH {
        return Err(Refusal::Other(format!(
            "folders nested deeper than {MAX_DEPTH}"
        )));
    }
    let mut names = vec![];
    for e in rustix::fs::Dir::read_from(&dir).map_err(|e| Refusal::io("read folder", e))? {
        let e = e.map_err(|e| Refusal::io("read folder", e))?;
        let name = e.file_name().to_bytes();
        if name == b"." || name == b".." || is_part_name(name) {
            continue;
        }
        names.push(name.to_vec());
    }
    names.sort();
    for name in names {
        if out.len() >= MAX_LIST_ENTRIES as usize {
            return Err(Refusal::Other(format!(
                "more than {MAX_LIST_ENTRIES} entries: copy its folders one by one"
            )));
        }
        let st = match rustix::fs::statat(&dir, OsStr::from_bytes(&name), AtFlags::SYMLINK_NOFOLLOW)
        {
            Ok(st) => st,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(Refusal::io("stat", e)),
        };
        let len = prefix.len();
        if !prefix.is_empty() {
            prefix.push(b'/');
        }
        prefix.extend_from_slice(&name);
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => out.push(Entry {
                kind: Kind::File,
                size: st.st_size as u64,
                path: prefix.clone(),
            }),
            FileType::Directory => {
                out.push(Entry {
                    kind: Kind::Dir,
                    size: 0,
                    path: prefix.clone(),
                });
                let sub = rustix::fs::openat(
                    &dir,
                    OsStr::from_bytes(&name),
                    OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| Refusal::io("open folder", e))?;
                list_into(sub, prefix, depth + 1, out)?;
            }
            _ => {}
        }
        prefix.truncate(len);
    }
    Ok(())
}

/// Entries a sweep for stale partial uploads looks at, at most.
const MAX_SWEEP: usize = 1_000_000;

impl Root {
    /// Removes the partial uploads (`.NAME.longhaul-part`) under the folder
    /// that nothing has written for `max_age` and no upload holds (they
    /// are locked while one runs); returns how many. Looks at no more than
    /// [`MAX_SWEEP`] entries; never follows a symbolic link.
    pub fn sweep_parts(&self, max_age: std::time::Duration) -> usize {
        let Ok(dir) = rustix::fs::openat(
            &self.dir,
            ".",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return 0;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let oldest = now.saturating_sub(max_age).as_secs() as i64;
        let mut budget = MAX_SWEEP;
        sweep_into(dir, 0, oldest, &mut budget)
    }
}

fn sweep_into(dir: OwnedFd, depth: usize, oldest: i64, budget: &mut usize) -> usize {
    let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
        return 0;
    };
    let (mut subdirs, mut removed) = (vec![], 0);
    for e in entries {
        let Ok(e) = e else { break };
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        let name = OsStr::from_bytes(e.file_name().to_bytes()).to_owned();
        if name == "." || name == ".." {
            continue;
        }
        let Ok(st) = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory if depth < MAX_DEPTH => subdirs.push(name),
            FileType::RegularFile if is_part_name(name.as_bytes()) && st.st_mtime < oldest => {
                let Ok(f) = rustix::fs::openat(
                    &dir,
                    &name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) else {
                    continue;
                };
                // Held by an upload that is running: not stale.
                if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                    .is_ok()
                    && rustix::fs::unlinkat(&dir, &name, AtFlags::empty()).is_ok()
                {
                    removed += 1;
                }
            }
            _ => {}
        }
    }
    for name in subdirs {
        if let Ok(sub) = rustix::fs::openat(
            &dir,
            &name,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            removed += sweep_into(sub, depth + 1, oldest, budget);
        }
    }
    removed
}

/// Whether a name is a partial copy's (`.NAME.longhaul-part`).
pub fn is_part_name(name: &[u8]) -> bool {
    name.starts_with(b".") && name.ends_with(PART_SUFFIX.as_bytes())
}

/// The partial copy's name for a file name.
pub fn part_name(name: &[u8]) -> Vec<u8> {
    let mut v = b".".to_vec();
    v.extend_from_slice(name);
    v.extend_from_slice(PART_SUFFIX.as_bytes());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_checked() {
        assert!(matches!(
            RelPath::parse(b"/etc/passwd"),
            Err(Refusal::Absolute)
        ));
        assert!(matches!(RelPath::parse(b"a/../../x"), Err(Refusal::DotDot)));
        assert!(matches!(RelPath::parse(b"a\0b"), Err(Refusal::Nul)));
        assert_eq!(
            RelPath::parse(b"./a//b/").unwrap().components(),
            &[b"a".to_vec(), b"b".to_vec()]
        );
        assert!(RelPath::parse(b"").unwrap().components().is_empty());
    }

    #[test]
    fn stale_partial_uploads_are_swept_and_nothing_else() {
        use std::time::{Duration, SystemTime};
        let base = std::env::temp_dir().join(format!("lh-sweep-{}", std::process::id()));
        let (root, outside) = (base.join("root"), base.join("outside"));
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let week_ago = SystemTime::now() - Duration::from_secs(8 * 86_400);
        let make = |p: PathBuf, old: bool| {
            let f = File::create(&p).unwrap();
            if old {
                f.set_modified(week_ago).unwrap();
            }
            f
        };
        make(root.join(".a.longhaul-part"), true);
        make(root.join("sub/.b.longhaul-part"), true);
        make(root.join(".fresh.longhaul-part"), false);
        make(root.join("old-but-whole.iso"), true);
        let held = make(root.join(".held.longhaul-part"), true);
        rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
        make(outside.join(".c.longhaul-part"), true);
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();

        let r = Root::open(&root).unwrap();
        assert_eq!(r.sweep_parts(Duration::from_secs(7 * 86_400)), 2);
        assert!(!root.join(".a.longhaul-part").exists());
        assert!(!root.join("sub/.b.longhaul-part").exists());
        for kept in [
            ".fresh.longhaul-part",
            "old-but-whole.iso",
            ".held.longhaul-part",
        ] {
            assert!(root.join(kept).exists(), "{kept} removed");
        }
        assert!(outside.join(".c.longhaul-part").exists(), "followed a link");
        drop(held);
        assert_eq!(r.sweep_parts(Duration::from_secs(7 * 86_400)), 1);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn part_names() {
        assert_eq!(part_name(b"f.iso"), b".f.iso.longhaul-part");
        assert!(is_part_name(&part_name(b"x")));
        assert!(!is_part_name(b"x.longhaul-part"));
    }
}
