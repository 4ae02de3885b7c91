//! Starting a session, and the handle the forwarders use.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use longhaul_carrier::Carrier;
use longhaul_proto::frame::{self, DecodeLimits, Frame, Reason, MAX_DATA_PAYLOAD};
use longhaul_proto::handshake::{self, Hello, HELLO_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch, Notify};

use crate::config::{Acceptor, Mode, OpenRefused, SessionConfig, SessionError, SessionStats};
use crate::housekeeping::housekeeping;
use crate::reader::carrier_reader;
use crate::runtime::{Shared, State, MAX_BINDS};
use crate::writer::carrier_writer;

/// How long a closing session's writer may still take to write what it
/// has (a peer that stopped reading) before it is cancelled and the carrier
/// dropped.
const WRITER_GRACE: Duration = Duration::from_secs(2);

/// A cheap, clonable handle to a running session.
#[derive(Clone)]
pub struct SessionHandle {
    pub(crate) shared: Arc<Shared>,
}

/// A stream the peer accepted, not yet attached to a local socket. Dropping
/// it closes the stream.
pub struct Opened {
    shared: Arc<Shared>,
    id: u32,
    attached: bool,
}

impl Opened {
    /// Starts relaying between the stream and `sock`.
    pub fn attach(mut self, sock: TcpStream) {
        self.attached = true;
        let shared = self.shared.clone();
        let mut st = shared.lock();
        shared.spawn_pumps(&mut st, self.id, sock);
    }

    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if !self.attached {
            let mut st = self.shared.lock();
            self.shared.abort_stream(&mut st, self.id);
        }
    }
}

/// Expires an OPEN whose opener stopped waiting (timed out or was
/// cancelled), unless it was answered.
struct PendingOpen<'a> {
    shared: &'a Shared,
    id: u32,
}

impl Drop for PendingOpen<'_> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        self.shared.expire_open(&mut st, self.id);
    }
}

pub struct Session;

impl Session {
    /// Runs the hello (native mode) and starts the session's tasks.
    pub async fn start(
        mut carrier: Carrier,
        config: SessionConfig,
        acceptor: Arc<dyn Acceptor>,
    ) -> Result<SessionHandle, SessionError> {
        let (ext, frame_limit) = match config.mode {
            Mode::Jmux => (false, u16::MAX),
            Mode::Native => {
                let ours = Hello::ours(config.max_frame);
                let hello = async {
                    carrier.writer.write_all(&ours.encode()).await?;
                    carrier.writer.flush().await?;
                    let mut b = [0u8; HELLO_LEN];
                    carrier.reader.read_exact(&mut b).await?;
                    Ok::<_, SessionError>(Hello::decode(&b)?)
                };
                let peer = tokio::time::timeout(config.handshake_timeout, hello)
                    .await
                    .map_err(|_| SessionError::HelloTimeout(config.handshake_timeout))??;
                let n = ours.negotiate(&peer);
                (n.features & handshake::FEATURE_PING != 0, n.max_frame)
            }
        };
        let send_max_payload = (frame_limit as usize)
            .saturating_sub(frame::DATA_HEADER_LEN)
            .clamp(1, MAX_DATA_PAYLOAD);
        let our_max_packet = (config.max_frame as usize)
            .saturating_sub(frame::DATA_HEADER_LEN)
            .clamp(1, MAX_DATA_PAYLOAD) as u16;
        let (closed_tx, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            st: Mutex::new(State::new(config.budget)),
            wake_writer: Notify::new(),
            closed_tx,
            finished_tx: watch::channel(false).0,
            acceptor,
            started: Instant::now(),
            ping_rtt_ns: AtomicU64::new(0),
            tcp_rtt_ns: AtomicU64::new(0),
            last_rx_ns: AtomicU64::new(0),
            peer: carrier.peer.clone(),
            ext,
            our_max_packet,
            send_max_payload,
            config,
        });
        let limits = DecodeLimits {
            max_frame: shared.config.max_frame as usize,
            extensions: ext,
        };
        let reader = tokio::spawn(carrier_reader(shared.clone(), carrier.reader, limits));
        let writer = tokio::spawn(carrier_writer(
            shared.clone(),
            carrier.writer,
            carrier.urgent,
        ));
        let house = tokio::spawn(housekeeping(shared.clone(), carrier.probe));
        // When the session closes, stop the tasks that might be parked.
        let mut closed = shared.closed_tx.subscribe();
        let finished = shared.finished_tx.clone();
        tokio::spawn(async move {
            let _ = closed.wait_for(|c| c.is_some()).await;
            reader.abort();
            house.abort();
            // The writer sees `dead` and exits on its own after waking,
            // unless it is stuck writing to a peer that stopped reading:
            // then it is cancelled, which drops the carrier.
            let abort = writer.abort_handle();
            if tokio::time::timeout(WRITER_GRACE, writer).await.is_err() {
                abort.abort();
            }
            finished.send_replace(true);
        });
        Ok(SessionHandle { shared })
    }
}

