//! Where a download writes: beneath the destination the user named, made
//! and opened one folder at a time relative to the one above
//! (`mkdirat`/`openat` with `O_NOFOLLOW`), never through a symbolic link.
//! A link already inside the destination (`sub -> /elsewhere`), or a folder
//! swapped for one by another local user while the copy runs (in a shared
//! place such as /tmp), is refused; a folder swapped after it was opened
//! is written as the folder it was, never where the link points. The
//! destination as the user wrote it is followed: that is the user's
//! choice.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// A file to write: its path beneath a folder the user named.
#[derive(Debug, Clone)]
pub struct LocalDest {
    base: Arc<OwnedFd>,
    /// Components beneath `base` (at least one: the file's name).
    rel: Vec<Vec<u8>>,
    /// The path as the user sees it, for messages.
    pub shown: PathBuf,
}

impl LocalDest {
    /// `rel` (not empty) beneath the folder `base`, shown as `shown`.
    pub fn new(base: Arc<OwnedFd>, rel: Vec<Vec<u8>>, shown: PathBuf) -> LocalDest {
        debug_assert!(!rel.is_empty());
        LocalDest { base, rel, shown }
    }

    /// A file at a path the user named: its folder as named, its name.
    pub fn path(p: &Path) -> anyhow::Result<LocalDest> {
        let name = p
            .file_name()
            .ok_or_else(|| anyhow!("{}: not a file name", p.display()))?;
        let base = open_named(parent(p))?;
        Ok(LocalDest::new(
            Arc::new(base),
            vec![name.as_bytes().to_vec()],
            p.to_path_buf(),
        ))
    }

    /// Opens the folder the file goes in (it exists: the plan made it),
    /// and the file's name.
    pub fn open_parent(&self) -> anyhow::Result<(OwnedFd, &[u8])> {
        let (name, folders) = self.rel.split_last().expect("a name");
        let dir = open_beneath(&self.base, folders, false, &self.shown)?;
        Ok((dir, name))
    }
}

/// The folder `p` is in (`.` for a bare name).
pub fn parent(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Opens a folder the user named, following links as the shell would.
pub fn open_named(p: &Path) -> anyhow::Result<OwnedFd> {
    rustix::fs::open(
        p,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("cannot open {}", p.display()))
}

/// Opens the folder `comps` beneath `base`, one component at a time and
/// through no symbolic link, making what is missing if `create` (with the
/// umask's permissions, as `mkdir` does). `shown` names the place in
/// messages.
pub fn open_beneath(
    base: &OwnedFd,
    comps: &[Vec<u8>],
    create: bool,
    shown: &Path,
) -> anyhow::Result<OwnedFd> {
    let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut at = rustix::fs::openat(base, ".", flags, Mode::empty())?;
    let mut path = PathBuf::new();
    let me = rustix::process::geteuid().as_raw();
    for (depth, c) in comps.iter().enumerate() {
        let name = OsStr::from_bytes(c);
        path.push(name);
        if create {
            // 0700: a folder's mode is not carried by the copy, and a new
            // one must never be wider than its source was.
            match rustix::fs::mkdirat(&at, name, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => {
                    return Err(anyhow!("cannot make {}: {e}", where_(shown, &path)));
                }
            }
        }
        // O_DIRECTORY with O_NOFOLLOW says ENOTDIR for a link: look.
        let is_link = |at: &OwnedFd| {
            rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
        };
        // The folder named like the copied one may be the user's own link
        // to a folder of their own (`~/photos -> /mnt/big/photos`), as cp
        // and scp allow; deeper links never.
        let own_link = |at: &OwnedFd| {
            depth == 0
                && rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
                    FileType::from_raw_mode(st.st_mode) == FileType::Symlink && st.st_uid == me
                })
        };
        let next = match rustix::fs::openat(&at, name, flags, Mode::empty()) {
            Err(Errno::LOOP | Errno::NOTDIR) if own_link(&at) => {
                rustix::fs::openat(&at, name, flags - OFlags::NOFOLLOW, Mode::empty())
            }
            r => r,
        };
        at = next.map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR if is_link(&at) => anyhow!(
                "{} is a symbolic link: refused (a download never writes through one; \
                 copy to the folder it points to instead)",
                where_(shown, &path)
            ),
            Errno::NOTDIR => anyhow!("{} is not a folder", where_(shown, &path)),
            e => anyhow!("cannot open {}: {e}", where_(shown, &path)),
        })?;
        // A folder another user made (first, in a shared place like /tmp)
        // is theirs to read and change: never copied into.
        if create {
            let st = rustix::fs::fstat(&at)?;
            if st.st_uid != me && st.st_uid != 0 {
                return Err(anyhow!(
                    "{} belongs to another user: refused (copy into a folder of your own)",
                    where_(shown, &path)
                ));
            }
        }
    }
    Ok(at)
}

fn where_(shown: &Path, path: &Path) -> String {
    shown.join(path).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_made_beneath_and_links_refused() {
        let d = std::env::temp_dir().join(format!("lh-local-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (dest, other) = (d.join("dest"), d.join("other"));
        std::fs::create_dir_all(&dest).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let base = open_named(&dest).unwrap();
        let c = |s: &str| {
            s.split('/')
                .map(|c| c.as_bytes().to_vec())
                .collect::<Vec<_>>()
        };
        open_beneath(&base, &c("a/b/c"), true, &dest).unwrap();
        assert!(dest.join("a/b/c").is_dir());
        std::os::unix::fs::symlink(&other, dest.join("a/sub")).unwrap();
        let e = open_beneath(&base, &c("a/sub/x"), true, &dest).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
        std::fs::write(dest.join("a/file"), b"").unwrap();
        let e = open_beneath(&base, &c("a/file/x"), true, &dest).unwrap_err();
        assert!(e.to_string().contains("not a folder"), "{e}");

        // Opened, then swapped for a link: what is written goes into the
        // folder that was opened, never where the link points.
        let held = open_beneath(&base, &c("a/b"), false, &dest).unwrap();
        std::fs::rename(dest.join("a/b"), dest.join("a/b-moved")).unwrap();
        std::os::unix::fs::symlink(&other, dest.join("a/b")).unwrap();
        let mut p = crate::part::Part::open(held, b"f").unwrap();
        std::io::Write::write_all(&mut p.file, b"x").unwrap();
        p.finish(0o644).unwrap();
        assert!(dest.join("a/b-moved/f").exists());
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
