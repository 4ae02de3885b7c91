//! Starting a session, and the handle the forwarders use.

use std::sync::Arc;
use std::time::Duration;

use longhaul_carrier::Carrier;

use crate::config::{OpenRefused, Role, SessionConfig, SessionError, SessionStats};
use crate::flow::{DatagramSink, Flow};
use crate::local::LocalStream;
use crate::resume::{NewSession, Resumables, Served};
use crate::runtime::{Acceptor, SessionHandle, Shared};
use crate::start::{build, hello};

/// A stream the peer accepted, not yet attached to a local socket. Dropping
/// it closes the stream.
pub struct Opened {
    shared: Arc<Shared>,
    id: u32,
    attached: bool,
}

impl Opened {
    /// Starts relaying between the stream and `sock`.
    pub fn attach(mut self, sock: impl Into<LocalStream>) {
        self.attached = true;
        crate::stream::spawn_pumps(&self.shared, self.id, sock.into());
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    /// Makes the stream (opened to `udp://…`) a UDP flow: the peer's
    /// datagrams go to `sink`; `None` if it already ended.
    pub fn into_flow(mut self, sink: Arc<dyn DatagramSink>) -> Option<Flow> {
        self.attached = true;
        let flow = Flow {
            shared: self.shared.clone(),
            id: self.id,
        };
        if self.shared.attach_flow(self.id, sink) {
            Some(flow)
        } else {
            // It finished already: what it left goes, and dropping the
            // flow closes whatever is left of the stream.
            self.shared.forget_unattached(self.id);
            drop(flow);
            None
        }
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        if !self.attached {
            let id = self.id;
            self.shared.forget_unattached(id);
            self.shared.with(|m, _| m.abandon(id));
        }
    }
}

/// Gives up on an OPEN whose opener stopped waiting (cancelled), unless it
/// was answered.
struct PendingOpen<'a> {
    shared: &'a Arc<Shared>,
    id: u32,
    answered: bool,
}

impl Drop for PendingOpen<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.shared.give_up_open(self.id);
        }
    }
}

pub struct Session;

impl Session {
    /// Client side: runs the hello (native mode) and, when both sides
    /// offer resume, asks the server for a new resumable session; then
    /// starts the session's tasks.
    pub async fn start(
        mut carrier: Carrier,
        config: SessionConfig,
        acceptor: Arc<dyn Acceptor>,
    ) -> Result<SessionHandle, SessionError> {
        let n = hello(&mut carrier, &config).await?;
        let (link, instance) = if n.resume {
            let (l, name) = crate::resume::open_new(&mut carrier, &config, n.instance).await?;
            (Some(l), name)
        } else {
            (None, None)
        };
        let h = build(carrier, config, acceptor, &n, Role::Client, link);
        if let Some(name) = instance {
            let _ = h.shared.instance.set(name);
        }
        Ok(h)
    }

    /// Server side: runs the hello and, with resume, the attach exchange: a
    /// new session, or `carrier` given to the detached session it resumes.
    /// `identity` names who authenticated the carrier; a session is only
    /// resumed by the same identity.
    pub async fn serve(
        mut carrier: Carrier,
        config: SessionConfig,
        acceptor: Arc<dyn Acceptor>,
        resumables: &Arc<Resumables>,
        identity: String,
    ) -> Result<Served, SessionError> {
        let n = hello(&mut carrier, &config).await?;
        if !n.resume {
            return Ok(Served::New(Box::new(NewSession {
                carrier,
                config,
                acceptor,
                negotiated: n,
                resumable: None,
            })));
        }
        crate::resume::serve_attach(carrier, config, acceptor, resumables, identity, &n).await
    }
}

impl SessionHandle {
    /// Opens a stream to `dest` (`tcp://host:port`) at the peer.
    pub async fn open(&self, dest: &str) -> Result<Opened, OpenRefused> {
        let sh = &self.shared;
        let (id, rx) = sh.open_stream(dest)?;
        let mut pending = PendingOpen {
            shared: sh,
            id,
            answered: false,
        };
        // The core expires the OPEN after `open_timeout`.
        let answer = rx.await;
        pending.answered = true;
        match answer {
            Ok(Ok(())) => Ok(Opened {
                shared: sh.clone(),
                id,
                attached: false,
            }),
            Ok(Err(refused)) => Err(refused),
            Err(_) => Err(OpenRefused::new(
                longhaul_proto::Reason::GENERAL_FAILURE,
                format!(
                    "session closed: {}",
                    self.close_reason().unwrap_or_default()
                ),
            )),
        }
    }

