//! The two pumps of one stream.
//!
//! Neither holds a buffer while its socket is idle: the uplink waits for the
//! socket to be readable before it allocates one, and the downlink takes its
//! data from the stream's inbound queue only when there is some. An idle
//! stream costs its two tasks, its socket and its entry — a few KiB.

use std::io::{self, IoSlice};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::AsyncWriteExt;

use crate::driver::AbortHandle;
use crate::inbound::{compact_parts, Part};
use crate::local::{read_now, LocalRead, LocalStream, LocalWrite};
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

/// Starts relaying between stream `id` and `sock`: its two pumps. A
/// lease the socket came with is held by both pumps, and goes with the
/// last of them.
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
    let up = match sock {
        LocalStream::Tcp(sock) => {
            let _ = longhaul_carrier::tune_socket(&sock);
            let (r, w) = sock.into_split();
            spawn_holding(shared, &lease, downlink(shared.clone(), id, io.clone(), w));
            spawn_holding(shared, &lease, uplink(shared.clone(), id, io, r))
        }
        LocalStream::Pair(sock) => {
            let (r, w) = sock.into_split();
            spawn_holding(shared, &lease, downlink(shared.clone(), id, io.clone(), w));
            spawn_holding(shared, &lease, uplink(shared.clone(), id, io, r))
        }
        LocalStream::Service(pipe) => {
            let (r, w) = pipe.split();
            spawn_holding(
                shared,
                &lease,
                crate::pipe_pumps::downlink(shared.clone(), id, io.clone(), w),
            );
            spawn_holding(
                shared,
                &lease,
                crate::pipe_pumps::uplink(shared.clone(), id, io, r),
            )
        }
        LocalStream::Udp(_) | LocalStream::Leased(..) => return,
    };
    shared.set_uplink(id, up.abort_handle(), local);
}

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
pub(crate) async fn uplink(
    shared: Arc<Shared>,
    id: u32,
    io: Arc<StreamIo>,
    mut rd: impl LocalRead,
) {
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
            if let Err(err) = rd.readable().await {
                return fail(&shared, id, err);
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
        let k = match read_now(&mut rd, &mut (&mut buf).limit(n)).await {
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

/// Inbound DATA → local socket; credit goes back only for written bytes.
pub(crate) async fn downlink(
    shared: Arc<Shared>,
    id: u32,
    io: Arc<StreamIo>,
    mut wr: impl LocalWrite,
) {
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
                    settle(&wr, &io).await;
                    wr.reset();
                }
                return;
            }
            io.down.notified().await;
            continue;
        }
        if !pending.is_empty() {
            let total: usize = pending.iter().map(|p| p.data.len()).sum();
            if let Err(err) = write_parts(&mut wr, &mut pending, &io).await {
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
                        r = wr.writable() => Some(r),
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
                    r = wr.writable() => r?,
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

    /// A stream's downlink ended: its socket is closed.
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
    pub fn set_uplink(&self, id: u32, task: AbortHandle, local: Option<String>) {
        match self.lock().streams.get_mut(&id) {
            Some(s) => {
                s.uplink = Some(task);
                s.local = local;
            }
            None => task.abort(),
        }
    }
}
