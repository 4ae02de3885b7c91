//! What a server reads that SIGHUP reads again: rules, authorized keys and
//! the token (from the same command line and `--config` file).

use longhaul_forward::auth::{AuthorizedKeys, ServerAuth, MAX_TOKEN};
use longhaul_forward::policy::Policy;
use longhaul_forward::server::Reloader;

use crate::args::{Cli, Cmd, ServerArgs};

/// The reloadable part of a server's configuration.
pub(crate) fn policy(a: &ServerArgs) -> anyhow::Result<Policy> {
    let mut auth = ServerAuth::default();
    if let Some(f) = &a.authorized_keys {
        let keys = AuthorizedKeys::load(f).map_err(|e| anyhow::anyhow!(e))?;
        tracing::info!("{} authorized key(s) from {}", keys.len(), f.display());
        auth.authorized_keys = Some(keys);
    }
    auth.token = a.token.clone().filter(|t| !t.is_empty());
    if auth.token.as_ref().is_some_and(|t| t.len() > MAX_TOKEN) {
        anyhow::bail!("--token is longer than {MAX_TOKEN} bytes");
    }
    auth.insecure = a.insecure;
    Ok(Policy {
        auth,
        rules: a.rules(),
        bind_rules: a.bind_rules(),
        files_without_key: a.files.as_ref().and(a.files_for_token),
    })
}

/// On every SIGHUP: parse the command line and its `--config` file again
/// and put the new policy in force; a bad file keeps the old one.
pub(crate) async fn on_hangup(reloader: Reloader) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return tracing::warn!("cannot watch for SIGHUP: no reloads");
    };
    while hup.recv().await.is_some() {
        match reread() {
            Ok(p) => {
                let ended = reloader.reload(p);
                tracing::info!(
                    "reloaded rules, authorized keys and token ({ended} session(s) ended); other options need a restart"
                );
            }
            Err(e) => tracing::error!("reload failed, keeping the configuration in force: {e:#}"),
        }
    }
}

fn reread() -> anyhow::Result<Policy> {
    use clap::Parser;
    let argv =
        crate::config::expand(std::env::args_os().collect()).map_err(|e| anyhow::anyhow!(e))?;
    let cli = Cli::try_parse_from(argv).map_err(|e| {
        let text = e.render().to_string();
        anyhow::anyhow!(
            "{}",
            text.lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ")
        )
    })?;
    match cli.cmd {
        Cmd::Server(a) => policy(&a),
        _ => anyhow::bail!("not a server command line"),
    }
}
