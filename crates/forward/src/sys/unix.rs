//! Unix: the control socket's folder and socket (only our user may reach
//! them), and the host's name.

use std::io;
use std::path::{Path, PathBuf};

use super::sockets;

use tokio::net::{UnixListener, UnixStream};

/// Where control sockets live: `/run/longhaul` for root, else
/// `$XDG_RUNTIME_DIR/longhaul`, else `/tmp/longhaul-UID`.
pub fn default_dir() -> PathBuf {
    let uid = rustix::process::getuid();
    if uid.is_root() {
        return PathBuf::from("/run/longhaul");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("longhaul"),
        None => PathBuf::from(format!("/tmp/longhaul-{}", uid.as_raw())),
    }
}

/// Makes `dir` (0700) if it is missing, and checks that it is ours alone.
/// In a shared place like /tmp another user may have made it first, to
/// reach or replace our sockets: see [`check_private`].
pub fn make_private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    // mkdir(2) never follows a symlink in the last component: one that is
    // there already makes it fail, and the check below refuses it.
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    check_private(dir)
}

/// Whether `dir` is a folder (not a symlink to one) owned by our user,
/// with no access for group or others; otherwise one line saying why not.
pub fn check_private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("refusing {} for control sockets: {why}", dir.display()),
        ))
    };
    let m = std::fs::symlink_metadata(dir)?;
    let me = rustix::process::geteuid().as_raw();
    if m.file_type().is_symlink() {
        return refuse("it is a symbolic link (remove it)".into());
    }
    if !m.is_dir() {
        return refuse("it is not a directory (remove it)".into());
    }
    if m.uid() != me {
        return refuse(format!(
            "it belongs to uid {}, not to us (uid {me}): another user made it first (remove it, or pass --control PATH)",
            m.uid()
        ));
    }
    if m.mode() & 0o077 != 0 {
        return refuse(format!(
            "its mode {:04o} lets other users in (chmod 700 it)",
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// A control socket, listening.
pub struct ControlListener(UnixListener);

/// One asker's connection.
pub type ControlStream = UnixStream;

impl ControlListener {
    /// Binds `path`. The default folder (`default`) must be ours alone
    /// ([`make_private`]); a folder named with `--control` is the user's
    /// choice, made 0700 if it is missing.
    pub fn bind(path: &Path, default: &Path) -> io::Result<ControlListener> {
        use std::os::unix::fs::DirBuilderExt;
        match path.parent() {
            Some(dir) if dir == default => make_private(dir)?,
            Some(dir) => std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?,
            None => {}
        }
        // A socket file left by a process that is gone is replaced; one
        // that answers is not.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is in use by another process", path.display()),
            ));
        }
        let _ = std::fs::remove_file(path);
        if let Some(dir) = path.parent() {
            // Sockets of processes that ended without removing them
            // (killed): `ROLE-PID.sock` whose PID is gone.
            for stale in sockets(dir) {
                let pid = stale
                    .file_stem()
                    .and_then(|s| s.to_str()?.rsplit('-').next()?.parse::<u32>().ok());
                if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                    let _ = std::fs::remove_file(stale);
                }
            }
        }
        let listener = UnixListener::bind(path)?;
        only_ours(path)?;
        Ok(ControlListener(listener))
    }

    pub async fn accept(&self) -> io::Result<ControlStream> {
        Ok(self.0.accept().await?.0)
    }
}

pub async fn connect(path: &Path) -> io::Result<ControlStream> {
    UnixStream::connect(path).await
}

/// Makes the socket we just bound 0600 without following a symlink that
/// another user put in its place (if they can write the folder).
#[cfg(target_os = "linux")]
fn only_ours(path: &Path) -> io::Result<()> {
    use rustix::fs::{FileType, Mode, OFlags};
    use std::os::unix::fs::PermissionsExt;
    let fd = rustix::fs::open(
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) != FileType::Socket {
        return Err(io::Error::other(format!(
            "{} was replaced by something other than our socket",
            path.display()
        )));
    }
    // An O_PATH descriptor cannot be fchmod'ed; its /proc link names the
    // very file it holds.
    let by_fd = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    std::fs::set_permissions(by_fd, std::fs::Permissions::from_mode(0o600))
}

/// Without Linux's O_PATH the socket keeps the mode the umask gave it: the
/// folder (0700, checked) is what keeps other users out.
#[cfg(not(target_os = "linux"))]
fn only_ours(path: &Path) -> io::Result<()> {
    if !std::os::unix::fs::FileTypeExt::is_socket(&std::fs::symlink_metadata(path)?.file_type()) {
        return Err(io::Error::other(format!(
            "{} was replaced by something other than our socket",
            path.display()
        )));
    }
    Ok(())
}

/// This machine's host name.
pub fn host_name() -> Option<String> {
    rustix::system::uname()
        .nodename()
        .to_str()
        .ok()
        .map(str::to_owned)
}
