//! `longhaul service install|uninstall`, and what runs when Windows'
//! service manager starts one: the installed `server …` or `client …`
//! command, logging to a file rotated daily (errors also to the Event
//! Log); the manager's stop is the first stop signal (a server drains),
//! PARAMCHANGE a reload. What a service runs and where it logs are
//! changeable by Administrators only, checked.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use clap::Parser;
use tokio::sync::watch;
use windows_service::service::{
    ServiceAccess, ServiceControl, ServiceControlAccept, ServiceErrorControl, ServiceExitCode,
    ServiceInfo, ServiceStartType, ServiceState, ServiceStatus, ServiceType,
};
use windows_service::service_control_handler::{
    self, ServiceControlHandlerResult, ServiceStatusHandle,
};
use windows_service::service_manager::{ServiceManager, ServiceManagerAccess};
use windows_service::{define_windows_service, service_dispatcher};

use crate::args::{Cli, Cmd, ServiceCmd};

/// Daily log files kept (`%ProgramData%\longhaul\logs\NAME.YYYY-MM-DD.log`).
const LOG_FILES_KEPT: usize = 14;
/// What the manager is told a stop may take beyond a server's drain.
const STOP_MARGIN: Duration = Duration::from_secs(15);
/// A client's stop, or a server's with the default 30 s drain.
const STOP_HINT: Duration = Duration::from_secs(45);
/// This service's stop: its drain and [`STOP_MARGIN`].
static STOP_TAKES: OnceLock<Duration> = OnceLock::new();

static STOPS: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::channel(0).0);
static STOPS_TAKEN: AtomicU64 = AtomicU64::new(0);
static RELOADS: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::channel(0).0);
/// What `service run` was asked to run: name, folder, command.
static JOB: OnceLock<(String, PathBuf, Vec<OsString>)> = OnceLock::new();
static STATUS: OnceLock<ServiceStatusHandle> = OnceLock::new();

/// A manager's stop this process has not yet acted on.
pub(super) async fn stop_asked() {
    let mut stops = STOPS.subscribe();
    let seen = STOPS_TAKEN.load(Ordering::SeqCst);
    let _ = stops.wait_for(|&n| n > seen).await;
    STOPS_TAKEN.fetch_add(1, Ordering::SeqCst);
}

/// Each PARAMCHANGE from now on.
pub(super) fn reloads() -> watch::Receiver<u64> {
    RELOADS.subscribe()
}

/// `longhaul service install|uninstall`.
pub(crate) fn service(cmd: ServiceCmd) -> anyhow::Result<()> {
    match cmd {
        ServiceCmd::Install { name, command } => install(&name, command),
        ServiceCmd::Uninstall { name } => uninstall(&name),
        ServiceCmd::Reload { name } => reload(&name),
        ServiceCmd::Run { .. } => anyhow::bail!("'service run' is what the service manager starts"),
    }
}

/// Parses the command a service runs (its `--config` file read): a
/// server or a client, else one line saying why not.
fn parse(command: &[OsString]) -> anyhow::Result<Cli> {
    let argv: Vec<OsString> = std::iter::once(OsString::from("longhaul"))
        .chain(command.iter().cloned())
        .collect();
    let argv = crate::config::expand(argv).map_err(|e| anyhow::anyhow!(e))?;
    let path = crate::arg_errors::command_path(&argv);
    let cli = Cli::try_parse_from(argv).map_err(|e| {
        anyhow::anyhow!(crate::arg_errors::one_line_error(
            &e.render().to_string(),
            &path
        ))
    })?;
    match cli.cmd {
        Cmd::Server(_) | Cmd::Client(_) => Ok(cli),
        _ => anyhow::bail!("a service runs 'server …' or 'client …'"),
    }
}

