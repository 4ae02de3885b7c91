//! Command-line arguments of `longhaul bench`.

use std::net::SocketAddr;

use clap::{Args, Subcommand};

use crate::values::{parse_addr, parse_delay, parse_loss, parse_rate, parse_size};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub cmd: BenchCmd,
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Answer tput, rr and goodput clients.
    Server(BenchServerArgs),
    /// Throughput over N parallel connections (iperf-like).
    Tput(TputArgs),
    /// Request/response round trips per size: mean and percentiles of N round trips each.
    Rr(RrArgs),
    /// Goodput of a transfer in blocks, by block size, one block in flight
    /// (a chatty protocol) or several (pipelined).
    Goodput(GoodputArgs),
    /// Direct vs tunnel per (delay, connections) over the WAN emulator,
    /// written as report.md, report.json and chart.svg. Needs root.
    Matrix(MatrixArgs),
    /// UDP at a set rate and size, like iperf3 -u, measured over the round
    /// trip (the bench server sends each datagram back): loss,
    /// duplicates, reordering, round-trip p50/p99 and jitter.
    Udp(UdpArgs),
    /// Many sessions at one longhaul server from this process, each with
    /// one stream held open: how fast they come up (handshakes per second).
    Sessions(SessionsArgs),
}

#[derive(Args, Debug)]
pub struct SessionsArgs {
    /// The longhaul server, as for 'client'.
    #[arg(value_parser = crate::conn_args::parse_server_url)]
    pub server: crate::conn_args::ServerUrl,
    /// Sessions to start.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub count: usize,
    /// Sessions being set up at once.
    #[arg(short = 'c', long, default_value_t = 64)]
    pub concurrency: usize,
    /// Where each session's stream goes (HOST:PORT, allowed at the server).
    #[arg(long, value_name = "HOST:PORT")]
    pub to: String,
    /// Seconds the sessions are held once all are up.
    #[arg(long, default_value_t = 0.0)]
    pub hold: f64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: crate::conn_args::ConnectArgs,
    #[command(flatten)]
    pub session: crate::conn_args::SessionArgs,
}

#[derive(Args, Debug)]
pub struct UdpArgs {
    /// HOST:PORT of a bench server (direct) or of a `-L udp:` forward to one.
    pub addr: String,
    /// Rate offered, e.g. 64kbit, 10mbit, 1gbit.
    #[arg(short = 'b', long, default_value = "10mbit", value_parser = parse_rate)]
    pub rate: u64,
    /// Bytes per datagram (UDP payload, 20 to 65507).
    #[arg(short = 'l', long, default_value_t = 1200, value_parser = clap::value_parser!(u32).range(20..=65507))]
    pub size: u32,
    /// Seconds to send.
    #[arg(short = 't', long, default_value_t = 10.0, value_parser = parse_seconds)]
    pub time: f64,
    /// Seconds sent first and not counted: the flow opens through the
    /// tunnel meanwhile (its first datagrams wait or are dropped), and a
    /// load started beside it settles.
    #[arg(long, value_name = "SECONDS", value_parser = parse_warmup)]
    pub warmup: Option<f64>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct MatrixArgs {
    /// One-way delays to test (RTT = 2 × delay), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,50ms", value_parser = parse_delay)]
    pub delay: Vec<std::time::Duration>,
    /// Parallel connections per cell, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,10", value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub conns: Vec<u16>,
    /// Seconds per measurement.
    #[arg(short = 't', long, default_value_t = 10.0, value_parser = parse_seconds)]
    pub time: f64,
    /// Seconds of warm-up before each throughput measurement, not measured (iperf3's -O).
    #[arg(short = 'O', long, default_value_t = 2.0, value_parser = parse_omit)]
    pub omit: f64,
    /// Output directory.
    #[arg(long, default_value = "report")]
    pub out: std::path::PathBuf,
    /// Rate cap of the emulated link, e.g. 1gbit.
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<u64>,
    /// Random loss on the emulated link, e.g. 0.5%.
    #[arg(long, default_value = "0", value_parser = parse_loss)]
    pub loss: f64,
    /// Fixed socket buffers for the application (bench client and server), e.g. 64k: an application that cannot be retuned.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub app_buffer: Option<u64>,
    /// Raise the namespaces' TCP buffer maximum, e.g. 64m.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub tcp_buffers: Option<u64>,
    /// Round trips per rr size (default: about 2 s worth, 10–1000).
    #[arg(long)]
    pub rr_count: Option<usize>,
    /// rr request sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000,100000", value_parser = parse_rr_size)]
    pub rr_sizes: Vec<u32>,
    /// Skip the rr sweep.
    #[arg(long)]
    pub no_rr: bool,
    /// Emulator instance name.
    #[arg(long, default_value = "matrix")]
    pub name: String,
    /// TCP congestion control for longhaul's carrier (both ends).
    #[arg(long, value_name = "ALGO")]
    pub congestion: Option<String>,
    /// longhaul's carrier: tcp (plain, the multiplexer alone), tls (pinned keys, as users run it) or quic (the same keys, over UDP).
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "tls", "quic"])]
    pub carrier: String,
    /// Load generator: iperf3 (Debian's, when installed), bench (longhaul
    /// bench tput), or auto (iperf3 if installed).
    #[arg(long, default_value = "auto", value_parser = longhaul_bench::load::Load::parse)]
    pub load: longhaul_bench::load::Load,
}

