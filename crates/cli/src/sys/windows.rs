//! Windows: Ctrl-C (and Ctrl-Break) stop; there is no SIGHUP, so no
//! reload by signal; a command is run and waited for; `cp` is not built
//! yet.

/// Ctrl-C or Ctrl-Break.
pub(crate) async fn stop_signal() {
    let brk = tokio::signal::windows::ctrl_break();
    match brk {
        Ok(mut b) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = b.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
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
