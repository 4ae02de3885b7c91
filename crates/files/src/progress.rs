//! What `cp` shows: a progress bar on a terminal (nothing otherwise), and
//! at the end the size, time and goodput — or JSON for scripts.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::client::{Copied, Counters};

/// Draws the bar from the counters until dropped.
pub struct Bar {
    bar: ProgressBar,
    stop: Arc<std::sync::atomic::AtomicBool>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

impl Bar {
    /// A bar for `total` bytes; hidden unless stderr is a terminal and
    /// `show`.
    pub fn start(total: u64, counters: Arc<Counters>, show: bool) -> Bar {
        let target = match show && std::io::stderr().is_terminal() {
            true => ProgressDrawTarget::stderr_with_hz(10),
            false => ProgressDrawTarget::hidden(),
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        bar.set_style(
            ProgressStyle::with_template(
                "{bytes:>10} / {total_bytes} {wide_bar} {binary_bytes_per_sec:>12} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ticker = {
            let (bar, stop) = (bar.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut resumed = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Bytes found already there count as done, but not as
                    // speed: the bar starts from them.
                    let r = counters.resumed.load(Ordering::Relaxed);
                    if r != resumed {
                        bar.inc(r - resumed);
                        bar.reset_eta();
                        resumed = r;
                    }
                    bar.set_position(counters.moved.load(Ordering::Relaxed) + resumed);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Bar {
            bar,
            stop,
            ticker: Some(ticker),
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

/// The outcome of a `cp`.
#[derive(Debug, serde::Serialize)]
pub struct Summary {
    pub files: usize,
    /// Size of the files copied.
    pub bytes: u64,
    /// Bytes carried this time.
    pub transferred: u64,
    /// Bytes already there from an interrupted copy, verified and kept.
    pub resumed: u64,
    pub seconds: f64,
    /// `transferred` over `seconds`, in bits per second.
    pub goodput_bps: f64,
    pub copied: Vec<Copied>,
    pub errors: Vec<String>,
}

impl Summary {
    pub fn new(
        copied: Vec<Copied>,
        errors: Vec<String>,
        c: &Counters,
        started: Instant,
    ) -> Summary {
        let seconds = started.elapsed().as_secs_f64();
        let transferred = c.moved.load(Ordering::Relaxed);
        Summary {
            files: copied.len(),
            bytes: copied.iter().map(|f| f.size).sum(),
            transferred,
            resumed: c.resumed.load(Ordering::Relaxed),
            seconds,
            goodput_bps: transferred as f64 * 8.0 / seconds.max(1e-9),
            copied,
            errors,
        }
    }

    /// One line for people.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{} file{}, {} in {:.1} s: {} goodput",
            self.files,
            if self.files == 1 { "" } else { "s" },
            size(self.bytes),
            self.seconds,
            rate(self.goodput_bps),
        );
        if self.resumed > 0 {
            s += &format!(" ({} were already there, verified)", size(self.resumed));
        }
        // How many failed is said once, by the command's last line.
        s
    }
}

fn size(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{b} B"),
        _ => format!("{v:.2} {}", UNITS[u]),
    }
}

fn rate(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else {
        format!("{:.1} Mbit/s", bps / 1e6)
    }
}
