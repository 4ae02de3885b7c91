//! Server and client arguments for a carrier kind, with throwaway keys, for
//! the demo and the bench matrix (which start longhaul as child processes).

use std::path::{Path, PathBuf};

use anyhow::Context;
use longhaul_carrier::Identity;

/// What a measurement runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CarrierKind {
    /// Plain TCP (`--insecure`): the multiplexer alone.
    Tcp,
    /// TLS 1.3 with a pinned server key and an authorized client key.
    Tls,
    /// QUIC with the same keys as `Tls`.
    Quic,
}

impl CarrierKind {
    pub fn parse(s: &str) -> Result<CarrierKind, String> {
        match s {
            "tcp" => Ok(CarrierKind::Tcp),
            "tls" => Ok(CarrierKind::Tls),
            "quic" => Ok(CarrierKind::Quic),
            _ => Err(format!("unknown carrier '{s}' (use tcp, tls or quic)")),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            CarrierKind::Tcp => "tcp",
            CarrierKind::Tls => "tls",
            CarrierKind::Quic => "quic",
        }
    }
}

/// Throwaway keys in a private directory, removed on drop.
pub struct Keys {
    dir: PathBuf,
    pub server_key: PathBuf,
    pub server_fp: String,
    pub client_key: PathBuf,
    pub authorized: PathBuf,
    pub client: Identity,
}

impl Keys {
    pub fn new(tag: &str) -> anyhow::Result<Keys> {
        let dir = std::env::temp_dir().join(format!("longhaul-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let server = Identity::generate()?;
        let client = Identity::generate()?;
        let server_key = dir.join("server.key");
        let client_key = dir.join("client.key");
        server.save(&server_key)?;
        client.save(&client_key)?;
        let authorized = dir.join("authorized_keys");
        std::fs::write(
            &authorized,
            format!("{} # {tag} client\n", client.fingerprint),
        )?;
        Ok(Keys {
            dir,
            server_key,
            server_fp: server.fingerprint.to_string(),
            client_key,
            authorized,
            client,
        })
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// `server` arguments listening on `addr` (IP:PORT).
pub fn server_args(kind: CarrierKind, addr: &str, keys: &Keys) -> Vec<String> {
    match kind {
        CarrierKind::Tcp => vec![
            "--listen".into(),
            format!("tcp://{addr}"),
            "--insecure".into(),
        ],
        CarrierKind::Tls | CarrierKind::Quic => vec![
            "--listen".into(),
            format!("{}://{addr}", kind.name()),
            "--key".into(),
            p(&keys.server_key),
            "--authorized-keys".into(),
            p(&keys.authorized),
        ],
    }
}

/// `client` arguments (the server URL first) for a server on `addr`.
pub fn client_args(kind: CarrierKind, addr: &str, keys: &Keys) -> Vec<String> {
    match kind {
        CarrierKind::Tcp => vec![format!("tcp://{addr}"), "--insecure".into()],
        CarrierKind::Tls | CarrierKind::Quic => vec![
            format!("{}://{addr}", kind.name()),
            "--key".into(),
            p(&keys.client_key),
            "--pin".into(),
            keys.server_fp.clone(),
        ],
    }
}
