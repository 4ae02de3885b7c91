//! `recvmmsg`, which std, socket2 and rustix lack: several datagrams
//! waiting on a UDP socket read in one call, and — what matters more —
//! knowing that the socket is drained when fewer came than asked for.
//!
//! A UDP socket says nothing else about what is left in it: a relay that
//! reads one datagram with `recv` must try once more, and get `EAGAIN`,
//! before it may wait for the next (one wasted call per DNS query, at each
//! end of a tunnel). A short batch is the same proof without the extra
//! call. Elsewhere (no `recvmmsg`) a batch is read one datagram at a time
//! until the socket is empty ([`crate::sys`]).

use std::io;
use std::net::SocketAddr;

/// The most datagrams one call reads.
pub use crate::sys::MAX_BATCH;

/// Reads the datagrams already waiting on `sock`, at most `bufs.len()`
/// (and [`MAX_BATCH`]), without blocking: each into one buffer, from its
/// start up to its capacity (a longer datagram is cut there; give one
/// byte more than the longest wanted to tell). Each buffer's length
/// becomes what it received, and `from[i]` the source of datagram `i`
/// (`None`: not an IP address, `from` is shorter, or — on Windows — the
/// datagram was cut). Returns how many
/// were read: fewer than asked means the socket was drained. `WouldBlock`
/// when none waited; other errors are the socket's (an ICMP report for
/// an earlier send, on a connected socket). The socket must be
/// non-blocking (a runtime's are) where there is no `recvmmsg`.
pub fn recv_batch(
    sock: &socket2::Socket,
    bufs: &mut [Vec<u8>],
    from: &mut [Option<SocketAddr>],
) -> io::Result<usize> {
    crate::sys::recv_batch(sock, bufs, from)
}

/// Keeps ICMP errors (for earlier sends, or forged) from failing the
/// receives of an unconnected socket that serves many senders: Windows
/// reports them there unless told not to; Unix never does.
pub fn ignore_icmp_resets(sock: &socket2::Socket) -> io::Result<()> {
    crate::sys::udp_ignore_icmp_resets(sock)
}

/// [`recv_batch`] on a runtime's socket. A short batch also clears the
/// runtime's readiness, so that the next wait starts at once instead of
/// first finding the socket empty. `WouldBlock`: none waited.
///
/// `connected`: the socket is `connect`ed, so ICMP errors for its sends
/// are reported on it. The kernel reports a pending error before the
/// next datagram, so an error arriving during the call cuts the batch
/// short while datagrams still wait, and no new wake-up comes for them:
/// a short batch then checks for (and takes) the error, and keeps the
/// readiness if there was one.
pub fn try_recv(
    sock: &tokio::net::UdpSocket,
    bufs: &mut [Vec<u8>],
    from: &mut [Option<SocketAddr>],
    connected: bool,
) -> io::Result<usize> {
    let want = bufs.len().min(MAX_BATCH);
    if want == 0 {
        return Ok(0);
    }
    let mut got = 0;
    // `WouldBlock` out of the closure is what makes tokio clear the
    // readiness it saw (unless a newer wake-up came meanwhile): said for a
    // short batch too, after keeping what it read.
    let r = sock.try_io(tokio::io::Interest::READABLE, || {
        got = recv_batch(&socket2::SockRef::from(sock), bufs, from)?;
        let cut_by_error = || connected && matches!(sock.take_error(), Ok(Some(_)));
        match got < want && !cut_by_error() {
            true => Err(io::ErrorKind::WouldBlock.into()),
            false => Ok(()),
        }
    });
    match r {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => Ok(got),
        Ok(()) => Ok(got),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn reads_what_waits_and_says_when_drained() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let to = rx.local_addr().unwrap();
        let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| Vec::with_capacity(8)).collect();
        let mut from = [None; 4];
        let e = recv_batch(&socket2::SockRef::from(&rx), &mut bufs, &mut from).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        for d in [&b"one"[..], b"two!", b"longer than eight"] {
            tx.send_to(d, to).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(
            recv_batch(&socket2::SockRef::from(&rx), &mut bufs, &mut from).unwrap(),
            3
        );
        assert_eq!(bufs[0], b"one");
        assert_eq!(bufs[1], b"two!");
        assert_eq!(bufs[2], b"longer t", "cut at the capacity");
        assert_eq!(from[0], Some(tx.local_addr().unwrap()));
        // Windows reports a cut datagram as an error, without its source.
        if !cfg!(windows) {
            assert_eq!(from[2], Some(tx.local_addr().unwrap()));
        }
        let v6 = UdpSocket::bind("[::1]:0");
        if let Ok(rx6) = v6 {
            let tx6 = UdpSocket::bind("[::1]:0").unwrap();
            rx6.set_nonblocking(true).unwrap();
            tx6.send_to(b"six", rx6.local_addr().unwrap()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(
                recv_batch(&socket2::SockRef::from(&rx6), &mut bufs[..1], &mut []).unwrap(),
                1
            );
            assert_eq!(bufs[0], b"six");
        }
    }
}
