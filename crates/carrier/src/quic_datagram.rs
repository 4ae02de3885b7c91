//! A QUIC connection's datagrams (RFC 9221) as the session's datagram
//! path, with the share they may take of it.
//!
//! quinn puts queued datagrams in every packet ahead of stream data, so
//! datagrams handed to it as fast as they come would starve the session's
//! byte stream (its streams, PINGs, ACKs and CLOSEs): one UDP flood
//! through a `-L udp:` forward would stall every TCP forward of the
//! session. So while the stream is busy, datagrams get at most half of
//! the path's rate (its congestion window per round trip), the session's
//! own queue holding (and, full, dropping) the rest; while it is idle,
//! they get all of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use quinn::Connection;
use tokio::sync::Notify;

/// The stream counts as busy this long after the session last wrote to it
/// (or at least a round trip).
const BUSY_FOR: Duration = Duration::from_millis(50);

/// When the session's byte stream last took (or waited to take) bytes.
#[derive(Clone)]
pub(super) struct StreamActivity {
    epoch: Instant,
    /// Microseconds since `epoch`, 0 for never.
    last_us: Arc<AtomicU64>,
}

impl Default for StreamActivity {
    fn default() -> Self {
        StreamActivity {
            epoch: Instant::now(),
            last_us: Arc::default(),
        }
    }
}

impl StreamActivity {
    pub(super) fn mark(&self) {
        let us = self.epoch.elapsed().as_micros() as u64;
        self.last_us.store(us.max(1), Ordering::Relaxed);
    }

    fn busy_within(&self, window: Duration) -> bool {
        match self.last_us.load(Ordering::Relaxed) {
            0 => false,
            us => self.epoch.elapsed().as_micros() as u64 <= us + window.as_micros() as u64,
        }
    }
}

/// Datagram bytes that may go now while the stream is busy: a token
/// bucket filled at half the path's rate.
struct Share {
    tokens: f64,
    filled: Instant,
}

/// A QUIC connection's datagrams: each message arrives whole or not at
/// all, in any order, and is never sent twice.
#[derive(Clone)]
pub struct DatagramPath {
    conn: Connection,
    stream: StreamActivity,
    share: Arc<Mutex<Share>>,
    /// Stops the task that discards datagrams nobody reads yet.
    claimed: Arc<Notify>,
}

impl DatagramPath {
    /// The path of `conn`, whose byte stream's writer marks `stream`. Until
    /// [`DatagramPath::claim`], what arrives is read and discarded: before
    /// a client is authenticated, and on a striped session's lanes (which
    /// carry datagrams in their streams), it would otherwise sit in quinn's
    /// buffer pinning the receive buffers it arrived in.
    pub(super) fn new(conn: Connection, stream: StreamActivity) -> DatagramPath {
        let claimed = Arc::new(Notify::new());
        tokio::spawn(discard_unclaimed(conn.clone(), claimed.clone()));
        DatagramPath {
            conn,
            stream,
            share: Arc::new(Mutex::new(Share {
                tokens: 0.0,
                filled: Instant::now(),
            })),
            claimed,
        }
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

    /// Bytes of messages that may be sent now (see the module docs):
    /// unbounded while the byte stream is idle.
    pub fn room(&self) -> usize {
        let rtt = self.conn.rtt();
        let few = 4.0 * self.max_size() as f64;
        let mut s = self.share.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if !self.stream.busy_within(BUSY_FOR.max(rtt)) {
            // The bucket starts again from a few messages' worth when the
            // stream gets busy.
            s.tokens = few;
            s.filled = now;
            return usize::MAX;
        }
        let cwnd = self.conn.stats().path.cwnd as f64;
        let rate = cwnd / rtt.as_secs_f64().max(1e-3) / 2.0;
        // A burst of half a window, and never less than a few messages.
        let burst = (cwnd / 2.0).max(few);
        let elapsed = now.duration_since(s.filled).as_secs_f64();
        s.tokens = (s.tokens + rate * elapsed).min(burst);
        s.filled = now;
        s.tokens.max(0.0) as usize
    }

    /// Queues one message (at most [`DatagramPath::max_size`] bytes, within
    /// [`DatagramPath::room`]); `false` when it was not (too large now, or
    /// the connection is gone).
    pub fn send(&self, msg: Bytes) -> bool {
        {
            let mut s = self.share.lock().unwrap_or_else(|p| p.into_inner());
            s.tokens -= msg.len() as f64;
        }
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
