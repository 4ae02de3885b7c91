//! Unix: the socket options Linux has (TCP_INFO, SO_MEMINFO,
//! TCP_NOTSENT_LOWAT), the path from FreeBSD's TCP_INFO and macOS's
//! TCP_CONNECTION_INFO (other options "not known" there), `poll`,
//! `recvmmsg` (Linux; a loop of `recvfrom` elsewhere), and the file calls
//! the folder carrier and keys use. Each unsafe call passes a buffer of the
//! kernel's structure size.

#[cfg(target_os = "linux")]
use super::MAX_BATCH;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
#[cfg(target_os = "linux")]
use std::mem::MaybeUninit;
#[cfg(target_os = "linux")]
use std::net::SocketAddr;
#[cfg(target_os = "linux")]
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
#[cfg(any(target_os = "linux", target_os = "freebsd", target_vendor = "apple"))]
use std::time::Duration;

use super::{SendSpace, TcpPath};

pub fn tcp_path(sock: &socket2::Socket) -> Option<TcpPath> {
    #[cfg(target_os = "linux")]
    {
        let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: `info` is a writable buffer of `len` bytes that outlives the
        // call; the kernel writes at most `len` bytes and updates `len`. A
        // zeroed tcp_info is a valid value (plain integers), so reading it
        // after a short write is sound.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return None;
        }
        // SAFETY: zero-initialised above, possibly partly overwritten by the kernel.
        let info = unsafe { info.assume_init() };
        Some(TcpPath {
            rtt: (info.tcpi_rtt != 0).then(|| Duration::from_micros(info.tcpi_rtt as u64)),
            delivery_rate: info.tcpi_delivery_rate,
            retransmits: info.tcpi_total_retrans,
            rto: (info.tcpi_rto != 0).then(|| Duration::from_micros(info.tcpi_rto as u64)),
            notsent: info.tcpi_notsent_bytes,
            cwnd_bytes: info.tcpi_snd_cwnd as u64 * info.tcpi_snd_mss as u64,
        })
    }
    // FreeBSD: TCP_INFO (RTT and RTO in µs, the window in bytes, segments
    // retransmitted); no delivery rate (one window per RTT instead) or
    // unsent bytes.
    #[cfg(target_os = "freebsd")]
    {
        // SAFETY: as Linux's above: a zeroed plain-integer buffer of the
        // length given; the kernel writes at most that.
        let info: libc::tcp_info =
            unsafe { sockopt_struct(sock, libc::IPPROTO_TCP, libc::TCP_INFO)? };
        Some(TcpPath::by_window(
            Duration::from_micros(info.tcpi_rtt as u64),
            Duration::from_micros(info.tcpi_rto as u64),
            info.tcpi_snd_cwnd as u64,
            info.tcpi_snd_rexmitpack,
        ))
    }
    // macOS: TCP_CONNECTION_INFO (smoothed RTT and RTO in ms, the window
    // in bytes); no delivery rate (one window per RTT instead), unsent
    // bytes or retransmissions.
    #[cfg(target_vendor = "apple")]
    {
        // SAFETY: as above.
        let info: libc::tcp_connection_info =
            unsafe { sockopt_struct(sock, libc::IPPROTO_TCP, libc::TCP_CONNECTION_INFO)? };
        // libc's struct declares XNU's TFO bitfield as fifteen integers:
        // the counters after it are not where the kernel writes them, so
        // retransmissions are not known.
        Some(TcpPath::by_window(
            Duration::from_millis(info.tcpi_srtt as u64),
            Duration::from_millis(info.tcpi_rto as u64),
            info.tcpi_snd_cwnd as u64,
            0,
        ))
    }
    #[cfg(not(any(target_os = "linux", target_os = "freebsd", target_vendor = "apple")))]
    {
        let _ = sock;
        None
    }
}

/// Reads a socket option into a zeroed `T`.
///
/// # Safety
/// `T` must be plain integers (any bytes a valid value).
#[cfg(any(target_os = "freebsd", target_vendor = "apple"))]
unsafe fn sockopt_struct<T>(
    sock: &socket2::Socket,
    level: libc::c_int,
    name: libc::c_int,
) -> Option<T> {
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` is a writable buffer of `len` bytes alive for the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            v.as_mut_ptr().cast(),
            &mut len,
        )
    };
    // SAFETY: zeroed, possibly partly written: valid for plain integers.
    (rc == 0).then(|| unsafe { v.assume_init() })
}

pub fn set_notsent_lowat(sock: &socket2::Socket, bytes: u32) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let v: libc::c_int = bytes.min(i32::MAX as u32) as libc::c_int;
        // SAFETY: `v` is a live c_int and its size is passed alongside.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        // Not set (yet) here: the kernel's queue stays first come, first
        // served, which costs latency, not correctness.
        let _ = (sock, bytes);
        Ok(())
    }
}

pub fn notsent_lowat(sock: &socket2::Socket) -> Option<u32> {
    #[cfg(target_os = "linux")]
    {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` is a live c_int and `len` its size.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (rc == 0).then_some(v as u32)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = sock;
        None
    }
}

