//! The `longhaul` binary as a user runs it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::common;

use common::*;

fn run_err(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn wrong_arguments_get_one_line_that_says_what_to_do() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["client", "127.0.0.1:1", "-L", "nonsense"],
            "expected [udp:][BIND:]PORT:HOST:HOSTPORT",
        ),
        (
            &["client", "127.0.0.1:1", "-D", "a:b:c"],
            "expected [BIND:]PORT",
        ),
        (&["server", "--listen", "nowhere"], "needs HOST:PORT"),
        (
            &["client", "http://x:1", "-L", "1:a:1"],
            "unknown carrier scheme",
        ),
        (
            &["client", "x:1", "--pin", "SHA256:short", "-L", "1:a:1"],
            "not a key fingerprint",
        ),
        (
            &["server", "--listen", "127.0.0.1:0", "--allow", "x y:1"],
            "expected [udp:]HOST:PORT",
        ),
        (
            &[
                "server",
                "--listen",
                "127.0.0.1:0",
                "--allow-bind",
                "host:1",
            ],
            "is not an IP address",
        ),
        (&["bench", "tput", "127.0.0.1:1", "-P", "0"], "--parallel"),
        (&["frobnicate"], "unrecognized subcommand"),
        (
            &["client", "tcp://x:1?stripes=99", "-L", "1:a:1"],
            "give a number of lanes from 1 to 16",
        ),
        (
            &["client", "tcp://x:1?lanes=2", "-L", "1:a:1"],
            "the options are ?stripes=K&via=IP1,IP2",
        ),
        (
            &["client", "tcp://x:1?stripes=2&via=nowhere", "-L", "1:a:1"],
            "is not an IP address",
        ),
        (&["netem", "up", "--link2", "30ms,fast"], "is not a rate"),
        (
            &["client", "dir:///srv/share?poll=fast", "-L", "1:a:1"],
            "or dir://PATH?poll=DURATION",
        ),
        (
            &["server", "--listen", "dir:///srv/share?stripes=2"],
            "unknown option 'stripes=2'",
        ),
        (
            &["server", "--listen", "127.0.0.1:0", "--max-stripes", "0"],
            "give a number of lanes from 1 to 16",
        ),
        // A required argument left out is named, with the usage.
        (
            &["server"],
            "not provided: --listen <URL>; usage: longhaul server --listen <URL> (see 'longhaul server --help')",
        ),
        (&["client"], "not provided: <SERVER>; usage: longhaul client"),
        (&["bench", "tput"], "see 'longhaul bench tput --help'"),
        (&["client", "x:1", "--stripe", "2"], "similar argument exists: '--stripes'"),
        (&["completions", "tcsh"], "[possible values: bash,"),
        (
            &["server", "--listen", "127.0.0.1:0", "--max-stripes", "0"],
            "(see 'longhaul server --help')",
        ),
    ];
    for (args, want) in cases {
        let (code, err) = run_err(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?} printed more than one line:\n{err}"
        );
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn a_windows_service_is_refused_here_in_one_line() {
    let out = Command::new(BIN)
        .args(["service", "install", "server", "--listen", "127.0.0.1:1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("registers Windows services"), "{err}");
    assert!(err.contains("systemd"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn version_completions_and_manual_pages() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    let version = String::from_utf8(out.stdout).unwrap();
    assert!(version.starts_with("longhaul "), "{version}");
    assert!(version.contains("(commit "), "{version}");
    let target = format!("{}-", std::env::consts::ARCH);
    assert!(version.contains(&target), "no target named: {version}");

    for (shell, want) in [
        ("bash", "complete -F _longhaul"),
        ("zsh", "#compdef longhaul"),
        ("fish", "complete -c longhaul"),
    ] {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(want), "{shell}: no {want:?}");
        // Subcommands and their options are in it.
        assert!(
            text.contains("stripes") && text.contains("allow-bind"),
            "{shell}"
        );
    }

    let out = Command::new(BIN).arg("man").output().unwrap();
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.contains(".TH longhaul 1"), "{page}");
    let dir = tmpdir("man");
    let st = Command::new(BIN)
        .args(["man", "--dir"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    for page in [
        "longhaul.1",
        "longhaul-server.1",
        "longhaul-client.1",
        "longhaul-bench-udp.1",
    ] {
        let text = std::fs::read_to_string(dir.join(page)).unwrap();
        assert!(text.contains(".SH SYNOPSIS"), "{page}");
    }
    // man(1) reads them, where it is installed.
    if let Ok(out) = Command::new("man")
        .arg("-l")
        .arg(dir.join("longhaul-server.1"))
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
    {
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("--listen"), "{text}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn client_with_nothing_to_forward_or_no_server_fails_clearly() {
    let (code, err) = run_err(&["client", "127.0.0.1:1"]);
    assert_eq!(code, 1);
    assert!(err.contains("nothing to forward"), "{err}");
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (code, err) = run_err(&["client", &dead.to_string(), "-L", "0:127.0.0.1:1"]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot connect to server"), "{err}");
}

#[test]
fn a_folder_that_is_not_there_fails_clearly() {
    // Unencrypted (asked for twice), so that no key is needed to get there.
    let missing = "dir:///nonexistent/longhaul-share?tls=off";
    for args in [
        &["server", "--listen", missing, "--insecure", "--allow-all"][..],
        &["client", missing, "--insecure", "-L", "0:127.0.0.1:1"][..],
    ] {
        let (code, err) = run_err(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains("create it or mount the share there"),
            "{args:?}: {err}"
        );
    }
}

/// `longhaul keygen --out DIR/NAME`; returns the path and the printed fingerprint.
fn keygen(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, String) {
    let path = dir.join(name);
    let out = Command::new(BIN)
        .args(["keygen", "--out", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let fp = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(fp.starts_with("SHA256:"), "{fp}");
    (path, fp)
}

#[test]
fn server_and_client_processes_forward_intact_and_exit_on_refused_bind() {
    // Target: hashes what it receives and sends its own data back.
    let target = TcpListener::bind("127.0.0.1:0").unwrap();
    let tport = target.local_addr().unwrap().port();
    let mut reply = vec![0u8; 8 << 20];
    rand::thread_rng().fill_bytes(&mut reply);
    let reply_hash = Sha256::digest(&reply);
    let t = std::thread::spawn(move || loop {
        // Skip the empty connection that `wait_port` makes through the forward.
        let (mut s, _) = target.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        if got.is_empty() {
            continue;
        }
        s.write_all(&reply).unwrap();
        return Sha256::digest(&got);
    });
    // Keys made by the CLI itself; the client is authorized by its key and
    // pins the server's.
    let dir = tmpdir("procs");
    let _gone = RemovedOnDrop(dir.clone());
    let (skey, sfp) = keygen(&dir, "server.key");
    let (ckey, cfp) = keygen(&dir, "client.key");
    let ak = dir.join("authorized_keys");
    std::fs::write(&ak, format!("{cfp} # test client\n")).unwrap();
    let sport = free_port();
    let lport = free_port();
    let _server = spawn(&[
        "server",
        "--listen",
        &format!("tls://127.0.0.1:{sport}"),
        "--key",
        skey.to_str().unwrap(),
        "--authorized-keys",
        ak.to_str().unwrap(),
        "--allow",
        &format!("127.0.0.1:{tport}"),
    ]);
    wait_port(sport);
    let url = format!("tls://127.0.0.1:{sport}");
    let _client = spawn(&[
        "client",
        &url,
        "--key",
        ckey.to_str().unwrap(),
        "--pin",
        &sfp,
        "-L",
        &format!("{lport}:127.0.0.1:{tport}"),
    ]);
    wait_port(lport);
    let mut data = vec![0u8; 8 << 20];
    rand::thread_rng().fill_bytes(&mut data);
    let mut s = TcpStream::connect(("127.0.0.1", lport)).unwrap();
    s.write_all(&data).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(Sha256::digest(&got), reply_hash);
    assert_eq!(t.join().unwrap(), Sha256::digest(&data));

    // -R to a port the server does not allow: the client exits non-zero, one line.
    let mut c = spawn(&[
        "client",
        &url,
        "--key",
        ckey.to_str().unwrap(),
        "--pin",
        &sfp,
        "-R",
        &format!("{}:127.0.0.1:{tport}", free_port()),
    ]);
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = c.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "client did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut err = String::new();
    c.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(
        err.contains("server refused -R") && err.contains("not allowed"),
        "{err}"
    );
    // It names the fix, once ("not allowed: not allowed" no more).
    assert!(err.contains("--allow-bind"), "{err}");
    assert!(!err.contains("not allowed: not allowed"), "{err}");
}

#[test]
fn bench_commands_measure_and_report_json() {
    let port = free_port();
    let _bench = spawn(&["bench", "server", "--listen", &format!("127.0.0.1:{port}")]);
    wait_port(port);
    let addr = format!("127.0.0.1:{port}");
    let out = Command::new(BIN)
        .args(["bench", "tput", &addr, "-P", "3", "-t", "0.5", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["streams"].as_array().unwrap().len(), 3);
    assert!(v["total_bytes"].as_u64().unwrap() > 0);
    let jain = v["jain"].as_f64().unwrap();
    assert!(jain > 0.33 && jain <= 1.0 + 1e-9, "{jain}");

    let out = Command::new(BIN)
        .args([
            "bench",
            "rr",
            &addr,
            "--sizes",
            "1,1k,100000",
            "-n",
            "50",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let sizes: Vec<u64> = rows.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, vec![1, 1024, 100_000]);
    for r in rows {
        assert_eq!(r["count"].as_u64(), Some(50));
        assert!(r["p50_us"].as_f64().unwrap() > 0.0);
        assert!(r["p99_us"].as_f64().unwrap() >= r["p50_us"].as_f64().unwrap());
    }
    let (code, err) = run_err(&["bench", "rr", &addr, "--sizes", "1,99999999"]);
    assert_eq!(code, 2);
    assert!(err.contains("16 MiB limit"), "{err}");

    // Seed 003's table: every block acknowledged, whatever the depth.
    let out = Command::new(BIN)
        .args([
            "bench", "goodput", &addr, "--sizes", "4k,1m", "--depth", "1,4", "--total", "8m", "-t",
            "0.3", "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        let size = r["size"].as_u64().unwrap();
        let cells = r["cells"].as_array().unwrap();
        let depths: Vec<u64> = cells.iter().map(|c| c["depth"].as_u64().unwrap()).collect();
        assert_eq!(depths, vec![1, 4]);
        for c in cells {
            let (blocks, bytes) = (c["blocks"].as_u64().unwrap(), c["bytes"].as_u64().unwrap());
            assert!(
                blocks > 0 && bytes == blocks * size && bytes <= 8 << 20,
                "{c}"
            );
            assert!(c["goodput_bps"].as_f64().unwrap() > 0.0);
        }
    }
}

#[test]
fn unknown_congestion_control_is_refused_at_start() {
    let (code, err) = run_err(&[
        "server",
        "--listen",
        "tcp://127.0.0.1:0",
        "--insecure",
        "--allow-all",
        "--congestion",
        "nosuchcc",
    ]);
    assert_eq!(code, 1);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("congestion control 'nosuchcc' unavailable"),
        "{err}"
    );
}

#[test]
fn cmd_carrier_runs_a_stdio_server_and_carries_data_intact() {
    // An echo target the stdio server may reach.
    let target = TcpListener::bind("127.0.0.1:0").unwrap();
    let tport = target.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in target.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    let lport = free_port();
    // The same shape as `cmd://ssh far longhaul server --stdio ...`, minus ssh.
    let cmd = format!("cmd://{BIN} -q server --stdio --allow 127.0.0.1:{tport}");
    let mut client = spawn(&["client", &cmd, "-L", &format!("{lport}:127.0.0.1:{tport}")]);
    wait_port(lport);
    let mut data = vec![0u8; 16 << 20];
    rand::thread_rng().fill_bytes(&mut data);
    let mut s = TcpStream::connect(("127.0.0.1", lport)).unwrap();
    let mut w = s.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || {
        w.write_all(&sent).unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    assert_eq!(Sha256::digest(&got), Sha256::digest(&data));
    // The client owns the server process: stopping the client ends it.
    let _ = client.0.kill();
    let _ = client.0.wait();
}

/// A load balancer's TCP check (connect, then close or reset before a
/// byte) costs neither a log line nor a refusal; a connection that sends
/// something wrong is still logged.
#[test]
fn connection_checks_are_not_logged() {
    let dir = tmpdir("checks");
    let (key, _) = keygen(&dir, "s.key");
    for scheme in ["tcp", "tls"] {
        let port = free_port();
        let log = dir.join(format!("{scheme}.log"));
        let listen = format!("{scheme}://127.0.0.1:{port}");
        let _server = spawn_logged(
            &[
                "server",
                "--listen",
                &listen,
                "--key",
                key.to_str().unwrap(),
                "--insecure",
                "--allow",
                "127.0.0.1:1",
                "--control",
                "none",
            ],
            &log,
        );
        wait_port(port);
        for i in 0..10 {
            let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            if i % 2 == 1 {
                // A reset rather than a FIN (SO_LINGER 0).
                socket2::SockRef::from(&s)
                    .set_linger(Some(Duration::ZERO))
                    .unwrap();
            }
            drop(s);
        }
        // One byte then a close, and a wrong request: both still logged.
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"G").unwrap();
        drop(s);
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        let refusals = || {
            let text = std::fs::read_to_string(&log).unwrap();
            let n = text
                .lines()
                .filter(|l| l.contains("refused carrier"))
                .count();
            (n, text)
        };
        let t0 = Instant::now();
        while refusals().0 < 2 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        // Anything the checks would have logged is in by now.
        std::thread::sleep(Duration::from_millis(300));
        let (n, text) = refusals();
        assert_eq!(n, 2, "{scheme}: a line for each bad client only:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_readme_quick_start_runs_word_for_word() {
    let readme = include_str!("../../../../README.md");
    let block = readme
        .split("<!-- quick-start -->")
        .nth(1)
        .and_then(|b| b.split("<!-- /quick-start -->").next())
        .expect("the README has a quick start");
    let script: String = block
        .lines()
        .filter(|l| !l.starts_with("```"))
        .map(|l| format!("{l}\n"))
        .collect();
    let dir = std::env::temp_dir().join(format!("lh-quick-start-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The lines as they are; what they start in the background is ended
    // with them.
    let wrapped = format!("set -e\ntrap 'kill $(jobs -p) 2>/dev/null' EXIT\n{script}");
    let out = Command::new("bash")
        .arg("-c")
        .arg(&wrapped)
        .current_dir(&dir)
        .env("PATH", path)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("bit/s"), "no throughput reported: {stdout}");
    // The client said what it did.
    assert!(stderr.contains("server key SHA256:"), "{stderr}");
    assert!(stderr.contains("authenticated with the token"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_refused_first_session_says_who_refused_what_and_the_fix_once() {
    let dir = tmpdir("refused-start");
    let (skey, fp) = keygen(&dir, "s.key");
    let (_, allowed) = keygen(&dir, "c.key");
    let (other, other_fp) = keygen(&dir, "other.key");
    std::fs::write(dir.join("ak"), format!("{allowed}\n")).unwrap();
    let port = free_port();
    let _server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--key",
            skey.to_str().unwrap(),
            "--authorized-keys",
            dir.join("ak").to_str().unwrap(),
            "--allow",
            "127.0.0.1:1",
            "--control",
            "none",
        ],
        &dir.join("server.log"),
    );
    wait_port(port);
    let client = |server: &str, auth: &[&str]| {
        let mut args = vec![
            "client",
            server,
            "--pin",
            &fp,
            "-L",
            "0:127.0.0.1:1",
            "--no-reconnect",
            "--control",
            "none",
        ];
        args.extend_from_slice(auth);
        let (code, err) = run_err(&args);
        assert_ne!(code, 0);
        err
    };
    let addr = format!("127.0.0.1:{port}");
    let err = client(&addr, &["--key", other.to_str().unwrap()]);
    assert!(err.contains("did not let us in"), "{err}");
    assert!(
        err.contains(&other_fp) && err.contains("--authorized-keys"),
        "{err}"
    );
    // Said once, without the TLS library's words or links.
    assert!(
        !err.contains("docs.rs") && !err.contains("close_notify"),
        "{err}"
    );
    let err = client(&addr, &["--token", "wrong"]);
    assert!(
        err.contains("with the token") && err.contains("LONGHAUL_TOKEN"),
        "{err}"
    );
    // ws:// against a TLS listener says so.
    let err = client(&format!("ws://127.0.0.1:{port}/x"), &["--token", "wrong"]);
    assert!(err.contains("answers in TLS"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
