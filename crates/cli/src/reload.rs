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

/// The options a reload cannot apply, as they are now (name, value).
pub(crate) fn fixed(a: &ServerArgs) -> Vec<(&'static str, String)> {
    let d = |v: &dyn std::fmt::Debug| format!("{v:?}");
    vec![
        ("listen", d(&a.listen)),
        ("stdio", d(&a.stdio)),
        ("key", d(&a.key)),
        ("jmux", d(&a.jmux)),
        ("max-sessions", d(&a.max_sessions)),
        ("instance", d(&a.instance)),
        ("drain-timeout", d(&a.drain_timeout)),
        ("files", d(&a.files)),
        ("files-keep-partial", d(&a.files_keep_partial)),
        ("metrics", d(&a.metrics)),
        ("control", d(&a.control)),
        ("max-stripes", d(&a.max_stripes)),
        ("max-flows", d(&a.max_flows)),
        ("max-flows-per-client", d(&a.max_flows_per_client)),
        ("flow-idle", d(&a.flow_idle)),
        ("session limits", d(&a.session)),
    ]
}

/// On every SIGHUP: parse the command line and its `--config` file again
/// and put the new policy in force; a bad file keeps the old one. What
/// changed that a reload cannot apply (`running`: as the server runs) is
/// named in one line.
pub(crate) async fn on_hangup(reloader: Reloader, running: Vec<(&'static str, String)>) {
    let mut hup = match crate::sys::Hangups::watch() {
        Ok(h) => h,
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            return tracing::info!("{e}: no reloads by signal")
        }
        Err(e) => return tracing::warn!("cannot watch for SIGHUP ({e}): no reloads"),
    };
    while hup.next().await.is_some() {
        match reread() {
            Ok((p, a)) => {
                let ended = reloader.reload(p);
                tracing::info!(
                    "reloaded rules, authorized keys and token ({ended} session(s) ended)"
                );
                let changed: Vec<&str> = fixed(&a)
                    .iter()
                    .zip(&running)
                    .filter(|(new, old)| new.1 != old.1)
                    .map(|(new, _)| new.0)
                    .collect();
                if !changed.is_empty() {
                    tracing::warn!(
                        "the reload does not apply {}: restart the server to change them",
                        changed.join(", ")
                    );
                }
            }
            Err(e) => tracing::error!("reload failed, keeping the configuration in force: {e:#}"),
        }
    }
}

fn reread() -> anyhow::Result<(Policy, ServerArgs)> {
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
        Cmd::Server(a) => Ok((policy(&a)?, a)),
        _ => anyhow::bail!("not a server command line"),
    }
}
