//! The emulator's command-line values: durations, rates, loss rates.

use std::time::Duration;

/// Parses `50ms`, `1.5s`, `200us`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let err = || format!("'{s}' is not a duration (use e.g. 50ms, 1s, 200us)");
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if t == "0" {
        ("0", 1.0)
    } else {
        return Err(err());
    };
    let v: f64 = num.trim().parse().map_err(|_| err())?;
    if !(0.0..=60.0).contains(&(v * mult)) {
        return Err(format!("'{s}' is out of range (0 to 60 s)"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

/// Parses `1gbit`, `100mbit`, `500kbit`, `1000000` (bits per second).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let err = || format!("'{s}' is not a rate (use e.g. 1gbit, 100mbit, 500kbit)");
    let (num, mult) = if let Some(n) = t.strip_suffix("gbit") {
        (n, 1e9)
    } else if let Some(n) = t.strip_suffix("mbit") {
        (n, 1e6)
    } else if let Some(n) = t.strip_suffix("kbit") {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix("bit") {
        (n, 1.0)
    } else {
        (t.as_str(), 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| err())?;
    let bps = v * mult;
    if !(1000.0..=1e12).contains(&bps) {
        return Err(format!("'{s}' is out of range (1kbit to 1000gbit)"));
    }
    Ok(bps as u64)
}

/// Parses `0.5%` or `0.005`.
pub fn parse_loss(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("'{s}' is not a loss rate (use e.g. 0.5% or 0.005)"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("loss '{s}' must be between 0% and 100%"));
    }
    Ok(v)
}

/// A timeout or an age: `500ms`, `90s`, `30m`, `2h`, `7d`, `0`; at most 30
/// days.
pub fn parse_span(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let err = || format!("'{s}' is not a duration (use e.g. 500ms, 90s, 30m, 2h, 7d)");
    let digits = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let mult = match unit {
        "" if num.parse::<f64>() == Ok(0.0) => 1.0,
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return Err(err()),
    };
    let v: f64 = num.parse().map_err(|_| err())?;
    let secs = v * mult;
    if !(0.0..=30.0 * 86_400.0).contains(&secs) {
        return Err(format!("'{s}' is out of range (0 to 30d)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("200us"), Ok(Duration::from_micros(200)));
        assert!(parse_duration("50").is_err());
        assert!(parse_duration("90s").is_err());
        assert_eq!(parse_rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("2.5mbit"), Ok(2_500_000));
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_loss("0.5%"), Ok(0.005));
        assert_eq!(parse_loss("0.01"), Ok(0.01));
        assert!(parse_loss("150%").is_err());
    }

    #[test]
    fn spans_take_units_up_to_days() {
        assert_eq!(parse_span("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_span("300s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_span("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_span("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_span("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_span("0"), Ok(Duration::ZERO));
        for bad in ["", "h", "5", "5x", "-1s", "31d", "1e9s", "s5"] {
            assert!(parse_span(bad).is_err(), "{bad}");
        }
    }
}
