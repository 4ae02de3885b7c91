//! Server processes under signals and resource exhaustion.

use crate::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn wait_exit(k: &mut Kill, secs: u64) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = k.0.try_wait().unwrap() {
            return st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "process did not exit within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server (with `extra` arguments) and a client (with `client_extra`)
/// forwarding to an echo target, with one stream in the middle of a
/// conversation.
fn server_client_stream(
    name: &str,
    extra: &[&str],
    client_extra: &[&str],
) -> (Kill, Kill, TcpStream, std::path::PathBuf) {
    let tport = echo_target();
    let sport = free_port();
    let lport = free_port();
    let dir = tmpdir(name);
    let listen = format!("tcp://127.0.0.1:{sport}");
    let allow = format!("127.0.0.1:{tport}");
    let mut args = vec![
        "server",
        "--listen",
        &listen,
        "--insecure",
        "--allow",
        &allow,
    ];
    args.extend_from_slice(extra);
    let server = spawn_logged(&args, &dir.join("server.log"));
    wait_port(sport);
    let server_url = format!("tcp://127.0.0.1:{sport}");
    let fwd = format!("{lport}:127.0.0.1:{tport}");
    let mut cargs = vec!["client", &server_url, "--insecure", "-L", &fwd];
    cargs.extend_from_slice(client_extra);
    let client = spawn_logged(&cargs, &dir.join("client.log"));
    wait_port(lport);
    // A live stream, in the middle of a conversation.
    let mut s = TcpStream::connect(("127.0.0.1", lport)).unwrap();
    s.write_all(b"hello").unwrap();
    let mut b = [0u8; 5];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
    (server, client, s, dir)
}

fn sigterm(k: &Kill) {
    let ok = Command::new("kill")
        .args(["-TERM", &k.pid().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

#[test]
fn sigterm_closes_live_sessions_and_the_server_exits_cleanly() {
    let (mut server, mut client, mut s, dir) =
        server_client_stream("sigterm", &["--drain-timeout", "0"], &["--no-reconnect"]);
    let _gone = RemovedOnDrop(dir.clone());
    let t = Instant::now();
    sigterm(&server);
    let st = wait_exit(&mut server, 5);
    assert!(st.success(), "server exited with {st}");
    // The stream was closed, not left hanging: EOF (or a reset) promptly.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = vec![];
    match s.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert!(
            e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut,
            "the stream hung after the server stopped: {e}"
        ),
    }
    // Without reconnects, the client notices its session is gone and exits
    // non-zero.
    let cst = wait_exit(&mut client, 5);
    assert!(!cst.success());
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    assert!(log.contains("closing 1 session"), "{log}");
}

#[test]
fn a_first_sigterm_drains_and_a_second_one_stops_at_once() {
    // A client that goes on after the server stops (it reconnects): the
    // reset of the cut stream is its to deliver, not a process exit's.
    let (mut server, _client, mut s, dir) = server_client_stream("drain", &[], &[]);
    let _gone = RemovedOnDrop(dir.clone());
    sigterm(&server);
    // Draining: the open stream goes on, the server with it.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(500));
        s.write_all(b"still").unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"still");
        assert!(
            server.0.try_wait().unwrap().is_none(),
            "the server stopped during the drain"
        );
    }
    let t = Instant::now();
    sigterm(&server);
    let st = wait_exit(&mut server, 5);
    assert!(st.success(), "server exited with {st}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // The stream still open was cut: the application sees a reset, not a
    // clean end of data.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = vec![];
    match s.read_to_end(&mut rest) {
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "the stream ended with {e}, not a reset"
        ),
        Ok(n) => panic!("the cut stream ended cleanly after {n} bytes"),
    }
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    assert!(
        log.contains("draining 1 session(s), 1 with open streams"),
        "{log}"
    );
    assert!(log.contains("second stop signal"), "{log}");
}

#[test]
fn a_reverse_forward_out_of_file_descriptors_does_not_spin() {
    // The client's -R target: accepts and holds.
    let target = TcpListener::bind("127.0.0.1:0").unwrap();
    let tport = target.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = vec![];
        for s in target.incoming().flatten() {
            held.push(s);
        }
    });
    let sport = free_port();
    let rport = free_port();
    let dir = tmpdir("emfile");
    let _gone = RemovedOnDrop(dir.clone());
    // The server may hold only 64 descriptors.
    let server = Kill(
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n 64 && exec {BIN} server --listen tcp://127.0.0.1:{sport} --insecure --allow-bind {rport}"
            ))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("server.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_port(sport);
    let _client = spawn_logged(
        &[
            "client",
            &format!("tcp://127.0.0.1:{sport}"),
            "--insecure",
            "-R",
            &format!("{rport}:127.0.0.1:{tport}"),
        ],
        &dir.join("client.log"),
    );
    wait_port(rport);
    // Far more connections than the server has descriptors for.
    let mut held = vec![];
    for _ in 0..120 {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", rport)) {
            held.push(s);
        }
    }
    wait_until(10, "the server runs out of descriptors", || {
        std::fs::read_to_string(dir.join("server.log"))
            .unwrap()
            .contains("accept failed")
    });
    let before = cpu_time(server.pid());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_time(server.pid()) - before;
    assert!(
        used < Duration::from_millis(400),
        "server burnt {used:?} of CPU in 2 s while out of descriptors"
    );
    // Once descriptors are free again, it accepts again.
    drop(held);
    std::thread::sleep(Duration::from_millis(1500));
    let mut s = TcpStream::connect(("127.0.0.1", rport)).unwrap();
    s.write_all(b"x").unwrap();
}