fn install(name: &str, command: Vec<OsString>) -> anyhow::Result<()> {
    let dir = std::env::current_dir()?;
    // Checked here, in the folder the service will run in: a typo is
    // said now, not in the Event Log at the next boot.
    let role = match parse(&command)?.cmd {
        Cmd::Server(_) => "server",
        _ => "client",
    };
    only_admins_change(&dir, &command)?;
    let manager = ServiceManager::local_computer(
        None::<&str>,
        ServiceManagerAccess::CONNECT | ServiceManagerAccess::CREATE_SERVICE,
    )
    .map_err(|e| {
        anyhow::anyhow!("cannot reach the service manager ({e}): run this as Administrator")
    })?;
    let mut args: Vec<OsString> = ["service", "run", "--name", name, "--dir"]
        .map(OsString::from)
        .to_vec();
    args.push(dir.clone().into_os_string());
    args.extend(command);
    let info = ServiceInfo {
        name: name.into(),
        display_name: format!("longhaul {role} ({name})").into(),
        service_type: ServiceType::OWN_PROCESS,
        start_type: ServiceStartType::AutoStart,
        error_control: ServiceErrorControl::Normal,
        executable_path: std::env::current_exe()?,
        launch_arguments: args,
        dependencies: vec![],
        account_name: None,
        account_password: None,
    };
    let service = manager
        .create_service(&info, ServiceAccess::CHANGE_CONFIG)
        .map_err(|e| anyhow::anyhow!("cannot install service '{name}': {e}"))?;
    let _ = service.set_description(format!(
        "Carries TCP and UDP through a longhaul {role}; logs in %ProgramData%\\longhaul\\logs"
    ));
    println!(
        "installed service '{name}' (a {role}, starts with the system, relative paths from {}); start it now: sc.exe start {name}",
        dir.display()
    );
    Ok(())
}

/// A service runs as LocalSystem: whoever could change its program (or
/// add a library beside it), its folder or a file its command names —
/// on the command line or in its config (config, keys, tokens) — could
/// run their own code or configuration as the system. Each must be
/// changeable by SYSTEM, Administrators and the installing user only; a
/// named file not there yet, the nearest folder that is (whoever may add
/// it chooses it); the words of a `cmd://` command too. A folder
/// carrier's folder is not: its peer writes it by design.
fn only_admins_change(dir: &std::path::Path, command: &[OsString]) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut paths = vec![exe.clone(), dir.to_path_buf()];
    paths.extend(exe.parent().map(std::path::Path::to_path_buf));
    let argv: Vec<OsString> = std::iter::once(OsString::from("longhaul"))
        .chain(command.iter().cloned())
        .collect();
    let expanded = crate::config::expand(argv).map_err(|e| anyhow::anyhow!(e))?;
    for arg in command.iter().chain(expanded.iter().skip(1)) {
        let arg = arg.to_string_lossy();
        // `--flag=value`, or the value on its own.
        let value = match arg.split_once('=') {
            Some((flag, v)) if flag.starts_with('-') => v,
            _ => &arg,
        };
        // A folder carrier's folder is written by its peer by design; a
        // command's words may name its program and its files.
        let words: Vec<String> = match value.strip_prefix("cmd://") {
            Some(cmd) => {
                let words = command_words(cmd)?;
                // Its folder too: a library planted beside it is loaded.
                let program = std::path::Path::new(&words[0]);
                paths.extend(program.parent().map(std::path::Path::to_path_buf));
                words
            }
            None if value.contains("://") => continue,
            None => vec![value.to_string()],
        };
        for word in &words {
            if word.is_empty() || word.starts_with('-') {
                continue;
            }
            // `D:file` is relative to a folder the service will not have
            // (`h:22`, a host and port, is not a path).
            let b = word.as_bytes();
            if b.len() > 2
                && b[0].is_ascii_alphabetic()
                && b[1] == b':'
                && !matches!(b[2], b'\\' | b'/')
                && !b[2..].iter().all(u8::is_ascii_digit)
            {
                anyhow::bail!(
                    "{word}: a drive-relative path; give it whole ({}:\\…)",
                    b[0] as char
                );
            }
            let path = dir.join(word);
            if path.is_file() {
                paths.push(path);
            } else if word.contains(['\\', '/']) && !path.exists() {
                // Not there yet: whoever may make it there chooses it; with
                // no folder at all (a drive or share not there now), who
                // brings it.
                match path.ancestors().skip(1).find(|f| f.is_dir()) {
                    Some(folder) => paths.push(folder.to_path_buf()),
                    None => anyhow::bail!(
                        "{word}: no folder of it exists here (a drive or share not there now is anyone's to bring): give a path on a local drive"
                    ),
                }
            }
        }
    }
    paths.sort();
    paths.dedup();
    for path in paths {
        if let Some(why) = longhaul_carrier::private::changeable_by_others(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        {
            anyhow::bail!(
                "{why}, and a service runs as LocalSystem: keep the program, its folder and the files it reads where only Administrators write (C:\\Program Files\\longhaul; a folder made in %ProgramData% or C:\\ lets users add files)"
            );
        }
    }
    Ok(())
}

