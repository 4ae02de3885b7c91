//! The two pumps of one stream, and the relay that runs them as one task.
//!
//! Neither holds a buffer while its socket is idle: the uplink waits for the
//! socket to be readable before it allocates one, and the downlink takes its
//! data from the stream's inbound queue only when there is some. An idle
//! stream costs its relay's state, its socket and its entries — about a
//! KiB (docs/BENCHMARKS.md, 10 000 idle streams).

use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::task::Poll;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncWriteExt;

use crate::driver::AbortHandle;
use crate::inbound::{compact_parts, Part};
use crate::local::{read_now, LocalRead, LocalStream, LocalWrite, PairStream};
use crate::pump::{
    aborted, credit_delivered, fail, send_room, take_inbound, Inbound, LocalClosed, UPLINK_READ,
};
use crate::runtime::{Shared, Socket};
use crate::stream_io::StreamIo;

/// First read of a new stream; reads grow while they come back full, and a
/// stream keeps its size across pauses (the buffer itself is released
/// while the socket is idle, so the size costs nothing then), so a
/// request/response stream reads each large message in one go.
const UPLINK_FIRST_READ: usize = 64 * 1024;
/// A read that fills less than this share of its buffer is copied out, so
/// queued frames never pin much more memory than the bytes they carry.
const SHORT_READ_SHARE: usize = 4;

/// Starts relaying between stream `id` and `sock`. A lease the socket came
/// with is held as long as its pumps run.
pub(crate) fn spawn_pumps(shared: &Arc<Shared>, id: u32, sock: LocalStream) {
    let mut sock = sock;
    let mut leases = Vec::new();
    while let LocalStream::Leased(inner, lease) = sock {
        leases.push(lease);
        sock = *inner;
    }
    let lease = (!leases.is_empty()).then(|| Arc::new(leases));
    let sock = match sock {
        LocalStream::Udp(sock) => return crate::flow::spawn_connected(shared, id, sock, lease),
        other => other,
    };
    let Some(io) = shared.pumps_io(id) else {
        return;
    };
    let local = match &sock {
        LocalStream::Tcp(s) => s.peer_addr().ok().map(|a| a.to_string()),
        _ => None,
    };
    let (up, is_relay) = match sock {
        LocalStream::Tcp(sock) => {
            let _ = longhaul_carrier::tune_socket(&sock);
            let relay = relay_tcp(shared.clone(), id, io.clone(), sock);
            (spawn_holding(shared, &lease, relay), true)
        }
        LocalStream::Pair(sock) => {
            let relay = relay_pair(shared.clone(), id, io.clone(), sock);
            (spawn_holding(shared, &lease, relay), true)
        }
        LocalStream::Service(pipe) => {
            let (r, w) = pipe.split();
            spawn_holding(
                shared,
                &lease,
                crate::pipe_pumps::downlink(shared.clone(), id, io.clone(), w),
            );
            let up = crate::pipe_pumps::uplink(shared.clone(), id, io.clone(), r);
            (spawn_holding(shared, &lease, up), false)
        }
        LocalStream::Udp(_) | LocalStream::Leased(..) => return,
    };
    let relay = is_relay.then_some(&*io);
    shared.set_uplink(id, up.abort_handle(), relay, local);
}

