//! `longhaul bench server`.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::*;

/// Serves bench clients until dropped.
pub async fn run(listener: TcpListener, buffer: Option<u32>) {
    loop {
        let (sock, _) =
            longhaul_carrier::accept_with_backoff(&listener, "the bench listener").await;
        if let Some(b) = buffer {
            let s = socket2::SockRef::from(&sock);
            let _ = s.set_send_buffer_size(b as usize);
            let _ = s.set_recv_buffer_size(b as usize);
        }
        tokio::spawn(async move {
            if let Err(e) = serve(sock).await {
                tracing::debug!("bench connection: {e}");
            }
        });
    }
}

async fn serve(mut s: TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut h = [0u8; 16];
    s.read_exact(&mut h).await?;
    if &h[..4] != MAGIC {
        return Err(std::io::Error::other("not a longhaul bench client"));
    }
    let dur = u32::from_be_bytes([h[8], h[9], h[10], h[11]]).min(MAX_DURATION_MS);
    let omit = u32::from_be_bytes([h[12], h[13], h[14], h[15]]).min(MAX_DURATION_MS);
    match h[4] {
        MODE_UPLOAD => {
            let mut buf = vec![0u8; send::BLOCK];
            let mut meter = ReceiveMeter::new(Duration::from_millis(omit as u64));
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                meter.add(n);
            }
            let mut reply = [0u8; 24];
            reply[..8].copy_from_slice(&meter.omitted.to_be_bytes());
            reply[8..16].copy_from_slice(&meter.measured.to_be_bytes());
            let us = (meter.seconds() * 1e6) as u64;
            reply[16..].copy_from_slice(&us.to_be_bytes());
            s.write_all(&reply).await?;
            s.shutdown().await?;
        }
        MODE_DOWNLOAD => {
            let end = Instant::now() + Duration::from_millis(dur as u64 + omit as u64);
            send::send_until(&mut s, send::Sender::from_code(h[5]), end, None).await?;
            s.shutdown().await?;
        }
        MODE_RR => {
            let mut buf = Vec::new();
            loop {
                let mut len = [0u8; 4];
                match s.read_exact(&mut len).await {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e),
                }
                let n = u32::from_be_bytes(len);
                if n > MAX_RR_SIZE {
                    return Err(std::io::Error::other("rr request too large"));
                }
                buf.resize(n as usize, 0);
                s.read_exact(&mut buf).await?;
                s.write_all(&buf).await?;
            }
        }
        MODE_BLOCKS => crate::goodput::serve_blocks(&mut s).await?,
        m => return Err(std::io::Error::other(format!("unknown bench mode {m}"))),
    }
    Ok(())
}
