//! A QUIC connection's datagrams (RFC 9221) as the session's datagram
//! path. How much of the path they may take beside the session's byte
//! stream is the protocol's business (`Connection::path_room`): quinn
//! sends queued datagrams ahead of stream data.

use std::sync::Arc;

use bytes::Bytes;
use quinn::Connection;
use tokio::sync::Notify;

/// A QUIC connection's datagrams: each message arrives whole or not at
/// all, in any order, and is never sent twice.
#[derive(Clone)]
pub struct DatagramPath {
    conn: Connection,
    /// Stops the task that discards datagrams nobody reads yet.
    claimed: Arc<Notify>,
}

impl DatagramPath {
    /// The path of `conn`. Until [`DatagramPath::claim`], what arrives is
    /// read and discarded: before a client is authenticated, and on a
    /// striped session's lanes (which carry datagrams in their streams),
    /// it would otherwise sit in quinn's buffer pinning the receive
    /// buffers it arrived in.
    pub(super) fn new(conn: Connection) -> DatagramPath {
        let claimed = Arc::new(Notify::new());
        tokio::spawn(discard_unclaimed(conn.clone(), claimed.clone()));
        DatagramPath { conn, claimed }
    }

    /// The session reads the path from now on ([`DatagramPath::recv`]).
    pub fn claim(&self) {
        self.claimed.notify_one();
    }

    /// The largest message the path carries now: it follows the path's
    /// MTU as QUIC discovers it (about 1 200–1 400 bytes on the Internet).
    pub fn max_size(&self) -> usize {
        self.conn.max_datagram_size().unwrap_or(0)
    }

    /// Bytes quinn takes now without dropping older messages to make
    /// room: more waits in the session's queue (where it is counted if
    /// dropped).
    pub fn buffer_space(&self) -> usize {
        self.conn.datagram_send_buffer_space()
    }

    /// Queues one message (at most [`DatagramPath::max_size`] bytes, within
    /// [`DatagramPath::buffer_space`]); `false` when it was not (too large now, or
    /// the connection is gone).
    pub fn send(&self, msg: Bytes) -> bool {
        self.conn.send_datagram(msg).is_ok()
    }

    /// The next message received; `None` once the connection is closed.
    pub async fn recv(&self) -> Option<Bytes> {
        self.conn.read_datagram().await.ok()
    }
}

/// Reads and drops `conn`'s datagrams until the path is claimed or the
/// connection ends. (A read cancelled by the claim takes nothing.)
async fn discard_unclaimed(conn: Connection, claimed: Arc<Notify>) {
    loop {
        tokio::select! {
            biased;
            _ = claimed.notified() => return,
            d = conn.read_datagram() => {
                if d.is_err() {
                    return;
                }
            }
        }
    }
}
