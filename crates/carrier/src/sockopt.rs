//! What a TCP socket can tell about its path and its send queue, and the
//! unsent-bytes limit: `getsockopt(TCP_INFO)`, `getsockopt(SO_MEMINFO)`,
//! `setsockopt(TCP_NOTSENT_LOWAT)` and a zero-timeout `poll` on Linux,
//! made in [`crate::sys`]; "not known" where a system lacks them.

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
    crate::sys::tcp_path(sock)
}

/// Limits the bytes a TCP socket holds *unsent* (TCP_NOTSENT_LOWAT): the
/// socket reports writable only below it. Bytes in flight do not count, so
/// throughput is unaffected, but bulk data then waits in longhaul's own
/// scheduler, where control frames and interactive streams can pass it,
/// instead of in a kernel queue that is first come, first served.
pub fn set_notsent_lowat(sock: &socket2::Socket, bytes: u32) -> std::io::Result<()> {
    crate::sys::set_notsent_lowat(sock, bytes)
}

/// Reads TCP_NOTSENT_LOWAT (None where unsupported).
pub fn notsent_lowat(sock: &socket2::Socket) -> Option<u32> {
    crate::sys::notsent_lowat(sock)
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
pub fn send_space(sock: &socket2::Socket) -> Option<SendSpace> {
    crate::sys::send_space(sock)
}

/// Whether the kernel reports the socket writable right now (a level
/// check, as `select` or `poll` do; async runtimes cache an edge instead).
/// For TCP that means at least a third of the send buffer is free (or the
/// socket has failed, so that a write will say why).
pub fn poll_writable(sock: &socket2::Socket) -> std::io::Result<bool> {
    crate::sys::poll_writable(sock)
}
