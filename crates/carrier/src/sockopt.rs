//! Socket options that need `getsockopt` directly. This is the only module
//! of the carrier crate with `unsafe`: one call to `getsockopt(TCP_INFO)`
//! into a buffer of the kernel's structure size.

use std::os::fd::AsRawFd;
use std::time::Duration;

/// What the kernel knows about a TCP connection's path.
#[derive(Debug, Clone, Copy)]
pub struct TcpPath {
    /// Smoothed RTT (TCP_INFO.tcpi_rtt).
    pub rtt: Option<Duration>,
    /// Recent delivery rate in bytes per second (TCP_INFO.tcpi_delivery_rate).
    pub delivery_rate: u64,
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
