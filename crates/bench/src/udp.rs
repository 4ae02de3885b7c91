//! `longhaul bench udp`: UDP at a set rate and size, like `iperf3 -u`, but
//! measured over the round trip: the bench server's UDP socket (the same
//! port as its TCP listener) sends every bench datagram back to where it
//! came from, so one command on one machine measures a direct path, a
//! `-L udp:` forward or a SOCKS5 association, with one clock.
//!
//! Each datagram carries `"LHU1" | seq u64 | sent_ns u64` (big endian,
//! then padding to the size). Reported: what was offered and what came
//! back (Mbit/s), loss, duplicates and datagrams that came back after a
//! later one (reordered), and the round trip's p50/p99 and jitter (the mean
//! difference between consecutive round trips, RFC 3550's estimator
//! without its smoothing).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::net::UdpSocket;

use crate::stats::percentile;

pub const UDP_MAGIC: &[u8; 4] = b"LHU1";
/// What the reflector sends back: never reflected again, so two
/// reflectors (or a reflector and any echo service) cannot be made to
/// bounce a forged datagram between them for ever.
pub const UDP_REPLY_MAGIC: &[u8; 4] = b"LHU2";
const HEADER: usize = 20;
/// Largest datagram the bench sends (the largest UDP payload over IPv4).
pub const MAX_SIZE: usize = 65_507;
/// Datagrams one run sends at most: the record of what came back is a
/// bit per datagram.
pub const MAX_DATAGRAMS: u64 = 50_000_000;
/// Round-trip samples kept (every one up to this many, then a spread).
const MAX_SAMPLES: usize = 1 << 20;
/// How long the client waits for stragglers after the last datagram.
const DRAIN: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct UdpOptions {
    pub addr: String,
    /// Bits per second offered.
    pub rate: u64,
    /// Bytes per datagram (UDP payload).
    pub size: usize,
    pub duration: Duration,
    /// Sent first and not counted (see `bench udp --warmup`).
    pub warmup: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UdpResult {
    pub addr: String,
    pub size: usize,
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub lost_percent: f64,
    pub duplicates: u64,
    pub reordered: u64,
    pub offered_mbit_s: f64,
    pub received_mbit_s: f64,
    pub rtt_p50_us: f64,
    pub rtt_p99_us: f64,
    pub jitter_us: f64,
}

impl UdpResult {
    pub fn human(&self) -> String {
        format!(
            "udp {}: {} B datagrams, offered {:.1} Mbit/s, back {:.1} Mbit/s\n  sent {}  back {}  lost {} ({:.3} %)  duplicates {}  reordered {}\n  round trip p50 {:.0} µs  p99 {:.0} µs  jitter {:.0} µs\n",
            self.addr,
            self.size,
            self.offered_mbit_s,
            self.received_mbit_s,
            self.sent,
            self.received,
            self.lost,
            self.lost_percent,
            self.duplicates,
            self.reordered,
            self.rtt_p50_us,
            self.rtt_p99_us,
            self.jitter_us
        )
    }
}

/// What came back, as the receiving task counts it.
#[derive(Default)]
struct Back {
    seen: Vec<u8>,
    received: u64,
    duplicates: u64,
    reordered: u64,
    highest: Option<u64>,
    rtts_us: Vec<f64>,
    jitter_sum: f64,
    jitter_n: u64,
    last_rtt: Option<f64>,
    bytes: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Back {
    fn add(&mut self, seq: u64, rtt_us: f64, n: usize, now: Instant) {
        let (byte, bit) = ((seq / 8) as usize, 1u8 << (seq % 8));
        let Some(b) = self.seen.get_mut(byte) else {
            return;
        };
        if *b & bit != 0 {
            self.duplicates += 1;
            return;
        }
        *b |= bit;
        self.received += 1;
        self.bytes += n as u64;
        self.first.get_or_insert(now);
        self.last = Some(now);
        match self.highest {
            Some(h) if seq < h => self.reordered += 1,
            _ => self.highest = Some(seq),
        }
        if let Some(prev) = self.last_rtt {
            self.jitter_sum += (rtt_us - prev).abs();
            self.jitter_n += 1;
        }
        self.last_rtt = Some(rtt_us);
        if self.rtts_us.len() < MAX_SAMPLES {
            self.rtts_us.push(rtt_us);
        } else {
            // Past the bound, a sample replaces one spread over the rest.
            let i = (seq as usize).wrapping_mul(2_654_435_761) % MAX_SAMPLES;
            self.rtts_us[i] = rtt_us;
        }
    }
}

/// Runs one test against a bench server's UDP port (or a forward to it).
pub async fn run(opts: UdpOptions) -> std::io::Result<UdpResult> {
    if !(HEADER..=MAX_SIZE).contains(&opts.size) {
        return Err(std::io::Error::other(format!(
            "datagram size {} out of range (give {HEADER} to {MAX_SIZE})",
            opts.size
        )));
    }
    let bytes_per_sec = (opts.rate / 8).max(1) as f64;
    let count = |d: Duration| ((bytes_per_sec * d.as_secs_f64()) / opts.size as f64).ceil() as u64;
    let total = count(opts.duration);
    // Datagrams numbered below `warm` are the warm-up's.
    let warm = count(opts.warmup);
    if total.saturating_add(warm) > MAX_DATAGRAMS {
        return Err(std::io::Error::other(format!(
            "{total} datagrams is more than one run sends ({MAX_DATAGRAMS}): lower the rate or the time"
        )));
    }
    let sock = UdpSocket::bind(match tokio::net::lookup_host(&opts.addr).await?.next() {
        Some(a) if a.is_ipv6() => "[::]:0",
        _ => "0.0.0.0:0",
    })
    .await?;
    sock.connect(&opts.addr).await?;
    let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(4 << 20);
    let _ = socket2::SockRef::from(&sock).set_send_buffer_size(4 << 20);
    let sock = Arc::new(sock);
    let start = Instant::now();
    let back = Arc::new(std::sync::Mutex::new(Back {
        seen: vec![0; (total as usize).div_ceil(8)],
        ..Back::default()
    }));
    let receiver = {
        let (sock, back) = (sock.clone(), back.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; MAX_SIZE + 1];
            loop {
                let Ok(n) = sock.recv(&mut buf).await else {
                    continue;
                };
                if n < HEADER || &buf[..4] != UDP_REPLY_MAGIC {
                    continue;
                }
                let now = Instant::now();
                let seq = u64::from_be_bytes(buf[4..12].try_into().unwrap_or_default());
                let sent = u64::from_be_bytes(buf[12..20].try_into().unwrap_or_default());
                let Some(seq) = seq.checked_sub(warm) else {
                    continue;
                };
                let rtt = now.duration_since(start).as_nanos() as f64 - sent as f64;
                let mut b = back.lock().unwrap_or_else(|p| p.into_inner());
                b.add(seq, rtt / 1e3, n, now);
            }
        })
    };
    // Paced in 1 ms steps: each sends what the rate allows so far.
    let mut datagram = vec![0u8; opts.size];
    datagram[..4].copy_from_slice(UDP_MAGIC);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0u64;
    let mut measured_from = start;
    while sent < warm + total {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() * bytes_per_sec) / opts.size as f64) as u64;
        while sent < due.min(warm + total) {
            if sent == warm {
                measured_from = Instant::now();
            }
            datagram[4..12].copy_from_slice(&sent.to_be_bytes());
            let ns = start.elapsed().as_nanos() as u64;
            datagram[12..20].copy_from_slice(&ns.to_be_bytes());
            // A full socket buffer or an ICMP error: counted as lost.
            let _ = sock.send(&datagram).await;
            sent += 1;
        }
    }
    let sending = measured_from.elapsed();
    let sent = sent - warm;
    tokio::time::sleep(DRAIN).await;
    receiver.abort();
    let b = back.lock().unwrap_or_else(|p| p.into_inner());
    let mut rtts = b.rtts_us.clone();
    rtts.sort_by(|x, y| x.total_cmp(y));
    let span = match (b.first, b.last) {
        (Some(f), Some(l)) if l > f => l.duration_since(f).as_secs_f64(),
        _ => sending.as_secs_f64(),
    };
    let lost = sent - b.received;
    Ok(UdpResult {
        addr: opts.addr.clone(),
        size: opts.size,
        sent,
        received: b.received,
        lost,
        lost_percent: 100.0 * lost as f64 / sent.max(1) as f64,
        duplicates: b.duplicates,
        reordered: b.reordered,
        offered_mbit_s: (sent * opts.size as u64 * 8) as f64 / sending.as_secs_f64() / 1e6,
        received_mbit_s: (b.bytes * 8) as f64 / span.max(1e-9) / 1e6,
        rtt_p50_us: percentile(&rtts, 50.0),
        rtt_p99_us: percentile(&rtts, 99.0),
        jitter_us: b.jitter_sum / b.jitter_n.max(1) as f64,
    })
}

/// The bench server's UDP side: every bench datagram goes back to its
/// sender, marked as a reply (one for one: nothing is amplified; datagrams
/// without the bench's magic, replies included, get nothing).
pub async fn reflect(sock: UdpSocket) {
    let mut buf = vec![0u8; MAX_SIZE + 1];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        if n >= HEADER && &buf[..4] == UDP_MAGIC {
            buf[..4].copy_from_slice(UDP_REPLY_MAGIC);
            let _ = sock.send_to(&buf[..n], from).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_duplicates_and_reordering_are_counted() {
        let mut b = Back {
            seen: vec![0; 2],
            ..Back::default()
        };
        let now = Instant::now();
        for (seq, rtt) in [(0, 100.0), (2, 110.0), (1, 90.0), (2, 80.0), (3, 100.0)] {
            b.add(seq, rtt, 100, now);
        }
        // 99 is beyond what was sent: ignored.
        b.add(99, 1.0, 100, now);
        assert_eq!((b.received, b.duplicates, b.reordered), (4, 1, 1));
        assert_eq!(b.rtts_us, vec![100.0, 110.0, 90.0, 100.0]);
        assert!((b.jitter_sum / b.jitter_n as f64 - 40.0 / 3.0).abs() < 1e-9);
    }
}
