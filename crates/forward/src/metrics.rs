//! What a server or client counts, and the Prometheus text endpoint that
//! shows it (`--metrics ADDR`).
//!
//! Live figures (sessions, streams, RTT, lanes) are read from the sessions
//! at each scrape; counters (bytes, resumes, stalls) are the live sessions'
//! plus what ended sessions had, so they never go back; refusals are
//! counted where they happen.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use longhaul_session::SessionHandle;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Why something was refused (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// `--max-sessions` reached.
    SessionLimit,
    /// TLS, WebSocket or hello failed or took too long.
    Handshake,
    /// No authorized key, wrong or missing token.
    NotAuthenticated,
    /// A stream to a target no rule allows.
    TargetNotAllowed,
    /// A reverse listener no rule allows.
    BindNotAllowed,
    /// The file service, to a client without access.
    FilesNotAllowed,
    /// A UDP flow past `--max-flows` or `--max-flows-per-client`.
    FlowLimit,
}

impl Refusal {
    const ALL: [Refusal; 7] = [
        Refusal::SessionLimit,
        Refusal::Handshake,
        Refusal::NotAuthenticated,
        Refusal::TargetNotAllowed,
        Refusal::BindNotAllowed,
        Refusal::FilesNotAllowed,
        Refusal::FlowLimit,
    ];
    fn label(self) -> &'static str {
        match self {
            Refusal::SessionLimit => "session_limit",
            Refusal::Handshake => "handshake",
            Refusal::NotAuthenticated => "not_authenticated",
            Refusal::TargetNotAllowed => "target_not_allowed",
            Refusal::BindNotAllowed => "bind_not_allowed",
            Refusal::FilesNotAllowed => "files_not_allowed",
            Refusal::FlowLimit => "flow_limit",
        }
    }
}

/// Counters of ended sessions, added to the live ones' at each scrape.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    sent: u64,
    received: u64,
    resumes: u64,
    replayed: u64,
    stalls: u64,
    /// Sent, received, dropped; sent and received on a datagram path.
    datagrams: [u64; 5],
}

impl Totals {
    fn add(&mut self, s: &longhaul_session::SessionStats) {
        self.sent += s.bytes_sent;
        self.received += s.bytes_received;
        self.resumes += s.resumes;
        self.replayed += s.replayed;
        self.stalls += s.window_stalls;
        let d = &s.datagrams;
        for (t, n) in self.datagrams.iter_mut().zip([
            d.sent,
            d.received,
            d.dropped,
            d.path_sent,
            d.path_received,
        ]) {
            *t += n;
        }
    }
}

#[derive(Default)]
struct Inner {
    live: HashMap<u64, (String, SessionHandle)>,
    ended: Totals,
    next: u64,
}

/// One process's figures. Cheap to share; always counting, shown only
/// when `--metrics` is given.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    started: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
}

/// Keeps a session in the figures until dropped; then its counters move
/// to the totals.
pub struct Tracked {
    metrics: Arc<Metrics>,
    id: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut g = self.metrics.lock();
        if let Some((_, h)) = g.live.remove(&self.id) {
            let s = h.stats();
            g.ended.add(&s);
        }
    }
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a session from now until the returned guard is dropped.
    pub fn track(self: &Arc<Self>, peer: &str, h: &SessionHandle) -> Tracked {
        self.started.fetch_add(1, Ordering::Relaxed);
        let mut g = self.lock();
        g.next += 1;
        let id = g.next;
        g.live.insert(id, (peer.to_string(), h.clone()));
        Tracked {
            metrics: self.clone(),
            id,
        }
    }

    pub fn refused(&self, why: Refusal) {
        if let Some(i) = Refusal::ALL.iter().position(|r| *r == why) {
            self.refused[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The live sessions, with their peers.
    pub fn sessions(&self) -> Vec<(String, SessionHandle)> {
        self.lock().live.values().cloned().collect()
    }

    /// Everything, in Prometheus' text format (0.0.4).
    pub fn render(self: &Arc<Self>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Scrape(self.clone())));
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        openmetrics_to_text(&out)
    }
}