pub fn send_space(sock: &socket2::Socket) -> Option<SendSpace> {
    #[cfg(target_os = "linux")]
    {
        let mut info = [0u32; 9];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: `info` is a writable buffer of `len` bytes that outlives
        // the call; the kernel writes at most `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MEMINFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc != 0 || (len as usize) < 6 * 4 {
            return None;
        }
        Some(SendSpace {
            sndbuf: info[libc::SK_MEMINFO_SNDBUF as usize],
            queued: info[libc::SK_MEMINFO_WMEM_QUEUED as usize],
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = sock;
        None
    }
}

pub fn poll_writable(sock: &socket2::Socket) -> io::Result<bool> {
    let mut fds = [libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    }];
    // SAFETY: `fds` is a valid array of one pollfd that outlives the call;
    // a zero timeout never blocks.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // An error or hang-up counts as writable: the next write reports it.
    Ok(fds[0].revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) != 0)
}

/// `recvmmsg`: what `udp_batch::recv_batch` documents.
#[cfg(target_os = "linux")]
pub fn recv_batch(
    sock: &socket2::Socket,
    bufs: &mut [Vec<u8>],
    from: &mut [Option<SocketAddr>],
) -> io::Result<usize> {
    let n = bufs.len().min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut iov: [MaybeUninit<libc::iovec>; MAX_BATCH] = [MaybeUninit::uninit(); MAX_BATCH];
    let mut addrs: [MaybeUninit<libc::sockaddr_storage>; MAX_BATCH] =
        [MaybeUninit::uninit(); MAX_BATCH];
    // SAFETY: an all-zero mmsghdr is a valid value (null pointers, zero
    // lengths); the fields that matter are set below.
    let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        let b = &mut bufs[i];
        b.clear();
        iov[i].write(libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.capacity(),
        });
        msgs[i].msg_hdr.msg_iov = iov[i].as_mut_ptr();
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = addrs[i].as_mut_ptr().cast();
        msgs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
    }
    // SAFETY: `msgs[..n]` each point at one iovec over a buffer's whole
    // capacity and at one sockaddr_storage, all live for the call; the
    // kernel writes at most those lengths. MSG_DONTWAIT: never blocks,
    // whatever the descriptor's flags; a null timeout is allowed.
    let rc = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as libc::c_uint,
            // `as _`: an int on glibc, an unsigned int on musl.
            libc::MSG_DONTWAIT as _,
            std::ptr::null_mut(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = rc as usize;
    for i in 0..got {
        let len = (msgs[i].msg_len as usize).min(bufs[i].capacity());
        // SAFETY: the kernel wrote `msg_len` bytes from the buffer's start
        // (at most its capacity, which `min` keeps to anyway).
        unsafe { bufs[i].set_len(len) };
        if let Some(slot) = from.get_mut(i) {
            // SAFETY: the kernel wrote `msg_namelen` bytes of an address
            // into the storage; only the family's own structure is read,
            // and only when that many bytes were written.
            *slot = unsafe { socket_addr(addrs[i].as_ptr(), msgs[i].msg_hdr.msg_namelen) };
        }
    }
    Ok(got)
}

#[cfg(not(target_os = "linux"))]
pub use super::fallback::recv_batch;

#[cfg(target_os = "linux")]
/// The IP address in `storage` (`len` bytes of it written by the kernel).
///
/// # Safety
/// `storage` points at a sockaddr_storage whose first `len` bytes are
/// initialised.
unsafe fn socket_addr(
    storage: *const libc::sockaddr_storage,
    len: libc::socklen_t,
) -> Option<SocketAddr> {
    let len = len as usize;
    if len < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    match i32::from((*storage).ss_family) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            let a = &*storage.cast::<libc::sockaddr_in>();
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            let a = &*storage.cast::<libc::sockaddr_in6>();
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Flags for every folder-carrier file opened: a FIFO must not block the
/// open, a symbolic link (to a device, a FIFO, another file) is never
/// followed, a terminal never becomes ours.
pub fn no_surprises(o: &mut OpenOptions) -> &mut OpenOptions {
    use rustix::fs::OFlags;
    o.custom_flags((OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::NOCTTY).bits() as i32)
}

/// An open refused because the name became something that is not a
/// regular file: ELOOP (a symbolic link), ENXIO (a socket).
pub fn not_a_regular_file(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENXIO))
}

