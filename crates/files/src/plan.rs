//! What a `cp` command means (scp's rules), and running it on a few
//! streams at once.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context};

use crate::client::{Conn, Copied, Counters, Remote};
use crate::local::{self, LocalDest};
use crate::part::PART_DIR;
use crate::root::RelPath;
use crate::sys::{self, Dir, FileKind};
use crate::wire::Kind;

/// One side of a copy, as written on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Local(PathBuf),
    /// `SERVER:/PATH`: the server's address, and a path in its folder.
    Remote {
        server: String,
        path: String,
    },
}

/// `HOST:PORT:PATH` (PATH not empty, HOST without a slash): the server
/// `HOST:PORT` and PATH.
fn scp_style(s: &str) -> Option<(&str, &str)> {
    let (host, rest) = s.split_once(':')?;
    let (port, path) = rest.split_once(':')?;
    let port_ok = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    let query = port.contains('?');
    (port_ok && !query && !host.is_empty() && !host.contains('/') && !path.is_empty())
        .then(|| (&s[..host.len() + 1 + port.len()], path))
}

impl Place {
    /// `URL:/PATH` is remote (split at the first `:/` after the URL's
    /// `://`, if any); anything else, or anything starting with `/` or
    /// `.` (or, on Windows, a drive `C:` or `\\`), is a local path (write
    /// `./a:/b` for a local name with `:/`).
    pub fn parse(s: &str) -> Place {
        if s.starts_with('/') || s.starts_with('.') || sys::is_local_spelling(s) {
            return Place::Local(s.into());
        }
        let after = s.find("://").map(|i| i + 3).unwrap_or(0);
        match s[after..].find(":/") {
            Some(i) if after + i > 0 => Place::Remote {
                server: s[..after + i].to_string(),
                path: s[after + i + 1..].to_string(),
            },
            // scp's habit, HOST:PORT:PATH without the slash: the path is
            // still inside the server's folder.
            _ => match scp_style(&s[after..]) {
                Some((server, path)) => Place::Remote {
                    server: format!("{}{server}", &s[..after]),
                    path: format!("/{path}"),
                },
                None => Place::Local(s.into()),
            },
        }
    }
}

/// One file to copy.
#[derive(Debug, Clone)]
pub enum Task {
    Put {
        src: PathBuf,
        dest: Vec<u8>,
        /// If `dest` is a folder, the name in it (empty: `dest` is the file).
        into: Vec<u8>,
        size: u64,
        /// For a file found inside a folder: its (device, inode) when the
        /// folder was read. The upload opens it without following a link
        /// and sends it only if it is still that file (a local user who
        /// can write the tree cannot swap in a link to a secret).
        found: Option<(u64, u64)>,
    },
    Get {
        src: Vec<u8>,
        dest: LocalDest,
        size: u64,
    },
}

impl Task {
    pub fn size(&self) -> u64 {
        match self {
            Task::Put { size, .. } | Task::Get { size, .. } => *size,
        }
    }
}

/// A remote path as the service wants it: relative to the served folder,
/// checked.
pub fn rel(path: &str) -> anyhow::Result<Vec<u8>> {
    let r = RelPath::parse(path.trim_start_matches('/').as_bytes())
        .map_err(|e| anyhow!("{path}: {e}"))?;
    Ok(r.components().join(&b'/'))
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    match dir.is_empty() {
        true => name.to_vec(),
        false => [dir, b"/", name].concat(),
    }
}

fn local_name(p: &Path) -> anyhow::Result<Vec<u8>> {
    let full = std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))?;
    full.file_name()
        .and_then(sys::name_bytes)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| anyhow!("{}: has no name to copy it under", p.display()))
}

