//! Windows: a loopback TCP pair (tokio has no Unix sockets here).

use std::io;

/// The pumps' end of a pair.
pub type PairStream = tokio::net::TcpStream;
/// The service's end of a pair, blocking.
pub type PairEnd = std::net::TcpStream;

/// Connections a pair's listener turns away before giving up.
const PAIR_ACCEPTS: usize = 64;

pub fn pair() -> io::Result<(PairStream, PairEnd)> {
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    let ours = std::net::TcpStream::connect(listener.local_addr()?)?;
    let want = ours.local_addr()?;
    // Another local program may connect to the listener in the moment it
    // exists: only our own connection is taken (it is queued already, so
    // the accepts do not wait), for a bounded number.
    for _ in 0..PAIR_ACCEPTS {
        let (theirs, from) = listener.accept()?;
        if from == want {
            theirs.set_nodelay(true)?;
            ours.set_nodelay(true)?;
            ours.set_nonblocking(true)?;
            return Ok((PairStream::from_std(ours)?, theirs));
        }
    }
    Err(io::Error::other(
        "a local socket pair: other programs kept connecting to its listener",
    ))
}

/// The service's end, for the runtime.
pub fn pair_end_async(end: PairEnd) -> io::Result<PairStream> {
    end.set_nonblocking(true)?;
    PairStream::from_std(end)
}
