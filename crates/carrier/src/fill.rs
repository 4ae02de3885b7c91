//! The write side of a carrier's TCP socket: keeps the kernel's send
//! buffer filled, short of a small reserve.
//!
//! Why not just write until the socket says "would block" and wait for the
//! runtime to report it writable? Because Linux reports a TCP socket
//! writable only once a third of its send buffer is free, and on a long
//! path that buffer is what limits the bytes in flight: a sender woken at
//! two thirds keeps, on average, well under a full buffer in flight. On this
//! project's test path (100 ms RTT, 4 MiB buffers) that is 220 Mbit/s
//! against 330 for a sender that tops the buffer up every millisecond
//! (docs/BENCHMARKS.md, issue 11). So while the buffer is above that mark
//! the writer looks again on a 1 ms tick, and writes what fits.
//!
//! Why a reserve? A buffer kept completely full makes an urgent frame (a
//! keystroke, a control frame) wait for the next ACK to free room, and on a
//! bulk-loaded path ACKs come in bursts, tens of ms apart. Bulk writes stop
//! short of the reserve; urgent bytes may use it (plain TCP sends them
//! directly, see [`crate::UrgentSend`]; TLS and WebSocket raise
//! [`UrgentFlag`] while they write them).

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::sockopt::{notsent_lowat, poll_writable, send_space, set_notsent_lowat, tcp_path};

/// How often a writer above the kernel's wake-up mark looks again.
const TICK: Duration = Duration::from_millis(1);
/// After this many ticks without progress (the peer is not reading, or
/// the path is dead), look only every [`IDLE_TICK`].
const TICKS_BEFORE_IDLE: u32 = 200;
const IDLE_TICK: Duration = Duration::from_millis(50);
/// Room kept free for urgent bytes: this much, or 1/32 of the buffer.
const RESERVE_MIN: u64 = 64 * 1024;
/// Written bytes are counted against the free room with this much extra
/// (1/8) for the kernel's per-packet overhead, so the estimate errs low.
const OVERHEAD_SHIFT: u32 = 3;
/// Below this TCP_NOTSENT_LOWAT (a slow path: the probe sizes the mark to
/// 2 ms of the delivery rate), writes are also held to what the kernel's
/// unsent queue has room for. The kernel checks the mark only when it
/// starts a new packet buffer, and one buffer grows to half the peer's
/// window (64 KiB), so on its own the queue overshoots the mark by that
/// much: 0.3 s at 1.5 Mbit/s, which an urgent frame or a datagram written
/// behind it waits out (docs/BENCHMARKS.md, the voice flow beside bulk).
const SMALL_LOWAT: u32 = 32 * 1024;
/// Urgent bytes may go this far past the mark on a slow path (room for
/// the frames that lead the write, not for the bulk behind them).
const URGENT_UNSENT: u64 = 16 * 1024;
/// How many refreshes of the room estimate reuse the mark last read (the
/// probe changes it at most every 500 ms).
const LOWAT_REREAD: u32 = 32;
/// No limit from the unsent queue (a fast path).
const UNLIMITED: u64 = u64::MAX / 4;

/// Raised by the session's writer while the bytes it writes include
/// urgent frames: they may use the reserve.
pub type UrgentFlag = Arc<AtomicBool>;

/// The smallest TCP_NOTSENT_LOWAT the path's probe may set, shared with
/// the writer: below [`crate::NOTSENT_MIN`] the socket is a lane of a
/// striped session, whose unsent queue the writer leaves to the kernel
/// (the session spreads chunks by the room each lane's socket has).
pub(crate) type Floor = Arc<AtomicU32>;

/// The TCP socket under a writer.
pub(crate) trait TcpSide {
    fn tcp(&self) -> &TcpStream;
}

impl TcpSide for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl TcpSide for OwnedWriteHalf {
    fn tcp(&self) -> &TcpStream {
        self.as_ref()
    }
}

pub(crate) struct Filler<T> {
    inner: T,
    /// Free room in the send buffer as last read, less what was written
    /// since (with overhead). Re-read whenever it gets near the reserve.
    room: u64,
    reserve: u64,
    /// The kernel's accounting is unavailable: behave as a plain socket.
    blind: bool,
    urgent: UrgentFlag,
    /// While urgent bytes are written, the socket's TCP_NOTSENT_LOWAT is
    /// raised by the reserve (they must not wait for the kernel's unsent
    /// queue to drain either); this is the value to put back.
    lowered_to: Option<u32>,
    /// Room left in the kernel's unsent queue on a slow path (less what
    /// was written since it was read), for ordinary and for urgent bytes
    /// (both measured from the same target, so that a run of urgent writes
    /// cannot ratchet the queue up); [`UNLIMITED`] on a fast one.
    unsent: u64,
    unsent_urgent: u64,
    /// TCP_NOTSENT_LOWAT as last read, and refreshes until it is read again.
    lowat: u32,
    lowat_age: u32,
    floor: Floor,
    tick: Pin<Box<Sleep>>,
    armed: bool,
    misses: u32,
}