// Both pumps of a TCP socket's stream as one future: one task, one state
// and the socket's halves borrowed rather than shared (an idle stream
// costs half of what two tasks did). The uplink alone stops when the
// stream closes ([`StreamIo::stop_uplink`]): the downlink may still have
// bytes to write, or a reset to give. (No wrapper futures here: each
// layer of `async fn` would keep its own copy of what it hands on; for
// the same reason these functions return `async` blocks, which use their
// captures in place where an `async fn` copies its arguments.)
// `relay_tcp` and `relay_pair` differ only in the socket's type.
macro_rules! relay_fn {
    ($(#[$doc:meta])* $name:ident, $sock:ty) => {
        $(#[$doc])*
        #[allow(clippy::manual_async_fn)] // in place, for its size (above)
        fn $name(
            shared: Arc<Shared>,
            id: u32,
            io: Arc<StreamIo>,
            mut sock: $sock,
        ) -> impl Future<Output = ()> + Send {
            async move {
                let (rd, wr) = sock.split();
                futures_util::future::join(
                    uplink(shared.clone(), id, io.clone(), rd),
                    downlink(shared, id, io, wr),
                )
                .await;
            }
        }
    };
}

relay_fn!(relay_tcp, tokio::net::TcpStream);
relay_fn!(
    /// [`relay_tcp`] for a socket pair's end (the same on Windows, whose
    /// pair is TCP).
    relay_pair,
    PairStream
);

/// Spawns `f` as one of the session's tasks, holding `lease` (if any)
/// until it ends. Without a lease `f` is spawned as it is: a wrapper would
/// store the future twice over (an idle stream's memory counts).
fn spawn_holding<F: std::future::Future<Output = ()> + Send + 'static>(
    shared: &Arc<Shared>,
    lease: &Option<Arc<Vec<crate::local::Lease>>>,
    f: F,
) -> crate::driver::Task {
    match lease.clone() {
        None => shared.spawn(f),
        Some(held) => shared.spawn(async move {
            let _held = held;
            f.await
        }),
    }
}

/// Local socket → DATA frames, as fast as the peer's credit and the
/// stream's send queue allow.
#[allow(clippy::manual_async_fn)] // in place, for its size (above)
pub(crate) fn uplink(
    shared: Arc<Shared>,
    id: u32,
    io: Arc<StreamIo>,
    mut rd: impl LocalRead,
) -> impl Future<Output = ()> + Send {
    async move {
        let mut buf = BytesMut::new();
        // Capacity of `buf`'s allocation when it was made.
        let mut alloc = 0;
        let mut size = UPLINK_FIRST_READ;
        // Room left after the last send, asked under the same lock.
        let mut room = None;
        loop {
            let Some(mut n) = send_room(&shared, id, &io, room.take()).await else {
                return;
            };
            // Readiness first: an idle socket holds no buffer.
            if buf.capacity() == 0 {
                // Ends when the stream closes (`StreamIo::stop_uplink`, which
                // wakes the relay) as well as when the socket has data.
                let ready = poll_fn(|cx| match io.uplink_stopped() {
                    true => Poll::Ready(Ok(false)),
                    false => rd.poll_read_ready(cx).map_ok(|()| true),
                });
                match ready.await {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(err) => return fail(&shared, id, err),
                }
                // Other streams may have taken the session's room meanwhile
                // (its queue is bounded in total): ask again, with no wait
                // between the answer and the read.
                match shared.peek(|m| m.send_room(id)) {
                    None => return,
                    Some(0) => {
                        // Counted as a stall already: wait, without asking twice.
                        room = Some(Some(0));
                        continue;
                    }
                    Some(now) => n = now.min(UPLINK_READ),
                }
                // A fresh buffer, never a grown one: growing a uniquely owned
                // buffer reallocates and copies everything already sent out of
                // it (seen at 4.5 % of the relay's CPU).
                buf = BytesMut::with_capacity(size.min(n));
                alloc = buf.capacity();
            }
            let offered = buf.capacity().min(n);
            // The stream may close while a read waits for the runtime's
            // budget: no bytes are taken from the socket after that.
            let k = match read_now(&mut rd, &mut buf, n, || io.uplink_stopped()).await {
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Drained: let go of the buffer until data comes again.
                    buf = BytesMut::new();
                    continue;
                }
                Err(err) => return fail(&shared, id, err),
            };
            if k == offered {
                size = (size * 2).min(UPLINK_READ);
            }
            let data = if k * SHORT_READ_SHARE < alloc {
                // A short read: copy it out and keep the buffer for the next.
                let d = Bytes::copy_from_slice(&buf[..k]);
                buf.clear();
                d
            } else {
                buf.split().freeze()
            };
            if buf.capacity() * SHORT_READ_SHARE < alloc {
                // What is left could only take short reads: start afresh.
                buf = BytesMut::new();
            }
            if k == 0 {
                return shared.with(|m, _| m.send_eof(id));
            }
            room = Some(shared.with(|m, _| {
                m.send(id, data);
                m.send_room(id)
            }));
        }
    }
}

