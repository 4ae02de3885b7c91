//! A harness for hostile authenticated peers: it drives any sequence of
//! lawful-looking steps (opens to targets that read, echo or never read,
//! tiny and full frames, CLOSE racing data in flight, bogus window
//! adjustments, opens left unanswered…) against one live server, runs a
//! set of named patterns and seeded random ones, and after each checks
//! that the server's resident memory stays within the session budget plus
//! the documented allowance, that its descriptors stay within the stream
//! limit plus a constant, and that a well-behaved client is still served.
//! The peer may lose its session (a frame the rules forbid ends it); the
//! server must not lose anything else.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::*;
use longhaul_forward::rules::{BindRules, Rules};
use longhaul_proto::frame::{self, write_data_header, DecodeLimits, Frame, DATA_HEADER_LEN};
use longhaul_proto::window::WindowConfig;
use longhaul_session::SessionConfig;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BUDGET: u64 = 16 << 20;
const MAX_STREAMS: usize = 16;
/// docs/SECURITY.md: read buffers (8.6 MiB), control lane (4 MiB), per
/// stream queues towards the carrier and allocator slack.
const ALLOWANCE: u64 = 40 << 20;

/// One thing a hostile peer does.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// OPEN to target `t` (0: echoes, 1: never reads, 2: sinks).
    Open(u8),
    /// DATA on the `i`-th stream opened, `n` bytes in frames of `size`.
    Data { i: usize, n: usize, size: usize },
    /// CLOSE the `i`-th stream (whatever is in flight).
    Close(usize),
    /// EOF on the `i`-th stream.
    Eof(usize),
    /// A WINDOW_ADJUST, for a real stream or not.
    Adjust { i: usize, increment: u32 },
    /// A PING, whose PONG is never read.
    Ping,
    /// Read nothing for a while (the server's replies pile up).
    Pause(u64),
    /// OPEN a UDP flow to the UDP echo target.
    OpenUdp,
    /// OPEN to a destination written to forge a log line (`i`-th).
    OpenForged(u32),
}

/// A destination that would forge a log line, in red, if logged raw.
fn forged(i: u32) -> String {
    format!("tcp://x{i}\nFORGED 2026-01-01T00:00:00Z  INFO \x1b[31mroot logged in\x1b[0m:80")
}

struct Peer {
    s: TcpStream,
    buf: BytesMut,
    next_sender: u32,
    /// Our id of each stream opened, with the server's id and its window
    /// once known.
    streams: Vec<(u32, Option<(u32, u64)>)>,
    /// Per stream: 1 once we sent EOF, 2 once we sent CLOSE.
    ended: Vec<u8>,
    /// Keep to the rules (no frame for a stream we ended, credit only for
    /// live streams), so that a random run lasts; named patterns break
    /// them on purpose.
    lawful: bool,
}

impl Peer {
    async fn send(&mut self, f: &Frame) -> bool {
        self.s.write_all(&f.to_bytes().unwrap()).await.is_ok()
    }

