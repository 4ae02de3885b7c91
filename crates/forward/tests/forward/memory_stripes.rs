//! A hostile striped peer: chunks with bogus offsets and lengths end the
//! session, and the server's memory stays bounded meanwhile. In a binary of
//! its own, so the RSS it checks is the server's alone.

use crate::common;

use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_proto::resume::{Attach, Attached};

/// X25519's base point: a valid key share.
const BASE_POINT: [u8; 32] = {
    let mut b = [0u8; 32];
    b[0] = 9;
    b
};
use longhaul_session::SessionConfig;

/// A raw striped peer: a new session with two lanes granted, on a carrier
/// the test writes lane messages to.
async fn raw_striped_peer(server: &str) -> longhaul_carrier::Carrier {
    let mut c = dial_raw(server, None).await;
    let answer = raw_attach(
        &mut c,
        Attach::New {
            replay_limit: 1 << 20,
            lanes: 2,
            share: BASE_POINT,
        },
    )
    .await;
    assert!(
        matches!(answer, Attached::New { lanes: 2, .. }),
        "{answer:?}"
    );
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_with_bogus_offsets_close_the_session() {
    if !common::alone(
        module_path!(),
        "chunks_with_bogus_offsets_close_the_session",
    ) {
        return;
    }
    use longhaul_proto::frame::Frame;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    logs();
    let _dump = DumpLogsOnPanic;
    let session = SessionConfig {
        max_stripes: 8,
        ..SessionConfig::default()
    };
    let server = start_server_with(Rules::default(), BindRules::default(), session).await;
    let server = format!("tcp://{server}");
    let base = status_bytes("VmRSS:");
    let cases: [(&str, u64, Vec<u8>); 3] = [
        // Far beyond the reorder window: never buffered.
        ("beyond the reorder window", 1 << 40, vec![0; 1000]),
        // At the next byte, but not frames.
        ("malformed frame", 0, vec![0xff; 64]),
        // A frame cut short at the end of the chunk.
        ("ends inside a frame", 0, {
            let mut f = Frame::Ping { nonce: 1 }.to_bytes().unwrap().to_vec();
            f.truncate(6);
            f
        }),
    ];
    for (why, offset, body) in cases {
        let mut c = raw_striped_peer(&server).await;
        let head = Frame::Chunk {
            offset,
            len: body.len() as u32,
        }
        .to_bytes()
        .unwrap();
        c.writer.write_all(&head).await.unwrap();
        c.writer.write_all(&body).await.unwrap();
        c.writer.flush().await.unwrap();
        wait_log(why).await;
        // The server ends the session: the lane closes.
        let mut sink = vec![0u8; 4096];
        within(10, async {
            while !matches!(c.reader.read(&mut sink).await, Ok(0) | Err(_)) {}
        })
        .await;
    }
    // A chunk header announcing more than a chunk may hold is refused
    // before anything is allocated for it.
    let mut c = raw_striped_peer(&server).await;
    let head = Frame::Chunk {
        offset: 0,
        len: u32::MAX,
    }
    .to_bytes()
    .unwrap();
    c.writer.write_all(&head).await.unwrap();
    c.writer.flush().await.unwrap();
    wait_log("allowed)").await;
    assert!(
        status_bytes("VmRSS:") < base + (64 << 20),
        "memory grew by {} bytes",
        status_bytes("VmRSS:") - base
    );
}
