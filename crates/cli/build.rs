//! Names the commit the binary is built from (and its target), for `longhaul --version`:
//! `LONGHAUL_COMMIT` if set (a package built from a tarball), else the
//! checkout's HEAD, else "unknown". Uncommitted changes are not marked:
//! watching the index for them would rebuild on every `git status`.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=LONGHAUL_COMMIT");
    let from_env = std::env::var("LONGHAUL_COMMIT")
        .ok()
        .filter(|s| !s.is_empty());
    let from_git = || {
        let out = Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        let s = String::from_utf8(out.stdout).ok()?;
        let s = s.trim();
        (out.status.success() && !s.is_empty()).then(|| s.to_string())
    };
    let commit = from_env
        .or_else(from_git)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LONGHAUL_COMMIT=commit {commit}");
    // The system it was built for: a Windows, macOS or FreeBSD user
    // reporting a bug says which build they run.
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=LONGHAUL_TARGET={target}");
    // Built again when HEAD moves (a commit, a checkout).
    // Not a checkout (a tarball, a vendored build): nothing to watch; a
    // path that does not exist would run this script on every build.
    let git = |arg: &str| {
        let out = Command::new("git").args(["rev-parse", arg]).output().ok()?;
        let s = String::from_utf8(out.stdout).ok()?;
        let s = s.trim();
        (out.status.success() && !s.is_empty()).then(|| std::path::PathBuf::from(s))
    };
    let (Some(dir), Some(common)) = (git("--git-dir"), git("--git-common-dir")) else {
        return;
    };
    let head = dir.join("HEAD");
    println!("cargo:rerun-if-changed={}", head.display());
    // A branch's commit is in its ref file, or in packed-refs once git has
    // packed it; both in the common folder (a worktree has its own HEAD).
    let branch = std::fs::read_to_string(&head)
        .ok()
        .and_then(|h| h.trim().strip_prefix("ref: ").map(|r| common.join(r)));
    for f in branch.into_iter().chain([common.join("packed-refs")]) {
        if f.exists() {
            println!("cargo:rerun-if-changed={}", f.display());
        }
    }
}
