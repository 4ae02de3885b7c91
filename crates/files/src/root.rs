//! The served folder: every path a client names is resolved beneath it by
//! the kernel (`openat2` with `RESOLVE_BENEATH`), so `..`, absolute paths
//! and symbolic links that lead out are refused however they are spelled.
//! (Linux 5.6 or later.)

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::part::PART_DIR;
use crate::sys::{self, Dir, FileKind, Why};
use crate::wire::Kind;

/// Deepest folder nesting a listing or a sweep follows.
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
    #[error("'.longhaul-partial' is refused in paths (it holds partial copies)")]
    Reserved,
    #[error("read-only access: writing is not allowed for this client (the server grants it with files=rw for this key in its authorized_keys, or --files-for-token rw)")]
    ReadOnly,
    /// A name this system would take for another, or for a device.
    #[error("{0}")]
    Name(&'static str),
    #[error("{0}")]
    Other(String),
}

impl Refusal {
    /// Refusals worth a warning in the server's log (attempts to get out,
    /// or to write without the right).
    pub fn is_hostile(&self) -> bool {
        !matches!(self, Refusal::Other(_))
    }
    pub(crate) fn io(what: &str, e: std::io::Error) -> Refusal {
        match sys::why(&e) {
            Why::Escapes => Refusal::Escapes,
            _ => Refusal::Other(format!("{what}: {e}")),
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
                // Any case: a folder that ignores case takes it for ours.
                c if c.eq_ignore_ascii_case(PART_DIR.as_bytes()) => return Err(Refusal::Reserved),
                c => match sys::name_refusal(c) {
                    Some(why) => return Err(Refusal::Name(why)),
                    None => parts.push(c.to_vec()),
                },
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

    pub(crate) fn as_path(&self) -> PathBuf {
        if self.0.is_empty() {
            return PathBuf::from(".");
        }
        self.0.iter().map(|c| sys::name_os(c)).collect::<PathBuf>()
    }

    fn split_last(&self) -> Option<(RelPath, &[u8])> {
        let (last, parent) = self.0.split_last()?;
        Some((RelPath(parent.to_vec()), last))
    }
}

/// The served folder.
#[derive(Debug)]
pub struct Root {
    dir: Dir,
    pub path: PathBuf,
}

impl Root {
    pub fn open(path: &Path) -> std::io::Result<Root> {
        let dir = Dir::open(path)?;
        dir.require_beneath()?;
        Ok(Root {
            dir,
            path: path.to_path_buf(),
        })
    }

    /// The folder `rel`, resolved beneath the served one.
    pub(crate) fn dir_at(&self, rel: &RelPath) -> std::io::Result<Dir> {
        self.dir.dir_beneath(&rel.as_path())
    }

    /// What is at `rel` (a file's size with it).
    pub fn stat(&self, rel: &RelPath) -> Result<(Kind, u64), Refusal> {
        match self.dir.stat_beneath(&rel.as_path()) {
            Ok(st) => Ok(match st.kind {
                FileKind::Dir => (Kind::Dir, 0),
                FileKind::File => (Kind::File, st.size),
                _ => (Kind::Missing, 0),
            }),
            Err(e) if sys::why(&e) == Why::NotFound => Ok((Kind::Missing, 0)),
            Err(e) => Err(Refusal::io("stat", e)),
        }
    }

    /// Opens a regular file for reading. Anything else — a FIFO, a device,
    /// a socket — is refused without being opened for reading (whose
    /// `open` could block for good, or act on a device): it is looked at
    /// without being opened first, and opened non-blocking in case it was
    /// swapped meanwhile, then checked again.
    pub fn open_file(&self, rel: &RelPath) -> Result<File, Refusal> {
        let not_regular = || Refusal::Other("not a regular file: refused".into());
        let path = rel.as_path();
        let st = self
            .dir
            .stat_beneath(&path)
            .map_err(|e| Refusal::io("open", e))?;
        if st.kind != FileKind::File {
            return Err(not_regular());
        }
        let file = self
            .dir
            .file_beneath(&path)
            .map_err(|e| Refusal::io("open", e))?;
        let st = sys::file_stat(&file).map_err(|e| Refusal::io("stat", e))?;
        if st.kind != FileKind::File {
            return Err(not_regular());
        }
        Ok(file)
    }

    /// Opens the folder `rel`, creating it and its parents if `create`.
    pub fn open_dir(&self, rel: &RelPath, create: bool) -> Result<Dir, Refusal> {
        match self.dir_at(rel) {
            Err(e) if create && sys::why(&e) == Why::NotFound => {}
            // Named as the client wrote it (the client shows it escaped).
            Err(e) if sys::why(&e) == Why::NotFound => {
                let shown: Vec<String> = rel
                    .components()
                    .iter()
                    .map(|c| String::from_utf8_lossy(c).into_owned())
                    .collect();
                return Err(Refusal::Other(format!(
                    "no folder /{} on the server (cp -r makes folders; or copy into one that exists)",
                    shown.join("/")
                )));
            }
            r => return r.map_err(|e| Refusal::io("open folder", e)),
        }
        // Walk down, making what is missing, each step resolved beneath.
        let mut at = RelPath(vec![]);
        for c in rel.components() {
            let parent = self
                .dir_at(&at)
                .map_err(|e| Refusal::io("open folder", e))?;
            parent
                .make_dir(c)
                .map_err(|e| Refusal::io("make folder", e))?;
            at.0.push(c.clone());
        }
        self.dir_at(rel).map_err(|e| Refusal::io("open folder", e))
    }

    /// The folder a file at `rel` goes in, and the file's name.
    pub fn parent_of<'a>(
        &self,
        rel: &'a RelPath,
        create: bool,
    ) -> Result<(Dir, &'a [u8]), Refusal> {
        let (parent, name) = rel
            .split_last()
            .ok_or_else(|| Refusal::Other("a file name is needed".into()))?;
        Ok((self.open_dir(&parent, create)?, name))
    }
}

/// Entries a sweep for stale partial uploads looks at, at most.
const MAX_SWEEP: usize = 1_000_000;

impl Root {
    /// Removes the partial uploads (in `.longhaul-partial` folders) under
    /// the folder that nothing has written for `max_age` and no upload
    /// holds (they are locked while one runs); returns how many. Looks at
    /// no more than [`MAX_SWEEP`] entries, [`MAX_DEPTH`] folders deep,
    /// holding one descriptor and one read buffer per level; never follows
    /// a symbolic link, never opens anything but folders and regular files.
    pub fn sweep_parts(&self, max_age: std::time::Duration) -> usize {
        let Ok(dir) = self.dir.reopen() else {
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

fn sweep_into(dir: Dir, depth: usize, oldest: i64, budget: &mut usize) -> usize {
    let Ok(entries) = dir.entries() else {
        return 0;
    };
    let mut removed = 0;
    for name in entries {
        let Ok(name) = name else { break };
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        if !dir.stat_at(&name).is_ok_and(|st| st.kind == FileKind::Dir) {
            continue;
        }
        let Ok(sub) = dir.subdir(&name) else {
            continue;
        };
        if name == PART_DIR.as_bytes() {
            removed += sweep_state(&sub, oldest, budget);
            // Empty now: gone (a copy starting meanwhile makes it again).
            let _ = dir.remove_dir(&name);
        } else if depth < MAX_DEPTH {
            removed += sweep_into(sub, depth + 1, oldest, budget);
        }
    }
    removed
}

/// Removes the stale partial files of one state folder of ours.
fn sweep_state(state: &Dir, oldest: i64, budget: &mut usize) -> usize {
    match state.stat() {
        Ok(st) if st.mine => {}
        // Not ours: uploads refuse it too; whoever made it tends it.
        _ => return 0,
    }
    let Ok(entries) = state.entries() else {
        return 0;
    };
    let mut removed = 0;
    for name in entries {
        let Ok(name) = name else { break };
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        match state.stat_at(&name) {
            Ok(st) if st.kind == FileKind::File && st.mtime < oldest => {}
            _ => continue,
        }
        // Non-blocking: swapped for a FIFO meanwhile, it cannot block the sweep.
        let Ok(f) = state.open_file_at(&name) else {
            continue;
        };
        // Held by an upload that is running: not stale.
        if sys::try_lock(&f) && state.remove_file(&name).is_ok() {
            removed += 1;
        }
    }
    removed
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
        for d in ["", "sub/"] {
            std::fs::create_dir_all(root.join(d).join(PART_DIR)).unwrap();
        }
        std::fs::create_dir_all(outside.join(PART_DIR)).unwrap();
        let part = |name: &str| root.join(PART_DIR).join(name);
        make(part("a"), true);
        make(root.join("sub").join(PART_DIR).join("b"), true);
        make(part("fresh"), false);
        make(root.join("old-but-whole.iso"), true);
        // A user's own file named like an earlier version's partial copy.
        make(root.join(".mine.longhaul-part"), true);
        let held = make(part("held"), true);
        assert!(sys::try_lock(&held));
        make(outside.join(PART_DIR).join("c"), true);
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();

        let r = Root::open(&root).unwrap();
        assert_eq!(r.sweep_parts(Duration::from_secs(7 * 86_400)), 2);
        assert!(!part("a").exists());
        assert!(
            !root.join("sub").join(PART_DIR).exists(),
            "emptied, removed"
        );
        for kept in [part("fresh"), part("held")] {
            assert!(kept.exists(), "{} removed", kept.display());
        }
        for kept in ["old-but-whole.iso", ".mine.longhaul-part"] {
            assert!(root.join(kept).exists(), "{kept} removed");
        }
        assert!(outside.join(PART_DIR).join("c").exists(), "followed a link");
        drop(held);
        assert_eq!(r.sweep_parts(Duration::from_secs(7 * 86_400)), 1);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_state_folder_is_refused_in_paths() {
        assert!(matches!(
            RelPath::parse(b"a/.longhaul-partial/x"),
            Err(Refusal::Reserved)
        ));
        assert!(RelPath::parse(b"a/.x.longhaul-part").is_ok());
    }
}
