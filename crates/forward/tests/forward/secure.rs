//! Secure carriers: TLS with pinned keys, authorized keys with their own
//! rules, tokens, known-hosts, WebSocket (directly and through a real
//! nginx), and servers that must drop handshakes that never finish.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use longhaul_carrier::{Fingerprint, Identity};
use longhaul_forward::auth::AuthorizedKeys;
use longhaul_forward::known_hosts::KnownHosts;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_forward::spec::ForwardSpec;
use longhaul_forward::{Client, ClientConfig, Server, ServerConfig};
use longhaul_session::SessionConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct TestServer {
    addr: SocketAddr,
    key: Fingerprint,
}

fn server_config(listen: &str, id: &Identity) -> ServerConfig {
    let mut cfg = ServerConfig::new(listen.parse().unwrap());
    cfg.identity = Some(id.clone());
    cfg
}

async fn run_server(cfg: ServerConfig) -> TestServer {
    let key = cfg.identity.as_ref().unwrap().fingerprint;
    let s = Server::bind(cfg).await.unwrap();
    let addr = s.local_addr().unwrap();
    tokio::spawn(s.run());
    TestServer { addr, key }
}

/// A server on `listen` (fresh key) that lets in token "tok" to anywhere.
async fn token_server(listen: &str, session: SessionConfig) -> TestServer {
    let mut cfg = server_config(listen, &Identity::generate().unwrap());
    cfg.auth.token = Some("tok".into());
    cfg.rules = Rules::allow_all();
    cfg.session = session;
    run_server(cfg).await
}

fn authorized(lines: &str) -> Option<AuthorizedKeys> {
    Some(AuthorizedKeys::parse(lines, "test").unwrap())
}

fn client_to(url: String, pin: Fingerprint, targets: &[SocketAddr]) -> ClientConfig {
    let mut cfg = ClientConfig::new(url.parse().unwrap());
    cfg.pin = Some(pin);
    cfg.local = targets
        .iter()
        .map(|t| fwd(&t.ip().to_string(), t.port()))
        .collect();
    cfg
}

/// A target that counts the connections it receives (and echoes).
async fn counting_target() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            n2.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, n)
}

