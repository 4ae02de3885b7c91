//! The measuring kit: an iperf-like throughput test and seed 000's
//! request/response test, both against any TCP address, so the same command
//! measures a direct path and a path through a longhaul forward.
//!
//! Wire protocol between `bench tput`/`rr` and `bench server` (all big endian):
//! a 16-byte hello `"LHB1" | mode u8 | sender u8 | 2 reserved | duration_ms u32 | omit_ms u32`
//! (sender: how the sending side writes, [`send::Sender`]),
//! then
//! * mode 1 (upload): the client sends for omit + duration, shuts its write
//!   side; the server counts to EOF ([`ReceiveMeter`]) and answers
//!   `omitted u64 | measured u64 | measured_us u64`;
//! * mode 2 (download, `-R`): the server sends for omit + duration and
//!   closes; the client counts the same way;
//! * mode 3 (request/response): repeated `size u32 | size bytes`, each
//!   echoed back by the server;
//! * mode 4 (blocks, `bench goodput`): repeated `size u32 | size bytes`,
//!   each answered by one byte once it is all there.
//!
//! `bench udp` talks to the server's UDP socket on the same port (see
//! [`udp`]): every bench datagram is sent back as it is.
#![forbid(unsafe_code)]

pub mod carriers;
pub mod demo;
pub mod doctor;
pub mod goodput;
pub mod load;
pub mod matrix;
pub mod report;
pub mod rr;
pub mod send;
pub mod server;
pub mod sessions;
pub mod stats;
pub mod tput;
pub mod udp;

pub const MAGIC: &[u8; 4] = b"LHB1";
pub const MODE_UPLOAD: u8 = 1;
pub const MODE_DOWNLOAD: u8 = 2;
pub const MODE_RR: u8 = 3;
pub const MODE_BLOCKS: u8 = 4;
/// Largest request accepted in rr mode.
pub const MAX_RR_SIZE: u32 = 16 * 1024 * 1024;
/// Longest test a server agrees to run.
pub const MAX_DURATION_MS: u32 = 3_600_000;

/// The 16-byte hello. `omit_ms`: a warm-up at the start (slow start, window
/// growth) that is not measured, like iperf3's `-O`.
pub fn hello(mode: u8, sender: send::Sender, duration_ms: u32, omit_ms: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(MAGIC);
    h[4] = mode;
    h[5] = sender.code();
    h[8..12].copy_from_slice(&duration_ms.to_be_bytes());
    h[12..16].copy_from_slice(&omit_ms.to_be_bytes());
    h
}

/// Counts received bytes the way iperf3's receiver does: the clock starts
/// at the first byte; bytes that arrive within the warm-up are reported
/// apart; the measured span runs from the end of the warm-up to the last
/// byte.
#[derive(Debug, Clone, Copy)]
pub struct ReceiveMeter {
    omit: std::time::Duration,
    first: Option<std::time::Instant>,
    last: Option<std::time::Instant>,
    pub omitted: u64,
    pub measured: u64,
}

impl ReceiveMeter {
    pub fn new(omit: std::time::Duration) -> ReceiveMeter {
        ReceiveMeter {
            omit,
            first: None,
            last: None,
            omitted: 0,
            measured: 0,
        }
    }

    pub fn add(&mut self, n: usize) {
        let now = std::time::Instant::now();
        let first = *self.first.get_or_insert(now);
        if now < first + self.omit {
            self.omitted += n as u64;
        } else {
            self.measured += n as u64;
        }
        self.last = Some(now);
    }

    /// Seconds from the end of the warm-up to the last byte.
    pub fn seconds(&self) -> f64 {
        match (self.first, self.last) {
            (Some(f), Some(l)) => l.saturating_duration_since(f + self.omit).as_secs_f64(),
            _ => 0.0,
        }
    }
}

/// Connects to a bench peer, optionally with fixed socket buffers (an
/// application that cannot be retuned, as in seed 001).
pub async fn connect(addr: &str, buffer: Option<u32>) -> std::io::Result<tokio::net::TcpStream> {
    let target = tokio::net::lookup_host(addr)
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("cannot resolve {addr}")))?;
    let sock = if target.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if let Some(b) = buffer {
        sock.set_send_buffer_size(b)?;
        sock.set_recv_buffer_size(b)?;
    }
    let s = sock.connect(target).await?;
    s.set_nodelay(true)?;
    Ok(s)
}