    /// Asks the peer to listen on `bind` and open streams back to `dest`.
    pub async fn bind(&self, bind: &str, dest: &str) -> Result<u16, OpenRefused> {
        let rx = self.shared.bind_request(bind, dest)?;
        // The core expires the BIND after `open_timeout`.
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(OpenRefused::new(
                longhaul_proto::Reason::GENERAL_FAILURE,
                "session closed before the reverse forward was answered",
            )),
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
        self.shared.with(|m, _| m.dead().map(str::to_owned))
    }

    pub fn is_closed(&self) -> bool {
        self.close_reason().is_some()
    }

    /// Ends stream `id` abruptly (its two ends see a reset); the session
    /// goes on.
    pub fn reset_stream(&self, id: u32) {
        self.shared.with(|m, _| m.abort(id));
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
        sh.with(|m, _| m.shutdown(why));
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
        let (s, datagrams) = self.shared.with(|m, _| (m.stats(), m.datagram_stats()));
        SessionStats {
            streams: s.streams,
            budget_used: s.budget_used,
            rtt: Duration::from_nanos(s.rtt_ns),
            bytes_sent: s.bytes_sent,
            bytes_received: s.bytes_received,
            resumes: self.shared.link().map_or(0, |l| l.resumes()),
            replayed: self.shared.link().map_or(0, |l| l.replayed()),
            replay_held: self.shared.link().map_or(0, |l| l.replay().held()),
            window_stalls: self
                .shared
                .window_stalls
                .load(std::sync::atomic::Ordering::Relaxed),
            age: self.shared.started.elapsed(),
            detached: self.is_detached(),
            datagrams,
        }
    }

    /// Every open stream's figures.
    pub fn streams(&self) -> Vec<crate::StreamStats> {
        let st = self.shared.lock();
        let mut v: Vec<_> = st
            .streams
            .iter()
            .filter_map(|(&id, rt)| {
                let m = st.conn().mux().stream_stats(id)?;
                Some(crate::config::StreamStats {
                    id,
                    dest: rt.dest.to_string(),
                    local: rt.local.clone(),
                    opened_here: rt.opened_here,
                    age: rt.since.elapsed(),
                    bytes_sent: m.tx_bytes,
                    bytes_received: m.rx_bytes,
                    window: m.window,
                    credit: m.credit,
                    stalls: m.credit_stalls,
                })
            })
            .collect();
        v.sort_by_key(|s| s.id);
        v
    }

    /// Lanes agreed for a striped session (1 for any other).
    pub fn lanes_wanted(&self) -> usize {
        self.shared.link().map_or(1, |l| l.lanes_wanted())
    }

    /// Lanes running now (striped sessions; 0 otherwise).
    pub fn lanes(&self) -> usize {
        *self.shared.lanes_tx.borrow()
    }

    /// Waits until the number of running lanes changes or the session
    /// ends; returns the number.
    pub async fn lanes_changed(&self) -> usize {
        let mut rx = self.shared.lanes_tx.subscribe();
        rx.mark_unchanged();
        tokio::select! {
            _ = rx.changed() => {}
            _ = self.closed() => {}
        }
        self.lanes()
    }

    /// Per-lane counters of a striped session.
    pub fn lane_stats(&self) -> Vec<crate::LaneStats> {
        self.shared.lane_stats()
    }

    /// Chunks sent again on another lane, and chunks that arrived twice.
    pub fn stripe_counters(&self) -> (u64, u64) {
        self.shared
            .link()
            .map(|l| l.stripe_counters())
            .unwrap_or_default()
    }

    /// Client side: adds a freshly dialled carrier (authenticated, the
    /// preamble sent) as lane `number` of this striped session.
    pub async fn join_lane(&self, carrier: Carrier, number: u8) -> Result<(), SessionError> {
        crate::resume::join_lane(&self.shared, carrier, number).await
    }

    /// Whether the session can carry UDP flows (native mode; JMUX has no
    /// datagrams).
    pub fn carries_datagrams(&self) -> bool {
        self.shared.with(|m, _| m.config().extensions)
    }

