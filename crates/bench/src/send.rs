//! How a bench sender writes: the same pattern as iperf3, or a plain
//! "fill the socket" loop.
//!
//! The pattern matters on a long path. Linux reports a full TCP socket
//! writable again only when a third of its send buffer is free, and the
//! send buffer is what limits the bytes in flight there. iperf3 (3.12,
//! Debian) waits in `select` and then writes at most ten 128 KiB blocks
//! per wake-up, so it rarely fills the buffer to the brim; a sender that
//! writes until the socket refuses (a blocking `write`, tokio's
//! `write_all`) does. At 100 ms RTT with 4 MiB buffers the first gets
//! 270–285 Mbit/s and the second 210–229 on the same path
//! (docs/BENCHMARKS.md, issue 11). `bench tput` uses iperf3's pattern, so
//! the two tools agree; `--sender fill` shows the other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;

/// Block size, as iperf3's default for TCP.
pub const BLOCK: usize = 128 * 1024;
/// Blocks written per wake-up at most, as iperf3's `multisend`.
const MULTISEND: usize = 10;

/// Sender patterns; the wire code is byte 5 of the bench hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sender {
    /// Wait until the kernel reports the socket writable (a level check,
    /// like `select`), then write up to ten blocks; iperf3's pattern.
    #[default]
    Iperf,
    /// Write block after block until the socket refuses, then wait.
    Fill,
}

impl Sender {
    pub fn code(self) -> u8 {
        match self {
            Sender::Iperf => 0,
            Sender::Fill => 1,
        }
    }

    pub fn from_code(c: u8) -> Sender {
        if c == 1 {
            Sender::Fill
        } else {
            Sender::Iperf
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Sender::Iperf => "iperf",
            Sender::Fill => "fill",
        }
    }
}

/// Sends `fill` bytes until `end`; counts every byte the socket took.
pub async fn send_until(
    s: &mut TcpStream,
    sender: Sender,
    end: Instant,
    counter: Option<&AtomicU64>,
) -> std::io::Result<()> {
    let buf = vec![0xa5u8; BLOCK];
    let count = |n: usize| {
        if let Some(c) = counter {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
    };
    match sender {
        Sender::Fill => {
            while Instant::now() < end {
                s.write_all(&buf).await?;
                count(BLOCK);
            }
        }
        Sender::Iperf => {
            while Instant::now() < end {
                s.writable().await?;
                // The runtime caches an edge; ask the kernel, as select()
                // would. "No" clears the cached readiness, so the next wait
                // lasts until the kernel's own wake-up.
                let level = s.try_io(Interest::WRITABLE, || {
                    if longhaul_carrier::poll_writable(&socket2::SockRef::from(&*s))? {
                        Ok(())
                    } else {
                        Err(std::io::ErrorKind::WouldBlock.into())
                    }
                });
                match level {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
                for _ in 0..MULTISEND {
                    match s.try_write(&buf) {
                        Ok(n) => count(n),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
    Ok(())
}
