//! The attach exchange on the runtime side: a client asking for a new
//! resumable session or resuming one, and the server's table of sessions
//! that may be resumed (see `longhaul_proto::resume` for the messages).
//!
//! Security: the exchange runs only after the carrier's own
//! authentication; a resume must come from the identity that started the
//! session and prove the session secret with an attempt number never used
//! before. Refusals are logged, and checked before the live session is
//! touched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use longhaul_carrier::Carrier;
use longhaul_proto::link::{AttachRefused, LinkLayer};
use longhaul_proto::resume::{
    instance, Attach, Attached, Refusal, SessionId, ATTACHED_LEN, ATTACH_LEN,
};
use longhaul_proto::stripe::MAX_LANES;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::{Role, SessionConfig, SessionError};
use crate::kex::{binding, Share};
use crate::runtime::{Acceptor, SessionHandle, Shared};
use crate::start::{build, decode_limits, replay_limit, Negotiated};

/// What [`crate::Session::serve`] did with a carrier.
pub enum Served {
    /// The client asks for a new session: start it, or refuse it.
    New(Box<NewSession>),
    /// It now carries an existing session that had lost its carrier.
    Resumed(SessionHandle),
    /// It is one more lane of a striped session.
    Joined(SessionHandle),
}

/// Refused resumes and lanes logged, across sessions: an authenticated
/// peer can ask as often as it likes.
static REFUSED: crate::logs::Throttle = crate::logs::Throttle::new();

/// How long a lane for an unknown session waits for it to be filed.
const LANE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// A server's sessions that may be resumed, by id. Entries are weak: a
/// session that ended is gone from the table at the next lookup or insert.
/// Bounded by the server's session limit (a detached session keeps its
/// slot).
#[derive(Default)]
pub struct Resumables {
    map: Mutex<HashMap<SessionId, Weak<Shared>>>,
    /// The table's size after its last sweep.
    swept_at: AtomicUsize,
}

