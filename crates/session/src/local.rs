//! The local end of a stream: a TCP connection (forwards, targets), one
//! end of a socket pair, a UDP flow's socket, or an in-process pipe to a service that runs
//! on plain blocking I/O (the file service; see [`crate::pipe`]).

use std::future::Future;
use std::io;

use bytes::{BufMut, BytesMut};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{tcp, TcpStream};

pub use crate::sys::{pair_end_async, PairEnd, PairStream};

/// What a stream's pumps relay to.
#[derive(Debug)]
pub enum LocalStream {
    Tcp(TcpStream),
    /// The pumps' end of a [`LocalStream::pair`].
    Pair(PairStream),
    Service(crate::pipe::PumpEnd),
    /// A UDP socket `connect`ed to a flow's destination.
    Udp(tokio::net::UdpSocket),
    /// A local end with something held exactly as long as its pumps run
    /// (a flow's share of the server's ports).
    Leased(Box<LocalStream>, Lease),
}

/// What a [`LocalStream::Leased`] holds: dropped when the stream's pumps
/// end.
pub type Lease = Box<dyn std::any::Any + Send + Sync>;

impl From<TcpStream> for LocalStream {
    fn from(s: TcpStream) -> LocalStream {
        LocalStream::Tcp(s)
    }
}

impl LocalStream {
    /// A connected pair (a Unix socket pair; loopback TCP on Windows):
    /// the first end for a stream's pumps, the second (blocking) for an
    /// in-process service. Must run inside the runtime.
    pub fn pair() -> io::Result<(LocalStream, PairEnd)> {
        let (ours, theirs) = crate::sys::pair()?;
        Ok((LocalStream::Pair(ours), theirs))
    }

    /// An in-process pipe: the first end for a stream's pumps, the second
    /// for a service on its own threads, whose reads and writes fail after
    /// `idle` without progress.
    pub fn service(idle: std::time::Duration) -> (LocalStream, crate::pipe::ServicePipe) {
        let (pumps, svc) = crate::pipe::pipe(idle);
        (LocalStream::Service(pumps), svc)
    }
}

/// The read half the uplink needs: readiness, then non-blocking reads
/// ([`read_now`]). Readiness is polled, not awaited as tokio's `readable()`
/// future: that future is a waiter of its own, kept in every idle stream's
/// state (≈ 100 B each).
pub(crate) trait LocalRead: AsyncRead + Unpin + Send + Sync {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

/// Reads what `rd` has now into `buf`, or fails with `WouldBlock`. Unlike a
/// `try_read`, a read that comes back short tells the runtime the socket is
/// drained (tokio's `poll_read` clears its readiness then), so the next
/// wait goes straight to the poller instead of costing one more `recvfrom`
/// that only says `EAGAIN` — one syscall saved per message on an
/// interactive stream.
///
/// At most `limit` bytes; none once `stopped` says so (as if drained). A
/// poll function that makes tokio's read future afresh on each poll (it
/// holds nothing between polls): it sits in every stream's state, where a
/// stored future would cost ≈ 40 bytes more.
pub(crate) fn read_now<'a>(
    rd: &'a mut impl LocalRead,
    buf: &'a mut BytesMut,
    limit: usize,
    stopped: impl Fn() -> bool + Send + 'a,
) -> impl Future<Output = io::Result<usize>> + Send + 'a {
    use tokio::io::AsyncReadExt;
    std::future::poll_fn(move |cx| {
        if stopped() {
            return Poll::Ready(Err(io::ErrorKind::WouldBlock.into()));
        }
        let mut dst = (&mut *buf).limit(limit);
        let read = std::pin::pin!(rd.read_buf(&mut dst));
        match read.poll(cx) {
            Poll::Ready(r) => Poll::Ready(r),
            // Out of the runtime's budget for this turn, not out of data:
            // wait (tokio wakes the task on its next turn). Taken for
            // "drained", the socket would look readable again at once and
            // the loop would spin.
            Poll::Pending if !tokio::task::coop::has_budget_remaining() => Poll::Pending,
            Poll::Pending => Poll::Ready(Err(io::ErrorKind::WouldBlock.into())),
        }
    })
}

