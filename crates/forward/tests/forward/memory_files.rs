//! The file service's bound, as memory: an authenticated peer that asks for
//! a large file on every file stream it may open, grants huge windows and
//! then never reads, must not make the server hold more than each stream's
//! pipe and block. Alone in its binary, so the process's resident memory is
//! this test's.

use crate::common;

use std::time::Duration;

use common::*;
use longhaul_files::serve::{FileServer, MAX_FILE_STREAMS};
use longhaul_files::wire::Request;
use longhaul_files::Access;
use longhaul_forward::{Server, ServerConfig};
use longhaul_proto::frame::{self, DecodeLimits, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_its_downloads_pins_only_the_pipes() {
    if !common::alone(
        module_path!(),
        "a_peer_that_never_reads_its_downloads_pins_only_the_pipes",
    ) {
        return;
    }
    logs();
    let dir = std::path::PathBuf::from(format!("/dev/shm/lh-mem-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // 64 MiB, written a MiB at a time (the peak RSS below counts from the
    // start of the process).
    let mut f = std::fs::File::create(dir.join("big.bin")).unwrap();
    for _ in 0..64 {
        std::io::Write::write_all(&mut f, &random_bytes(1 << 20)).unwrap();
    }
    drop(f);
    let mut cfg = ServerConfig::new("tcp://127.0.0.1:0".parse().unwrap());
    cfg.auth.insecure = true;
    cfg.files = Some(FileServer::open(&dir).unwrap());
    cfg.files_without_key = Some(Access::ReadOnly);
    let s = Server::bind(cfg).await.unwrap();
    let server = s.local_addr().unwrap();
    tokio::spawn(s.run());

    let base = status_bytes("VmRSS:");
    let mut peer = native_peer(server).await;
    for id in 0..MAX_FILE_STREAMS as u32 {
        let open = Frame::Open {
            sender: id,
            window: u32::MAX,
            max_packet: 65000,
            dest: longhaul_files::SERVICE.into(),
        };
        peer.write_all(&open.to_bytes().unwrap()).await.unwrap();
    }
    // Each stream's id at the server, then a download on each.
    let mut buf = bytes::BytesMut::with_capacity(1 << 16);
    let mut theirs = Vec::new();
    within(10, async {
        while theirs.len() < MAX_FILE_STREAMS {
            assert!(peer.read_buf(&mut buf).await.unwrap() > 0, "server hung up");
            while let Ok(Some(f)) = frame::decode(&mut buf, DecodeLimits::default()) {
                match f {
                    Frame::OpenSuccess { sender, .. } => theirs.push(sender),
                    Frame::OpenFailure { description, .. } => panic!("refused: {description}"),
                    _ => {}
                }
            }
        }
    })
    .await;
    let get = Request::Get {
        path: b"big.bin".to_vec(),
        have: 0,
        have_hash: [0; 32],
    }
    .encode();
    for &recipient in &theirs {
        let data = Frame::Data {
            recipient,
            payload: get.clone().into(),
        };
        peer.write_all(&data.to_bytes().unwrap()).await.unwrap();
    }
    peer.flush().await.unwrap();
    // From now on nothing is read: the server's sockets fill, then its
    // queues, then its pipes, and every file thread waits.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let grown = status_bytes("VmHWM:").saturating_sub(base);
    // Per stream: its pipe's queue (which may end one block past its
    // size), the block its thread waits to add, and the stream's send
    // queue in the session; plus the session's other buffers.
    let block = longhaul_files::transfer::SEND_BLOCK;
    let send_queue = longhaul_session::SessionConfig::default().send_queue;
    let per_stream = longhaul_session::PIPE_QUEUE + 2 * block + send_queue;
    let bound = (MAX_FILE_STREAMS * per_stream + (32 << 20)) as u64;
    eprintln!(
        "peak RSS grew by {} MiB (bound {} MiB)",
        grown >> 20,
        bound >> 20
    );
    assert!(
        grown < bound,
        "peak RSS grew by {} MiB with {MAX_FILE_STREAMS} downloads never read (bound {} MiB)",
        grown >> 20,
        bound >> 20
    );
    // Another peer meanwhile: its file stream, past the limit, is refused
    // at once rather than queued.
    let over = Frame::Open {
        sender: 10_000,
        window: 1 << 20,
        max_packet: 65000,
        dest: longhaul_files::SERVICE.into(),
    };
    let mut other = native_peer(server).await;
    other.write_all(&over.to_bytes().unwrap()).await.unwrap();
    let mut b2 = bytes::BytesMut::new();
    within(10, async {
        loop {
            assert!(other.read_buf(&mut b2).await.unwrap() > 0, "server hung up");
            while let Ok(Some(f)) = frame::decode(&mut b2, DecodeLimits::default()) {
                match f {
                    Frame::OpenFailure { description, .. } => {
                        assert!(description.contains("busy"), "{description}");
                        return;
                    }
                    Frame::OpenSuccess { .. } => panic!("a file stream past the limit"),
                    _ => {}
                }
            }
        }
    })
    .await;
    drop(peer);
    let _ = std::fs::remove_dir_all(&dir);
}
