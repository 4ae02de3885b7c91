//! TLS 1.3 with pinned keys (rustls, ring).
//!
//! The client checks that the server signed the handshake with the key it
//! expects (a `--pin`, or the one remembered in known-hosts); the server
//! accepts any client key that proves possession and decides afterwards,
//! from its fingerprint, what that key may do. No CA, no names, no dates.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls13_signature, CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::cushion::Cushion;
use crate::keys::{Fingerprint, Identity};

pub use tokio_rustls::client::TlsStream as ClientTls;
pub use tokio_rustls::server::TlsStream as ServerTls;

/// ring's suites, AES-128-GCM first: with AES-NI it costs about 30% less
/// CPU per byte than AES-256-GCM (10 rounds against 14), and the carrier's
/// throughput on fast paths is bounded by that CPU. ChaCha20 stays for
/// peers without AES hardware.
fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites = vec![
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

fn tls13_only() -> &'static [&'static rustls::SupportedProtocolVersion] {
    TLS13_ONLY
}

/// The handshake-signature checks both verifiers share: TLS 1.3 with the
/// key inside the peer's certificate, never TLS 1.2 (it is not offered).
#[derive(Debug, Clone, Copy)]
struct Signatures(WebPkiSupportedAlgorithms);

impl Signatures {
    fn new() -> Signatures {
        Signatures(provider().signature_verification_algorithms)
    }
    fn tls12() -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not supported".into()))
    }
    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0)
    }
    fn schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// Verifies the server's key against a pin, and remembers the key it saw
/// (for trust on first use).
#[derive(Debug)]
pub struct PinVerifier {
    expected: Option<Fingerprint>,
    seen: Mutex<Option<Fingerprint>>,
    sigs: Signatures,
}

impl PinVerifier {
    /// `expected: None` accepts any key (the caller checks [`Self::seen`]
    /// against known-hosts before sending anything).
    pub fn new(expected: Option<Fingerprint>) -> Arc<PinVerifier> {
        Arc::new(PinVerifier {
            expected,
            seen: Mutex::new(None),
            sigs: Signatures::new(),
        })
    }

