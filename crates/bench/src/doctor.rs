//! `longhaul doctor`: measures the path to a server and says, with
//! numbers, what limits it (seed 001's diagnosis, automated).
//!
//! Measured: the round trip (over the session), the throughput of the
//! session's carrier (the server sends for a few seconds), and of one plain
//! TCP connection with default buffers (the server listens once for it).
//! Read: both ends' TCP limits. Explained: what one connection can reach
//! with those buffers at this RTT (the send buffer of the side that sends
//! and half the receive buffer of the side that receives — the part the
//! kernel offers as window), what an application's own buffer caps it at,
//! and what to change where.

use std::time::{Duration, Instant};

use longhaul_forward::doctor::{self, Limits};
use longhaul_session::{LocalStream, SessionHandle};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The part of a send buffer that is data in flight: the kernel counts
/// each packet's whole memory (headers, skb) against `tcp_wmem`. Measured
/// on this kernel (6.18): one plain connection at 100 ms RTT with a 4 MiB
/// maximum carried 228 Mbit/s, 0.68 of 4 MiB per RTT.
const SEND_PAYLOAD_SHARE: f64 = 0.7;
/// Buffers are called the limit when what they allow is below this many
/// times the best rate measured.
const BUFFER_MARGIN: f64 = 1.1;