/// Inbound DATA → local socket; credit goes back only for written bytes.
#[allow(clippy::manual_async_fn)] // in place, for its size (above)
pub(crate) fn downlink(
    shared: Arc<Shared>,
    id: u32,
    io: Arc<StreamIo>,
    mut wr: impl LocalWrite,
) -> impl Future<Output = ()> + Send {
    async move {
        let _closed = LocalClosed(shared.clone(), id);
        let mut pending: Vec<Part> = Vec::new();
        loop {
            let Inbound {
                eof,
                closed,
                reset,
                abort,
            } = take_inbound(&io, &mut pending);
            if abort {
                wr.reset();
                return;
            }
            if pending.is_empty() && !eof {
                if closed {
                    if reset {
                        // What was written reaches the application before the
                        // reset does (a reset discards unsent bytes).
                        // Boxed: rare, and in place it would double an
                        // idle stream's state.
                        Box::pin(settle(&wr, &io)).await;
                        wr.reset();
                    } else {
                        // No more data: the application sees its end now, not
                        // once the relay's uplink has ended too.
                        let _ = wr.shutdown().await;
                    }
                    return;
                }
                io.down.notified().await;
                continue;
            }
            if !pending.is_empty() {
                let total: usize = pending.iter().map(|p| p.data.len()).sum();
                // Boxed for the same reason: a write is one allocation among
                // many, an idle stream's state is counted in thousands.
                if let Err(err) = Box::pin(write_parts(&mut wr, &mut pending, &io)).await {
                    wr.reset();
                    return fail(&shared, id, err);
                }
                // Release the vector's buffer: an idle stream keeps nothing.
                pending = Vec::new();
                credit_delivered(&shared, id, total);
            }
            if eof {
                let _ = wr.shutdown().await;
                shared.with(|m, _| m.eof_delivered(id));
                // Nothing may follow EOF (the core checks it).
                return;
            }
        }
    }
}

/// Longest a reset waits for the application to take what was written.
const SETTLE_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits (at most [`SETTLE_MAX`], or until the session dies) until the
/// local socket has no bytes left unacknowledged.
async fn settle(wr: &impl LocalWrite, io: &StreamIo) {
    let start = tokio::time::Instant::now();
    let mut pause = std::time::Duration::from_micros(200);
    while wr.unacked() > 0 && start.elapsed() < SETTLE_MAX && !io.inbox().abort {
        tokio::time::sleep(pause).await;
        // At most 10 checks a second per stream once it waits.
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
    }
}

/// How long a full local socket is waited for before its stream counts as
/// stalled.
const STALLED_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

