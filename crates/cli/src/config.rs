//! `--config FILE`: a TOML file whose keys are the command's long options
//! (`listen = ["tls://0.0.0.0:7000"]`, `authorized-keys = "…"`, `insecure =
//! true`). It is turned into arguments placed before the command line's
//! own; an option given on the command line replaces the file's value (for
//! repeatable options, the whole list). An unknown key, or a value of the
//! wrong kind, is an error naming the file, the line and the key.

use std::ffi::OsString;
use std::path::Path;

use clap::CommandFactory;

use crate::args::Cli;

/// Largest configuration file read.
const MAX_CONFIG: u64 = 1 << 20;

/// Expands `--config FILE` in `argv` (once, after the subcommand).
pub fn expand(argv: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let Some(at) = argv
        .iter()
        .position(|a| a == "--config" || a.to_string_lossy().starts_with("--config="))
    else {
        return Ok(argv);
    };
    let file = match argv[at].to_string_lossy().strip_prefix("--config=") {
        Some(f) => OsString::from(f),
        None => argv
            .get(at + 1)
            .cloned()
            .ok_or("--config needs a FILE (a TOML file of long options)")?,
    };
    let cmd = Cli::command();
    let Some((sub_at, sub)) = argv
        .iter()
        .enumerate()
        .skip(1)
        .find_map(|(i, a)| cmd.find_subcommand(a.to_str()?).map(|s| (i, s.clone())))
    else {
        return Err(
            "--config goes with a command: longhaul server --config FILE (or client, cp)".into(),
        );
    };
    // `service install|run COMMAND…`: the file belongs to COMMAND, read
    // when it is checked or run.
    if sub.get_name() == "service" {
        return Ok(argv);
    }
    let given = given_options(&argv[sub_at + 1..], &sub);
    let extra = file_args(Path::new(&file), &sub, &given)?;
    let mut out = argv[..=sub_at].to_vec();
    out.extend(extra);
    out.extend_from_slice(&argv[sub_at + 1..]);
    Ok(out)
}

/// Ids of the options the command line gives itself.
fn given_options(args: &[OsString], sub: &clap::Command) -> Vec<String> {
    let mut ids = vec![];
    for a in args.iter().filter_map(|a| a.to_str()) {
        for arg in sub.get_arguments() {
            let long = arg.get_long().map(|l| format!("--{l}"));
            let short = arg.get_short().map(|s| format!("-{s}"));
            let hit = long
                .as_deref()
                .is_some_and(|l| a == l || a.starts_with(&format!("{l}=")))
                || short
                    .as_deref()
                    .is_some_and(|s| a.starts_with(s) && !a.starts_with("--"));
            if hit {
                ids.push(arg.get_id().to_string());
            }
        }
    }
    ids
}