#[derive(Debug, Clone)]
pub struct DoctorOptions {
    /// Seconds each throughput is measured for (after the ramp-up: 20
    /// round trips, 1 to 5 s).
    pub seconds: u64,
    /// An application's socket buffer to explain (`--app-buffer`).
    pub app_buffer: Option<u64>,
    /// Host to open the plain TCP connection to (None: not measured).
    pub host: Option<String>,
    /// Say each step on stderr while measuring.
    pub progress: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Diagnosis {
    pub rtt_ms: f64,
    pub tunnel_bps: f64,
    /// One plain TCP connection with default buffers (None: could not be
    /// measured, e.g. a firewall).
    pub direct_bps: Option<f64>,
    pub client: Limits,
    pub server: Limits,
    /// What one connection's buffers allow at this RTT, server to client.
    pub buffer_cap_bps: f64,
    /// Which buffer that is, in words.
    pub buffer_limit: String,
    /// The bandwidth-delay product of the best rate measured, in bytes.
    pub bdp_bytes: f64,
    pub app_buffer_cap_bps: Option<f64>,
    /// The explanation, a sentence each.
    pub findings: Vec<String>,
    /// Commands to run, if any.
    pub advice: Vec<String>,
}

/// The tunnel under this share of one plain connection is called the limit.
const TUNNEL_BEHIND: f64 = 0.8;

/// Runs the measurements over `session` and explains them.
pub async fn run(session: &SessionHandle, o: &DoctorOptions) -> anyhow::Result<Diagnosis> {
    let say = |what: String| {
        if o.progress {
            eprintln!("doctor: {what}");
        }
    };
    say("measuring the round trip".into());
    let (mut r, mut w) = open(session).await?;
    // Round trip: the best of a few.
    let mut rtt = Duration::MAX;
    let mut line = String::new();
    for _ in 0..5 {
        let t = Instant::now();
        w.write_all(b"PING\n").await?;
        line.clear();
        r.read_line(&mut line).await?;
        rtt = rtt.min(t.elapsed());
    }
    w.write_all(b"INFO\n").await?;
    line.clear();
    r.read_line(&mut line).await?;
    let server: Limits = serde_json::from_str(line.trim())?;
    let client = Limits::local();
    // Slow start takes longer the longer the path: leave it out.
    let omit = (rtt * 20).clamp(Duration::from_secs(1), Duration::from_secs(5));
    let secs = (o.seconds + omit.as_secs()).clamp(1, doctor::MAX_SECONDS - 1);

    let direct_bps = match &o.host {
        Some(host) => {
            say(format!(
                "measuring one plain TCP connection from the server for {secs} s"
            ));
            w.write_all(format!("DIRECT {}\n", secs + 1).as_bytes())
                .await?;
            line.clear();
            r.read_line(&mut line).await?;
            match line
                .trim()
                .strip_prefix("PORT ")
                .and_then(|p| p.parse::<u16>().ok())
            {
                Some(port) => match tokio::time::timeout(
                    Duration::from_secs(5),
                    tokio::net::TcpStream::connect((host.as_str(), port)),
                )
                .await
                {
                    Ok(Ok(mut s)) => Some(doctor::sink(&mut s, omit).await?),
                    _ => None,
                },
                None => None,
            }
        }
        None => None,
    };
    say(format!("measuring the tunnel for {secs} s"));
    let (mut r2, mut w2) = open(session).await?;
    w2.write_all(format!("SOURCE {}\n", secs + 1).as_bytes())
        .await?;
    let tunnel_bps = doctor::sink(&mut r2, omit).await?;
    drop((r, w));

    let rtt_s = rtt.as_secs_f64().max(1e-6);
    // Server → client: the server's send buffer and the client's receive
    // buffer (half of it is offered as window).
    let send = server.tcp_wmem[2] as f64 * SEND_PAYLOAD_SHARE;
    let recv = client.tcp_rmem[2] as f64 / 2.0;
    let (limit_bytes, buffer_limit, side, key) = if send <= recv {
        (
            send,
            format!(
                "the server's tcp_wmem max of {}",
                size(server.tcp_wmem[2] as f64)
            ),
            "server",
            "wmem",
        )
    } else {
        (
            recv,
            format!(
                "half the client's tcp_rmem max of {}",
                size(client.tcp_rmem[2] as f64)
            ),
            "client",
            "rmem",
        )
    };
    let buffer_cap_bps = limit_bytes * 8.0 / rtt_s;
    let best = tunnel_bps.max(direct_bps.unwrap_or(0.0));
    let bdp = best / 8.0 * rtt_s;
    let app_buffer_cap_bps = o.app_buffer.map(|b| b as f64 * 8.0 / rtt_s);

    let mut findings = vec![format!("Round trip {:.1} ms.", rtt_s * 1e3)];
    findings.push(format!(
        "The tunnel's carrier carried {} (the server sending for {} s).",
        rate(tunnel_bps),
        o.seconds
    ));
    match direct_bps {
        Some(d) => findings.push(format!(
            "One plain TCP connection with default buffers carried {}; at this RTT its buffers allow at most {} ({} per {:.1} ms).",
            rate(d),
            rate(buffer_cap_bps),
            buffer_limit,
            rtt_s * 1e3
        )),
        None => findings.push(format!(
            "One plain TCP connection could not be measured (no direct connection to the server's host); at this RTT its buffers allow at most {} ({}).",
            rate(buffer_cap_bps),
            buffer_limit
        )),
    }
    if let (Some(b), Some(cap)) = (o.app_buffer, app_buffer_cap_bps) {
        findings.push(if tunnel_bps > cap {
            format!(
                "An application with {} socket buffers is capped at {} at this RTT, whatever the path; through an -L forward of longhaul it gets the tunnel's {} instead ({:.1}× as fast).",
                size(b as f64),
                rate(cap),
                rate(tunnel_bps),
                tunnel_bps / cap
            )
        } else {
            format!(
                "An application with {} socket buffers is capped at {} at this RTT; the tunnel carried {}, so an -L forward would not make it faster here.",
                size(b as f64),
                rate(cap),
                rate(tunnel_bps)
            )
        });
    }
    // The tunnel well behind one plain connection: here the tunnel (a
    // relay's copies and CPU on a fast path), not the path, is the limit.
    // (On a short path only: on a long one the advice below applies.)
    let tunnel_limits = rtt_s < 0.002 && direct_bps.is_some_and(|d| tunnel_bps < TUNNEL_BEHIND * d);
    let mut advice = vec![];
    // Buffers that allow barely more than the best measured (or less) are
    // what holds one connection; well above it, the path is the limit.
    if buffer_cap_bps < BUFFER_MARGIN * best {
        let want = (bdp * 2.0).max(limit_bytes * 2.0).ceil() as u64;
        findings.push(format!(
            "One connection is limited by {buffer_limit}: the path's bandwidth-delay product is {} (at {}).",
            size(bdp),
            rate(best)
        ));
        let (sysctl, core) = match key {
            "wmem" => ("net.ipv4.tcp_wmem", "net.core.wmem_max"),
            _ => ("net.ipv4.tcp_rmem", "net.core.rmem_max"),
        };
        let lo = if key == "wmem" {
            server.tcp_wmem
        } else {
            client.tcp_rmem
        };
        advice.push(format!(
            "on the {side}: sysctl -w {sysctl}='{} {} {want}'",
            lo[0], lo[1]
        ));
        advice.push(format!("on the {side}: sysctl -w {core}={want}"));
        advice.push("or, without changing either host: use longhaul with ?stripes=4 (K connections, K buffers)".into());
    } else if tunnel_limits {
        findings.push(format!(
            "The tunnel is the limit here, not the path: it carried {}, {:.0} % of one plain connection's {}. On a path this fast (loopback, a LAN) a relay's copies and CPU cost more than the path; see 'longhaul bench' for the tunnel's own figures, and use the tunnel for long or lossy paths, where it gains.",
            rate(tunnel_bps),
            100.0 * tunnel_bps / direct_bps.unwrap_or(1.0),
            rate(direct_bps.unwrap_or(0.0))
        ));
    } else {
        findings.push(format!(
            "Nothing to change: one connection's buffers allow {}, more than the path carries; the path is the limit ({}).",
            rate(buffer_cap_bps),
            rate(best)
        ));
    }
    Ok(Diagnosis {
        rtt_ms: rtt_s * 1e3,
        tunnel_bps,
        direct_bps,
        client,
        server,
        buffer_cap_bps,
        buffer_limit,
        bdp_bytes: bdp,
        app_buffer_cap_bps,
        findings,
        advice,
    })
}

type Halves = (
    BufReader<tokio::io::ReadHalf<longhaul_session::local::PairStream>>,
    tokio::io::WriteHalf<longhaul_session::local::PairStream>,
);

async fn open(session: &SessionHandle) -> anyhow::Result<Halves> {
    let opened = session
        .open(doctor::SERVICE)
        .await
        .map_err(|e| anyhow::anyhow!("the server refused the doctor: {e}"))?;
    let (ours, theirs) = LocalStream::pair()?;
    opened.attach(ours);
    let (r, w) = tokio::io::split(longhaul_session::local::pair_end_async(theirs)?);
    Ok((BufReader::new(r), w))
}

impl Diagnosis {
    pub fn human(&self) -> String {
        let mut s = self.findings.join("\n");
        s.push('\n');
        if !self.advice.is_empty() {
            s += "To change it:\n";
            for a in &self.advice {
                s += &format!("  {a}\n");
            }
        }
        s
    }
}

fn rate(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else {
        format!("{:.0} Mbit/s", bps / 1e6)
    }
}

fn size(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1024.0 / 1024.0)
    } else {
        format!("{:.0} KiB", b / 1024.0)
    }
}
