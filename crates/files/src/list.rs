//! Listings, streamed: the server sends each entry as it finds it, so what
//! a listing holds does not grow with the tree, and a client that stops
//! reading only stops the walk (its stream's pipe is full).
//!
//! Bounds per listing: two descriptors (the listed folder and the one being
//! read; folders deeper down are opened again from the listed one, beneath
//! it and refusing symbolic links, rather than held open a level each), up
//! to [`MAX_PENDING`] bytes of names of folders still to be read, a batch
//! of [`BATCH`] bytes being written, and one directory read buffer. A walk
//! stops with a message past [`MAX_DEPTH`] levels, [`MAX_LIST_ENTRIES`]
//! entries, [`MAX_LIST_BYTES`] bytes of paths, a path longer than
//! [`MAX_PATH`], or [`MAX_LOOKED_AT`] directory entries read.

use std::io::{self, Write};
use std::path::Path;

use crate::part::PART_DIR;
use crate::root::MAX_DEPTH;
use crate::sys::{self, Dir, FileKind, Why};
use crate::wire::{self, Entry, Kind, ListItem, MAX_LIST_BYTES, MAX_LIST_ENTRIES, MAX_PATH};

/// Bytes of names of folders found but not yet read, at most: a folder
/// with more subfolders than fit is refused, to be copied in parts.
pub const MAX_PENDING: usize = 1 << 20;
/// Listing bytes gathered before they are written to the stream.
pub const BATCH: usize = 64 * 1024;
/// Directory entries one listing reads at most, listed or not (symbolic
/// links, special files): the walk's CPU is bounded too.
pub const MAX_LOOKED_AT: usize = 1_000_000;

enum Stop {
    /// The walk cannot go on: said to the client, the stream goes on.
    Failed(String),
    /// Writing to the stream failed: it cannot go on.
    Io(io::Error),
}

impl From<io::Error> for Stop {
    fn from(e: io::Error) -> Stop {
        Stop::Io(e)
    }
}

fn failed(msg: impl Into<String>) -> Stop {
    Stop::Failed(msg.into())
}

/// Writes the ok status and every entry under the folder `base` (a folder
/// before what it holds; symbolic links, special files and partial copies
/// left out), then the end or why the walk stopped. An error is the
/// stream's (it cannot go on).
pub fn stream(base: Dir, w: &mut impl Write) -> io::Result<()> {
    let mut walk = Walk {
        base,
        w,
        out: Vec::with_capacity(BATCH + MAX_PATH + 64),
        entries: 0,
        bytes: 0,
        looked_at: 0,
        pending: 0,
    };
    walk.out.push(0);
    let last = match walk.run() {
        Ok(()) => ListItem::End,
        Err(Stop::Failed(msg)) => ListItem::Failed(msg),
        Err(Stop::Io(e)) => return Err(e),
    };
    wire::write_item(&mut walk.out, &last);
    walk.w.write_all(&walk.out)?;
    walk.w.flush()
}

struct Walk<'a, W: Write> {
    base: Dir,
    w: &'a mut W,
    out: Vec<u8>,
    entries: u32,
    bytes: u64,
    looked_at: usize,
    /// Bytes of all levels' `names`.
    pending: usize,
}

/// A folder read, and the subfolders found in it still to be walked.
struct Level {
    /// Their names, each followed by a NUL (which no name holds).
    names: Vec<u8>,
    next: usize,
    /// Length of the folder's own path (in `prefix`).
    prefix_len: usize,
}