/// Plans an upload: makes the remote folders on the way, returns the files.
pub fn plan_upload(
    conn: &mut Conn,
    sources: &[PathBuf],
    dest: &str,
    recursive: bool,
) -> anyhow::Result<Vec<Task>> {
    let dest_rel = rel(dest)?;
    // One file: the server puts it in the folder if `dest` is one, and
    // the data starts a round trip sooner.
    if let [src] = sources {
        let meta = std::fs::metadata(src).with_context(|| format!("{}", src.display()))?;
        if meta.is_file() {
            let name = local_name(src)?;
            let (dest, into) = match dest.ends_with('/') || dest_rel.is_empty() {
                true => (join(&dest_rel, &name), vec![]),
                false => (dest_rel, name),
            };
            return Ok(vec![Task::Put {
                src: src.clone(),
                dest,
                into,
                size: meta.len(),
                found: None,
            }]);
        }
    }
    let (kind, _) = conn.stat(&dest_rel)?;
    let into = kind == Kind::Dir;
    if !into {
        if sources.len() > 1 {
            bail!("{dest} is not a folder on the server (several sources go into a folder)");
        }
        if dest.ends_with('/') || dest_rel.is_empty() {
            bail!("no folder {dest} on the server");
        }
    }
    let mut tasks = vec![];
    for src in sources {
        let meta = std::fs::metadata(src).with_context(|| format!("{}", src.display()))?;
        let target = match into {
            true => join(&dest_rel, &local_name(src)?),
            false => dest_rel.clone(),
        };
        if meta.is_file() {
            tasks.push(Task::Put {
                src: src.clone(),
                dest: target,
                into: vec![],
                size: meta.len(),
                found: None,
            });
        } else if meta.is_dir() {
            if !recursive {
                bail!("{} is a folder: add -r to copy folders", src.display());
            }
            conn.mkdir(&target)?;
            // The folder the user named, as named (a link to it is theirs);
            // beneath it, nothing through a link.
            let top = Dir::open(src).with_context(|| format!("{}", src.display()))?;
            walk_local(conn, &top, src, &target, &mut tasks)?;
        } else {
            bail!("{}: not a file or folder", src.display());
        }
    }
    Ok(tasks)
}

fn walk_local(
    conn: &mut Conn,
    dir_fd: &Dir,
    dir: &Path,
    remote: &[u8],
    tasks: &mut Vec<Task>,
) -> anyhow::Result<()> {
    // Read through the folder's descriptor, each subfolder opened from it
    // without following a link: a folder swapped for a link while the tree
    // is read is refused, never listed.
    let mut names: Vec<Vec<u8>> = vec![];
    for name in dir_fd
        .entries()
        .with_context(|| format!("{}", dir.display()))?
    {
        names.push(name.with_context(|| format!("{}", dir.display()))?);
    }
    names.sort();
    for name in names {
        let path = dir.join(sys::name_os(&name));
        // A download's partial copies, left by one interrupted here.
        if name.eq_ignore_ascii_case(PART_DIR.as_bytes()) {
            continue;
        }
        let target = join(remote, &name);
        let st = dir_fd
            .stat_at(&name)
            .with_context(|| format!("{}", path.display()))?;
        match st.kind {
            FileKind::Dir => {
                let sub = dir_fd
                    .subdir(&name)
                    .with_context(|| format!("{} changed while it was read", path.display()))?;
                if sub.stat()?.id != st.id {
                    bail!("{} changed while it was read", path.display());
                }
                conn.mkdir(&target)?;
                walk_local(conn, &sub, &path, &target, tasks)?;
            }
            FileKind::File => tasks.push(Task::Put {
                size: st.size,
                src: path,
                dest: target,
                into: vec![],
                found: Some(st.id),
            }),
            _ => tracing::warn!("skipping {} (not a file or folder)", path.display()),
        }
    }
    Ok(())
}

/// Plans a download: makes the local folders on the way (beneath the
/// destination, through no symbolic link: [`crate::local`]), returns the
/// files, in the order of their paths.
pub fn plan_download(
    conn: &mut Conn,
    sources: &[String],
    dest: &Path,
    recursive: bool,
) -> anyhow::Result<Vec<Task>> {
    let into = dest.is_dir();
    if !into && sources.len() > 1 {
        bail!(
            "{} is not a folder (several sources go into a folder)",
            dest.display()
        );
    }
    // The folder the copy goes in, as the user named it; everything is
    // made and written beneath it.
    let (base, named) = match into {
        true => (local::open_named(dest)?, None),
        false => {
            let name = dest
                .file_name()
                .ok_or_else(|| anyhow!("{}: not a file or folder name", dest.display()))?;
            let name = sys::name_bytes(name)
                .ok_or_else(|| anyhow!("{}: not a name this system can write", dest.display()))?;
            (local::open_named(local::parent(dest))?, Some(name.to_vec()))
        }
    };
    let base = Arc::new(base);
    let shown_base = match into {
        true => dest.to_path_buf(),
        false => local::parent(dest).to_path_buf(),
    };
    let mut tasks = vec![];
    for src in sources {
        let src_rel = rel(src)?;
        let (kind, size) = conn.stat(&src_rel)?;
        let name = src_rel.rsplit(|&b| b == b'/').next().unwrap_or_default();
        if name.is_empty() {
            bail!("{src}: name a file or folder inside the served folder");
        }
        let top = named.clone().unwrap_or_else(|| name.to_vec());
        let shown = |comps: &[Vec<u8>]| -> PathBuf {
            let mut p = shown_base.clone();
            p.extend(comps.iter().map(|c| sys::name_os(c)));
            p
        };
        match kind {
            Kind::Missing => bail!("{src}: no such file or folder on the server"),
            Kind::File => tasks.push(Task::Get {
                src: src_rel,
                dest: LocalDest::new(base.clone(), vec![top.clone()], shown(&[top])),
                size,
            }),
            Kind::Dir => {
                if !recursive {
                    bail!("{src} is a folder: add -r to copy folders");
                }
                let top = vec![top];
                local::open_beneath(&base, &top, true, &shown_base)?;
                conn.list_each(&src_rel, |e, rel| {
                    let comps = [&top[..], rel.components()].concat();
                    match e.kind {
                        Kind::Dir => drop(local::open_beneath(&base, &comps, true, &shown_base)?),
                        _ => tasks.push(Task::Get {
                            src: join(&src_rel, &e.path),
                            dest: LocalDest::new(base.clone(), comps.clone(), shown(&comps)),
                            size: e.size,
                        }),
                    }
                    Ok(())
                })
                .map_err(|e| anyhow!("{src}: {e:#}"))?;
            }
        }
    }
    // Listings come in the server's folder order: copy in the paths' order.
    tasks.sort_by(|a, b| match (a, b) {
        (Task::Get { dest: a, .. }, Task::Get { dest: b, .. }) => a.shown.cmp(&b.shown),
        _ => std::cmp::Ordering::Equal,
    });
    Ok(tasks)
}

