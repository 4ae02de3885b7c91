//! Dialling a client's carrier, the server's key checked before anything
//! else is sent.

use anyhow::{anyhow, bail, Context};
use longhaul_carrier::{CarrierUrl, DialOptions, Transport};

use crate::known_hosts::Known;

use crate::client_config::ClientConfig;

/// A server that shows another key than the one expected: never waited
/// for, never passed over for another server.
#[derive(Debug)]
pub(crate) struct KeyMismatch(String);

impl std::fmt::Display for KeyMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KeyMismatch {}

/// Whether `e` is (or wraps) a [`KeyMismatch`].
pub(crate) fn is_key_mismatch(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<KeyMismatch>())
}

/// Dials the carrier and checks the server's key (pin or known-hosts)
/// before anything else is sent. `instance`: the server instance holding
/// the session this carrier joins (see `DialOptions::instance`).
pub(crate) async fn connect(
    config: &ClientConfig,
    bind: Option<std::net::IpAddr>,
    instance: Option<&str>,
) -> anyhow::Result<longhaul_carrier::Carrier> {
    let url = &config.server;
    let use_tls = match url {
        CarrierUrl::Cmd { .. } => false,
        // --insecure alone never takes TLS off a folder.
        CarrierUrl::Dir(d) if !d.tls && !config.insecure => bail!(
            "{url} is unencrypted: the token and all traffic would be written in clear into the folder; add --insecure if that is what you want, or drop ?tls=off"
        ),
        CarrierUrl::Dir(d) => d.tls,
        CarrierUrl::Net { transport, .. } => match transport {
            Transport::Tcp if !config.insecure => bail!(
                "{url} is unencrypted and unauthenticated; use tls:// (the default) or pass --insecure"
            ),
            Transport::Tcp => false,
            Transport::Ws { .. } => !config.insecure,
            Transport::Tls | Transport::Quic | Transport::Wss { .. } => true,
        },
    };
    let host = match url {
        CarrierUrl::Net { addr, .. } => addr.clone(),
        CarrierUrl::Cmd { .. } => String::new(),
        // Remembered in known_hosts under a form without whitespace or
        // options: one entry per folder.
        CarrierUrl::Dir(d) => d.identity(),
    };
    let mut opts = DialOptions {
        tls: None,
        congestion: config.congestion.clone(),
        bind,
        instance: instance.map(str::to_owned),
    };
    let mut known = Known::Unknown;
    let mut verifier = None;
    if use_tls {
        if config.pin.is_none() {
            if let Some(kh) = &config.known_hosts {
                known = kh.lookup(&host).map_err(|e| anyhow!(e))?;
            } else {
                tracing::warn!("no --pin and no known-hosts file: the server's key is not checked");
            }
        }
        if config.no_first_use && config.pin.is_none() && known == Known::Unknown {
            bail!(
                "no key known for the failover server {host}: connect to it once by hand (trusting its key then), or give --pin"
            );
        }
        if matches!(url, CarrierUrl::Dir(_))
            && config.pin.is_none()
            && known == Known::Unknown
            && !config.trust_first_use
        {
            bail!(
                "no key known for the folder {host}: give --pin SHA256:… (the server logs its key when it starts), or --trust-first-use to trust and remember whichever key answers first (anyone who can write the folder could)"
            );
        }
        let expected = config.pin.or(match known {
            Known::Key(fp, _) => Some(fp),
            Known::Unknown => None,
        });
        let (tls, v) = config
            .tls_sessions
            .config(config.identity.as_ref(), expected)
            .context("TLS setup failed")?;
        opts.tls = Some(tls);
        verifier = Some((v, expected));
    } else if !matches!(url, CarrierUrl::Cmd { .. }) {
        // Once per process: the demo and tests make many sessions.
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| tracing::warn!("{url}: carrier is NOT encrypted (--insecure)"));
    }
    let carrier = match longhaul_carrier::dial(url, &opts).await {
        Ok(c) => c,
        Err(e) => {
            if let Some((v, Some(want))) = &verifier {
                if let Some(seen) = v.seen().filter(|s| s != want) {
                    let why = match (&known, &config.known_hosts) {
                        (Known::Key(_, line), Some(kh)) => format!(
                            "REFUSED: the key of server {host} has CHANGED: it shows {seen}, but {} line {line} says {want}. \
                             Someone may be intercepting the connection. If the server's key was changed on purpose, delete that line.",
                            kh.path().display()
                        ),
                        _ => format!("REFUSED: server {host} shows key {seen}, not the pinned {want}"),
                    };
                    return Err(KeyMismatch(why).into());
                }
            }
            return Err(anyhow!(e)).with_context(|| format!("cannot connect to server {url}"));
        }
    };
    // Once per process at the default level (every carrier is checked).
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let say = !SAID.swap(true, std::sync::atomic::Ordering::Relaxed);
    match (&verifier, &known, &config.known_hosts) {
        (Some((_, Some(fp))), _, _) if config.pin.is_some() && say => {
            tracing::info!("server key {fp} verified (--pin)")
        }
        (Some((_, Some(fp))), Known::Key(_, line), Some(kh)) if say => tracing::info!(
            "server key {fp} verified ({} line {line})",
            kh.path().display()
        ),
        _ => {}
    }
    if let (Some((v, None)), Some(kh)) = (&verifier, &config.known_hosts) {
        if let Some(seen) = v.seen() {
            kh.remember(&host, seen).map_err(|e| anyhow!(e))?;
            // not peer text: host is the server the user named
            tracing::warn!(
                "first connection to {host}: trusting its key {seen} from now on (saved in {})",
                kh.path().display()
            );
        }
    }
    Ok(carrier)
}