impl<W: Write> Walk<'_, W> {
    fn run(&mut self) -> Result<(), Stop> {
        let mut prefix = Vec::new();
        let first = self
            .base
            .reopen()
            .map_err(|e| failed(format!("read folder: {e}")))?;
        let names = self.read_folder(first, &prefix)?;
        let mut stack = vec![Level {
            names,
            next: 0,
            prefix_len: 0,
        }];
        while let Some(top) = stack.last_mut() {
            if top.next >= top.names.len() {
                self.pending -= top.names.len();
                stack.pop();
                continue;
            }
            let end = top.names[top.next..]
                .iter()
                .position(|&b| b == 0)
                .map_or(top.names.len(), |i| top.next + i);
            prefix.truncate(top.prefix_len);
            if !prefix.is_empty() {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(&top.names[top.next..end]);
            top.next = end + 1;
            if stack.len() > MAX_DEPTH {
                return Err(failed(format!("folders nested deeper than {MAX_DEPTH}")));
            }
            // Again from the listed folder, beneath it and through no
            // symbolic link: a folder swapped for one meanwhile is skipped.
            let fd = match self
                .base
                .dir_beneath_nofollow(Path::new(&*sys::name_os(&prefix)))
            {
                Ok(fd) => fd,
                Err(e) if sys::why(&e) != Why::Other => continue,
                Err(e) => return Err(failed(format!("open folder: {e}"))),
            };
            let names = self.read_folder(fd, &prefix)?;
            stack.push(Level {
                names,
                next: 0,
                prefix_len: prefix.len(),
            });
        }
        Ok(())
    }

    /// Sends the entries of one folder; returns its subfolders' names.
    fn read_folder(&mut self, dir: Dir, prefix: &[u8]) -> Result<Vec<u8>, Stop> {
        let read_err = |e: io::Error| failed(format!("read folder: {e}"));
        let mut names = Vec::new();
        for name in dir.entries().map_err(read_err)? {
            let name = name.map_err(read_err)?;
            let name = &name[..];
            self.looked_at += 1;
            if self.looked_at > MAX_LOOKED_AT {
                return Err(failed(format!(
                    "more than {MAX_LOOKED_AT} entries: copy its folders one by one"
                )));
            }
            if name.eq_ignore_ascii_case(PART_DIR.as_bytes()) {
                continue;
            }
            let st = match dir.stat_at(name) {
                Ok(st) => st,
                Err(e) if sys::why(&e) == Why::NotFound => continue,
                Err(e) => return Err(failed(format!("stat: {e}"))),
            };
            match st.kind {
                FileKind::File => self.emit(Kind::File, st.size, prefix, name)?,
                FileKind::Dir => {
                    self.emit(Kind::Dir, 0, prefix, name)?;
                    self.pending += name.len() + 1;
                    if self.pending > MAX_PENDING {
                        return Err(failed(format!(
                            "more than {} KiB of folder names waiting to be listed: copy its folders one by one",
                            MAX_PENDING >> 10
                        )));
                    }
                    names.extend_from_slice(name);
                    names.push(0);
                }
                _ => {}
            }
        }
        names.shrink_to_fit();
        Ok(names)
    }

    fn emit(&mut self, kind: Kind, size: u64, prefix: &[u8], name: &[u8]) -> Result<(), Stop> {
        let mut path = Vec::with_capacity(prefix.len() + 1 + name.len());
        if !prefix.is_empty() {
            path.extend_from_slice(prefix);
            path.push(b'/');
        }
        path.extend_from_slice(name);
        if path.len() > MAX_PATH {
            return Err(failed(format!(
                "a path longer than {MAX_PATH} bytes: copy its folders one by one"
            )));
        }
        self.entries += 1;
        self.bytes += path.len() as u64;
        if self.entries > MAX_LIST_ENTRIES || self.bytes > MAX_LIST_BYTES {
            return Err(failed(format!(
                "more than {MAX_LIST_ENTRIES} entries or {} MiB of paths: copy its folders one by one",
                MAX_LIST_BYTES >> 20
            )));
        }
        wire::write_item(&mut self.out, &ListItem::Entry(Entry { kind, size, path }));
        if self.out.len() >= BATCH {
            self.w.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("lh-list-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The listing of `dir`: its entries' paths and how it ended.
    fn list(dir: &Path) -> (Vec<String>, ListItem) {
        let fd = Dir::open(dir).unwrap();
        let mut b = vec![];
        stream(fd, &mut b).unwrap();
        let mut r = &b[..];
        assert_eq!(wire::read_status(&mut r).unwrap(), Ok(()));
        let mut paths = vec![];
        loop {
            match wire::read_item(&mut r).unwrap() {
                ListItem::Entry(e) => paths.push(String::from_utf8(e.path).unwrap()),
                end => {
                    assert!(r.is_empty());
                    paths.sort();
                    return (paths, end);
                }
            }
        }
    }

    #[test]
    fn a_listing_has_files_and_folders_and_nothing_else() {
        let d = tmp("plain");
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::create_dir_all(d.join("a").join(PART_DIR)).unwrap();
        std::fs::write(d.join("a").join(PART_DIR).join("x"), b"").unwrap();
        std::fs::write(d.join("a/b/c.txt"), b"").unwrap();
        std::fs::write(d.join(".mine.longhaul-part"), b"").unwrap();
        std::os::unix::fs::symlink("/etc", d.join("a/link")).unwrap();
        assert!(std::process::Command::new("mkfifo")
            .arg(d.join("fifo"))
            .status()
            .unwrap()
            .success());
        let (paths, end) = list(&d);
        assert_eq!(paths, [".mine.longhaul-part", "a", "a/b", "a/b/c.txt"]);
        assert_eq!(end, ListItem::End);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn too_deep_or_too_wide_ends_with_a_message() {
        let d = tmp("deep");
        let mut p = d.clone();
        for _ in 0..MAX_DEPTH + 2 {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        let (paths, end) = list(&d);
        assert_eq!(paths.len(), MAX_DEPTH + 1);
        assert!(matches!(end, ListItem::Failed(m) if m.contains("deeper than 64")));
        std::fs::remove_dir_all(&d).unwrap();

        // More subfolder names waiting than the bound.
        let d = tmp("wide");
        let n = MAX_PENDING / 250 + 10;
        for i in 0..n {
            std::fs::create_dir(d.join(format!("{i:06}{}", "w".repeat(244)))).unwrap();
        }
        let (_, end) = list(&d);
        assert!(matches!(end, ListItem::Failed(m) if m.contains("folder names waiting")));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_writer_that_fails_ends_the_walk() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let d = tmp("broken");
        for i in 0..2000 {
            std::fs::write(d.join(format!("{i:04}{}", "n".repeat(100))), b"").unwrap();
        }
        let fd = Dir::open(&d).unwrap();
        assert!(stream(fd, &mut Broken).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
