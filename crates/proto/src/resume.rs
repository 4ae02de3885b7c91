//! Attaching a carrier to a session: a new one, or one that lost its carrier.
//!
//! Runs right after the hello when both sides offer
//! `handshake::FEATURE_RESUME`, and after the
//! carrier's own authentication (TLS key, token). Fixed-size messages:
//!
//! ```text
//! client → server  ATTACH   (73 bytes)
//!   "LHR2" | u8 kind (0 new, 1 resume, 2 lane) | 16 B session id
//!   | u64 attempt | u64 bytes received (lane: lane number) | 32 B proof
//!   | u32 replay limit
//!   (new: the lanes wanted in the session-id byte 0; 0 or 1: not striped;
//!   the client's X25519 key share in bytes 6..38)
//! server → client  ATTACHED (65 bytes)
//!   "LHR2" | u8 status (0 new, 1 resumed, 2–4 refused, 5 lane joined)
//!   | 16 B session id | 32 B the server's X25519 key share (new only)
//!   | u64 bytes received (new: lanes granted in its first byte)
//!   | u32 replay limit
//!   (new, with `handshake::FEATURE_INSTANCE` on both sides: then
//!   u8 length | the server's instance name, 0..=63 bytes; see [`instance`])
//! ```
//!
//! A striped session (`stripe`) starts like any other, with the
//! lanes wanted; each further lane joins with kind 2 and a proof made the
//! same way under another label, so a lane proof never passes for a
//! resume.
//!
//! A new session gets a random id (the server makes it) and a secret that
//! never travels: both sides derive it from an X25519 exchange of
//! ephemeral key shares carried in ATTACH and ATTACHED
//! ([`session_secret`]), so someone who only watched the carrier (a plain
//! `tcp://` one, say) cannot resume the session. To resume, the client
//! proves it holds the secret without sending it:
//! `proof = SHA-256(secret ‖ "longhaul resume" ‖ id ‖ attempt ‖ received ‖
//! binding)`, all fixed-length, with `attempt` larger than any accepted
//! before, so a proof seen once cannot be used again, and `binding` the
//! new carrier's TLS exporter value (zeros without TLS), so a proof made
//! on one carrier is worthless on any other (it cannot be relayed). Both
//! sides then send again what the other has not received
//! (`link::Replay::rewind`).

use sha2::{Digest, Sha256};

pub const MAGIC: &[u8; 4] = b"LHR2";
pub const ATTACH_LEN: usize = 73;
pub const ATTACHED_LEN: usize = 65;

/// A session's name on the server: 128 random bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId(pub [u8; 16]);

impl std::fmt::Display for SessionId {
    /// The first 8 bytes in hex: enough to tell sessions apart in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// What proves a resume comes from the client that started the session.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub [u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// The client's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attach {
    New {
        replay_limit: u32,
        /// Lanes the client wants (0 or 1: one carrier).
        lanes: u8,
        /// The client's X25519 public key share.
        share: [u8; 32],
    },
    /// Another lane for a striped session.
    Lane {
        id: SessionId,
        attempt: u64,
        lane: u8,
        proof: [u8; 32],
    },
    Resume {
        id: SessionId,
        attempt: u64,
        received: u64,
        proof: [u8; 32],
        replay_limit: u32,
    },
}

/// Why a resume was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No such session (never was, expired, or the server restarted).
    Unknown,
    /// Wrong proof, a different client identity, or an attempt number
    /// already used.
    Denied,
    /// The client's offset does not fit what the server sent.
    BadOffset,
    /// No session slot is free (`--max-sessions`): a new session is
    /// refused before anything it sent is acted on.
    Busy,
    /// The striped session has every lane it was granted (the server has
    /// not yet seen a lost one go).
    LanesFull,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Unknown => "no such session on the server (expired, or the server restarted)",
            Refusal::Denied => "the server did not accept the proof of the session",
            Refusal::BadOffset => "the offsets of the two sides do not fit",
            Refusal::Busy => "the server has no session slot free (its --max-sessions is reached)",
            Refusal::LanesFull => {
                "the server still counts every lane it granted the session (a lost one not yet seen gone)"
            }
        }
    }
}

/// The server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    New {
        id: SessionId,
        /// The server's X25519 public key share.
        share: [u8; 32],
        replay_limit: u32,
        /// Lanes granted (0 or 1: one carrier).
        lanes: u8,
    },
    /// The lane was added.
    Joined,
    Resumed {
        received: u64,
        replay_limit: u32,
    },
    Refused(Refusal),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    #[error("peer sent something other than a session attach message")]
    BadMagic,
    #[error("unknown attach kind {0}")]
    BadKind(u8),
}