#[derive(Args, Debug)]
pub struct BenchServerArgs {
    #[arg(long, default_value = "127.0.0.1:5201", value_parser = parse_addr)]
    pub listen: SocketAddr,
    /// Fixed SO_SNDBUF/SO_RCVBUF for accepted connections.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub buffer: Option<u64>,
}

#[derive(Args, Debug)]
pub struct TputArgs {
    /// HOST:PORT of a bench server (direct) or of a forward to one.
    pub addr: String,
    /// Parallel connections.
    #[arg(short = 'P', long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub parallel: u16,
    /// Seconds to run.
    #[arg(short = 't', long, default_value_t = 10.0, value_parser = parse_seconds)]
    pub time: f64,
    /// Reverse: the server sends.
    #[arg(short = 'R', long)]
    pub reverse: bool,
    /// Seconds of warm-up (slow start) left out of the result, like iperf3's -O.
    #[arg(short = 'O', long, default_value_t = 0.0, value_parser = parse_omit)]
    pub omit: f64,
    /// Seconds between progress lines (0: none).
    #[arg(short = 'i', long, default_value_t = 1.0)]
    pub interval: f64,
    /// Fixed SO_SNDBUF/SO_RCVBUF, like an application that cannot be retuned.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub buffer: Option<u64>,
    /// How the sender writes: iperf (wait until writable, then up to ten
    /// 128 KiB blocks, as iperf3 does) or fill (write until the socket refuses).
    #[arg(long, value_enum, default_value_t = SenderArg::Iperf)]
    pub sender: SenderArg,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SenderArg {
    Iperf,
    Fill,
}

impl From<SenderArg> for longhaul_bench::send::Sender {
    fn from(s: SenderArg) -> Self {
        match s {
            SenderArg::Iperf => longhaul_bench::send::Sender::Iperf,
            SenderArg::Fill => longhaul_bench::send::Sender::Fill,
        }
    }
}

fn parse_omit(x: &str) -> Result<f64, String> {
    x.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && (0.0..=600.0).contains(v))
        .ok_or_else(|| format!("--omit '{x}': seconds from 0 to 600"))
}

fn parse_seconds(x: &str) -> Result<f64, String> {
    x.parse::<f64>()
        .ok()
        .filter(|t| (0.05..=3600.0).contains(t))
        .ok_or_else(|| format!("-t '{x}': seconds from 0.05 to 3600"))
}

fn parse_warmup(x: &str) -> Result<f64, String> {
    x.parse::<f64>()
        .ok()
        .filter(|t| (0.0..=600.0).contains(t))
        .ok_or_else(|| format!("--warmup '{x}': seconds from 0 to 600"))
}

fn parse_rr_size(x: &str) -> Result<u32, String> {
    let v = parse_size(x)?;
    u32::try_from(v)
        .ok()
        .filter(|&v| v <= longhaul_bench::MAX_RR_SIZE)
        .ok_or_else(|| format!("rr size '{x}' is above the 16 MiB limit"))
}

#[derive(Args, Debug)]
pub struct RrArgs {
    pub addr: String,
    /// Request sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000,10000,100000", value_parser = parse_rr_size)]
    pub sizes: Vec<u32>,
    /// Round trips per size.
    #[arg(short = 'n', long = "count", default_value_t = 1000)]
    pub count: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct GoodputArgs {
    pub addr: String,
    /// Block sizes, comma-separated (up to 16m).
    #[arg(long, value_delimiter = ',', default_value = "4k,16k,64k,256k,1m,4m,16m", value_parser = parse_rr_size)]
    pub sizes: Vec<u32>,
    /// Blocks in flight at once, comma-separated: 1 waits for each
    /// block's answer before the next.
    #[arg(long, value_delimiter = ',', default_value = "1,8", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub depth: Vec<u16>,
    /// Per run, stop after this many bytes…
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    pub total: u64,
    /// …or after this many seconds.
    #[arg(short = 't', long, default_value_t = 5.0, value_parser = parse_seconds)]
    pub time: f64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Seconds per throughput measurement.
    #[arg(short = 't', long, default_value_t = 3.0, value_parser = parse_seconds)]
    pub time: f64,
    /// Round trips per rr size.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub count: usize,
    /// Repeat every measurement, interleaved direct/tunnel; report medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=20))]
    pub rounds: u16,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

impl From<DemoArgs> for longhaul_bench::demo::DemoOptions {
    fn from(d: DemoArgs) -> Self {
        longhaul_bench::demo::DemoOptions {
            time: d.time,
            count: d.count,
            rounds: d.rounds,
            json: d.json,
        }
    }
}

impl From<MatrixArgs> for longhaul_bench::matrix::MatrixOptions {
    fn from(a: MatrixArgs) -> Self {
        longhaul_bench::matrix::MatrixOptions {
            delay: a.delay,
            conns: a.conns,
            time: a.time,
            omit: a.omit,
            out: a.out,
            rate: a.rate,
            loss: a.loss,
            app_buffer: a.app_buffer,
            tcp_buffers: a.tcp_buffers,
            rr_count: a.rr_count,
            rr_sizes: a.rr_sizes,
            no_rr: a.no_rr,
            name: a.name,
            congestion: a.congestion,
            carrier: a.carrier,
            load: a.load,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert_eq!(parse_size("10"), Ok(10));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("5x").is_err());
    }

    #[test]
    fn addrs() {
        assert_eq!(parse_addr(":7000"), Ok("0.0.0.0:7000".parse().unwrap()));
        assert!(parse_addr("localhost").is_err());
    }
}
