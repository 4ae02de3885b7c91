//! Windows: the control channel is a named pipe whose access list admits
//! only the user, SYSTEM and Administrators (as the Unix socket's 0600),
//! that refuses remote clients, and whose first instance must be ours (a
//! name another user took first is refused, not shared). Its "path" is a
//! marker file in `%LOCALAPPDATA%\longhaul` (`ROLE-PID.sock`, listed by
//! `status`) naming the pipe `\\.\pipe\longhaul-` + that path; a path that
//! is itself `\\.\pipe\…` is the pipe. The host's name from the
//! environment.

use std::io;
use std::path::{Path, PathBuf};

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

/// The control channels' marker files in `dir`.
pub fn sockets(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
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
            std::fs::write(path, name.as_bytes())?;
        }
        Ok(ControlListener {
            name,
            next: tokio::sync::Mutex::new(first),
        })
    }

    pub async fn accept(&self) -> io::Result<ControlStream> {
        let mut next = self.next.lock().await;
        next.connect().await?;
        // The next asker's instance before this one is handed over.
        let fresh = owner_only::create(&self.name, false)?;
        Ok(ControlStream::Server(std::mem::replace(&mut *next, fresh)))
    }
}

pub async fn connect(path: &Path) -> io::Result<ControlStream> {
    let name = pipe_name(path)?;
    // All instances busy: wait a little, as the system's clients do.
    for _ in 0..50 {
        match ClientOptions::new().open(&name) {
            Err(e) if e.raw_os_error() == Some(231) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            r => return r.map(ControlStream::Client),
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

/// The system calls for a pipe whose access list is the user's own: the
/// user's SID from the process token, a security descriptor from SDDL
/// (`D:P`: protected, so nothing is inherited), and the pipe made with it.
mod owner_only {
    use std::io;
    use std::ptr::null_mut;

    use tokio::net::windows::named_pipe::{NamedPipeServer, ServerOptions};
    use windows_sys::Win32::Foundation::{CloseHandle, LocalFree, HANDLE};
    use windows_sys::Win32::Security::Authorization::{
        ConvertSidToStringSidW, ConvertStringSecurityDescriptorToSecurityDescriptorW,
        SDDL_REVISION_1,
    };
    use windows_sys::Win32::Security::{
        GetTokenInformation, TokenUser, PSECURITY_DESCRIPTOR, SECURITY_ATTRIBUTES, TOKEN_QUERY,
        TOKEN_USER,
    };
    use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

    /// Makes an instance of pipe `name`; `first`: it must be the first.
    pub(super) fn create(name: &str, first: bool) -> io::Result<NamedPipeServer> {
        let sddl = format!("D:P(A;;GA;;;SY)(A;;GA;;;BA)(A;;GA;;;{})\0", user_sid()?);
        let sddl: Vec<u16> = sddl.encode_utf16().collect();
        let mut sd: PSECURITY_DESCRIPTOR = null_mut();
        // SAFETY: `sddl` is NUL-terminated UTF-16 that outlives the call;
        // `sd` receives a descriptor the system allocated (freed below).
        let ok = unsafe {
            ConvertStringSecurityDescriptorToSecurityDescriptorW(
                sddl.as_ptr(),
                SDDL_REVISION_1,
                &mut sd,
                null_mut(),
            )
        };
        if ok == 0 {
            return Err(io::Error::last_os_error());
        }
        let mut attrs = SECURITY_ATTRIBUTES {
            nLength: std::mem::size_of::<SECURITY_ATTRIBUTES>() as u32,
            lpSecurityDescriptor: sd,
            bInheritHandle: 0,
        };
        let mut options = ServerOptions::new();
        options
            .first_pipe_instance(first)
            .reject_remote_clients(true);
        // SAFETY: `attrs` points at the descriptor made above, both alive
        // for the call, which copies what it needs.
        let made = unsafe {
            options.create_with_security_attributes_raw(
                name,
                (&mut attrs as *mut SECURITY_ATTRIBUTES).cast(),
            )
        };
        // SAFETY: allocated by the conversion above, used by no one now.
        unsafe { LocalFree(sd) };
        made
    }

    /// This process's user, as an SDDL SID string (`S-1-5-21-…`).
    fn user_sid() -> io::Result<String> {
        let mut token: HANDLE = null_mut();
        // SAFETY: the current-process pseudo handle; `token` receives a
        // handle closed below.
        if unsafe { OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &mut token) } == 0 {
            return Err(io::Error::last_os_error());
        }
        // TOKEN_USER and the SID it points into, in one buffer (u64s:
        // aligned for the struct).
        let mut buf = vec![0u64; 64];
        let mut len = 0u32;
        // SAFETY: `buf` holds `buf.len() * 8` writable bytes.
        let ok = unsafe {
            GetTokenInformation(
                token,
                TokenUser,
                buf.as_mut_ptr().cast(),
                (buf.len() * 8) as u32,
                &mut len,
            )
        };
        let err = io::Error::last_os_error();
        // SAFETY: opened above, closed once.
        unsafe { CloseHandle(token) };
        if ok == 0 {
            return Err(err);
        }
        // SAFETY: the call filled `buf` with a TOKEN_USER.
        let sid = unsafe { (*(buf.as_ptr() as *const TOKEN_USER)).User.Sid };
        let mut text: *mut u16 = null_mut();
        // SAFETY: `sid` points into `buf`, alive here; `text` receives a
        // string the system allocated (freed below).
        if unsafe { ConvertSidToStringSidW(sid, &mut text) } == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a NUL-terminated UTF-16 string from the call above.
        let s = unsafe {
            let n = (0..).take_while(|&i| *text.add(i) != 0).count();
            String::from_utf16_lossy(std::slice::from_raw_parts(text, n))
        };
        // SAFETY: allocated by the conversion, not used after this.
        unsafe { LocalFree(text.cast()) };
        Ok(s)
    }
}
