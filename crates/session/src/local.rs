//! The local end of a stream: a TCP connection (forwards, targets), one
//! end of a Unix socket pair, or an in-process pipe to a service that runs
//! on plain blocking I/O (the file service; see [`crate::pipe`]).

use std::future::Future;
use std::io;

use bytes::BufMut;
use tokio::io::AsyncWrite;
use tokio::net::{tcp, unix, TcpStream, UnixStream};

/// What a stream's pumps relay to.
#[derive(Debug)]
pub enum LocalStream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Service(crate::pipe::PumpEnd),
}

impl From<TcpStream> for LocalStream {
    fn from(s: TcpStream) -> LocalStream {
        LocalStream::Tcp(s)
    }
}

impl From<UnixStream> for LocalStream {
    fn from(s: UnixStream) -> LocalStream {
        LocalStream::Unix(s)
    }
}

impl LocalStream {
    /// A connected pair: the first end for a stream's pumps, the second
    /// (blocking) for the in-process service. Must run inside the runtime.
    pub fn pair() -> io::Result<(LocalStream, std::os::unix::net::UnixStream)> {
        let (a, b) = std::os::unix::net::UnixStream::pair()?;
        a.set_nonblocking(true)?;
        Ok((LocalStream::Unix(UnixStream::from_std(a)?), b))
    }

    /// An in-process pipe: the first end for a stream's pumps, the second
    /// for a service on its own threads, whose reads and writes fail after
    /// `idle` without progress.
    pub fn service(idle: std::time::Duration) -> (LocalStream, crate::pipe::ServicePipe) {
        let (pumps, svc) = crate::pipe::pipe(idle);
        (LocalStream::Service(pumps), svc)
    }
}

/// The read half the uplink needs: readiness, then non-blocking reads.
pub(crate) trait LocalRead: Send + 'static {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send;
    fn try_read_buf<B: BufMut>(&self, buf: &mut B) -> io::Result<usize>;
}

/// The write half the downlink needs.
pub(crate) trait LocalWrite: AsyncWrite + Unpin + Send + 'static {
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;
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
        impl LocalRead for $read {
            fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
                <$read>::readable(self)
            }
            fn try_read_buf<B: BufMut>(&self, buf: &mut B) -> io::Result<usize> {
                <$read>::try_read_buf(self, buf)
            }
        }
        impl LocalWrite for $write {
            fn writable(&self) -> impl Future<Output = io::Result<()>> + Send {
                <$write>::writable(self)
            }
            fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
                <$write>::try_write_vectored(self, bufs)
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

local_halves!(
    tcp::OwnedReadHalf,
    tcp::OwnedWriteHalf,
    |w| {
        // Closing with SO_LINGER 0 sends a reset. Dropping the half would
        // shut down its direction first (a FIN, which the application
        // takes for a clean end); forgetting it leaves the close to the
        // read half's drop (the uplink ends with the stream).
        let _ = socket2::SockRef::from(w.as_ref()).set_linger(Some(std::time::Duration::ZERO));
        w.forget();
    },
    // The send buffer's queued memory: unsent plus unacknowledged.
    |w| longhaul_carrier::send_space(w.as_ref()).map_or(0, |s| s.queued)
);
// A Unix socket has no reset: the service sees the close.
local_halves!(unix::OwnedReadHalf, unix::OwnedWriteHalf, drop, |_| 0);