struct Scrape(Arc<Metrics>);

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrape")
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let m = &self.0;
        let (live, ended) = {
            let g = m.lock();
            (g.live.values().cloned().collect::<Vec<_>>(), g.ended)
        };
        let stats: Vec<_> = live.iter().map(|(p, h)| (p, h, h.stats())).collect();
        let mut t = ended;
        let (mut attached, mut detached, mut streams) = (0, 0, 0);
        for (_, _, s) in &stats {
            t.add(s);
            streams += s.streams as i64;
            match s.detached {
                true => detached += 1,
                false => attached += 1,
            }
        }
        {
            let mut f = e.encode_descriptor(
                "longhaul_sessions",
                "Sessions now: attached to a carrier, or detached (waiting for a resume).",
                None,
                MetricType::Gauge,
            )?;
            for (state, n) in [("attached", attached), ("detached", detached)] {
                ConstGauge::new(n).encode(f.encode_family(&[("state", state)])?)?;
            }
        }
        counter(
            &mut e,
            "longhaul_sessions_started",
            "Sessions started.",
            m.started.load(Ordering::Relaxed),
        )?;
        gauge(&mut e, "longhaul_streams", "Streams open now.", streams)?;
        counter(
            &mut e,
            "longhaul_sent_bytes",
            "Payload bytes sent on streams.",
            t.sent,
        )?;
        counter(
            &mut e,
            "longhaul_received_bytes",
            "Payload bytes received on streams.",
            t.received,
        )?;
        counter(
            &mut e,
            "longhaul_resumes",
            "Carrier drops that sessions survived.",
            t.resumes,
        )?;
        counter(
            &mut e,
            "longhaul_replayed_bytes",
            "Bytes sent again after carrier drops.",
            t.replayed,
        )?;
        counter(
            &mut e,
            "longhaul_window_stalls",
            "Times a stream had data to send and waited for the peer's window.",
            t.stalls,
        )?;
        {
            let mut f = e.encode_descriptor(
                "longhaul_datagrams",
                "UDP datagrams of flows: sent, received, or dropped (no room, no carrier, too long, flow closed).",
                None,
                MetricType::Counter,
            )?;
            for (what, n) in ["sent", "received", "dropped"].iter().zip(t.datagrams) {
                ConstCounter::new(n).encode(f.encode_family(&[("what", *what)])?)?;
            }
        }
        {
            let mut f = e.encode_descriptor(
                "longhaul_datagrams_as_quic_datagrams",
                "Of the UDP datagrams sent and received, those carried as QUIC datagrams (quic:// carriers) rather than in the session's byte stream.",
                None,
                MetricType::Counter,
            )?;
            for (what, n) in ["sent", "received"].iter().zip(&t.datagrams[3..]) {
                ConstCounter::new(*n).encode(f.encode_family(&[("what", *what)])?)?;
            }
        }
        {
            let mut f = e.encode_descriptor(
                "longhaul_refused",
                "Carriers, streams and requests refused, by reason.",
                None,
                MetricType::Counter,
            )?;
            for (i, r) in Refusal::ALL.iter().enumerate() {
                let v = m.refused[i].load(Ordering::Relaxed);
                ConstCounter::new(v).encode(f.encode_family(&[("reason", r.label())])?)?;
            }
        }
        {
            let mut f = e.encode_descriptor(
                "longhaul_session_rtt_seconds",
                "Smoothed round-trip time of each live session.",
                None,
                MetricType::Gauge,
            )?;
            for (peer, _, s) in &stats {
                let labels = [("peer", peer.as_str())];
                ConstGauge::new(s.rtt.as_secs_f64()).encode(f.encode_family(&labels)?)?;
            }
        }
        let lanes: Vec<_> = stats
            .iter()
            .flat_map(|(peer, h, _)| h.lane_stats().into_iter().map(move |l| (*peer, l)))
            .collect();
        if !lanes.is_empty() {
            for (name, help, pick) in [
                (
                    "longhaul_lane_sent_bytes",
                    "Bytes sent on each lane of a striped session.",
                    0,
                ),
                (
                    "longhaul_lane_received_bytes",
                    "Bytes received on each lane of a striped session.",
                    1,
                ),
            ] {
                let mut f = e.encode_descriptor(name, help, None, MetricType::Counter)?;
                for (peer, l) in &lanes {
                    let lane = l.number.to_string();
                    let labels = [("peer", peer.as_str()), ("lane", lane.as_str())];
                    let v = if pick == 0 {
                        l.bytes_sent
                    } else {
                        l.bytes_received
                    };
                    ConstCounter::new(v).encode(f.encode_family(&labels)?)?;
                }
            }
            let mut f = e.encode_descriptor(
                "longhaul_lane_rtt_seconds",
                "Round-trip time of each lane of a striped session (TCP's estimate).",
                None,
                MetricType::Gauge,
            )?;
            for (peer, l) in &lanes {
                let lane = l.number.to_string();
                let labels = [("peer", peer.as_str()), ("lane", lane.as_str())];
                let rtt = l.rtt.unwrap_or_default().as_secs_f64();
                ConstGauge::new(rtt).encode(f.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The encoder writes OpenMetrics, where a counter's HELP and TYPE name the
/// family (`x`) and its sample is `x_total`. Prometheus' own text format
/// — what scrapers without OpenMetrics and `promtool check metrics` read —
/// names the sample in all three, and has no `# EOF`.
fn openmetrics_to_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len() + 64);
    for line in om.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}
