//! `longhaul bench goodput`: seed 003's question — how much of the link a
//! transfer in blocks gets, by block size, when each block waits for its
//! acknowledgement (a chatty protocol: depth 1) and when several are in
//! flight at once (pipelined: depth D).
//!
//! Wire (mode 4): the client sends `size u32 | size bytes` blocks; the
//! server answers each whole block with one byte. Goodput is the payload
//! acknowledged over the time from the first byte sent to the last
//! acknowledgement.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::*;

/// The byte the server answers each block with.
pub const BLOCK_ACK: u8 = 0x06;

#[derive(Debug, Clone)]
pub struct GoodputOptions {
    pub addr: String,
    pub sizes: Vec<u32>,
    /// Blocks in flight at once; one run per depth.
    pub depths: Vec<u16>,
    /// Per run: stop after this many bytes…
    pub total: u64,
    /// …or this long, whichever comes first.
    pub duration: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GoodputCell {
    pub depth: u16,
    pub blocks: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub goodput_bps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GoodputRow {
    pub size: u32,
    pub cells: Vec<GoodputCell>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GoodputResult {
    pub addr: String,
    pub rows: Vec<GoodputRow>,
}

/// One run: blocks of `size`, at most `depth` unacknowledged.
async fn one(opts: &GoodputOptions, size: u32, depth: u16) -> std::io::Result<GoodputCell> {
    let s = connect(&opts.addr, None).await?;
    let (mut r, mut w) = s.into_split();
    w.write_all(&hello(MODE_BLOCKS, crate::send::Sender::Iperf, 0, 0))
        .await?;
    let want = (opts.total / size as u64).max(1);
    let window = Arc::new(tokio::sync::Semaphore::new(depth as usize));
    let start = Instant::now();
    let deadline = start + opts.duration;
    let w2 = window.clone();
    // Sends blocks while the window has room, until enough or time is up.
    let sender = tokio::spawn(async move {
        let payload = vec![0x5au8; size.min(1 << 20) as usize];
        let mut sent = 0u64;
        while sent < want && Instant::now() < deadline {
            let Ok(p) = w2.acquire().await else { break };
            p.forget();
            w.write_all(&size.to_be_bytes()).await?;
            let mut left = size as usize;
            while left > 0 {
                let n = left.min(payload.len());
                w.write_all(&payload[..n]).await?;
                left -= n;
            }
            sent += 1;
        }
        Ok::<_, std::io::Error>((sent, w))
    });
    let mut acked = 0u64;
    let mut ack = [0u8; 1];
    let mut sender = std::pin::pin!(sender);
    // Acknowledgements free the window, until the sender stops; then the
    // rest of what it sent is acknowledged. (A one-byte read is whole or
    // nothing, so leaving it for the sender's end loses nothing.)
    let (sent, mut w) = loop {
        tokio::select! {
            done = &mut sender => break done.map_err(std::io::Error::other)??,
            got = r.read_exact(&mut ack) => {
                got?;
                if ack[0] != BLOCK_ACK {
                    return Err(std::io::Error::other("goodput: unexpected answer"));
                }
                acked += 1;
                window.add_permits(1);
            }
        }
    };
    while acked < sent {
        r.read_exact(&mut ack).await?;
        acked += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    let _ = w.shutdown().await;
    let bytes = acked * size as u64;
    Ok(GoodputCell {
        depth,
        blocks: acked,
        bytes,
        seconds,
        goodput_bps: bytes as f64 * 8.0 / seconds.max(1e-9),
    })
}

pub async fn run(opts: GoodputOptions) -> std::io::Result<GoodputResult> {
    let mut rows = vec![];
    for &size in &opts.sizes {
        if size == 0 || size > MAX_RR_SIZE {
            return Err(std::io::Error::other(format!(
                "block size {size}: give 1 byte to 16 MiB"
            )));
        }
        let mut cells = vec![];
        for &depth in &opts.depths {
            cells.push(one(&opts, size, depth.max(1)).await?);
        }
        rows.push(GoodputRow { size, cells });
    }
    Ok(GoodputResult {
        addr: opts.addr,
        rows,
    })
}

/// Sizes for humans: 4 KiB, 16 MiB.
fn size_label(n: u32) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

impl GoodputResult {
    pub fn human(&self) -> String {
        let depths: Vec<u16> = self
            .rows
            .first()
            .map(|r| r.cells.iter().map(|c| c.depth).collect())
            .unwrap_or_default();
        let mut out = format!("{:>10}", "block");
        for d in &depths {
            out += &format!(" {:>16}", format!("depth {d} Mbit/s"));
        }
        out.push('\n');
        for r in &self.rows {
            out += &format!("{:>10}", size_label(r.size));
            for c in &r.cells {
                out += &format!(" {:>16.1}", c.goodput_bps / 1e6);
            }
            out.push('\n');
        }
        out
    }
}

/// Server side of mode 4: reads blocks (in 64 KiB pieces: nothing is held
/// whole) and answers each with one byte.
pub async fn serve_blocks(s: &mut tokio::net::TcpStream) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut len = [0u8; 4];
        match s.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let mut left = u32::from_be_bytes(len) as usize;
        if left > MAX_RR_SIZE as usize {
            return Err(std::io::Error::other("block too large"));
        }
        while left > 0 {
            let n = left.min(buf.len());
            s.read_exact(&mut buf[..n]).await?;
            left -= n;
        }
        s.write_all(&[BLOCK_ACK]).await?;
    }
}
