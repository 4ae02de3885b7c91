//! Where a download writes: beneath the destination the user named, made
//! and opened one folder at a time relative to the one above
//! (`mkdirat`/`openat` with `O_NOFOLLOW`), never through a symbolic link.
//! A link already inside the destination (`sub -> /elsewhere`), or a folder
//! swapped for one by another local user while the copy runs (in a shared
//! place such as /tmp), is refused; a folder swapped after it was opened
//! is written as the folder it was, never where the link points. The
//! destination as the user wrote it is followed: that is the user's
//! choice.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Context};

use crate::sys::{self, Dir, FileKind, Why};

/// A file to write: its path beneath a folder the user named.
#[derive(Debug, Clone)]
pub struct LocalDest {
    base: Arc<Dir>,
    /// Components beneath `base` (at least one: the file's name).
    rel: Vec<Vec<u8>>,
    /// The path as the user sees it, for messages.
    pub shown: PathBuf,
}

impl LocalDest {
    /// `rel` (not empty) beneath the folder `base`, shown as `shown`.
    pub fn new(base: Arc<Dir>, rel: Vec<Vec<u8>>, shown: PathBuf) -> LocalDest {
        debug_assert!(!rel.is_empty());
        LocalDest { base, rel, shown }
    }

    /// A file at a path the user named: its folder as named, its name.
    pub fn path(p: &Path) -> anyhow::Result<LocalDest> {
        let name = p
            .file_name()
            .ok_or_else(|| anyhow!("{}: not a file name", p.display()))?;
        let base = open_named(parent(p))?;
        let name = sys::name_bytes(name)
            .ok_or_else(|| anyhow!("{}: not a name this system can write", p.display()))?;
        Ok(LocalDest::new(
            Arc::new(base),
            vec![name.to_vec()],
            p.to_path_buf(),
        ))
    }

    /// Opens the folder the file goes in (it exists: the plan made it),
    /// and the file's name.
    pub fn open_parent(&self) -> anyhow::Result<(Dir, &[u8])> {
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
pub fn open_named(p: &Path) -> anyhow::Result<Dir> {
    Dir::open(p).with_context(|| format!("cannot open {}", p.display()))
}

/// Opens the folder `comps` beneath `base`, one component at a time and
/// through no symbolic link, making what is missing if `create` (with the
/// umask's permissions, as `mkdir` does). `shown` names the place in
/// messages.
pub fn open_beneath(
    base: &Dir,
    comps: &[Vec<u8>],
    create: bool,
    shown: &Path,
) -> anyhow::Result<Dir> {
    let mut at = base.reopen()?;
    let mut path = PathBuf::new();
    for (depth, name) in comps.iter().enumerate() {
        path.push(sys::name_os(name));
        if create {
            at.make_dir(name)
                .map_err(|e| anyhow!("cannot make {}: {e}", where_(shown, &path)))?;
        }
        // No-follow on a folder's name says "not a folder" for a link: look.
        let link = |at: &Dir| at.stat_at(name).ok().filter(|st| st.kind == FileKind::Link);
        let next = match at.subdir(name) {
            // The folder named like the copied one may be the user's own
            // link to a folder of their own (`~/photos -> /mnt/big/photos`),
            // as cp and scp allow; deeper links never.
            Err(e)
                if sys::why(&e) == Why::LinkOrNotDir
                    && depth == 0
                    && link(&at).is_some_and(|st| st.mine) =>
            {
                at.subdir_following(name)
            }
            r => r,
        };
        at = next.map_err(|e| match sys::why(&e) {
            Why::LinkOrNotDir if link(&at).is_some() => anyhow!(
                "{} is a symbolic link: refused (a download never writes through one; \
                 copy to the folder it points to instead)",
                where_(shown, &path)
            ),
            Why::LinkOrNotDir => anyhow!("{} is not a folder", where_(shown, &path)),
            _ => anyhow!("cannot open {}: {e}", where_(shown, &path)),
        })?;
        // A folder another user made (first, in a shared place like /tmp)
        // is theirs to read and change: never copied into.
        if create {
            let st = at.stat()?;
            if !st.mine && !st.system {
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
