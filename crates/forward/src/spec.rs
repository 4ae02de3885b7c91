//! ssh-style forward specifications.
//!
//! `-L [udp:][BIND:]PORT:HOST:HOSTPORT`, `-R [udp:][BIND:]PORT:HOST:HOSTPORT`,
//! `-D [BIND:]PORT`, `--http-proxy [BIND:]PORT`. BIND defaults to
//! 127.0.0.1; `*` or an empty BIND means all interfaces; IPv6 literals go in
//! brackets. `udp:` in front forwards UDP datagrams instead of TCP
//! connections.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use longhaul_proto::frame::format_target;
pub use longhaul_proto::frame::Transport;

/// `-L`/`-R`: listen on `bind:port`, connect to `host:host_port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardSpec {
    /// TCP connections, or UDP datagrams (`udp:` in front).
    pub transport: Transport,
    pub bind: String,
    pub port: u16,
    pub host: String,
    pub host_port: u16,
}

impl ForwardSpec {
    pub fn bind_addr(&self) -> String {
        join_host_port(&self.bind, self.port)
    }

    /// The stream destination it opens: `tcp://HOST:PORT` or `udp://…`.
    pub fn dest(&self) -> String {
        format_target(self.transport, &self.host, self.host_port)
    }

    /// The whole spec as a user writes it: `[udp:]BIND:PORT:HOST:HOSTPORT`.
    pub fn spelled(&self) -> String {
        format!(
            "{}{}:{}",
            self.prefix(),
            self.bind_addr(),
            join_host_port(&self.host, self.host_port)
        )
    }

    /// How it is written on the command line (`udp:` in front for UDP).
    pub fn prefix(&self) -> &'static str {
        match self.transport {
            Transport::Tcp => "",
            Transport::Udp => "udp:",
        }
    }
}

pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Splits on ':' outside brackets, stripping the brackets.
fn fields(s: &str) -> Option<Vec<String>> {
    let mut out = vec![];
    let mut cur = String::new();
    let mut in_br = false;
    for c in s.chars() {
        match c {
            '[' if !in_br && cur.is_empty() => in_br = true,
            ']' if in_br => in_br = false,
            ':' if !in_br => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    if in_br {
        return None;
    }
    out.push(cur);
    Some(out)
}

fn bind_host(b: &str) -> String {
    match b {
        "" | "*" => "0.0.0.0".into(),
        "localhost" => "127.0.0.1".into(),
        other => other.into(),
    }
}

fn port(s: &str) -> Option<u16> {
    s.parse().ok()
}

/// Longest host name (or address) in a `-L`/`-R` spec: a DNS name has at
/// most 253 characters, 254 with a final dot.
const MAX_HOST: usize = 255;

/// Parses `-L`/`-R` specs; `flag` names the option in error messages.
pub fn parse_forward(s: &str, flag: &str) -> Result<ForwardSpec, String> {
    let err = || {
        format!("invalid {flag} '{s}': expected [udp:][BIND:]PORT:HOST:HOSTPORT, e.g. {flag} 8080:example.com:80, {flag} [::1]:8080:[::1]:80 or {flag} udp:5353:dns.corp:53")
    };
    let (transport, spec) = match s.split_once(':') {
        Some(("udp", rest)) => (Transport::Udp, rest),
        Some(("tcp", rest)) => (Transport::Tcp, rest),
        _ => (Transport::Tcp, s),
    };
    let f = fields(spec).ok_or_else(err)?;
    let (bind, rest) = match f.len() {
        3 => ("127.0.0.1".to_string(), &f[..]),
        4 => (bind_host(&f[0]), &f[1..]),
        _ => return Err(err()),
    };
    // A number out of range is named as such, not as a wrong shape.
    let bad_port = |what: &str, v: &str| {
        format!(
            "invalid {flag} '{s}': {what} {v} is not a port (1-65535{})",
            if what == "local port" {
                ", or 0 for any"
            } else {
                ""
            }
        )
    };
    let is_number = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
    let p = match port(&rest[0]) {
        Some(p) => p,
        None if is_number(&rest[0]) => return Err(bad_port("local port", &rest[0])),
        None => return Err(err()),
    };
    let hp = match port(&rest[2]).filter(|&p| p != 0) {
        Some(p) => p,
        None if is_number(&rest[2]) => return Err(bad_port("target port", &rest[2])),
        None => return Err(err()),
    };
    if rest[1].is_empty() {
        return Err(err());
    }
    // Said without the spec itself, which may be as long as the host.
    for (what, host) in [("listen address", &bind), ("target host", &rest[1])] {
        if host.len() > MAX_HOST {
            return Err(format!(
                "invalid {flag}: its {what} is {} bytes long; a host name has at most {MAX_HOST}",
                host.len()
            ));
        }
    }
    Ok(ForwardSpec {
        transport,
        bind,
        port: p,
        host: rest[1].clone(),
        host_port: hp,
    })
}

/// Parses `-D`/`--http-proxy` specs into a socket address.
pub fn parse_listen(s: &str, flag: &str) -> Result<SocketAddr, String> {
    let err = || {
        format!(
            "invalid {flag} '{s}': expected [BIND:]PORT, e.g. {flag} 1080 or {flag} 0.0.0.0:1080"
        )
    };
    let f = fields(s).ok_or_else(err)?;
    let (bind, p) = match f.len() {
        1 => ("127.0.0.1".to_string(), &f[0]),
        2 => (bind_host(&f[0]), &f[1]),
        _ => return Err(err()),
    };
    let p = port(p).ok_or_else(err)?;
    let ip: IpAddr = bind.parse().map_err(|_| err())?;
    Ok(SocketAddr::new(ip, p))
}

/// Resolves a BIND host for listening (IP literals only, plus the names above).
pub fn listen_addr(bind: &str, port: u16) -> Result<SocketAddr, String> {
    let ip: IpAddr = bind.parse().map_err(|_| {
        format!("bind address '{bind}' is not an IP address (use e.g. 127.0.0.1, 0.0.0.0 or [::1])")
    })?;
    Ok(SocketAddr::new(ip, port))
}

pub fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_specs() {
        let f = parse_forward("4450:files.corp:445", "-L").unwrap();
        assert_eq!(
            f,
            ForwardSpec {
                transport: Transport::Tcp,
                bind: "127.0.0.1".into(),
                port: 4450,
                host: "files.corp".into(),
                host_port: 445
            }
        );
        let f = parse_forward("[::1]:8080:[2001:db8::1]:80", "-L").unwrap();
        assert_eq!(f.bind, "::1");
        assert_eq!(f.host, "2001:db8::1");
        assert_eq!(f.bind_addr(), "[::1]:8080");
        let f = parse_forward("*:1:h:2", "-R").unwrap();
        assert_eq!(f.bind, "0.0.0.0");
        let f = parse_forward("udp:5353:dns.corp:53", "-L").unwrap();
        assert_eq!(f.transport, Transport::Udp);
        assert_eq!((f.port, f.dest()), (5353, "udp://dns.corp:53".into()));
        let f = parse_forward("udp:[::1]:5353:[::1]:53", "-R").unwrap();
        assert_eq!(
            (f.bind.as_str(), f.dest()),
            ("::1", "udp://[::1]:53".into())
        );
        for bad in [
            "",
            "1:2",
            "x:h:1",
            "1:h:0",
            "1:h:99999",
            "[::1:1:h:2",
            "a:b:c:d:e",
            "udp:",
            "udp:1:h",
        ] {
            let e = parse_forward(bad, "-L").unwrap_err();
            assert!(e.starts_with("invalid -L"), "{e}");
        }
        // Too long for any host name: one short line, not the spec again.
        let long = "h".repeat(MAX_HOST + 1);
        assert!(parse_forward(&format!("1:{}:2", &long[1..]), "-L").is_ok());
        for spec in [format!("1:{long}:2"), format!("{long}:1:h:2")] {
            let e = parse_forward(&spec, "-R").unwrap_err();
            assert!(e.starts_with("invalid -R: its "), "{e}");
            assert!(e.len() < 120, "{e}");
        }
    }

    #[test]
    fn listen_specs() {
        assert_eq!(
            parse_listen("1080", "-D").unwrap(),
            "127.0.0.1:1080".parse().unwrap()
        );
        assert_eq!(
            parse_listen("[::1]:1080", "-D").unwrap(),
            "[::1]:1080".parse().unwrap()
        );
        assert_eq!(
            parse_listen("*:1", "-D").unwrap(),
            "0.0.0.0:1".parse().unwrap()
        );
        assert!(parse_listen("host:1", "-D").is_err());
        assert!(parse_listen("1:2:3", "-D").is_err());
    }
}
