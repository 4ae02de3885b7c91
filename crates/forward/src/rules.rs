//! Deny-by-default rules.
//!
//! A target rule is `HOST:PORT`: HOST is an IP, a CIDR, a DNS name, `*.suffix`
//! or `*`; PORT is a number, a range `a-b`, or `*`. IPv6 hosts go in brackets
//! (`[::1]:22`, `[fd00::/8]:*`). It allows TCP streams; `udp:HOST:PORT`
//! allows UDP flows instead (a rule says one protocol, never both).
//!
//! A bind rule is `[ADDR:]PORT` (PORT as above). Without ADDR it allows that
//! port on loopback only — the safe meaning, like ssh's `GatewayPorts no`;
//! `0.0.0.0:PORT` or `[::]:PORT` allow the wildcard address. It allows TCP
//! listeners; `udp:[ADDR:]PORT` allows UDP ones instead.

use std::net::IpAddr;
use std::str::FromStr;

pub use longhaul_proto::frame::Transport;

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Any,
    Cidr(IpAddr, u8),
    Name(String),
    /// `*.corp` stored as `.corp`
    Suffix(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    lo: u16,
    hi: u16,
}

impl PortRange {
    pub fn contains(&self, p: u16) -> bool {
        (self.lo..=self.hi).contains(&p)
    }

    fn is_any(&self) -> bool {
        self.lo == 0 && self.hi == u16::MAX
    }
}

impl FromStr for PortRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "*" {
            return Ok(PortRange {
                lo: 0,
                hi: u16::MAX,
            });
        }
        let num = |x: &str| {
            x.parse::<u16>()
                .map_err(|_| format!("'{x}' is not a port number (use 1-65535, a range a-b, or *)"))
        };
        match s.split_once('-') {
            Some((a, b)) => {
                let (lo, hi) = (num(a)?, num(b)?);
                if lo > hi {
                    return Err(format!("port range '{s}' is backwards"));
                }
                Ok(PortRange { lo, hi })
            }
            None => {
                let p = num(s)?;
                Ok(PortRange { lo: p, hi: p })
            }
        }
    }
}

/// Splits `HOST:PORT`, honouring `[v6]` brackets.
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        Some((host, port))
    } else {
        s.rsplit_once(':')
    }
}

fn normalize_name(h: &str) -> String {
    h.trim_end_matches('.').to_ascii_lowercase()
}

fn parse_cidr(h: &str) -> Option<(IpAddr, u8)> {
    let (ip, bits) = match h.split_once('/') {
        Some((ip, bits)) => (ip.parse::<IpAddr>().ok()?, bits.parse::<u8>().ok()?),
        None => {
            let ip = h.parse::<IpAddr>().ok()?;
            (ip, if ip.is_ipv4() { 32 } else { 128 })
        }
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (bits <= max).then_some((ip, bits))
}

/// An IPv6 address that carries an IPv4 one — mapped (`::ffff:0:0/96`),
/// NAT64's well-known prefix (`64:ff9b::/96`) or IPv4-compatible
/// (`::/96`, but not `::` or `::1`) — as that IPv4 address: a rule for
/// `10.0.0.0/8` covers `[64:ff9b::a00:1]` and `[::ffff:10.0.0.1]`, and an
/// IPv6 rule never admits an IPv4 host through such a spelling.
pub fn embedded_v4(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let o = v6.octets();
    let v4 = std::net::Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    let nat64 = o[..12] == [0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0];
    let compatible = o[..12] == [0; 12] && o[12] != 0;
    if nat64 || compatible {
        IpAddr::V4(v4)
    } else {
        ip
    }
}

fn in_cidr(net: IpAddr, bits: u8, ip: IpAddr) -> bool {
    let ip = embedded_v4(ip);
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// One `--allow` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    transport: Transport,
    host: HostPattern,
    ports: PortRange,
}

impl FromStr for Rule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let usage = "expected [udp:]HOST:PORT, e.g. --allow db.corp:5432, --allow '*.corp:443', --allow 10.0.0.0/8:1-1024, --allow udp:dns.corp:53";
        // `udp:53` is host "udp" (TCP); `udp:dns:53` is a UDP rule.
        let (transport, spec) = match s.strip_prefix("udp:") {
            Some(rest) if split_host_port(rest).is_some() => (Transport::Udp, rest),
            _ => (Transport::Tcp, s),
        };
        let (host, port) =
            split_host_port(spec).ok_or_else(|| format!("invalid rule '{s}': {usage}"))?;
        let ports = port
            .parse::<PortRange>()
            .map_err(|e| format!("invalid rule '{s}': {e}"))?;
        let host = if host == "*" {
            HostPattern::Any
        } else if let Some((ip, bits)) = parse_cidr(host) {
            HostPattern::Cidr(ip, bits)
        } else if let Some(sfx) = host.strip_prefix("*.") {
            HostPattern::Suffix(format!(".{}", normalize_name(sfx)))
        } else if !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
        {
            HostPattern::Name(normalize_name(host))
        } else {
            return Err(format!("invalid rule '{s}': bad host '{host}'; {usage}"));
        };
        Ok(Rule {
            transport,
            host,
            ports,
        })
    }
}