    /// Takes in what the server sent without waiting (answers to OPENs,
    /// credit); false once the server has closed the session.
    fn absorb(&mut self) -> bool {
        loop {
            match self.s.try_read_buf(&mut self.buf) {
                Ok(0) => return false,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
        while let Ok(Some(f)) = frame::decode(&mut self.buf, DecodeLimits::default()) {
            match f {
                Frame::OpenSuccess {
                    recipient,
                    sender,
                    window,
                    ..
                } => {
                    if let Some(s) = self.streams.iter_mut().find(|s| s.0 == recipient) {
                        s.1 = Some((sender, window as u64));
                    }
                }
                Frame::WindowAdjust {
                    recipient,
                    increment,
                } => {
                    if let Some((_, Some((_, w)))) =
                        self.streams.iter_mut().find(|s| s.0 == recipient)
                    {
                        *w += increment as u64;
                    }
                }
                _ => {}
            }
        }
        true
    }

    fn remote(&self, i: usize) -> Option<u32> {
        let n = self.streams.len();
        (n > 0)
            .then(|| self.streams[i % n].1.map(|x| x.0))
            .flatten()
    }

    /// Whether a lawful peer may still send `level` (1: data or EOF, 2:
    /// CLOSE) on the `i`-th stream, and marks it when sending ends it.
    fn may(&mut self, i: usize, level: u8, ends: u8) -> bool {
        let n = self.streams.len();
        if n == 0 {
            return false;
        }
        let k = i % n;
        if self.lawful && self.ended[k] >= level {
            return false;
        }
        self.ended[k] = self.ended[k].max(ends);
        true
    }

    /// Runs one step; false once the session is gone.
    async fn step(&mut self, step: Step, targets: &[SocketAddr; 4]) -> bool {
        if !self.absorb() {
            return false;
        }
        match step {
            Step::Open(t) => {
                let sender = self.next_sender;
                self.next_sender += 1;
                self.streams.push((sender, None));
                self.ended.push(0);
                let open = Frame::Open {
                    sender,
                    window: 1 << 20,
                    max_packet: u16::MAX,
                    dest: format!("tcp://{}", targets[t as usize % 3]),
                };
                self.send(&open).await
            }
            Step::Data { i, n, size } => {
                let Some(recipient) = self.remote(i) else {
                    return true;
                };
                if !self.may(i, 1, 0) {
                    return true;
                }
                let k = i % self.streams.len();
                let credit = self.streams[k].1.map_or(0, |x| x.1) as usize;
                let n = n.min(credit);
                let size = size.clamp(1, frame::MAX_DATA_PAYLOAD);
                let mut out = Vec::with_capacity(n + n / size * DATA_HEADER_LEN + 8);
                let mut left = n;
                while left > 0 {
                    let m = left.min(size);
                    let mut head = [0u8; DATA_HEADER_LEN];
                    write_data_header(&mut head, recipient, m);
                    out.extend_from_slice(&head);
                    out.resize(out.len() + m, 0x5a);
                    left -= m;
                }
                if let Some((_, Some((_, w)))) = self.streams.get_mut(k) {
                    *w -= n as u64;
                }
                self.s.write_all(&out).await.is_ok()
            }
            Step::Close(i) => match self.remote(i) {
                Some(recipient) if self.may(i, 2, 2) => {
                    self.send(&Frame::Close { recipient }).await
                }
                _ => true,
            },
            Step::Eof(i) => match self.remote(i) {
                Some(recipient) if self.may(i, 1, 1) => self.send(&Frame::Eof { recipient }).await,
                _ => true,
            },
            Step::Adjust { i, increment } => {
                let live = self.remote(i).filter(|_| {
                    let k = i % self.streams.len().max(1);
                    self.ended.get(k).is_some_and(|&e| e < 2)
                });
                if self.lawful && live.is_none() {
                    return true;
                }
                let increment = if self.lawful {
                    increment % (1 << 20)
                } else {
                    increment
                };
                let recipient = live.unwrap_or(i as u32);
                self.send(&Frame::WindowAdjust {
                    recipient,
                    increment,
                })
                .await
            }
            Step::OpenUdp | Step::OpenForged(_) => {
                let sender = self.next_sender;
                self.next_sender += 1;
                self.streams.push((sender, None));
                self.ended.push(0);
                let dest = match step {
                    Step::OpenForged(i) => forged(i),
                    _ => format!("udp://{}", targets[3]),
                };
                let open = Frame::Open {
                    sender,
                    window: 1 << 20,
                    max_packet: u16::MAX,
                    dest,
                };
                self.send(&open).await
            }
            Step::Ping => self.send(&Frame::Ping { nonce: 1 }).await,
            Step::Pause(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                true
            }
        }
    }
}

/// The named patterns, each a sequence of steps.
fn named() -> Vec<(&'static str, Vec<Step>)> {
    use Step::*;
    let mut v = vec![];
    // Tiny frames on a stream whose target never reads, beside bulk.
    let mut tiny = vec![Open(1), Open(2), Pause(50)];
    for _ in 0..2000 {
        tiny.push(Data {
            i: 0,
            n: 1,
            size: 1,
        });
    }
    for _ in 0..40 {
        tiny.push(Data {
            i: 1,
            n: 256 << 10,
            size: 65_000,
        });
    }
    v.push(("tiny frames beside bulk", tiny));
    // Streams filled towards targets that never read, then closed.
    let mut stuck = vec![];
    for k in 0..40 {
        stuck.extend([
            Open(1),
            Pause(5),
            Data {
                i: k,
                n: 1 << 20,
                size: 65_000,
            },
            Close(k),
        ]);
    }
    v.push(("stalled streams closed with data in flight", stuck));
    // CLOSE racing data and EOF, on echoing targets.
    let mut races = vec![];
    for k in 0..60 {
        races.extend([
            Open(0),
            Pause(2),
            Data {
                i: k,
                n: 200_000,
                size: 3000,
            },
            Eof(k),
            Close(k),
            Data {
                i: k,
                n: 1000,
                size: 1000,
            },
        ]);
    }
    v.push(("close races data", races));
    // Many opens at once, more than the limit, never used.
    let opens = (0..200).map(|_| Open(1)).collect();
    v.push(("many opens", opens));
    // Credit the server never granted, and PINGs whose answers are never read.
    let mut bogus = vec![Open(0), Pause(20)];
    for k in 0..200 {
        bogus.push(Adjust {
            i: k,
            increment: u32::MAX,
        });
        bogus.push(Ping);
    }
    v.push(("bogus adjustments and unread pongs", bogus));
    // UDP flows, many more than the streams allowed.
    v.push(("many UDP flows", (0..300).map(|_| OpenUdp).collect()));
    // Destinations that forge log lines, past the stream limit and not.
    let mut forging: Vec<Step> = (0..300).map(OpenForged).collect();
    forging.splice(100..100, (0..MAX_STREAMS).map(|_| Open(1)));
    v.push(("forged destinations past the stream limit", forging));
    v
}

/// A random sequence from `seed`.
fn random(seed: u64) -> Vec<Step> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..400)
        .map(|_| match r.gen_range(0..100) {
            0..=14 => Step::Open(r.gen_range(0..3)),
            15..=59 => Step::Data {
                i: r.gen_range(0..64),
                n: r.gen_range(1..600_000),
                size: *[1, 7, 1000, 16_384, 65_000]
                    .get(r.gen_range(0..5))
                    .unwrap_or(&1000),
            },
            60..=69 => Step::Close(r.gen_range(0..64)),
            70..=76 => Step::Eof(r.gen_range(0..64)),
            77..=84 => Step::Adjust {
                i: r.gen_range(0..64),
                increment: r.gen(),
            },
            85..=94 => Step::Ping,
            _ => Step::Pause(r.gen_range(0..20)),
        })
        .collect()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// An echo target that also keeps what it holds small: reads and writes
/// back; a sink that reads everything.
async fn sink() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut b = vec![0u8; 1 << 16];
                while matches!(c.read(&mut b).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_patterns_stay_within_the_bounds() {
    if !common::alone(module_path!(), "hostile_patterns_stay_within_the_bounds") {
        return;
    }
    logs();
    let _dump = DumpLogsOnPanic;
    let echo = echo_server().await;
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let targets = [
        echo,
        never_reading_target(1024),
        sink().await,
        udp.local_addr().unwrap(),
    ];
    let rules = Rules::new(
        targets[..3]
            .iter()
            .map(|t| t.to_string())
            .chain([format!("udp:{}", targets[3])])
            .map(|t| t.parse().unwrap())
            .collect(),
        false,
    );
    let cfg = SessionConfig {
        budget: BUDGET,
        max_streams: MAX_STREAMS,
        window: WindowConfig {
            initial: 256 << 10,
            max: 4 << 20,
        },
        control_limit: 1 << 20,
        ..SessionConfig::default()
    };
    let server = start_server_with(rules, BindRules::default(), cfg).await;
    let base_rss = status_bytes("VmRSS:");
    let mut runs: Vec<(String, Vec<Step>, bool)> = named()
        .into_iter()
        .map(|(n, s)| (n.to_string(), s, false))
        .collect();
    for seed in 0..6 {
        runs.push((format!("random seed {seed}"), random(seed), true));
    }
    for (name, steps, lawful) in runs {
        // Per run: the target that never reads keeps what it accepted.
        let base_fds = open_fds();
        let mut p = Peer {
            s: native_peer(server).await,
            buf: BytesMut::new(),
            next_sender: 1,
            streams: vec![],
            ended: vec![],
            lawful,
        };
        let mut alive = true;
        for step in steps {
            if !within(30, p.step(step, &targets)).await {
                alive = false;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let fds = open_fds().saturating_sub(base_fds);
        let grew = status_bytes("VmHWM:").saturating_sub(base_rss);
        eprintln!(
            "{name}: session {}; +{fds} fds, peak RSS +{} MiB",
            if alive { "kept" } else { "ended" },
            grew >> 20
        );
        // Each stream: the server's socket and the target's (this process).
        assert!(
            fds <= 2 * MAX_STREAMS + 16,
            "{name}: {fds} more descriptors"
        );
        assert!(
            grew < BUDGET + ALLOWANCE,
            "{name}: peak RSS grew by {} MiB",
            grew >> 20
        );
        // Another client is still served, whatever this peer did.
        let client = start_client(server, &[echo]).await;
        let data = Bytes::from(random_bytes(256 << 10));
        let s = TcpStream::connect(client.local_addrs[0]).await.unwrap();
        let got = within(20, send_and_collect(s, data.to_vec())).await;
        assert_eq!(sha(&got), sha(&data), "{name}: the other client's bytes");
        drop(client);
        drop(p);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Whatever the peers named, no line of the log is theirs to write.
    let log = log_text();
    assert!(!log.contains('\x1b'), "a raw ESC in the log");
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED")),
        "a forged log line"
    );
    drop(udp);
}
