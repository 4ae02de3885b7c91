//! Unix: SIGTERM and SIGHUP, `exec`.

use tokio::signal::unix::{signal, SignalKind};

/// Ctrl-C or SIGTERM (what `kill` and service managers send).
pub(crate) async fn stop_signal() {
    if let Ok(mut term) = signal(SignalKind::terminate()) {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    } else {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("stop signal received");
}

/// What [`Hangups`] are, in a log line.
pub(crate) const HANGUP: &str = "SIGHUP";

/// Each SIGHUP, as it comes (a server's reload; a client's closed
/// terminal).
pub(crate) struct Hangups(tokio::signal::unix::Signal);

impl Hangups {
    pub(crate) fn watch() -> std::io::Result<Hangups> {
        signal(SignalKind::hangup()).map(Hangups)
    }

    pub(crate) async fn next(&mut self) -> Option<()> {
        self.0.recv().await
    }
}

/// Becomes `cmd` (so its PID is ours and signals sent to us reach it);
/// returns only on failure.
pub(crate) fn become_command(cmd: &mut std::process::Command) -> std::io::Error {
    std::os::unix::process::CommandExt::exec(cmd)
}

/// `longhaul cp` (the file service is built for Linux only so far).
pub(crate) async fn cp(a: crate::args::CpArgs) -> anyhow::Result<()> {
    #[cfg(target_os = "linux")]
    return crate::cp::run(a).await;
    #[cfg(not(target_os = "linux"))]
    {
        let _ = a;
        anyhow::bail!(longhaul_files::NOT_BUILT)
    }
}

/// `longhaul service`: Windows' service manager only.
pub(crate) fn service(_: crate::args::ServiceCmd) -> anyhow::Result<()> {
    anyhow::bail!(
        "'longhaul service' registers Windows services; here run the server under systemd (contrib/longhaul-server.service) or your init system"
    )
}

/// Never started by a service manager here.
pub(crate) fn run_service(
    _: String,
    _: std::path::PathBuf,
    _: Vec<std::ffi::OsString>,
) -> std::process::ExitCode {
    eprintln!("longhaul: 'service run' is what Windows' service manager starts");
    std::process::ExitCode::from(2)
}
