//! Session state shared by the session's tasks, and the stream bookkeeping
//! every task goes through.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use bytes::Bytes;
use longhaul_proto::drr::Drr;
use longhaul_proto::frame::Frame;
use longhaul_proto::window::{Budget, RecvWindow, SendCredit};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch, Notify};
use tokio::task::AbortHandle;

use crate::config::{Acceptor, OpenRefused, SessionConfig};
use crate::inbound::InQueue;
use crate::outframe::OutFrame;
use crate::stream::{downlink, uplink};

/// Smallest window granted to a new stream when the budget is spent.
pub(crate) const MIN_WINDOW: u64 = 16 * 1024;
/// Reverse-forward listeners one session may ask for.
pub(crate) const MAX_BINDS: usize = 256;
/// PINGs awaiting their PONG; only these nonces are accepted back.
pub(crate) const MAX_PINGS: usize = 8;

/// What a stream's pumps share with the rest of the session without taking
/// the session lock: their wake-ups and the inbound queue.
#[derive(Default)]
pub(crate) struct StreamIo {
    /// Wakes the uplink: credit arrived, queue room freed, or closing.
    pub up: Notify,
    /// Wakes the downlink: data or EOF queued, or closing.
    pub down: Notify,
    inbox: Mutex<Inbox>,
}

#[derive(Default)]
pub(crate) struct Inbox {
    pub q: InQueue,
    /// Nothing more will be queued; the downlink ends once `q` is written.
    pub closed: bool,
    /// The local socket is full: queue copies, not slices of carrier buffers.
    pub blocked: bool,
}

impl StreamIo {
    pub fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No more inbound data: the downlink writes what it has and ends.
    /// `discard` drops what is queued as well (the stream failed).
    pub fn close_inbox(&self, discard: bool) {
        let mut ib = self.inbox();
        ib.closed = true;
        if discard {
            ib.q = InQueue::default();
        }
        drop(ib);
        self.down.notify_one();
    }
}

pub(crate) struct StreamEntry {
    /// The peer's id for this stream (valid once open).
    pub remote: u32,
    /// Waiting for OPEN_SUCCESS/FAILURE; the opener's reply channel.
    pub opening: Option<oneshot::Sender<Result<(), OpenRefused>>>,
    pub credit: SendCredit,
    pub max_packet: usize,
    pub io: Arc<StreamIo>,
    pub recv: RecvWindow,
    /// Budget bytes held by this stream's receive window.
    pub reserved: u64,
    pub uplink: Option<AbortHandle>,
    pub eof_sent: bool,
    pub eof_recv: bool,
    pub eof_delivered: bool,
    pub close_sent: bool,
    pub close_recv: bool,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub credit_stalls: u64,
}

/// An OPEN we stopped waiting for: its slot and budget are released, and
/// only this marker stays, so that a late answer is handled rather than
/// taken for a protocol violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// No answer yet.
    Unanswered,
    /// It succeeded late; we sent CLOSE and wait for the peer's.
    Closing,
}

