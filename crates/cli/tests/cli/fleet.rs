//! A fleet: three server processes behind a real load balancer (HAProxy
//! from Debian, in TCP mode, started here with its own configuration on
//! loopback ports — never the system's service). Each server names itself
//! (`--instance`); a client's later carriers of a session carry that name
//! in the TLS server name, and the balancer routes on it, so resumes and
//! lanes reach the server that holds their session.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use sha2::{Digest, Sha256};

fn haproxy_binary() -> Option<PathBuf> {
    [
        "/usr/sbin/haproxy",
        "/usr/bin/haproxy",
        "/usr/local/sbin/haproxy",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// The tested HAProxy configuration (README, "A fleet behind a load
/// balancer"): new sessions round-robin; a carrier whose TLS server name
/// is an instance goes to that server while its health check passes.
fn haproxy_config(port: u16, servers: &[(String, u16)]) -> String {
    let mut c = format!(
        "global
  maxconn 512
defaults
  mode tcp
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  retries 2
  option redispatch
frontend longhaul
  bind 127.0.0.1:{port}
  tcp-request inspect-delay 5s
  tcp-request content accept if {{ req.ssl_hello_type 1 }}
  default_backend fleet
backend fleet
  balance roundrobin
"
    );
    for (name, _) in servers {
        c += &format!("  use-server {name} if {{ req.ssl_sni -i {name} }}\n");
    }
    for (name, p) in servers {
        c += &format!("  server {name} 127.0.0.1:{p} check inter 1s fall 2 rise 2\n");
    }
    c
}

/// Starts HAProxy with `config`; None (the test skips) where it is not
/// installed, except under CI, where `.ci/setup` installs it.
fn start_haproxy(dir: &Path, port: u16, config: &str) -> Option<Kill> {
    let Some(bin) = haproxy_binary() else {
        assert!(
            std::env::var("CI").is_err(),
            "haproxy is missing: run .ci/setup (apt-get install haproxy)"
        );
        eprintln!("skipping: haproxy is not installed (apt-get install haproxy)");
        return None;
    };
    let cfg = dir.join("haproxy.cfg");
    std::fs::write(&cfg, config).unwrap();
    let k = Kill(
        Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("haproxy.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_port(port);
    Some(k)
}

struct Fleet {
    /// "tls" or "ws" (TLS inside the WebSocket).
    scheme: &'static str,
    dir: PathBuf,
    fp: String,
    echo: u16,
    lb: u16,
    servers: Vec<(String, u16)>,
    procs: Vec<Option<Kill>>,
}

impl Fleet {
    fn start(name: &str, scheme: &'static str) -> Fleet {
        let dir = tmpdir(name);
        // One key for the whole fleet: clients pin one.
        let fp = keygen(&dir.join("server.key"));
        let ck = keygen(&dir.join("c.key"));
        std::fs::write(dir.join("ak"), format!("{ck}\n")).unwrap();
        let echo = echo_target();
        let servers: Vec<(String, u16)> = (1..=3).map(|i| (format!("s{i}"), free_port())).collect();
        let procs = servers
            .iter()
            .map(|(name, port)| {
                let k = spawn_logged(
                    &[
                        "server",
                        "--listen",
                        &Fleet::url(scheme, *port),
                        "--key",
                        dir.join("server.key").to_str().unwrap(),
                        "--authorized-keys",
                        dir.join("ak").to_str().unwrap(),
                        "--allow",
                        &format!("127.0.0.1:{echo}"),
                        "--instance",
                        name,
                    ],
                    &dir.join(format!("{name}.log")),
                );
                wait_port(*port);
                Some(k)
            })
            .collect();
        Fleet {
            scheme,
            dir,
            fp,
            echo,
            lb: free_port(),
            servers,
            procs,
        }
    }

    fn url(scheme: &str, port: u16) -> String {
        match scheme {
            "ws" => format!("ws://127.0.0.1:{port}/longhaul"),
            _ => format!("tls://127.0.0.1:{port}"),
        }
    }

    fn haproxy(&self) -> Option<Kill> {
        start_haproxy(&self.dir, self.lb, &haproxy_config(self.lb, &self.servers))
    }

    /// A client through the balancer; its `-L` port.
    fn client(&self, name: &str, query: &str) -> (Kill, u16) {
        let local = free_port();
        let k = spawn_logged(
            &[
                "client",
                &format!("{}{query}", Fleet::url(self.scheme, self.lb)),
                "--key",
                self.dir.join("c.key").to_str().unwrap(),
                "--pin",
                &self.fp,
                "-L",
                &format!("127.0.0.1:{local}:127.0.0.1:{}", self.echo),
            ],
            &self.dir.join(format!("{name}.log")),
        );
        wait_port(local);
        (k, local)
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    fn server_logs(&self) -> Vec<String> {
        self.servers.iter().map(|(n, _)| self.log(n)).collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.procs.clear();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Echoes `total` random bytes through `port`, paced (64 KiB every
/// `pace`) so that the transfer spans the disturbances; returns whether
/// both hashes match.
fn paced_echo(port: u16, total: usize, pace: Duration) -> std::thread::JoinHandle<bool> {
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut r = s.try_clone().unwrap();
        let data = random(total);
        let want: [u8; 32] = Sha256::digest(&data).into();
        let reader = std::thread::spawn(move || {
            let mut h = Sha256::new();
            let mut got = 0;
            let mut b = vec![0u8; 64 << 10];
            while got < total {
                match r.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        h.update(&b[..n]);
                        got += n;
                    }
                }
            }
            (got, <[u8; 32]>::from(h.finalize()))
        });
        for c in data.chunks(64 << 10) {
            if s.write_all(c).is_err() {
                break;
            }
            std::thread::sleep(pace);
        }
        let (got, hash) = reader.join().unwrap();
        got == total && hash == want
    })
}

fn random(n: usize) -> Vec<u8> {
    use rand::RngCore;
    let mut v = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

/// Three clients with paced transfers while the balancer (started by
/// `balancer`) dies and comes back twice: every resume must land on its
/// own server, 0 bytes lost; then a striped client must get its four
/// lanes on one server. Returns the clients and the running balancer.
fn resumes_and_lanes_land_on_their_server(
    fleet: &Fleet,
    balancer: impl Fn() -> Option<Kill>,
) -> Option<(Vec<(Kill, u16)>, Kill)> {
    let mut lb = Some(balancer()?);
    // Three clients: round-robin puts their sessions on three servers.
    let clients: Vec<(Kill, u16)> = (0..3)
        .map(|i| {
            let c = fleet.client(&format!("c{i}"), "");
            // One after the other, so each first carrier takes the next server.
            wait_until(10, "a session", || {
                fleet
                    .server_logs()
                    .iter()
                    .map(|l| l.matches("session started").count())
                    .sum::<usize>()
                    == i + 1
            });
            c
        })
        .collect();
    let transfers: Vec<_> = clients
        .iter()
        .map(|(_, port)| paced_echo(*port, 12 << 20, Duration::from_millis(12)))
        .collect();
    // Twice, the balancer dies (every carrier is cut) and comes back.
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(700));
        drop(lb.take());
        std::thread::sleep(Duration::from_millis(200));
        lb = balancer();
        assert!(lb.is_some());
    }
    for (i, t) in transfers.into_iter().enumerate() {
        assert!(
            t.join().unwrap(),
            "client {i}: bytes lost or changed\n{}",
            fleet.log(&format!("c{i}"))
        );
    }
    for (i, l) in fleet.server_logs().iter().enumerate() {
        assert!(l.contains("session started"), "s{}: no session\n{l}", i + 1);
        assert!(
            !l.contains("resume refused"),
            "s{}: a misrouted resume\n{l}",
            i + 1
        );
    }
    for i in 0..3 {
        let log = fleet.log(&format!("c{i}"));
        assert!(log.contains("session resumed"), "c{i}:\n{log}");
        assert!(!log.contains("starting a new session"), "c{i}:\n{log}");
    }
    // A striped client gets all four lanes on the server of its session.
    let (_striped, port) = fleet.client("striped", "?stripes=4");
    wait_until(10, "four lanes", || {
        servers_with_lanes(&fleet.server_logs()) == vec![3]
    });
    assert!(paced_echo(port, 4 << 20, Duration::ZERO).join().unwrap());
    // No lane went to a server that refused it (and was dialled again).
    for (i, l) in fleet.server_logs().iter().enumerate() {
        assert!(
            !l.contains("resume refused"),
            "s{}: a misrouted lane\n{l}",
            i + 1
        );
    }
    Some((clients, lb.unwrap()))
}

#[test]
fn resumes_and_lanes_find_their_server_through_haproxy() {
    let mut fleet = Fleet::start("fleet-haproxy", "tls");
    let Some((clients, _lb)) = resumes_and_lanes_land_on_their_server(&fleet, || fleet.haproxy())
    else {
        return;
    };
    // One server dies: its clients get a fresh session on another within
    // 5 s (the health check takes it out of the balancer), and their
    // listeners stay open throughout.
    let victim = (0..3)
        .find(|&i| {
            fleet
                .log(&format!("s{}", i + 1))
                .contains("session started")
        })
        .unwrap();
    fleet.procs[victim] = None;
    let t = Instant::now();
    wait_until(15, "a fresh session after the server died", || {
        (0..3).any(|i| fleet.log(&format!("c{i}")).contains("new session with"))
    });
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "a fresh session took {:?}",
        t.elapsed()
    );
    for (_, port) in &clients {
        assert!(paced_echo(*port, 1 << 20, Duration::ZERO).join().unwrap());
    }
}

#[test]
fn resumes_and_lanes_find_their_server_through_nginx_stream() {
    let fleet = Fleet::start("fleet-nginx-stream", "tls");
    resumes_and_lanes_land_on_their_server(&fleet, || fleet.nginx(NginxMode::Stream));
}

#[test]
fn resumes_and_lanes_find_their_server_through_nginx_websocket() {
    let fleet = Fleet::start("fleet-nginx-ws", "ws");
    resumes_and_lanes_land_on_their_server(&fleet, || fleet.nginx(NginxMode::Http));
}

#[derive(Clone, Copy, PartialEq)]
enum NginxMode {
    /// `stream` with `ssl_preread`: routes `tls://` on the server name.
    Stream,
    /// `http`: routes `ws://` on the Longhaul-Instance header.
    Http,
}

fn nginx_binary() -> Option<PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Where Debian's libnginx-mod-stream puts the stream module.
const STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// The tested nginx configuration's routing part (README): an upstream
/// per instance, with the others as backups (a resume for a dead server
/// reaches a live one, is refused there, and the client starts afresh),
/// and one for new sessions; a map from the instance to the upstream.
fn nginx_upstreams(servers: &[(String, u16)], key: &str) -> String {
    let mut c = String::new();
    c += &format!("  map {key} $longhaul_pool {{\n");
    for (name, _) in servers {
        c += &format!("    {name} {name};\n");
    }
    c += "    default longhaul_fleet;\n  }\n  upstream longhaul_fleet {\n";
    for (_, p) in servers {
        c += &format!("    server 127.0.0.1:{p};\n");
    }
    c += "  }\n";
    for (name, port) in servers {
        c += &format!("  upstream {name} {{\n    server 127.0.0.1:{port};\n");
        for (_, p) in servers.iter().filter(|(n, _)| n != name) {
            c += &format!("    server 127.0.0.1:{p} backup;\n");
        }
        c += "  }\n";
    }
    c
}

impl Fleet {
    fn nginx(&self, mode: NginxMode) -> Option<Kill> {
        let Some(bin) =
            nginx_binary().filter(|_| mode == NginxMode::Http || Path::new(STREAM_MODULE).exists())
        else {
            assert!(
                std::env::var("CI").is_err(),
                "nginx or its stream module is missing: run .ci/setup"
            );
            eprintln!("skipping: nginx (with libnginx-mod-stream) is not installed");
            return None;
        };
        let d = self.dir.join("nginx");
        std::fs::create_dir_all(&d).unwrap();
        let port = self.lb;
        let dd = d.display();
        let body = match mode {
            NginxMode::Stream => format!(
                "stream {{\n{}  server {{\n    listen 127.0.0.1:{port};\n    ssl_preread on;\n    proxy_pass $longhaul_pool;\n  }}\n}}\n",
                nginx_upstreams(&self.servers, "$ssl_preread_server_name")
            ),
            NginxMode::Http => format!(
                "http {{\n  access_log off;\n  client_body_temp_path {dd}/body;\n  proxy_temp_path {dd}/proxy;\n  fastcgi_temp_path {dd}/fastcgi;\n  uwsgi_temp_path {dd}/uwsgi;\n  scgi_temp_path {dd}/scgi;\n{}  server {{\n    listen 127.0.0.1:{port};\n    location /longhaul {{\n      proxy_pass http://$longhaul_pool;\n      proxy_http_version 1.1;\n      proxy_set_header Upgrade $http_upgrade;\n      proxy_set_header Connection \"upgrade\";\n      proxy_buffering off;\n      proxy_read_timeout 1h;\n    }}\n  }}\n}}\n",
                nginx_upstreams(&self.servers, "$http_longhaul_instance")
            ),
        };
        let load = match mode {
            NginxMode::Stream => format!("load_module {STREAM_MODULE};\n"),
            NginxMode::Http => String::new(),
        };
        let conf = format!(
            "{load}worker_processes 1;\ndaemon off;\n# One process: killing it leaves no worker behind.\nmaster_process off;\npid {dd}/nginx.pid;\nerror_log {dd}/error.log;\nevents {{ worker_connections 256; }}\n{body}"
        );
        std::fs::write(d.join("nginx.conf"), conf).unwrap();
        let k = Kill(
            Command::new(bin)
                .arg("-p")
                .arg(&d)
                .arg("-c")
                .arg(d.join("nginx.conf"))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(d.join("stderr.log")).unwrap())
                .spawn()
                .unwrap(),
        );
        wait_port(port);
        Some(k)
    }
}

/// How many lane joins each server logged, for the servers that logged any.
fn servers_with_lanes(logs: &[String]) -> Vec<usize> {
    logs.iter()
        .map(|l| l.matches("carrier added as a lane").count())
        .filter(|&n| n > 0)
        .collect()
}

#[test]
fn a_rolling_restart_through_haproxy_cuts_no_stream() {
    let mut fleet = Fleet::start("fleet-rolling", "tls");
    let Some(_lb) = fleet.haproxy() else {
        return;
    };
    let clients: Vec<(Kill, u16)> = (0..3).map(|i| fleet.client(&format!("c{i}"), "")).collect();
    // Streams that last about 4 s, open before the first server stops.
    let long: Vec<_> = clients
        .iter()
        .map(|(_, port)| paced_echo(*port, 2 << 20, Duration::from_millis(125)))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..3 {
        let (name, port) = fleet.servers[i].clone();
        let t = Instant::now();
        let p = fleet.procs[i].as_mut().unwrap();
        let ok = Command::new("kill")
            .args(["-TERM", &p.pid().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        wait_until(20, "the server's exit after its drain", || {
            p.0.try_wait().unwrap().is_some()
        });
        let drained = t.elapsed();
        assert!(
            drained < Duration::from_secs(15),
            "{name} drained for {drained:?}"
        );
        fleet.procs[i] = Some(spawn_logged(
            &[
                "server",
                "--listen",
                &Fleet::url("tls", port),
                "--key",
                fleet.dir.join("server.key").to_str().unwrap(),
                "--authorized-keys",
                fleet.dir.join("ak").to_str().unwrap(),
                "--allow",
                &format!("127.0.0.1:{}", fleet.echo),
                "--instance",
                &name,
            ],
            &fleet.dir.join(format!("{name}-again.log")),
        ));
        wait_port(port);
        // New connections work throughout (through new sessions).
        for (_, port) in &clients {
            assert!(paced_echo(*port, 64 << 10, Duration::ZERO).join().unwrap());
        }
    }
    for (i, t) in long.into_iter().enumerate() {
        assert!(
            t.join().unwrap(),
            "client {i}: a stream open before the restart was cut\n{}",
            fleet.log(&format!("c{i}"))
        );
    }
    let drained = (0..3)
        .filter(|i| fleet.log(&format!("c{i}")).contains("is draining"))
        .count();
    assert!(drained >= 2, "the clients were not told to move");
}