/// The server's target rules.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    rules: Vec<Rule>,
    allow_all: bool,
}

impl Rules {
    pub fn new(rules: Vec<Rule>, allow_all: bool) -> Rules {
        Rules { rules, allow_all }
    }

    pub fn allow_all() -> Rules {
        Rules::new(vec![], true)
    }

    /// Nothing is allowed at all.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && !self.allow_all
    }

    /// Allowed by name alone (name, suffix, `*`, or an IP literal target).
    pub fn allows_name(&self, t: Transport, host: &str, port: u16) -> bool {
        if self.allow_all {
            return true;
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return self.allows_ip(t, ip, port);
        }
        let name = normalize_name(host);
        self.rules.iter().any(|r| {
            r.transport == t
                && r.ports.contains(port)
                && match &r.host {
                    HostPattern::Any => true,
                    HostPattern::Name(n) => *n == name,
                    HostPattern::Suffix(sfx) => name.ends_with(sfx.as_str()),
                    HostPattern::Cidr(..) => false,
                }
        })
    }

    /// Allowed by address (IP and CIDR rules, `*`).
    pub fn allows_ip(&self, t: Transport, ip: IpAddr, port: u16) -> bool {
        self.allow_all
            || self.rules.iter().any(|r| {
                r.transport == t
                    && r.ports.contains(port)
                    && match &r.host {
                        HostPattern::Any => true,
                        HostPattern::Cidr(net, bits) => in_cidr(*net, *bits, ip),
                        _ => false,
                    }
            })
    }

    /// Whether any rule could admit an address of a name resolved for
    /// `port` (worth a DNS lookup: a name no rule can admit is never
    /// resolved, so a peer cannot make the server look up names of its
    /// choosing).
    pub fn has_address_rules(&self, t: Transport, port: u16) -> bool {
        self.allow_all
            || self.rules.iter().any(|r| {
                r.transport == t
                    && r.ports.contains(port)
                    && matches!(r.host, HostPattern::Cidr(..) | HostPattern::Any)
            })
    }
}

/// One `--allow-bind` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindRule {
    transport: Transport,
    addr: Option<IpAddr>,
    ports: PortRange,
}

impl FromStr for BindRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let usage = "expected [udp:][ADDR:]PORT, e.g. --allow-bind 8080, --allow-bind 0.0.0.0:9000-9010 or --allow-bind udp:5353";
        let (transport, spec) = match s.strip_prefix("udp:") {
            Some(rest) => (Transport::Udp, rest),
            None => (Transport::Tcp, s),
        };
        let (addr, port) = match split_host_port(spec) {
            Some((a, p)) if !a.is_empty() => (
                Some(a.parse::<IpAddr>().map_err(|_| {
                    format!("invalid bind rule '{s}': '{a}' is not an IP address; {usage}")
                })?),
                p,
            ),
            _ => (None, spec),
        };
        let ports = port
            .parse::<PortRange>()
            .map_err(|e| format!("invalid bind rule '{s}': {e}; {usage}"))?;
        Ok(BindRule {
            transport,
            addr,
            ports,
        })
    }
}

/// The server's reverse-bind rules.
#[derive(Debug, Clone, Default)]
pub struct BindRules {
    rules: Vec<BindRule>,
    allow_all: bool,
}

impl BindRules {
    pub fn new(rules: Vec<BindRule>, allow_all: bool) -> BindRules {
        BindRules { rules, allow_all }
    }

