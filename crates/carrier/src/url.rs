//! Carrier addresses: what the client dials and what the server listens on.
//!
//! | URL                    | transport              | longhaul TLS (pinned keys)      |
//! |------------------------|------------------------|---------------------------------|
//! | `HOST:PORT`, `tls://`  | TCP                    | yes                             |
//! | `tcp://HOST:PORT`      | TCP                    | no (needs `--insecure`)         |
//! | `quic://HOST:PORT`     | QUIC over UDP          | yes (QUIC's own TLS 1.3)        |
//! | `ws://HOST:PORT/PATH`  | WebSocket over TCP     | inside the WebSocket, end to end (off with `--insecure`) |
//! | `wss://HOST:PORT/PATH` | WebSocket inside TLS   | yes (the outer TLS)             |
//! | `cmd://COMMAND`        | a command's stdin/stdout | no: the command's channel (ssh) authenticates |
//! | `dir://PATH`           | files in a shared directory | yes, through the files (off with `--insecure`) |
//!
//! `ws://` keeps TLS inside the WebSocket so that a reverse proxy in the
//! middle forwards only ciphertext and cannot impersonate the server.

use std::fmt;
use std::net::SocketAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Tls,
    /// QUIC over UDP; its TLS is always on (see [`crate::quic`]).
    Quic,
    Ws {
        path: String,
    },
    Wss {
        path: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarrierUrl {
    /// A network carrier to `addr` (`host:port`).
    Net { transport: Transport, addr: String },
    /// Run `sh -c COMMAND`; its stdin/stdout are the carrier.
    Cmd { command: String },
    /// Files in a shared directory (the folder carrier).
    Dir(crate::folder::FolderUrl),
}

impl CarrierUrl {
    /// Whether it is a `quic://` URL.
    pub fn is_quic(&self) -> bool {
        matches!(
            self,
            CarrierUrl::Net {
                transport: Transport::Quic,
                ..
            }
        )
    }
}

impl Transport {
    /// Whether TLS with pinned keys runs over this transport by default.
    pub fn encrypted_by_default(&self) -> bool {
        !matches!(self, Transport::Tcp)
    }
    fn scheme(&self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Quic => "quic",
            Transport::Ws { .. } => "ws",
            Transport::Wss { .. } => "wss",
        }
    }
}

const USAGE: &str = "use HOST:PORT, tls://HOST:PORT, tcp://HOST:PORT, quic://HOST:PORT, ws://HOST:PORT/PATH, wss://HOST:PORT/PATH, cmd://COMMAND or dir://PATH";

fn split_scheme(s: &str) -> (Option<&str>, &str) {
    match s.find("://") {
        Some(i) => (Some(&s[..i]), &s[i + 3..]),
        None => (None, s),
    }
}

fn host_port_path(rest: &str, what: &str) -> Result<(String, String), String> {
    let (hp, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let ok = hp
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
    if !ok {
        return Err(format!("'{what}' needs HOST:PORT ({USAGE})"));
    }
    Ok((hp.to_string(), path.to_string()))
}

impl std::str::FromStr for CarrierUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<CarrierUrl, String> {
        let (scheme, rest) = split_scheme(s.trim());
        let transport = match scheme {
            Some("cmd") => {
                if rest.trim().is_empty() {
                    return Err(format!("'{s}' has no command ({USAGE})"));
                }
                return Ok(CarrierUrl::Cmd {
                    command: rest.to_string(),
                });
            }
            Some("dir") => return Ok(CarrierUrl::Dir(s.trim().parse()?)),
            None | Some("tls") => Transport::Tls,
            Some("tcp") => Transport::Tcp,
            Some("quic") => Transport::Quic,
            Some("ws") | Some("wss") => {
                let (addr, path) = host_port_path(rest, s)?;
                let t = if scheme == Some("ws") {
                    Transport::Ws { path }
                } else {
                    Transport::Wss { path }
                };
                return Ok(CarrierUrl::Net { transport: t, addr });
            }
            Some(other) => return Err(format!("unknown carrier scheme '{other}://' ({USAGE})")),
        };
        let (addr, path) = host_port_path(rest, s)?;
        if path != "/" {
            return Err(format!("'{s}': only ws:// and wss:// take a path"));
        }
        Ok(CarrierUrl::Net { transport, addr })
    }
}