/// One echo round trip through `port`, or why it failed.
fn echo_once(port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(b"again").map_err(|e| e.to_string())?;
    let mut b = [0u8; 5];
    s.read_exact(&mut b).map_err(|e| e.to_string())?;
    if &b == b"again" {
        Ok(())
    } else {
        Err(format!("got {b:?}"))
    }
}

#[test]
fn a_restarted_server_gets_a_fresh_session_and_the_old_streams_are_reset() {
    let tport = echo_target();
    let sport = free_port();
    let lport = free_port();
    let rport = free_port();
    let dir = tmpdir("restart");
    let _gone = RemovedOnDrop(dir.clone());
    let server_args = [
        "server".to_string(),
        "--listen".into(),
        format!("tcp://127.0.0.1:{sport}"),
        "--insecure".into(),
        "--allow".into(),
        format!("127.0.0.1:{tport}"),
        "--allow-bind".into(),
        rport.to_string(),
    ];
    let args: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let mut server = spawn_logged(&args, &dir.join("server1.log"));
    wait_port(sport);
    let mut client = spawn_logged(
        &[
            "client",
            &format!("tcp://127.0.0.1:{sport}"),
            "--insecure",
            "-L",
            &format!("{lport}:127.0.0.1:{tport}"),
            "-R",
            &format!("{rport}:127.0.0.1:{tport}"),
        ],
        &dir.join("client.log"),
    );
    wait_port(lport);
    wait_port(rport);
    // A live stream through the first session.
    let mut s = TcpStream::connect(("127.0.0.1", lport)).unwrap();
    s.write_all(b"hello").unwrap();
    let mut b = [0u8; 5];
    s.read_exact(&mut b).unwrap();
    // The server dies without a word (its sessions with it), and comes
    // back a second later.
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let _server2 = spawn_logged(&args, &dir.join("server2.log"));
    let back = Instant::now();
    // The old stream ends promptly once the client hears the session is
    // gone: a reset (or at least an end), not a hang.
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let mut rest = vec![];
    match s.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert!(
            e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut,
            "the old stream hung: {e}"
        ),
    }
    // New connections through the same -L work again, and the server's
    // -R listener is back.
    wait_until(10, "-L works again", || echo_once(lport).is_ok());
    wait_until(10, "-R is back", || echo_once(rport).is_ok());
    assert!(
        back.elapsed() < Duration::from_secs(12),
        "{:?}",
        back.elapsed()
    );
    assert!(client.0.try_wait().unwrap().is_none(), "the client exited");
    let log = std::fs::read_to_string(dir.join("client.log")).unwrap();
    assert!(log.contains("refused to resume the session"), "{log}");
    assert!(log.contains("new session"), "{log}");
}