/// Blocking reads again after a [`no_surprises`] open (a FUSE server sees
/// the flags of each read).
pub fn blocking_again(f: &File) -> io::Result<()> {
    rustix::fs::fcntl_setfl(f, rustix::fs::OFlags::empty()).map_err(Into::into)
}

/// A file's size as the file system has it now: on a share whose client
/// caches attributes (FUSE keeps them for a second by default; NFS for
/// several), Linux's `statx` with AT_STATX_FORCE_SYNC asks the server
/// again, and a held descriptor then reads what is new. None: the file is
/// gone. Never through a symbolic link: it is not a carrier file.
pub fn fresh_len(path: &Path) -> io::Result<Option<u64>> {
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
        let flags = AtFlags::STATX_FORCE_SYNC | AtFlags::SYMLINK_NOFOLLOW;
        match statx(CWD, path, flags, StatxFlags::SIZE) {
            Ok(st) => return Ok(Some(st.stx_size)),
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            // No statx (old kernels, some sandboxes): what stat says.
            Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::PERM) => {}
            Err(e) => return Err(e.into()),
        }
    }
    super::fallback::len(path)
}

pub fn read_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    f.read_at(buf, off)
}

pub fn write_all_at(f: &File, buf: &[u8], off: u64) -> io::Result<()> {
    f.write_all_at(buf, off)
}

/// Creates `path` for writing (never over an existing file) readable by
/// its owner only (a private key).
pub fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Runs `command` with the system's shell.
pub fn shell(command: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new("sh");
    c.arg("-c").arg(command);
    c
}

/// The folder a `dir://` URL's path names: the path as written.
pub fn folder_path(url_path: &str) -> std::path::PathBuf {
    url_path.into()
}

/// A folder's path as a `dir://` URL spells it.
pub fn folder_url_path(path: &Path) -> OsString {
    path.as_os_str().to_owned()
}

/// The folder whose URL path `FolderUrl::identity`
/// encoded: any bytes are a Unix path.
pub fn folder_path_from_bytes(bytes: Vec<u8>) -> Option<std::path::PathBuf> {
    let os: OsString = std::os::unix::ffi::OsStringExt::from_vec(bytes);
    Some(os.into())
}

/// Kernel keepalive: a probe after `idle` without traffic, then every
/// `interval`; `retries` unanswered end the connection (where the count can
/// be set; Linux ends it at TCP_USER_TIMEOUT instead when that is set).
pub fn set_keepalive(
    sock: &socket2::Socket,
    idle: std::time::Duration,
    interval: std::time::Duration,
    retries: u32,
) -> io::Result<()> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval);
    #[cfg(any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_vendor = "apple"
    ))]
    let ka = ka.with_retries(retries);
    #[cfg(not(any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_vendor = "apple"
    )))]
    let _ = retries;
    sock.set_tcp_keepalive(&ka)
}

/// The kernel aborts a connection whose sent data stays unacknowledged
/// this long (Linux's TCP_USER_TIMEOUT; other Unixes keep their default).
pub fn set_user_timeout(sock: &socket2::Socket, d: std::time::Duration) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    return sock.set_tcp_user_timeout(Some(d));
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "fuchsia")))]
    {
        let _ = (sock, d);
        Ok(())
    }
}

/// Chooses the socket's congestion control.
pub fn set_congestion(sock: &socket2::Socket, algo: &str) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "freebsd"))]
    return sock.set_tcp_congestion(algo.as_bytes()).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "congestion control '{algo}' unavailable ({e}); see /proc/sys/net/ipv4/tcp_available_congestion_control"
            ),
        )
    });
    #[cfg(not(any(target_os = "linux", target_os = "freebsd")))]
    {
        let _ = sock;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("congestion control '{algo}': this system does not let a program choose one"),
        ))
    }
}

/// SO_REUSEADDR: a listener's port is free again while connections of
/// the process before linger in TIME_WAIT.
pub fn rebind_at_once(sock: &socket2::Socket) -> io::Result<()> {
    sock.set_reuse_address(true)
}

/// Unix reports ICMP errors only on connected UDP sockets.
pub fn udp_ignore_icmp_resets(_: &socket2::Socket) -> io::Result<()> {
    Ok(())
}

/// Unix cuts a long datagram without an error.
pub fn datagram_cut(_: &io::Error) -> bool {
    false
}
