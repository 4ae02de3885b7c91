//! What a server reads that SIGHUP reads again: rules, authorized keys and
//! the token (from the same command line and `--config` file).

use longhaul_forward::auth::{AuthorizedKeys, ServerAuth, MAX_TOKEN};
use longhaul_forward::policy::Policy;
use longhaul_forward::server::Reloader;
use longhaul_session::logs::shown;

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

/// A running server's reload: parse the command line and its `--config`
/// file again and put the new policy in force; a bad file keeps the old
/// one. What changed that a reload cannot apply (`running`: as the server
/// runs) is named. Asked by SIGHUP (Unix) or `longhaul reload` (the
/// control channel, everywhere); one at a time.
#[derive(Clone)]
pub(crate) struct Reload {
    reloader: Reloader,
    running: std::sync::Arc<Vec<(&'static str, String)>>,
    one_at_a_time: std::sync::Arc<std::sync::Mutex<()>>,
}

impl Reload {
    pub(crate) fn new(reloader: Reloader, running: Vec<(&'static str, String)>) -> Reload {
        Reload {
            reloader,
            running: std::sync::Arc::new(running),
            one_at_a_time: Default::default(),
        }
    }

    /// Reloads now; says what it did, or why it kept the configuration
    /// (each also logged, naming who asked: `by`).
    pub(crate) fn run(&self, by: &str) -> Result<String, String> {
        let _one = self.one_at_a_time.lock().unwrap_or_else(|e| e.into_inner());
        match reread() {
            Ok((p, a)) => {
                let ended = self.reloader.reload(p);
                let mut said =
                    format!("reloaded rules, authorized keys and token ({ended} session(s) ended)");
                tracing::info!("{said} ({by})");
                let changed: Vec<&str> = fixed(&a)
                    .iter()
                    .zip(self.running.iter())
                    .filter(|(new, old)| new.1 != old.1)
                    .map(|(new, _)| new.0)
                    .collect();
                if !changed.is_empty() {
                    let not = format!(
                        "the reload does not apply {}: restart the server to change them",
                        changed.join(", ")
                    );
                    tracing::warn!("{not}");
                    said = format!("{said}; {not}");
                }
                Ok(said)
            }
            Err(e) => {
                let said = format!("reload failed, keeping the configuration in force: {e:#}");
                tracing::error!("{said} ({by})");
                Err(said)
            }
        }
    }

    /// Reloads on every SIGHUP (where the system has signals).
    pub(crate) async fn on_hangup(self) {
        let mut hup = match crate::sys::Hangups::watch() {
            Ok(h) => h,
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                return tracing::debug!("{e}: reloads by 'longhaul reload' only")
            }
            Err(e) => {
                return tracing::warn!("cannot watch for SIGHUP ({e}): use 'longhaul reload'")
            }
        };
        while hup.next().await.is_some() {
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || me.run(crate::sys::HANGUP)).await;
        }
    }
}

/// `longhaul reload [SOCKET]`: asks one server, or every server running
/// here as this user, to reload, and prints each answer; fails if one
/// could not.
pub(crate) async fn by_control(a: crate::args::ReloadArgs) -> anyhow::Result<()> {
    use longhaul_forward::status;
    // Every server's `server-PID.sock` (a client has nothing to reload).
    let sockets: Vec<_> = status::to_ask(a.socket.as_deref())?
        .into_iter()
        .filter(|s| {
            a.socket.is_some()
                || s.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("server-"))
        })
        .collect();
    let mut failed = 0;
    let mut asked = 0;
    for s in &sockets {
        let v = match status::reload(s).await {
            Ok(v) => v,
            // A process that ended without removing its socket.
            Err(e) if a.socket.is_none() => {
                tracing::debug!("{}: {e}", s.display());
                continue;
            }
            Err(e) => anyhow::bail!("{}: {e}", s.display()),
        };
        asked += 1;
        // Whoever answers on the socket wrote it: no terminal controls.
        let message: String = v["message"]
            .as_str()
            .unwrap_or("no answer")
            .chars()
            .take(4096)
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        println!(
            "{} pid {}: {message}",
            shown(v["role"].as_str().unwrap_or("?")),
            v["pid"]
        );
        if v["reloaded"] != true {
            failed += 1;
        }
    }
    if asked == 0 {
        anyhow::bail!(
            "no longhaul server running here (looked in {}; give a server's control socket)",
            status::default_dir().display()
        );
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {asked} server(s) kept their configuration");
    }
    Ok(())
}

fn reread() -> anyhow::Result<(Policy, ServerArgs)> {
    reread_from(std::env::args_os().collect())
}

fn reread_from(argv: Vec<std::ffi::OsString>) -> anyhow::Result<(Policy, ServerArgs)> {
    use clap::Parser;
    let argv = crate::config::expand(argv).map_err(|e| anyhow::anyhow!(e))?;
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
        // A Windows service: the command it runs.
        Cmd::Service(crate::args::ServiceArgs {
            cmd: crate::args::ServiceCmd::Run { command, .. },
        }) => reread_from(std::iter::once("longhaul".into()).chain(command).collect()),
        _ => anyhow::bail!("not a server command line"),
    }
}
