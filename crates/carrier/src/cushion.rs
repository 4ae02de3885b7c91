//! A read buffer under TLS that exists only while data streams in.
//!
//! rustls asks the transport for about one record per read, which on a
//! fast path is a syscall every few KiB; a big buffer underneath turns
//! most of those reads into memory copies. But a buffer held by every
//! carrier is resident memory for every idle session (tokio's `BufReader`
//! zeroes its 256 KiB up front, so a reused allocation is all touched).
//! So: reads go straight to the caller until one fills what the caller
//! asked for (more is waiting: data is streaming), then through a buffer
//! of [`CUSHION`] bytes until [`SLOWED_AFTER`] refills in a row bring less
//! than [`SMALL_READ`] each (the stream has slowed), when the buffer is let
//! go. (The count keeps a peer that alternates bursts and trickles from
//! making every few KiB cost a fresh buffer.) A small refill after a pause
//! of [`PAUSED`] lets it go at once: an idle session's keepalives come tens
//! of seconds apart, and eight of them would keep the buffer for minutes.
//! (A path whose round trip is a second or more may so make a fresh buffer
//! once per round trip: one allocation a second at most.)

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The buffer's size while data streams in.
pub const CUSHION: usize = 256 * 1024;
/// A refill smaller than this is a small one.
const SMALL_READ: usize = 1024;
/// A filled read starts the buffer only if at least this much was asked
/// for (rustls asks for a record's last few bytes too).
const MIN_ASK: usize = 4096;
/// This many small refills in a row: the data no longer streams.
const SLOWED_AFTER: u8 = 8;
/// A small refill this long after the one before: the data stopped.
pub const PAUSED: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads `S` through a buffer kept only while reads come in big.
pub struct Cushion<S> {
    inner: S,
    /// Empty (no allocation) while reads are small.
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Small refills in a row.
    small: u8,
    /// When the buffer was last refilled.
    refilled: Option<std::time::Instant>,
}

impl<S> Cushion<S> {
    pub fn new(inner: S) -> Self {
        Cushion {
            inner,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            small: 0,
            refilled: None,
        }
    }

    /// Whether a buffer is held now (for tests).
    pub fn is_buffering(&self) -> bool {
        !self.buf.is_empty()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Cushion<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.pos == me.end {
            if me.buf.is_empty() {
                // No buffer: straight into the caller's.
                let before = out.filled().len();
                let asked = out.remaining();
                ready!(Pin::new(&mut me.inner).poll_read(cx, out))?;
                if asked >= MIN_ASK && out.filled().len() - before == asked {
                    // Filled: more is waiting; buffer from the next read on.
                    me.buf = vec![0; CUSHION];
                    // Timed from here: the first small refill after a
                    // pause lets it go again.
                    me.refilled = Some(std::time::Instant::now());
                }
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut me.buf);
            ready!(Pin::new(&mut me.inner).poll_read(cx, &mut rb))?;
            let got = rb.filled().len();
            (me.pos, me.end) = (0, got);
            let now = std::time::Instant::now();
            let paused = me.refilled.is_some_and(|t| now.duration_since(t) >= PAUSED);
            me.refilled = Some(now);
            me.small = match (got < SMALL_READ, paused) {
                (true, true) => SLOWED_AFTER,
                (true, false) => me.small.saturating_add(1),
                (false, _) => 0,
            };
            if got == 0 {
                // The end: nothing buffered is left to hand over.
                me.let_go();
                return Poll::Ready(Ok(()));
            }
        }
        let n = (me.end - me.pos).min(out.remaining());
        out.put_slice(&me.buf[me.pos..me.pos + n]);
        me.pos += n;
        if me.pos == me.end && me.small >= SLOWED_AFTER {
            // Slowed down: no buffer until reads come in big again.
            me.let_go();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S> Cushion<S> {
    fn let_go(&mut self) {
        self.buf = Vec::new();
        (self.pos, self.end, self.small, self.refilled) = (0, 0, 0, None);
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Cushion<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, b)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn buffers_only_while_reads_come_in_big_and_loses_nothing() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut c = Cushion::new(a);
        // Small: no buffer.
        b.write_all(b"hello").await.unwrap();
        let mut small = [0u8; 4096];
        let n = c.read(&mut small).await.unwrap();
        assert_eq!(&small[..n], b"hello");
        assert!(!c.is_buffering());
        // A burst that fills the caller's reads: buffered, bytes intact.
        let data: Vec<u8> = (0..600_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        b.write_all(&data).await.unwrap();
        let mut got = Vec::new();
        while got.len() < data.len() {
            let n = c.read(&mut small).await.unwrap();
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(got, data);
        // Slow again: the buffer is let go once enough small refills in a
        // row are drained.
        for i in 0..SLOWED_AFTER {
            assert!(c.is_buffering());
            b.write_all(&[i]).await.unwrap();
            let n = c.read(&mut small).await.unwrap();
            assert_eq!(&small[..n], &[i]);
        }
        assert!(!c.is_buffering());
        drop(b);
        assert_eq!(c.read(&mut small).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_small_read_after_a_pause_lets_the_buffer_go_at_once() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut c = Cushion::new(a);
        let mut out = [0u8; 8192];
        b.write_all(&vec![1u8; 300_000]).await.unwrap();
        let mut got = 0;
        while got < 300_000 {
            got += c.read(&mut out).await.unwrap();
        }
        assert!(c.is_buffering());
        tokio::time::sleep(PAUSED + std::time::Duration::from_millis(50)).await;
        // One keepalive after the pause.
        b.write_all(b"ping").await.unwrap();
        let n = c.read(&mut out).await.unwrap();
        assert_eq!(&out[..n], b"ping");
        assert!(!c.is_buffering());
    }

    #[tokio::test]
    async fn a_buffer_never_refilled_goes_at_the_first_small_read_after_a_pause() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut c = Cushion::new(a);
        let mut out = [0u8; 8192];
        // One read that fills what was asked starts the buffer ...
        b.write_all(&[1u8; 8192]).await.unwrap();
        assert_eq!(c.read(&mut out).await.unwrap(), 8192);
        assert!(c.is_buffering());
        tokio::time::sleep(PAUSED + std::time::Duration::from_millis(50)).await;
        // ... and the first keepalive after a pause ends it.
        b.write_all(b"ping").await.unwrap();
        let n = c.read(&mut out).await.unwrap();
        assert_eq!(&out[..n], b"ping");
        assert!(!c.is_buffering());
    }
}
