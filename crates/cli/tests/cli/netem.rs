//! The WAN emulator and the matrix, for real: namespaces, TUN devices and
//! processes. These need root (or CAP_NET_ADMIN); under CI=true they fail
//! loudly instead of skipping.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::RngCore;
use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_longhaul");

fn root_or_skip(test: &str) -> bool {
    if longhaul_netem::can_run() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test} needs root or CAP_NET_ADMIN (network namespaces, TUN); CI must run as root");
    }
    eprintln!("SKIPPED {test}: needs root or CAP_NET_ADMIN");
    false
}

fn longhaul(args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Takes the named emulator down even if the test fails.
struct Down(&'static str);
impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args(["netem", "--name", self.0, "down"])
            .output();
    }
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ns_exists(ns: &str) -> bool {
    std::path::Path::new(&format!("/var/run/netns/{ns}")).exists()
}

#[test]
fn up_gives_the_configured_rtt_and_down_leaves_nothing() {
    if !root_or_skip("up_gives_the_configured_rtt_and_down_leaves_nothing") {
        return;
    }
    let name = "tping";
    let _down = Down(name);
    let (ok, out) = longhaul(&["netem", "--name", name, "up", "--delay", "10ms"]);
    assert!(ok, "{out}");
    let (ok, out) = longhaul(&["netem", "--name", name, "up", "--delay", "10ms"]);
    assert!(!ok && out.contains("already up"), "{out}");
    let (ok, out) = longhaul(&[
        "netem",
        "--name",
        name,
        "exec",
        "a",
        "--",
        "ping",
        "-c",
        "10",
        "-i",
        "0.05",
        "-q",
        "198.18.0.2",
    ]);
    assert!(ok, "{out}");
    // rtt min/avg/max/mdev = 20.1/20.2/20.4/0.1 ms
    let avg: f64 = out
        .lines()
        .find(|l| l.contains("min/avg/max"))
        .and_then(|l| l.split('=').nth(1))
        .and_then(|v| v.trim().split('/').nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ping summary in: {out}"));
    assert!(
        (avg - 20.0).abs() <= 2.0,
        "ping RTT {avg} ms, wanted 20 ± 2 ms"
    );
    // `exec` becomes the command: its PID is the one we hold, so signals reach it.
    let mut child = Command::new(BIN)
        .args(["netem", "--name", name, "exec", "b", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).starts_with("sleep"),
        "exec did not replace itself"
    );
    child.kill().unwrap();
    child.wait().unwrap();

    let (ok, out) = longhaul(&["netem", "--name", name, "status", "--json"]);
    assert!(ok, "{out}");
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    let pid = st["pid"].as_u64().unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());

    let (ok, out) = longhaul(&["netem", "--name", name, "down"]);
    assert!(ok && out.contains("down"), "{out}");
    assert!(!ns_exists("longhaul-tping-a") && !ns_exists("longhaul-tping-b"));
    let t0 = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "daemon {pid} still running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!std::path::Path::new("/run/longhaul-netem/tping").exists());
    let (ok, out) = longhaul(&["netem", "--name", name, "down"]);
    assert!(ok && out.contains("was not up"), "second down: {out}");
    let (ok, out) = longhaul(&["netem", "--name", name, "exec", "a", "--", "true"]);
    assert!(!ok && out.contains("is not up"), "exec when down: {out}");
}

#[test]
fn thirty_two_mib_through_a_lossy_wan_arrive_intact() {
    if !root_or_skip("thirty_two_mib_through_a_lossy_wan_arrive_intact") {
        return;
    }
    thirty_two_mib_through("tloss", &["--loss", "1%"], "tcp://198.18.0.2:7000", 1);
}

#[test]
fn thirty_two_mib_bonded_over_two_emulated_links_arrive_intact() {
    if !root_or_skip("thirty_two_mib_bonded_over_two_emulated_links_arrive_intact") {
        return;
    }
    thirty_two_mib_through(
        "tbond",
        &["--rate", "500mbit", "--link2", "40ms,200mbit,0.5%"],
        "tcp://198.18.0.2:7000?stripes=4&via=198.18.0.1,198.18.1.1",
        4,
    );
}

#[test]
fn thirty_two_mib_striped_over_four_lossy_lanes_arrive_intact() {
    if !root_or_skip("thirty_two_mib_striped_over_four_lossy_lanes_arrive_intact") {
        return;
    }
    thirty_two_mib_through(
        "tstripe",
        &["--loss", "1%", "--loss-back", "0.5%"],
        "tcp://198.18.0.2:7000?stripes=4",
        4,
    );
}

/// 32 MiB from side a to a hashing target on side b through a client and
/// server over the emulator (20 ms each way, `loss`), over `lanes`
/// carriers.
fn thirty_two_mib_through(name: &'static str, loss: &[&str], url: &str, lanes: usize) {
    let _down = Down(name);
    let mut up = vec!["netem", "--name", name, "up", "--delay", "20ms"];
    up.extend_from_slice(loss);
    let (ok, out) = longhaul(&up);
    assert!(ok, "{out}");
    // Target on side b: hashes what it receives.
    let (tx, rx) = std::sync::mpsc::channel();
    let target = std::thread::spawn(move || {
        longhaul_netem::enter_side(name, 'b').unwrap();
        let l = TcpListener::bind("127.0.0.1:9000").unwrap();
        tx.send(()).unwrap();
        loop {
            let (mut s, _) = l.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            if !got.is_empty() {
                s.write_all(&Sha256::digest(&got)).unwrap();
                return got.len();
            }
        }
    });
    rx.recv().unwrap();
    let ip = |side: &str, args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("longhaul-{name}-{side}"), BIN])
            .args(args);
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Kill(c.spawn().unwrap())
    };
    let _server = ip(
        "b",
        &[
            "server",
            "--listen",
            "tcp://198.18.0.2:7000",
            "--insecure",
            "--allow",
            "127.0.0.1:9000",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let _client = ip(
        "a",
        &["client", url, "--insecure", "-L", "9001:127.0.0.1:9000"],
    );
    let mut data = vec![0u8; 32 << 20];
    rand::thread_rng().fill_bytes(&mut data);
    let want = Sha256::digest(&data);
    let sender = std::thread::spawn(move || {
        longhaul_netem::enter_side(name, 'a').unwrap();
        let t0 = Instant::now();
        let mut s = loop {
            match TcpStream::connect("127.0.0.1:9001") {
                Ok(s) => break s,
                Err(_) if t0.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("forward never opened: {e}"),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(240))).unwrap();
        s.write_all(&data).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut digest = Vec::new();
        s.read_to_end(&mut digest).unwrap();
        digest
    });
    let digest = sender.join().unwrap();
    // The carriers the client has open. A lane that a lossy link made
    // fail is dialled again while the others carry on: give it a moment.
    let carriers = || {
        let ss = Command::new("ip")
            .args(["netns", "exec", &format!("longhaul-{name}-a"), "ss", "-Htn"])
            .args(["state", "established", "( dport = :7000 )"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&ss.stdout).into_owned()
    };
    let t0 = Instant::now();
    let mut ss = carriers();
    while ss.lines().count() != lanes && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
        ss = carriers();
    }
    assert_eq!(ss.lines().count(), lanes, "carriers to the server: {ss}");
    if url.contains("via=") {
        // Lanes left from both local addresses: over both links.
        for from in ["198.18.0.1:", "198.18.1.1:"] {
            assert!(ss.contains(from), "no lane from {from}: {ss}");
        }
    }
    assert_eq!(target.join().unwrap(), 32 << 20);
    assert_eq!(&digest[..], &want[..], "bytes changed on the way");
    let (_, status) = longhaul(&["netem", "--name", name, "status", "--json"]);
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    if loss.contains(&"--loss") {
        for dir in ["a_to_b", "b_to_a"] {
            assert!(
                st[dir]["lost"].as_u64().unwrap() > 0,
                "the emulator lost nothing {dir}: {status}"
            );
        }
    }
    if loss.contains(&"--link2") {
        // Both links carried data, and the second lost some.
        assert!(
            st["a_to_b"]["bytes"].as_u64().unwrap() > 1 << 20,
            "{status}"
        );
        // The lossy second link's share varies from run to run: lanes take
        // chunks as their socket has room, and a lane that lost early has
        // little for a while (270 KB to several MB seen; over 1 MiB was
        // asked before, and failed 2 runs in 10 on the build before
        // 2026-11-25's session too). That it carried data is the point.
        assert!(
            st["link2"][0]["bytes"].as_u64().unwrap() > 128 << 10,
            "{status}"
        );
        assert!(st["link2"][0]["lost"].as_u64().unwrap() > 0, "{status}");
    }
}

#[test]
fn short_matrix_writes_sane_reports() {
    if !root_or_skip("short_matrix_writes_sane_reports") {
        return;
    }
    let _down = Down("tmx");
    let dir = std::env::temp_dir().join(format!("longhaul-matrix-{}", std::process::id()));
    let (ok, out) = longhaul(&[
        "bench",
        "matrix",
        "--name",
        "tmx",
        "--delay",
        "5ms",
        "--conns",
        "1,2",
        "-t",
        "1",
        "--rr-sizes",
        "1,1000",
        "--rr-count",
        "20",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| 10 ms |")).collect();
    assert_eq!(rows.len(), 2 + 2, "2 throughput rows + 2 rr rows:\n{md}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    for c in cells {
        for side in ["direct", "tunnel"] {
            assert!(
                c[side]["total_bytes_per_sec"].as_f64().unwrap() > 0.0,
                "{c}"
            );
            let j = c[side]["jain"].as_f64().unwrap();
            assert!(j > 0.0 && j <= 1.0 + 1e-9);
        }
    }
    assert_eq!(json["rr"][0]["tunnel"]["rows"].as_array().unwrap().len(), 2);
    let svg = std::fs::read_to_string(dir.join("chart.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("</svg>") && svg.contains("<rect x="));
    assert!(!ns_exists("longhaul-tmx-a"), "matrix left its emulator up");
    let _ = std::fs::remove_dir_all(dir);
}
