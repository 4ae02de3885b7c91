//! An in-process pipe between a stream's pumps and a service that runs on
//! plain threads (the file service). It carries the session's own buffers
//! across without copying them: what the service sends as [`Bytes`] goes
//! out as DATA frames as it is, and DATA arriving is handed over as the
//! slices it came in. A socket pair in its place cost two copies and two
//! system calls per direction, on every byte of a file copy.
//!
//! Bounds: each direction queues at most [`PIPE_QUEUE`] bytes (one more
//! item may finish past it); DATA that waits here because the service is
//! slow is compacted into buffers of its own, as on a socket that is
//! full, so it pins no carrier buffer.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::Notify;

use crate::inbound::{compact_parts, Part};

/// Bytes queued in each direction before the side filling it waits.
pub const PIPE_QUEUE: usize = 512 * 1024;
/// Items smaller than this are gathered into one DATA frame.
const SMALL: usize = 16 * 1024;

#[derive(Default)]
struct Queue {
    q: VecDeque<Part>,
    bytes: usize,
    /// Nothing more will come: the end of the data once `q` is drained.
    ended: bool,
    /// The side that takes from it is gone: what is pushed is refused.
    dropped: bool,
    /// The stream was reset: reads fail.
    reset: bool,
}

impl Queue {
    fn push(&mut self, p: Part) {
        self.bytes += p.data.len();
        self.q.push_back(p);
    }

    /// Up to `max` bytes of the front item.
    fn take(&mut self, max: usize) -> Option<Bytes> {
        let front = self.q.front_mut()?;
        let d = match front.data.len() <= max {
            true => self.q.pop_front()?.data,
            false => front.data.split_to(max),
        };
        self.bytes -= d.len();
        Some(d)
    }
}

#[derive(Default)]
struct Queues {
    /// DATA from the peer, for the service.
    inbound: Queue,
    /// The service's bytes, for the peer.
    outbound: Queue,
}

struct Shared {
    st: Mutex<Queues>,
    /// The service's threads wait here (for data, or for room).
    cv: Condvar,
    /// The uplink waits here for the service's bytes.
    up: Notify,
    /// The downlink waits here for room.
    down: Notify,
    /// How long a service's read or write waits before it fails.
    idle: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Makes a pipe: the end for a stream's pumps, and the service's end,
/// whose reads and writes fail after `idle` without progress.
pub(crate) fn pipe(idle: Duration) -> (PumpEnd, ServicePipe) {
    let sh = Arc::new(Shared {
        st: Mutex::default(),
        cv: Condvar::new(),
        up: Notify::new(),
        down: Notify::new(),
        idle,
    });
    (PumpEnd(sh.clone()), ServicePipe(Arc::new(ServiceGuard(sh))))
}

/// The service's end (blocking). Clones share it: one thread may read
/// while another writes. The pipe closes when the last clone is dropped.
#[derive(Clone)]
pub struct ServicePipe(Arc<ServiceGuard>);

struct ServiceGuard(Arc<Shared>);

impl Drop for ServiceGuard {
    fn drop(&mut self) {
        let sh = &self.0;
        {
            let mut st = sh.lock();
            st.outbound.ended = true;
            st.inbound.dropped = true;
            st.inbound.q.clear();
            st.inbound.bytes = 0;
        }
        sh.up.notify_one();
        sh.down.notify_one();
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the peer went quiet")
}

impl std::fmt::Debug for ServicePipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServicePipe")
    }
}

impl ServicePipe {
    fn sh(&self) -> &Shared {
        &self.0 .0
    }

