//! Native-mode hello.
//!
//! Both sides send one fixed-size HELLO before any frame:
//!
//! ```text
//! 8 bytes  magic "LONGHAUL"
//! u16      protocol version
//! u32      feature bits
//! u16      largest frame the sender accepts
//! u16      the sender's quiet keepalive in seconds (with FEATURE_QUIET_KEEPALIVE)
//! u16      reserved (zero)
//! ```
//!
//! The session then runs with the lower version, the intersection of the
//! feature bits and the smaller frame limit. `--jmux` mode skips this, so a
//! JMUX peer sees only JMUX frames.

pub const MAGIC: &[u8; 8] = b"LONGHAUL";
pub const VERSION: u16 = 1;
pub const HELLO_LEN: usize = 20;

/// PING/PONG extension messages.
pub const FEATURE_PING: u32 = 1 << 0;
/// Reverse forwards (BIND messages).
pub const FEATURE_BIND: u32 = 1 << 1;
/// The link layer (ACK frames) and the attach exchange of
/// `resume`: sessions that survive a dropped carrier. (Bit 2 was
/// its first version, whose secret travelled in the ATTACHED message and
/// whose proofs were not bound to the carrier: a peer that offers only
/// that one gets a session without resume.)
pub const FEATURE_RESUME: u32 = 1 << 3;
/// DRAIN messages: a server going away tells its clients to open their
/// next streams through a new session (a peer without it is not told).
pub const FEATURE_DRAIN: u32 = 1 << 4;
/// The server's instance name follows its answer to a new resumable
/// session (`resume::Instance`), for the client's later carriers of that
/// session to carry where a load balancer routes on it.
pub const FEATURE_INSTANCE: u32 = 1 << 5;
/// While no data moves, the sender PINGs only every so many seconds (the
/// hello's quiet keepalive field, at most [`MAX_QUIET_KEEPALIVE_SECS`]),
/// and lets its peer do the same: each side then allows the other that much
/// more silence. A peer without the bit gets PINGs at the usual pace.
pub const FEATURE_QUIET_KEEPALIVE: u32 = 1 << 6;
/// The longest quiet keepalive a peer may announce (a longer one is taken
/// as this): how much longer a silent peer is waited for at most.
pub const MAX_QUIET_KEEPALIVE_SECS: u16 = 120;
/// What every native session offers; [`FEATURE_RESUME`] is added by
/// sessions that can resume (not JMUX-like pipes such as `--stdio`).
pub const FEATURES: u32 = FEATURE_PING | FEATURE_BIND | FEATURE_DRAIN | FEATURE_INSTANCE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub features: u32,
    pub max_frame: u16,
    /// Seconds between our PINGs while no data moves (0: none announced).
    pub quiet_keepalive_secs: u16,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HelloError {
    #[error("peer is not a longhaul native peer (no LONGHAUL hello; is it a JMUX peer? then use --jmux)")]
    BadMagic,
    #[error("peer speaks protocol version {0}, this build speaks {VERSION}")]
    Version(u16),
    #[error("peer's frame limit {0} is below the minimum of 256")]
    TinyFrames(u16),
}

impl Hello {
    pub fn ours(max_frame: u16) -> Hello {
        Hello {
            version: VERSION,
            features: FEATURES,
            max_frame,
            quiet_keepalive_secs: 0,
        }
    }

    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..10].copy_from_slice(&self.version.to_be_bytes());
        b[10..14].copy_from_slice(&self.features.to_be_bytes());
        b[14..16].copy_from_slice(&self.max_frame.to_be_bytes());
        b[16..18].copy_from_slice(&self.quiet_keepalive_secs.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8; HELLO_LEN]) -> Result<Hello, HelloError> {
        if &b[..8] != MAGIC {
            return Err(HelloError::BadMagic);
        }
        let version = u16::from_be_bytes([b[8], b[9]]);
        if version == 0 {
            return Err(HelloError::Version(version));
        }
        let max_frame = u16::from_be_bytes([b[14], b[15]]);
        if max_frame < 256 {
            return Err(HelloError::TinyFrames(max_frame));
        }
        Ok(Hello {
            version,
            features: u32::from_be_bytes([b[10], b[11], b[12], b[13]]),
            max_frame,
            quiet_keepalive_secs: u16::from_be_bytes([b[16], b[17]]),
        })
    }

    /// What both ends can use.
    pub fn negotiate(&self, peer: &Hello) -> Hello {
        Hello {
            version: self.version.min(peer.version),
            features: self.features & peer.features,
            max_frame: self.max_frame.min(peer.max_frame),
            quiet_keepalive_secs: 0,
        }
    }

    /// How rarely the peer of this hello PINGs while no data moves, if
    /// both hellos (`self` ours) offered the quiet keepalive.
    pub fn peer_quiet_keepalive(&self, peer: &Hello) -> Option<std::time::Duration> {
        let both = self.features & peer.features & FEATURE_QUIET_KEEPALIVE != 0;
        let secs = peer.quiet_keepalive_secs.min(MAX_QUIET_KEEPALIVE_SECS);
        (both && secs > 0).then(|| std::time::Duration::from_secs(secs.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_negotiate() {
        let a = Hello::ours(65535);
        let b = Hello {
            version: 3,
            features: FEATURE_PING | 1 << 20,
            max_frame: 16384,
            quiet_keepalive_secs: 0,
        };
        assert_eq!(Hello::decode(&a.encode()), Ok(a));
        let n = a.negotiate(&b);
        assert_eq!(n.version, 1);
        assert_eq!(n.features, FEATURE_PING);
        assert_eq!(n.max_frame, 16384);
    }

    #[test]
    fn a_quiet_keepalive_needs_both_and_is_bounded() {
        let mut a = Hello::ours(65535);
        a.features |= FEATURE_QUIET_KEEPALIVE;
        a.quiet_keepalive_secs = 30;
        let mut b = a;
        assert_eq!(Hello::decode(&a.encode()), Ok(a));
        b.quiet_keepalive_secs = u16::MAX;
        let max = std::time::Duration::from_secs(MAX_QUIET_KEEPALIVE_SECS.into());
        assert_eq!(a.peer_quiet_keepalive(&b), Some(max));
        b.features &= !FEATURE_QUIET_KEEPALIVE;
        assert_eq!(a.peer_quiet_keepalive(&b), None);
        assert_eq!(b.peer_quiet_keepalive(&a), None);
    }

    #[test]
    fn refuses_strangers() {
        let mut b = Hello::ours(65535).encode();
        b[0] = b'X';
        assert_eq!(Hello::decode(&b), Err(HelloError::BadMagic));
        // A JMUX OPEN arriving where a hello is expected.
        let mut jmux = [0u8; HELLO_LEN];
        jmux[0] = 100;
        assert_eq!(Hello::decode(&jmux), Err(HelloError::BadMagic));
        let mut tiny = Hello::ours(65535).encode();
        tiny[14] = 0;
        tiny[15] = 10;
        assert_eq!(Hello::decode(&tiny), Err(HelloError::TinyFrames(10)));
    }
}
