//! Socket calls std and socket2 lack: `getsockopt(TCP_INFO)`,
//! `getsockopt(SO_MEMINFO)`, `setsockopt(TCP_NOTSENT_LOWAT)` and a
//! zero-timeout `poll`. This is the only module of the carrier crate with
//! `unsafe`; each call passes a buffer of the kernel's structure size.

use std::os::fd::AsRawFd;
use std::time::Duration;

/// What the kernel knows about a TCP connection's path.
#[derive(Debug, Clone, Copy)]
pub struct TcpPath {
    /// Smoothed RTT (TCP_INFO.tcpi_rtt).
    pub rtt: Option<Duration>,
    /// Recent delivery rate in bytes per second (TCP_INFO.tcpi_delivery_rate).
    pub delivery_rate: u64,
    /// Segments retransmitted over the connection's life
    /// (TCP_INFO.tcpi_total_retrans).
    pub retransmits: u32,
    /// The retransmission timeout now (TCP_INFO.tcpi_rto).
    pub rto: Option<Duration>,
    /// Bytes written and not yet sent (TCP_INFO.tcpi_notsent_bytes).
    pub notsent: u32,
    /// Congestion window in bytes (tcpi_snd_cwnd × tcpi_snd_mss).
    pub cwnd_bytes: u64,
}

/// Smoothed RTT of a TCP socket as the kernel sees it.
pub fn tcp_rtt(sock: &socket2::Socket) -> Option<Duration> {
    tcp_path(sock).and_then(|p| p.rtt)
}

/// Reads TCP_INFO.
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
    #[cfg(not(target_os = "linux"))]
    {
        let _ = sock.as_raw_fd();
        None
    }
}

/// Limits the bytes a TCP socket holds *unsent* (TCP_NOTSENT_LOWAT): the
/// socket reports writable only below it. Bytes in flight do not count, so
/// throughput is unaffected, but bulk data then waits in longhaul's own
/// scheduler, where control frames and interactive streams can pass it,
/// instead of in a kernel queue that is first come, first served.
pub fn set_notsent_lowat(sock: &socket2::SockRef<'_>, bytes: u32) -> std::io::Result<()> {
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
        let _ = (sock, bytes);
        Ok(())
    }
}

/// Reads TCP_NOTSENT_LOWAT (None where unsupported).
pub fn notsent_lowat(sock: &impl AsRawFd) -> Option<u32> {
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
        let _ = sock.as_raw_fd();
        None
    }
}

/// How full a socket's send buffer is, in the kernel's own accounting
/// (bytes plus per-packet overhead), which is what `send` checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendSpace {
    /// The send buffer's current size (SO_SNDBUF as the kernel uses it).
    pub sndbuf: u32,
    /// Memory queued in it: unsent plus sent but unacknowledged.
    pub queued: u32,
}

impl SendSpace {
    pub fn free(&self) -> u32 {
        self.sndbuf.saturating_sub(self.queued)
    }
}

/// Reads SO_MEMINFO.
pub fn send_space(sock: &impl AsRawFd) -> Option<SendSpace> {
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
        let _ = sock.as_raw_fd();
        None
    }
}

/// Whether the kernel reports the socket writable right now (a level
/// check, as `select` or `poll` do; async runtimes cache an edge instead).
/// For TCP that means at least a third of the send buffer is free (or the
/// socket has failed, so that a write will say why).
pub fn poll_writable(sock: &impl AsRawFd) -> std::io::Result<bool> {
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
