//! Anyone who can write the folder can forge carriers. 300 forged carriers,
//! each stalled in the middle of a TLS record, held by the server until its
//! handshake timeout: the server's memory stays within a fixed allowance
//! per carrier, every forged file is gone afterwards, and a real client is
//! served meanwhile. In a binary of its own, so the RSS it checks is the
//! server's alone.

use crate::common;
use crate::common::folder;

use std::time::Duration;

use common::*;
use folder::{folder_server, Folder};
use longhaul_carrier::folder::record::{self, Kind};
use longhaul_forward::{Client, ClientConfig};
use longhaul_session::SessionConfig;

const FORGED: usize = 300;
/// What one carrier in its handshake may hold: read-ahead, the record
/// being read, TLS state, a thread's stack.
const PER_CARRIER: u64 = 384 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_carriers_cost_a_bounded_allowance_and_leave_nothing() {
    if !common::alone(
        module_path!(),
        "forged_carriers_cost_a_bounded_allowance_and_leave_nothing",
    ) {
        return;
    }
    logs();
    let _dump = DumpLogsOnPanic;
    let folder = Folder::new("memory");
    let (dir, url) = (&folder.0, folder.url());
    let session = SessionConfig {
        handshake_timeout: Duration::from_secs(3),
        ..SessionConfig::default()
    };
    let key = folder_server(&url, session).await;
    let echo = echo_server().await;
    let base = status_bytes("VmRSS:");

    // A TLS record header announcing 16 KiB, and a little less than that:
    // the server's TLS waits for the rest until its handshake timeout.
    let mut payload = vec![0x16, 0x03, 0x01, 0x40, 0x00];
    payload.extend(random_bytes(16_000));
    let forged = record::encode(Kind::Data, 0, &payload);
    for i in 0..FORGED {
        std::fs::write(dir.join(format!("lh-{:016x}.c.0", 0xf000 + i)), &forged).unwrap();
    }
    // A real client meanwhile.
    let mut c = ClientConfig::new(url.parse().unwrap());
    c.pin = Some(key);
    c.token = Some("tok".into());
    c.local = vec![fwd("127.0.0.1", echo.port())];
    // The listener keeps 32 carriers in their handshake and ends the
    // earliest to make room: among 300 forged ones arriving together, the
    // real client's may be one of those ended ("tls handshake eof"), and a
    // real client dials again.
    let mut tries = 0;
    let client = loop {
        match within(30, Client::start(c.clone())).await {
            Ok(client) => break client,
            Err(e) if tries < 4 => {
                tries += 1;
                eprintln!("client start {tries} failed: {e:#}");
            }
            Err(e) => panic!("the real client never got in: {e:#}"),
        }
    };
    echo_streams(client.local_addrs[0], vec![1, 100_000, 1 << 20]).await;
    wait_log("handshake not finished within").await;
    let peak = status_bytes("VmHWM:").saturating_sub(base);
    eprintln!("{FORGED} forged carriers: peak RSS +{} KiB", peak >> 10);
    assert!(
        peak < FORGED as u64 * PER_CARRIER,
        "peak RSS grew by {} MiB for {FORGED} forged carriers",
        peak >> 20
    );
    // Their files go: the server removes what it read and, after a grace
    // for a reader that never comes, what it wrote.
    let forged_left = || {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with("lh-000000000000f"))
            })
            .count()
    };
    within(20, async {
        while forged_left() > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    // And the real session still works.
    echo_streams(client.local_addrs[0], vec![1000]).await;
}
