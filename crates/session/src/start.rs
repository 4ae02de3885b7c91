//! Starting a session: the hello on its first carrier, then its
//! connection and tasks.

use std::sync::Arc;
use std::time::Duration;

use longhaul_carrier::Carrier;
use longhaul_proto::connection::Connection;
use longhaul_proto::frame::{self, DecodeLimits, MAX_DATA_PAYLOAD};
use longhaul_proto::handshake::{self, Hello, HELLO_LEN};
use longhaul_proto::link::{LinkLayer, MIN_REPLAY_LIMIT};
use longhaul_proto::mux::{Mux, MuxConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::{Mode, Role, SessionConfig, SessionError};
use crate::housekeeping::housekeeping;
use crate::runtime::{Acceptor, SessionHandle, Shared};

/// How long a closing session's writer may still take to write what it
/// has (a peer that stopped reading) before it is cancelled and the carrier
/// dropped.
const WRITER_GRACE: Duration = Duration::from_secs(2);

/// What the hello settled.
#[derive(Clone)]
pub(crate) struct Negotiated {
    pub extensions: bool,
    pub frame_limit: u16,
    /// Both sides offered the link layer.
    pub resume: bool,
    /// Both sides understand DRAIN.
    pub drain: bool,
    /// A new resumable session's answer is followed by the server's
    /// instance name.
    pub instance: bool,
    /// Both sides offered the quiet keepalive: the shorter of the two
    /// intervals, which both then use (the side that asked for the shorter
    /// knows of a middlebox that needs it).
    pub quiet_keepalive: Option<Duration>,
}

/// Runs the native hello (nothing in JMUX mode).
pub(crate) async fn hello(
    carrier: &mut Carrier,
    config: &SessionConfig,
) -> Result<Negotiated, SessionError> {
    hello_then(carrier, config, &[]).await
}

/// The hello, with `then` written right behind ours in the same flight
/// (a resume's attach message: one round trip saved on every resume).
pub(crate) async fn hello_then(
    carrier: &mut Carrier,
    config: &SessionConfig,
    then: &[u8],
) -> Result<Negotiated, SessionError> {
    if config.mode == Mode::Jmux {
        return Ok(Negotiated {
            extensions: false,
            frame_limit: u16::MAX,
            resume: false,
            drain: false,
            instance: false,
            quiet_keepalive: None,
        });
    }
    let mut ours = Hello::ours(config.max_frame);
    if config.resume {
        ours.features |= handshake::FEATURE_RESUME;
    }
    // Only over a TCP socket, whose kernel keepalive watches the carrier
    // while PINGs are rare (a folder or a pipe has none).
    let quiet = config.quiet_keepalive.filter(|q| *q > config.keepalive);
    if let (Some(q), Some(_)) = (quiet, &carrier.probe) {
        ours.features |= handshake::FEATURE_QUIET_KEEPALIVE;
        let max = handshake::MAX_QUIET_KEEPALIVE_SECS;
        ours.quiet_keepalive_secs = q.as_secs().min(max.into()) as u16;
    }
    let hello = async {
        let mut first = ours.encode().to_vec();
        first.extend_from_slice(then);
        carrier.writer.write_all(&first).await?;
        carrier.writer.flush().await?;
        let mut b = [0u8; HELLO_LEN];
        carrier.reader.read_exact(&mut b).await?;
        Ok::<_, SessionError>(Hello::decode(&b)?)
    };
    let peer = tokio::time::timeout(config.handshake_timeout, hello)
        .await
        .map_err(|_| SessionError::HelloTimeout(config.handshake_timeout))??;
    let n = ours.negotiate(&peer);
    Ok(Negotiated {
        extensions: n.features & handshake::FEATURE_PING != 0,
        frame_limit: n.max_frame,
        // The link layer's frames are extensions: resume needs them.
        resume: n.features & handshake::FEATURE_RESUME != 0
            && n.features & handshake::FEATURE_PING != 0,
        drain: n.features & handshake::FEATURE_DRAIN != 0
            && n.features & handshake::FEATURE_PING != 0,
        instance: n.features & handshake::FEATURE_INSTANCE != 0,
        quiet_keepalive: ours
            .peer_quiet_keepalive(&peer)
            .map(|theirs| theirs.min(Duration::from_secs(ours.quiet_keepalive_secs.into()))),
    })
}

/// The frame limits a session's readers decode with.
pub(crate) fn decode_limits(config: &SessionConfig, n: &Negotiated) -> DecodeLimits {
    DecodeLimits {
        max_frame: config.max_frame as usize,
        extensions: n.extensions,
    }
}

/// The replay bound this side uses.
pub(crate) fn replay_limit(config: &SessionConfig) -> usize {
    let limit = match config.replay_limit {
        0 => crate::link::auto_replay_limit(),
        n => n,
    };
    // The attach messages carry it in 32 bits.
    limit.clamp(MIN_REPLAY_LIMIT, u32::MAX as usize)
}

/// Starts the tasks of a session on its first carrier.
pub(crate) fn build(
    carrier: Carrier,
    config: SessionConfig,
    acceptor: Arc<dyn Acceptor>,
    n: &Negotiated,
    role: Role,
    link: Option<LinkLayer>,
) -> SessionHandle {
    let mux = Mux::new(MuxConfig {
        window: config.window,
        budget: config.budget,
        max_streams: config.max_streams,
        send_queue: config.send_queue,
        send_total: config.send_total,
        control_limit: config.control_limit,
        keepalive: config.keepalive,
        dead_after: config.dead_after,
        open_timeout: config.open_timeout,
        idle_timeout: config.idle_timeout,
        rtt_floor: config.rtt_floor,
        jmux: config.mode == Mode::Jmux,
        extensions: n.extensions,
        our_max_packet: (config.max_frame as usize)
            .saturating_sub(frame::DATA_HEADER_LEN)
            .clamp(1, MAX_DATA_PAYLOAD) as u16,
        send_max_payload: (n.frame_limit as usize)
            .saturating_sub(frame::DATA_HEADER_LEN)
            .clamp(1, MAX_DATA_PAYLOAD),
        resumable: link.is_some(),
    });
    let mut mux = mux;
    mux.set_drain_negotiated(n.drain);
    mux.set_quiet_keepalive(n.quiet_keepalive);
    // Clients ping; a server answers, and pings only a client that stops.
    mux.set_answer_only(role == Role::Server);
    let limits = decode_limits(&config, n);
    let peer = carrier.peer.clone();
    let mut link = link;
    let first = link.as_mut().map_or(Ok(0), |l| l.attach(0));
    let mut conn = Connection::new(mux, link, limits);
    if role == Role::Server {
        // The client keeps trying until its own limit; the server gives a
        // detached session up after this (its housekeeping runs the timer).
        conn.set_resume_timeout(Some(config.resume_timeout));
    }
    let shared = Arc::new(Shared::new(conn, config, acceptor, peer));
    match first {
        Ok(id) if shared.striped => shared.spawn_lane(carrier, limits, id, 0),
        Ok(id) => shared.spawn_carrier(carrier, id, Vec::new()),
        Err(e) => unreachable!("a session's first carrier attaches: {e:?}"),
    }
    let house = shared.spawn(housekeeping(shared.clone()));
    // When the session closes, stop the tasks that might be parked.
    let mut closed = shared.closed_tx.subscribe();
    let finished = shared.finished_tx.clone();
    let sh = shared.clone();
    tokio::spawn(async move {
        let _ = closed.wait_for(|c| c.is_some()).await;
        house.abort();
        let (reader, writer, lanes) = {
            let mut slot = sh.slot();
            // The probe holds a duplicate of the carrier's socket: the
            // socket closes only once it is gone too.
            slot.probe = None;
            slot.forget_datagrams();
            let mut lanes: Vec<_> = slot.lanes.drain(..).collect();
            lanes.append(&mut slot.retired);
            (slot.reader.take(), slot.writer.take(), lanes)
        };
        // Every lane's writer wakes, finishes its chunk and ends.
        sh.wake_writer.notify_waiters();
        for lane in lanes {
            lane.reader.abort();
            let abort = lane.writer.abort_handle();
            if tokio::time::timeout(WRITER_GRACE, lane.writer)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        if let Some(r) = reader {
            r.abort();
        }
        // The writer sees the session dead and exits on its own after
        // waking, unless it is stuck writing to a peer that stopped
        // reading: then it is cancelled, which drops the carrier.
        if let Some(w) = writer {
            let abort = w.abort_handle();
            if tokio::time::timeout(WRITER_GRACE, w).await.is_err() {
                abort.abort();
            }
        }
        finished.send_replace(true);
    });
    SessionHandle { shared }
}