/// What ties a proof to one carrier: its TLS exporter value (see
/// `longhaul_carrier::tls::binding`), or zeros for a carrier without TLS.
pub type Binding = [u8; 32];

/// The session secret both sides derive from the X25519 exchange
/// (`shared`: the Diffie-Hellman output).
pub fn session_secret(
    shared: &[u8],
    id: &SessionId,
    client_share: &[u8; 32],
    server_share: &[u8; 32],
) -> Secret {
    let mut h = Sha256::new();
    h.update(b"longhaul session secret");
    h.update(shared);
    h.update(id.0);
    h.update(client_share);
    h.update(server_share);
    Secret(h.finalize().into())
}

/// The proof of `secret` for one resume attempt on a carrier.
pub fn proof(
    secret: &Secret,
    id: &SessionId,
    attempt: u64,
    received: u64,
    binding: &Binding,
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(secret.0);
    h.update(b"longhaul resume");
    h.update(id.0);
    h.update(attempt.to_be_bytes());
    h.update(received.to_be_bytes());
    h.update(binding);
    h.finalize().into()
}

/// The proof of `secret` for one lane joining a striped session.
pub fn lane_proof(
    secret: &Secret,
    id: &SessionId,
    attempt: u64,
    lane: u8,
    binding: &Binding,
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(secret.0);
    h.update(b"longhaul lane");
    h.update(id.0);
    h.update(attempt.to_be_bytes());
    h.update([lane]);
    h.update(binding);
    h.finalize().into()
}

/// Compares proofs in constant time.
pub fn proof_matches(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(x)
}

impl Attach {
    pub fn encode(&self) -> [u8; ATTACH_LEN] {
        let mut b = [0u8; ATTACH_LEN];
        b[..4].copy_from_slice(MAGIC);
        match self {
            Attach::New {
                replay_limit,
                lanes,
                share,
            } => {
                b[5] = *lanes;
                b[6..38].copy_from_slice(share);
                b[69..73].copy_from_slice(&replay_limit.to_be_bytes());
            }
            Attach::Lane {
                id,
                attempt,
                lane,
                proof,
            } => {
                b[4] = 2;
                b[5..21].copy_from_slice(&id.0);
                b[21..29].copy_from_slice(&attempt.to_be_bytes());
                b[36] = *lane;
                b[37..69].copy_from_slice(proof);
            }
            Attach::Resume {
                id,
                attempt,
                received,
                proof,
                replay_limit,
            } => {
                b[4] = 1;
                b[5..21].copy_from_slice(&id.0);
                b[21..29].copy_from_slice(&attempt.to_be_bytes());
                b[29..37].copy_from_slice(&received.to_be_bytes());
                b[37..69].copy_from_slice(proof);
                b[69..73].copy_from_slice(&replay_limit.to_be_bytes());
            }
        }
        b
    }

    pub fn decode(b: &[u8; ATTACH_LEN]) -> Result<Attach, ResumeError> {
        if &b[..4] != MAGIC {
            return Err(ResumeError::BadMagic);
        }
        let replay_limit = u32_at(b, 69);
        match b[4] {
            0 => {
                let mut share = [0u8; 32];
                share.copy_from_slice(&b[6..38]);
                Ok(Attach::New {
                    replay_limit,
                    lanes: b[5],
                    share,
                })
            }
            2 => {
                let mut id = [0u8; 16];
                id.copy_from_slice(&b[5..21]);
                let mut proof = [0u8; 32];
                proof.copy_from_slice(&b[37..69]);
                Ok(Attach::Lane {
                    id: SessionId(id),
                    attempt: u64_at(b, 21),
                    lane: b[36],
                    proof,
                })
            }
            1 => {
                let mut id = [0u8; 16];
                id.copy_from_slice(&b[5..21]);
                let mut proof = [0u8; 32];
                proof.copy_from_slice(&b[37..69]);
                Ok(Attach::Resume {
                    id: SessionId(id),
                    attempt: u64_at(b, 21),
                    received: u64_at(b, 29),
                    proof,
                    replay_limit,
                })
            }
            k => Err(ResumeError::BadKind(k)),
        }
    }
}