/// The words of a `cmd://` command, its program first. What install
/// checks must be what `cmd /C` runs, so a service's command is one plain
/// command: no `& | < > ^ ( ) ! %` or quotes (a second command, a
/// redirection, a variable, or quotes cmd would read otherwise), words
/// split at spaces, the program a whole path to a file there (without
/// spaces: its 8.3 name, or a folder without them), an option's path a
/// word of its own (`-F C:\\x`, not `-FC:\\x`). (`@` is cmd's only at
/// the start, where the program's drive letter is.)
fn command_words(cmd: &str) -> anyhow::Result<Vec<String>> {
    if let Some(c) = cmd.chars().find(|c| "&|<>^()!%\"".contains(*c)) {
        anyhow::bail!(
            "cmd://{cmd}: a service's command is one plain command, without '{c}' (write a .cmd file in an Administrators-only folder and give its path)"
        );
    }
    let words: Vec<String> = cmd.split_whitespace().map(str::to_owned).collect();
    let program = words.first().map(std::path::Path::new);
    if !program.is_some_and(|p| p.is_absolute() && p.is_file()) {
        anyhow::bail!(
            "cmd://{cmd}: a service's command starts with its program's whole path (e.g. C:\\Windows\\System32\\OpenSSH\\ssh.exe)"
        );
    }
    if let Some(w) = words
        .iter()
        .find(|w| w.starts_with('-') && w.contains(['\\', '/']))
    {
        anyhow::bail!("cmd://{cmd}: give the path in '{w}' as a word of its own");
    }
    Ok(words)
}

