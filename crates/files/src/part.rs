//! Partial copies: where a file is written until its hash is verified, on
//! both sides (the server's uploads, the client's downloads).
//!
//! They live in a folder of their own beside the final name,
//! `.longhaul-partial/NAME`. The file service refuses that name in every
//! path and leaves it out of listings, so a user's own file is never taken
//! for a partial copy (hidden, swept, truncated), and no client can reach
//! one. The folder must be ours (made mode 0700; one owned by another user
//! is refused), and a partial file must be a regular file with a single
//! link, owned by us: a hard link, a FIFO or a device placed there is
//! refused, never written through or waited on.

use std::fs::File;
use std::io;

use crate::sys::{self, Dir, FileKind, Why};

/// The folder, beside the final names, that holds their partial copies.
pub const PART_DIR: &str = ".longhaul-partial";

/// Attempts at opening a partial copy while other copies into the same
/// folder finish and remove the state folder under it: each failure means
/// another copy finished in between, so a few suffice; bounded all the same.
const OPEN_TRIES: u32 = 20;

/// A partial copy, open for writing, and where it goes when verified.
#[derive(Debug)]
pub struct Part {
    /// The folder of the final name.
    dir: Dir,
    /// `dir/.longhaul-partial`.
    state: Dir,
    name: Vec<u8>,
    pub file: File,
}

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

impl Part {
    /// Opens (or makes) the partial copy of `name` in the folder `dir`. It
    /// is not locked: callers lock it (`flock`) as they need.
    pub fn open(dir: Dir, name: &[u8]) -> io::Result<Part> {
        // A copy that finishes removes the state folder when it is empty:
        // one that made or opened it just before finds it gone (opening it,
        // or making its file in it), and makes it again.
        let mut tries = 0;
        loop {
            tries += 1;
            match open_state(&dir).and_then(|state| Ok((open_file(&state, name)?, state))) {
                Err(e) if sys::why(&e) == Why::NotFound && tries < OPEN_TRIES => continue,
                Err(e) => return Err(e),
                Ok((file, state)) => {
                    return Ok(Part {
                        dir,
                        state,
                        name: name.to_vec(),
                        file,
                    })
                }
            }
        }
    }

    /// The folder the final name is in.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Gives the verified copy its permissions (`mode`: the source's) and
    /// its final name; if that fails, nothing of it stays.
    pub fn finish(self, mode: u32) -> io::Result<()> {
        let placed = self.place(mode);
        if placed.is_err() {
            let _ = self.state.remove_file(&self.name);
        }
        self.tidy();
        placed
    }

    fn place(&self, mode: u32) -> io::Result<()> {
        let name = &self.name;
        let existing = match self.dir.stat_at(name) {
            Ok(st) if st.kind == FileKind::File => Some(st.mode),
            _ => None,
        };
        sys::set_mode(&self.file, final_mode(mode, existing))?;
        self.state.rename(name, &self.dir, name)
    }

    /// Removes the partial copy (its contents are not to be trusted).
    pub fn remove(self) {
        let _ = self.state.remove_file(&self.name);
        self.tidy();
    }

    /// Removes the state folder if nothing else is in it (its handle and
    /// the file's closed first: Windows keeps a folder open elsewhere).
    fn tidy(self) {
        let Part {
            dir, state, file, ..
        } = self;
        drop((state, file));
        let _ = dir.remove_dir(PART_DIR.as_bytes());
    }
}

/// Opens `dir/.longhaul-partial`, making it if needed; refuses one that is
/// not a folder of ours.
fn open_state(dir: &Dir) -> io::Result<Dir> {
    let name = PART_DIR.as_bytes();
    dir.make_dir(name)
        .map_err(|e| io::Error::other(format!("cannot make {PART_DIR}: {e}")))?;
    let state = dir.subdir(name).map_err(|e| match sys::why(&e) {
        // Removed meanwhile by a copy that finished: made again.
        Why::NotFound => e,
        Why::LinkOrNotDir => refused(format!("{PART_DIR} is not a folder: refused")),
        _ => io::Error::other(format!("cannot open {PART_DIR}: {e}")),
    })?;
    let st = state.stat()?;
    if !st.mine {
        return Err(refused(format!(
            "{PART_DIR} belongs to another user (uid {}): refused",
            st.owner
        )));
    }
    // Ours but opened up (by hand): only we may place files in it.
    if st.mode & 0o077 != 0 {
        state.make_private()?;
    }
    Ok(state)
}

