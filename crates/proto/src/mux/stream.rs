//! One stream's lifecycle as explicit states.
//!
//! ```text
//!            OPEN sent                    OPEN_SUCCESS
//!  (local) ─────────────► Opening ───────────────────────┐
//!                            │ OPEN_FAILURE / expiry      ▼
//!                            ▼                   Open { up, down }
//!                          gone         our EOF: up Open → EofSent
//!                                       peer EOF: down Open → EofReceived
//!  (peer OPEN, accepted) ──────────►    written:  down EofReceived → EofDelivered
//!                                                 │
//!            both EOFs done, local abort ─► CLOSE sent ─► CloseSent ── peer CLOSE ─► gone
//!            peer CLOSE (from Open) ─► CLOSE sent back ─► gone
//! ```
//!
//! Each frame is valid only in the states that allow it ([`Phase::accepts`]);
//! anything else is a protocol violation (native mode) or, for a peer that
//! is known to send stray frames after CLOSE (JMUX), ignored.

/// Our direction of an open stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Up {
    Open,
    /// We sent EOF: no more DATA from us.
    EofSent,
}

/// The peer's direction of an open stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Down {
    Open,
    /// The peer sent EOF; data before it may still wait to be written.
    EofReceived,
    /// Everything up to the peer's EOF was written to the local socket.
    EofDelivered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// We sent OPEN; only OPEN_SUCCESS or OPEN_FAILURE may come. The
    /// deadline is when we stop waiting (caller's clock, ns).
    Opening {
        deadline: u64,
    },
    Open {
        up: Up,
        down: Down,
    },
    /// We sent CLOSE and wait for the peer's. Frames the peer sent before
    /// it saw ours (DATA, EOF, WINDOW_ADJUST) are dropped.
    CloseSent,
}

/// Frame kinds addressed to a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFrame {
    OpenSuccess,
    OpenFailure,
    Data,
    WindowAdjust,
    Eof,
    Close,
}

/// What a frame does in a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Handle it.
    Accept,
    /// Drop it silently (it crossed our CLOSE on the wire).
    Ignore,
    /// A protocol violation, with why.
    Violation(&'static str),
}

impl Phase {
    pub fn accepts(self, f: StreamFrame) -> Verdict {
        use StreamFrame::*;
        use Verdict::*;
        match (self, f) {
            (Phase::Opening { .. }, OpenSuccess | OpenFailure) => Accept,
            (Phase::Opening { .. }, _) => Violation("before it was open"),
            (Phase::Open { .. }, OpenSuccess) => Violation("duplicate OPEN_SUCCESS"),
            (Phase::Open { .. }, OpenFailure) => Violation("OPEN_FAILURE for an open stream"),
            (Phase::Open { down, .. }, Data) if down != Down::Open => Violation("DATA after EOF"),
            (Phase::Open { down, .. }, Eof) if down != Down::Open => Violation("duplicate EOF"),
            (Phase::Open { .. }, _) => Accept,
            (Phase::CloseSent, OpenSuccess | OpenFailure) => {
                Violation("OPEN answer for a closing stream")
            }
            (Phase::CloseSent, Close) => Accept,
            (Phase::CloseSent, _) => Ignore,
        }
    }

    pub fn is_opening(self) -> bool {
        matches!(self, Phase::Opening { .. })
    }

    /// Both directions are done: time to send CLOSE.
    pub fn finished(self) -> bool {
        matches!(
            self,
            Phase::Open {
                up: Up::EofSent,
                down: Down::EofDelivered
            }
        )
    }

    /// We may still send DATA.
    pub fn can_send(self) -> bool {
        matches!(self, Phase::Open { up: Up::Open, .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_but_an_answer_while_opening() {
        let p = Phase::Opening { deadline: 0 };
        for f in [
            StreamFrame::Data,
            StreamFrame::WindowAdjust,
            StreamFrame::Eof,
            StreamFrame::Close,
        ] {
            assert!(matches!(p.accepts(f), Verdict::Violation(_)), "{f:?}");
        }
        assert_eq!(p.accepts(StreamFrame::OpenSuccess), Verdict::Accept);
    }

    #[test]
    fn stray_frames_after_our_close_are_dropped() {
        let p = Phase::CloseSent;
        assert_eq!(p.accepts(StreamFrame::Data), Verdict::Ignore);
        assert_eq!(p.accepts(StreamFrame::Close), Verdict::Accept);
    }

    #[test]
    fn data_after_eof_is_a_violation() {
        let p = Phase::Open {
            up: Up::Open,
            down: Down::EofReceived,
        };
        assert!(matches!(
            p.accepts(StreamFrame::Data),
            Verdict::Violation(_)
        ));
        assert_eq!(p.accepts(StreamFrame::Close), Verdict::Accept);
    }
}