impl fmt::Display for CarrierUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CarrierUrl::Cmd { command } => write!(f, "cmd://{command}"),
            CarrierUrl::Dir(d) => d.fmt(f),
            CarrierUrl::Net { transport, addr } => match transport {
                Transport::Ws { path } | Transport::Wss { path } => {
                    write!(f, "{}://{addr}{path}", transport.scheme())
                }
                t => write!(f, "{}://{addr}", t.scheme()),
            },
        }
    }
}

/// A server listener: a transport on a local socket address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenUrl {
    pub transport: Transport,
    pub addr: SocketAddr,
}

impl std::str::FromStr for ListenUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<ListenUrl, String> {
        // `:7000` means every interface, as before.
        let fixed;
        let s2 = if let Some(p) = s.strip_prefix(':') {
            fixed = format!("0.0.0.0:{p}");
            fixed.as_str()
        } else {
            s
        };
        match s2.parse::<CarrierUrl>()? {
            CarrierUrl::Cmd { .. } => Err(
                "a server cannot listen on cmd://; use 'longhaul server --stdio' as the command instead"
                    .to_string(),
            ),
            // The CLI takes dir:// apart before it gets here.
            CarrierUrl::Dir(_) => Err(format!("'{s}' is a folder, not a network listener")),
            CarrierUrl::Net { transport, addr } => {
                let addr = addr.parse().map_err(|_| {
                    format!("'{s}': listen on an IP:PORT, e.g. tls://0.0.0.0:7000 or ws://127.0.0.1:8080/longhaul")
                })?;
                Ok(ListenUrl { transport, addr })
            }
        }
    }
}

impl fmt::Display for ListenUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        CarrierUrl::Net {
            transport: self.transport.clone(),
            addr: self.addr.to_string(),
        }
        .fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme() {
        let u: CarrierUrl = "far.example:7000".parse().unwrap();
        assert_eq!(
            u,
            CarrierUrl::Net {
                transport: Transport::Tls,
                addr: "far.example:7000".into()
            }
        );
        let u: CarrierUrl = "ws://127.0.0.1:80/lh/x".parse().unwrap();
        assert_eq!(u.to_string(), "ws://127.0.0.1:80/lh/x");
        let u: CarrierUrl = "wss://h:443".parse().unwrap();
        assert_eq!(u.to_string(), "wss://h:443/");
        let u: CarrierUrl = "cmd://ssh far longhaul server --stdio".parse().unwrap();
        assert_eq!(
            u,
            CarrierUrl::Cmd {
                command: "ssh far longhaul server --stdio".into()
            }
        );
        assert_eq!(
            "tcp://[::1]:7".parse::<CarrierUrl>().unwrap().to_string(),
            "tcp://[::1]:7"
        );
        let l: ListenUrl = "quic://0.0.0.0:7000".parse().unwrap();
        assert_eq!(
            (l.transport.clone(), l.to_string()),
            (Transport::Quic, "quic://0.0.0.0:7000".into())
        );
    }

    #[test]
    fn rejects_with_a_hint() {
        for bad in [
            "http://h:1",
            "h",
            "tls://h:port",
            "cmd://",
            "tcp://h:1/x",
            "",
        ] {
            let e = bad.parse::<CarrierUrl>().unwrap_err();
            assert!(e.contains("://") || e.contains("path"), "{bad}: {e}");
        }
        assert!("cmd://x".parse::<ListenUrl>().is_err());
        assert!("tls://name:1".parse::<ListenUrl>().is_err());
        let l: ListenUrl = ":7000".parse().unwrap();
        assert_eq!(l.to_string(), "tls://0.0.0.0:7000");
    }
}
