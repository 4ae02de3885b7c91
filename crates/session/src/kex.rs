//! The session secret's key exchange: each side's ephemeral X25519 share
//! travels in the attach messages, the secret itself never does (so a
//! carrier without TLS shows an observer nothing that resumes the
//! session); and what binds a proof to the carrier it is sent on.

use longhaul_carrier::Carrier;
use longhaul_proto::resume::{session_secret, Binding, Secret, SessionId};
use ring::agreement::{agree_ephemeral, EphemeralPrivateKey, UnparsedPublicKey, X25519};

use crate::config::SessionError;

/// One side's ephemeral key, until the peer's share arrives.
pub(crate) struct Share {
    key: EphemeralPrivateKey,
    public: [u8; 32],
}

fn failed() -> SessionError {
    SessionError::Closed("the session's key exchange failed".into())
}

impl Share {
    pub fn new() -> Result<Share, SessionError> {
        let key = EphemeralPrivateKey::generate(&X25519, &ring::rand::SystemRandom::new())
            .map_err(|_| failed())?;
        let public = key
            .compute_public_key()
            .map_err(|_| failed())?
            .as_ref()
            .try_into()
            .map_err(|_| failed())?;
        Ok(Share { key, public })
    }

    pub fn public(&self) -> [u8; 32] {
        self.public
    }

    /// The session secret, from our key and the peer's share (ring refuses
    /// a share that gives an all-zero result).
    pub fn secret(
        self,
        peer: &[u8; 32],
        id: &SessionId,
        client: &[u8; 32],
        server: &[u8; 32],
    ) -> Result<Secret, SessionError> {
        agree_ephemeral(self.key, &UnparsedPublicKey::new(&X25519, peer), |shared| {
            session_secret(shared, id, client, server)
        })
        .map_err(|_| failed())
    }
}

/// What an attach proof made on `carrier` is bound to: its TLS exporter
/// value, or zeros where no TLS runs over it.
pub(crate) fn binding(carrier: &Carrier) -> Binding {
    carrier.binding.unwrap_or([0; 32])
}
