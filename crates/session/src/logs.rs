//! What a peer sends, in our log lines: escaped and cut short ([`shown`]),
//! so that it cannot forge a line or drive a terminal; and refusals
//! throttled ([`Refusals`]), so that a peer asking for what it may not have
//! cannot fill the disk the logs go to.

use std::fmt::{self, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most characters of one peer string in a log line.
pub const SHOWN_MAX: usize = 160;
/// Refusals logged per second (per session, or per [`Throttle`]).
pub const REFUSALS_PER_SECOND: u32 = 10;

/// `s` for a log line: newlines, ESC and the other control characters,
/// Unicode's line separators and bidirectional overrides escaped (`\n`,
/// `\u{1b}`), a backslash doubled, and at most [`SHOWN_MAX`] characters
/// (then `…(N bytes)`).
pub fn shown(s: &str) -> Shown<'_> {
    Shown(s)
}

/// [`shown`] of anything displayed (an error whose text quotes the peer).
pub fn escaped(v: impl fmt::Display) -> String {
    shown(&v.to_string()).to_string()
}

pub struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.chars().enumerate() {
            if i == SHOWN_MAX {
                return write!(f, "…({} bytes)", self.0.len());
            }
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                '\\' => f.write_str("\\\\")?,
                c if c.is_control() || invisible(c) => write!(f, "\\u{{{:x}}}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Characters that break or reorder a line in log viewers and terminals
/// without being control characters.
fn invisible(c: char) -> bool {
    matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// The first [`REFUSALS_PER_SECOND`] events of each second pass; the rest
/// are counted, and the count is handed to the next one that passes.
pub struct Throttle {
    window: Mutex<Window>,
}

struct Window {
    start: Option<Instant>,
    passed: u32,
    held: u64,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new()
    }
}

impl Throttle {
    pub const fn new() -> Throttle {
        Throttle {
            window: Mutex::new(Window {
                start: None,
                passed: 0,
                held: 0,
            }),
        }
    }

    /// Whether to log the event happening now: `Some(n)` with the number
    /// of earlier ones that were not, or `None` (counted, not logged).
    pub fn admit(&self) -> Option<u64> {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if w.start
            .is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1))
        {
            w.start = Some(now);
            w.passed = 0;
        }
        if w.passed >= REFUSALS_PER_SECOND {
            w.held += 1;
            return None;
        }
        w.passed += 1;
        Some(std::mem::take(&mut w.held))
    }

    /// [`Throttle::admit`], first logging how many `what` were not.
    pub fn pass(&self, what: &str) -> bool {
        match self.admit() {
            Some(0) => true,
            Some(n) => {
                tracing::warn!(
                    "… and {n} more {what} not logged (at most {REFUSALS_PER_SECOND} a second)"
                );
                true
            }
            None => false,
        }
    }

    /// Events not logged since the last one that was (and forgets them).
    pub fn take_held(&self) -> u64 {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut w.held)
    }
}

/// Refused OPENs logged, across sessions.
static REFUSED_STREAMS: Throttle = Throttle::new();

/// A refused OPEN in the log: its destination escaped, at most
/// [`crate::logs::REFUSALS_PER_SECOND`] lines a second for the process.
pub(crate) fn log_refused(peer: &str, dest: &str, why: &dyn std::fmt::Display) {
    if REFUSED_STREAMS.pass("refused streams") {
        let (dest, why) = (shown(dest), escaped(why));
        tracing::info!(%peer, %dest, reason = %why, "stream refused");
    }
}

/// One session's refusals: a [`Throttle`] that says, at most once a second
/// and when the session ends, how many it did not log.
pub struct Refusals {
    peer: String,
    throttle: Throttle,
}

impl Refusals {
    pub fn new(peer: String) -> Refusals {
        Refusals {
            peer,
            throttle: Throttle::new(),
        }
    }

    /// Whom the session serves.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Whether to log the refusal happening now (first saying how many
    /// were not logged before it).
    pub fn admit(&self) -> bool {
        match self.throttle.admit() {
            Some(n) => {
                self.held(n);
                true
            }
            None => false,
        }
    }

    fn held(&self, n: u64) {
        if n > 0 {
            tracing::warn!(peer = %self.peer, "… and {n} more refusals not logged (at most {REFUSALS_PER_SECOND} a second)");
        }
    }
}