    /// Waits on the condition variable until `deadline`.
    fn wait<'a>(
        &'a self,
        st: MutexGuard<'a, Queues>,
        deadline: Instant,
    ) -> io::Result<MutexGuard<'a, Queues>> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        let (st, _) = self
            .sh()
            .cv
            .wait_timeout(st, left)
            .unwrap_or_else(|p| p.into_inner());
        Ok(st)
    }

    /// The next bytes from the peer, at most `max`, as they arrived (no
    /// copy); an empty buffer at the end of the stream.
    pub fn read_chunk(&self, max: usize) -> io::Result<Bytes> {
        let deadline = Instant::now() + self.sh().idle;
        let mut st = self.sh().lock();
        loop {
            let q = &mut st.inbound;
            if q.reset {
                return Err(io::ErrorKind::ConnectionReset.into());
            }
            if q.dropped {
                return Ok(Bytes::new());
            }
            if let Some(d) = q.take(max.max(1)) {
                drop(st);
                self.sh().down.notify_one();
                return Ok(d);
            }
            if q.ended {
                return Ok(Bytes::new());
            }
            st = self.wait(st, deadline)?;
        }
    }

    /// Waits until there is something to read (or the end, or a reset).
    pub fn wait_readable(&self) -> io::Result<()> {
        let deadline = Instant::now() + self.sh().idle;
        let mut st = self.sh().lock();
        loop {
            let q = &st.inbound;
            if q.reset || q.dropped || q.ended || !q.q.is_empty() {
                return Ok(());
            }
            st = self.wait(st, deadline)?;
        }
    }

    /// Sends `data` as it is (no copy), once the queue has room.
    pub fn send(&self, data: Bytes) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let deadline = Instant::now() + self.sh().idle;
        let mut st = self.sh().lock();
        loop {
            let q = &mut st.outbound;
            if q.dropped || q.ended {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            if q.bytes < PIPE_QUEUE {
                q.push(Part { data, owned: true });
                drop(st);
                self.sh().up.notify_one();
                return Ok(());
            }
            st = self.wait(st, deadline)?;
        }
    }

    /// Ends our sending (the peer sees the end of the stream once it has
    /// everything before it), and with `both` our reading too.
    pub fn shutdown(&self, both: bool) {
        {
            let mut st = self.sh().lock();
            st.outbound.ended = true;
            if both {
                st.inbound.dropped = true;
                st.inbound.q.clear();
                st.inbound.bytes = 0;
            }
        }
        self.sh().cv.notify_all();
        self.sh().up.notify_one();
        self.sh().down.notify_one();
    }
}

impl Read for ServicePipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let d = self.read_chunk(buf.len())?;
        buf[..d.len()].copy_from_slice(&d);
        Ok(d.len())
    }
}

impl Write for ServicePipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(PIPE_QUEUE);
        self.send(Bytes::copy_from_slice(&buf[..n]))?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The pumps' end (opaque: [`crate::LocalStream::service`] makes one).
pub struct PumpEnd(Arc<Shared>);

impl std::fmt::Debug for PumpEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PumpEnd")
    }
}

impl PumpEnd {
    pub(crate) fn split(self) -> (PipeSource, PipeSink) {
        (PipeSource(self.0.clone()), PipeSink(self.0))
    }
}

/// What the uplink takes from: the service's bytes.
pub(crate) struct PipeSource(Arc<Shared>);

/// What one [`PipeSource::take`] found.
pub(crate) enum Taken {
    Data(Bytes),
    End,
    Empty,
}

impl PipeSource {
    /// Up to `max` bytes the service sent: a large item as it is, small
    /// ones (headers, answers) gathered into one buffer.
    pub fn take(&self, max: usize) -> Taken {
        let mut st = self.0.lock();
        let q = &mut st.outbound;
        let Some(first) = q.take(max) else {
            return match q.ended {
                true => Taken::End,
                false => Taken::Empty,
            };
        };
        let data = match first.len() >= SMALL {
            true => first,
            false => {
                let mut run = BytesMut::from(&first[..]);
                while run.len() < max && q.q.front().is_some_and(|p| p.data.len() < SMALL) {
                    match q.take(max - run.len()) {
                        Some(d) => run.extend_from_slice(&d),
                        None => break,
                    }
                }
                run.freeze()
            }
        };
        drop(st);
        self.0.cv.notify_all();
        Taken::Data(data)
    }

    pub async fn wait(&self) {
        self.0.up.notified().await
    }
}

impl Drop for PipeSource {
    fn drop(&mut self) {
        {
            let mut st = self.0.lock();
            st.outbound.dropped = true;
            st.outbound.q.clear();
            st.outbound.bytes = 0;
        }
        self.0.cv.notify_all();
    }
}

/// Where the downlink puts DATA for the service.
pub(crate) struct PipeSink(Arc<Shared>);

/// Why [`PipeSink::push`] could not take everything.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The queue is full: wait with [`PipeSink::wait`].
    Full,
    /// The service is gone.
    Gone,
}

