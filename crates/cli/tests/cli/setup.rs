//! `.ci/setup` must not harm the machine it sets up (root): it is run in a
//! mount namespace whose /usr/sbin is a scratch folder, with every command
//! it may call replaced by a stub that records the call. It may install
//! packages; it must never start, stop or kill a service, and it keeps no
//! daemon from starting except with a policy-rc.d of its own, only while
//! installing, never one it found.

use std::path::{Path, PathBuf};
use std::process::Command;

const SETUP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.ci/setup");

/// What an installer may be asked, and what must never be run.
const STUBS: &[(&str, &str)] = &[
    ("id", "echo 0"),
    // Not installed: set-up must install it.
    ("dpkg", "exit 1"),
    ("cargo", "echo 'cargo 0.0.0 (stub)'"),
    (
        "apt-get",
        r#"if [ -x /usr/sbin/policy-rc.d ]; then /usr/sbin/policy-rc.d nginx start; p=$?; else p=none; fi
echo "apt-get $* policy=$p" >>"$LOG"
case " $* " in *" nginx "*)
  printf '#!/bin/sh\necho "FORBIDDEN /usr/sbin/nginx $*" >>"$LOG"\n' >/usr/sbin/nginx
  chmod 755 /usr/sbin/nginx;;
esac"#,
    ),
    (
        "deb-systemd-helper",
        r#"echo "BOOT deb-systemd-helper $*" >>"$LOG""#,
    ),
    ("update-rc.d", r#"echo "BOOT update-rc.d $*" >>"$LOG""#),
];
const FORBIDDEN: &[&str] = &[
    "service",
    "systemctl",
    "invoke-rc.d",
    "start-stop-daemon",
    "pkill",
    "killall",
];
/// Real programs a shell script needs.
const TOOLS: &[&str] = &["rm", "chmod", "cat"];

/// Runs `.ci/setup` in the sandbox; the calls it made.
fn run_setup(name: &str, policy: Option<&str>) -> Option<(String, PathBuf)> {
    let root = std::env::temp_dir().join(format!("lh-setup-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (bin, sbin) = (root.join("bin"), root.join("sbin"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&sbin).unwrap();
    let script = |p: &Path, body: &str| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    for (n, body) in STUBS {
        script(&bin.join(n), body);
    }
    for n in FORBIDDEN {
        script(
            &bin.join(n),
            &format!("echo \"FORBIDDEN {n} $*\" >>\"$LOG\""),
        );
    }
    for n in TOOLS {
        std::os::unix::fs::symlink(Path::new("/bin").join(n), bin.join(n)).unwrap();
    }
    if let Some(p) = policy {
        script(&sbin.join("policy-rc.d"), p);
    }
    let log = root.join("calls");
    std::fs::write(&log, "").unwrap();
    let inner = format!(
        "mount --bind {} /usr/sbin && exec env -i PATH={} HOME={} LOG={} /bin/bash {SETUP}",
        sbin.display(),
        bin.display(),
        root.display(),
        log.display()
    );
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            &inner,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && err.contains("unshare failed") {
        assert!(std::env::var("CI").is_err(), "CI runs as root: {err}");
        eprintln!("SKIPPED: no mount namespace here: {err}");
        return None;
    }
    assert!(out.status.success(), "setup failed: {err}");
    Some((std::fs::read_to_string(&log).unwrap(), root))
}

fn root_or_skip() -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return true;
    }
    assert!(std::env::var("CI").is_err(), "CI must run as root");
    eprintln!("SKIPPED: needs root");
    false
}

#[test]
fn setup_installs_and_never_starts_stops_or_kills_a_service() {
    if !root_or_skip() {
        return;
    }
    let Some((calls, root)) = run_setup("fresh", None) else {
        return;
    };
    assert!(!calls.contains("FORBIDDEN"), "{calls}");
    let installs: Vec<&str> = calls
        .lines()
        .filter(|l| l.starts_with("apt-get install"))
        .collect();
    assert!(installs.iter().any(|l| l.contains(" nginx ")), "{calls}");
    assert!(
        installs.iter().any(|l| l.contains(" prometheus ")),
        "{calls}"
    );
    // No daemon could start while installing…
    for l in &installs {
        assert!(l.ends_with("policy=101"), "{l}\n{calls}");
    }
    // …and the policy that kept them from it is gone afterwards.
    assert!(
        !root.join("sbin/policy-rc.d").exists(),
        "set-up left its policy-rc.d behind"
    );
    // What it installed does not start at boot; nothing else is touched.
    for l in calls.lines().filter(|l| l.starts_with("BOOT")) {
        assert!(l.contains(" disable"), "{l}\n{calls}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn setup_leaves_an_existing_policy_rc_d_alone() {
    if !root_or_skip() {
        return;
    }
    // The machine's owner lets daemons start.
    let theirs = "# the owner's\nexit 0";
    let Some((calls, root)) = run_setup("policy", Some(theirs)) else {
        return;
    };
    assert!(!calls.contains("FORBIDDEN"), "{calls}");
    for l in calls.lines().filter(|l| l.starts_with("apt-get install")) {
        assert!(l.ends_with("policy=0"), "{l}\n{calls}");
    }
    let after = std::fs::read_to_string(root.join("sbin/policy-rc.d")).unwrap();
    assert_eq!(after, format!("#!/bin/sh\n{theirs}\n"));
    let _ = std::fs::remove_dir_all(&root);
}
