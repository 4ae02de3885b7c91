//! Windows: Ctrl-C, Ctrl-Break, a closed console and shutdown stop; there is no SIGHUP, so no
//! reload by signal; a command is run and waited for; `cp` is not built
//! yet.

/// Ctrl-C, Ctrl-Break, the console closing, or the system shutting down.
pub(crate) async fn stop_signal() {
    use tokio::signal::windows::{ctrl_break, ctrl_close, ctrl_shutdown};
    let (mut b, mut c, mut s) = (ctrl_break().ok(), ctrl_close().ok(), ctrl_shutdown().ok());
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        Some(_) = async { b.as_mut()?.recv().await } => {}
        Some(_) = async { c.as_mut()?.recv().await } => {}
        Some(_) = async { s.as_mut()?.recv().await } => {}
    }
    tracing::info!("stop signal received");
}

/// Windows has no SIGHUP.
pub(crate) struct Hangups(std::convert::Infallible);

impl Hangups {
    pub(crate) fn watch() -> std::io::Result<Hangups> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "Windows has no SIGHUP",
        ))
    }

    pub(crate) async fn next(&mut self) -> Option<()> {
        match self.0 {}
    }
}

/// Runs `cmd` and exits with its status.
pub(crate) fn become_command(cmd: &mut std::process::Command) -> std::io::Error {
    match cmd.status() {
        Ok(s) => std::process::exit(s.code().unwrap_or(1)),
        Err(e) => e,
    }
}

/// `longhaul cp`: not built here yet.
pub(crate) async fn cp(_: crate::args::CpArgs) -> anyhow::Result<()> {
    anyhow::bail!(longhaul_files::NOT_BUILT)
}