impl PipeSink {
    /// Moves parts from the front of `parts` while the queue has room;
    /// returns the bytes moved, or why none could be.
    pub fn push(&self, parts: &mut Vec<Part>) -> Result<usize, Refused> {
        let mut st = self.0.lock();
        let q = &mut st.inbound;
        if q.dropped {
            return Err(Refused::Gone);
        }
        let mut moved = 0;
        let mut n = 0;
        while n < parts.len() && q.bytes + moved < PIPE_QUEUE {
            moved += parts[n].data.len();
            n += 1;
        }
        for p in parts.drain(..n) {
            q.push(p);
        }
        if n == 0 {
            // The service is slow: what waits for it keeps only its own
            // bytes, not the carrier buffers they arrived in.
            let mut held: Vec<Part> = q.q.drain(..).collect();
            compact_parts(&mut held);
            q.q.extend(held);
            return Err(Refused::Full);
        }
        drop(st);
        self.0.cv.notify_all();
        Ok(moved)
    }

    pub async fn wait(&self) {
        self.0.down.notified().await
    }

    /// The end of the stream: the service reads what is queued, then 0.
    pub fn end(&self) {
        self.0.lock().inbound.ended = true;
        self.0.cv.notify_all();
    }

    /// The stream was reset: the service's reads fail.
    pub fn reset(&self) {
        self.0.lock().inbound.reset = true;
        self.0.cv.notify_all();
    }
}

impl Drop for PipeSink {
    fn drop(&mut self) {
        // Stopped early (the session closed): the service sees the end.
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(b: &[u8]) -> Part {
        Part {
            data: Bytes::copy_from_slice(b),
            owned: false,
        }
    }

    #[test]
    fn small_writes_are_gathered_and_large_ones_kept_whole() {
        let (pumps, mut svc) = pipe(Duration::from_secs(1));
        let (src, _sink) = pumps.split();
        svc.write_all(b"abc").unwrap();
        svc.write_all(b"def").unwrap();
        let big = Bytes::from(vec![7u8; 100_000]);
        svc.send(big.clone()).unwrap();
        match src.take(1 << 20) {
            Taken::Data(d) => assert_eq!(&d[..], b"abcdef"),
            _ => panic!("nothing taken"),
        }
        match src.take(1 << 20) {
            Taken::Data(d) => assert_eq!(d.as_ptr(), big.as_ptr(), "copied"),
            _ => panic!("nothing taken"),
        }
        assert!(matches!(src.take(10), Taken::Empty));
        svc.shutdown(false);
        assert!(matches!(src.take(10), Taken::End));
    }

    #[test]
    fn a_full_queue_refuses_and_compacts() {
        let (pumps, svc) = pipe(Duration::from_secs(1));
        let (_src, sink) = pumps.split();
        let mut parts: Vec<Part> = (0..200).map(|_| part(&[1u8; 8192])).collect();
        let moved = sink.push(&mut parts).unwrap();
        assert_eq!(moved, PIPE_QUEUE);
        assert!(matches!(sink.push(&mut parts), Err(Refused::Full)));
        assert!(svc.0 .0.lock().inbound.q.iter().all(|p| p.owned));
        let d = svc.read_chunk(usize::MAX).unwrap();
        assert_eq!(d.len(), PIPE_QUEUE, "compacted into one buffer");
        assert!(sink.push(&mut parts).is_ok());
        drop(svc);
        assert!(matches!(sink.push(&mut parts), Err(Refused::Gone)));
    }

    #[test]
    fn reads_see_the_end_a_reset_and_a_timeout() {
        let (pumps, mut svc) = pipe(Duration::from_millis(50));
        let (src, sink) = pumps.split();
        let t = Instant::now();
        let e = svc.read(&mut [0u8; 4]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(50));
        sink.push(&mut vec![part(b"xy")]).unwrap();
        sink.end();
        let mut got = Vec::new();
        svc.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"xy");
        sink.reset();
        assert_eq!(
            svc.read(&mut [0u8; 4]).unwrap_err().kind(),
            io::ErrorKind::ConnectionReset
        );
        drop(src);
        assert_eq!(
            svc.write(b"z").unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }
}