fn file_args(path: &Path, sub: &clap::Command, given: &[String]) -> Result<Vec<OsString>, String> {
    use std::io::Read;
    let name = path.display();
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG).read_to_string(&mut text))
        .map_err(|e| format!("--config {name}: {e}"))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
            .unwrap_or(1);
        format!("{name}:{line}: {}", e.message())
    })?;
    let line_of = |key: &str| {
        text.lines()
            .position(|l| {
                let l = l.trim_start();
                l.strip_prefix(key)
                    .or_else(|| l.strip_prefix(&format!("\"{key}\"")))
                    .is_some_and(|r| r.trim_start().starts_with('='))
            })
            .map_or(1, |i| i + 1)
    };
    let mut out = vec![];
    for (key, value) in &table {
        let at = || format!("{name}:{}", line_of(key));
        let norm = key.replace('_', "-");
        let Some(arg) = sub.get_arguments().find(|a| {
            a.get_long() == Some(norm.as_str()) || a.get_id().as_str().replace('_', "-") == norm
        }) else {
            let examples = match sub.get_name() {
                "server" => "listen, key, allow",
                "client" => "server, local, remote, dynamic, pin",
                _ => "pin, key, token",
            };
            return Err(format!(
                "{}: unknown key '{key}' (keys are the long options of 'longhaul {}', e.g. {examples}; see 'longhaul {} --help')",
                at(),
                sub.get_name(),
                sub.get_name()
            ));
        };
        if arg.get_id() == "config_file" || given.iter().any(|g| g == arg.get_id().as_str()) {
            continue;
        }
        let flag = match (arg.get_long(), arg.get_short()) {
            (Some(l), _) => Some(format!("--{l}")),
            (None, Some(s)) => Some(format!("-{s}")),
            // A positional argument (the client's SERVER).
            (None, None) => None,
        };
        let takes_value = arg.get_action().takes_values();
        if !takes_value {
            match value {
                toml::Value::Boolean(true) => out.extend(flag.clone().map(OsString::from)),
                toml::Value::Boolean(false) => {}
                _ => return Err(format!("{}: '{key}' is a switch: write {key} = true", at())),
            }
            continue;
        }
        let values: Vec<String> = match value {
            toml::Value::String(s) => vec![s.clone()],
            toml::Value::Integer(i) => vec![i.to_string()],
            toml::Value::Float(f) => vec![f.to_string()],
            toml::Value::Array(a) => a
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) => Ok(s.clone()),
                    toml::Value::Integer(i) => Ok(i.to_string()),
                    _ => Err(format!("{}: '{key}' takes strings", at())),
                })
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(format!(
                    "{}: '{key}' takes a string, a number or a list",
                    at()
                ))
            }
        };
        for v in values {
            // Checked here, so that a bad value is named with its line.
            let one = clap::Command::new("longhaul").no_binary_name(true).arg(
                clap::Arg::new("value")
                    .allow_hyphen_values(true)
                    .value_parser(arg.get_value_parser().clone()),
            );
            if let Err(e) = one.try_get_matches_from([&v]) {
                let why = match std::error::Error::source(&e) {
                    Some(cause) => cause.to_string(),
                    None => e.kind().to_string(),
                };
                return Err(format!("{}: {key} = {v:?}: {why}", at()));
            }
            out.extend(flag.clone().map(OsString::from));
            out.push(v.into());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_with(toml: &str, args: &[&str]) -> Result<Vec<String>, String> {
        // A file of its own per call (tests run in parallel), removed below.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let f = std::env::temp_dir().join(format!("lh-config-{}-{n}.toml", std::process::id()));
        std::fs::write(&f, toml).unwrap();
        let mut argv: Vec<OsString> = vec![
            "longhaul".into(),
            "server".into(),
            "--config".into(),
            f.clone().into(),
        ];
        argv.extend(args.iter().map(OsString::from));
        let r = expand(argv).map(|v| v.into_iter().map(|a| a.into_string().unwrap()).collect());
        let _ = std::fs::remove_file(&f);
        r
    }

    #[test]
    fn keys_become_options_and_the_command_line_wins() {
        let a = expand_with(
            "listen = [\"tls://0.0.0.0:7000\", \"dir:///srv/x\"]\nkey = \"s.key\"\ninsecure = true\nmax_sessions = 10\nallow = [\"a:1\"]\n",
            &["--allow", "b:2"],
        )
        .unwrap();
        let s = a.join(" ");
        assert!(
            s.contains("--listen tls://0.0.0.0:7000 --listen dir:///srv/x"),
            "{s}"
        );
        assert!(
            s.contains("--key s.key")
                && s.contains("--insecure")
                && s.contains("--max-sessions 10"),
            "{s}"
        );
        assert!(!s.contains("a:1") && s.ends_with("--allow b:2"), "{s}");
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_line() {
        let e = expand_with("key = \"k\"\n\nlisen = \"x\"\n", &[]).unwrap_err();
        assert!(e.contains(".toml:3: unknown key 'lisen' (keys are the long options of 'longhaul server', e.g. listen, key, allow"), "{e}");
        // A bad value is named with its line too.
        let e = expand_with("key = \"k\"\nmax-sessions = \"many\"\n", &[]).unwrap_err();
        assert!(e.contains(".toml:2: max-sessions = \"many\""), "{e}");
        let e = expand_with("insecure = \"yes\"\n", &[]).unwrap_err();
        assert!(e.contains(":1: 'insecure' is a switch"), "{e}");
        let e = expand_with("key = \n", &[]).unwrap_err();
        assert!(e.contains(".toml:1:"), "{e}");
    }

    #[test]
    fn the_shipped_examples_parse() {
        use clap::Parser;
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/");
        for (cmd, file) in [("server", "server.toml"), ("client", "client.toml")] {
            let argv = vec![
                "longhaul".into(),
                cmd.into(),
                "--config".into(),
                format!("{root}{file}").into(),
            ];
            let argv = expand(argv).unwrap();
            if let Err(e) = Cli::try_parse_from(&argv) {
                panic!("{file}: {e}\n{argv:?}");
            }
        }
    }

    /// Clap's own checks of the whole command line (duplicate ids and the
    /// like, which only show as a panic when that command runs).
    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
