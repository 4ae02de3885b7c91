//! Identities: an Ed25519 key pair in a PEM file, named by the SHA-256 of
//! its public key (ssh-style `SHA256:` + unpadded base64).
//!
//! TLS wants certificates, so each side wraps its key in a self-signed
//! certificate at start. Peers never check the certificate's names, dates or
//! self-signature, only that the TLS handshake was signed by the key inside
//! it and that the key's fingerprint is the one expected: trust is in keys,
//! as with ssh, not in a CA.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read key file {path}: {err}")]
    Read { path: PathBuf, err: std::io::Error },
    #[error("cannot write key file {path}: {err}")]
    Write { path: PathBuf, err: std::io::Error },
    #[error("{path} already exists; choose another --out or delete it first")]
    Exists { path: PathBuf },
    #[error("{path} is not a longhaul key (PEM PKCS#8 Ed25519 expected; make one with 'longhaul keygen'): {why}")]
    Parse { path: PathBuf, why: String },
    #[error("cannot make a key: {0}")]
    Generate(String),
}

/// A key's name: SHA-256 of its SubjectPublicKeyInfo.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub fn of_spki(spki_der: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(spki_der).into())
    }

    /// The fingerprint of the key inside a certificate, if it parses.
    pub fn of_cert(cert: &CertificateDer<'_>) -> Result<Fingerprint, rustls::Error> {
        let parsed = rustls::server::ParsedCertificate::try_from(cert)?;
        Ok(Fingerprint::of_spki(
            parsed.subject_public_key_info().as_ref(),
        ))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SHA256:{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(self.0)
        )
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Fingerprint {
    type Err = String;
    fn from_str(s: &str) -> Result<Fingerprint, String> {
        let bad = || {
            format!("'{s}' is not a key fingerprint (expected SHA256:<43 base64 characters>, as printed by 'longhaul keygen')")
        };
        let b64 = s.trim().strip_prefix("SHA256:").ok_or_else(bad)?;
        let b64 = b64.trim_end_matches('=');
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(b64)
            .map_err(|_| bad())?;
        let arr: [u8; 32] = bytes.try_into().map_err(|_| bad())?;
        Ok(Fingerprint(arr))
    }
}

/// A loaded key pair with its self-signed certificate.
#[derive(Clone)]
pub struct Identity {
    pub cert: CertificateDer<'static>,
    key_der: Vec<u8>,
    key_pem: String,
    pub fingerprint: Fingerprint,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the private key.
        write!(f, "Identity({})", self.fingerprint)
    }
}

impl Identity {
    /// A fresh Ed25519 identity (kept in memory only).
    pub fn generate() -> Result<Identity, KeyError> {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
            .map_err(|e| KeyError::Generate(e.to_string()))?;
        Identity::from_key_pair(&kp).map_err(KeyError::Generate)
    }

    /// Parses a PEM private key (as written by [`Identity::save`]).
    pub fn from_pem(pem: &str) -> Result<Identity, String> {
        let kp = rcgen::KeyPair::from_pem(pem).map_err(|e| e.to_string())?;
        if kp.algorithm() != &rcgen::PKCS_ED25519 {
            return Err("only Ed25519 keys are supported".into());
        }
        Identity::from_key_pair(&kp)
    }

    fn from_key_pair(kp: &rcgen::KeyPair) -> Result<Identity, String> {
        let params = rcgen::CertificateParams::new(vec!["longhaul".to_string()])
            .map_err(|e| e.to_string())?;
        let cert = params.self_signed(kp).map_err(|e| e.to_string())?;
        let cert = cert.der().clone();
        let fingerprint = Fingerprint::of_cert(&cert).map_err(|e| e.to_string())?;
        Ok(Identity {
            cert,
            key_der: kp.serialize_der(),
            key_pem: kp.serialize_pem(),
            fingerprint,
        })
    }

    pub fn load(path: &Path) -> Result<Identity, KeyError> {
        let pem = std::fs::read_to_string(path).map_err(|err| KeyError::Read {
            path: path.into(),
            err,
        })?;
        Identity::from_pem(&pem).map_err(|why| KeyError::Parse {
            path: path.into(),
            why,
        })
    }

    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// Writes the private key (mode 0600, or on Windows an access list for
    /// the user, SYSTEM and Administrators; never over an existing file) and
    /// `PATH.pub` with the fingerprint, for pasting into authorized keys.
    pub fn save(&self, path: &Path) -> Result<(), KeyError> {
        use std::io::Write;
        let werr = |err| KeyError::Write {
            path: path.into(),
            err,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(werr)?;
        }
        let mut f = crate::sys::private::create_new(path).map_err(|err| {
            if err.kind() == std::io::ErrorKind::AlreadyExists {
                KeyError::Exists { path: path.into() }
            } else {
                werr(err)
            }
        })?;
        f.write_all(self.key_pem.as_bytes()).map_err(werr)?;
        let mut pubpath = path.as_os_str().to_owned();
        pubpath.push(".pub");
        std::fs::write(&pubpath, format!("{}\n", self.fingerprint)).map_err(|err| {
            KeyError::Write {
                path: pubpath.into(),
                err,
            }
        })?;
        Ok(())
    }
}

/// Compares two secrets in time that depends only on their lengths' hash,
/// not on where they differ.
pub fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    let (ha, hb) = (Sha256::digest(a), Sha256::digest(b));
    ha.iter()
        .zip(hb.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_round_trips_and_is_stable_across_loads() {
        let id = Identity::generate().unwrap();
        let text = id.fingerprint.to_string();
        assert!(
            text.starts_with("SHA256:") && text.len() == 7 + 43,
            "{text}"
        );
        assert_eq!(text.parse::<Fingerprint>().unwrap(), id.fingerprint);
        // The certificate is made afresh on each load; the name must not change.
        let again = Identity::from_pem(&id.key_pem).unwrap();
        assert_eq!(again.fingerprint, id.fingerprint);
        assert!("SHA256:abc".parse::<Fingerprint>().is_err());
        assert!("MD5:xyz".parse::<Fingerprint>().is_err());
    }

    #[test]
    fn save_refuses_to_overwrite_and_is_private() {
        let dir = std::env::temp_dir().join(format!("lh-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("k");
        let id = Identity::generate().unwrap();
        id.save(&path).unwrap();
        // Windows: its access list is checked in `sys::windows_access`.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0);
        }
        assert!(matches!(id.save(&path), Err(KeyError::Exists { .. })));
        let loaded = Identity::load(&path).unwrap();
        assert_eq!(loaded.fingerprint, id.fingerprint);
        let pubtext = std::fs::read_to_string(dir.join("k.pub")).unwrap();
        assert_eq!(pubtext.trim(), id.fingerprint.to_string());
        std::fs::write(dir.join("bad"), "not a key").unwrap();
        assert!(matches!(
            Identity::load(&dir.join("bad")),
            Err(KeyError::Parse { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn secrets_compare() {
        assert!(secrets_equal(b"abc", b"abc"));
        assert!(!secrets_equal(b"abc", b"abd"));
        assert!(!secrets_equal(b"abc", b"abcd"));
    }
}
