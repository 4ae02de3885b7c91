//! Windows: `SIO_TCP_INFO` for the path (no SO_MEMINFO or
//! TCP_NOTSENT_LOWAT equivalents: the send queue is the kernel's), `WSAPoll`
//! for the level check, one `recvfrom` per datagram, positional file I/O
//! through `seek_read`/`seek_write`, and `cmd /C` behind `cmd://`.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::windows::fs::{FileExt, OpenOptionsExt};
use std::os::windows::io::AsRawSocket;
use std::path::Path;
use std::time::Duration;

use windows_sys::Win32::Networking::WinSock;

use super::{SendSpace, TcpPath};

pub use super::fallback::recv_batch;

/// `TCP_INFO_v0` as the system writes it (`TimestampsEnabled` a byte:
/// read as an integer, never as a Rust `bool`).
#[repr(C)]
#[derive(Default)]
struct TcpInfoV0 {
    state: i32,
    mss: u32,
    connection_time_ms: u64,
    timestamps_enabled: u8,
    rtt_us: u32,
    min_rtt_us: u32,
    bytes_in_flight: u32,
    cwnd: u32,
    snd_wnd: u32,
    rcv_wnd: u32,
    rcv_buf: u32,
    bytes_out: u64,
    bytes_in: u64,
    bytes_reordered: u32,
    bytes_retrans: u32,
    fast_retrans: u32,
    dup_acks_in: u32,
    timeout_episodes: u32,
    syn_retrans: u8,
}

/// `SIO_TCP_INFO` (Windows 10 1703 and later): the RTT, the congestion
/// window, bytes retransmitted. No delivery rate, unsent bytes or RTO:
/// the rate is estimated as one window per RTT, the others are unknown.
pub fn tcp_path(sock: &socket2::Socket) -> Option<TcpPath> {
    let version: u32 = 0;
    let mut info = TcpInfoV0::default();
    let mut returned = 0u32;
    // SAFETY: in and out buffers of the sizes given, alive for the call;
    // no overlapped I/O. The struct is plain integers: any bytes the
    // system writes are a valid value.
    let rc = unsafe {
        WinSock::WSAIoctl(
            sock.as_raw_socket() as usize,
            WinSock::SIO_TCP_INFO,
            (&version as *const u32).cast(),
            4,
            (&mut info as *mut TcpInfoV0).cast(),
            std::mem::size_of::<TcpInfoV0>() as u32,
            &mut returned,
            std::ptr::null_mut(),
            None,
        )
    };
    // At least up to the congestion window (36 bytes).
    if rc != 0 || returned < 36 {
        return None;
    }
    Some(TcpPath::by_window(
        Duration::from_micros(info.rtt_us.into()),
        Duration::ZERO,
        info.cwnd.into(),
        info.bytes_retrans / info.mss.max(1),
    ))
}

pub fn set_notsent_lowat(_: &socket2::Socket, _: u32) -> io::Result<()> {
    // Nothing to set: the kernel's queue stays first come, first served,
    // which costs latency, not correctness.
    Ok(())
}

pub fn notsent_lowat(_: &socket2::Socket) -> Option<u32> {
    None
}

pub fn send_space(_: &socket2::Socket) -> Option<SendSpace> {
    None
}

pub fn poll_writable(sock: &socket2::Socket) -> io::Result<bool> {
    let mut fds = [WinSock::WSAPOLLFD {
        fd: sock.as_raw_socket() as WinSock::SOCKET,
        events: WinSock::POLLWRNORM,
        revents: 0,
    }];
    // SAFETY: `fds` is a valid array of one WSAPOLLFD that outlives the
    // call; a zero timeout never blocks.
    let rc = unsafe { WinSock::WSAPoll(fds.as_mut_ptr(), 1, 0) };
    if rc < 0 {
        return Err(last_socket_error());
    }
    // An error or hang-up counts as writable: the next write reports it.
    let ready = WinSock::POLLWRNORM | WinSock::POLLERR | WinSock::POLLHUP;
    Ok(fds[0].revents & ready != 0)
}

/// Kernel keepalive: a probe after `idle` without traffic, then every
/// `interval` (SIO_KEEPALIVE_VALS); Windows fixes the number of probes.
pub fn set_keepalive(
    sock: &socket2::Socket,
    idle: std::time::Duration,
    interval: std::time::Duration,
    _retries: u32,
) -> io::Result<()> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval);
    sock.set_tcp_keepalive(&ka)
}

/// TCP_MAXRT: the connection is aborted when a retransmission goes
/// unanswered this long (whole seconds).
pub fn set_user_timeout(sock: &socket2::Socket, d: std::time::Duration) -> io::Result<()> {
    let secs: u32 = d.as_secs().clamp(1, u32::MAX as u64) as u32;
    // SAFETY: passes a live u32 and its size; the call only reads it.
    let rc = unsafe {
        WinSock::setsockopt(
            sock.as_raw_socket() as WinSock::SOCKET,
            WinSock::IPPROTO_TCP,
            WinSock::TCP_MAXRT,
            (&secs as *const u32).cast(),
            std::mem::size_of::<u32>() as i32,
        )
    };
    match rc {
        0 => Ok(()),
        // Systems without it (Wine) keep their own retransmission limit.
        _ => match last_socket_error() {
            e if e.raw_os_error() == Some(WinSock::WSAENOPROTOOPT) => Ok(()),
            e => Err(e),
        },
    }
}