pub(crate) struct State {
    pub control: VecDeque<Bytes>,
    pub control_bytes: usize,
    pub data: Drr<OutFrame>,
    pub streams: HashMap<u32, StreamEntry>,
    /// Expired OPENs (at most `max_streams`).
    pub expired: HashMap<u32, Expired>,
    next_id: u32,
    pub connecting: usize,
    pub budget: Budget,
    pub binds_out: HashMap<u32, oneshot::Sender<Result<u16, OpenRefused>>>,
    /// BIND requests we stopped waiting for (at most `MAX_BINDS`).
    pub binds_expired: VecDeque<u32>,
    pub next_bind: u32,
    pub binds_in: usize,
    /// Nonces of PINGs not yet answered.
    pub pings: VecDeque<u64>,
    pub dead: Option<String>,
    /// Shutting down: CLOSE sent for every stream; the writer ends the
    /// session once the control lane is written.
    pub goodbye: Option<String>,
    /// `close` has run: streams dropped, waiters told.
    torn_down: bool,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

impl State {
    pub fn new(budget: u64) -> State {
        State {
            control: VecDeque::new(),
            control_bytes: 0,
            data: Drr::new(longhaul_proto::frame::MAX_FRAME_LEN),
            streams: HashMap::new(),
            expired: HashMap::new(),
            next_id: 1,
            connecting: 0,
            budget: Budget::new(budget),
            binds_out: HashMap::new(),
            binds_expired: VecDeque::new(),
            next_bind: 1,
            binds_in: 0,
            pings: VecDeque::new(),
            dead: None,
            goodbye: None,
            torn_down: false,
            bytes_sent: 0,
            bytes_received: 0,
        }
    }
}

pub(crate) struct Shared {
    pub st: Mutex<State>,
    pub wake_writer: Notify,
    pub closed_tx: watch::Sender<Option<String>>,
    /// Set once the carrier writer has ended (the carrier is shut down).
    pub finished_tx: watch::Sender<bool>,
    pub config: SessionConfig,
    pub acceptor: Arc<dyn Acceptor>,
    pub started: Instant,
    pub ping_rtt_ns: AtomicU64,
    pub tcp_rtt_ns: AtomicU64,
    pub last_rx_ns: AtomicU64,
    pub peer: String,
    /// Extension messages (PING, BIND) negotiated.
    pub ext: bool,
    /// Largest DATA payload we accept, advertised in OPEN/OPEN_SUCCESS.
    pub our_max_packet: u16,
    /// Largest DATA payload the carrier's frame limit lets us send.
    pub send_max_payload: usize,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a task panicked mid-update; the state may be
        // inconsistent, but closing cleanly still needs it.
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// RTT used for window growth decisions.
    pub fn window_rtt_ns(&self) -> u64 {
        let floor = self.config.rtt_floor.as_nanos() as u64;
        self.ping_rtt_ns
            .load(Ordering::Relaxed)
            .max(self.tcp_rtt_ns.load(Ordering::Relaxed))
            .max(floor)
    }

    /// Closes the whole session: every stream ends, the carrier is dropped.
    pub fn close(&self, why: String) {
        let mut st = self.lock();
        if st.torn_down {
            return;
        }
        st.torn_down = true;
        let why = st.dead.get_or_insert(why).clone();
        let streams = std::mem::take(&mut st.streams);
        st.binds_out.clear();
        st.control.clear();
        st.control_bytes = 0;
        st.data = Drr::new(1);
        drop(st);
        for (_, e) in streams {
            if let Some(a) = e.uplink {
                a.abort();
            }
            e.io.up.notify_one();
            // Each downlink finishes what it has queued and ends.
            e.io.close_inbox(false);
        }
        self.closed_tx.send_replace(Some(why));
        self.wake_writer.notify_one();
    }

    /// Queues a control message (never behind bulk data).
    pub fn send_control(&self, st: &mut State, f: Frame) {
        let Ok(b) = f.to_bytes() else {
            // Only an over-long string could fail; such frames are never built.
            return;
        };
        st.control_bytes += b.len();
        st.control.push_back(b);
        if st.control_bytes > self.config.control_limit && st.dead.is_none() {
            // The peer keeps causing replies (PONGs, adjusts) but does not
            // read them: it is not a well-behaved peer.
            st.dead = Some("peer is not reading its control messages".into());
        }
    }

    /// Queues EOF/CLOSE for a stream behind that stream's own queued data,
    /// but ahead of every other stream's.
    pub fn send_stream_control(&self, st: &mut State, id: u32, f: Frame) {
        if st.data.queued(id) > 0 {
            if let Ok(b) = f.to_bytes() {
                st.data.push(id, OutFrame::encoded(b));
            }
        } else {
            self.send_control(st, f);
        }
    }

    /// Sends CLOSE when both directions have ended and removes the stream
    /// once CLOSE went both ways.
    pub fn finish_if_done(&self, st: &mut State, id: u32) {
        let Some(e) = st.streams.get_mut(&id) else {
            return;
        };
        if !e.close_sent && e.eof_sent && e.eof_recv && e.eof_delivered {
            e.close_sent = true;
            let remote = e.remote;
            self.send_stream_control(st, id, Frame::Close { recipient: remote });
        }
        let Some(e) = st.streams.get(&id) else {
            return;
        };
        if e.close_sent && e.close_recv {
            self.remove_stream(st, id);
        }
    }