impl Resumables {
    pub fn new() -> Arc<Resumables> {
        Arc::new(Resumables::default())
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Weak<Shared>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Files a new session. Entries of sessions gone are swept when the
    /// table has doubled since the last sweep (amortised; the sweep looks
    /// at reference counts only, never at a session's lock).
    pub(crate) fn insert(&self, id: SessionId, s: &Arc<Shared>) {
        let mut m = self.map();
        if m.len() >= self.swept_at.load(Ordering::Relaxed).max(64) * 2 {
            m.retain(|_, w| w.strong_count() > 0);
            self.swept_at.store(m.len(), Ordering::Relaxed);
        }
        m.insert(id, Arc::downgrade(s));
    }

    fn get(&self, id: &SessionId) -> Option<Arc<Shared>> {
        let s = self.map().get(id)?.upgrade()?;
        (!s.is_dead()).then_some(s)
    }

    /// Like `get`, but waits up to [`LANE_GRACE`] for a session not filed
    /// yet: a client dials its lanes as soon as the answer that starts the
    /// session arrives, and the server files the session just after
    /// sending it.
    async fn get_soon(&self, id: &SessionId) -> Option<Arc<Shared>> {
        let until = tokio::time::Instant::now() + LANE_GRACE;
        loop {
            if let Some(s) = self.get(id) {
                return Some(s);
            }
            if tokio::time::Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Sessions in the table (live or detached).
    pub fn len(&self) -> usize {
        self.map().values().filter(|w| w.strong_count() > 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub(crate) async fn exchange<T>(
    config: &SessionConfig,
    f: impl std::future::Future<Output = Result<T, SessionError>>,
) -> Result<T, SessionError> {
    tokio::time::timeout(config.handshake_timeout, f)
        .await
        .map_err(|_| SessionError::HelloTimeout(config.handshake_timeout))?
}

/// Client: asks for a new resumable session. Returns its link layer and
/// the server's instance name, if it told one (`with_instance`: the
/// hellos agreed it would).
pub(crate) async fn open_new(
    carrier: &mut Carrier,
    config: &SessionConfig,
    with_instance: bool,
) -> Result<(LinkLayer, Option<String>), SessionError> {
    let limit = replay_limit(config);
    let share = Share::new()?;
    let ours = share.public();
    let answer = exchange(config, async {
        let ask = Attach::New {
            replay_limit: limit as u32,
            lanes: config.stripes.min(MAX_LANES as u8),
            share: ours,
        };
        carrier.writer.write_all(&ask.encode()).await?;
        carrier.writer.flush().await?;
        let mut b = [0u8; ATTACHED_LEN];
        carrier.reader.read_exact(&mut b).await?;
        let answer = Attached::decode(&b)?;
        let mut name = None;
        if with_instance && matches!(answer, Attached::New { .. }) {
            let mut len = [0u8; 1];
            carrier.reader.read_exact(&mut len).await?;
            if len[0] as usize > instance::MAX_LEN {
                return Err(SessionError::Closed(format!(
                    "server sent an instance name of {} bytes (at most {})",
                    len[0],
                    instance::MAX_LEN
                )));
            }
            let mut b = vec![0u8; len[0] as usize];
            carrier.reader.read_exact(&mut b).await?;
            name = instance::decode(&b);
        }
        Ok((answer, name))
    })
    .await?;
    let (answer, name) = answer;
    match answer {
        Attached::New {
            id,
            share: theirs,
            replay_limit: peer,
            lanes,
        } => {
            let secret = share.secret(&theirs, &id, &ours, &theirs)?;
            if lanes > config.stripes.max(1) || lanes as usize > MAX_LANES {
                return Err(SessionError::Closed(format!(
                    "server granted {lanes} lanes, more than asked"
                )));
            }
            // not peer text: a name that passed instance::valid (letters, digits, - and .)
            tracing::debug!(session = %id, lanes, instance = ?name, "resumable session opened");
            let link = LinkLayer::new(limit, peer as usize, lanes, id, secret, String::new());
            Ok((link, name))
        }
        Attached::Refused(r) => Err(SessionError::ResumeRefused(r)),
        Attached::Resumed { .. } | Attached::Joined => Err(SessionError::Closed(
            "server answered a new session with a resume".into(),
        )),
    }
}

/// Milliseconds since the epoch: attempt numbers stay ahead of any used
/// before by this client even if it lost count.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Client: the hello with `ask` written right behind it (the server
/// offered resume when the session started: one round trip), then the
/// server's answer.
async fn attach_behind_hello(
    carrier: &mut Carrier,
    config: &SessionConfig,
    ask: &Attach,
) -> Result<(Negotiated, Attached), SessionError> {
    let n = crate::start::hello_then(carrier, config, &ask.encode()).await?;
    if !n.resume {
        return Err(SessionError::NoResume);
    }
    let answer = exchange(config, async {
        let mut b = [0u8; ATTACHED_LEN];
        carrier.reader.read_exact(&mut b).await?;
        Ok(Attached::decode(&b)?)
    })
    .await?;
    Ok((n, answer))
}

/// Client: resumes `shared` on a new carrier.
pub(crate) async fn resume_client(
    shared: &Arc<Shared>,
    mut carrier: Carrier,
) -> Result<u64, SessionError> {
    if !shared.resumable {
        return Err(SessionError::NoResume);
    }
    if let Some(why) = shared.with(|m, _| m.dead().map(str::to_owned)) {
        return Err(SessionError::Closed(why));
    }
    let config = &shared.config;
    let _attaching = shared.attach_lock.lock().await;
    // The old carrier may still be attached (it died without a sign yet),
    // or its tasks still finishing: either way, they end first.
    shared
        .stop_carrier("replaced by a new carrier")
        .await
        .map_err(SessionError::Closed)?;
    let ask = shared
        .link()
        .ok_or(SessionError::NoResume)?
        .resume_request(&binding(&carrier), wall_ms());
    let (n, answer) = attach_behind_hello(&mut carrier, config, &ask).await?;
    match answer {
        Attached::Resumed { received, .. } => {
            let limits = decode_limits(config, &n);
            shared
                .resume_on(carrier, limits, n.quiet_keepalive, received)
                .map_err(|e| {
                    let why = format!("cannot resume: {e}");
                    shared.close(why.clone());
                    SessionError::Closed(why)
                })
        }
        Attached::Refused(r) => Err(SessionError::ResumeRefused(r)),
        Attached::New { .. } | Attached::Joined => Err(SessionError::Closed(
            "server answered a resume with a new session".into(),
        )),
    }
}

/// Client: adds `carrier` as lane `number` of the striped session `shared`.
pub(crate) async fn join_lane(
    shared: &Arc<Shared>,
    mut carrier: Carrier,
    number: u8,
) -> Result<(), SessionError> {
    if !shared.striped {
        return Err(SessionError::NoResume);
    }
    let config = &shared.config;
    let _attaching = shared.attach_lock.lock().await;
    if let Some(why) = shared.with(|m, _| m.dead().map(str::to_owned)) {
        return Err(SessionError::Closed(why));
    }
    let ask = {
        let mut l = shared.link().ok_or(SessionError::NoResume)?;
        if l.is_detached() {
            return Err(SessionError::Closed(
                "the session has no lane left: it must be resumed first".into(),
            ));
        }
        l.lane_request(number, &binding(&carrier), wall_ms())
    };
    let (n, answer) = attach_behind_hello(&mut carrier, config, &ask).await?;
    match answer {
        Attached::Joined => {
            let limits = decode_limits(config, &n);
            // The last lane may have failed meanwhile: then only a resume
            // attaches (the link layer refuses the lane).
            let id = shared
                .link()
                .ok_or(SessionError::NoResume)?
                .attach(number)
                .map_err(|e| SessionError::Closed(e.why))?;
            shared.spawn_lane(carrier, limits, id, number);
            Ok(())
        }
        Attached::Refused(r) => Err(SessionError::ResumeRefused(r)),
        _ => Err(SessionError::Closed(
            "server answered a lane with something else".into(),
        )),
    }
}

/// Server: the attach exchange after the hello.
pub(crate) async fn serve_attach(
    mut carrier: Carrier,
    config: SessionConfig,
    acceptor: Arc<dyn Acceptor>,
    resumables: &Arc<Resumables>,
    identity: String,
    n: &Negotiated,
) -> Result<Served, SessionError> {
    let ask = exchange(&config, async {
        let mut b = [0u8; ATTACH_LEN];
        carrier.reader.read_exact(&mut b).await?;
        Ok(Attach::decode(&b)?)
    })
    .await?;
    let from = carrier.peer.clone();
    let limit = config.handshake_timeout;
    let refuse = |mut carrier: Carrier, r: Refusal, why: String| async move {
        if REFUSED.pass("refused resumes and lanes") {
            tracing::warn!(peer = %from, "resume refused: {why}");
        }
        let _ = tokio::time::timeout(limit, async {
            carrier
                .writer
                .write_all(&Attached::Refused(r).encode())
                .await?;
            carrier.writer.flush().await
        })
        .await;
        Err(SessionError::ResumeRefused(r))
    };
    match ask {
        Attach::New {
            replay_limit: peer,
            lanes,
            share: theirs,
        } => {
            let id = SessionId(rand::random());
            let share = Share::new()?;
            let ours = share.public();
            let secret = match share.secret(&theirs, &id, &theirs, &ours) {
                Ok(s) => s,
                Err(_) => {
                    return refuse(carrier, Refusal::Denied, "a bad key share".into()).await;
                }
            };
            let limit = replay_limit(&config);
            let lanes = match lanes.min(config.max_stripes).min(MAX_LANES as u8) {
                0 | 1 => 0,
                n => n,
            };
            let answer = Attached::New {
                id,
                share: ours,
                replay_limit: limit as u32,
                lanes,
            };
            let mut msg = answer.encode().to_vec();
            if n.instance {
                msg.extend(instance::encode(config.instance.as_deref()));
            }
            let link = LinkLayer::new(limit, peer as usize, lanes, id, secret, identity);
            Ok(Served::New(Box::new(NewSession {
                carrier,
                config,
                acceptor,
                negotiated: n.clone(),
                resumable: Some(Resumable {
                    answer: msg,
                    link,
                    id,
                    table: resumables.clone(),
                }),
            })))
        }
        Attach::Lane {
            id,
            attempt,
            lane,
            proof: shown,
        } => {
            let Some(shared) = resumables.get_soon(&id).await else {
                return refuse(carrier, Refusal::Unknown, format!("no session {id}")).await;
            };
            let _attaching = shared.attach_lock.lock().await;
            let bound = binding(&carrier);
            let verdict = shared
                .link()
                .map(|mut l| l.check_lane(&identity, attempt, lane, &shown, &bound));
            let Some(verdict) = verdict else {
                return refuse(carrier, Refusal::Unknown, format!("no session {id}")).await;
            };
            if let Err(AttachRefused { refusal, why }) = verdict {
                return refuse(carrier, refusal, format!("lane for {id}: {why}")).await;
            }
            exchange(&config, async {
                carrier.writer.write_all(&Attached::Joined.encode()).await?;
                carrier.writer.flush().await?;
                Ok(())
            })
            .await?;
            let limits = decode_limits(&config, n);
            // The last lane may have failed since the check: then the lane
            // is dropped, and the client resumes.
            let attached = shared.link().map(|mut l| l.attach(lane));
            let Some(Ok(lane_id)) = attached else {
                tracing::info!(session = %id, lane, "lane dropped: the session lost its last lane meanwhile");
                return Err(SessionError::Closed(
                    "the session must be resumed first".into(),
                ));
            };
            shared.spawn_lane(carrier, limits, lane_id, lane);
            tracing::debug!(session = %id, lane, "lane joined");
            drop(_attaching);
            Ok(Served::Joined(SessionHandle { shared }))
        }
        Attach::Resume {
            id,
            attempt,
            received,
            proof: shown,
            ..
        } => {
            let Some(shared) = resumables.get(&id) else {
                return refuse(carrier, Refusal::Unknown, format!("no session {id}")).await;
            };
            let _attaching = shared.attach_lock.lock().await;
            // Checked before the live carrier is touched: the proof, the
            // identity, the attempt, and an offset that fits what was sent.
            let bound = binding(&carrier);
            let verdict = shared
                .link()
                .map(|mut l| l.check_resume(&identity, attempt, received, &shown, &bound));
            let Some(verdict) = verdict else {
                return refuse(carrier, Refusal::Unknown, format!("no session {id}")).await;
            };
            if let Err(AttachRefused { refusal, why }) = verdict {
                return refuse(carrier, refusal, why).await;
            }
            if shared.is_dead() {
                return refuse(carrier, Refusal::Unknown, format!("session {id} ended")).await;
            }
            // The client may have seen its carrier die before we did; and
            // the old carrier's tasks end before anything is counted.
            if let Err(why) = shared.stop_carrier("replaced by a resumed carrier").await {
                return refuse(carrier, Refusal::Unknown, why).await;
            }
            // What the peer acknowledged may have moved since the check.
            let offsets = shared
                .link()
                .map(|l| (l.check_offset(received), l.received()));
            let ours = match offsets {
                Some((Ok(()), ours)) => ours,
                Some((Err(AttachRefused { refusal, why }), _)) => {
                    return refuse(carrier, refusal, why).await
                }
                None => return refuse(carrier, Refusal::Unknown, format!("no session {id}")).await,
            };
            // Over meanwhile (closed, or past --resume-timeout while the
            // old carrier stopped): a fresh session, not a resumed one.
            if shared.with_conn_quiet(|c, now| c.is_over(now.ns())) {
                return refuse(carrier, Refusal::Unknown, format!("session {id} ended")).await;
            }
            let answer = Attached::Resumed {
                received: ours,
                replay_limit: shared.link().map_or(0, |l| l.replay().limit()) as u32,
            };
            exchange(&config, async {
                carrier.writer.write_all(&answer.encode()).await?;
                carrier.writer.flush().await?;
                Ok(())
            })
            .await?;
            let limits = decode_limits(&config, n);
            if let Err(e) = shared.resume_on(carrier, limits, n.quiet_keepalive, received) {
                let why = format!("cannot resume session {id}: {e}");
                shared.close(why.clone());
                return Err(SessionError::Closed(why));
            }
            drop(_attaching);
            Ok(Served::Resumed(SessionHandle { shared }))
        }
    }
}

// ---- a new session, held between the ask and its start ----
// A new session a client asked the server for, held between the ask and
// its start: the server decides (a slot under `--max-sessions`) before
// anything the client sent is acted on. Until [`NewSession::start`] no
// reader runs on the carrier, so OPENs and BINDs the client pipelined
// behind its hello wait unread, and are dropped with the carrier if the
// session is refused.

/// A new session, asked for and not yet answered.
pub struct NewSession {
    pub(crate) carrier: Carrier,
    pub(crate) config: SessionConfig,
    pub(crate) acceptor: Arc<dyn Acceptor>,
    pub(crate) negotiated: Negotiated,
    /// A resumable session's answer (written by `start`), its link layer,
    /// and the table it is filed in.
    pub(crate) resumable: Option<Resumable>,
}

pub(crate) struct Resumable {
    pub answer: Vec<u8>,
    pub link: LinkLayer,
    pub id: SessionId,
    pub table: Arc<Resumables>,
}

impl NewSession {
    /// Answers the client and starts the session's tasks.
    pub async fn start(self) -> Result<SessionHandle, SessionError> {
        let NewSession {
            mut carrier,
            config,
            acceptor,
            negotiated,
            resumable,
        } = self;
        let Some(r) = resumable else {
            return Ok(build(
                carrier,
                config,
                acceptor,
                &negotiated,
                Role::Server,
                None,
            ));
        };
        exchange(&config, async {
            carrier.writer.write_all(&r.answer).await?;
            carrier.writer.flush().await?;
            Ok(())
        })
        .await?;
        let h = build(
            carrier,
            config,
            acceptor,
            &negotiated,
            Role::Server,
            Some(r.link),
        );
        r.table.insert(r.id, &h.shared);
        tracing::debug!(session = %r.id, "resumable session started");
        Ok(h)
    }

    /// Refuses the session: a client that asked for a resumable one is
    /// told the server is full; the carrier is then dropped unread.
    pub async fn refuse_busy(mut self) {
        if self.resumable.is_none() {
            return;
        }
        let answer = Attached::Refused(Refusal::Busy).encode();
        let _ = exchange(&self.config, async {
            self.carrier.writer.write_all(&answer).await?;
            self.carrier.writer.flush().await?;
            Ok(())
        })
        .await;
    }
}