pub fn set_congestion(_: &socket2::Socket, algo: &str) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!("congestion control '{algo}': Windows does not let a program choose one"),
    ))
}

/// Nothing: Windows lets a listener bind while old connections linger,
/// and SO_REUSEADDR there would let another program take the port.
pub fn rebind_at_once(_: &socket2::Socket) -> io::Result<()> {
    Ok(())
}

fn last_socket_error() -> io::Error {
    // SAFETY: reads the calling thread's last socket error.
    io::Error::from_raw_os_error(unsafe { WinSock::WSAGetLastError() })
}

/// SIO_UDP_CONNRESET off: otherwise an ICMP port-unreachable (for any
/// earlier send, or forged) makes the next receive on an unconnected
/// socket fail, and one listener serves every sender.
pub fn udp_ignore_icmp_resets(sock: &socket2::Socket) -> io::Result<()> {
    const SIO_UDP_CONNRESET: u32 = 0x9800_000C;
    let off: u32 = 0;
    let mut returned: u32 = 0;
    // SAFETY: passes a live u32 and its size as the input buffer, no
    // output buffer, a live count, and no overlapped I/O (synchronous).
    let rc = unsafe {
        WinSock::WSAIoctl(
            sock.as_raw_socket() as WinSock::SOCKET,
            SIO_UDP_CONNRESET,
            (&off as *const u32).cast(),
            std::mem::size_of::<u32>() as u32,
            std::ptr::null_mut(),
            0,
            &mut returned,
            std::ptr::null_mut(),
            None,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(last_socket_error()),
    }
}

/// WSAEMSGSIZE: the datagram was longer than the buffer, which holds its
/// start.
pub fn datagram_cut(e: &io::Error) -> bool {
    e.raw_os_error() == Some(WinSock::WSAEMSGSIZE)
}

/// Never follows a reparse point (a symbolic link or junction someone
/// who can write the folder made): the link itself is opened, and then
/// fails the regular-file check.
pub fn no_surprises(o: &mut OpenOptions) -> &mut OpenOptions {
    const FILE_FLAG_OPEN_REPARSE_POINT: u32 = 0x0020_0000;
    o.custom_flags(FILE_FLAG_OPEN_REPARSE_POINT)
}

pub fn not_a_regular_file(_: &io::Error) -> bool {
    false
}

pub fn blocking_again(_: &File) -> io::Result<()> {
    Ok(())
}

/// The size the file system reports (SMB clients refresh it on a query).
pub fn fresh_len(path: &Path) -> io::Result<Option<u64>> {
    super::fallback::len(path)
}

pub fn read_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    f.seek_read(buf, off)
}

pub fn write_all_at(f: &File, mut buf: &[u8], mut off: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match f.seek_write(buf, off) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Runs `command` with `cmd /C` (so `ssh.exe host longhaul stdio` works
/// as it is typed at a prompt).
pub fn shell(command: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new("cmd");
    // cmd.exe parses its own command line, not by the C runtime's quoting
    // rules: handed over as typed.
    c.arg("/C").raw_arg(command);
    c
}

/// The folder a `dir://` URL's path names: `/C:/share/tunnel` (or
/// `C:/share/tunnel`, `C:\share\tunnel`) is `C:\share\tunnel`;
/// `//server/share/tunnel` (`dir:////server/share/tunnel`) is the share
/// `\\server\share\tunnel`; anything else is taken as written (a bare
/// `dir://name` is a relative folder, as on Unix, never a host that a
/// name lookup could answer for and ask for our credentials).
pub fn folder_path(url_path: &str) -> std::path::PathBuf {
    let p = url_path.replace('/', "\\");
    let drive = |s: &str| {
        let b = s.as_bytes();
        b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':'
    };
    if let Some(rest) = p.strip_prefix('\\').filter(|r| drive(r)) {
        return rest.into();
    }
    p.into()
}

/// A folder's path as a `dir://` URL spells it: `/C:/share/tunnel`,
/// `//server/share/tunnel` for a share, a relative path as it is.
pub fn folder_url_path(path: &Path) -> OsString {
    let s = path.as_os_str().to_string_lossy().replace('\\', "/");
    let s = if let Some(r) = s.strip_prefix("//?/UNC/") {
        format!("//{r}")
    } else if let Some(r) = s.strip_prefix("//?/") {
        r.to_string()
    } else {
        s
    };
    let b = s.as_bytes();
    let spelled = if b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':' {
        format!("/{s}")
    } else {
        s
    };
    spelled.into()
}

/// The folder whose URL path `FolderUrl::identity`
/// encoded: UTF-8 here (the names are Unicode).
pub fn folder_path_from_bytes(bytes: Vec<u8>) -> Option<std::path::PathBuf> {
    Some(folder_path(&String::from_utf8(bytes).ok()?))
}