    pub fn remove_stream(&self, st: &mut State, id: u32) {
        if let Some(e) = st.streams.remove(&id) {
            st.budget.release(e.reserved);
            if let Some(a) = e.uplink {
                a.abort();
            }
            e.io.up.notify_one();
            e.io.close_inbox(false);
            tracing::debug!(
                stream = id,
                peer = %self.peer,
                tx = e.tx_bytes,
                rx = e.rx_bytes,
                window = e.recv.size(),
                credit_stalls = e.credit_stalls,
                "stream closed"
            );
        }
    }

    /// Ends a stream abruptly (local socket error, or the opener gave up):
    /// CLOSE to the peer, stop reading locally, drop what is queued; the
    /// entry stays until the peer's CLOSE arrives.
    pub fn abort_stream(&self, st: &mut State, id: u32) {
        let Some(e) = st.streams.get_mut(&id) else {
            return;
        };
        if let Some(a) = e.uplink.take() {
            a.abort();
        }
        e.io.close_inbox(true);
        if !e.close_sent {
            e.close_sent = true;
            let remote = e.remote;
            self.send_stream_control(st, id, Frame::Close { recipient: remote });
        }
        self.finish_if_done(st, id);
        self.wake_writer.notify_one();
    }

    /// An OPEN we sent was not answered in time: free its slot and budget,
    /// keep only a marker for the late answer.
    pub fn expire_open(&self, st: &mut State, id: u32) {
        let Some(e) = st.streams.get(&id) else {
            return;
        };
        if e.opening.is_none() {
            return;
        }
        if let Some(e) = st.streams.remove(&id) {
            st.budget.release(e.reserved);
        }
        st.expired.insert(id, Expired::Unanswered);
        if st.expired.len() > self.config.max_streams && st.dead.is_none() {
            st.dead = Some(format!(
                "peer left more than {} stream opens unanswered",
                self.config.max_streams
            ));
        }
    }

    fn alloc_id(st: &mut State) -> u32 {
        loop {
            let id = st.next_id;
            st.next_id = st.next_id.wrapping_add(1);
            if !st.streams.contains_key(&id) && !st.expired.contains_key(&id) {
                return id;
            }
        }
    }

    pub fn new_entry(
        &self,
        st: &mut State,
        remote: u32,
        peer_window: u32,
        peer_max_packet: u16,
    ) -> (u32, Arc<StreamIo>) {
        let id = Self::alloc_id(st);
        let want = self.config.window.initial as u64;
        let reserved = st.budget.reserve_with_floor(want, MIN_WINDOW.min(want));
        let io = Arc::new(StreamIo::default());
        st.streams.insert(
            id,
            StreamEntry {
                remote,
                opening: None,
                credit: SendCredit::new(peer_window),
                max_packet: self.clamp_packet(peer_max_packet),
                io: io.clone(),
                recv: RecvWindow::new(reserved as u32, self.config.window.max, self.now_ns()),
                reserved,
                uplink: None,
                eof_sent: false,
                eof_recv: false,
                eof_delivered: false,
                close_sent: false,
                close_recv: false,
                tx_bytes: 0,
                rx_bytes: 0,
                credit_stalls: 0,
            },
        );
        (id, io)
    }

    /// Largest DATA payload to send to a peer that advertised
    /// `peer_max_packet`. JMUX peers (jetsocat) count the whole DATA
    /// message, header included, against it and drop larger ones, so in
    /// that mode the header comes off; longhaul peers count the payload.
    pub fn clamp_packet(&self, peer_max_packet: u16) -> usize {
        let allowed = match self.config.mode {
            crate::Mode::Jmux => {
                (peer_max_packet as usize).saturating_sub(longhaul_proto::frame::DATA_HEADER_LEN)
            }
            crate::Mode::Native => peer_max_packet as usize,
        };
        allowed.clamp(1, self.send_max_payload)
    }

    pub fn spawn_pumps(self: &Arc<Self>, st: &mut State, id: u32, sock: TcpStream) {
        let Some(e) = st.streams.get_mut(&id) else {
            return;
        };
        let _ = longhaul_carrier::tune_socket(&sock);
        let (r, w) = sock.into_split();
        let up = tokio::spawn(uplink(self.clone(), id, e.io.clone(), r));
        tokio::spawn(downlink(self.clone(), id, e.io.clone(), w));
        e.uplink = Some(up.abort_handle());
    }
}