async fn echo_through(client: &Client, i: usize, size: usize) {
    let data = random_bytes(size);
    let h = sha(&data);
    let s = TcpStream::connect(client.local_addrs[i]).await.unwrap();
    assert_eq!(sha(&within(60, send_and_collect(s, data)).await), h);
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("lh-secure-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_authorized_key_carries_data_intact() {
    logs();
    let (sid, cid) = (Identity::generate().unwrap(), Identity::generate().unwrap());
    let echo = echo_server().await;
    let mut cfg = server_config("tls://127.0.0.1:0", &sid);
    cfg.auth.authorized_keys = authorized(&format!("{} # alice\n", cid.fingerprint));
    cfg.rules = Rules::new(vec![echo.to_string().parse().unwrap()], false);
    let srv = run_server(cfg).await;
    let mut c = client_to(format!("tls://{}", srv.addr), srv.key, &[echo]);
    c.identity = Some(cid.clone());
    let client = Client::start(c).await.unwrap();
    echo_through(&client, 0, 16 << 20).await;
    wait_log(&format!("key {} (alice)", cid.fingerprint)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_right_key_or_token_nothing_opens() {
    logs();
    let sid = Identity::generate().unwrap();
    let (good_key, bad_key) = (Identity::generate().unwrap(), Identity::generate().unwrap());
    let (target, contacted) = counting_target().await;
    let mut cfg = server_config("tls://127.0.0.1:0", &sid);
    cfg.auth.authorized_keys = authorized(&format!("{}\n", good_key.fingerprint));
    cfg.auth.token = Some("correct horse".into());
    cfg.rules = Rules::allow_all();
    let srv = run_server(cfg).await;
    let url = format!("tls://{}", srv.addr);

    // A key the server does not know.
    let mut c = client_to(url.clone(), srv.key, &[target]);
    c.identity = Some(bad_key.clone());
    let e = Client::start(c)
        .await
        .err()
        .expect("unknown key must be refused");
    assert!(format!("{e:#}").contains("did not let us in"), "{e:#}");
    wait_log(&format!(
        "key {} is not in the authorized keys",
        bad_key.fingerprint
    ))
    .await;

    // A wrong token, and nothing at all.
    let mut c = client_to(url.clone(), srv.key, &[target]);
    c.token = Some("wrong".into());
    assert!(Client::start(c).await.is_err());
    wait_log("not authenticated: wrong token").await;
    let c = client_to(url.clone(), srv.key, &[target]);
    assert!(Client::start(c).await.is_err());
    wait_log("no authorized key and no token").await;
    assert_eq!(
        contacted.load(Ordering::SeqCst),
        0,
        "a target was contacted"
    );

    // The right token and the right key both work.
    let mut c = client_to(url.clone(), srv.key, &[target]);
    c.token = Some("correct horse".into());
    echo_through(&Client::start(c).await.unwrap(), 0, 1 << 20).await;
    let mut c = client_to(url, srv.key, &[target]);
    c.identity = Some(good_key);
    echo_through(&Client::start(c).await.unwrap(), 0, 1 << 20).await;
    assert_eq!(contacted.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_pin_and_changed_known_host_are_refused_before_any_stream() {
    logs();
    let sid = Identity::generate().unwrap();
    let other = Identity::generate().unwrap();
    let (target, contacted) = counting_target().await;
    let mut cfg = server_config("tls://127.0.0.1:0", &sid);
    cfg.auth.token = Some("t".into());
    cfg.rules = Rules::allow_all();
    let srv = run_server(cfg).await;
    let url = format!("tls://{}", srv.addr);

    let mut c = client_to(url.clone(), other.fingerprint, &[target]);
    c.token = Some("t".into());
    let e = format!("{:#}", Client::start(c).await.err().unwrap());
    assert!(
        e.contains("REFUSED") && e.contains(&other.fingerprint.to_string()),
        "{e}"
    );
    // The server saw the client abort its handshake; nothing got further.
    wait_log("handshake failed").await;

    // Trust on first use: the first connection records the key ...
    let dir = tmp("kh");
    let kh = KnownHosts::new(dir.join("known_hosts"));
    let mut c = client_to(url.clone(), sid.fingerprint, &[target]);
    c.pin = None;
    c.known_hosts = Some(kh.clone());
    c.token = Some("t".into());
    echo_through(&Client::start(c.clone()).await.unwrap(), 0, 4096).await;
    let text = std::fs::read_to_string(kh.path()).unwrap();
    assert_eq!(text.trim(), format!("{} {}", srv.addr, sid.fingerprint));
    // ... and a later, different key on the same address is refused loudly.
    std::fs::write(kh.path(), format!("{} {}\n", srv.addr, other.fingerprint)).unwrap();
    let before = contacted.load(Ordering::SeqCst);
    let e = format!("{:#}", Client::start(c).await.err().unwrap());
    assert!(e.contains("has CHANGED") && e.contains("line 1"), "{e}");
    assert_eq!(contacted.load(Ordering::SeqCst), before);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_rules_narrow_what_it_may_reach_and_bind() {
    logs();
    let sid = Identity::generate().unwrap();
    let cid = Identity::generate().unwrap();
    let (allowed, _) = counting_target().await;
    let (other, other_hits) = counting_target().await;
    let bind_ok = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = server_config("tls://127.0.0.1:0", &sid);
    // Global ceiling: everything. The key: one target and one port.
    cfg.rules = Rules::allow_all();
    cfg.bind_rules = BindRules::new(vec!["*".parse().unwrap()], false);
    cfg.auth.authorized_keys = authorized(&format!(
        "{} allow={allowed} bind={bind_ok} # narrow\n",
        cid.fingerprint
    ));
    let srv = run_server(cfg).await;
    let mut c = client_to(format!("tls://{}", srv.addr), srv.key, &[allowed, other]);
    c.identity = Some(cid.clone());
    let client = Client::start(c.clone()).await.unwrap();
    echo_through(&client, 0, 1 << 20).await;
    // The other target: the forward's connection is closed without data.
    let mut s = TcpStream::connect(client.local_addrs[1]).await.unwrap();
    let _ = s.write_all(b"hello").await;
    let mut buf = [0u8; 16];
    let n = within(10, s.read(&mut buf)).await.unwrap_or(0);
    assert_eq!(n, 0);
    assert_eq!(other_hits.load(Ordering::SeqCst), 0);
    wait_log("refused: not allowed").await;

    // Reverse binds: the key's port works, another does not.
    let spec = |port: u16| ForwardSpec {
        transport: longhaul_forward::spec::Transport::Tcp,
        bind: "127.0.0.1".into(),
        port,
        host: allowed.ip().to_string(),
        host_port: allowed.port(),
    };
    let mut r = c.clone();
    r.local = vec![];
    r.remote = vec![spec(bind_ok)];
    let rc = Client::start(r.clone()).await.unwrap();
    assert_eq!(rc.remote_ports, vec![bind_ok]);
    let free = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    r.remote = vec![spec(free)];
    let e = format!("{:#}", Client::start(r).await.err().unwrap());
    assert!(e.contains("not allowed"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_carriers_direct_and_wss() {
    logs();
    let _dump = DumpLogsOnPanic;
    let echo = echo_server().await;
    for listen in ["ws://127.0.0.1:0/lh", "wss://127.0.0.1:0/lh"] {
        let srv = token_server(listen, SessionConfig::default()).await;
        let scheme = &listen[..listen.find(':').unwrap()];
        let mut c = client_to(format!("{scheme}://{}/lh", srv.addr), srv.key, &[echo]);
        c.token = Some("tok".into());
        let client = Client::start(c.clone()).await.unwrap();
        echo_through(&client, 0, 8 << 20).await;
        // The wrong path is refused at the upgrade.
        c.server = format!("{scheme}://{}/other", srv.addr).parse().unwrap();
        let e = format!("{:#}", Client::start(c).await.err().unwrap());
        assert!(e.contains("404") || e.contains("upgrade"), "{e}");
    }
}

/// nginx from the distribution, on loopback, forwarding the upgrade.
struct Nginx {
    child: std::process::Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nginx_binary() -> Option<std::path::PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
}

fn start_nginx(backend: SocketAddr) -> Option<Nginx> {
    let Some(bin) = nginx_binary() else {
        // CI installs nginx (.ci/setup); elsewhere the test says why it skips.
        assert!(
            std::env::var("CI").is_err(),
            "nginx is missing: run .ci/setup (apt-get install nginx)"
        );
        eprintln!("skipping: nginx is not installed (apt-get install nginx)");
        return None;
    };
    let dir = tmp("nginx");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let d = dir.display();
    let conf = format!(
        r#"worker_processes 1;
daemon off;
# One process, so killing it leaves no orphaned workers behind.
master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  server {{
    listen 127.0.0.1:{port};
    location /longhaul {{
      proxy_pass http://{backend};
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_buffering off;
      proxy_read_timeout 1h;
    }}
  }}
}}
"#
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let child = std::process::Command::new(bin)
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("cannot start nginx");
    let t = Instant::now();
    // A connection to itself (nothing listening yet, and the ephemeral
    // port chosen is `port`) does not count.
    let listening = || {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .is_ok_and(|s| s.local_addr().ok() != s.peer_addr().ok())
    };
    while !listening() {
        assert!(t.elapsed() < Duration::from_secs(10), "nginx did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Nginx { child, dir, port })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_through_real_nginx_64_mib_round_trip() {
    logs();
    let sid = Identity::generate().unwrap();
    let cid = Identity::generate().unwrap();
    let echo = echo_server().await;
    let mut cfg = server_config("ws://127.0.0.1:0/longhaul", &sid);
    cfg.auth.authorized_keys = authorized(&format!("{}\n", cid.fingerprint));
    cfg.rules = Rules::new(vec![echo.to_string().parse().unwrap()], false);
    let srv = run_server(cfg).await;
    let Some(nginx) = start_nginx(srv.addr) else {
        return;
    };
    // TLS runs inside the WebSocket, end to end: nginx relays ciphertext.
    let url = format!("ws://127.0.0.1:{}/longhaul", nginx.port);
    let mut c = client_to(url, srv.key, &[echo]);
    c.identity = Some(cid);
    let client = Client::start(c).await.unwrap();
    echo_through(&client, 0, 64 << 20).await;
    // And several streams at once through the same upgraded connection.
    echo_streams(client.local_addrs[0], vec![1 << 20; 8]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_that_never_finish_are_dropped_while_others_are_served() {
    logs();
    let echo = echo_server().await;
    let srv = token_server(
        "tls://127.0.0.1:0",
        SessionConfig {
            handshake_timeout: Duration::from_secs(1),
            ..SessionConfig::default()
        },
    )
    .await;
    // Silent after connecting; half a ClientHello; plain garbage.
    let mut silent = TcpStream::connect(srv.addr).await.unwrap();
    let mut partial = TcpStream::connect(srv.addr).await.unwrap();
    partial
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    let mut garbage = TcpStream::connect(srv.addr).await.unwrap();
    garbage.write_all(&random_bytes(4096)).await.unwrap();
    // Meanwhile a real client gets through.
    let mut c = client_to(format!("tls://{}", srv.addr), srv.key, &[echo]);
    c.token = Some("tok".into());
    echo_through(&Client::start(c).await.unwrap(), 0, 1 << 20).await;
    let t = Instant::now();
    for s in [&mut silent, &mut partial, &mut garbage] {
        let mut buf = [0u8; 4096];
        let closed = within(5, async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return true,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(closed);
    }
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "took {:?}",
        t.elapsed()
    );
    wait_log("handshake not finished within 1s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_tcp_and_open_servers_need_insecure() {
    let sid = Identity::generate().unwrap();
    // tcp:// without --insecure, TLS without a key, no authentication at all.
    let mut a = ServerConfig::new("tcp://127.0.0.1:0".parse().unwrap());
    a.auth.token = Some("t".into());
    let mut b = ServerConfig::new("tls://127.0.0.1:0".parse().unwrap());
    b.auth.token = Some("t".into());
    let c = server_config("tls://127.0.0.1:0", &sid);
    for (cfg, want) in [
        (a, "pass --insecure"),
        (b, "--key FILE"),
        (c, "no way to authenticate"),
    ] {
        let e = Server::bind(cfg).await.err().unwrap().to_string();
        assert!(e.contains(want), "{e}");
    }
    let cl = ClientConfig::new("tcp://127.0.0.1:1".parse().unwrap());
    let e = format!("{:#}", Client::start(cl).await.err().unwrap());
    assert!(e.contains("--insecure"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_are_closed_after_the_idle_timeout() {
    logs();
    let echo = echo_server().await;
    let srv = token_server(
        "tls://127.0.0.1:0",
        SessionConfig {
            idle_timeout: Some(Duration::from_secs(1)),
            ..SessionConfig::default()
        },
    )
    .await;
    let mut c = client_to(format!("tls://{}", srv.addr), srv.key, &[echo]);
    c.token = Some("tok".into());
    // Without reconnects, the end of the session is the end of the client.
    c.reconnect = false;
    let client = Client::start(c).await.unwrap();
    // Busy: a stream open longer than the timeout keeps the session.
    let mut s = TcpStream::connect(client.local_addrs[0]).await.unwrap();
    for _ in 0..4 {
        s.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(s);
    // Idle: closed within about a second more.
    let why = within(10, client.wait()).await;
    assert!(!why.is_empty());
    wait_log("no streams; --idle-timeout").await;
}

/// Whether the kernel's table holds the server's side of one connection
/// (local port `server`, remote port `client`) in state ESTABLISHED.
fn server_side_established(server: u16, client: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap(), 16).unwrap();
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        port(f[1]) == server && port(f[2]) == client && f[3] == "01"
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_peer_that_stops_reading_loses_its_carrier_once_the_session_closes() {
    use longhaul_carrier::tls::PinVerifier;
    use longhaul_proto::frame::Frame;
    use longhaul_proto::handshake::{Hello, HELLO_LEN};
    logs();
    let _dump = DumpLogsOnPanic;
    let srv = token_server(
        "tls://127.0.0.1:0",
        SessionConfig {
            control_limit: 64 * 1024,
            ..SessionConfig::default()
        },
    )
    .await;
    let cfg = longhaul_carrier::tls::client_config(None, PinVerifier::new(Some(srv.key))).unwrap();
    // Our own TCP connection, so that its port identifies it in the table.
    let tcp = TcpStream::connect(srv.addr).await.unwrap();
    let ours = tcp.local_addr().unwrap().port();
    let tls = longhaul_carrier::tls::connect(tcp, cfg).await.unwrap();
    let mut c = longhaul_carrier::Carrier::from_io(tls, None, None, "test".into());
    let pre = longhaul_forward::auth::preamble(Some("tok")).unwrap();
    c.writer.write_all(&pre).await.unwrap();
    c.writer
        .write_all(&Hello::ours(u16::MAX).encode())
        .await
        .unwrap();
    c.writer.flush().await.unwrap();
    let mut h = [0u8; HELLO_LEN];
    c.reader.read_exact(&mut h).await.unwrap();
    assert!(server_side_established(srv.addr.port(), ours));
    // A stream from a target that sends without end, and we stop reading:
    // the server's writer blocks on the full socket.
    let source = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let source_addr = source.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = source.accept().await {
            tokio::spawn(async move {
                let zeros = vec![0u8; 1 << 16];
                while s.write_all(&zeros).await.is_ok() {}
            });
        }
    });
    let open = Frame::Open {
        sender: 1,
        window: u32::MAX,
        max_packet: u16::MAX,
        dest: format!("tcp://{source_addr}"),
    };
    c.writer.write_all(&open.to_bytes().unwrap()).await.unwrap();
    c.writer.flush().await.unwrap();
    let mut buf = bytes::BytesMut::new();
    loop {
        use longhaul_proto::frame::{decode, DecodeLimits};
        if let Some(f) = decode(&mut buf, DecodeLimits::default()).unwrap() {
            if matches!(f, Frame::OpenSuccess { .. }) {
                break;
            }
            continue;
        }
        within(5, c.reader.read_buf(&mut buf)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // PINGs without ever reading a PONG: the server's writer blocks on a
    // full socket, its control lane overflows and the session is closed.
    let mut pings = Vec::new();
    for i in 0..4096u64 {
        pings.extend_from_slice(&Frame::Ping { nonce: i }.to_bytes().unwrap());
    }
    let flood = async {
        loop {
            if c.writer.write_all(&pings).await.is_err() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::select! {
            _ = flood => {}
            _ = wait_log("peer is not reading its control messages") => {}
        }
    })
    .await;
    assert!(log_contains("peer is not reading its control messages"));
    // The writer, stuck on the full socket, must be cancelled and the
    // carrier dropped, not left behind the closed session.
    let t = Instant::now();
    while server_side_established(srv.addr.port(), ours) {
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "the server still holds the carrier {:?} after its session closed",
            t.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(c);
}
