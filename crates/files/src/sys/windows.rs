//! Windows: a folder is a `cap_std::fs::Dir`, which resolves every path
//! beneath it itself (one component at a time through held handles,
//! links followed only while they stay beneath, `..` and absolute or
//! drive-relative paths refused). A name is UTF-8 and passes
//! [`name_refusal`] before it reaches the system: no `\`, no `:` (an
//! alternate data stream), no device name (`CON`, `NUL`, `COM1`…), no
//! trailing dot or space (which Windows drops, making two names one), no
//! 8.3 short name (`PROGRA~1`: another name for a file beside it). A link
//! or junction is opened as itself where a name must not be followed.
//! There are no FIFOs or devices in a folder and no permission bits (a
//! file without write bits is made read-only); owners are read from open
//! handles (a folder or partial file another user made is refused), but a
//! folder's access list is inherited, not narrowed as Unix's 0700 is.

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::windows::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_primitives::fs::_WindowsByHandle;
use cap_std::ambient_authority;

use super::{FileKind, Stat, Why};

/// A folder held open.
#[derive(Debug)]
pub struct Dir(cap_std::fs::Dir);

/// `FILE_FLAG_OPEN_REPARSE_POINT`: a link or junction opened as itself.
const OPEN_REPARSE_POINT: u32 = 0x0020_0000;

/// Seconds since the epoch of a Windows file time (100 ns since 1601).
fn unix_seconds(filetime: u64) -> i64 {
    (filetime / 10_000_000) as i64 - 11_644_473_600
}

fn kind(t: cap_std::fs::FileType) -> FileKind {
    if t.is_symlink() {
        FileKind::Link
    } else if t.is_dir() {
        FileKind::Dir
    } else if t.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

fn stat_of(m: &cap_std::fs::Metadata) -> Stat {
    let readonly = m.permissions().readonly();
    let modified = m
        .modified()
        .ok()
        .and_then(|t| t.into_std().duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs() as i64);
    Stat {
        kind: kind(m.file_type()),
        size: m.len(),
        mtime: modified,
        // Known only through a handle ([`owned`]).
        mine: false,
        system: false,
        owner: 0,
        mode: if readonly { 0o444 } else { 0o644 },
        links: _WindowsByHandle::number_of_links(m).map_or(1, u64::from),
        id: (
            _WindowsByHandle::volume_serial_number(m).map_or(0, u64::from),
            _WindowsByHandle::file_index(m).unwrap_or(0),
        ),
    }
}

fn utf8(name: &[u8]) -> io::Result<&str> {
    std::str::from_utf8(name).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a name that is not UTF-8 cannot be written here",
        )
    })
}

fn std_file(f: cap_std::fs::File) -> File {
    f.into_std()
}

impl Dir {
    /// A folder the user named, following links as the shell would.
    /// Only a folder on a drive letter: for a share (`\\host\share`, a
    /// mapped network drive) or a volume without a letter, cap-std's calls
    /// that work by path (make, remove, rename, list) would act relative
    /// to the current folder instead (cap-std issue 348), so those are
    /// refused in one line.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let dir = cap_std::fs::Dir::open_ambient_dir(path, ambient_authority())?;
        let real = std::fs::canonicalize(path)?;
        let b = real.as_os_str().as_encoded_bytes();
        let on_drive = b.len() >= 7
            && b.starts_with(br"\\?\")
            && b[4].is_ascii_alphabetic()
            && &b[5..7] == br":\";
        if !on_drive {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: a share or a volume without a drive letter ({}) is not served or written by the file service yet; use a folder on a local drive",
                    path.display(),
                    real.display()
                ),
            ));
        }
        Ok(Dir(dir))
    }

    /// cap-std resolves beneath on every Windows.
    pub fn require_beneath(&self) -> io::Result<()> {
        Ok(())
    }

    pub fn reopen(&self) -> io::Result<Dir> {
        self.0.try_clone().map(Dir)
    }

    pub fn dir_beneath(&self, rel: &Path) -> io::Result<Dir> {
        self.0.open_dir(rel).map(Dir)
    }

    /// Through no link: each component opened without following one.
    pub fn dir_beneath_nofollow(&self, rel: &Path) -> io::Result<Dir> {
        let mut at = self.reopen()?;
        for c in rel.components() {
            at = Dir(at.0.open_dir_nofollow(c.as_os_str())?);
        }
        Ok(at)
    }

    pub fn stat_beneath(&self, rel: &Path) -> io::Result<Stat> {
        self.0.metadata(rel).map(|m| stat_of(&m))
    }

    pub fn file_beneath(&self, rel: &Path) -> io::Result<File> {
        self.0.open(rel).map(std_file)
    }

    pub fn make_dir(&self, name: &[u8]) -> io::Result<()> {
        match self.0.create_dir(utf8(name)?) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            r => r,
        }
    }

    pub fn subdir(&self, name: &[u8]) -> io::Result<Dir> {
        self.0.open_dir_nofollow(utf8(name)?).map(Dir)
    }

    /// Through a link only while it stays beneath this folder (cap-std
    /// holds no path to follow one elsewhere).
    pub fn subdir_following(&self, name: &[u8]) -> io::Result<Dir> {
        self.0.open_dir(utf8(name)?).map(Dir)
    }

    pub fn stat_at(&self, name: &[u8]) -> io::Result<Stat> {
        self.0.symlink_metadata(utf8(name)?).map(|m| stat_of(&m))
    }

    pub fn stat(&self) -> io::Result<Stat> {
        let mut st = stat_of(&self.0.dir_metadata()?);
        owned(&mut st, &self.0)?;
        Ok(st)
    }

    pub fn entries(&self) -> io::Result<Entries> {
        Ok(Entries(self.0.entries()?))
    }

    pub fn remove_file(&self, name: &[u8]) -> io::Result<()> {
        self.0.remove_file(utf8(name)?)
    }

    pub fn remove_dir(&self, name: &[u8]) -> io::Result<()> {
        self.0.remove_dir(utf8(name)?)
    }

    pub fn rename(&self, name: &[u8], to: &Dir, to_name: &[u8]) -> io::Result<()> {
        self.0.rename(utf8(name)?, &to.0, utf8(to_name)?)
    }

    /// Access lists are inherited: nothing to narrow here.
    pub fn make_private(&self) -> io::Result<()> {
        Ok(())
    }

    pub fn open_file_at(&self, name: &[u8]) -> io::Result<File> {
        let mut o = cap_std::fs::OpenOptions::new();
        o.read(true).follow(FollowSymlinks::No);
        self.0.open_with(utf8(name)?, &o).map(std_file)
    }

    pub fn open_part(&self, name: &[u8]) -> io::Result<File> {
        let mut o = cap_std::fs::OpenOptions::new();
        o.read(true)
            .write(true)
            .create(true)
            .follow(FollowSymlinks::No);
        self.0.open_with(utf8(name)?, &o).map(std_file)
    }
}

