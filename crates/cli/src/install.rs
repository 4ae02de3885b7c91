//! What installing longhaul as a system tool needs from the binary: shell
//! completions and manual pages (the Debian package is built from them,
//! scripts/build_deb.sh).

use crate::args::Cli;

/// `longhaul completions SHELL`.
pub(crate) fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    // Into memory first: the crate panics on a failed write (a closed
    // pipe), which must be an error like any other.
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "longhaul", &mut out);
    print_all(&out)
}

/// `longhaul man [--dir DIR]`: the main page on stdout, or a page per
/// command in DIR.
pub(crate) fn man(dir: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let cmd = <Cli as clap::CommandFactory>::command();
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .map_err(|e| anyhow::anyhow!("cannot write to {}: {e}", dir.display()))?;
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut out)?;
            print_all(&out)?;
        }
    }
    Ok(())
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
fn print_all(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
