//! Striped sessions: one session over several TCP connections ("lanes"),
//! real client and server on loopback with a relay between them that the
//! test uses to reset or silence one lane. Every stream's bytes are hashed
//! end to end.

use crate::common;
use crate::common::relay;
use crate::common::transfer;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use longhaul_carrier::Identity;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_forward::{Client, ClientConfig, Server, ServerConfig};
use longhaul_proto::resume::{Attach, Attached, Refusal, SessionId};
use relay::Relay;
use transfer::*;

const LANES: u8 = 4;

async fn run(cfg: ServerConfig) -> SocketAddr {
    let s = Server::bind(cfg).await.unwrap();
    let addr = s.local_addr().unwrap();
    tokio::spawn(s.run());
    addr
}

/// A plain-TCP server allowing `target`, with a relay in front; a client
/// config striped over `LANES` lanes through the relay.
async fn striped_setup(target: SocketAddr, max_stripes: u8) -> (Relay, ClientConfig) {
    let mut session = quick_session();
    session.max_stripes = max_stripes;
    let server = start_server_with(
        Rules::new(vec![target.to_string().parse().unwrap()], false),
        BindRules::default(),
        session,
    )
    .await;
    let relay = Relay::start(server).await;
    let mut cfg = client_config(relay.addr);
    cfg.local = vec![fwd("127.0.0.1", target.port())];
    cfg.session = quick_session();
    cfg.session.stripes = LANES;
    (relay, cfg)
}

