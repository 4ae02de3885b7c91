//! Windows: the control channel (`status`, `reload`) is not built yet — a
//! named pipe whose access list admits only the user is the plan — and
//! says so in one line; the host's name from the environment.

use std::convert::Infallible;
use std::io;
use std::path::{Path, PathBuf};

const NOT_BUILT: &str =
    "the control channel (status, reload) is not built for Windows yet: use --metrics";

/// Under the user's local application data.
pub fn default_dir() -> PathBuf {
    std::env::var_os("LOCALAPPDATA")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("longhaul")
}

pub fn make_private(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)
}

/// A folder under the user's profile inherits its access list.
pub fn check_private(_: &Path) -> io::Result<()> {
    Ok(())
}

/// No control sockets here yet.
pub fn sockets(_: &Path) -> Vec<PathBuf> {
    Vec::new()
}

pub struct ControlListener(Infallible);

pub type ControlStream = tokio::io::DuplexStream;

impl ControlListener {
    pub fn bind(_: &Path, _: &Path) -> io::Result<ControlListener> {
        Err(io::Error::new(io::ErrorKind::Unsupported, NOT_BUILT))
    }

    pub async fn accept(&self) -> io::Result<ControlStream> {
        match self.0 {}
    }
}

pub async fn connect(_: &Path) -> io::Result<ControlStream> {
    Err(io::Error::new(io::ErrorKind::Unsupported, NOT_BUILT))
}

pub fn host_name() -> Option<String> {
    std::env::var("COMPUTERNAME").ok()
}