/// A folder's names, read as they are asked for; a name that is not
/// UTF-8 (a lone surrogate), ends in a dot or a space or is a device's
/// (made through `\\?\`: the calls by path would take `a.` for `a`, `CON`
/// for the console) is left out. Other names [`name_refusal`] refuses are
/// listed, and refused when asked for.
pub struct Entries(cap_std::fs::ReadDir);

impl Iterator for Entries {
    type Item = io::Result<Vec<u8>>;

    fn next(&mut self) -> Option<io::Result<Vec<u8>>> {
        loop {
            return match self.0.next()? {
                // A name Windows would rewrite (`a.` is `a` to the calls
                // that take paths) could act on another: left out.
                Ok(e) => match e.file_name().into_string() {
                    Ok(name) if !rewritten(&name) => Some(Ok(name.into_bytes())),
                    _ => continue,
                },
                Err(e) => Some(Err(e)),
            };
        }
    }
}

/// A name as bytes (UTF-8; None for a name that is not).
pub fn name_bytes(name: &OsStr) -> Option<&[u8]> {
    name.to_str().map(str::as_bytes)
}

/// Bytes as a name (a checked name is UTF-8; anything else is shown with
/// replacement characters, and opened as nothing that exists).
pub fn name_os(name: &[u8]) -> Cow<'_, OsStr> {
    Cow::Owned(OsString::from(String::from_utf8_lossy(name).into_owned()))
}

/// A drive (`C:`, `C:\…`, `C:/…`) or a share or device path (`\\…`) is
/// local, never a server named `C`.
pub fn is_local_spelling(s: &str) -> bool {
    let b = s.as_bytes();
    s.starts_with('\\')
        || (b.len() >= 2
            && b[0].is_ascii_alphabetic()
            && b[1] == b':'
            && matches!(b.get(2), None | Some(b'/' | b'\\')))
}

/// A device's name (`CON`, `nul.txt`, `COM1`, `LPT²`…): Windows opens the
/// device for it in every folder.
fn device(name: &str) -> bool {
    let stem = name
        .split('.')
        .next()
        .unwrap_or("")
        .trim_end()
        .to_ascii_uppercase();
    matches!(
        stem.as_str(),
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$"
    ) || (stem.len() == 4
        && (stem.starts_with("COM") || stem.starts_with("LPT"))
        && stem[3..]
            .chars()
            .all(|c| c.is_ascii_digit() || "¹²³".contains(c)))
        || ((stem.starts_with("COM") || stem.starts_with("LPT"))
            && ["¹", "²", "³"].contains(&&stem[3..]))
}

/// A name on disk the calls by path would take for another (`a.` for
/// `a`) or for a device.
fn rewritten(name: &str) -> bool {
    name.ends_with(['.', ' ']) || device(name)
}