    /// Whether the session can outlive its carrier (both sides offered
    /// resume).
    pub fn is_resumable(&self) -> bool {
        self.shared.resumable
    }

    /// The session's id on the server (resumable sessions only): the same
    /// across carrier drops, a different one for a fresh session.
    pub fn resume_id(&self) -> Option<longhaul_proto::resume::SessionId> {
        self.shared.link().map(|l| l.session_id())
    }

    /// The session's secret and last attempt number: what a client needs to
    /// resume it. For tests that play a client forging resumes.
    #[doc(hidden)]
    pub fn resume_secret_for_tests(&self) -> Option<(longhaul_proto::resume::Secret, u64)> {
        self.shared
            .link()
            .map(|l| (l.secret().clone(), l.attempt()))
    }

    /// Whether the peer ended the session on purpose (its idle timeout, a
    /// shutdown) rather than losing it.
    pub fn ended_by_peer(&self) -> bool {
        self.shared
            .peer_goodbye
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `other` is a handle to this same session.
    pub fn is(&self, other: &SessionHandle) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Client side: the instance name the server told for this session:
    /// its later carriers carry it (TLS server name, WebSocket header) for
    /// a load balancer to send them to the same server.
    pub fn instance(&self) -> Option<&str> {
        self.shared.instance.get().map(String::as_str)
    }

    /// Starts draining: the peer (if it understands DRAIN; a client does
    /// from this version on) is told to open its next streams through a
    /// new session; the open streams go on, and OPENs are still served.
    /// Whoever runs the session decides when to end it
    /// ([`SessionHandle::shutdown`]).
    ///
    /// Returns whether the peer was told. Only then does
    /// [`SessionHandle::drain_started`] resolve: a peer that cannot hear it
    /// would not bind its reverse forwards again elsewhere, so they stay.
    pub fn drain(&self, why: &str) -> bool {
        let told = self.shared.with(|m, _| {
            m.drain(why);
            m.drain_negotiated()
        });
        if told {
            self.shared.drain_tx.send_replace(true);
            self.shared.wake_writer.notify_one();
        }
        told
    }

    /// Whether this side told the peer it is draining.
    pub fn is_draining(&self) -> bool {
        *self.shared.drain_tx.borrow()
    }

    /// Whether streams are open or being opened (an OPEN from the peer
    /// still connecting to its target counts).
    pub fn has_streams(&self) -> bool {
        self.shared.with(|m, _| m.has_streams())
    }

    /// Resolves once this side has told the peer it is draining (never
    /// otherwise): what serves the peer's reverse forwards stops taking
    /// connections then.
    pub async fn drain_started(&self) {
        let mut rx = self.shared.drain_tx.subscribe();
        if rx.wait_for(|d| *d).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The peer's reason, once it said it is draining.
    pub fn peer_drain(&self) -> Option<String> {
        self.shared.peer_drain_tx.borrow().clone()
    }

    /// Resolves with the peer's reason once it says it is draining (never
    /// otherwise).
    pub async fn peer_draining(&self) -> String {
        let mut rx = self.shared.peer_drain_tx.subscribe();
        let why = match rx.wait_for(|d| d.is_some()).await {
            Ok(d) => d.clone(),
            Err(_) => None,
        };
        match why {
            Some(why) => why,
            None => std::future::pending().await,
        }
    }

    /// Whether the session has no carrier now (waiting for a resume).
    pub fn is_detached(&self) -> bool {
        *self.shared.detached_tx.borrow()
    }

    /// Waits until the session loses its carrier (`true`) or ends
    /// (`false`).
    pub async fn detached(&self) -> bool {
        let mut rx = self.shared.detached_tx.subscribe();
        tokio::select! {
            r = rx.wait_for(|d| *d) => r.is_ok(),
            _ = self.closed() => false,
        }
    }

    /// Client side: attaches a freshly dialled carrier (authenticated, the
    /// preamble sent) to this session and replays what the server missed.
    /// Returns the bytes sent again. A refusal leaves the session detached;
    /// the caller decides whether to close it.
    pub async fn resume(&self, carrier: Carrier) -> Result<u64, SessionError> {
        crate::resume::resume_client(&self.shared, carrier).await
    }
}