    /// Port 0 (any free port) is allowed only by a rule whose ports are `*`.
    pub fn allows(&self, t: Transport, addr: IpAddr, port: u16) -> bool {
        self.allow_all
            || self.rules.iter().any(|r| {
                if r.transport != t {
                    return false;
                }
                let port_ok = if port == 0 {
                    r.ports.is_any()
                } else {
                    r.ports.contains(port)
                };
                let addr_ok = match r.addr {
                    None => addr.is_loopback(),
                    Some(a) => a == addr,
                };
                port_ok && addr_ok
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Transport = Transport::Tcp;

    fn rules(list: &[&str]) -> Rules {
        Rules::new(list.iter().map(|r| r.parse().unwrap()).collect(), false)
    }

    #[test]
    fn deny_by_default() {
        let r = Rules::default();
        assert!(!r.allows_name(T, "example.com", 80));
        assert!(!r.allows_ip(T, "127.0.0.1".parse().unwrap(), 80));
    }

    #[test]
    fn names_suffixes_and_ports() {
        let r = rules(&["files.corp:445", "*.corp:443", "db.corp:5000-5010"]);
        assert!(r.allows_name(T, "files.corp", 445));
        assert!(r.allows_name(T, "FILES.corp.", 445));
        assert!(!r.allows_name(T, "files.corp", 446));
        assert!(r.allows_name(T, "a.b.corp", 443));
        assert!(!r.allows_name(T, "corp", 443));
        assert!(!r.allows_name(T, "evilcorp", 443));
        assert!(r.allows_name(T, "db.corp", 5005));
        assert!(!r.allows_name(T, "db.corp", 5011));
    }

    #[test]
    fn addresses_and_cidrs() {
        let r = rules(&["10.0.0.0/8:*", "[::1]:22", "127.0.0.1:80"]);
        assert!(r.allows_ip(T, "10.200.1.1".parse().unwrap(), 1));
        assert!(!r.allows_ip(T, "11.0.0.1".parse().unwrap(), 1));
        assert!(r.allows_name(T, "::1", 22));
        assert!(!r.allows_name(T, "::1", 23));
        assert!(r.allows_name(T, "127.0.0.1", 80));
        assert!(r.allows_ip(T, "::ffff:10.0.0.1".parse().unwrap(), 9));
        assert!(
            !r.allows_name(T, "localhost", 80),
            "names never match address rules"
        );
        assert!(r.has_address_rules(T, 9));
    }

    #[test]
    fn udp_rules_allow_udp_only() {
        let r = rules(&["udp:dns.corp:53", "udp:10.0.0.0/8:*", "udp:5353"]);
        let u = Transport::Udp;
        assert!(r.allows_name(u, "dns.corp", 53));
        assert!(
            !r.allows_name(T, "dns.corp", 53),
            "a UDP rule allows no TCP"
        );
        assert!(r.allows_ip(u, "10.1.2.3".parse().unwrap(), 9));
        assert!(!r.allows_ip(T, "10.1.2.3".parse().unwrap(), 9));
        assert!(r.has_address_rules(u, 9) && !r.has_address_rules(T, 9));
        // `udp:5353` is the TCP rule for host "udp".
        assert!(r.allows_name(T, "udp", 5353));
        let tcp = rules(&["dns.corp:53"]);
        assert!(
            !tcp.allows_name(u, "dns.corp", 53),
            "a TCP rule allows no UDP"
        );
    }

    #[test]
    fn bad_rules_explain() {
        for bad in ["nohost", "a:b", "[::1:22", "x y:1", "a:5-1", "1.2.3.4/40:1"] {
            let e = bad.parse::<Rule>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn bind_rules() {
        let b = BindRules::new(
            vec![
                "8080".parse().unwrap(),
                "0.0.0.0:9000-9001".parse().unwrap(),
            ],
            false,
        );
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        assert!(b.allows(T, lo, 8080));
        assert!(!b.allows(T, any, 8080), "no address means loopback only");
        assert!(b.allows(T, any, 9001));
        assert!(!b.allows(T, lo, 9001));
        assert!(!b.allows(T, lo, 0));
        assert!(BindRules::new(vec!["*".parse().unwrap()], false).allows(T, lo, 0));
        assert!("nope:1".parse::<BindRule>().is_err());
        let u = BindRules::new(vec!["udp:5353".parse().unwrap()], false);
        assert!(u.allows(Transport::Udp, lo, 5353));
        assert!(
            !u.allows(T, lo, 5353),
            "a UDP bind rule allows no TCP listener"
        );
        assert!(
            !b.allows(Transport::Udp, lo, 8080),
            "a TCP bind rule allows no UDP"
        );
    }
}
