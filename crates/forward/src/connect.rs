//! Connecting to targets, under rules.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use longhaul_proto::frame::parse_target;
use longhaul_proto::Reason;
use longhaul_session::OpenRefused;
use tokio::net::{TcpStream, UdpSocket};

use crate::rules::{Rules, Transport};

/// Time allowed for one target connect (all addresses together).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Parses a stream's destination URL.
pub fn target(dest: &str) -> Result<(Transport, String, u16), OpenRefused> {
    parse_target(dest).ok_or_else(|| {
        OpenRefused::new(
            Reason::ADDRESS_TYPE_NOT_SUPPORTED,
            format!(
                "unsupported destination '{dest}' (expected tcp://host:port or udp://host:port)"
            ),
        )
    })
}

/// Resolves `host:port` to the addresses that every rule set in `sets`
/// allows (the server's global rules, then a key's own, narrower ones). A
/// name allowed by a name rule may go to any of its addresses; otherwise
/// only the resolved addresses that an IP/CIDR rule admits are used.
/// Nothing is resolved when some set could not admit the target, so refused
/// names cause no DNS traffic.
pub async fn allowed_addrs(
    sets: &[&Rules],
    t: Transport,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, OpenRefused> {
    // Says what would allow it (it tells nothing of the rules in force).
    let not_allowed = || {
        let prefix = if t == Transport::Udp { "udp:" } else { "" };
        let target = crate::spec::join_host_port(host, port);
        OpenRefused::new(
            Reason::NOT_ALLOWED,
            format!("the server's rules do not allow {prefix}{target}: it needs --allow {prefix}{target} (or allow= for this key in its authorized_keys)"),
        )
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return if sets.iter().all(|r| r.allows_ip(t, ip, port)) {
            Ok(vec![SocketAddr::new(ip, port)])
        } else {
            Err(not_allowed())
        };
    }
    let by_name: Vec<bool> = sets.iter().map(|r| r.allows_name(t, host, port)).collect();
    if sets
        .iter()
        .zip(&by_name)
        .any(|(r, &named)| !named && !r.has_address_rules(t, port))
    {
        return Err(not_allowed());
    }
    let resolved: Vec<SocketAddr> =
        tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| {
                OpenRefused::new(Reason::TTL_EXPIRED, format!("resolving {host} timed out"))
            })?
            .map_err(|e| {
                OpenRefused::new(
                    Reason::HOST_UNREACHABLE,
                    format!("cannot resolve {host}: {e}"),
                )
            })?
            .collect();
    let ok: Vec<SocketAddr> = resolved
        .into_iter()
        .filter(|a| {
            sets.iter()
                .zip(&by_name)
                .all(|(r, &named)| named || r.allows_ip(t, a.ip(), port))
        })
        .collect();
    if ok.is_empty() {
        return Err(not_allowed());
    }
    Ok(ok)
}

/// Connects to the first address that answers.
pub async fn connect_any(addrs: &[SocketAddr]) -> Result<TcpStream, OpenRefused> {
    let attempt = async {
        let mut last = None;
        for a in addrs {
            match TcpStream::connect(a).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::ErrorKind::NotFound.into()))
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, attempt).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(OpenRefused::new(Reason::from_io(e.kind()), e.to_string())),
        Err(_) => Err(OpenRefused::new(Reason::TTL_EXPIRED, "connect timed out")),
    }
}

/// A UDP socket `connect`ed to the first of `addrs` (so only its answers
/// come back), bound to the unspecified address of its family.
pub async fn connect_udp(addrs: &[SocketAddr]) -> Result<UdpSocket, OpenRefused> {
    let failed = |e: std::io::Error| OpenRefused::new(Reason::from_io(e.kind()), e.to_string());
    let to = *addrs
        .first()
        .ok_or_else(|| failed(std::io::ErrorKind::NotFound.into()))?;
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(any).await.map_err(failed)?;
    sock.connect(to).await.map_err(failed)?;
    Ok(sock)
}

/// Resolves a host without rules (the client's own `-R` targets).
pub async fn resolve_host(host: &str, port: u16) -> Result<Vec<SocketAddr>, OpenRefused> {
    Ok(match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| {
                OpenRefused::new(
                    Reason::HOST_UNREACHABLE,
                    format!("cannot resolve {host}: {e}"),
                )
            })?
            .collect(),
    })
}

/// Resolves and connects without rules (the client's own `-R` targets).
pub async fn connect_host(host: &str, port: u16) -> Result<TcpStream, OpenRefused> {
    connect_any(&resolve_host(host, port).await?).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_no_rule_can_admit_is_not_resolved() {
        // An address rule for another port: a lookup could not help.
        let rules = Rules::new(vec!["10.0.0.0/8:22".parse().unwrap()], false);
        let e = allowed_addrs(&[&rules], Transport::Tcp, "lh-never-looked-up.invalid", 80)
            .await
            .unwrap_err();
        assert_eq!(e.reason, Reason::NOT_ALLOWED, "{}", e.description);
        // IPv4 spelled as IPv6 is matched as the IPv4 address it carries.
        for spelled in ["::ffff:10.1.2.3", "64:ff9b::a01:203", "::10.1.2.3"] {
            let ok = allowed_addrs(&[&rules], Transport::Tcp, spelled, 22).await;
            assert!(ok.is_ok(), "{spelled}");
        }
        let v6 = Rules::new(vec!["[64:ff9b::/96]:22".parse().unwrap()], false);
        assert!(
            allowed_addrs(&[&v6], Transport::Tcp, "64:ff9b::a01:203", 22)
                .await
                .is_err()
        );
    }
}
