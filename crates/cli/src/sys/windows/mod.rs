//! Windows: Ctrl-C, Ctrl-Break, a closed console, shutdown and the service
//! manager's stop end a command; there is no SIGHUP, so a reload is asked
//! through the control pipe or, for a service, by the manager's
//! PARAMCHANGE; a command is run and waited for.

mod event_log;
mod param_change;
mod service;

use param_change::param_change;

pub(crate) use service::{run_service, service};

/// Ctrl-C, Ctrl-Break, the console closing, the system shutting down, or
/// the service manager's stop. Each call waits for a stop that comes after
/// the last one a call returned for (a server's first drains, its second
/// ends).
pub(crate) async fn stop_signal() {
    use tokio::signal::windows::{ctrl_break, ctrl_close, ctrl_shutdown};
    let (mut b, mut c, mut s) = (ctrl_break().ok(), ctrl_close().ok(), ctrl_shutdown().ok());
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        Some(_) = async { b.as_mut()?.recv().await } => {}
        Some(_) = async { c.as_mut()?.recv().await } => {}
        Some(_) = async { s.as_mut()?.recv().await } => {}
        _ = service::stop_asked() => {}
    }
    tracing::info!("stop signal received");
}

/// What [`Hangups`] are, in a log line.
pub(crate) const HANGUP: &str = "asked by the service manager";

/// The service manager's PARAMCHANGE, each time (never outside a service).
pub(crate) struct Hangups(tokio::sync::watch::Receiver<u64>);

impl Hangups {
    pub(crate) fn watch() -> std::io::Result<Hangups> {
        Ok(Hangups(service::reloads()))
    }

    pub(crate) async fn next(&mut self) -> Option<()> {
        self.0.changed().await.ok()
    }
}

/// Runs `cmd` and exits with its status.
pub(crate) fn become_command(cmd: &mut std::process::Command) -> std::io::Error {
    match cmd.status() {
        Ok(s) => std::process::exit(s.code().unwrap_or(1)),
        Err(e) => e,
    }
}

/// `longhaul cp`.
pub(crate) async fn cp(a: crate::args::CpArgs) -> anyhow::Result<()> {
    crate::cp::run(a).await
}
