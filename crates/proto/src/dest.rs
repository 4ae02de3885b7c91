//! Destination URLs of streams: `tcp://host:port` (JMUX's form) and
//! `udp://host:port` (a UDP flow).

/// What a stream carries: a byte stream to a TCP target, or the
/// datagrams of a UDP flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    Tcp,
    Udp,
}

impl Transport {
    pub fn scheme(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
        }
    }
}

/// Parses a destination URL `tcp://host:port` or `udp://host:port` (IPv6
/// hosts in brackets).
pub fn parse_target(url: &str) -> Option<(Transport, String, u16)> {
    let (transport, rest) = match url.split_once("://")? {
        ("tcp", rest) => (Transport::Tcp, rest),
        ("udp", rest) => (Transport::Udp, rest),
        _ => return None,
    };
    let (host, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    Some((transport, host.to_owned(), port))
}

/// Parses a JMUX destination URL `tcp://host:port` (IPv6 hosts in brackets).
pub fn parse_dest(url: &str) -> Option<(String, u16)> {
    match parse_target(url)? {
        (Transport::Tcp, host, port) => Some((host, port)),
        _ => None,
    }
}

/// Formats a destination URL, bracketing IPv6 literals.
pub fn format_target(transport: Transport, host: &str, port: u16) -> String {
    let scheme = transport.scheme();
    if host.contains(':') {
        format!("{scheme}://[{host}]:{port}")
    } else {
        format!("{scheme}://{host}:{port}")
    }
}

/// Formats a TCP destination URL.
pub fn format_dest(host: &str, port: u16) -> String {
    format_target(Transport::Tcp, host, port)
}
