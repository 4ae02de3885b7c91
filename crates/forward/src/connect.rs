//! Connecting to targets, under rules.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use longhaul_proto::frame::parse_dest;
use longhaul_proto::Reason;
use longhaul_session::OpenRefused;
use tokio::net::TcpStream;

use crate::rules::Rules;

/// Time allowed for one target connect (all addresses together).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Parses a stream's destination URL.
pub fn target(dest: &str) -> Result<(String, u16), OpenRefused> {
    parse_dest(dest).ok_or_else(|| {
        OpenRefused::new(
            Reason::ADDRESS_TYPE_NOT_SUPPORTED,
            format!("unsupported destination '{dest}' (expected tcp://host:port)"),
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
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, OpenRefused> {
    let not_allowed = || OpenRefused::new(Reason::NOT_ALLOWED, "not allowed");
    if let Ok(ip) = host.parse::<IpAddr>() {
        return if sets.iter().all(|r| r.allows_ip(ip, port)) {
            Ok(vec![SocketAddr::new(ip, port)])
        } else {
            Err(not_allowed())
        };
    }
    let by_name: Vec<bool> = sets.iter().map(|r| r.allows_name(host, port)).collect();
    if sets
        .iter()
        .zip(&by_name)
        .any(|(r, &named)| !named && !r.has_address_rules())
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
                .all(|(r, &named)| named || r.allows_ip(a.ip(), port))
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

/// Resolves and connects without rules (the client's own `-R` targets).
pub async fn connect_host(host: &str, port: u16) -> Result<TcpStream, OpenRefused> {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
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
    };
    connect_any(&addrs).await
}
