//! Names the commit the binary is built from, for `longhaul --version`:
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
    // Built again when HEAD moves (a commit, a checkout).
    if let Ok(out) = Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .output()
    {
        if let Ok(dir) = String::from_utf8(out.stdout) {
            let dir = std::path::Path::new(dir.trim());
            println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
            if let Ok(head) = std::fs::read_to_string(dir.join("HEAD")) {
                // A branch's commit is in its ref file, or in packed-refs
                // once git has packed it (a path that does not exist would
                // run this script on every build).
                let r = head.trim().strip_prefix("ref: ").map(|r| dir.join(r));
                for f in r.into_iter().chain([dir.join("packed-refs")]) {
                    if f.exists() {
                        println!("cargo:rerun-if-changed={}", f.display());
                    }
                }
            }
        }
    }
}
