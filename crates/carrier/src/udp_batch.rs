//! `recvmmsg`, which std, socket2 and rustix lack: several datagrams
//! waiting on a UDP socket read in one call, and — what matters more —
//! knowing that the socket is drained when fewer came than asked for.
//!
//! A UDP socket says nothing else about what is left in it: a relay that
//! reads one datagram with `recv` must try once more, and get `EAGAIN`,
//! before it may wait for the next (one wasted call per DNS query, at each
//! end of a tunnel). A short batch is the same proof without the extra
//! call. This is the one other module of the carrier crate with `unsafe`.

use std::io;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;

/// The most datagrams one call reads.
pub const MAX_BATCH: usize = 16;

/// Reads the datagrams already waiting on `sock`, at most `bufs.len()`
/// (and [`MAX_BATCH`]), without blocking: each into one buffer, from its
/// start up to its capacity (a longer datagram is cut there; give one
/// byte more than the longest wanted to tell). Each buffer's length
/// becomes what it received, and `from[i]` the source of datagram `i`
/// (`None`: not an IP address, or `from` is shorter). Returns how many
/// were read: fewer than asked means the socket was drained. `WouldBlock`
/// when none waited; other errors are the socket's (an ICMP report for
/// an earlier send, on a connected socket).
pub fn recv_batch(
    sock: &impl AsRawFd,
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
        got = recv_batch(sock, bufs, from)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn reads_what_waits_and_says_when_drained() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| Vec::with_capacity(8)).collect();
        let mut from = [None; 4];
        let e = recv_batch(&rx, &mut bufs, &mut from).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        for d in [&b"one"[..], b"two!", b"longer than eight"] {
            tx.send_to(d, to).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(recv_batch(&rx, &mut bufs, &mut from).unwrap(), 3);
        assert_eq!(bufs[0], b"one");
        assert_eq!(bufs[1], b"two!");
        assert_eq!(bufs[2], b"longer t", "cut at the capacity");
        assert_eq!(from[0], Some(tx.local_addr().unwrap()));
        assert_eq!(from[2], Some(tx.local_addr().unwrap()));
        let v6 = UdpSocket::bind("[::1]:0");
        if let Ok(rx6) = v6 {
            let tx6 = UdpSocket::bind("[::1]:0").unwrap();
            tx6.send_to(b"six", rx6.local_addr().unwrap()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(recv_batch(&rx6, &mut bufs[..1], &mut []).unwrap(), 1);
            assert_eq!(bufs[0], b"six");
        }
    }
}
