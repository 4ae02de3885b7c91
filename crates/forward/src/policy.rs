//! What a reload (SIGHUP) can change while sessions run: who may come in
//! (authorized keys, token) and what they may reach or bind. Sessions read
//! the current policy at every stream they open; a reload also ends the
//! sessions it no longer admits.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use longhaul_carrier::Fingerprint;
use longhaul_files::Access;
use longhaul_proto::frame::parse_target;

use crate::auth::{Authenticated, ServerAuth};
use crate::rules::{BindRules, Rules, Transport};

#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub auth: ServerAuth,
    /// Global ceiling: what any client may reach.
    pub rules: Rules,
    /// Global ceiling: what any client may bind.
    pub bind_rules: BindRules,
    /// File access of token (and `--insecure`) clients.
    pub files_without_key: Option<Access>,
}

/// Who a session was admitted as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    Key(Fingerprint),
    Token,
    Anonymous,
    /// The `--stdio` pipe: its owner authenticated the peer.
    Pipe,
}

impl From<&Authenticated> for Who {
    fn from(a: &Authenticated) -> Who {
        match a {
            Authenticated::Key(fp, _) => Who::Key(*fp),
            Authenticated::Token => Who::Token,
            Authenticated::Anonymous => Who::Anonymous,
        }
    }
}

/// What one client may do now.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// The key's own `allow=` (None: the global rules alone).
    pub allow: Option<Rules>,
    pub bind: Option<BindRules>,
    pub files: Option<Access>,
}

impl Policy {
    /// What `who` may do under this policy; None if it is no longer let in.
    pub fn grants(&self, who: &Who) -> Option<Grants> {
        match who {
            Who::Key(fp) => {
                let p = self.auth.authorized_keys.as_ref()?.get(fp)?;
                Some(Grants {
                    allow: p.allow.clone(),
                    bind: p.bind.clone(),
                    files: p.files,
                })
            }
            Who::Token => self.auth.token.as_ref().map(|_| Grants {
                files: self.files_without_key,
                ..Grants::default()
            }),
            Who::Anonymous => (self.auth.is_open() && self.auth.insecure).then(|| Grants {
                files: self.files_without_key,
                ..Grants::default()
            }),
            Who::Pipe => Some(Grants {
                files: self.files_without_key,
                ..Grants::default()
            }),
        }
    }

    /// Why a running session of `who` must end after a change from `old`
    /// to this policy: its identity no longer let in, or (holding a file
    /// stream, `files`) its file access narrowed. Streams the rules no
    /// longer allow are [`Policy::refuses`]'s, one by one.
    pub fn ends(&self, old: &Policy, who: &Who, files: bool) -> Option<String> {
        let Some(g) = self.grants(who) else {
            return Some(match who {
                Who::Key(fp) => format!("key {fp} is no longer authorized"),
                Who::Token => "the token was removed".into(),
                Who::Anonymous | Who::Pipe => "anonymous clients are no longer let in".into(),
            });
        };
        if *who == Who::Token && old.auth.token != self.auth.token {
            return Some("the token changed".into());
        }
        // A file stream keeps the access it was opened with: narrowed
        // access ends the session that holds one.
        if files {
            let before = old.grants(who).and_then(|g| g.files);
            let narrowed = matches!(
                (before, g.files),
                (_, None) | (Some(Access::ReadWrite), Some(Access::ReadOnly))
            );
            if narrowed {
                return Some("its file access was narrowed or removed".into());
            }
        }
        None
    }

    /// Whether this policy refuses a stream of `who` to `dest` that is
    /// open now, connected to `connected` (a name allowed only through an
    /// address rule is judged by the address it is connected to; no DNS
    /// on reload).
    pub fn refuses(&self, who: &Who, dest: &str, connected: Option<IpAddr>) -> bool {
        let Some(g) = self.grants(who) else {
            return true;
        };
        let Some((t, host, port)) = parse_target(dest) else {
            return false;
        };
        let sets: Vec<&Rules> = std::iter::once(&self.rules)
            .chain(g.allow.as_ref())
            .collect();
        let allowed = match host.parse::<IpAddr>() {
            Ok(ip) => sets.iter().all(|r| r.allows_ip(t, ip, port)),
            Err(_) => sets.iter().all(|r| {
                r.allows_name(t, &host, port)
                    || match connected {
                        Some(ip) => r.allows_ip(t, ip, port),
                        None => r.has_address_rules(t, port),
                    }
            }),
        };
        !allowed
    }
}

impl Policy {
    /// Whether `who` may listen on `addr` (a reverse forward, TCP or UDP)
    /// under this policy: the global `--allow-bind` rules and the key's
    /// own `bind=`.
    pub fn allows_bind(&self, who: &Who, t: Transport, addr: SocketAddr) -> bool {
        let Some(g) = self.grants(who) else {
            return false;
        };
        g.bind
            .as_ref()
            .is_none_or(|r| r.allows(t, addr.ip(), addr.port()))
            && self.bind_rules.allows(t, addr.ip(), addr.port())
    }
}

/// The policy in force, shared by the server's sessions; those that hold
/// something granted once (a reverse listener) watch it for changes.
#[derive(Debug, Clone)]
pub struct PolicyCell(Arc<tokio::sync::watch::Sender<Arc<Policy>>>);

impl Default for PolicyCell {
    fn default() -> PolicyCell {
        PolicyCell::new(Policy::default())
    }
}

impl PolicyCell {
    pub fn new(p: Policy) -> PolicyCell {
        PolicyCell(Arc::new(tokio::sync::watch::Sender::new(Arc::new(p))))
    }

    pub fn current(&self) -> Arc<Policy> {
        self.0.borrow().clone()
    }

    /// Puts `p` in force; returns the one it replaces.
    pub fn replace(&self, p: Policy) -> Arc<Policy> {
        self.0.send_replace(Arc::new(p))
    }

    /// Changes from now on.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<Arc<Policy>> {
        self.0.subscribe()
    }
}