impl<T: TcpSide> Filler<T> {
    pub(crate) fn new(inner: T, urgent: UrgentFlag, floor: Floor) -> io::Result<Filler<T>> {
        Ok(Filler {
            inner,
            room: 0,
            reserve: RESERVE_MIN,
            blind: false,
            urgent,
            lowered_to: None,
            unsent: UNLIMITED,
            unsent_urgent: UNLIMITED,
            lowat: u32::MAX,
            lowat_age: 0,
            floor,
            tick: Box::pin(tokio::time::sleep(TICK)),
            armed: false,
            misses: 0,
        })
    }

    /// Raises or restores TCP_NOTSENT_LOWAT as the urgent flag went up
    /// or down since the last write.
    fn follow_flag(&mut self, urgent: bool) {
        if urgent == self.lowered_to.is_some() {
            return;
        }
        let sock = socket2::SockRef::from(self.inner.tcp());
        if urgent {
            if let Some(v) = notsent_lowat(&sock) {
                let boost = u32::try_from(self.reserve).unwrap_or(u32::MAX);
                if set_notsent_lowat(&sock, v.saturating_add(boost)).is_ok() {
                    self.lowered_to = Some(v);
                }
            }
        } else if let Some(v) = self.lowered_to.take() {
            let _ = set_notsent_lowat(&sock, v);
        }
    }

    /// Bytes that may be written now, of the `want` offered.
    fn limit(&mut self, want: usize) -> usize {
        let urgent = self.urgent.load(Ordering::Relaxed);
        self.follow_flag(urgent);
        if self.blind {
            return usize::MAX;
        }
        // Re-read only when the estimate would cut this write short: the
        // estimate errs low, and small writes then cost no extra call.
        let unsent = if urgent {
            self.unsent_urgent
        } else {
            self.unsent
        };
        if self.room < self.reserve + want as u64 || unsent < want as u64 {
            match send_space(&socket2::SockRef::from(self.inner.tcp())) {
                Some(s) => {
                    self.room = u64::from(s.free());
                    // Never more than a quarter: a new socket's buffer starts
                    // small and grows only while the sender keeps it busy.
                    let buf = u64::from(s.sndbuf);
                    self.reserve = RESERVE_MIN.max(buf / 32).min(buf / 4);
                    (self.unsent, self.unsent_urgent) = self.unsent_room(urgent);
                }
                None => {
                    self.blind = true;
                    return usize::MAX;
                }
            }
        }
        let room = if urgent {
            self.room.min(self.unsent_urgent)
        } else {
            self.room.saturating_sub(self.reserve).min(self.unsent)
        };
        usize::try_from(room).unwrap_or(usize::MAX)
    }

    /// Room in the kernel's unsent queue on a slow path (see
    /// [`SMALL_LOWAT`]) for ordinary and for urgent bytes; [`UNLIMITED`] on
    /// a fast one.
    fn unsent_room(&mut self, urgent: bool) -> (u64, u64) {
        // While urgent bytes are written the mark is raised (above): keep
        // the one read before.
        if self.lowat_age == 0 && !urgent {
            self.lowat =
                notsent_lowat(&socket2::SockRef::from(self.inner.tcp())).unwrap_or(u32::MAX);
            self.lowat_age = LOWAT_REREAD;
        }
        self.lowat_age = self.lowat_age.saturating_sub(1);
        let lane = self.floor.load(Ordering::Relaxed) < crate::NOTSENT_MIN;
        // 0: never set, the system's default (no mark at all).
        if self.lowat == 0 || self.lowat >= SMALL_LOWAT || lane {
            return (UNLIMITED, UNLIMITED);
        }
        // At least half a window stays queued, whatever the mark: the mark
        // follows a delivery rate sampled every 500 ms, which reads low
        // just after a loss, and a fast path must not run dry until the
        // next sample (nor stop growing its window for want of data).
        match tcp_path(&socket2::SockRef::from(self.inner.tcp())) {
            Some(p) => {
                let target = u64::from(self.lowat).max(p.cwnd_bytes / 2);
                let notsent = u64::from(p.notsent);
                (
                    target.saturating_sub(notsent),
                    (target + URGENT_UNSENT).saturating_sub(notsent),
                )
            }
            None => (UNLIMITED, UNLIMITED),
        }
    }

    fn wrote(&mut self, n: usize) {
        let n = n as u64;
        self.unsent = self.unsent.saturating_sub(n);
        self.unsent_urgent = self.unsent_urgent.saturating_sub(n);
        self.room = self.room.saturating_sub(n + (n >> OVERHEAD_SHIFT));
        self.misses = 0;
        self.armed = false;
    }