    /// The server key presented in the last handshake.
    pub fn seen(&self) -> Option<Fingerprint> {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let fp = Fingerprint::of_cert(end_entity)?;
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(fp);
        match self.expected {
            Some(want) if want != fp => Err(rustls::Error::General(format!(
                "server key {fp} does not match the pinned key {want}"
            ))),
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Signatures::tls12()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.sigs.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.sigs.schemes()
    }
}

/// Accepts any client key that signs the handshake; authorization by
/// fingerprint happens after the handshake. Client keys are optional (a
/// token may authenticate instead).
#[derive(Debug)]
struct AnyClientKey {
    sigs: Signatures,
}

impl ClientCertVerifier for AnyClientKey {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Reject what does not even parse, so the fingerprint exists later.
        Fingerprint::of_cert(end_entity)?;
        Ok(ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Signatures::tls12()
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.sigs.tls13(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.sigs.schemes()
    }
}

/// Server side: our identity, any client key.
pub fn server_config(id: &Identity) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let p = provider();
    let mut cfg = rustls::ServerConfig::builder_with_provider(p.clone())
        .with_protocol_versions(tls13_only())?
        .with_client_cert_verifier(Arc::new(AnyClientKey {
            sigs: Signatures(p.signature_verification_algorithms),
        }))
        .with_single_cert(vec![id.cert.clone()], id.private_key())?;
    // Resumption tickets let a client's next carriers — the lanes of a
    // striped session, a redial after a drop — skip the certificate and
    // signature work (still a fresh ECDHE). Stateless: sealed with a key
    // that lives in this process only, so they cost the server no memory;
    // the client's key is carried inside them, so the identity a resumed
    // carrier shows is the one that was verified.
    cfg.send_tls13_tickets = TICKETS;
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    cfg.ticketer = rustls::crypto::ring::Ticketer::new()?;
    Ok(Arc::new(cfg))
}

/// Server handshakes that resumed an earlier session, in this process.
static RESUMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many server handshakes in this process resumed a session (a
/// client's second and later carriers).
pub fn resumed_handshakes() -> u64 {
    RESUMED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Tickets a server hands out per handshake: enough for a client to add
/// the lanes of a striped session at once.
const TICKETS: usize = 8;

/// What a client keeps across the carriers it dials to one server key,
/// so that later carriers (the lanes of a striped session, redials)
/// resume the first one's TLS session: rustls resumes only with the very
/// same verifier and client-key objects, so the config is made once.
#[derive(Debug, Clone, Default)]
pub struct SessionCache(Arc<Mutex<Option<CachedConfig>>>);

type CachedConfig = (Fingerprint, Arc<rustls::ClientConfig>, Arc<PinVerifier>);

impl SessionCache {
    /// The config and verifier for a server whose key must be `expected`,
    /// made once and resuming. Without an expected key (trust on first
    /// use), a fresh one each time, without resumption: a session resumed
    /// from an unchecked first contact would skip the check that comes
    /// next.
    pub fn config(
        &self,
        id: Option<&Identity>,
        expected: Option<Fingerprint>,
    ) -> Result<(Arc<rustls::ClientConfig>, Arc<PinVerifier>), rustls::Error> {
        let Some(fp) = expected else {
            let v = PinVerifier::new(None);
            return Ok((client_config(id, v.clone())?, v));
        };
        let mut cached = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((have, cfg, v)) = cached.as_ref() {
            if *have == fp {
                return Ok((cfg.clone(), v.clone()));
            }
        }
        let v = PinVerifier::new(Some(fp));
        let mut cfg = Arc::unwrap_or_clone(client_config(id, v.clone())?);
        // Tickets are kept per server name, as a server takes one only
        // under the name it was issued for: a session's later carriers,
        // which name its server's instance, resume one another's.
        cfg.resumption = rustls::client::Resumption::in_memory_sessions(4 * TICKETS);
        let cfg = Arc::new(cfg);
        *cached = Some((fp, cfg.clone(), v.clone()));
        Ok((cfg, v))
    }
}

/// Client side: the server must match `verifier`; we present `id` if given.
pub fn client_config(
    id: Option<&Identity>,
    verifier: Arc<PinVerifier>,
) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(tls13_only())?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut cfg = match id {
        Some(id) => b.with_client_auth_cert(vec![id.cert.clone()], id.private_key())?,
        None => b.with_no_client_auth(),
    };
    cfg.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(cfg))
}

/// Encrypted bytes rustls may hold before it writes them out: one full
/// record. Kept small on purpose: bytes queued here are past the
/// scheduler, so an interactive frame waits behind all of them (1 MiB here
/// put 45 ms in front of every request at 220 Mbit/s; 64 KiB, rustls'
/// default, still 10 ms at p99 beside 10 bulk streams; docs/BENCHMARKS.md).
pub const TLS_SEND_BUFFER: usize = 64 * 1024;

/// Ciphertext is read under TLS through a buffer that exists only while
/// data streams in ([`Cushion`]).
pub type Buffered<S> = Cushion<S>;

/// The label of the TLS exporter value that binds a session's attach
/// proofs to one carrier (RFC 5705 / RFC 8446 §7.5).
pub(crate) const BINDING_LABEL: &[u8] = b"EXPORTER-longhaul-attach";

/// A TLS connection's exporter value: the same at both ends of one
/// connection, different for every other, and known to no one else.
pub fn binding<D>(conn: &rustls::ConnectionCommon<D>) -> Option<[u8; 32]> {
    conn.export_keying_material([0u8; 32], BINDING_LABEL, None)
        .ok()
}

/// Runs the client handshake over any byte stream.
pub async fn connect<S>(
    io: S,
    cfg: Arc<rustls::ClientConfig>,
) -> std::io::Result<ClientTls<Buffered<S>>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    connect_named(io, cfg, None).await
}

/// The server name sent when there is no instance to name.
const DEFAULT_NAME: &str = "longhaul";

/// Runs the client handshake, sending `instance` as the server name (for
/// a load balancer to route on; `None`: "longhaul").
pub async fn connect_named<S>(
    io: S,
    cfg: Arc<rustls::ClientConfig>,
    instance: Option<&str>,
) -> std::io::Result<ClientTls<Buffered<S>>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // Names are not checked (keys are pinned); any valid name will do.
    let name = instance
        .and_then(|n| ServerName::try_from(n.to_owned()).ok())
        .unwrap_or_else(|| ServerName::try_from(DEFAULT_NAME).expect("static name is valid"));
    let io = Cushion::new(io);
    let mut tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, io)
        .await?;
    tls.get_mut().1.set_buffer_limit(Some(TLS_SEND_BUFFER));
    Ok(tls)
}

/// Runs the server handshake; returns the stream and the client's key, if
/// it presented one.
pub async fn accept<S>(
    io: S,
    cfg: Arc<rustls::ServerConfig>,
) -> std::io::Result<(ServerTls<Buffered<S>>, Option<Fingerprint>)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let io = Cushion::new(io);
    let mut tls = tokio_rustls::TlsAcceptor::from(cfg).accept(io).await?;
    tls.get_mut().1.set_buffer_limit(Some(TLS_SEND_BUFFER));
    if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
        RESUMED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let fp = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| Fingerprint::of_cert(c).ok());
    Ok((tls, fp))
}
