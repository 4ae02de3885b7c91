//! What each frame from the peer does: the protocol's rules.

use crate::frame::{Frame, Reason};
use crate::window::SendCredit;

use super::stream::{Down, Phase, StreamFrame, Up, Verdict};
use super::{Event, Expired, IncomingOpen, Mux, Refused, MAX_BINDS, MIN_PEER_PACKET};

/// A peer's maximum packet size below [`MIN_PEER_PACKET`] is refused.
fn check_packet(max_packet: u16) -> Result<(), Violation> {
    if max_packet < MIN_PEER_PACKET {
        return Err(Violation(format!(
            "maximum packet size {max_packet} below {MIN_PEER_PACKET}"
        )));
    }
    Ok(())
}

/// A protocol violation: the session must end, with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Violation(pub String);

impl Mux {
    /// Handles one frame from the peer. An `Err` is a protocol violation;
    /// the session is then closed ([`Mux::dead`] says why).
    pub fn handle_frame(&mut self, f: Frame, now: u64) -> Result<(), Violation> {
        if self.dead.is_some() {
            return Ok(());
        }
        let r = self.apply(f, now);
        if let Err(v) = &r {
            self.close(v.0.clone());
        } else if let Some(why) = &self.dead {
            return Err(Violation(why.clone()));
        }
        r
    }

    /// Checks a stream frame against the stream's state. `Ok(None)`: drop
    /// the frame.
    fn check(&self, id: u32, kind: StreamFrame, name: &str) -> Result<Option<Phase>, Violation> {
        let Some(s) = self.streams.get(&id) else {
            return self.unknown(id, kind, name).map(|()| None);
        };
        match s.phase.accepts(kind) {
            Verdict::Accept => Ok(Some(s.phase)),
            Verdict::Ignore => Ok(None),
            Verdict::Violation(why) => Err(Violation(format!("{name} for stream {id}: {why}"))),
        }
    }

    /// A frame for a stream we do not know. Native peers never send one; a
    /// JMUX peer (jetsocat) does after its own CLOSE (WINDOW_ADJUST, a
    /// second CLOSE), so in that mode it is ignored.
    fn unknown(&self, id: u32, kind: StreamFrame, name: &str) -> Result<(), Violation> {
        let closing = self.expired.get(&id) == Some(&Expired::Closing);
        let answer = matches!(kind, StreamFrame::OpenSuccess | StreamFrame::OpenFailure);
        if !answer && (closing || self.cfg.jmux) {
            return Ok(());
        }
        Err(Violation(format!("{name} for unknown stream {id}")))
    }

