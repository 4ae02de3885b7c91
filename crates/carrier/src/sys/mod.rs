//! What differs between operating systems, and nothing else: socket
//! options the standard library and socket2 lack, batched UDP reads, file
//! flags and positional I/O for the folder carrier, file-change
//! notifications, a private key's file mode and the shell behind `cmd://`.
//! The rest of the crate calls these and has no `cfg(target_os)`.
//!
//! `unix.rs` (Linux first: other Unixes get "not known" for the socket
//! options), `windows.rs`, and here what both can share.

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

impl TcpPath {
    /// Where a system reports no delivery rate or unsent bytes: the rate
    /// estimated as one congestion window per RTT (0: unknown), nothing
    /// unsent; a zero RTT or RTO is unknown.
    #[allow(dead_code)]
    fn by_window(rtt: Duration, rto: Duration, cwnd_bytes: u64, retransmits: u32) -> TcpPath {
        let rtt = (!rtt.is_zero()).then_some(rtt);
        TcpPath {
            rtt,
            delivery_rate: rtt.map_or(0, |r| (cwnd_bytes as f64 / r.as_secs_f64()) as u64),
            retransmits,
            rto: (!rto.is_zero()).then_some(rto),
            notsent: 0,
            cwnd_bytes,
        }
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

/// The most datagrams one batch read takes.
pub const MAX_BATCH: usize = 16;

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub use unix::*;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use self::windows::*;

#[cfg(windows)]
mod windows_access;
#[cfg(windows)]
mod windows_admin;

/// Files (and, on Windows, pipes) only this user and the system's
/// administrators may open: mode 0600 on Unix, an explicit access list on
/// Windows.
pub mod private {
    #[cfg(unix)]
    pub use super::unix::create_private as create_new;
    #[cfg(windows)]
    pub use super::windows_access::{
        create_new, owner_of, pipe_server_pid, user_sid, Owner, SecurityAttributes,
    };
    #[cfg(windows)]
    pub use super::windows_admin::{admin_folder, changeable_by_others};
}

#[cfg(target_os = "linux")]
mod inotify;
#[cfg(target_os = "linux")]
pub use self::inotify::DirNotifier;

#[cfg(not(target_os = "linux"))]
mod notify_watch;
#[cfg(not(target_os = "linux"))]
pub use notify_watch::DirNotifier;

/// What works wherever socket2 and std do.
#[allow(dead_code)]
mod fallback {
    use std::io;
    use std::net::SocketAddr;
    use std::path::Path;

    use super::MAX_BATCH;

    /// One `recvfrom` per datagram, until the socket is empty: what a
    /// batch read is where the system has no `recvmmsg`.
    pub fn recv_batch(
        sock: &socket2::Socket,
        bufs: &mut [Vec<u8>],
        from: &mut [Option<SocketAddr>],
    ) -> io::Result<usize> {
        let n = bufs.len().min(MAX_BATCH);
        for (i, b) in bufs.iter_mut().take(n).enumerate() {
            b.clear();
            let r = sock.recv_from(b.spare_capacity_mut());
            let (len, addr) = match r {
                Ok((len, addr)) => (len, Some(addr)),
                // Windows: a datagram longer than the buffer fills it and
                // says so with an error (Unix cuts it quietly).
                Err(e) if super::datagram_cut(&e) => (b.capacity(), None),
                // What was read is kept; an error after it comes again or
                // was an ICMP report, which a flow survives anyway.
                Err(_) if i > 0 => return Ok(i),
                Err(e) => return Err(e),
            };
            let len = len.min(b.capacity());
            // SAFETY: the system wrote `len` bytes from the buffer's start
            // (at most its capacity, which `min` keeps to anyway).
            unsafe { b.set_len(len) };
            if let Some(slot) = from.get_mut(i) {
                *slot = addr.and_then(|a| a.as_socket());
            }
        }
        Ok(n)
    }

    pub fn len(path: &Path) -> io::Result<Option<u64>> {
        match std::fs::symlink_metadata(path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}
