//! Socket options that need `getsockopt` directly. This is the only module
//! of the carrier crate with `unsafe`: one call to `getsockopt(TCP_INFO)`
//! into a buffer of the kernel's structure size.

use std::os::fd::AsRawFd;
use std::time::Duration;

/// Smoothed RTT of a TCP socket as the kernel sees it (TCP_INFO.tcpi_rtt).
pub fn tcp_rtt(sock: &socket2::Socket) -> Option<Duration> {
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
        if info.tcpi_rtt == 0 {
            return None;
        }
        Some(Duration::from_micros(info.tcpi_rtt as u64))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = sock.as_raw_fd();
        None
    }
}