fn open_file(state: &Dir, name: &[u8]) -> io::Result<File> {
    let file = state.open_part(name).map_err(|e| match sys::why(&e) {
        Why::LinkOrNotDir => refused(format!(
            "{PART_DIR}/{} is a symbolic link: refused",
            show(name)
        )),
        _ => e,
    })?;
    let st = sys::file_stat(&file)?;
    let what = format!("{PART_DIR}/{}", show(name));
    if st.kind != FileKind::File {
        return Err(refused(format!("{what} is not a regular file: refused")));
    }
    if st.links != 1 {
        return Err(refused(format!(
            "{what} has {} links (a hard link placed there): refused",
            st.links
        )));
    }
    if !st.mine {
        return Err(refused(format!("{what} belongs to another user: refused")));
    }
    Ok(file)
}

/// The permissions a received file gets: the source's read, write and
/// execute bits (never set-id or sticky) less this process's umask, as scp
/// does — and no more than an existing file of that name had, so a copy
/// never widens access to what it replaces.
pub fn final_mode(source: u32, existing: Option<u32>) -> u32 {
    let mode = source & 0o777 & !sys::umask();
    match existing {
        Some(e) => mode & e,
        None => mode,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::Path;

    fn open_dir(p: &Path) -> Dir {
        Dir::open(p).unwrap()
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("lh-part-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_partial_copy_is_made_finished_and_tidied() {
        let d = tmp("finish");
        let mut p = Part::open(open_dir(&d), b"f.txt").unwrap();
        std::io::Write::write_all(&mut p.file, b"hello").unwrap();
        let meta = std::fs::metadata(d.join(PART_DIR)).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
        assert!(d.join(PART_DIR).join("f.txt").exists());
        p.finish(0o100600).unwrap();
        assert_eq!(std::fs::read(d.join("f.txt")).unwrap(), b"hello");
        let mode = std::fs::metadata(d.join("f.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!d.join(PART_DIR).exists(), "an empty state folder stays");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Copies into one folder at once: each one that finishes removes the
    /// state folder when it is empty, under the others' feet. None fails
    /// (a copy that found the folder gone between making and opening it
    /// once failed with "No such file or directory").
    #[test]
    fn copies_into_one_folder_at_once_do_not_trip_each_other() {
        let d = tmp("race");
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for i in 0..300 {
                        let name = format!("f{t}-{i}");
                        let p = Part::open(open_dir(&d), name.as_bytes())
                            .unwrap_or_else(|e| panic!("{name}: {e}"));
                        p.finish(0o100644).unwrap();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1200);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn hard_links_fifos_and_links_are_refused_not_written_through() {
        let d = tmp("hostile");
        let victim = d.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::fs::create_dir(d.join(PART_DIR)).unwrap();
        std::fs::hard_link(&victim, d.join(PART_DIR).join("a")).unwrap();
        let e = Part::open(open_dir(&d), b"a").unwrap_err().to_string();
        assert!(e.contains("2 links"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

        std::os::unix::fs::symlink(&victim, d.join(PART_DIR).join("b")).unwrap();
        let e = Part::open(open_dir(&d), b"b").unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");

        let fifo = d.join(PART_DIR).join("c");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let e = Part::open(open_dir(&d), b"c").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");

        // The state folder itself as a link to elsewhere.
        let other = tmp("hostile-other");
        std::fs::remove_dir_all(d.join(PART_DIR)).unwrap();
        std::os::unix::fs::symlink(&other, d.join(PART_DIR)).unwrap();
        let e = Part::open(open_dir(&d), b"a").unwrap_err().to_string();
        assert!(e.contains("not a folder"), "{e}");
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&other).unwrap();
    }

    #[test]
    fn a_state_folder_of_another_user_is_refused() {
        // Only root can give a folder away; elsewhere there is nothing to try.
        if rustix::process::geteuid().as_raw() != 0 {
            return;
        }
        let d = tmp("owner");
        std::fs::create_dir(d.join(PART_DIR)).unwrap();
        std::os::unix::fs::chown(d.join(PART_DIR), Some(54_321), None).unwrap();
        let e = Part::open(open_dir(&d), b"x").unwrap_err().to_string();
        assert!(e.contains("another user"), "{e}");
        assert!(!d.join(PART_DIR).join("x").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn modes_are_kept_masked_and_never_widened() {
        let u = sys::umask();
        assert_eq!(final_mode(0o100755, None), 0o755 & !u);
        assert_eq!(
            final_mode(0o104755, None) & 0o7000,
            0,
            "set-id bits dropped"
        );
        assert_eq!(final_mode(0o100600, None), 0o600 & !u);
        assert_eq!(final_mode(0o100644, Some(0o100600)), 0o600 & !u);
    }
}