fn signal(k: &Kill, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &k.pid().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// A client with `-R RPORT` to an echo target (and `extra`), its log.
fn reverse_client(
    dir: &std::path::Path,
    sport: u16,
    rport: u16,
    tport: u16,
    extra: &[&str],
    log: &str,
) -> Kill {
    let url = format!("tcp://127.0.0.1:{sport}");
    let fwd = format!("{rport}:127.0.0.1:{tport}");
    let mut args = vec![
        "client",
        &url,
        "--insecure",
        "-R",
        &fwd,
        "--control",
        "none",
    ];
    args.extend_from_slice(extra);
    spawn_logged(&args, &dir.join(log))
}

#[test]
fn a_client_that_stops_frees_its_reverse_ports_at_once_on_every_way_out() {
    let dir = tmpdir("client-goodbye");
    let tport = echo_target();
    let sport = free_port();
    let rport = free_port();
    let _server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("tcp://127.0.0.1:{sport}"),
            "--insecure",
            "--allow-bind",
            &rport.to_string(),
            "--control",
            "none",
        ],
        &dir.join("server.log"),
    );
    wait_port(sport);
    // Ctrl-C, then SIGTERM, each followed at once by a new client asking
    // for the same port: it gets it (no session kept for a resume).
    for (i, sig) in ["-INT", "-TERM"].into_iter().enumerate() {
        let log = format!("client{i}.log");
        let mut c = reverse_client(&dir, sport, rport, tport, &[], &log);
        wait_until(10, "the -R open", || {
            std::fs::read_to_string(dir.join(&log)).is_ok_and(|l| l.contains("open"))
        });
        if i == 0 {
            // A SIGHUP does not kill a client.
            signal(&c, "-HUP");
            wait_until(5, "the SIGHUP said", || {
                std::fs::read_to_string(dir.join(&log))
                    .is_ok_and(|l| l.contains("reload (SIGHUP) ignored"))
            });
            assert!(
                c.0.try_wait().unwrap().is_none(),
                "SIGHUP killed the client"
            );
        }
        signal(&c, sig);
        wait_exit(&mut c, 5);
        let again = format!("again{i}.log");
        let mut c = reverse_client(&dir, sport, rport, tport, &["--no-reconnect"], &again);
        wait_until(10, "the -R open again", || {
            let l = std::fs::read_to_string(dir.join(&again)).unwrap_or_default();
            assert!(!l.contains("refused"), "{sig}: {l}");
            l.contains("open")
        });
        echo_once(rport).unwrap();
        signal(&c, "-TERM");
        wait_exit(&mut c, 5);
    }
    // A client that fails at start (its -L port taken) says GOODBYE too.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let lport = taken.local_addr().unwrap().port();
    let fwd = format!("{lport}:127.0.0.1:{tport}");
    let mut c = reverse_client(&dir, sport, rport, tport, &["-L", &fwd], "failed.log");
    let st = wait_exit(&mut c, 10);
    assert!(!st.success());
    let mut c = reverse_client(&dir, sport, rport, tport, &["--no-reconnect"], "after.log");
    wait_until(10, "the -R open after a failed start", || {
        let l = std::fs::read_to_string(dir.join("after.log")).unwrap_or_default();
        assert!(!l.contains("refused"), "{l}");
        l.contains("open")
    });
    signal(&c, "-TERM");
    wait_exit(&mut c, 5);
    let server_log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    assert!(
        !server_log.contains("kept for a resume"),
        "a stopped client's session was kept: {server_log}"
    );
    drop(taken);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_first_dial_that_gets_no_answer_ends_at_the_handshake_timeout_and_says_so() {
    let dir = tmpdir("client-dead-dial");
    // Accepts and never answers.
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hole.local_addr().unwrap().port();
    let start = Instant::now();
    let mut c = spawn_logged(
        &[
            "client",
            &format!("127.0.0.1:{port}"),
            "--pin",
            "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "--handshake-timeout",
            "2s",
            "-L",
            "0:127.0.0.1:9",
            "--control",
            "none",
        ],
        &dir.join("client.log"),
    );
    let st = wait_exit(&mut c, 10);
    assert!(!st.success());
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    let log = std::fs::read_to_string(dir.join("client.log")).unwrap();
    assert!(log.contains("connecting to"), "{log}");
    assert!(log.contains("no longhaul server answered"), "{log}");
    assert!(log.contains("--handshake-timeout"), "{log}");
    // A folder with no server: the client says it waits, then gives up.
    let folder = dir.join("share");
    std::fs::create_dir(&folder).unwrap();
    let mut c = spawn_logged(
        &[
            "client",
            &format!("dir://{}", folder.display()),
            "--pin",
            "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "--token",
            "t",
            "--handshake-timeout",
            "2s",
            "-L",
            "0:127.0.0.1:9",
            "--control",
            "none",
        ],
        &dir.join("folder.log"),
    );
    let st = wait_exit(&mut c, 10);
    assert!(!st.success());
    let log = std::fs::read_to_string(dir.join("folder.log")).unwrap();
    assert!(log.contains("waiting for a server on the folder"), "{log}");
    assert!(
        log.contains("no longhaul server answered in that folder"),
        "{log}"
    );
    drop(hole);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_client_started_before_its_server_waits_for_it_when_asked() {
    let dir = tmpdir("client-waits");
    let tport = echo_target();
    let sport = free_port();
    let lport = free_port();
    let _client = spawn_logged(
        &[
            "client",
            &format!("tcp://127.0.0.1:{sport}"),
            "--insecure",
            "--wait-for-server",
            "-L",
            &format!("{lport}:127.0.0.1:{tport}"),
            "--control",
            "none",
        ],
        &dir.join("client.log"),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let log = std::fs::read_to_string(dir.join("client.log")).unwrap();
    assert!(log.contains("waiting for tcp://127.0.0.1"), "{log}");
    let _server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("tcp://127.0.0.1:{sport}"),
            "--insecure",
            "--allow",
            &format!("127.0.0.1:{tport}"),
            "--control",
            "none",
        ],
        &dir.join("server.log"),
    );
    wait_port(lport);
    echo_once(lport).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_client_fails_over_to_the_next_server_when_the_first_does_not_answer() {
    let dir = tmpdir("client-failover");
    let tport = echo_target();
    let (dead, live, lport) = (free_port(), free_port(), free_port());
    let _server = spawn_logged(
        &[
            "server",
            "--listen",
            &format!("tcp://127.0.0.1:{live}"),
            "--insecure",
            "--allow",
            &format!("127.0.0.1:{tport}"),
            "--control",
            "none",
        ],
        &dir.join("server.log"),
    );
    wait_port(live);
    let _client = spawn_logged(
        &[
            "client",
            &format!("tcp://127.0.0.1:{dead}"),
            "--failover",
            &format!("tcp://127.0.0.1:{live}"),
            "--insecure",
            "-L",
            &format!("{lport}:127.0.0.1:{tport}"),
            "--control",
            "none",
        ],
        &dir.join("client.log"),
    );
    wait_port(lport);
    echo_once(lport).unwrap();
    let log = std::fs::read_to_string(dir.join("client.log")).unwrap();
    assert!(
        log.contains(&format!("trying tcp://127.0.0.1:{live}")),
        "{log}"
    );
    assert!(
        log.contains(&format!("session with tcp://127.0.0.1:{live} up")),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
