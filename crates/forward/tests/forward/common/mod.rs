//! Shared helpers for the forwarding tests: real servers and clients on
//! loopback, plus small target services.

#![allow(dead_code)]

pub mod folder;
pub mod relay;
pub mod transfer;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use longhaul_forward::rules::{BindRules, Rules};
use longhaul_forward::spec::ForwardSpec;
use longhaul_forward::{Client, ClientConfig, Server, ServerConfig};
use longhaul_session::SessionConfig;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

pub fn sha(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

pub async fn start_server(rules: Rules, bind_rules: BindRules) -> SocketAddr {
    start_server_with(rules, bind_rules, SessionConfig::default()).await
}

pub async fn start_server_with(
    rules: Rules,
    bind_rules: BindRules,
    session: SessionConfig,
) -> SocketAddr {
    // Plain TCP: these tests are about the multiplexer and forwarders; the
    // secure carriers have their own tests.
    let mut cfg = ServerConfig::new("tcp://127.0.0.1:0".parse().unwrap());
    cfg.auth.insecure = true;
    cfg.rules = rules;
    cfg.bind_rules = bind_rules;
    cfg.session = session;
    let s = Server::bind(cfg).await.unwrap();
    let addr = s.local_addr().unwrap();
    tokio::spawn(s.run());
    addr
}

pub fn fwd(host: &str, port: u16) -> ForwardSpec {
    ForwardSpec {
        transport: longhaul_forward::spec::Transport::Tcp,
        bind: "127.0.0.1".into(),
        port: 0,
        host: host.into(),
        host_port: port,
    }
}

/// A client with one `-L` forward per target; returns the client.
pub async fn start_client(server: SocketAddr, targets: &[SocketAddr]) -> Client {
    let mut cfg = ClientConfig::new(format!("tcp://{server}").parse().unwrap());
    cfg.insecure = true;
    cfg.local = targets
        .iter()
        .map(|t| fwd(&t.ip().to_string(), t.port()))
        .collect();
    Client::start(cfg).await.unwrap()
}

/// Echo service: writes back everything, half-closes after EOF.
pub async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// Sends `data` and reads everything back concurrently.
pub async fn send_and_collect(mut s: TcpStream, data: Vec<u8>) -> Vec<u8> {
    let (mut r, mut w) = s.split();
    let write = async {
        w.write_all(&data).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let read = async {
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        got
    };
    let ((), got) = tokio::join!(write, read);
    got
}

pub async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("timed out")
}

/// Runs one echo round trip per entry of `sizes`, all at once, through
/// `fwd`; each stream's bytes must come back unchanged.
pub async fn echo_streams(fwd: SocketAddr, sizes: Vec<usize>) {
    let mut tasks = vec![];
    for (i, size) in sizes.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let data = random_bytes(size);
            let h = sha(&data);
            let s = TcpStream::connect(fwd).await.unwrap();
            let got = send_and_collect(s, data).await;
            assert_eq!(sha(&got), h, "stream {i} corrupted");
        }));
    }
    within(60, async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
}

/// A client config for a plain-TCP test server.
pub fn client_config(server: SocketAddr) -> ClientConfig {
    let mut cfg = ClientConfig::new(format!("tcp://{server}").parse().unwrap());
    cfg.insecure = true;
    cfg
}

/// Log lines of every test in this binary (all of the crate's integration
/// tests), captured so tests can check that a refusal says why; a test that
/// asserts a line is absent runs `alone`.
#[derive(Clone, Default)]
pub struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn logs() -> &'static LogBuf {
    static LOGS: OnceLock<LogBuf> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = LogBuf::default();
        let w = buf.clone();
        tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
        buf
    })
}

/// Everything logged so far.
pub fn log_text() -> String {
    String::from_utf8_lossy(&logs().0.lock().unwrap()).to_string()
}

pub fn log_contains(s: &str) -> bool {
    String::from_utf8_lossy(&logs().0.lock().unwrap()).contains(s)
}

pub async fn wait_log(s: &str) {
    for _ in 0..100 {
        if log_contains(s) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("log never said '{s}'");
}

/// Prints the captured log when a test fails (drop during a panic).
pub struct DumpLogsOnPanic;
impl Drop for DumpLogsOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- captured log ---\n{}",
                String::from_utf8_lossy(&logs().0.lock().unwrap())
            );
        }
    }
}

/// A raw peer of a plain-TCP test server: connects, sends the empty
/// authentication preamble and completes the native hello, as a real client
/// would; what it sends next is up to the test.
pub async fn native_peer(server: SocketAddr) -> TcpStream {
    use longhaul_proto::handshake::{Hello, HELLO_LEN};
    let mut s = TcpStream::connect(server).await.unwrap();
    s.write_all(&longhaul_forward::auth::preamble(None).unwrap())
        .await
        .unwrap();
    s.write_all(&Hello::ours(u16::MAX).encode()).await.unwrap();
    let mut h = [0u8; HELLO_LEN];
    s.read_exact(&mut h).await.unwrap();
    Hello::decode(&h).unwrap();
    s
}

/// A field of this process's `/proc/self/status`, in bytes (`VmRSS:`,
/// `VmHWM:`); memory tests run alone in their process.
pub fn status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = s
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib * 1024
}

/// A target that accepts and holds connections but never reads, with a
/// tiny receive buffer, so what is sent to it waits in the sender.
pub fn never_reading_target(backlog: i32) -> SocketAddr {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    sock.listen(backlog).unwrap();
    sock.set_nonblocking(true).unwrap();
    let l = TcpListener::from_std(sock.into()).unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = vec![];
        while let Ok((c, _)) = l.accept().await {
            held.push(c);
        }
    });
    addr
}

/// Sends a raw attach message after the hello, on a carrier that passed
/// the server's authentication; returns the server's answer.
pub async fn raw_attach(
    carrier: &mut longhaul_carrier::Carrier,
    ask: longhaul_proto::resume::Attach,
) -> longhaul_proto::resume::Attached {
    use longhaul_proto::handshake::{Hello, FEATURE_INSTANCE, FEATURE_RESUME, HELLO_LEN};
    use longhaul_proto::resume::{Attached, ATTACHED_LEN};
    let mut hello = Hello::ours(u16::MAX);
    hello.features |= FEATURE_RESUME;
    // The bare answer, without the instance name behind a new one.
    hello.features &= !FEATURE_INSTANCE;
    carrier.writer.write_all(&hello.encode()).await.unwrap();
    carrier.writer.write_all(&ask.encode()).await.unwrap();
    carrier.writer.flush().await.unwrap();
    let mut h = [0u8; HELLO_LEN];
    carrier.reader.read_exact(&mut h).await.unwrap();
    let mut b = [0u8; ATTACHED_LEN];
    carrier.reader.read_exact(&mut b).await.unwrap();
    Attached::decode(&b).unwrap()
}

/// Dials `url` as a client would and sends the empty authentication
/// preamble: a carrier ready for the hello.
pub async fn dial_raw(
    url: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> longhaul_carrier::Carrier {
    let opts = longhaul_carrier::DialOptions {
        tls,
        congestion: None,
        bind: None,
        instance: None,
    };
    let mut c = longhaul_carrier::dial(&url.parse().unwrap(), &opts)
        .await
        .unwrap();
    let p = longhaul_forward::auth::preamble(None).unwrap();
    c.writer.write_all(&p).await.unwrap();
    c
}

/// Shared by every crate's tests: [`alone::alone`].
#[path = "../../../../../tests/support/alone.rs"]
mod alone;
pub use alone::alone;