impl Drop for Refusals {
    fn drop(&mut self) {
        self.held(self.throttle.take_held());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_escapes_and_cuts() {
        let s = shown("a\nb\x1b[31mc\\d\u{202e}e\u{85}").to_string();
        assert_eq!(s, "a\\nb\\u{1b}[31mc\\\\d\\u{202e}e\\u{85}");
        let long = "x".repeat(1000);
        let s = shown(&long).to_string();
        assert!(
            s.ends_with("…(1000 bytes)") && s.len() < SHOWN_MAX + 20,
            "{s}"
        );
    }

    /// Fields that hold what a peer (or a folder's writer) chose.
    const PEER_FIELDS: [&str; 7] = [
        "dest",
        "bind",
        "path",
        "description",
        "reason",
        "instance",
        "host",
    ];

    /// Every `tracing` macro in the workspace's sources, with the lines
    /// before it: (file:line, the lines before, the macro's text).
    fn log_calls() -> Vec<(String, String, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![];
        let mut dirs = vec![root];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() && !p.ends_with("tests") {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    files.push(p);
                }
            }
        }
        let mut calls = vec![];
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            // Test modules log what they like.
            let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            for level in ["trace!(", "debug!(", "info!(", "warn!(", "error!("] {
                for (at, _) in text.match_indices(&format!("tracing::{level}")) {
                    let body_at = at + "tracing::".len() + level.len();
                    let mut depth = 1;
                    let end = text[body_at..]
                        .char_indices()
                        .find(|&(_, c)| {
                            depth += match c {
                                '(' => 1,
                                ')' => -1,
                                _ => 0,
                            };
                            depth == 0
                        })
                        .map_or(text.len(), |(i, _)| body_at + i);
                    let line = text[..at].lines().count();
                    let before: Vec<&str> = text[..at].lines().rev().take(30).collect();
                    calls.push((
                        format!("{}:{line}", f.display()),
                        before.join("\n"),
                        text[body_at..end].to_string(),
                    ));
                }
            }
        }
        calls
    }

    /// Whether `body` logs `field` as it came — `%field`, `?field`,
    /// `{field}` in the text, or `field = %x` with no `shown`/`escaped` —
    /// and then the name that must have been escaped before (`field`, or
    /// `x`).
    fn raw_use(body: &str, field: &str) -> Option<String> {
        let b = body.as_bytes();
        let ok = |c: u8| !(c.is_ascii_alphanumeric() || c == b'_');
        let word = |i: usize, len: usize| {
            (i == 0 || ok(b[i - 1])) && b.get(i + len).is_none_or(|&c| ok(c))
        };
        body.match_indices(field).find_map(|(i, _)| {
            if !word(i, field.len()) {
                return None;
            }
            let prev = body[..i].chars().next_back();
            let after = body[i + field.len()..].trim_start();
            match prev {
                Some('%') | Some('?') if !after.starts_with('=') => Some(field.to_string()),
                Some('{') if after.starts_with('}') || after.starts_with(':') => {
                    Some(field.to_string())
                }
                Some('%') | Some('?') | Some('{') => None,
                _ if after.starts_with('=') && !after.starts_with("==") => {
                    let value = after[1..].trim_start().trim_start_matches(['%', '?']);
                    let name: String = value
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    let rest = &value[name.len()..];
                    (!rest.starts_with('(') && !rest.starts_with("::")).then_some(name)
                }
                _ => None,
            }
        })
    }

    #[test]
    fn no_peer_chosen_field_is_logged_unescaped() {
        let mut raw = vec![];
        for (at, before, body) in log_calls() {
            for field in PEER_FIELDS {
                let Some(name) = raw_use(&body, field) else {
                    continue;
                };
                // Escaped just before (`let dest = shown(&dest);`), or
                // marked as not the peer's (`// not peer text: …`).
                let rebound = before.lines().any(|l| {
                    l.contains("let ")
                        && l.contains(&name)
                        && (l.contains("shown(") || l.contains("escaped("))
                });
                if !rebound && !before.lines().take(2).any(|l| l.contains("not peer text")) {
                    raw.push(format!("{at}: {field}"));
                }
            }
        }
        assert!(raw.is_empty(), "peer fields logged unescaped: {raw:#?}");
        // The check sees what it looks for.
        assert_eq!(raw_use("%dest, \"x\"", "dest").as_deref(), Some("dest"));
        assert_eq!(raw_use("\"to {dest}\"", "dest").as_deref(), Some("dest"));
        assert_eq!(raw_use("dest = %d", "dest").as_deref(), Some("d"));
        assert_eq!(raw_use("dest = %shown(&d)", "dest"), None);
        assert_eq!(raw_use("%destination", "dest"), None);
    }

    #[test]
    fn throttle_passes_the_first_ones_and_counts_the_rest() {
        let t = Throttle::new();
        let passed = (0..1000).filter(|_| t.admit().is_some()).count();
        assert_eq!(passed, REFUSALS_PER_SECOND as usize);
        assert_eq!(t.take_held(), 1000 - REFUSALS_PER_SECOND as u64);
    }
}
