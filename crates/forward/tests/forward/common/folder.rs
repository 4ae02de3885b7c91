//! A longhaul server on a folder, for the folder carrier's tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use longhaul_carrier::{Fingerprint, Identity};
use longhaul_forward::rules::Rules;
use longhaul_forward::{ClientConfig, Server, ServerConfig};
use longhaul_session::SessionConfig;

use crate::common::fwd;
use crate::common::transfer::quick_session;

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

/// A fresh directory (on tmpfs when there is one), removed on drop.
pub struct Folder(pub PathBuf);

impl Folder {
    pub fn new(name: &str) -> Folder {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!("lh-fwd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Folder(d)
    }
    pub fn url(&self) -> String {
        format!("dir://{}", self.0.display())
    }
    pub fn bytes(&self) -> u64 {
        std::fs::read_dir(&self.0)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
    pub fn remove_carrier_files(&self) {
        for e in std::fs::read_dir(&self.0).unwrap().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn folder_client(url: &str, pin: Fingerprint, target: std::net::SocketAddr) -> ClientConfig {
    let mut cfg = ClientConfig::new(url.parse().unwrap());
    cfg.pin = Some(pin);
    cfg.token = Some("tok".into());
    cfg.local = vec![fwd("127.0.0.1", target.port())];
    cfg.session = quick_session();
    cfg
}
