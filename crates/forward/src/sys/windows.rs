//! Windows: the control channel is a named pipe whose access list admits
//! only the user, SYSTEM and Administrators (as the Unix socket's 0600),
//! that refuses remote clients, and whose first instance must be ours (a
//! name another user took first is refused, not shared). Its "path" is a
//! marker file in `%LOCALAPPDATA%\longhaul` (`ROLE-PID.sock`, listed by
//! `status`) naming the pipe `\\.\pipe\longhaul-` + that path and the
//! serving process (an asker checks the pipe's server is that process); a
//! path that is itself `\\.\pipe\…` is the pipe. The host's name from the
//! environment.

use std::io;
use std::path::{Path, PathBuf};

use super::sockets;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::windows::named_pipe::{ClientOptions, NamedPipeClient, NamedPipeServer};

/// Under the user's local application data.
pub fn default_dir() -> PathBuf {
    std::env::var_os("LOCALAPPDATA")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("longhaul")
}

/// A folder under the user's profile inherits its access list; the marker
/// files in it name pipes, and the pipes carry their own.
pub fn make_private(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)
}

pub fn check_private(_: &Path) -> io::Result<()> {
    Ok(())
}

/// The pipe a control path names (at most 256 characters, Windows' limit).
fn pipe_name(path: &Path) -> io::Result<String> {
    let text = path.to_string_lossy();
    let name = match text.strip_prefix(r"\\.\pipe\") {
        Some(_) => text.into_owned(),
        // A pipe's name may not hold a backslash after its prefix.
        None => format!(r"\\.\pipe\longhaul-{}", text.replace('\\', "/")),
    };
    if name.encode_utf16().count() > 256 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: too long for a pipe name (give a shorter --control path)",
                path.display()
            ),
        ));
    }
    Ok(name)
}

/// The PID a marker names (its second line; the first is the pipe's name).
fn marker_pid(path: &Path) -> io::Result<u32> {
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(std::fs::File::open(path)?, 1024),
        &mut text,
    )?;
    text.lines()
        .nth(1)
        .and_then(|pid| pid.trim().parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not a longhaul control marker", path.display()),
            )
        })
}

fn is_pipe(path: &Path) -> bool {
    path.to_string_lossy().starts_with(r"\\.\pipe\")
}

/// A control pipe, listening: the instance waiting for the next asker.
pub struct ControlListener {
    name: String,
    next: tokio::sync::Mutex<NamedPipeServer>,
}

/// One asker's connection (either end of a pipe).
pub enum ControlStream {
    Server(NamedPipeServer),
    Client(NamedPipeClient),
}

impl ControlListener {
    pub fn bind(path: &Path, _default: &Path) -> io::Result<ControlListener> {
        let name = pipe_name(path)?;
        let first = owner_only::create(&name, true).map_err(|e| match e.raw_os_error() {
            // ERROR_ACCESS_DENIED: the name exists, and is not ours to add to.
            Some(5) => io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{name} is in use by another process"),
            ),
            _ => e,
        })?;
        if !is_pipe(path) {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
                // Markers of processes that ended without removing them.
                for stale in sockets(dir) {
                    if let Ok(n) = pipe_name(&stale) {
                        if ClientOptions::new().open(&n).err().map(|e| e.kind())
                            == Some(io::ErrorKind::NotFound)
                        {
                            let _ = std::fs::remove_file(stale);
                        }
                    }
                }
            }
            std::fs::write(path, format!("{name}\n{}\n", std::process::id()))?;
        }
        Ok(ControlListener {
            name,
            next: tokio::sync::Mutex::new(first),
        })
    }

    pub async fn accept(&self) -> io::Result<ControlStream> {
        let mut next = self.next.lock().await;
        let connected = next.connect().await;
        // The next asker's instance before this one is handed over. An
        // instance whose connect failed (an asker that closed first:
        // ERROR_NO_DATA) cannot be used again: it is replaced too.
        let fresh = owner_only::create(&self.name, false)?;
        let this = std::mem::replace(&mut *next, fresh);
        connected?;
        Ok(ControlStream::Server(this))
    }
}

/// Opens the pipe a control path names. Through a marker (`ROLE-PID.sock`)
/// the pipe must be served by that PID: a marker left by a process that
/// ended names a pipe anyone could create since, and its answer is not
/// asked for.
pub async fn connect(path: &Path) -> io::Result<ControlStream> {
    let name = pipe_name(path)?;
    let marked = match is_pipe(path) {
        true => None,
        false => Some(marker_pid(path)?),
    };
    // All instances busy: wait a little, as the system's clients do.
    for _ in 0..50 {
        match ClientOptions::new().open(&name) {
            Err(e) if e.raw_os_error() == Some(231) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            Err(e) => return Err(e),
            Ok(pipe) => {
                let server = longhaul_carrier::private::pipe_server_pid(&pipe)?;
                if marked.is_some_and(|pid| pid != server) {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "{name} is served by process {server}, not the one its marker names: not asked"
                        ),
                    ));
                }
                return Ok(ControlStream::Client(pipe));
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{name}: busy"),
    ))
}

impl AsyncRead for ControlStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            ControlStream::Server(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            ControlStream::Client(c) => std::pin::Pin::new(c).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ControlStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut() {
            ControlStream::Server(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            ControlStream::Client(c) => std::pin::Pin::new(c).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            ControlStream::Server(s) => std::pin::Pin::new(s).poll_flush(cx),
            ControlStream::Client(c) => std::pin::Pin::new(c).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            ControlStream::Server(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            ControlStream::Client(c) => std::pin::Pin::new(c).poll_shutdown(cx),
        }
    }
}

pub fn host_name() -> Option<String> {
    std::env::var("COMPUTERNAME").ok()
}

/// A pipe instance with the owner-only access list (carrier's
/// [`longhaul_carrier::private`]).
mod owner_only {
    use std::io;

    use longhaul_carrier::private::SecurityAttributes;
    use tokio::net::windows::named_pipe::{NamedPipeServer, ServerOptions};

    /// Makes an instance of pipe `name`; `first`: it must be the first.
    pub(super) fn create(name: &str, first: bool) -> io::Result<NamedPipeServer> {
        let mut attrs = SecurityAttributes::owner_only()?;
        let mut options = ServerOptions::new();
        options
            .first_pipe_instance(first)
            .reject_remote_clients(true);
        // SAFETY: `attrs` holds the descriptor and lives through the call,
        // which copies what it needs.
        unsafe { options.create_with_security_attributes_raw(name, attrs.as_ptr()) }
    }
}
