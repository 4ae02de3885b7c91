//! What each frame from the peer does to the session: the protocol's rules.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use longhaul_proto::frame::{Frame, Reason};
use longhaul_proto::window::SendCredit;
use tokio::net::TcpStream;

use crate::config::{Mode, OpenRefused};
use crate::handle::SessionHandle;
use crate::runtime::{Expired, Shared, State, MAX_BINDS};

impl Shared {
    /// Handles one frame from the peer. An `Err` is a protocol violation that
    /// ends the session. `may_slice`: a DATA payload may be queued as a
    /// slice of the carrier's read buffer (the reader says when that buffer
    /// may not be pinned any longer).
    pub(crate) fn on_frame(self: &Arc<Self>, f: Frame, may_slice: bool) -> Result<(), String> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.dead.is_some() {
            return Ok(());
        }
        match f {
            Frame::Data { recipient, payload } => {
                let Some(e) = st.streams.get_mut(&recipient) else {
                    return self.unknown(st, recipient, "DATA");
                };
                if e.opening.is_some() {
                    return Err(format!("DATA for stream {recipient} before it was open"));
                }
                if payload.len() > self.our_max_packet as usize {
                    return Err(format!(
                        "DATA of {} bytes exceeds the maximum packet size {}",
                        payload.len(),
                        self.our_max_packet
                    ));
                }
                e.recv
                    .on_data(payload.len())
                    .map_err(|o| format!("stream {recipient}: window overrun: {o}"))?;
                if e.eof_recv {
                    return Err(format!("DATA after EOF on stream {recipient}"));
                }
                st.bytes_received += payload.len() as u64;
                let mut ib = e.io.inbox();
                if !ib.closed {
                    // Bounded by the receive window checked just above.
                    let slice = may_slice && !ib.blocked;
                    ib.q.push(payload, slice);
                    drop(ib);
                    e.io.down.notify_one();
                }
            }
            Frame::WindowAdjust {
                recipient,
                increment,
            } => {
                let Some(e) = st.streams.get_mut(&recipient) else {
                    return self.unknown(st, recipient, "WINDOW_ADJUST");
                };
                if e.opening.is_some() {
                    return Err(format!(
                        "WINDOW_ADJUST for stream {recipient} before it was open"
                    ));
                }
                e.credit.add(increment);
                e.io.up.notify_one();
            }
            Frame::Open {
                sender,
                window,
                max_packet,
                dest,
            } => {
                let refuse = if st.goodbye.is_some() {
                    Some("shutting down")
                } else if st.streams.len() + st.connecting >= self.config.max_streams {
                    tracing::warn!(peer = %self.peer, %dest, limit = self.config.max_streams, "refusing stream: stream limit reached");
                    Some("too many streams")
                } else {
                    None
                };
                if let Some(why) = refuse {
                    self.send_control(
                        st,
                        Frame::OpenFailure {
                            recipient: sender,
                            reason: Reason::GENERAL_FAILURE,
                            description: why.into(),
                        },
                    );
                } else {
                    st.connecting += 1;
                    let me = self.clone();
                    let fut = self.acceptor.connect(dest.clone());
                    let limit = self.config.open_timeout;
                    tokio::spawn(async move {
                        let r = match tokio::time::timeout(limit, fut).await {
                            Ok(r) => r,
                            Err(_) => Err(OpenRefused::new(
                                Reason::TTL_EXPIRED,
                                format!("target did not answer within {limit:?}"),
                            )),
                        };
                        me.finish_inbound_open(sender, window, max_packet, dest, r);
                    });
                }
            }
            Frame::OpenSuccess {
                recipient,
                sender,
                window,
                max_packet,
            } => {
                let max_packet = self.clamp_packet(max_packet);
                let Some(e) = st.streams.get_mut(&recipient) else {
                    if st.expired.get(&recipient) == Some(&Expired::Unanswered) {
                        // Too late: we gave up on it. Close it at once.
                        st.expired.insert(recipient, Expired::Closing);
                        self.send_control(st, Frame::Close { recipient: sender });
                        return self.wake_after(guard);
                    }
                    return Err(format!("OPEN_SUCCESS for unknown stream {recipient}"));
                };
                let Some(tx) = e.opening.take() else {
                    return Err(format!("duplicate OPEN_SUCCESS for stream {recipient}"));
                };
                e.remote = sender;
                e.credit = SendCredit::new(window);
                e.max_packet = max_packet;
                if tx.send(Ok(())).is_err() {
                    // The opener went away meanwhile.
                    self.abort_stream(st, recipient);
                }
            }
            Frame::OpenFailure {
                recipient,
                reason,
                description,
            } => {
                let Some(e) = st.streams.get_mut(&recipient) else {
                    if st.expired.get(&recipient) == Some(&Expired::Unanswered) {
                        st.expired.remove(&recipient);
                        return self.wake_after(guard);
                    }
                    return Err(format!("OPEN_FAILURE for unknown stream {recipient}"));
                };
                let Some(tx) = e.opening.take() else {
                    return Err(format!("OPEN_FAILURE for open stream {recipient}"));
                };
                let _ = tx.send(Err(OpenRefused {
                    reason,
                    description,
                }));
                if let Some(e) = st.streams.get_mut(&recipient) {
                    e.close_sent = true;
                    e.close_recv = true;
                }
                self.remove_stream(st, recipient);
            }
            Frame::Eof { recipient } => {
                let Some(e) = st.streams.get_mut(&recipient) else {
                    return self.unknown(st, recipient, "EOF");
                };
                if e.opening.is_some() {
                    return Err(format!("EOF for stream {recipient} before it was open"));
                }
                e.eof_recv = true;
                let closed = {
                    let mut ib = e.io.inbox();
                    ib.q.eof = true;
                    ib.closed
                };
                if closed {
                    e.eof_delivered = true;
                } else {
                    e.io.down.notify_one();
                }
                self.finish_if_done(st, recipient);
            }
            Frame::Close { recipient } => {
                let Some(e) = st.streams.get_mut(&recipient) else {
                    if st.expired.get(&recipient) == Some(&Expired::Closing) {
                        st.expired.remove(&recipient);
                        return self.wake_after(guard);
                    }
                    return self.unknown(st, recipient, "CLOSE");
                };
                if e.opening.is_some() {
                    return Err(format!("CLOSE for stream {recipient} before it was open"));
                }
                e.close_recv = true;
                e.io.close_inbox(false);
                if let Some(a) = e.uplink.take() {
                    a.abort();
                }
                if !e.close_sent {
                    e.close_sent = true;
                    let remote = e.remote;
                    // The peer is done with the stream: our unsent data for it is moot.
                    st.data.remove(recipient);
                    self.send_control(st, Frame::Close { recipient: remote });
                }
                self.finish_if_done(st, recipient);
            }
            Frame::Ping { nonce } => self.send_control(st, Frame::Pong { nonce }),
            Frame::Pong { nonce } => {
                // Only an answer to a PING we sent is a sample; anything else
                // (a forged or repeated nonce) would fake the RTT.
                if let Some(i) = st.pings.iter().position(|&n| n == nonce) {
                    st.pings.remove(i);
                    let sample = self.now_ns().saturating_sub(nonce);
                    let old = self.ping_rtt_ns.load(Ordering::Relaxed);
                    let new = if old == 0 {
                        sample
                    } else {
                        (old * 7 + sample) / 8
                    };
                    self.ping_rtt_ns.store(new, Ordering::Relaxed);
                } else {
                    tracing::debug!(peer = %self.peer, nonce, "ignoring PONG for no PING of ours");
                }
            }
            Frame::Bind {
                request,
                bind,
                dest,
            } => self.on_bind(st, request, bind, dest),
            Frame::BindSuccess { request, port } => {
                let Some(tx) = st.binds_out.remove(&request) else {
                    return self.late_bind_answer(st, request, "BIND_SUCCESS");
                };
                let _ = tx.send(Ok(port));
            }
            Frame::BindFailure {
                request,
                reason,
                description,
            } => {
                let Some(tx) = st.binds_out.remove(&request) else {
                    return self.late_bind_answer(st, request, "BIND_FAILURE");
                };
                let _ = tx.send(Err(OpenRefused {
                    reason,
                    description,
                }));
            }
        }
        if let Some(why) = st.dead.clone() {
            return Err(why);
        }
        self.wake_after(guard)
    }

    fn wake_after(&self, guard: std::sync::MutexGuard<'_, State>) -> Result<(), String> {
        drop(guard);
        self.wake_writer.notify_one();
        Ok(())
    }

    /// A frame for a stream we do not know. Native peers never send one; a
    /// JMUX peer (jetsocat) does after its own CLOSE (WINDOW_ADJUST, a
    /// second CLOSE), so in that mode it is logged and ignored.
    fn unknown(&self, st: &State, id: u32, what: &str) -> Result<(), String> {
        if st.expired.get(&id) == Some(&Expired::Closing) || self.config.mode == Mode::Jmux {
            tracing::debug!(peer = %self.peer, stream = id, "ignoring {what} for a closed stream");
            return Ok(());
        }
        Err(format!("{what} for unknown stream {id}"))
    }

    fn late_bind_answer(&self, st: &mut State, request: u32, what: &str) -> Result<(), String> {
        if let Some(i) = st.binds_expired.iter().position(|&r| r == request) {
            st.binds_expired.remove(i);
            tracing::info!(peer = %self.peer, request, "reverse-forward answer came after we gave up; ignored");
            return Ok(());
        }
        Err(format!("{what} for unknown request {request}"))
    }

    fn on_bind(self: &Arc<Self>, st: &mut State, request: u32, bind: String, dest: String) {
        if st.binds_in >= MAX_BINDS || st.goodbye.is_some() {
            self.send_control(
                st,
                Frame::BindFailure {
                    request,
                    reason: Reason::GENERAL_FAILURE,
                    description: "too many reverse forwards".into(),
                },
            );
            return;
        }
        st.binds_in += 1;
        let me = self.clone();
        let fut = self.acceptor.bind(
            bind,
            dest,
            SessionHandle {
                shared: self.clone(),
            },
        );
        tokio::spawn(async move {
            let r = fut.await;
            let mut st = me.lock();
            let f = match r {
                Ok(port) => Frame::BindSuccess { request, port },
                Err(e) => {
                    st.binds_in -= 1;
                    Frame::BindFailure {
                        request,
                        reason: e.reason,
                        description: e.description,
                    }
                }
            };
            me.send_control(&mut st, f);
            drop(st);
            me.wake_writer.notify_one();
        });
    }

    fn finish_inbound_open(
        self: &Arc<Self>,
        sender: u32,
        window: u32,
        max_packet: u16,
        dest: String,
        r: Result<TcpStream, OpenRefused>,
    ) {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.connecting -= 1;
        if st.dead.is_some() {
            return;
        }
        match r {
            Ok(sock) => {
                let (id, _) = self.new_entry(st, sender, window, max_packet);
                let ours = st.streams.get(&id).map_or(0, |e| e.recv.size());
                self.send_control(
                    st,
                    Frame::OpenSuccess {
                        recipient: sender,
                        sender: id,
                        window: ours,
                        max_packet: self.our_max_packet,
                    },
                );
                tracing::debug!(peer = %self.peer, %dest, stream = id, "stream opened by peer");
                self.spawn_pumps(st, id, sock);
            }
            Err(e) => {
                tracing::info!(peer = %self.peer, %dest, reason = %e, "stream refused");
                self.send_control(
                    st,
                    Frame::OpenFailure {
                        recipient: sender,
                        reason: e.reason,
                        description: e.description,
                    },
                );
            }
        }
        drop(guard);
        self.wake_writer.notify_one();
    }
}
