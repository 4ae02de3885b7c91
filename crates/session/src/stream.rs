//! The two pumps of one stream.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use longhaul_proto::frame::{write_data_header, Frame, DATA_HEADER_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use crate::runtime::Shared;

/// What the carrier reader hands to a stream's downlink.
pub(crate) enum Inbound {
    Data(Bytes),
    Eof,
}

/// Local socket → DATA frames, as fast as the peer's credit and the
/// stream's send queue allow.
pub(crate) async fn uplink(shared: Arc<Shared>, id: u32, mut rd: OwnedReadHalf) {
    let mut buf = BytesMut::new();
    loop {
        let (remote, n) = loop {
            let wake = {
                let mut guard = shared.lock();
                let st = &mut *guard;
                if st.dead.is_some() {
                    return;
                }
                let queued = st.data.queued(id);
                let Some(e) = st.streams.get_mut(&id) else {
                    return;
                };
                if e.close_sent || e.close_recv || e.eof_sent {
                    return;
                }
                let room = shared.config.send_queue.saturating_sub(queued);
                let n = (e.credit.available() as usize).min(e.max_packet).min(room);
                if n > 0 {
                    break (e.remote, n);
                }
                if e.credit.available() == 0 {
                    e.credit_stalls += 1;
                }
                e.wake.clone()
            };
            wake.notified().await;
        };
        buf.reserve(DATA_HEADER_LEN + n);
        buf.put_bytes(0, DATA_HEADER_LEN);
        let r = (&mut rd).take(n as u64).read_buf(&mut buf).await;
        let mut guard = shared.lock();
        let st = &mut *guard;
        match r {
            Ok(0) => {
                buf.clear();
                let Some(e) = st.streams.get_mut(&id) else {
                    return;
                };
                if e.close_sent {
                    return;
                }
                e.eof_sent = true;
                let remote = e.remote;
                shared.send_stream_control(st, id, Frame::Eof { recipient: remote });
                shared.finish_if_done(st, id);
                drop(guard);
                shared.wake_writer.notify_one();
                return;
            }
            Ok(k) => {
                write_data_header(&mut buf[..DATA_HEADER_LEN], remote, k);
                let frame = buf.split().freeze();
                let Some(e) = st.streams.get_mut(&id) else {
                    return;
                };
                if e.close_sent {
                    return;
                }
                e.credit.take(k);
                e.tx_bytes += k as u64;
                st.data.push(id, frame);
                drop(guard);
                shared.wake_writer.notify_one();
            }
            Err(err) => {
                tracing::debug!(stream = id, "local read failed: {err}");
                shared.abort_stream(st, id);
                return;
            }
        }
    }
}

/// Inbound DATA → local socket; credit goes back only for written bytes.
pub(crate) async fn downlink(
    shared: Arc<Shared>,
    id: u32,
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Inbound>,
) {
    while let Some(m) = rx.recv().await {
        match m {
            Inbound::Data(b) => {
                if let Err(err) = wr.write_all(&b).await {
                    tracing::debug!(stream = id, "local write failed: {err}");
                    let mut st = shared.lock();
                    shared.abort_stream(&mut st, id);
                    return;
                }
                let mut guard = shared.lock();
                let st = &mut *guard;
                let Some(e) = st.streams.get_mut(&id) else {
                    continue;
                };
                e.rx_bytes += b.len() as u64;
                let before = e.recv.size();
                let budget = &mut st.budget;
                let credit = e.recv.on_delivered(
                    b.len(),
                    shared.now_ns(),
                    shared.window_rtt_ns(),
                    |extra| budget.try_reserve(extra as u64),
                );
                e.reserved += (e.recv.size() - before) as u64;
                if let Some(increment) = credit {
                    if !e.close_sent {
                        let remote = e.remote;
                        shared.send_control(
                            st,
                            Frame::WindowAdjust {
                                recipient: remote,
                                increment,
                            },
                        );
                        drop(guard);
                        shared.wake_writer.notify_one();
                    }
                }
            }
            Inbound::Eof => {
                let _ = wr.shutdown().await;
                let mut guard = shared.lock();
                let st = &mut *guard;
                if let Some(e) = st.streams.get_mut(&id) {
                    e.eof_delivered = true;
                }
                shared.finish_if_done(st, id);
                drop(guard);
                shared.wake_writer.notify_one();
            }
        }
    }
}
