//! A command line clap refuses, told in one line: what is wrong, what to
//! write, and which help to read.

use crate::args::Cli;

/// The subcommands the command line names ("longhaul bench tput"), as clap
/// parses them (an option's value named like a subcommand is not one).
pub(crate) fn command_path(argv: &[std::ffi::OsString]) -> String {
    let cmd = <Cli as clap::CommandFactory>::command().ignore_errors(true);
    let mut path = vec!["longhaul".to_string()];
    if let Ok(m) = cmd.try_get_matches_from(argv) {
        let mut m = &m;
        while let Some((name, sub)) = m.subcommand() {
            path.push(name.to_string());
            m = sub;
        }
    }
    path.join(" ")
}

/// A clap error in one line that says what is wrong, what to write and
/// where to look: clap puts the missing arguments and the usage on lines
/// of their own, which a one-line message would otherwise cut off.
pub(crate) fn one_line_error(text: &str, path: &str) -> String {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("invalid arguments");
    let mut what = first.strip_prefix("error: ").unwrap_or(first).to_string();
    let mut usage = None;
    // The arguments clap lists under "...not provided:", or the possible
    // values under "invalid value", then any "tip:".
    let listing = what.ends_with(':');
    let mut first_paragraph = true;
    for line in lines {
        let t = line.trim();
        if let Some(u) = t.strip_prefix("Usage: ") {
            usage = Some(u.to_string());
        } else if t.is_empty() {
            first_paragraph = false;
        } else if first_paragraph || t.starts_with("tip:") {
            if listing && !what.ends_with(':') {
                what.push(',');
            }
            what.push_str(if t.starts_with("tip:") { "; " } else { " " });
            what.push_str(t);
        }
    }
    let what = what.trim_end_matches([',', ':']);
    // "longhaul bench tput [OPTIONS] ..." → help for that subcommand; an
    // error without a usage line (a bad value) names the subcommand the
    // command line gave.
    let words: Vec<&str> = usage
        .as_deref()
        .unwrap_or(path)
        .split_whitespace()
        .take_while(|w| !w.starts_with(['[', '<', '-']))
        .collect();
    let help = format!("{} --help", words.join(" "));
    match usage {
        Some(u) => format!("{what}; usage: {u} (see '{help}')"),
        None => format!("{what} (see '{help}')"),
    }
}
