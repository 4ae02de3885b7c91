//! What both kinds of stream pumps share (a local socket's, in
//! `stream`, and an in-process service's, in
//! `pipe_pumps`): waiting for room to send, taking what arrived,
//! returning credit, and telling the core when a stream's local end fails
//! or closes.

use std::io;
use std::sync::Arc;

use crate::inbound::Part;
use crate::runtime::Shared;
use crate::stream_io::StreamIo;

/// Largest single read from a local socket; split into frames of at most
/// the peer's maximum packet size without copying. Reads never exceed the
/// stream's send-queue room either (`send_queue`, 512 KiB by default), so
/// this only lets a busy stream read as much as its queue takes in one
/// call: on loopback 1 MiB against 256 KiB cut the relay reading the
/// application's socket from 0.45–0.47 to 0.39 ms of CPU per MB
/// (docs/BENCHMARKS.md).
pub(crate) const UPLINK_READ: usize = 1024 * 1024;

/// Waits until stream `id` may send (the peer's credit and the stream's
/// send queue); how much, at most [`UPLINK_READ`]. None once it never may
/// (closed, or its uplink told to stop). `known`: the answer the core gave
/// with the last send, used first (asking again would count a stall
/// twice). A plain poll function, not an `async fn`: it sits in every
/// idle stream's state, where an `async fn` keeps its arguments twice.
/// Polled again without a signal (the relay polls both pumps on any
/// wake-up), it looks at the signal only, not at the session.
pub(crate) fn send_room<'a>(
    shared: &'a Arc<Shared>,
    id: u32,
    io: &'a StreamIo,
    mut known: Option<Option<usize>>,
) -> impl std::future::Future<Output = Option<usize>> + Send + 'a {
    let mut waiting = false;
    std::future::poll_fn(move |cx| loop {
        if waiting {
            std::task::ready!(io.up.poll_notified(cx));
            waiting = false;
        }
        if io.uplink_stopped() {
            return std::task::Poll::Ready(None);
        }
        let room = known
            .take()
            .unwrap_or_else(|| shared.peek(|m| m.send_room(id)));
        match room {
            None => return std::task::Poll::Ready(None),
            Some(0) => {
                shared
                    .window_stalls
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                waiting = true;
            }
            Some(n) => return std::task::Poll::Ready(Some(n.min(UPLINK_READ))),
        }
    })
}

/// Moves what stream `id` received into `pending` (at most
/// [`MAX_WRITE_IOV`] parts); says whether the stream's data has ended
/// (EOF, or closed), and how the local socket must end.
pub(crate) fn take_inbound(io: &StreamIo, pending: &mut Vec<Part>) -> Inbound {
    let mut ib = io.inbox();
    ib.q.take(pending, MAX_WRITE_IOV);
    Inbound {
        eof: ib.q.eof && ib.q.is_empty(),
        closed: ib.closed && ib.q.is_empty(),
        reset: ib.reset,
        abort: ib.abort,
    }
}

pub(crate) struct Inbound {
    pub eof: bool,
    pub closed: bool,
    /// Reset the local socket once everything queued is written.
    pub reset: bool,
    /// Reset it now (the session died).
    pub abort: bool,
}

/// The error a downlink's wait ends with when its session dies.
pub(crate) fn aborted() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "session closed")
}

pub(crate) fn fail(shared: &Arc<Shared>, id: u32, err: io::Error) {
    tracing::debug!(stream = id, "local socket failed: {err}");
    shared.with(|m, _| m.abort(id));
}

/// Buffers handed to one vectored write towards a local socket.
pub(crate) const MAX_WRITE_IOV: usize = 64;

/// Tells the core, when a downlink ends however it ends (its socket half
/// goes with it), that the stream's local socket is closed.
pub(crate) struct LocalClosed(pub Arc<Shared>, pub u32);

impl Drop for LocalClosed {
    fn drop(&mut self) {
        self.0.local_closed(self.1);
    }
}

/// Accounts bytes written to the local socket; the core returns credit to
/// the peer when the window says it is time.
pub(crate) fn credit_delivered(shared: &Arc<Shared>, id: u32, total: usize) {
    shared.with(|m, now| m.delivered(id, total, now.ns()));
}
