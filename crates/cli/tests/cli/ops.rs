//! Operating a server: metrics scraped and checked against a known
//! transfer.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use common::*;

/// `GET /metrics` from `port`: the body.
fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let (head, body) = r.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn metrics_count_a_known_transfer_and_refusals() {
    let dir = tmpdir("ops-metrics");
    let files = dir.join("served");
    std::fs::create_dir_all(&files).unwrap();
    let fp = keygen(&dir.join("server.key"));
    let rw = keygen(&dir.join("rw.key"));
    keygen(&dir.join("stranger.key"));
    std::fs::write(dir.join("ak"), format!("{rw} files=rw\n")).unwrap();
    let (port, mport) = (free_port(), free_port());
    let _server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--key",
            dir.join("server.key").to_str().unwrap(),
            "--authorized-keys",
            dir.join("ak").to_str().unwrap(),
            "--files",
            files.to_str().unwrap(),
            "--metrics",
            &format!("127.0.0.1:{mport}"),
        ],
        &dir.join("server.log"),
    );
    wait_port(port);
    wait_port(mport);
    let before = scrape(mport);
    assert_eq!(value(&before, "longhaul_sessions_started_total"), 0.0);

    // A known transfer: 16 MiB up.
    let size = 16u64 << 20;
    let src = dir.join("src.bin");
    std::fs::write(&src, vec![7u8; size as usize]).unwrap();
    let cp = |key: &str| {
        Command::new(BIN)
            .args(["cp", "--key"])
            .arg(dir.join(key))
            .args(["--pin", &fp])
            .arg(&src)
            .arg(format!("127.0.0.1:{port}:/"))
            .output()
            .unwrap()
    };
    assert!(cp("rw.key").status.success());
    // A key the server does not know.
    assert!(!cp("stranger.key").status.success());

    let m = scrape(mport);
    let received = value(&m, "longhaul_received_bytes_total");
    // The file, plus the requests and block headers (4 bytes per 256 KiB).
    assert!(
        received >= size as f64 && received < size as f64 + 4096.0,
        "received {received} for a {size}-byte file"
    );
    assert_eq!(value(&m, "longhaul_sessions_started_total"), 1.0);
    assert_eq!(value(&m, "longhaul_sessions{state=\"attached\"}"), 0.0);
    assert_eq!(
        value(&m, "longhaul_refused_total{reason=\"not_authenticated\"}"),
        1.0
    );

    // Checked by a tool nobody here wrote.
    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut p) => {
            p.stdin.take().unwrap().write_all(m.as_bytes()).unwrap();
            let out = p.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(_) => {
            assert!(
                std::env::var("CI").is_err(),
                "CI installs promtool (.ci/setup)"
            );
            eprintln!("skipping the promtool check: not installed");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn status_lists_a_live_transfer() {
    let dir = tmpdir("ops-status");
    let fp = keygen(&dir.join("server.key"));
    let ck = keygen(&dir.join("c.key"));
    std::fs::write(dir.join("ak"), format!("{ck}\n")).unwrap();
    let (bench, port, local) = (free_port(), free_port(), free_port());
    let _bench = spawn(&["bench", "server", "--listen", &format!("127.0.0.1:{bench}")]);
    let ctl = |n: &str| dir.join(format!("{n}.sock"));
    let _server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--key",
            dir.join("server.key").to_str().unwrap(),
            "--authorized-keys",
            dir.join("ak").to_str().unwrap(),
            "--allow",
            &format!("127.0.0.1:{bench}"),
            "--control",
            ctl("s").to_str().unwrap(),
        ],
        &dir.join("server.log"),
    );
    wait_port(bench);
    wait_port(port);
    let _client = spawn_logged(
        &[
            "client",
            &format!("127.0.0.1:{port}"),
            "--key",
            dir.join("c.key").to_str().unwrap(),
            "--pin",
            &fp,
            "-L",
            &format!("127.0.0.1:{local}:127.0.0.1:{bench}"),
            "--control",
            ctl("c").to_str().unwrap(),
            // A PING a second, and the streams' figures at their end.
            "--dead-after",
            "3s",
            "-v",
        ],
        &dir.join("client.log"),
    );
    wait_port(local);
    let load = spawn(&["bench", "tput", &format!("127.0.0.1:{local}"), "-t", "4"]);
    let status = |sock: &Path| -> serde_json::Value {
        let out = Command::new(BIN)
            .args(["status", "--json"])
            .arg(sock)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let dest = format!("tcp://127.0.0.1:{bench}");
    // The client's side: one session, its stream to the bench server moving.
    let mut seen = None;
    wait_until(10, "the transfer in status", || {
        let v = status(&ctl("c"));
        let s = &v[0]["sessions"][0];
        let t = s["streams"]
            .as_array()
            .and_then(|a| a.iter().find(|t| t["dest"] == dest.as_str()).cloned());
        seen = t.filter(|t| t["bytes_sent"].as_u64() > Some(1 << 20));
        seen.is_some()
    });
    let seen = seen.unwrap();
    assert_eq!(seen["opened_here"], true);
    // The source: the bench client's socket.
    assert!(
        seen["local"]
            .as_str()
            .is_some_and(|l| l.starts_with("127.0.0.1:")),
        "{seen}"
    );
    let v = status(&ctl("s"));
    assert_eq!(v[0]["role"], "server");
    let t = &v[0]["sessions"][0]["streams"][0];
    assert_eq!(t["dest"], dest.as_str());
    assert_eq!(t["opened_here"], false);
    assert!(t["bytes_received"].as_u64() > Some(1 << 20), "{v}");
    // The socket is its user's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(ctl("s")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(load);
    // On loopback the round trip is well under a millisecond: status
    // shows what PINGs measure, not the window's floor.
    wait_until(15, "a loopback RTT under 1 ms in status", || {
        let v = status(&ctl("c"));
        v[0]["sessions"][0]["rtt_ms"]
            .as_f64()
            .is_some_and(|r| r > 0.0 && r < 1.0)
    });
    // -v: each stream's bytes at its end.
    wait_until(15, "the stream's figures at its end", || {
        let log = std::fs::read_to_string(dir.join("client.log")).unwrap_or_default();
        log.lines()
            .any(|l| l.contains("stream closed") && l.contains("sent=") && l.contains("received="))
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// `longhaul bench rr` through a forward: whether a round trip works.
fn round_trip(port: u16) -> bool {
    Command::new(BIN)
        .args([
            "bench",
            "rr",
            &format!("127.0.0.1:{port}"),
            "--sizes",
            "100",
            "-n",
            "3",
        ])
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn a_config_file_runs_the_server_and_sighup_reloads_keys_live() {
    let dir = tmpdir("ops-reload");
    let fp = keygen(&dir.join("server.key"));
    let a = keygen(&dir.join("a.key"));
    let b = keygen(&dir.join("b.key"));
    let (bench, port) = (free_port(), free_port());
    let _bench = spawn(&["bench", "server", "--listen", &format!("127.0.0.1:{bench}")]);
    let ak = dir.join("authorized_keys");
    std::fs::write(&ak, format!("{a} # a\n")).unwrap();
    let cfg = dir.join("server.toml");
    let good = format!(
        "# a server from a file\nlisten = [\"127.0.0.1:{port}\"]\nkey = \"{}\"\nauthorized-keys = \"{}\"\nallow = [\"127.0.0.1:{bench}\"]\ncontrol = \"{}\"\n",
        dir.join("server.key").display(),
        ak.display(),
        dir.join("server.sock").display()
    );
    std::fs::write(&cfg, &good).unwrap();

    // A bad file is refused at start, naming the line.
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        format!("{good}\nallow_all = true\nlisten-on = \"x\"\n"),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["server", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml:9: unknown key 'listen-on'"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let log = dir.join("server.log");
    let server = spawn_logged(&["server", "--config", cfg.to_str().unwrap()], &log);
    wait_port(bench);
    wait_port(port);
    let client = |key: &str, local: u16| {
        spawn_logged(
            &[
                "client",
                &format!("127.0.0.1:{port}"),
                "--key",
                dir.join(key).to_str().unwrap(),
                "--pin",
                &fp,
                "-L",
                &format!("127.0.0.1:{local}:127.0.0.1:{bench}"),
                "--control",
                "none",
            ],
            &dir.join(format!("{key}.log")),
        )
    };
    let (la, lb) = (free_port(), free_port());
    let mut ca = client("a.key", la);
    wait_port(la);
    assert!(
        round_trip(la),
        "key a, configured in the file, gets through"
    );
    let mut cb = client("b.key", lb);
    wait_until(10, "client b refused", || {
        cb.0.try_wait().unwrap().is_some()
    });

    // Swap the keys and reload: a's session ends, b gets in.
    std::fs::write(&ak, format!("{b} # b\n")).unwrap();
    let hup = || {
        assert!(Command::new("kill")
            .args(["-HUP", &server.pid().to_string()])
            .status()
            .unwrap()
            .success())
    };
    // `longhaul reload` (the control channel) says how it went.
    let reload = || {
        Command::new(BIN)
            .arg("reload")
            .arg(dir.join("server.sock"))
            .output()
            .unwrap()
    };
    let out = reload();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.starts_with("server pid "), "{said}");
    assert!(
        said.contains("reloaded rules, authorized keys and token (1 session(s) ended)"),
        "{said}"
    );
    wait_until(10, "a's session closed by the reload", || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("closing the session after the reload: key")
    });
    assert!(!round_trip(la), "a removed key keeps no access");
    cb = client("b.key", lb);
    wait_port(lb);
    assert!(round_trip(lb), "key b, added by the reload, gets through");

    // A broken file on reload: the old configuration stays.
    std::fs::write(&cfg, format!("{good}\nlisen = 1\n")).unwrap();
    let out = reload();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("reload failed, keeping the configuration in force"),
        "{said}"
    );
    assert!(
        said.contains("server.toml:8: unknown key 'lisen'"),
        "{said}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 of 1 server(s) kept their configuration"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(10, "the failed reload logged", || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("reload failed, keeping the configuration in force")
    });
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .contains("server.toml:8: unknown key 'lisen'"));
    assert!(round_trip(lb), "still served after a failed reload");

    // Rules that no longer allow an open stream end its session.
    let held = std::net::TcpStream::connect(("127.0.0.1", lb)).unwrap();
    let other = free_port();
    std::fs::write(
        &cfg,
        good.replace(&format!("127.0.0.1:{bench}"), &format!("127.0.0.1:{other}")),
    )
    .unwrap();
    // Loopback opens the stream through the tunnel in milliseconds.
    std::thread::sleep(std::time::Duration::from_millis(500));
    hup();
    let want = format!("the rules no longer allow its stream to tcp://127.0.0.1:{bench}");
    wait_until(10, "the session closed for its stream", || {
        std::fs::read_to_string(&log).unwrap().contains(&want)
    });
    drop(held);
    let _ = ca.0.kill();
    drop((ca, cb));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn logs_have_no_colours_in_a_file_and_can_be_json() {
    let dir = tmpdir("ops-logs");
    for (format, check) in [("text", 0), ("json", 1)] {
        let port = free_port();
        let log = dir.join(format!("{format}.log"));
        let p = spawn_logged(
            &[
                "--log-format",
                format,
                "bench",
                "server",
                "--listen",
                &format!("127.0.0.1:{port}"),
            ],
            &log,
        );
        wait_port(port);
        // The port opens a moment before the line reaches the file.
        wait_until(10, "the listening line in the log", || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("bench server listening")
        });
        drop(p);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("bench server listening"), "{text}");
        assert!(
            !text.contains('\x1b'),
            "ANSI escapes in a log file: {text:?}"
        );
        if check == 1 {
            for line in text.lines() {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                assert!(v["level"].is_string(), "{line}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Debian's headless browser, if installed (`.ci/setup` installs it).
fn chromium() -> Option<&'static str> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// The page at `url` as a headless Chromium renders it after its script
/// has run for a while.
fn rendered(browser: &str, url: &str) -> String {
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=3000",
            "--dump-dom",
            url,
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `data-bytes` of the element with `id` in a dumped page.
fn data_bytes(dom: &str, id: &str) -> Option<u64> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let rest = &dom[at..];
    let v = &rest[rest.find("data-bytes=\"")? + 12..];
    v[..v.find('"')?].parse().ok()
}

#[test]
fn the_dashboard_shows_a_live_transfer_in_a_real_browser() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var("CI").is_err(),
            "CI must have chromium (.ci/setup)"
        );
        eprintln!("SKIPPED: no chromium");
        return;
    };
    let dir = tmpdir("ops-dashboard");
    let (bench, port, local, mport) = (free_port(), free_port(), free_port(), free_port());
    let _bench = spawn(&["bench", "server", "--listen", &format!("127.0.0.1:{bench}")]);
    let _server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("tcp://127.0.0.1:{port}"),
            "--insecure",
            "--allow",
            &format!("127.0.0.1:{bench}"),
            "--metrics",
            &format!("127.0.0.1:{mport}"),
            "--control",
            "none",
        ],
        &dir.join("server.log"),
    );
    wait_port(bench);
    wait_port(port);
    wait_port(mport);
    let _client = spawn_logged(
        &[
            "client",
            &format!("tcp://127.0.0.1:{port}"),
            "--insecure",
            "-L",
            &format!("{local}:127.0.0.1:{bench}"),
            "--control",
            "none",
        ],
        &dir.join("client.log"),
    );
    wait_port(local);
    // A transfer through the tunnel while the page is looked at.
    let _load = spawn(&["bench", "tput", &format!("127.0.0.1:{local}"), "-t", "10"]);
    let url = format!("http://127.0.0.1:{mport}/");
    let mut seen = vec![];
    for _ in 0..2 {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let dom = rendered(browser, &url);
        assert!(
            dom.contains(&format!("tcp://127.0.0.1:{bench}")),
            "the stream's destination is not on the page: {dom}"
        );
        assert!(
            dom.contains("Sessions (<span id=\"session-count\">1</span>)"),
            "{dom}"
        );
        seen.push(data_bytes(&dom, "total-received").unwrap_or(0));
    }
    assert!(
        seen[0] > 0 && seen[1] > seen[0],
        "the numbers on the page do not move: {seen:?}"
    );
    // Only its own script may run, and the page is not framed.
    let mut s = TcpStream::connect(("127.0.0.1", mport)).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut head = String::new();
    let _ = s.read_to_string(&mut head);
    assert!(
        head.contains("Content-Security-Policy: default-src 'none'; script-src 'self'"),
        "{head}"
    );
    // A page elsewhere whose name was pointed here (DNS rebinding) is refused.
    let mut s = TcpStream::connect(("127.0.0.1", mport)).unwrap();
    s.write_all(b"GET /status.json HTTP/1.1\r\nHost: evil.example:80\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 421"), "{answer}");
    let _ = std::fs::remove_dir_all(&dir);
}
