//! Unix: a socket pair (no port, no listener).

use std::io;

/// The pumps' end of a pair.
pub type PairStream = tokio::net::UnixStream;
/// The service's end of a pair, blocking.
pub type PairEnd = std::os::unix::net::UnixStream;

pub fn pair() -> io::Result<(PairStream, PairEnd)> {
    let (a, b) = std::os::unix::net::UnixStream::pair()?;
    a.set_nonblocking(true)?;
    Ok((PairStream::from_std(a)?, b))
}

/// The service's end, for the runtime.
pub fn pair_end_async(end: PairEnd) -> io::Result<PairStream> {
    end.set_nonblocking(true)?;
    PairStream::from_std(end)
}