/// Why a name cannot be used on Windows, if it cannot.
pub fn name_refusal(name: &[u8]) -> Option<&'static str> {
    let Ok(name) = std::str::from_utf8(name) else {
        return Some("a name that is not UTF-8 is refused here");
    };
    if name.contains(['\\', ':', '<', '>', '"', '|', '?', '*']) || name.contains(|c: char| c < ' ')
    {
        return Some("\\ : < > \" | ? * and control characters are refused in names (Windows: ':' names a data stream)");
    }
    if name.ends_with(['.', ' ']) {
        return Some("a name ending in a dot or a space is refused (Windows drops them)");
    }
    if device(name) {
        return Some("device names (CON, NUL, COM1…) are refused");
    }
    let ntfs = [
        "$MFT", "$MFTMIRR", "$LOGFILE", "$VOLUME", "$ATTRDEF", "$BITMAP", "$BOOT", "$BADCLUS",
        "$SECURE", "$UPCASE", "$EXTEND", "$QUOTA", "$OBJID", "$REPARSE",
    ];
    if ntfs.contains(&name.to_ascii_uppercase().as_str()) {
        return Some("NTFS metadata names ($MFT, $Extend…) are refused");
    }
    // An 8.3 short name: at most 8 characters with `~` and digits, then
    // an extension of at most 3.
    let (base, ext) = name.split_once('.').unwrap_or((name, ""));
    if let Some((_, digits)) = base.rsplit_once('~') {
        if base.len() <= 8
            && ext.len() <= 3
            && !digits.is_empty()
            && digits.chars().all(|c| c.is_ascii_digit())
        {
            return Some(
                "8.3 short names (NAME~1) are refused: they are other names for files beside them",
            );
        }
    }
    None
}

pub fn why(e: &io::Error) -> Why {
    // ERROR_DIRECTORY, ERROR_STOPPED_ON_SYMLINK, ERROR_CANT_ACCESS_FILE
    // (a reparse point opened as itself), ERROR_TOO_MANY_LINKS.
    match (e.kind(), e.raw_os_error()) {
        (io::ErrorKind::NotFound, _) => Why::NotFound,
        (io::ErrorKind::AlreadyExists, _) => Why::Exists,
        (io::ErrorKind::NotADirectory, _) => Why::LinkOrNotDir,
        (_, Some(267 | 681 | 1920 | 1142)) => Why::LinkOrNotDir,
        (io::ErrorKind::PermissionDenied, None) if e.to_string().contains("outside") => {
            Why::Escapes
        }
        _ => Why::Other,
    }
}

pub fn file_stat(f: &File) -> io::Result<Stat> {
    let mut st = stat_of(&cap_primitives::fs::Metadata::from_file(f)?);
    owned(&mut st, f)?;
    Ok(st)
}

/// Who owns what `h` is open on (a name's metadata alone does not say:
/// only what is looked at through a handle has its owner checked).
fn owned(st: &mut Stat, h: &impl std::os::windows::io::AsRawHandle) -> io::Result<()> {
    let o = longhaul_carrier::private::owner_of(h)?;
    st.mine = o.mine;
    st.system = o.system;
    Ok(())
}

/// std's lock (`LockFileEx`): held until the file is closed.
pub fn try_lock(f: &File) -> bool {
    f.try_lock().is_ok()
}

/// No permission bits: a file without write bits is made read-only.
pub fn set_mode(f: &File, mode: u32) -> io::Result<()> {
    let mut p = f.metadata()?.permissions();
    p.set_readonly(mode & 0o222 == 0);
    f.set_permissions(p)
}

pub fn read_spare(f: &File, buf: &mut Vec<u8>, at: u64) -> io::Result<usize> {
    let start = buf.len();
    buf.resize(buf.capacity(), 0);
    let r = f.seek_read(&mut buf[start..], at);
    let n = *r.as_ref().unwrap_or(&0);
    buf.truncate(start + n);
    r
}

pub fn write_all_at(f: &File, mut buf: &[u8], mut at: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match f.seek_write(buf, at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub fn read_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    f.seek_read(buf, at)
}

/// The last write and creation times (Windows keeps no status change).
pub fn change_marks(m: &std::fs::Metadata) -> (u64, (i64, i64), (i64, i64)) {
    let (w, c) = (m.last_write_time(), m.creation_time());
    (
        0,
        (unix_seconds(w), (w % 10_000_000) as i64),
        (unix_seconds(c), (c % 10_000_000) as i64),
    )
}

pub fn open_source(path: &Path, nofollow: bool) -> io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    if nofollow {
        o.custom_flags(OPEN_REPARSE_POINT);
    }
    let f = o.open(path)?;
    if nofollow && f.metadata()?.file_attributes() & 0x400 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a link or junction: not sent",
        ));
    }
    Ok(f)
}

/// No umask: nothing to take away.
pub fn umask() -> u32 {
    0
}

/// Open files are not a per-process limit here.
pub fn open_files_limit() -> Option<u64> {
    None
}

pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    Err(io::ErrorKind::Unsupported.into())
}
