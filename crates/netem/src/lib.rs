//! `longhaul netem`: a userspace WAN emulator.
//!
//! Two network namespaces, side **a** (198.18.0.1) and side **b**
//! (198.18.0.2, both from the RFC 2544 benchmarking range), each with one
//! TUN device. A daemon process reads packets from one TUN and writes them
//! to the other after a one-way delay, an optional rate cap with a bounded
//! tail-drop queue, and optional random loss ([`line`]). Nothing else joins
//! the namespaces, so traffic can only pass between a and b.
//!
//! The kernel's netem qdisc is not available everywhere (including on the
//! project's machines); this needs only TUN and network namespaces.
// `unsafe` only in the one module that needs it (system calls std lacks).
#![deny(unsafe_code)]

pub mod line;
mod parse;
mod setup;
#[allow(unsafe_code)]
mod sys;

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use line::{Line, LineConfig, Verdict};
pub use parse::{parse_duration, parse_loss, parse_rate, parse_span};
use setup::{configure_link2, configure_side, open_tun_in};

pub const ADDR_A: &str = "198.18.0.1";
pub const ADDR_B: &str = "198.18.0.2";
/// The second link's addresses (`--link2`). Side a sends from `ADDR2_A`
/// over the second link whatever the destination (a rule routes by source
/// address, as on a host with two uplinks); side b answers it there.
pub const ADDR2_A: &str = "198.18.1.1";
pub const ADDR2_B: &str = "198.18.1.2";
const TUN2_NAME: &str = "lh1";
/// Bytes the delay line may hold on the wire per direction, whatever the
/// settings: the emulator's memory bound.
pub const MAX_IN_FLIGHT: u64 = 512 * 1024 * 1024;
const TUN_NAME: &str = "lh0";
/// Largest packet read from a TUN: a 64 KiB GSO packet plus its header.
const MAX_PACKET: usize = 65536 + 64;
/// A release later than this counts as late in `status`.
const LATE_NS: u64 = 1_000_000;

/// What `netem up` sets up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetemConfig {
    /// Instance name (lets tests run their own pairs side by side).
    pub name: String,
    pub delay_us: u64,
    pub rate_bps: Option<u64>,
    /// Random loss a→b (and b→a unless `loss_back` is given).
    pub loss: f64,
    /// Random loss b→a, when it differs from a→b.
    #[serde(default)]
    pub loss_back: Option<f64>,
    /// Tail-drop queue in bytes (with a rate cap). Default: one BDP
    /// (rate × RTT), at least 64 KiB.
    pub queue_bytes: Option<u64>,
    /// Raise the namespaces' TCP buffer limit (tcp_rmem/tcp_wmem max).
    pub tcp_buffer_max: Option<u64>,
    /// A second link between the sides, with its own delay, rate and loss.
    #[serde(default)]
    pub link2: Option<Link2>,
}

/// The second link (for bonding two uplinks).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Link2 {
    pub delay_us: u64,
    pub rate_bps: Option<u64>,
    pub loss: f64,
}

impl NetemConfig {
    pub fn ns_a(&self) -> String {
        ns_name(&self.name, 'a')
    }
    pub fn ns_b(&self) -> String {
        ns_name(&self.name, 'b')
    }

    fn line(&self) -> LineConfig {
        let delay = Duration::from_micros(self.delay_us);
        let queue = self.queue_bytes.unwrap_or_else(|| match self.rate_bps {
            Some(r) => {
                ((r as u128 * 2 * self.delay_us as u128 / 8 / 1_000_000) as u64).max(64 * 1024)
            }
            None => MAX_IN_FLIGHT,
        });
        LineConfig {
            delay,
            rate_bps: self.rate_bps,
            loss: self.loss,
            queue_bytes: queue,
        }
    }

    /// The second link's line (both directions).
    fn line2(&self, l: &Link2) -> LineConfig {
        NetemConfig {
            delay_us: l.delay_us,
            rate_bps: l.rate_bps,
            loss: l.loss,
            loss_back: None,
            queue_bytes: None,
            link2: None,
            ..self.clone()
        }
        .line()
    }

    /// The line b→a: the same, but for its own loss rate.
    fn line_back(&self) -> LineConfig {
        LineConfig {
            loss: self.loss_back.unwrap_or(self.loss),
            ..self.line()
        }
    }

