//! UDP flows: streams opened to `udp://host:port` that carry datagrams
//! (see `longhaul_proto::mux` for the rules: never flow controlled,
//! dropped rather than queued when they cannot go).
//!
//! The side the flow was opened *to* holds one UDP socket per flow,
//! `connect`ed to the destination so only its answers come back
//! ([`spawn_connected`]). The side that opened it (a `-L udp:` listener,
//! a SOCKS5 UDP association) keeps the [`Flow`] and a [`DatagramSink`]
//! that sends answers back to whoever sent the first datagram.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use longhaul_carrier::udp_batch;
use longhaul_proto::mux::Dropped;
use tokio::net::UdpSocket;

use crate::runtime::Shared;

/// Largest datagram a flow carries (what one DATAGRAM frame holds; the
/// largest UDP payload is 65 507 bytes over IPv4, 65 527 over IPv6).
pub const MAX_DATAGRAM: usize = longhaul_proto::frame::MAX_DATA_PAYLOAD;

pub use crate::config::DatagramSink;

/// A flow opened here: send its datagrams with [`Flow::send`]; dropping
/// it closes the flow.
pub struct Flow {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: u32,
}

impl Flow {
    /// Queues one datagram for the peer, or drops it (counted) and says
    /// why.
    pub fn send(&self, payload: Bytes) -> Result<(), Dropped> {
        self.shared.with(|m, _| m.send_datagram(self.id, payload))
    }

    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        let id = self.id;
        self.shared.with(|m, _| m.abort(id));
    }
}

/// Datagrams dropped at this end of flows (their socket had no room),
/// across sessions.
pub static DELIVERY_DROPS: AtomicU64 = AtomicU64::new(0);

/// A connected socket as the sink: answers go to the destination.
struct Connected {
    /// The flow's task holds the socket: it (and the port) goes when the
    /// task ends, whether or not the peer answers our CLOSE.
    sock: std::sync::Weak<UdpSocket>,
    /// When a datagram last went either way (ms since `since`).
    last: AtomicU64,
    since: std::time::Instant,
}

impl Connected {
    fn touch(&self) {
        let ms = self.since.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let ms = self.since.elapsed().as_millis() as u64;
        Duration::from_millis(ms.saturating_sub(self.last.load(Ordering::Relaxed)))
    }
}

impl DatagramSink for Connected {
    fn deliver(&self, payload: Bytes) {
        self.touch();
        // A full socket buffer, or the destination's ICMP "port
        // unreachable" reported on this send: the datagram is lost, as
        // it would be on the network.
        let sent = self.sock.upgrade().map(|s| s.try_send(&payload));
        if !matches!(sent, Some(Ok(_))) {
            DELIVERY_DROPS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Datagrams a flow's socket task takes in one go before it lets the
/// session's other tasks run.
const BURST: usize = 64;
/// Datagrams read in one call (`recvmmsg`): a short batch also tells that
/// the socket is drained, saving the read that would find it empty.
const BATCH: usize = 4;

/// Relays between flow `id` (opened by the peer) and `sock`, connected to
/// its destination, until the flow ends. An idle flow holds no buffer.
pub(crate) fn spawn_connected(
    shared: &Arc<Shared>,
    id: u32,
    sock: UdpSocket,
    lease: Option<Arc<Vec<crate::local::Lease>>>,
) {
    let local = sock.peer_addr().ok().map(|a| a.to_string());
    let sock = Arc::new(sock);
    let sink = Arc::new(Connected {
        sock: Arc::downgrade(&sock),
        last: AtomicU64::new(0),
        since: std::time::Instant::now(),
    });
    if !shared.attach_flow(id, sink.clone()) {
        // It finished already: nothing of it is kept.
        shared.forget_unattached(id);
        return;
    }
    let me = shared.clone();
    let idle_limit = shared.config.flow_idle;
    let task = shared.spawn(async move {
        // Held as long as the flow's socket.
        let _lease = lease;
        loop {
            // A flow idle for `flow_idle` either way ends here, whatever
            // the peer does: its socket (a port) is not held forever.
            let idle = sink.idle();
            if idle >= idle_limit {
                return me.with(|m, _| m.abort(id));
            }
            match tokio::time::timeout(idle_limit - idle, sock.readable()).await {
                Err(_) => continue,
                Ok(Err(_)) => return me.with(|m, _| m.abort(id)),
                Ok(Ok(())) => {}
            }
            // One byte more than a frame holds: a longer datagram is seen
            // as such (and dropped), never cut. Uninitialised, and only
            // while datagrams come: an idle flow holds no buffer.
            let mut bufs: Vec<Vec<u8>> = (0..BATCH)
                .map(|_| Vec::with_capacity(MAX_DATAGRAM + 1))
                .collect();
            let mut taken = 0;
            while taken < BURST {
                match udp_batch::try_recv(&sock, &mut bufs, &mut [], true) {
                    Ok(n) => {
                        taken += n;
                        if n > 0 {
                            sink.touch();
                        }
                        for b in bufs.iter().take(n).filter(|b| b.len() <= MAX_DATAGRAM) {
                            let payload = Bytes::copy_from_slice(b);
                            // Dropped when it cannot go: counted by the core.
                            let _ = me.with(|m, _| m.send_datagram(id, payload));
                        }
                        if n < BATCH {
                            // Short: the queue was empty (the runtime was
                            // told, and waits for the next datagram).
                            taken = 0;
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        taken = 0;
                        break;
                    }
                    // ICMP errors for earlier sends (port or host
                    // unreachable), reported once each: the destination may
                    // come back, and anyone can forge them; keep the flow.
                    Err(_) => taken += 1,
                }
            }
            // Never held across a wait: only the flow being read holds
            // buffers (256 KiB), one per session at a time.
            drop(bufs);
            if taken >= BURST {
                tokio::task::yield_now().await;
            }
        }
    });
    shared.set_uplink(id, task.abort_handle(), None, local);
}

impl Shared {
    /// Makes stream `id` a flow whose datagrams from the peer go to
    /// `sink`. `false`: the stream is gone already.
    pub(crate) fn attach_flow(&self, id: u32, sink: Arc<dyn DatagramSink>) -> bool {
        let mut st = self.lock();
        match st.streams.get_mut(&id) {
            Some(s) => {
                s.flow = Some(sink);
                s.socket = crate::runtime::Socket::Open;
                true
            }
            None => false,
        }
    }
}
