//! Values the command line takes (sizes, rates, delays, addresses), parsed
//! with a message that says what to write instead. Used by every command's
//! arguments (`args`, `bench_args`).

use std::net::SocketAddr;

/// A service's name: also its log files' and its Event Log source's, so no
/// path separators or other punctuation.
pub(crate) fn parse_service_name(s: &str) -> Result<String, String> {
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    match s.len() {
        1..=64 if s.chars().all(fine) && !s.starts_with('.') => Ok(s.to_string()),
        _ => Err(format!(
            "'{s}': a service name is 1 to 64 letters, digits, '-', '_' or '.' (not first)"
        )),
    }
}

pub(crate) fn parse_delay(s: &str) -> Result<std::time::Duration, String> {
    longhaul_netem::parse_duration(s)
}

/// A timeout or an age, up to 30 days (`90s`, `2h`, `7d`).
pub(crate) fn parse_span(s: &str) -> Result<std::time::Duration, String> {
    longhaul_netem::parse_span(s)
}
pub(crate) fn parse_rate(s: &str) -> Result<u64, String> {
    longhaul_netem::parse_rate(s)
}
pub(crate) fn parse_loss(s: &str) -> Result<f64, String> {
    longhaul_netem::parse_loss(s)
}
pub(crate) fn parse_link2(s: &str) -> Result<longhaul_netem::Link2, String> {
    let mut parts = s.split(',');
    let delay = parse_delay(parts.next().unwrap_or_default())?;
    let rate = parts.next().map(parse_rate).transpose()?;
    let loss = parts.next().map(parse_loss).transpose()?.unwrap_or(0.0);
    if parts.next().is_some() {
        return Err(format!(
            "--link2 {s}: give DELAY[,RATE[,LOSS]], e.g. 30ms,200mbit"
        ));
    }
    Ok(longhaul_netem::Link2 {
        delay_us: delay.as_micros() as u64,
        rate_bps: rate,
        loss,
    })
}

/// Parses sizes like 65536, 64k, 64KiB, 1m, 2G.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (use e.g. 65536, 64k, 16m, 1g)"))?;
    let mult = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("'{s}' has an unknown unit (use k, m or g)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// Parses `HOST:PORT` or `:PORT` (all interfaces) into a socket address.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let t = if let Some(p) = s.strip_prefix(':') {
        format!("0.0.0.0:{p}")
    } else {
        s.to_string()
    };
    t.parse().map_err(|_| {
        format!("'{s}' is not an IP:PORT address (use e.g. 127.0.0.1:7000, [::1]:7000 or :7000)")
    })
}