impl Attached {
    pub fn encode(&self) -> [u8; ATTACHED_LEN] {
        let mut b = [0u8; ATTACHED_LEN];
        b[..4].copy_from_slice(MAGIC);
        match self {
            Attached::New {
                id,
                share,
                replay_limit,
                lanes,
            } => {
                b[5..21].copy_from_slice(&id.0);
                b[21..53].copy_from_slice(share);
                b[53] = *lanes;
                b[61..65].copy_from_slice(&replay_limit.to_be_bytes());
            }
            Attached::Joined => b[4] = 5,
            Attached::Resumed {
                received,
                replay_limit,
            } => {
                b[4] = 1;
                b[53..61].copy_from_slice(&received.to_be_bytes());
                b[61..65].copy_from_slice(&replay_limit.to_be_bytes());
            }
            Attached::Refused(r) => {
                b[4] = match r {
                    Refusal::Unknown => 2,
                    Refusal::Denied => 3,
                    Refusal::BadOffset => 4,
                    Refusal::Busy => 6,
                    Refusal::LanesFull => 7,
                };
            }
        }
        b
    }

    pub fn decode(b: &[u8; ATTACHED_LEN]) -> Result<Attached, ResumeError> {
        if &b[..4] != MAGIC {
            return Err(ResumeError::BadMagic);
        }
        let replay_limit = u32_at(b, 61);
        Ok(match b[4] {
            0 => {
                let mut id = [0u8; 16];
                id.copy_from_slice(&b[5..21]);
                let mut share = [0u8; 32];
                share.copy_from_slice(&b[21..53]);
                Attached::New {
                    id: SessionId(id),
                    share,
                    replay_limit,
                    lanes: b[53],
                }
            }
            5 => Attached::Joined,
            1 => Attached::Resumed {
                received: u64_at(b, 53),
                replay_limit,
            },
            2 => Attached::Refused(Refusal::Unknown),
            3 => Attached::Refused(Refusal::Denied),
            4 => Attached::Refused(Refusal::BadOffset),
            6 => Attached::Refused(Refusal::Busy),
            7 => Attached::Refused(Refusal::LanesFull),
            k => return Err(ResumeError::BadKind(k)),
        })
    }
}

/// A server's instance name: what its clients' later carriers of a
/// session (resumes, lanes) carry in the TLS server name and a WebSocket
/// header, for a load balancer to send them to the server that holds it.
pub mod instance {
    /// Longest name (a DNS label's limit).
    pub const MAX_LEN: usize = 63;