    fn apply(&mut self, f: Frame, now: u64) -> Result<(), Violation> {
        match f {
            Frame::Datagram { recipient, payload } => self.on_datagram(recipient, payload),
            Frame::Data { recipient, payload } => {
                if self.check(recipient, StreamFrame::Data, "DATA")?.is_none() {
                    return Ok(());
                }
                if payload.len() > self.cfg.our_max_packet as usize {
                    return Err(Violation(format!(
                        "DATA of {} bytes exceeds the maximum packet size {}",
                        payload.len(),
                        self.cfg.our_max_packet
                    )));
                }
                let Some(s) = self.streams.get_mut(&recipient) else {
                    return Ok(());
                };
                s.recv
                    .on_data(payload.len())
                    .map_err(|o| Violation(format!("stream {recipient}: window overrun: {o}")))?;
                self.bytes_received += payload.len() as u64;
                if !payload.is_empty() {
                    self.events.push_back(Event::Data {
                        id: recipient,
                        payload,
                    });
                }
            }
            Frame::WindowAdjust {
                recipient,
                increment,
            } => {
                if self
                    .check(recipient, StreamFrame::WindowAdjust, "WINDOW_ADJUST")?
                    .is_none()
                {
                    return Ok(());
                }
                if let Some(s) = self.streams.get_mut(&recipient) {
                    s.credit.add(increment);
                    if s.waiting {
                        s.waiting = false;
                        self.events.push_back(Event::Writable { id: recipient });
                    }
                }
            }
            Frame::Open {
                sender,
                window,
                max_packet,
                dest,
            } => {
                check_packet(max_packet)?;
                // What the peer is told, and what the log says.
                let refuse = if self.goodbye.is_some() {
                    Some(("shutting down", "the session is shutting down"))
                } else if self.slots_used() >= self.cfg.max_streams {
                    Some(("too many streams", "stream limit reached (--max-streams)"))
                } else {
                    None
                };
                match refuse {
                    Some((told, why)) => {
                        // Logged by the runtime, escaped and throttled.
                        self.events.push_back(Event::RefusedOpen { dest, why });
                        self.send_control(Frame::OpenFailure {
                            recipient: sender,
                            reason: Reason::GENERAL_FAILURE,
                            description: told.into(),
                        })
                    }
                    None => {
                        self.connecting += 1;
                        self.events.push_back(Event::OpenRequest {
                            open: IncomingOpen {
                                sender,
                                window,
                                max_packet,
                            },
                            dest,
                        });
                    }
                }
            }
            Frame::OpenSuccess {
                recipient,
                sender,
                window,
                max_packet,
            } => {
                if !self.streams.contains_key(&recipient)
                    && self.expired.get(&recipient) == Some(&Expired::Unanswered)
                {
                    // Too late: we gave up on it. Close it at once.
                    self.expired.insert(recipient, Expired::Closing);
                    self.send_control(Frame::Close { recipient: sender });
                    return Ok(());
                }
                self.check(recipient, StreamFrame::OpenSuccess, "OPEN_SUCCESS")?;
                check_packet(max_packet)?;
                let max_packet = self.clamp_packet(max_packet);
                if let Some(s) = self.streams.get_mut(&recipient) {
                    s.remote = sender;
                    s.credit = SendCredit::new(window);
                    s.max_packet = max_packet;
                    s.phase = Phase::Open {
                        up: Up::Open,
                        down: Down::Open,
                    };
                }
                self.events.push_back(Event::OpenAnswered {
                    id: recipient,
                    result: Ok(()),
                });
            }
            Frame::OpenFailure {
                recipient,
                reason,
                description,
            } => {
                if !self.streams.contains_key(&recipient)
                    && self.expired.get(&recipient) == Some(&Expired::Unanswered)
                {
                    self.expired.remove(&recipient);
                    return Ok(());
                }
                self.check(recipient, StreamFrame::OpenFailure, "OPEN_FAILURE")?;
                self.remove(recipient);
                self.events.push_back(Event::OpenAnswered {
                    id: recipient,
                    result: Err(Refused {
                        reason,
                        description,
                    }),
                });
            }
            Frame::Eof { recipient } => {
                let Some(Phase::Open { up, .. }) =
                    self.check(recipient, StreamFrame::Eof, "EOF")?
                else {
                    return Ok(());
                };
                if let Some(s) = self.streams.get_mut(&recipient) {
                    s.phase = Phase::Open {
                        up,
                        down: Down::EofReceived,
                    };
                }
                self.events.push_back(Event::Eof { id: recipient });
            }
            Frame::Close { recipient } => {
                if !self.streams.contains_key(&recipient)
                    && self.expired.get(&recipient) == Some(&Expired::Closing)
                {
                    self.expired.remove(&recipient);
                    return Ok(());
                }
                let Some(phase) = self.check(recipient, StreamFrame::Close, "CLOSE")? else {
                    return Ok(());
                };
                if let (Phase::Open { down, .. }, Some(s)) = (phase, self.streams.get(&recipient)) {
                    // The peer is done with the stream: our unsent data for
                    // it is moot. Answer with our CLOSE. A native peer sends
                    // EOF before a graceful CLOSE, so a CLOSE while its data
                    // is still open means its side was reset or failed: pass
                    // the reset on. (A JMUX peer, jetsocat, never resets: its
                    // CLOSE without EOF still ends the local socket with FIN.)
                    let reset = down == Down::Open && !self.cfg.jmux;
                    let (remote, sent, received) = (s.remote, s.tx_bytes, s.rx_bytes);
                    self.data.remove(recipient);
                    self.wake_if_total_drained();
                    self.events.push_back(Event::Finished {
                        id: recipient,
                        discard: false,
                        reset,
                        sent,
                        received,
                    });
                    self.send_control(Frame::Close { recipient: remote });
                }
                self.remove(recipient);
            }
            Frame::Ping { nonce } => {
                self.peer_pinged = Some(now);
                self.send_control(Frame::Pong { nonce })
            }
            Frame::Pong { nonce } => {
                // Only an answer to a PING we sent is a sample; a forged or
                // repeated nonce would fake the RTT.
                if let Some(i) = self.pings.iter().position(|&n| n == nonce) {
                    self.pings.remove(i);
                    let sample = now.saturating_sub(nonce);
                    self.ping_rtt_ns = if self.ping_rtt_ns == 0 {
                        sample
                    } else {
                        (self.ping_rtt_ns * 7 + sample) / 8
                    };
                }
            }
            Frame::Bind {
                request,
                bind,
                dest,
            } => {
                if self.binds_in >= MAX_BINDS || self.goodbye.is_some() {
                    self.send_control(Frame::BindFailure {
                        request,
                        reason: Reason::GENERAL_FAILURE,
                        description: "too many reverse forwards".into(),
                    });
                } else if !super::local::open_fits(&dest) {
                    // Our OPENs back to `dest` could never be sent.
                    let refused = super::local::too_long("destination");
                    self.send_control(Frame::BindFailure {
                        request,
                        reason: refused.reason,
                        description: refused.description,
                    });
                } else {
                    self.binds_in += 1;
                    self.events.push_back(Event::BindRequest {
                        request,
                        bind,
                        dest,
                    });
                }
            }
            Frame::BindSuccess { request, port } => {
                self.bind_answered(request, Ok(port), "BIND_SUCCESS")?
            }
            Frame::BindFailure {
                request,
                reason,
                description,
            } => self.bind_answered(
                request,
                Err(Refused {
                    reason,
                    description,
                }),
                "BIND_FAILURE",
            )?,
            Frame::Drain { reason } => self.on_drain(reason),
            Frame::Ack { .. } | Frame::Goodbye | Frame::Chunk { .. } => {
                // The link layer takes its frames before they reach here.
                return Err(Violation(
                    "link frame on a session without a link layer".into(),
                ));
            }
        }
        Ok(())
    }

    fn bind_answered(
        &mut self,
        request: u32,
        result: Result<u16, Refused>,
        name: &str,
    ) -> Result<(), Violation> {
        if self.binds_out.remove(&request).is_some() {
            self.events
                .push_back(Event::BindAnswered { request, result });
            return Ok(());
        }
        if let Some(i) = self.binds_expired.iter().position(|&r| r == request) {
            // An answer after we gave up: ignored.
            self.binds_expired.remove(i);
            return Ok(());
        }
        Err(Violation(format!("{name} for unknown request {request}")))
    }
}