/// The write half the downlink needs.
pub(crate) trait LocalWrite: AsyncWrite + Unpin + Send + Sync {
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize>;
    /// Ends the local connection with a reset where the transport has one
    /// (TCP): no FIN first, which would read as a clean end of data.
    fn reset(self);
    /// Bytes written and not yet acknowledged by the other end (0 where
    /// the transport cannot tell).
    fn unacked(&self) -> u32 {
        0
    }
}

macro_rules! local_halves {
    ($read:ty, $write:ty, $reset:expr, $unacked:expr) => {
        impl $crate::local::LocalRead for $read {
            fn poll_read_ready(
                &self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                self.as_ref().poll_read_ready(cx)
            }
        }
        impl $crate::local::LocalWrite for $write {
            fn poll_write_ready(
                &self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                self.as_ref().poll_write_ready(cx)
            }
            fn try_write_vectored(&self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
                self.as_ref().try_write_vectored(bufs)
            }
            fn reset(self) {
                let reset: fn($write) = $reset;
                reset(self)
            }
            fn unacked(&self) -> u32 {
                let unacked: fn(&$write) -> u32 = $unacked;
                unacked(self)
            }
        }
    };
}

// The halves of a socket borrowed by its relay (`stream::relay_tcp`): no
// shared allocation, and dropping one does nothing to the socket, which
// closes when the relay ends.
local_halves!(
    tcp::ReadHalf<'_>,
    tcp::WriteHalf<'_>,
    |w| {
        // Closing with SO_LINGER 0 sends a reset (never a FIN first, which
        // the application would take for a clean end); the socket closes
        // when its relay ends.
        let _ = socket2::SockRef::from(w.as_ref()).set_linger(Some(std::time::Duration::ZERO));
    },
    // The send buffer's queued memory: unsent plus unacknowledged.
    |w| longhaul_carrier::send_space(&socket2::SockRef::from(w.as_ref())).map_or(0, |s| s.queued)
);
// A Unix socket pair (sys/unix.rs) has no reset: the service sees the
// close. (Windows' pair is TCP, covered above.)
#[cfg(unix)]
local_halves!(
    tokio::net::unix::ReadHalf<'_>,
    tokio::net::unix::WriteHalf<'_>,
    // No reset: the service sees the end now, as it would a close.
    |w| {
        let _ = socket2::SockRef::from(w.as_ref()).shutdown(std::net::Shutdown::Write);
    },
    |_| 0
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    /// An uplink's loop (readiness, then `read_now`) in a session's driver
    /// reads far more than tokio's budget for one turn allows: running out
    /// of budget must make it wait for its next turn, not take the socket
    /// for drained and spin on a readiness that never clears.
    #[test]
    fn reading_past_the_runtime_budget_waits_instead_of_spinning() {
        // On a thread of its own: a spinning driver never gives its runtime
        // back, so the verdict comes from here, with a deadline.
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let _ = done_tx.send(rt.block_on(read_much()));
        });
        let total = done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the reader kept its driver turning");
        assert_eq!(total, TOTAL);
    }

    const TOTAL: usize = 32 << 20;

    async fn read_much() -> usize {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let block = vec![7u8; 1 << 20];
            for _ in 0..TOTAL / block.len() {
                s.write_all(&block).await.unwrap();
            }
        });
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        let driver = crate::driver::Driver::start();
        let (tx, rx) = tokio::sync::oneshot::channel();
        driver.spawn(async move {
            let (mut rd, _wr) = sock.split();
            let mut total = 0;
            let mut buf = bytes::BytesMut::new();
            loop {
                std::future::poll_fn(|cx| rd.poll_read_ready(cx))
                    .await
                    .unwrap();
                // Small reads: the budget runs out many times over.
                buf.reserve(512);
                match read_now(&mut rd, &mut buf, 512, || false).await {
                    Ok(0) => break,
                    Ok(n) => total += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
                buf.clear();
            }
            let _ = tx.send(total);
        });
        rx.await.unwrap()
    }
}