/// Runs the tasks on up to `jobs` streams (the first is `first`). Returns
/// what was copied and what failed.
pub fn run(
    remote: &Remote,
    first: Conn,
    tasks: Vec<Task>,
    jobs: usize,
    counters: &Counters,
) -> (Vec<Copied>, Vec<String>) {
    let n = tasks.len();
    let queue = Mutex::new(tasks.into_iter().collect::<VecDeque<_>>());
    let done = Mutex::new(vec![]);
    let failed = Mutex::new(vec![]);
    let work = |conn: Option<Conn>| {
        let mut conn = conn;
        loop {
            let Some(task) = queue.lock().ok().and_then(|mut q| q.pop_front()) else {
                return;
            };
            let c = match conn.take() {
                Some(c) => Ok(c),
                None => remote.connect(),
            };
            let (r, c) = match c {
                Ok(mut c) => {
                    let r = match &task {
                        Task::Put {
                            src,
                            dest,
                            into,
                            found,
                            ..
                        } => c.put(src, dest, into, *found, counters),
                        Task::Get { src, dest, .. } => c.get(src, dest, counters),
                    };
                    (r, Some(c))
                }
                Err(e) => (Err(e), None),
            };
            match r {
                Ok(copied) => done.lock().unwrap_or_else(|p| p.into_inner()).push(copied),
                Err(e) => {
                    let what = match &task {
                        Task::Put { src, .. } => src.display().to_string(),
                        Task::Get { src, .. } => String::from_utf8_lossy(src).into_owned(),
                    };
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!("{what}: {e:#}"));
                    // A stream that failed half-way is out of step.
                    conn = None;
                    continue;
                }
            }
            conn = c;
        }
    };
    std::thread::scope(|s| {
        for _ in 1..jobs.clamp(1, n.max(1)) {
            s.spawn(|| work(None));
        }
        work(Some(first));
    });
    (
        done.into_inner().unwrap_or_default(),
        failed.into_inner().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_split_like_scp() {
        let r = |s: &str, p: &str| Place::Remote {
            server: s.into(),
            path: p.into(),
        };
        assert_eq!(Place::parse("tls://h:4433:/d/"), r("tls://h:4433", "/d/"));
        assert_eq!(Place::parse("h:4433:/f"), r("h:4433", "/f"));
        assert_eq!(
            Place::parse("tls://[::1]:7:/a:/b"),
            r("tls://[::1]:7", "/a:/b")
        );
        assert_eq!(Place::parse("ws://h:80/t:/x"), r("ws://h:80/t", "/x"));
        assert_eq!(Place::parse("dir:///mnt/s:/x"), r("dir:///mnt/s", "/x"));
        assert_eq!(Place::parse("./a:/b"), Place::Local("./a:/b".into()));
        assert_eq!(Place::parse("/tmp/x"), Place::Local("/tmp/x".into()));
        assert_eq!(Place::parse("file.iso"), Place::Local("file.iso".into()));
        // scp's habit: HOST:PORT:PATH.
        assert_eq!(Place::parse("h:7000:incoming/"), r("h:7000", "/incoming/"));
        assert_eq!(Place::parse("tls://h:7000:in"), r("tls://h:7000", "/in"));
        assert_eq!(Place::parse("a:b:c"), Place::Local("a:b:c".into()));
    }

    #[test]
    fn remote_paths_are_relative_and_checked() {
        assert_eq!(rel("/a//b/").unwrap(), b"a/b");
        assert_eq!(rel("/").unwrap(), b"");
        assert!(rel("/a/../../etc").is_err());
    }
}