    /// Whether `name` can be one: 1 to 63 ASCII letters, digits, `-` and
    /// `.`, each dot-separated part starting and ending with a letter or
    /// digit, and the last one not a number (decimal, or hex after `0x`:
    /// a TLS server name must not look like an IPv4 address, and rustls
    /// refuses those).
    pub fn valid(name: &str) -> bool {
        let number = |l: &str| {
            let hex = l
                .strip_prefix("0x")
                .or_else(|| l.strip_prefix("0X"))
                .is_some_and(|h| h.bytes().all(|c| c.is_ascii_hexdigit()));
            hex || l.bytes().all(|c| c.is_ascii_digit())
        };
        let label_ok = |l: &str| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
        };
        name.len() <= MAX_LEN
            && name.split('.').all(label_ok)
            && name.rsplit('.').next().is_some_and(|l| !number(l))
    }

    /// The trailer after a new session's ATTACHED: length, then the name
    /// (empty: the server has none).
    pub fn encode(name: Option<&str>) -> Vec<u8> {
        let name = name.filter(|n| valid(n)).unwrap_or("");
        let mut v = Vec::with_capacity(1 + name.len());
        v.push(name.len() as u8);
        v.extend_from_slice(name.as_bytes());
        v
    }

    /// A trailer's name, once its `len` bytes are read (`None`: empty, or
    /// not a valid name — ignored, as if the server had none).
    pub fn decode(bytes: &[u8]) -> Option<String> {
        let s = std::str::from_utf8(bytes).ok()?;
        valid(s).then(|| s.to_owned())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn names() {
            for ok in [
                "s1",
                "lh-a.example",
                "edge7",
                "a",
                "3f2a1b9c0d4e",
                "0xg1",
                "10.0.0.x",
            ] {
                assert!(valid(ok), "{ok}");
            }
            let long = "a".repeat(64);
            for bad in [
                "", "10.0.0.1", "-a", "a-", "a..b", "a_b", "é", " a", &long, "edge.1", "0xab",
                "a.-b", "a.", "123", "0X1F",
            ] {
                assert!(!valid(bad), "{bad}");
            }
            assert_eq!(encode(Some("s1")), b"\x02s1");
            assert_eq!(encode(Some("bad name")), b"\x00");
            assert_eq!(encode(None), b"\x00");
            assert_eq!(decode(b"s1").as_deref(), Some("s1"));
            assert_eq!(decode(b""), None);
            assert_eq!(decode(b"\xff"), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let id = SessionId([9; 16]);
        let secret = Secret([4; 32]);
        let p = proof(&secret, &id, 3, 77, &[0; 32]);
        for a in [
            Attach::New {
                replay_limit: 5,
                lanes: 4,
                share: [6; 32],
            },
            Attach::Lane {
                id,
                attempt: 9,
                lane: 3,
                proof: lane_proof(&secret, &id, 9, 3, &[1; 32]),
            },
            Attach::Resume {
                id,
                attempt: 3,
                received: 77,
                proof: p,
                replay_limit: 1 << 25,
            },
        ] {
            assert_eq!(Attach::decode(&a.encode()), Ok(a));
        }
        for a in [
            Attached::New {
                id,
                share: [8; 32],
                replay_limit: 9,
                lanes: 2,
            },
            Attached::Joined,
            Attached::Resumed {
                received: u64::MAX,
                replay_limit: 1,
            },
            Attached::Refused(Refusal::Unknown),
            Attached::Refused(Refusal::Denied),
            Attached::Refused(Refusal::Busy),
            Attached::Refused(Refusal::LanesFull),
            Attached::Refused(Refusal::BadOffset),
        ] {
            assert_eq!(Attached::decode(&a.encode()), Ok(a));
        }
        let mut bad = Attach::New {
            replay_limit: 1,
            lanes: 0,
            share: [0; 32],
        }
        .encode();
        bad[4] = 7;
        assert_eq!(Attach::decode(&bad), Err(ResumeError::BadKind(7)));
        bad[0] = b'X';
        assert_eq!(Attach::decode(&bad), Err(ResumeError::BadMagic));
    }

    proptest::proptest! {
        /// Whatever a peer sends where an attach message belongs decodes
        /// to an error or to a message that encodes back the same.
        #[test]
        fn any_bytes_decode_without_panic(
            a in proptest::collection::vec(proptest::prelude::any::<u8>(), ATTACH_LEN),
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), ATTACHED_LEN),
            magic in proptest::prelude::any::<bool>(),
        ) {
            let mut a: [u8; ATTACH_LEN] = a.try_into().unwrap();
            let mut b: [u8; ATTACHED_LEN] = b.try_into().unwrap();
            if magic {
                a[..4].copy_from_slice(MAGIC);
                b[..4].copy_from_slice(MAGIC);
            }
            if let Ok(m) = Attach::decode(&a) {
                proptest::prop_assert_eq!(Attach::decode(&m.encode()), Ok(m));
            }
            if let Ok(m) = Attached::decode(&b) {
                proptest::prop_assert_eq!(Attached::decode(&m.encode()), Ok(m));
            }
        }
    }

    #[test]
    fn a_proof_is_bound_to_secret_id_attempt_offset_and_carrier() {
        let id = SessionId([1; 16]);
        let s = Secret([2; 32]);
        let b = [5u8; 32];
        let p = proof(&s, &id, 1, 100, &b);
        assert!(proof_matches(&p, &proof(&s, &id, 1, 100, &b)));
        assert!(!proof_matches(
            &p,
            &proof(&Secret([3; 32]), &id, 1, 100, &b)
        ));
        assert!(!proof_matches(
            &p,
            &proof(&s, &SessionId([0; 16]), 1, 100, &b)
        ));
        assert!(!proof_matches(&p, &proof(&s, &id, 2, 100, &b)));
        assert!(!proof_matches(&p, &proof(&s, &id, 1, 101, &b)));
        // Made on another carrier: worthless on this one.
        assert!(!proof_matches(&p, &proof(&s, &id, 1, 100, &[6; 32])));
        // A lane's proof is not a resume's.
        assert!(!proof_matches(
            &lane_proof(&s, &id, 1, 0, &b),
            &proof(&s, &id, 1, 0, &b)
        ));
        // The secret depends on every part of the exchange.
        let base = session_secret(&[1; 32], &id, &[2; 32], &[3; 32]);
        assert_ne!(base, session_secret(&[9; 32], &id, &[2; 32], &[3; 32]));
        assert_ne!(base, session_secret(&[1; 32], &id, &[9; 32], &[3; 32]));
    }
}