    /// Waits for the next tick; Ready when it fired.
    fn poll_tick(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.armed {
            let every = if self.misses > TICKS_BEFORE_IDLE {
                IDLE_TICK
            } else {
                TICK
            };
            self.tick.as_mut().reset(Instant::now() + every);
            self.armed = true;
        }
        match self.tick.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.armed = false;
                self.misses = self.misses.saturating_add(1);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// One write of at most `limit` bytes through `send`.
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        want: usize,
        send: impl Fn(&socket2::Socket, usize) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        // Bounded: each round either returns or saw a fresh wake-up.
        for _ in 0..8 {
            let limit = self.limit(want);
            if limit > 0 {
                let tcp = self.inner.tcp();
                let raw = &*socket2::SockRef::from(tcp);
                // Through the runtime first, so that "would block" clears
                // its cached readiness; then directly, as the runtime's
                // "not writable" may only mean "above the wake-up mark".
                let r = match tcp.try_io(Interest::WRITABLE, || send(raw, limit)) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => send(raw, limit),
                    r => r,
                };
                match r {
                    Ok(n) => {
                        self.wrote(n);
                        return Poll::Ready(Ok(n));
                    }
                    Err(e) if e.kind() != io::ErrorKind::WouldBlock => {
                        return Poll::Ready(Err(e));
                    }
                    Err(_) => {
                        // Really full (or TCP_NOTSENT_LOWAT reached): the
                        // kernel wakes us below its mark, the tick above it.
                        self.room = 0;
                        if tcp.poll_write_ready(cx).is_ready() {
                            continue;
                        }
                    }
                }
            }
            // Asking the kernel whether the socket is writable marks it as
            // wanting room when it is not, which is what lets the kernel
            // grow the send buffer as ACKs come in (a sender that never
            // hits "would block" would otherwise keep its first, small one).
            let _ = poll_writable(&socket2::SockRef::from(self.inner.tcp()));
            if self.poll_tick(cx).is_pending() {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// `bufs` cut to at most `limit` bytes.
fn truncate<'a>(bufs: &'a [IoSlice<'a>], limit: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(bufs.len());
    let mut left = limit;
    for b in bufs {
        if left == 0 {
            break;
        }
        let take = b.len().min(left);
        out.push(IoSlice::new(&b[..take]));
        left -= take;
    }
    out
}

impl<T: TcpSide + AsyncRead + Unpin> AsyncRead for Filler<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: TcpSide + AsyncWrite + Unpin> AsyncWrite for Filler<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, buf.len(), |s, limit| {
            s.send(&buf[..buf.len().min(limit)])
        })
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        self.poll_send(cx, total, |s, limit| {
            if total <= limit {
                s.send_vectored(bufs)
            } else {
                s.send_vectored(&truncate(bufs, limit))
            }
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    /// Bulk writes stop short of the reserve when the peer stops reading;
    /// urgent bytes still go in at once; everything arrives in order.
    #[tokio::test]
    async fn keeps_the_reserve_for_urgent_bytes() {
        let (a, mut b) = pair().await;
        let flag = UrgentFlag::default();
        let mut w = Filler::new(a, flag.clone(), Floor::default()).unwrap();
        let block = vec![7u8; 64 * 1024];
        let mut sent = 0usize;
        // Fill until a write has waited 200 ms (the peer reads nothing).
        loop {
            let t = tokio::time::timeout(Duration::from_millis(200), w.write(&block)).await;
            match t {
                Ok(r) => sent += r.unwrap(),
                Err(_) => break,
            }
        }
        assert!(sent > 0);
        // Windows keeps its send-queue accounting to itself: no reserve is
        // kept there, urgent bytes queue behind bulk.
        let space = send_space(&socket2::SockRef::from(w.inner.tcp()));
        if cfg!(windows) && space.is_none() {
            return;
        }
        let space = space.unwrap();
        let reserve = RESERVE_MIN
            .max(u64::from(space.sndbuf) / 32)
            .min(u64::from(space.sndbuf) / 4);
        assert!(
            u64::from(space.free()) >= reserve / 2,
            "bulk used the reserve: {space:?}, reserve {reserve}"
        );
        flag.store(true, Ordering::Relaxed);
        let urgent = [9u8; 100];
        let n = tokio::time::timeout(Duration::from_millis(100), w.write(&urgent))
            .await
            .expect("an urgent write waits although the reserve is free")
            .unwrap();
        assert_eq!(n, urgent.len());
        w.shutdown().await.unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got.len(), sent + urgent.len());
        assert!(got[..sent].iter().all(|&x| x == 7));
        assert!(got[sent..].iter().all(|&x| x == 9));
    }

    /// A blocked write resumes by itself once the peer reads again (the
    /// 1 ms tick, not only the kernel's wake-up at a third free).
    #[tokio::test]
    async fn resumes_after_the_peer_reads() {
        let (a, mut b) = pair().await;
        let mut w = Filler::new(a, UrgentFlag::default(), Floor::default()).unwrap();
        let total = 32 * 1024 * 1024;
        let writer = tokio::spawn(async move {
            let block = vec![5u8; 256 * 1024];
            let mut left = total;
            while left > 0 {
                let n = w.write(&block[..left.min(block.len())]).await.unwrap();
                left -= n;
            }
            w.shutdown().await.unwrap();
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = tokio::time::timeout(Duration::from_secs(10), b.read(&mut buf))
                .await
                .expect("the writer stalled")
                .unwrap();
            if n == 0 {
                break;
            }
            assert!(buf[..n].iter().all(|&x| x == 5));
            got += n;
        }
        writer.await.unwrap();
        assert_eq!(got, total);
    }
}
