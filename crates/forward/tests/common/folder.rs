//! A longhaul server on a folder, for the folder carrier's tests.

#![allow(dead_code)]

use longhaul_carrier::{Fingerprint, Identity};
use longhaul_forward::rules::Rules;
use longhaul_forward::{Server, ServerConfig};
use longhaul_session::SessionConfig;

/// A server on the folder `url` with a fresh key, letting token "tok" in.
pub async fn folder_server(url: &str, session: SessionConfig) -> Fingerprint {
    let id = Identity::generate().unwrap();
    let mut cfg = ServerConfig {
        folders: vec![url.parse().unwrap()],
        identity: Some(id.clone()),
        rules: Rules::allow_all(),
        session,
        ..ServerConfig::default()
    };
    cfg.auth.token = Some("tok".into());
    let s = Server::bind(cfg).await.unwrap();
    tokio::spawn(s.run());
    id.fingerprint
}