    /// Offloads (64 KiB GSO packets) make the emulator fast, but loss must
    /// hit single 1500-byte packets to be realistic, so loss turns them off.
    fn offload(&self) -> bool {
        self.loss == 0.0
            && self.loss_back.unwrap_or(0.0) == 0.0
            && self.link2.is_none_or(|l| l.loss == 0.0)
    }
}

/// Moves the calling thread (only it) into side `side` of emulator `name`,
/// so a test can run a client or server there.
pub fn enter_side(name: &str, side: char) -> std::io::Result<()> {
    sys::enter_netns(&ns_name(name, side))
}

/// Whether this process may run the emulator (root or CAP_NET_ADMIN).
pub fn can_run() -> bool {
    sys::has_net_admin()
}

pub fn ns_name(name: &str, side: char) -> String {
    if name == "default" {
        format!("longhaul-{side}")
    } else {
        format!("longhaul-{name}-{side}")
    }
}

fn state_dir(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/longhaul-netem/{name}"))
}

fn need_admin() -> anyhow::Result<()> {
    if !sys::has_net_admin() {
        bail!("netem needs root or CAP_NET_ADMIN to create namespaces and TUN devices (run it with sudo)");
    }
    if Command::new("ip").arg("-V").output().is_err() {
        bail!("netem needs the 'ip' command (install iproute2)");
    }
    Ok(())
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run 'ip'")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn ns_exists(ns: &str) -> bool {
    std::path::Path::new(&format!("/var/run/netns/{ns}")).exists()
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn read_pid(name: &str) -> Option<u32> {
    std::fs::read_to_string(state_dir(name).join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Per-direction counters, shared with `status`.
#[derive(Debug, Default)]
struct DirStats {
    packets: AtomicU64,
    bytes: AtomicU64,
    queue_drops: AtomicU64,
    lost: AtomicU64,
    late: AtomicU64,
    worst_late_ns: AtomicU64,
    queued_bytes: AtomicU64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirStatus {
    pub packets: u64,
    pub bytes: u64,
    pub queue_drops: u64,
    pub lost: u64,
    /// Packets released more than 1 ms after they were due.
    pub late_releases: u64,
    pub worst_lateness_us: f64,
    pub queued_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub ready: bool,
    pub pid: u32,
    pub config: NetemConfig,
    pub offload: bool,
    pub a_to_b: DirStatus,
    pub b_to_a: DirStatus,
    /// The second link's a→b and b→a.
    #[serde(default)]
    pub link2: Option<[DirStatus; 2]>,
}

impl DirStats {
    fn snapshot(&self) -> DirStatus {
        DirStatus {
            packets: self.packets.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            queue_drops: self.queue_drops.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            late_releases: self.late.load(Ordering::Relaxed),
            worst_lateness_us: self.worst_late_ns.load(Ordering::Relaxed) as f64 / 1000.0,
            queued_bytes: self.queued_bytes.load(Ordering::Relaxed),
        }
    }
}

struct Pending {
    items: VecDeque<(u64, Vec<u8>)>,
    bytes: u64,
}

/// One direction: a reader thread feeding the delay line, a writer thread
/// releasing packets when due (sleeping, never spinning).
fn forward(src: File, dst: File, cfg: LineConfig, stats: Arc<DirStats>, epoch: Instant) {
    let q = Arc::new((
        Mutex::new(Pending {
            items: VecDeque::new(),
            bytes: 0,
        }),
        Condvar::new(),
    ));
    let wq = q.clone();
    let wstats = stats.clone();
    std::thread::spawn(move || {
        sys::tune_forwarding_thread();
        let mut dst = dst;
        let (lock, cv) = &*wq;
        loop {
            let (due, pkt) = {
                let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    match g.items.front() {
                        None => g = cv.wait(g).unwrap_or_else(|p| p.into_inner()),
                        Some(&(due, _)) => {
                            let now = epoch.elapsed().as_nanos() as u64;
                            if due <= now {
                                break;
                            }
                            g = cv
                                .wait_timeout(g, Duration::from_nanos(due - now))
                                .unwrap_or_else(|p| p.into_inner())
                                .0;
                        }
                    }
                }
                let Some((due, pkt)) = g.items.pop_front() else {
                    continue;
                };
                g.bytes -= pkt.len() as u64;
                wstats.queued_bytes.store(g.bytes, Ordering::Relaxed);
                (due, pkt)
            };
            let late = (epoch.elapsed().as_nanos() as u64).saturating_sub(due);
            if late > LATE_NS {
                wstats.late.fetch_add(1, Ordering::Relaxed);
            }
            wstats.worst_late_ns.fetch_max(late, Ordering::Relaxed);
            // A write error means the device is gone: the daemon is ending.
            if dst.write(&pkt).is_err() {
                return;
            }
        }
    });
    std::thread::spawn(move || {
        sys::tune_forwarding_thread();
        let mut src = src;
        let mut line = Line::new(cfg);
        let mut buf = vec![0u8; MAX_PACKET];
        let (lock, cv) = &*q;
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let now = epoch.elapsed().as_nanos() as u64;
            stats.packets.fetch_add(1, Ordering::Relaxed);
            stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
            match line.arrive(now, n, rand::random::<f64>()) {
                Verdict::Lost => {
                    stats.lost.fetch_add(1, Ordering::Relaxed);
                }
                Verdict::QueueDrop => {
                    stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                }
                Verdict::Release(due) => {
                    let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
                    if g.bytes + n as u64 > MAX_IN_FLIGHT {
                        stats.queue_drops.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    g.bytes += n as u64;
                    stats.queued_bytes.store(g.bytes, Ordering::Relaxed);
                    let was_empty = g.items.is_empty();
                    g.items.push_back((due, buf[..n].to_vec()));
                    drop(g);
                    if was_empty {
                        cv.notify_one();
                    }
                }
            }
        }
    });
}

/// The daemon: builds the namespaces and devices, forwards until killed.
/// Run by `up` as a detached child.
pub fn daemon(cfg: NetemConfig) -> anyhow::Result<()> {
    let (na, nb) = (cfg.ns_a(), cfg.ns_b());
    let dir = state_dir(&cfg.name);
    type Tuns = (File, File, Option<(File, File)>);
    let setup = || -> anyhow::Result<Tuns> {
        ip(&["netns", "add", &na])?;
        ip(&["netns", "add", &nb])?;
        let ta = open_tun_in(na.clone(), TUN_NAME, cfg.offload())?;
        let tb = open_tun_in(nb.clone(), TUN_NAME, cfg.offload())?;
        configure_side(&na, ADDR_A, cfg.tcp_buffer_max)?;
        configure_side(&nb, ADDR_B, cfg.tcp_buffer_max)?;
        let second = match cfg.link2 {
            Some(_) => {
                let ta2 = open_tun_in(na.clone(), TUN2_NAME, cfg.offload())?;
                let tb2 = open_tun_in(nb.clone(), TUN2_NAME, cfg.offload())?;
                configure_link2(&na, &nb)?;
                Some((ta2, tb2))
            }
            None => None,
        };
        Ok((ta, tb, second))
    };
    let (ta, tb, second) = match setup() {
        Ok(t) => t,
        Err(e) => {
            let _ = ip(&["netns", "del", &na]);
            let _ = ip(&["netns", "del", &nb]);
            return Err(e);
        }
    };
    let epoch = Instant::now();
    let ab = Arc::new(DirStats::default());
    let ba = Arc::new(DirStats::default());
    forward(
        ta.try_clone()?,
        tb.try_clone()?,
        cfg.line(),
        ab.clone(),
        epoch,
    );
    forward(tb, ta, cfg.line_back(), ba.clone(), epoch);
    let ab2 = Arc::new(DirStats::default());
    let ba2 = Arc::new(DirStats::default());
    if let (Some((ta2, tb2)), Some(l)) = (second, cfg.link2) {
        forward(
            ta2.try_clone()?,
            tb2.try_clone()?,
            cfg.line2(&l),
            ab2.clone(),
            epoch,
        );
        forward(tb2, ta2, cfg.line2(&l), ba2.clone(), epoch);
    }
    let pid = std::process::id();
    loop {
        let st = Status {
            ready: true,
            pid,
            config: cfg.clone(),
            offload: cfg.offload(),
            a_to_b: ab.snapshot(),
            b_to_a: ba.snapshot(),
            link2: cfg.link2.map(|_| [ab2.snapshot(), ba2.snapshot()]),
        };
        let tmp = dir.join("status.json.tmp");
        if std::fs::write(&tmp, serde_json::to_vec_pretty(&st)?).is_ok() {
            let _ = std::fs::rename(&tmp, dir.join("status.json"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `netem up`: starts the daemon and waits until the path works.
pub fn up(cfg: &NetemConfig, exe: &std::path::Path) -> anyhow::Result<()> {
    need_admin()?;
    if let Some(pid) = read_pid(&cfg.name) {
        if pid_alive(pid) {
            bail!(
                "netem '{}' is already up (pid {pid}); run 'longhaul netem down' first",
                cfg.name
            );
        }
    }
    // Leftovers of a daemon that died: clear them so `up` starts clean.
    down_quiet(&cfg.name);
    let dir = state_dir(&cfg.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let log = File::create(dir.join("log"))?;
    let cfg_json = serde_json::to_string(cfg)?;
    let mut cmd = Command::new(exe);
    cmd.args(["netem", "daemon", &cfg_json])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    sys::own_process_group(&mut cmd);
    let mut child = cmd.spawn().context("cannot start the netem daemon")?;
    std::fs::write(dir.join("pid"), child.id().to_string())?;
    let t0 = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            let last = log.lines().last().unwrap_or("no output").to_string();
            down_quiet(&cfg.name);
            bail!("netem daemon failed ({status}): {last}");
        }
        if dir.join("status.json").exists() {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(10) {
            down_quiet(&cfg.name);
            bail!("netem daemon did not become ready within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn down_quiet(name: &str) -> bool {
    let mut did = false;
    if let Some(pid) = read_pid(name) {
        if pid_alive(pid) && is_our_daemon(pid) {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            let t0 = Instant::now();
            while pid_alive(pid) && t0.elapsed() < Duration::from_secs(3) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if pid_alive(pid) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            did = true;
        }
    }
    for side in ['a', 'b'] {
        let ns = ns_name(name, side);
        if ns_exists(&ns) {
            let _ = ip(&["netns", "del", &ns]);
            did = true;
        }
    }
    let _ = std::fs::remove_dir_all(state_dir(name));
    did
}

/// Only a process whose command line is our daemon's is ever signalled.
fn is_our_daemon(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let s = String::from_utf8_lossy(&c);
            s.contains("netem") && s.contains("daemon")
        })
        .unwrap_or(false)
}

/// `netem down`: removes everything `up` created, and only that. Safe to
/// call twice. Returns whether anything was up.
pub fn down(name: &str) -> anyhow::Result<bool> {
    need_admin()?;
    Ok(down_quiet(name))
}

/// `netem status`.
pub fn status(name: &str) -> anyhow::Result<Option<Status>> {
    let Some(pid) = read_pid(name) else {
        return Ok(None);
    };
    if !pid_alive(pid) {
        bail!("netem '{name}' daemon (pid {pid}) is gone; run 'longhaul netem down' to clean up");
    }
    let s = std::fs::read_to_string(state_dir(name).join("status.json"))
        .context("netem status file missing")?;
    Ok(Some(serde_json::from_str(&s)?))
}

/// `netem exec a|b -- CMD`: the command to run a program on one side.
pub fn exec_command(name: &str, side: char, cmd: &[String]) -> anyhow::Result<Command> {
    let ns = ns_name(name, side);
    if !ns_exists(&ns) {
        bail!("netem '{name}' is not up (no namespace {ns}); run 'longhaul netem up' first");
    }
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &ns]).args(cmd);
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_queue_is_one_bdp() {
        let c = NetemConfig {
            name: "x".into(),
            delay_us: 5_000,
            rate_bps: Some(1_000_000_000),
            loss: 0.01,
            loss_back: Some(0.0),
            queue_bytes: None,
            tcp_buffer_max: None,
            link2: None,
        };
        // 1 Gbit/s × 10 ms RTT = 1.25 MB
        assert_eq!(c.line().queue_bytes, 1_250_000);
        assert_eq!((c.line().loss, c.line_back().loss), (0.01, 0.0));
        assert!(!c.offload());
        assert_eq!(c.ns_a(), "longhaul-x-a");
        assert_eq!(ns_name("default", 'b'), "longhaul-b");
    }
}
