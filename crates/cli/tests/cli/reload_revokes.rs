//! A reload (SIGHUP) takes away from live sessions what the new policy no
//! longer grants: a file stream opened under wider access, a reverse
//! listener the bind rules no longer allow, a UDP flow the rules no longer
//! allow.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn hup(pid: u32) {
    assert!(Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

fn log_has(log: &std::path::Path, what: &str) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains(what)
}

#[test]
fn a_reload_that_narrows_file_access_ends_a_live_file_stream() {
    let dir = tmpdir("reload-files");
    let served = dir.join("served");
    let into = dir.join("into");
    std::fs::create_dir_all(&served).unwrap();
    std::fs::create_dir_all(&into).unwrap();
    // Large and sparse: the copy lasts long enough to be caught in the act.
    let big = std::fs::File::create(served.join("big")).unwrap();
    big.set_len(8 << 30).unwrap();
    let fp = keygen(&dir.join("server.key"));
    let k = keygen(&dir.join("c.key"));
    let ak = dir.join("authorized_keys");
    std::fs::write(&ak, format!("{k} files=rw\n")).unwrap();
    let port = free_port();
    let log = dir.join("server.log");
    let server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--key",
            dir.join("server.key").to_str().unwrap(),
            "--authorized-keys",
            ak.to_str().unwrap(),
            "--files",
            served.to_str().unwrap(),
            "--control",
            "none",
        ],
        &log,
    );
    wait_port(port);
    let mut cp = Kill(
        Command::new(BIN)
            .args(["cp", "--key"])
            .arg(dir.join("c.key"))
            .args(["--pin", &fp, &format!("127.0.0.1:{port}:/big")])
            .arg(&into)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(20, "the download under way", || {
        std::fs::read_dir(&into).unwrap().next().is_some()
    });
    // Hold the stream open (the client stops reading), then take the
    // write access away: read access is narrower, so the stream ends.
    let stop = |sig: &str| {
        Command::new("kill")
            .args([sig, &cp.pid().to_string()])
            .status()
            .unwrap()
    };
    stop("-STOP");
    std::fs::write(&ak, format!("{k} files=ro\n")).unwrap();
    hup(server.pid());
    let ended = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        log_has(&log, "its file access was narrowed or removed")
    });
    stop("-CONT");
    let _ = cp.0.kill();
    let _ = cp.0.wait();
    assert!(
        ended,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reload_that_narrows_bind_rules_closes_a_reverse_listener() {
    let dir = tmpdir("reload-bind");
    let (sport, rport, other) = (free_port(), free_port(), free_port());
    let cfg = dir.join("server.toml");
    let write_cfg = |bind: u16, more: &str| {
        std::fs::write(
            &cfg,
            format!(
                "listen = [\"tcp://127.0.0.1:{sport}\"]\ninsecure = true\nallow-bind = [\"{bind}\"]\ncontrol = \"none\"\n{more}"
            ),
        )
        .unwrap()
    };
    write_cfg(rport, "");
    let log = dir.join("server.log");
    let server = spawn_logged(&["server", "--config", cfg.to_str().unwrap()], &log);
    wait_port(sport);
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tport = target.local_addr().unwrap().port();
    let mut client = spawn_logged(
        &[
            "client",
            &format!("tcp://127.0.0.1:{sport}"),
            "--insecure",
            "--no-reconnect",
            "-R",
            &format!("{rport}:127.0.0.1:{tport}"),
            "--control",
            "none",
        ],
        &dir.join("client.log"),
    );
    wait_port(rport);
    // With a setting no reload can apply: named in one line.
    write_cfg(other, "max-sessions = 7\n");
    hup(server.pid());
    wait_until(10, "what the reload does not apply", || {
        log_has(
            &log,
            "the reload does not apply max-sessions: restart the server",
        )
    });
    wait_until(10, "the reverse bind revoked", || {
        log_has(
            &log,
            &format!("the rules no longer allow its reverse bind on 127.0.0.1:{rport}"),
        )
    });
    wait_until(10, "the reverse listener closed", || {
        std::net::TcpStream::connect(("127.0.0.1", rport)).is_err()
    });
    // Surgical: the session itself goes on (the client, which does not
    // reconnect, is still there).
    std::thread::sleep(Duration::from_millis(500));
    assert!(client.0.try_wait().unwrap().is_none(), "the session ended");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reload_that_narrows_udp_rules_resets_the_flow_and_keeps_the_session() {
    let dir = tmpdir("reload-udp");
    let sport = free_port();
    // A UDP target that answers every datagram.
    let target = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let tport = target.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = target.recv_from(&mut buf) {
            let _ = target.send_to(&buf[..n], from);
        }
    });
    let cfg = dir.join("server.toml");
    let write_cfg = |allow: &str| {
        std::fs::write(
            &cfg,
            format!(
                "listen = [\"tcp://127.0.0.1:{sport}\"]\ninsecure = true\nallow = [\"{allow}\"]\ncontrol = \"none\"\n"
            ),
        )
        .unwrap()
    };
    write_cfg(&format!("udp:127.0.0.1:{tport}"));
    let log = dir.join("server.log");
    let server = spawn_logged(&["server", "--config", cfg.to_str().unwrap()], &log);
    wait_port(sport);
    let lport = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client_log = dir.join("client.log");
    let mut client = spawn_logged(
        &[
            "client",
            &format!("tcp://127.0.0.1:{sport}"),
            "--insecure",
            "--no-reconnect",
            "-L",
            &format!("udp:{lport}:127.0.0.1:{tport}"),
            "--control",
            "none",
        ],
        &client_log,
    );
    wait_until(10, "the client forwarding", || {
        log_has(&client_log, "forwarding udp:")
    });
    let app = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    app.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    wait_until(10, "an answer through the flow", || {
        app.send_to(b"ping", ("127.0.0.1", lport)).unwrap();
        app.recv_from(&mut buf)
            .is_ok_and(|(n, _)| &buf[..n] == b"ping")
    });
    // TCP to the same port stays allowed: UDP is what is taken away.
    write_cfg(&format!("127.0.0.1:{tport}"));
    hup(server.pid());
    wait_until(10, "the flow reset by the reload", || {
        log_has(
            &log,
            &format!("the rules no longer allow its stream to udp://127.0.0.1:{tport}"),
        )
    });
    // The flow gets no answer any more (a new one is refused)…
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        app.send_to(b"ping", ("127.0.0.1", lport)).unwrap();
        assert!(
            app.recv_from(&mut buf).is_err(),
            "answered after the reload"
        );
    }
    // …and the session goes on: the client, which does not reconnect,
    // is still there.
    assert!(client.0.try_wait().unwrap().is_none(), "the session ended");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