/// Writes every part. When the socket stays full ([`STALLED_AFTER`]), the
/// stream is marked blocked and what it holds is compacted, so that a
/// consumer that stops reading keeps only its own bytes in memory, not the
/// carrier buffers they came in (until then the session's bound on pinned
/// buffers, `MAX_PINNED_CHUNKS`, holds).
async fn write_parts(
    wr: &mut impl LocalWrite,
    parts: &mut Vec<Part>,
    io: &StreamIo,
) -> io::Result<()> {
    let mut start = 0;
    let mut blocked = false;
    // Ends STALLED_AFTER after the socket was first found full in this
    // call. The allowance starts again with each call on purpose: carried
    // while the queue stays non-empty, it would mark every bulk stream
    // whose consumer is a little slower than the path stalled, and copy
    // all it gets. A peer that spreads slices so that a slow consumer keeps
    // buffers referenced costs the session copying (CPU), never memory: the
    // session's pin bound (MAX_PINNED_CHUNKS) holds.
    let mut stall: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    while start < parts.len() {
        let r = {
            let slices: Vec<IoSlice<'_>> = parts[start..]
                .iter()
                .map(|p| IoSlice::new(&p.data))
                .collect();
            wr.try_write_vectored(&slices)
        };
        match r {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(mut left) => {
                while left > 0 && start < parts.len() {
                    let d = &mut parts[start].data;
                    if d.len() <= left {
                        left -= d.len();
                        start += 1;
                    } else {
                        d.advance(left);
                        left = 0;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // A consumer that takes a moment (a full socket under bulk
                // data, drained within milliseconds) is waited for with
                // the slices as they are: copying everything that arrives
                // meanwhile cost a bulk receiver ≈ 5 % of its CPU. One that
                // stays full past STALLED_AFTER is stalled.
                if !blocked {
                    let stalled_at =
                        stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(STALLED_AFTER)));
                    let quick = tokio::select! {
                        r = poll_fn(|cx| wr.poll_write_ready(cx)) => Some(r),
                        _ = io.down.notified() => Some(match io.inbox().abort {
                            true => Err(aborted()),
                            false => Ok(()),
                        }),
                        _ = stalled_at.as_mut() => None,
                    };
                    if let Some(r) = quick {
                        r?;
                        continue;
                    }
                    blocked = true;
                    parts.drain(..start);
                    start = 0;
                    compact_parts(parts);
                    let mut ib = io.inbox();
                    ib.blocked = true;
                    ib.q.compact();
                }
                // A full socket must not keep the task (and its session)
                // once the session is gone: the inbox says so.
                tokio::select! {
                    r = poll_fn(|cx| wr.poll_write_ready(cx)) => r?,
                    _ = io.down.notified() => {
                        if io.inbox().abort {
                            return Err(aborted());
                        }
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    if blocked {
        io.inbox().blocked = false;
    }
    parts.clear();
    Ok(())
}

/// The runtime's side of a stream's local socket: which pumps run, and
/// whether the socket is open (the multiplexer keeps the stream's slot
/// until it closes).
impl Shared {
    /// The inbound queue and wake-ups of stream `id`, for its pumps: the
    /// live stream's, or the one it left if it finished before its socket
    /// was attached (its last bytes and its end still go to the socket).
    pub fn pumps_io(&self, id: u32) -> Option<Arc<StreamIo>> {
        let mut st = self.lock();
        if let Some(s) = st.streams.get_mut(&id) {
            s.socket = Socket::Open;
            let io = s.io.clone();
            // Until the downlink closes the socket, the stream keeps its
            // slot and budget, even once closed (`Mux::local_closed`).
            st.conn_mut().mux_mut().local_opened(id);
            return Some(io);
        }
        let io = st.unattached.remove(&id)?;
        st.lingering.insert(id, io.clone());
        Some(io)
    }

    /// A stream's downlink ended: its socket is shut down for writing (or
    /// reset), and closes once the uplink has ended too.
    pub fn local_closed(self: &Arc<Self>, id: u32) {
        let mut st = self.lock();
        st.lingering.remove(&id);
        if let Some(s) = st.streams.get_mut(&id) {
            s.socket = Socket::Closed;
        }
        st.conn_mut().mux_mut().local_closed(id);
        self.dispatch(&mut st);
    }

    /// The opener of `id` went away without attaching a socket.
    pub fn forget_unattached(&self, id: u32) {
        self.lock().unattached.remove(&id);
    }

    /// Records the task reading stream `id`'s socket, so that closing the
    /// stream stops it; stops it at once if the stream is already gone.
    /// `relay`: the task is the stream's relay (its downlink too), whose
    /// uplink stops through this inbox.
    pub fn set_uplink(
        &self,
        id: u32,
        task: AbortHandle,
        relay: Option<&StreamIo>,
        local: Option<String>,
    ) {
        match self.lock().streams.get_mut(&id) {
            Some(s) => {
                s.uplink = Some(task);
                s.relay = relay.is_some();
                s.local = local;
            }
            None => match relay {
                Some(io) => {
                    io.stop_uplink();
                    task.wake();
                }
                None => task.abort(),
            },
        }
    }
}
