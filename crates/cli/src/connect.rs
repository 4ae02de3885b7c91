//! A client's connection settings from its options (`client`, `cp`).

use longhaul_carrier::CarrierUrl;
use longhaul_forward::ClientConfig;

use crate::args::{self, ConnectArgs, ServerUrl, SessionArgs};

pub(crate) fn client_config(
    server: &ServerUrl,
    a: &ConnectArgs,
    session: &SessionArgs,
    jmux: bool,
) -> anyhow::Result<ClientConfig> {
    let stripes = match (a.stripes, server.stripes) {
        (Some(x), Some(y)) if x != y => {
            anyhow::bail!("--stripes {x} and ?stripes={y} disagree: give the number of lanes once")
        }
        (x, y) => x.or(y).unwrap_or(1),
    };
    if stripes > 1 && (jmux || matches!(server.url, CarrierUrl::Cmd { .. } | CarrierUrl::Dir(_))) {
        anyhow::bail!("striping needs a network carrier (tls://, tcp://, ws://, wss://) in native mode: drop --stripes or ?stripes");
    }
    let mut cfg = ClientConfig::new(server.url.clone());
    cfg.session = session.config(jmux, std::time::Duration::ZERO);
    cfg.congestion = session.congestion.clone();
    cfg.session.stripes = stripes;
    cfg.via = server.via.clone();
    let key = match &a.key {
        Some(k) => Some(k.clone()),
        None => args::config_path("key").filter(|p| p.exists()),
    };
    if let Some(k) = key {
        let id = longhaul_carrier::Identity::load(&k)?;
        tracing::debug!("our key {} ({})", id.fingerprint, k.display());
        cfg.identity = Some(id);
        cfg.identity_file = Some(k);
    }
    cfg.pin = a.pin;
    cfg.known_hosts = a
        .known_hosts
        .clone()
        .or_else(|| args::config_path("known_hosts"))
        .map(longhaul_forward::known_hosts::KnownHosts::new);
    cfg.token = a.token.clone().filter(|t| !t.is_empty());
    cfg.insecure = a.insecure;
    cfg.trust_first_use = a.trust_first_use;
    Ok(cfg)
}