impl SessionHandle {
    /// Opens a stream to `dest` (`tcp://host:port`) at the peer.
    pub async fn open(&self, dest: &str) -> Result<Opened, OpenRefused> {
        let sh = &self.shared;
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut guard = sh.lock();
            let st = &mut *guard;
            if let Some(why) = &st.dead {
                return Err(OpenRefused::new(
                    Reason::GENERAL_FAILURE,
                    format!("session closed: {why}"),
                ));
            }
            if st.streams.len() + st.connecting >= sh.config.max_streams {
                return Err(OpenRefused::new(
                    Reason::GENERAL_FAILURE,
                    "too many streams",
                ));
            }
            let (id, _) = sh.new_entry(st, 0, 0, 0);
            let window = match st.streams.get_mut(&id) {
                Some(e) => {
                    e.opening = Some(tx);
                    e.recv.size()
                }
                None => 0,
            };
            sh.send_control(
                st,
                Frame::Open {
                    sender: id,
                    window,
                    max_packet: sh.our_max_packet,
                    dest: dest.to_owned(),
                },
            );
            id
        };
        sh.wake_writer.notify_one();
        let pending = PendingOpen { shared: sh, id };
        let answer = tokio::time::timeout(sh.config.open_timeout, rx).await;
        if answer.is_ok() {
            std::mem::forget(pending);
        } else {
            drop(pending);
        }
        match answer {
            Ok(Ok(Ok(()))) => Ok(Opened {
                shared: sh.clone(),
                id,
                attached: false,
            }),
            Ok(Ok(Err(refused))) => Err(refused),
            Ok(Err(_)) => Err(OpenRefused::new(
                Reason::GENERAL_FAILURE,
                format!(
                    "session closed: {}",
                    self.close_reason().unwrap_or_default()
                ),
            )),
            Err(_) => Err(OpenRefused::new(
                Reason::TTL_EXPIRED,
                "the peer did not answer the open in time",
            )),
        }
    }

    /// Asks the peer to listen on `bind` and open streams back to `dest`.
    pub async fn bind(&self, bind: &str, dest: &str) -> Result<u16, OpenRefused> {
        let sh = &self.shared;
        if !sh.ext {
            return Err(OpenRefused::new(
                Reason::GENERAL_FAILURE,
                "reverse forwards need longhaul's native mode (not --jmux)",
            ));
        }
        let (tx, rx) = oneshot::channel();
        let request = {
            let mut guard = sh.lock();
            let st = &mut *guard;
            if st.dead.is_some() || st.binds_out.len() >= MAX_BINDS {
                return Err(OpenRefused::new(
                    Reason::GENERAL_FAILURE,
                    "session closed or too many binds",
                ));
            }
            let request = st.next_bind;
            st.next_bind = st.next_bind.wrapping_add(1);
            st.binds_out.insert(request, tx);
            sh.send_control(
                st,
                Frame::Bind {
                    request,
                    bind: bind.to_owned(),
                    dest: dest.to_owned(),
                },
            );
            request
        };
        sh.wake_writer.notify_one();
        match tokio::time::timeout(sh.config.open_timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(OpenRefused::new(
                Reason::GENERAL_FAILURE,
                "session closed before the reverse forward was answered",
            )),
            Err(_) => {
                // Free the slot; remember the request so a late answer is
                // recognised rather than taken for a protocol violation.
                let mut st = sh.lock();
                st.binds_out.remove(&request);
                if st.binds_expired.len() >= MAX_BINDS {
                    st.binds_expired.pop_front();
                }
                st.binds_expired.push_back(request);
                Err(OpenRefused::new(
                    Reason::TTL_EXPIRED,
                    "no answer to the reverse-forward request",
                ))
            }
        }
    }

    /// Waits until the session has ended; returns why.
    pub async fn closed(&self) -> String {
        let mut rx = self.shared.closed_tx.subscribe();
        let r = rx.wait_for(|c| c.is_some()).await;
        match r {
            Ok(v) => v.clone().unwrap_or_default(),
            Err(_) => "session dropped".into(),
        }
    }

    pub fn close_reason(&self) -> Option<String> {
        self.shared.lock().dead.clone()
    }

    pub fn is_closed(&self) -> bool {
        self.close_reason().is_some()
    }

    /// Ends the session and every stream in it.
    pub fn close(&self, why: &str) {
        self.shared.close(why.to_owned());
    }

    /// Ends the session politely: CLOSE for every stream, refuse new ones,
    /// then end the carrier once that is written — or after `grace`,
    /// whatever the peer does.
    pub async fn shutdown(&self, why: &str, grace: Duration) {
        let sh = &self.shared;
        {
            let mut guard = sh.lock();
            let st = &mut *guard;
            if st.dead.is_some() {
                return;
            }
            st.goodbye = Some(why.to_owned());
            let ids: Vec<u32> = st.streams.keys().copied().collect();
            for id in ids {
                let Some(e) = st.streams.get_mut(&id) else {
                    continue;
                };
                if let Some(a) = e.uplink.take() {
                    a.abort();
                }
                if e.opening.is_some() {
                    continue;
                }
                e.io.close_inbox(false);
                if !e.close_sent {
                    e.close_sent = true;
                    let remote = e.remote;
                    sh.send_stream_control(st, id, Frame::Close { recipient: remote });
                }
            }
        }
        sh.wake_writer.notify_one();
        let mut finished = sh.finished_tx.subscribe();
        let done = tokio::time::timeout(grace, finished.wait_for(|f| *f)).await;
        if done.is_err() {
            sh.close(why.to_owned());
        }
    }

    pub fn peer(&self) -> &str {
        &self.shared.peer
    }

    pub fn stats(&self) -> SessionStats {
        let st = self.shared.lock();
        SessionStats {
            streams: st.streams.len(),
            budget_used: st.budget.used(),
            rtt: Duration::from_nanos(self.shared.window_rtt_ns()),
            bytes_sent: st.bytes_sent,
            bytes_received: st.bytes_received,
        }
    }
}