/// Waits until the client's session runs on `n` lanes.
async fn until_lanes(client: &Client, n: usize) {
    within(20, async {
        while client.session().lanes() != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_streams_over_four_lanes_arrive_intact() {
    logs();
    let _dump = DumpLogsOnPanic;
    let progress = Arc::new(AtomicU64::new(0));
    let target = hashing_target(progress.clone()).await;
    let (relay, cfg) = striped_setup(target.0, 8).await;
    let client = Client::start(cfg).await.unwrap();
    until_lanes(&client, LANES as usize).await;
    assert_eq!(client.session().lanes_wanted(), LANES as usize);
    transfer_while(&client, target, progress, |_| async {}).await;
    let s = client.session();
    // Every lane carried a share.
    let per_lane: Vec<u64> = s.lane_stats().iter().map(|l| l.bytes_sent).collect();
    assert_eq!(per_lane.len(), LANES as usize);
    assert!(per_lane.iter().all(|&b| b > 0), "lanes sent {per_lane:?}");
    assert_eq!(relay.live().len(), LANES as usize);
    assert_eq!(s.stats().resumes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_reset_mid_transfer_loses_nothing_and_is_replaced() {
    logs();
    let _dump = DumpLogsOnPanic;
    let progress = Arc::new(AtomicU64::new(0));
    let target = hashing_target(progress.clone()).await;
    let (relay, cfg) = striped_setup(target.0, 8).await;
    let client = Client::start(cfg).await.unwrap();
    until_lanes(&client, LANES as usize).await;
    let id = client.session().resume_id();
    transfer_while(&client, target, progress, |p| async move {
        until_progress(&p, 0.3).await;
        relay.reset_one(relay.live()[1]);
        wait_log("lane lost").await;
        until_progress(&p, 0.6).await;
        relay.reset_one(relay.live()[0]);
    })
    .await;
    let s = client.session();
    assert_eq!(s.resume_id(), id, "the session was replaced");
    assert_eq!(s.stats().resumes, 0, "a lost lane needs no resume");
    assert!(!s.is_closed());
    // The lost lanes were dialled again.
    until_lanes(&client, LANES as usize).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_stalled_lane_does_not_stall_the_session() {
    logs();
    let _dump = DumpLogsOnPanic;
    let progress = Arc::new(AtomicU64::new(0));
    let target = hashing_target(progress.clone()).await;
    let (relay, cfg) = striped_setup(target.0, 8).await;
    let client = Client::start(cfg).await.unwrap();
    until_lanes(&client, LANES as usize).await;
    // No reset, no EOF: one lane's bytes just stop, both ways — from the
    // start, so that the lane surely holds chunks of the transfer (silenced
    // at 30 %, it once had none in flight, in 1 CI run of many, and no stall
    // was there to see).
    let silenced = relay.live()[2];
    transfer_while(&client, target, progress, |_| async move {
        relay.silence_one(silenced);
    })
    .await;
    wait_log("lane stalled").await;
    let s = client.session();
    assert!(!s.is_closed());
    assert_eq!(s.stats().resumes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_streams_over_four_tls_lanes_arrive_intact() {
    logs();
    let _dump = DumpLogsOnPanic;
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
    let relay = Relay::start(server).await;
    let mut cfg = ClientConfig::new(format!("tls://{}", relay.addr).parse().unwrap());
    cfg.identity = Some(cid);
    cfg.pin = Some(sid.fingerprint);
    cfg.local = vec![fwd("127.0.0.1", target.0.port())];
    cfg.session = quick_session();
    cfg.session.stripes = LANES;
    let before = longhaul_carrier::tls::resumed_handshakes();
    let client = Client::start(cfg).await.unwrap();
    until_lanes(&client, LANES as usize).await;
    // The later lanes resumed the first lane's TLS session.
    assert!(
        longhaul_carrier::tls::resumed_handshakes() > before,
        "every lane made a full TLS handshake"
    );
    transfer_while(&client, target, progress, |p| async move {
        until_progress(&p, 0.5).await;
        relay.reset_one(relay.live()[3]);
    })
    .await;
    assert_eq!(client.session().stats().resumes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_streams_over_four_websocket_lanes_arrive_intact() {
    logs();
    let _dump = DumpLogsOnPanic;
    let progress = Arc::new(AtomicU64::new(0));
    let target = hashing_target(progress.clone()).await;
    let mut scfg = ServerConfig::new("ws://127.0.0.1:0/tunnel".parse().unwrap());
    scfg.auth.insecure = true;
    scfg.rules = Rules::new(vec![target.0.to_string().parse().unwrap()], false);
    scfg.session = quick_session();
    let server = run(scfg).await;
    let mut cfg = ClientConfig::new(format!("ws://{server}/tunnel").parse().unwrap());
    cfg.insecure = true;
    cfg.local = vec![fwd("127.0.0.1", target.0.port())];
    cfg.session = quick_session();
    cfg.session.stripes = LANES;
    let client = Client::start(cfg).await.unwrap();
    until_lanes(&client, LANES as usize).await;
    transfer_while(&client, target, progress, |_| async {}).await;
    let s = client.session();
    assert!(s.lane_stats().iter().all(|l| l.bytes_sent > 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_grants_no_more_lanes_than_it_allows() {
    logs();
    let _dump = DumpLogsOnPanic;
    let echo = echo_server().await;
    let (_relay, cfg) = striped_setup(echo, 2).await;
    let client = Client::start(cfg).await.unwrap();
    until_lanes(&client, 2).await;
    assert_eq!(client.session().lanes_wanted(), 2);
    echo_streams(client.local_addrs[0], vec![1 << 20, 3 << 20]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_surplus_lanes_are_refused() {
    logs();
    let _dump = DumpLogsOnPanic;
    let echo = echo_server().await;
    let (relay, cfg) = striped_setup(echo, 8).await;
    let server = format!("tcp://{}", relay.addr);
    let client = Client::start(cfg).await.unwrap();
    until_lanes(&client, LANES as usize).await;
    let s = client.session();
    let id = s.resume_id().unwrap();
    let (secret, attempt) = s.resume_secret_for_tests().unwrap();
    let lane = |id: SessionId, attempt: u64, proof: [u8; 32]| Attach::Lane {
        id,
        attempt,
        lane: 9,
        proof,
    };
    // An unknown session.
    let mut c = dial_raw(&server, None).await;
    assert_eq!(
        within(10, raw_attach(&mut c, lane(SessionId([5; 16]), 1, [0; 32]))).await,
        Attached::Refused(Refusal::Unknown)
    );
    // A wrong proof.
    let mut c = dial_raw(&server, None).await;
    assert_eq!(
        within(10, raw_attach(&mut c, lane(id, attempt + 10, [7; 32]))).await,
        Attached::Refused(Refusal::Denied)
    );
    wait_log("wrong proof of the secret").await;
    // A resume's proof does not pass for a lane's.
    let p = longhaul_proto::resume::proof(&secret, &id, attempt + 11, 9, &[0; 32]);
    let mut c = dial_raw(&server, None).await;
    assert_eq!(
        within(10, raw_attach(&mut c, lane(id, attempt + 11, p))).await,
        Attached::Refused(Refusal::Denied)
    );
    // The right proof, but the session has all its lanes: the client is
    // told so, not that its proof was refused.
    let a = attempt + 1_000_000;
    // Plain tcp:// carriers: their binding is zeros.
    let p = longhaul_proto::resume::lane_proof(&secret, &id, a, 9, &[0; 32]);
    let mut c = dial_raw(&server, None).await;
    assert_eq!(
        within(10, raw_attach(&mut c, lane(id, a, p))).await,
        Attached::Refused(Refusal::LanesFull)
    );
    wait_log("a lane more is refused").await;
    // The real session never noticed.
    echo_streams(client.local_addrs[0], vec![1 << 20]).await;
    assert_eq!(s.lanes(), LANES as usize);
    assert!(!s.is_closed());
}

/// What a user on a flaky network saw: lanes reset one at a time, every
/// 30 ms, while the replay bound is small (so the senders sit at it and a
/// lost ACK or a stalled chunk would stop them for good). Every byte still
/// arrives, the session never ends, and it still opens streams afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_reset_every_30_ms_at_a_small_replay_bound_lose_nothing() {
    logs();
    let _dump = DumpLogsOnPanic;
    let progress = Arc::new(AtomicU64::new(0));
    let target = hashing_target(progress.clone()).await;
    let mut session = quick_session();
    session.max_stripes = 8;
    session.replay_limit = 512 << 10;
    let server = start_server_with(
        Rules::new(vec![target.0.to_string().parse().unwrap()], false),
        BindRules::default(),
        session.clone(),
    )
    .await;
    let relay = Relay::start(server).await;
    let mut cfg = client_config(relay.addr);
    cfg.local = vec![fwd("127.0.0.1", target.0.port())];
    cfg.session = session;
    cfg.session.stripes = LANES;
    let client = Client::start(cfg).await.unwrap();
    until_lanes(&client, LANES as usize).await;
    let id = client.session().resume_id();
    let total = (2 * STREAMS * PER_STREAM) as f64;
    transfer_while(&client, target, progress, |p| async move {
        let mut resets = 0;
        while resets < 150 && (p.load(std::sync::atomic::Ordering::SeqCst) as f64) < 0.9 * total {
            let live = relay.live();
            if let Some(&i) = live.get(resets % live.len().max(1)) {
                relay.reset_one(i);
                resets += 1;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        assert!(resets >= 20, "only {resets} resets before the end");
    })
    .await;
    let s = client.session();
    assert!(!s.is_closed(), "{:?}", s.close_reason());
    assert_eq!(s.resume_id(), id, "the session was replaced");
    // Still serving: a new stream opens and echoes through the target.
    let fwd = client.local_addrs[0];
    within(20, async {
        let mut c = tokio::net::TcpStream::connect(fwd).await.unwrap();
        use tokio::io::AsyncReadExt;
        let mut b = [0u8; 1024];
        let n = c.read(&mut b).await.unwrap();
        assert!(n > 0, "the target's bytes come through a fresh stream");
    })
    .await;
}

/// How a lane of the datagram tests goes bad.
#[derive(Clone, Copy, Debug)]
enum BadLane {
    /// Nothing passes either way (a NAT that forgot the flow).
    Silent,
    /// What the client sends is taken and lost; what the server sends
    /// still arrives (the lane still hears), while a bulk upload runs
    /// beside the datagrams.
    HearsButCannotSend,
}

/// Datagrams through a `-L udp:` forward of a striped session keep coming
/// back, promptly, while one lane is silent: a datagram travels on one
/// lane, outside the byte sequence, so it never waits for another lane's
/// lost bytes; once the lane counts as silent, datagrams avoid it.
/// (Measured: 139–140 of 150; 84–94 when datagrams did not avoid a
/// silent lane.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_keep_flowing_while_a_lane_is_stalled() {
    datagrams_beside_a_bad_lane(BadLane::Silent).await;
}

/// The same when the lane still hears the peer but what it sends is lost
/// (its socket never fills: a black hole that still takes the bytes),
/// while a bulk upload runs beside: the lane's chunks stall, and from
/// then on datagrams avoid it until something it sent is acknowledged.
/// (Without the stall rule the lane keeps taking a share of the
/// datagrams, all lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_avoid_a_lane_that_hears_but_cannot_send() {
    datagrams_beside_a_bad_lane(BadLane::HearsButCannotSend).await;
}

async fn datagrams_beside_a_bad_lane(bad: BadLane) {
    logs();
    let _dump = DumpLogsOnPanic;
    // An echo that answers each datagram with itself.
    let echo = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        while let Ok((n, from)) = echo.recv_from(&mut buf).await {
            let _ = echo.send_to(&buf[..n], from).await;
        }
    });
    // A sink for the bulk upload: reads and forgets.
    let sink = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink_addr = sink.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = sink.accept().await {
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut c, &mut tokio::io::sink()).await;
            });
        }
    });
    let server = start_server_with(
        Rules::new(
            vec![
                format!("udp:{echo_addr}").parse().unwrap(),
                sink_addr.to_string().parse().unwrap(),
            ],
            false,
        ),
        BindRules::default(),
        quick_session(),
    )
    .await;
    let relay = Relay::start(server).await;
    let mut cfg = client_config(relay.addr);
    cfg.local = vec![
        longhaul_forward::spec::parse_forward(
            &format!("udp:0:127.0.0.1:{}", echo_addr.port()),
            "-L",
        )
        .unwrap(),
        fwd("127.0.0.1", sink_addr.port()),
    ];
    cfg.session = quick_session();
    cfg.session.stripes = LANES;
    let client = Client::start(cfg).await.unwrap();
    until_lanes(&client, LANES as usize).await;
    let fwd = client.local_addrs[0];
    let app = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // The flow opens (its first datagrams may be lost while it does).
    let mut buf = vec![0u8; 2048];
    within(10, async {
        loop {
            app.send_to(b"hello", fwd).await.unwrap();
            if let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_millis(200), app.recv_from(&mut buf)).await
            {
                return;
            }
        }
    })
    .await;
    let lane = relay.live()[2];
    let bulk = match bad {
        BadLane::Silent => {
            relay.silence_one(lane);
            None
        }
        BadLane::HearsButCannotSend => {
            relay.black_hole_upstream(lane);
            // Bulk bytes beside the datagrams, until the test ends: every
            // lane takes chunks, the bad one's stall.
            let mut up = tokio::net::TcpStream::connect(client.local_addrs[1])
                .await
                .unwrap();
            Some(tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let block = vec![7u8; 256 << 10];
                while up.write_all(&block).await.is_ok() {}
            }))
        }
    };
    // 150 datagrams, one every 20 ms (a voice flow), each numbered and
    // timed; the answers are read as they come.
    let start = std::time::Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let app = Arc::new(app);
    let reader = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            while let Ok(Ok((n, _))) =
                tokio::time::timeout(Duration::from_secs(2), app.recv_from(&mut buf)).await
            {
                if n == 8 {
                    let k = u64::from_be_bytes(buf[..8].try_into().unwrap());
                    let _ = tx.send((k, start.elapsed()));
                }
            }
        })
    };
    let mut sent_at = vec![];
    for k in 0..150u64 {
        sent_at.push(start.elapsed());
        app.send_to(&k.to_be_bytes(), fwd).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    reader.await.unwrap();
    if let Some(b) = bulk {
        b.abort();
    }
    let mut back = std::collections::HashMap::new();
    while let Ok((k, at)) = rx.try_recv() {
        assert!(k < 150, "an answer to nothing sent");
        assert!(
            back.insert(k, at - sent_at[k as usize]).is_none(),
            "{k} twice"
        );
    }
    let mut rtts: Vec<Duration> = back.values().copied().collect();
    rtts.sort();
    let p90 = rtts.get(rtts.len() * 9 / 10).copied().unwrap_or_default();
    // Only those that went into the bad lane before it counted as silent
    // (half a second, both ways) or stalled are lost: after that datagrams
    // avoid it. And those that come back come promptly: none waits for the
    // bad lane's bytes.
    eprintln!(
        "{bad:?}: {} of 150 datagrams came back, p90 round trip {p90:?}",
        back.len()
    );
    assert!(
        back.len() >= 120,
        "{} of 150 datagrams came back",
        back.len()
    );
    // Once the bad lane is found (half a second of silence, or its first
    // stalled chunk) no datagram goes into it: none of the second half is
    // lost. (Measured: none; 7–11 without the stall rule, the lane still
    // taking its share.)
    let late_lost = (75..150).filter(|k| !back.contains_key(k)).count();
    assert!(late_lost <= 3, "{late_lost} of the last 75 datagrams lost");
    // A datagram that waited for the bad lane would come after its stall
    // (STALL_MIN, 250 ms, at the least); beside a bulk upload on a loaded
    // 2-core CI machine, good lanes' queues alone measured 112 ms.
    assert!(p90 < Duration::from_millis(200), "p90 round trip {p90:?}");
    assert!(!client.session().is_closed());
}