fn uninstall(name: &str) -> anyhow::Result<()> {
    let manager = ServiceManager::local_computer(None::<&str>, ServiceManagerAccess::CONNECT)
        .map_err(|e| {
            anyhow::anyhow!("cannot reach the service manager ({e}): run this as Administrator")
        })?;
    let service = manager
        .open_service(
            name,
            ServiceAccess::QUERY_STATUS | ServiceAccess::STOP | ServiceAccess::DELETE,
        )
        .map_err(|e| anyhow::anyhow!("no service '{name}' to uninstall ({e})"))?;
    if service.query_status()?.current_state != ServiceState::Stopped {
        println!("stopping '{name}' (a server drains its sessions first)…");
        // The service says what its stop takes once it has begun.
        let takes = service
            .stop()
            .map_or(STOP_HINT, |s| s.wait_hint.max(STOP_HINT));
        let until = std::time::Instant::now() + takes;
        while service.query_status()?.current_state != ServiceState::Stopped {
            if std::time::Instant::now() > until {
                anyhow::bail!(
                    "'{name}' did not stop within {}s; try again",
                    takes.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    service.delete()?;
    println!("uninstalled service '{name}'");
    Ok(())
}

/// Sends PARAMCHANGE, which only those who may pause the service may
/// send (Administrators, by default): a user-defined control would let
/// any interactive user ask.
fn reload(name: &str) -> anyhow::Result<()> {
    super::param_change(name).map_err(|e| match e.raw_os_error() {
        // ERROR_ACCESS_DENIED
        Some(5) => {
            anyhow::anyhow!("cannot reach service '{name}' ({e}): run this as Administrator")
        }
        // ERROR_SERVICE_DOES_NOT_EXIST
        Some(1060) => anyhow::anyhow!("no service '{name}' ({e})"),
        _ => anyhow::anyhow!("service '{name}' did not take the reload ({e}): is it running?"),
    })?;
    println!(
        "asked '{name}' to reload; its log says how it went (%ProgramData%\\longhaul\\logs\\{name}.*.log)"
    );
    Ok(())
}

define_windows_service!(ffi_service_main, service_main);

/// `longhaul service run`: hands this thread to the service manager, which
/// calls [`service_main`] on one of its own.
pub(crate) fn run_service(name: String, dir: PathBuf, command: Vec<OsString>) -> ExitCode {
    let _ = JOB.set((name.clone(), dir, command));
    match service_dispatcher::start(&name, ffi_service_main) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("longhaul: 'service run' is for the service manager ({e}); run the command itself instead");
            ExitCode::from(2)
        }
    }
}

fn set_state(state: ServiceState, exit: u32) {
    let Some(handle) = STATUS.get() else { return };
    let (controls, hint) = match state {
        ServiceState::Running => (
            ServiceControlAccept::STOP
                | ServiceControlAccept::SHUTDOWN
                | ServiceControlAccept::PARAM_CHANGE,
            Duration::ZERO,
        ),
        ServiceState::StopPending => (
            ServiceControlAccept::empty(),
            *STOP_TAKES.get().unwrap_or(&STOP_HINT),
        ),
        _ => (ServiceControlAccept::empty(), Duration::ZERO),
    };
    let _ = handle.set_service_status(ServiceStatus {
        service_type: ServiceType::OWN_PROCESS,
        current_state: state,
        controls_accepted: controls,
        exit_code: match exit {
            0 => ServiceExitCode::Win32(0),
            n => ServiceExitCode::ServiceSpecific(n),
        },
        checkpoint: u32::from(state == ServiceState::StopPending),
        wait_hint: hint,
        process_id: None,
    });
}

fn service_main(_: Vec<OsString>) {
    let Some((name, dir, command)) = JOB.get() else {
        return;
    };
    let events = super::event_log::EventLog::open(name);
    let handler = |control| match control {
        ServiceControl::Stop | ServiceControl::Shutdown => {
            set_state(ServiceState::StopPending, 0);
            STOPS.send_modify(|n| *n += 1);
            ServiceControlHandlerResult::NoError
        }
        ServiceControl::ParamChange => {
            RELOADS.send_modify(|n| *n += 1);
            ServiceControlHandlerResult::NoError
        }
        ServiceControl::Interrogate => ServiceControlHandlerResult::NoError,
        _ => ServiceControlHandlerResult::NotImplemented,
    };
    match service_control_handler::register(name, handler) {
        Ok(h) => {
            let _ = STATUS.set(h);
        }
        Err(e) => return events.error(&format!("cannot register with the service manager: {e}")),
    }
    let code = match run(name, dir, command, &events) {
        Ok(()) => 0,
        Err(e) => {
            let said = format!("{e:#}");
            tracing::error!("{said}");
            events.error(&said);
            1
        }
    };
    set_state(ServiceState::Stopped, code);
}

fn run(
    name: &str,
    dir: &std::path::Path,
    command: &[OsString],
    events: &super::event_log::EventLog,
) -> anyhow::Result<()> {
    use tracing_subscriber::layer::{Layer, SubscriberExt};
    std::env::set_current_dir(dir).map_err(|e| anyhow::anyhow!("folder {}: {e}", dir.display()))?;
    let cli = parse(command)?;
    if let Cmd::Server(a) = &cli.cmd {
        let _ = STOP_TAKES.set(a.drain_timeout + STOP_MARGIN);
    }
    let logs = std::env::var_os("ProgramData")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("longhaul")
        .join("logs");
    // A folder a user made first (ProgramData lets them) or turned into a
    // junction would take the system's writes, and its old files' removal.
    longhaul_carrier::private::admin_folder(&logs)
        .map_err(|e| anyhow::anyhow!("log folder {}: {e}", logs.display()))?;
    let file = tracing_appender::rolling::Builder::new()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix(name)
        .filename_suffix("log")
        .max_log_files(LOG_FILES_KEPT)
        .build(&logs)
        .map_err(|e| anyhow::anyhow!("log folder {}: {e}", logs.display()))?;
    let format = tracing_subscriber::fmt::layer()
        .with_writer(file)
        .with_ansi(false)
        .with_target(false);
    let format = match cli.log_format {
        crate::args::LogFormat::Text => format.boxed(),
        crate::args::LogFormat::Json => format.json().boxed(),
    };
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new(crate::log_filter(&cli)))
        .with(format)
        .with(events.clone().layer());
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|e| anyhow::anyhow!("logging: {e}"))?;
    // No console: a panic goes to the log (and the Event Log) too.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |p| {
        tracing::error!("{p}");
        default_hook(p);
    }));
    set_state(ServiceState::Running, 0);
    tracing::info!("service '{name}' started ({})", crate::VERSION);
    let rt = crate::runtime(&cli)?;
    let done = rt.block_on(crate::run(cli.cmd));
    tracing::info!("service '{name}' stopped");
    done
}
