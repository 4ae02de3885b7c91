//! Sessions that survive their carrier: real client and server on
//! loopback, with a relay between them that the test resets, takes down
//! or silences. Every stream's bytes are hashed end to end.

use crate::common;
use crate::common::relay;
use crate::common::transfer;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use longhaul_carrier::Identity;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_forward::{Client, ClientConfig, Server, ServerConfig};
use longhaul_session::SessionConfig;
use relay::Relay;
use tokio::net::{TcpListener, TcpStream};
use transfer::*;

/// Starts a server; its address.
async fn run(cfg: ServerConfig) -> SocketAddr {
    let s = Server::bind(cfg).await.unwrap();
    let addr = s.local_addr().unwrap();
    tokio::spawn(s.run());
    addr
}

async fn plain_server(session: SessionConfig, rules: Rules, bind_rules: BindRules) -> SocketAddr {
    start_server_with(rules, bind_rules, session).await
}

/// The drop test over one carrier kind: two resets mid-transfer, the path
/// back after 2 s each time.
async fn survives_two_resets(
    server: SocketAddr,
    mut cfg: ClientConfig,
    target_progress: (Arc<AtomicU64>, Target),
) {
    let (progress, target) = target_progress;
    let relay = Relay::start(server).await;
    cfg.server = match cfg.server {
        longhaul_carrier::CarrierUrl::Net { transport, .. } => longhaul_carrier::CarrierUrl::Net {
            transport,
            addr: relay.addr.to_string(),
        },
        other => other,
    };
    cfg.local = vec![fwd("127.0.0.1", target.0.port())];
    cfg.session = quick_session();
    let client = Client::start(cfg).await.unwrap();
    let before = client.session().resume_id();
    transfer_while(&client, target, progress, |p| async move {
        until_progress(&p, 0.3).await;
        relay.outage(Duration::from_secs(2)).await;
        until_progress(&p, 0.7).await;
        relay.outage(Duration::from_secs(2)).await;
    })
    .await;
    let s = client.session();
    assert_eq!(
        s.resume_id(),
        before,
        "the session was replaced, not resumed"
    );
    let st = s.stats();
    assert!(st.resumes >= 2, "resumed {} times", st.resumes);
    assert!(!s.is_closed());
    wait_log("session resumed on a new carrier").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_streams_survive_two_carrier_resets_over_tcp() {
    logs();
    let progress = Arc::new(AtomicU64::new(0));
    let target = hashing_target(progress.clone()).await;
    let server = plain_server(
        quick_session(),
        Rules::new(vec![target.0.to_string().parse().unwrap()], false),
        BindRules::default(),
    )
    .await;
    let mut cfg = client_config(server);
    cfg.insecure = true;
    survives_two_resets(server, cfg, (progress, target)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_streams_survive_two_carrier_resets_over_tls() {
    logs();
    let (sid, cid) = (Identity::generate().unwrap(), Identity::generate().unwrap());
    let progress = Arc::new(AtomicU64::new(0));
    let target = hashing_target(progress.clone()).await;
    let mut scfg = ServerConfig::new("tls://127.0.0.1:0".parse().unwrap());
    scfg.identity = Some(sid.clone());
    scfg.auth.authorized_keys = Some(
        longhaul_forward::auth::AuthorizedKeys::parse(&format!("{}\n", cid.fingerprint), "test")
            .unwrap(),
    );
    scfg.rules = Rules::new(vec![target.0.to_string().parse().unwrap()], false);
    scfg.session = quick_session();
    let server = run(scfg).await;
    let mut cfg = ClientConfig::new(format!("tls://{server}").parse().unwrap());
    cfg.identity = Some(cid);
    cfg.pin = Some(sid.fingerprint);
    survives_two_resets(server, cfg, (progress, target)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carrier_gone_silent_is_detected_and_resumed() {
    logs();
    let progress = Arc::new(AtomicU64::new(0));
    let target = hashing_target(progress.clone()).await;
    let server = plain_server(
        quick_session(),
        Rules::new(vec![target.0.to_string().parse().unwrap()], false),
        BindRules::default(),
    )
    .await;
    let relay = Relay::start(server).await;
    let mut cfg = client_config(relay.addr);
    cfg.local = vec![fwd("127.0.0.1", target.0.port())];
    cfg.session = quick_session();
    let client = Client::start(cfg).await.unwrap();
    let t = Arc::new(std::sync::Mutex::new(None));
    let t2 = t.clone();
    transfer_while(&client, target, progress, |p| async move {
        until_progress(&p, 0.4).await;
        // No reset, no EOF: the bytes just stop.
        relay.go_silent();
        let at = Instant::now();
        wait_log("nothing heard from the peer").await;
        *t2.lock().unwrap() = Some(at.elapsed());
        // The silent connection is gone for good once detected.
        relay.reset_silent();
    })
    .await;
    let took = t.lock().unwrap().unwrap();
    assert!(
        took < Duration::from_secs(10),
        "silence noticed after {took:?}"
    );
    assert!(client.session().stats().resumes >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_streams_survive_two_carrier_resets_over_websocket() {
    logs();
    let progress = Arc::new(AtomicU64::new(0));
    let target = hashing_target(progress.clone()).await;
    let mut scfg = ServerConfig::new("ws://127.0.0.1:0/tunnel".parse().unwrap());
    scfg.auth.insecure = true;
    scfg.rules = Rules::new(vec![target.0.to_string().parse().unwrap()], false);
    scfg.session = quick_session();
    let server = run(scfg).await;
    let mut cfg = ClientConfig::new(format!("ws://{server}/tunnel").parse().unwrap());
    cfg.insecure = true;
    survives_two_resets(server, cfg, (progress, target)).await;
}

/// Echo service for the reverse-forward and hostile tests.
async fn echo_ok(addr: SocketAddr) {
    let data = random_bytes(64 * 1024);
    let h = sha(&data);
    let s = TcpStream::connect(addr).await.unwrap();
    assert_eq!(sha(&within(20, send_and_collect(s, data)).await), h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reverse_forward_serves_a_connection_made_during_the_outage() {
    logs();
    let echo = echo_server().await;
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let binds = BindRules::new(vec![port.to_string().parse().unwrap()], false);
    let server = plain_server(quick_session(), Rules::default(), binds).await;
    let relay = Relay::start(server).await;
    let mut cfg = client_config(relay.addr);
    cfg.remote = vec![longhaul_forward::spec::ForwardSpec {
        transport: longhaul_forward::spec::Transport::Tcp,
        bind: "127.0.0.1".into(),
        port,
        host: "127.0.0.1".into(),
        host_port: echo.port(),
    }];
    cfg.session = quick_session();
    let client = Client::start(cfg).await.unwrap();
    let rport = SocketAddr::from(([127, 0, 0, 1], client.remote_ports[0]));
    echo_ok(rport).await;
    // The path goes down; the server keeps the -R listener of the detached
    // session, and a connection made now waits for the client.
    relay.set_down(true);
    relay.reset_all();
    wait_log("the session is kept for a resume").await;
    let during = tokio::spawn(echo_ok(rport));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    relay.set_down(false);
    within(20, during).await.unwrap();
    assert!(client.session().stats().resumes >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_resumes_are_refused_and_the_real_session_is_unharmed() {
    use longhaul_proto::resume::{Attach, Attached, Refusal, SessionId};
    logs();
    let (sid, alice, mallory) = (
        Identity::generate().unwrap(),
        Identity::generate().unwrap(),
        Identity::generate().unwrap(),
    );
    let echo = echo_server().await;
    let mut scfg = ServerConfig::new("tls://127.0.0.1:0".parse().unwrap());
    scfg.identity = Some(sid.clone());
    scfg.auth.authorized_keys = Some(
        longhaul_forward::auth::AuthorizedKeys::parse(
            &format!("{}\n{}\n", alice.fingerprint, mallory.fingerprint),
            "test",
        )
        .unwrap(),
    );
    scfg.rules = Rules::new(vec![echo.to_string().parse().unwrap()], false);
    let server = run(scfg).await;
    let url = format!("tls://{server}");
    let mut cfg = ClientConfig::new(url.parse().unwrap());
    cfg.identity = Some(alice.clone());
    cfg.pin = Some(sid.fingerprint);
    cfg.local = vec![fwd("127.0.0.1", echo.port())];
    let client = Client::start(cfg).await.unwrap();
    let fwd_addr = client.local_addrs[0];
    echo_ok(fwd_addr).await;
    let id = client.session().resume_id().unwrap();
    let tls_as = |who: &Identity| {
        let v = longhaul_carrier::tls::PinVerifier::new(Some(sid.fingerprint));
        Some(longhaul_carrier::tls::client_config(Some(who), v).unwrap())
    };
    let forged = |id: SessionId, attempt: u64, received: u64| Attach::Resume {
        id,
        attempt,
        received,
        proof: [7u8; 32],
        replay_limit: 1 << 20,
    };
    // Another authorized key, the real session's id.
    let mut c = dial_raw(&url, tls_as(&mallory)).await;
    assert_eq!(
        within(10, raw_attach(&mut c, forged(id, 1000, 0))).await,
        Attached::Refused(Refusal::Denied)
    );
    wait_log("belongs to key").await;
    // The right key, a wrong proof; twice at once.
    let mut c1 = dial_raw(&url, tls_as(&alice)).await;
    let mut c2 = dial_raw(&url, tls_as(&alice)).await;
    let (a1, a2) = tokio::join!(
        raw_attach(&mut c1, forged(id, 1001, 0)),
        raw_attach(&mut c2, forged(id, 1002, 0))
    );
    assert_eq!(a1, Attached::Refused(Refusal::Denied));
    assert_eq!(a2, Attached::Refused(Refusal::Denied));
    wait_log("wrong proof of the secret").await;
    // An id that does not exist.
    let mut c = dial_raw(&url, tls_as(&alice)).await;
    assert_eq!(
        within(10, raw_attach(&mut c, forged(SessionId([3; 16]), 1, 0))).await,
        Attached::Refused(Refusal::Unknown)
    );
    wait_log("resume refused: no session").await;
    // The right key and the real secret, but an offset beyond what the
    // server ever sent; then the same attempt number again.
    let (secret, _) = client.session().resume_secret_for_tests().unwrap();
    let beyond = 1 << 40;
    // A proof is made for the carrier it is sent on (its TLS exporter).
    let honest = |attempt: u64, c: &longhaul_carrier::Carrier| Attach::Resume {
        id,
        attempt,
        received: beyond,
        proof: longhaul_proto::resume::proof(
            &secret,
            &id,
            attempt,
            beyond,
            &c.binding.expect("a TLS carrier has a binding"),
        ),
        replay_limit: 1 << 20,
    };
    // Made on one carrier, shown on another (relayed): refused.
    let other = dial_raw(&url, tls_as(&alice)).await;
    let mut c = dial_raw(&url, tls_as(&alice)).await;
    assert_ne!(other.binding, c.binding);
    assert_eq!(
        within(10, raw_attach(&mut c, honest(4000, &other))).await,
        Attached::Refused(Refusal::Denied)
    );
    let mut c = dial_raw(&url, tls_as(&alice)).await;
    let ask = honest(5000, &c);
    assert_eq!(
        within(10, raw_attach(&mut c, ask)).await,
        Attached::Refused(Refusal::BadOffset)
    );
    wait_log("is possible").await;
    let mut c = dial_raw(&url, tls_as(&alice)).await;
    let ask = honest(5000, &c);
    assert_eq!(
        within(10, raw_attach(&mut c, ask)).await,
        Attached::Refused(Refusal::Denied)
    );
    wait_log("was already used").await;
    // The real session never noticed.
    echo_ok(fwd_addr).await;
    let s = client.session();
    assert_eq!(s.resume_id(), Some(id));
    assert_eq!(s.stats().resumes, 0);
    assert!(!s.is_detached());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_idle_close_the_client_comes_back_on_demand() {
    logs();
    let echo = echo_server().await;
    let server_session = SessionConfig {
        idle_timeout: Some(Duration::from_secs(1)),
        ..SessionConfig::default()
    };
    let server = plain_server(
        server_session,
        Rules::new(vec![echo.to_string().parse().unwrap()], false),
        BindRules::default(),
    )
    .await;
    let mut cfg = client_config(server);
    cfg.local = vec![fwd("127.0.0.1", echo.port())];
    let client = Client::start(cfg).await.unwrap();
    let first = client.session().resume_id();
    echo_ok(client.local_addrs[0]).await;
    // Idle: the server ends the session on purpose, and the client does
    // not dial again while nothing asks for it.
    wait_log("a new one starts with the next connection").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(client.session().is_closed(), "reconnected without demand");
    // A new connection brings a new session, and is served by it.
    echo_ok(client.local_addrs[0]).await;
    let s = client.session();
    assert!(!s.is_closed());
    assert_ne!(s.resume_id(), first);
}

/// The server gives a detached session up at `--resume-timeout` (the
/// connection's own deadline, run by the session's timer): the path stays
/// down longer than that, the server closes the session with that reason
/// within a second of the deadline, and the client, once the path is
/// back, starts a fresh session that carries bytes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_gives_a_detached_session_up_at_its_resume_timeout() {
    // It asserts what the log does not say: other tests would say it.
    if !common::alone(
        module_path!(),
        "the_server_gives_a_detached_session_up_at_its_resume_timeout",
    ) {
        return;
    }
    logs();
    let echo = echo_server().await;
    let server = plain_server(
        SessionConfig {
            resume_timeout: Duration::from_secs(1),
            ..quick_session()
        },
        Rules::new(vec![echo.to_string().parse().unwrap()], false),
        BindRules::default(),
    )
    .await;
    let relay = Relay::start(server).await;
    let mut cfg = client_config(relay.addr);
    cfg.local = vec![fwd("127.0.0.1", echo.port())];
    cfg.session = quick_session();
    let client = Client::start(cfg).await.unwrap();
    echo_streams(client.local_addrs[0], vec![1, 100_000]).await;
    let before = client.session().resume_id();
    assert!(!log_contains("not resumed within"));
    let down = Instant::now();
    let outage = relay.outage(Duration::from_secs(4));
    let expired = async {
        wait_log("not resumed within 1s (--resume-timeout)").await;
        down.elapsed()
    };
    let ((), took) = tokio::join!(outage, within(10, expired));
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_millis(2500),
        "the server gave the session up after {took:?}"
    );
    // Back: the resume is refused (the server let the session go); the
    // client's forward carries on over a new session.
    within(30, async {
        while client.session().resume_id() == before || client.session().is_closed() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    within(30, echo_streams(client.local_addrs[0], vec![1, 100_000])).await;
}
