//! What every crate's integration-test binary shares (each includes this
//! file from its `common` module with `#[path]`): one place, no crate.

/// Whether the calling test should run here: false in the test binary's
/// ordinary run, which instead runs `test` (its full name, as
/// `module_path!()` and the function name give it) in a process of its own
/// and asserts that it passed. For tests that read this process's own
/// counters (peak RSS, open descriptors, CPU time), which the binary's other
/// tests would disturb: each crate's integration tests share one binary.
pub fn alone(module: &str, test: &str) -> bool {
    const MARK: &str = "LONGHAUL_TEST_ALONE";
    if std::env::var_os(MARK).is_some() {
        return true;
    }
    // Test names leave out the binary's own name.
    let module = module.split_once("::").map_or("", |(_, rest)| rest);
    let name = format!("{module}::{test}");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(MARK, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} failed in its own process");
    assert!(stdout.contains("1 passed"), "{name} did not run: {stdout}");
    false
}
