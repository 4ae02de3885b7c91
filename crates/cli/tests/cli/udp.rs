//! UDP through the real binaries: `dig` asks a real resolver (dnsmasq,
//! started by the test on loopback with options of its own, never a system
//! service) through `longhaul client -L udp:`, a server whose rules do
//! not allow UDP to the resolver answers nothing and says why, and `bench
//! udp` measures a direct path and a forward.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

fn dnsmasq() -> Option<&'static str> {
    ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

fn have_dig() -> bool {
    Command::new("dig")
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A port free for both UDP and TCP (dnsmasq listens on both).
fn free_dual_port() -> u16 {
    loop {
        let p = free_udp_port();
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
}

/// A resolver on 127.0.0.1:`port` that answers every name under `lh.test`
/// with 198.18.0.7 and knows nothing else (no upstream, no hosts file).
fn resolver(bin: &str, port: u16, dir: &Path) -> Kill {
    let child = Command::new(bin)
        .args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            "--address=/lh.test/198.18.0.7",
        ])
        .arg(format!("--port={port}"))
        .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("dnsmasq.log")).unwrap())
        .spawn()
        .unwrap();
    Kill(child)
}

/// Waits until the resolver answers; says what it logged if it never does.
fn wait_resolver(port: u16, dir: &Path) {
    let t = std::time::Instant::now();
    while dig(port, "direct.lh.test", 1, 1) != "198.18.0.7" {
        let log = std::fs::read_to_string(dir.join("dnsmasq.log")).unwrap_or_default();
        assert!(t.elapsed().as_secs() < 30, "dnsmasq never answered: {log}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `dig @127.0.0.1 -p PORT NAME +short`, each try waiting `secs`.
fn dig(port: u16, name: &str, tries: u32, secs: u32) -> String {
    let out = Command::new("dig")
        .arg("@127.0.0.1")
        .args(["-p", &port.to_string(), name, "A", "+short"])
        .arg(format!("+tries={tries}"))
        .arg(format!("+time={secs}"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Starts a server allowing `allow` and a client with `-L udp:` to the
/// resolver; returns both and the forward's port.
fn tunnel(dir: &Path, allow: &str, dns: u16) -> (Kill, Kill, u16) {
    let sport = free_port();
    let listen = format!("tcp://127.0.0.1:{sport}");
    let server = spawn_logged(
        &[
            "server",
            "--listen",
            &listen,
            "--insecure",
            "--allow",
            allow,
            "--control",
            "none",
        ],
        &dir.join("server.log"),
    );
    wait_port(sport);
    let lport = free_udp_port();
    let fwd = format!("udp:{lport}:127.0.0.1:{dns}");
    let log = dir.join("client.log");
    let client = spawn_logged(
        &[
            "client",
            &listen,
            "--insecure",
            "-L",
            &fwd,
            "--control",
            "none",
        ],
        &log,
    );
    wait_until(10, "the client forwarding", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("forwarding udp:"))
    });
    (server, client, lport)
}

#[test]
fn dig_reaches_a_real_resolver_through_a_udp_forward() {
    let (Some(bin), true) = (dnsmasq(), have_dig()) else {
        // CI installs both (.ci/setup); elsewhere the test says why it skips.
        eprintln!("skipping: dnsmasq or dig is not installed (apt-get install dnsmasq-base bind9-dnsutils)");
        return;
    };
    let dir = tmpdir("udp-dns");
    let _gone = RemovedOnDrop(dir.clone());
    let dns = free_dual_port();
    let _dns = resolver(bin, dns, &dir);
    // The resolver answers directly first (it may take a moment to start).
    wait_resolver(dns, &dir);
    let (_server, _client, lport) = tunnel(&dir, &format!("udp:127.0.0.1:{dns}"), dns);
    for i in 0..20 {
        let name = format!("host{i}.lh.test");
        assert_eq!(
            dig(lport, &name, 3, 2),
            "198.18.0.7",
            "{name} through -L udp:"
        );
    }
}

#[test]
fn a_server_that_allows_no_udp_to_the_resolver_answers_nothing() {
    let (Some(bin), true) = (dnsmasq(), have_dig()) else {
        eprintln!("skipping: dnsmasq or dig is not installed (apt-get install dnsmasq-base bind9-dnsutils)");
        return;
    };
    let dir = tmpdir("udp-dns-refused");
    let _gone = RemovedOnDrop(dir.clone());
    let dns = free_dual_port();
    let _dns = resolver(bin, dns, &dir);
    wait_resolver(dns, &dir);
    // TCP to the resolver's port is allowed; UDP is not.
    let (_server, _client, lport) = tunnel(&dir, &format!("127.0.0.1:{dns}"), dns);
    let answer = dig(lport, "refused.lh.test", 2, 1);
    assert!(!answer.contains("198.18.0.7"), "answered: {answer}");
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    assert!(
        log.contains("not allowed"),
        "the server says nothing: {log}"
    );
    // The client is told what the server would need.
    let client_log = std::fs::read_to_string(dir.join("client.log")).unwrap();
    assert!(
        client_log.contains(&format!("--allow udp:127.0.0.1:{dns}")),
        "{client_log}"
    );
}

/// `bench udp` against the bench server directly and through `-L udp:`:
/// at a low rate on loopback every datagram comes back once.
#[test]
fn bench_udp_measures_a_direct_path_and_a_forward() {
    let dir = tmpdir("bench-udp");
    let _gone = RemovedOnDrop(dir.clone());
    let bport = free_port();
    let baddr = format!("127.0.0.1:{bport}");
    let _bench = spawn_logged(
        &["bench", "server", "--listen", &baddr],
        &dir.join("bench.log"),
    );
    wait_port(bport);
    let (_server, _client, lport) = tunnel(&dir, &format!("udp:{baddr}"), bport);
    for addr in [baddr.clone(), format!("127.0.0.1:{lport}")] {
        let out = Command::new(BIN)
            .args([
                "bench", "udp", &addr, "-b", "8mbit", "-l", "1000", "-t", "1", "--json",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["sent"], 1000, "{j}");
        assert!(j["lost"].as_u64().unwrap() <= 10, "{addr}: {j}");
        assert_eq!(j["duplicates"], 0, "{j}");
        assert!(j["rtt_p50_us"].as_f64().unwrap() > 0.0, "{j}");
    }
}

/// A UDP echo target on a thread; its port.
fn udp_echo() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = s.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut b = [0u8; 2048];
        while let Ok((n, from)) = s.recv_from(&mut b) {
            let _ = s.send_to(&b[..n], from);
        }
    });
    port
}

/// How many of `socks` get their datagram echoed within `wait`.
fn echoed(socks: &[std::net::UdpSocket], to: u16, wait: std::time::Duration) -> usize {
    for (i, s) in socks.iter().enumerate() {
        s.send_to(format!("flow {i}").as_bytes(), ("127.0.0.1", to))
            .unwrap();
    }
    let until = std::time::Instant::now() + wait;
    let mut answered = 0;
    for (i, s) in socks.iter().enumerate() {
        let left = until.saturating_duration_since(std::time::Instant::now());
        s.set_read_timeout(Some(left.max(std::time::Duration::from_millis(1))))
            .unwrap();
        let mut b = [0u8; 64];
        if let Ok(n) = s.recv(&mut b) {
            assert_eq!(&b[..n], format!("flow {i}").as_bytes());
            answered += 1;
        }
    }
    answered
}

#[test]
fn a_client_gets_its_share_of_udp_flows_and_the_far_side_ends_idle_ones() {
    let dir = tmpdir("udp-flow-bounds");
    let echo = udp_echo();
    let sport = free_port();
    let listen = format!("tcp://127.0.0.1:{sport}");
    let server = spawn_logged(
        &[
            "server",
            "--listen",
            &listen,
            "--insecure",
            "--allow",
            &format!("udp:127.0.0.1:{echo}"),
            "--max-flows-per-client",
            "16",
            "--flow-idle",
            "3s",
            "--control",
            "none",
        ],
        &dir.join("server.log"),
    );
    wait_port(sport);
    let lport = free_udp_port();
    let log = dir.join("client.log");
    let _client = spawn_logged(
        &[
            "client",
            &listen,
            "--insecure",
            "-L",
            &format!("udp:{lport}:127.0.0.1:{echo}"),
            "--control",
            "none",
        ],
        &log,
    );
    wait_until(10, "the client forwarding", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("forwarding udp:"))
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let idle_fds = open_fds(server.pid());
    // 40 sources, a flow each: the client's share is 16.
    let socks: Vec<_> = (0..40)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let n = echoed(&socks, lport, std::time::Duration::from_millis(1500));
    assert_eq!(n, 16, "flows answered past --max-flows-per-client 16");
    let held = open_fds(server.pid());
    assert!(held >= idle_fds + 16, "{held} descriptors, {idle_fds} idle");
    // Quiet for longer than --flow-idle: the server ends them itself, and
    // their ports go back.
    wait_until(10, "the server to end idle flows", || {
        open_fds(server.pid()) < idle_fds + 4
    });
    // New sources while the old ones still hold their ports: a new socket
    // on the port of a source the server refused would be that source
    // again to the client, which drops its datagrams for a while.
    let again: Vec<_> = (0..8)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    assert_eq!(
        echoed(&again, lport, std::time::Duration::from_secs(3)),
        8,
        "flows after the idle ones ended"
    );
    drop(socks);
    let text = std::fs::read_to_string(dir.join("server.log")).unwrap();
    let refusals = text.matches("refusing UDP flows").count();
    assert_eq!(refusals, 1, "the refusal is logged once: {text}");
    assert!(text.contains("--max-flows-per-client"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
