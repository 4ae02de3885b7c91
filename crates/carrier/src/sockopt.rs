//! What a TCP socket can tell about its path and its send queue, and the
//! unsent-bytes limit: `getsockopt(TCP_INFO)`, `getsockopt(SO_MEMINFO)`,
//! `setsockopt(TCP_NOTSENT_LOWAT)` and a zero-timeout `poll` on Linux,
//! made in [`crate::sys`]; "not known" where a system lacks them.

use std::time::Duration;

pub use crate::sys::{SendSpace, TcpPath};

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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    /// A loopback connection that moved bytes: where the system reports
    /// its path, the figures are a loopback's (Wine reports none).
    #[test]
    fn a_loopback_path_is_reported_or_not_known() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        a.write_all(&[7; 100_000]).unwrap();
        let mut got = vec![0; 100_000];
        b.read_exact(&mut got).unwrap();
        let sock = socket2::SockRef::from(&a);
        if let Some(p) = super::tcp_path(&sock) {
            assert!(
                p.rtt.is_some_and(|r| r < std::time::Duration::from_secs(1)),
                "{p:?}"
            );
            assert!(p.cwnd_bytes > 0, "{p:?}");
        }
    }
}
