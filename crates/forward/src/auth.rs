//! Who may use a server: authorized keys (each with its own narrower rules),
//! a shared token, or — only with `--insecure` — anyone.
//!
//! After the carrier (and its TLS, if any) is up, a native-mode client
//! sends a short preamble before its hello: `LHA1`, one length byte and the
//! token (empty when it has none). The server reads it, decides, and either
//! goes on to the hello or closes the carrier without a word: nothing about
//! targets or rules is revealed before authentication succeeds.

use std::collections::HashMap;
use std::path::Path;

use longhaul_carrier::keys::secrets_equal;
use longhaul_carrier::Fingerprint;
use longhaul_files::Access;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::rules::{BindRule, BindRules, Rule, Rules};

pub const PREAMBLE_MAGIC: &[u8; 4] = b"LHA1";
/// Longest token the preamble can carry.
pub const MAX_TOKEN: usize = 255;
/// Largest authorized-keys file read (bounds memory on a bad path).
pub const MAX_AUTHORIZED_KEYS_BYTES: u64 = 4 << 20;

/// What one authorized key may do, within the server's global rules.
#[derive(Debug, Clone, Default)]
pub struct KeyPolicy {
    /// `allow=`: targets this key may reach (None: the global rules alone).
    pub allow: Option<Rules>,
    /// `bind=`: reverse binds this key may make (None: the global rules alone).
    pub bind: Option<BindRules>,
    /// `files=ro|rw`: what this key may do in the server's `--files`
    /// folder (None: nothing).
    pub files: Option<Access>,
    /// The comment after `#`, for logs.
    pub comment: String,
}

#[derive(Debug, Clone, Default)]
pub struct AuthorizedKeys {
    keys: HashMap<Fingerprint, KeyPolicy>,
}

impl AuthorizedKeys {
    /// Parses lines of `SHA256:… [allow=RULE,RULE] [bind=RULE,RULE] [files=ro|rw] [# comment]`.
    /// Blank lines and lines starting with `#` are skipped. `origin` names
    /// the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<AuthorizedKeys, String> {
        let mut keys = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let at = || format!("{origin}:{}", i + 1);
            let (line, comment) = match raw.find('#') {
                Some(p) => (&raw[..p], raw[p + 1..].trim()),
                None => (raw, ""),
            };
            let mut words = line.split_whitespace();
            let Some(fp) = words.next() else { continue };
            let fp: Fingerprint = fp.parse().map_err(|e| format!("{}: {e}", at()))?;
            let mut policy = KeyPolicy {
                comment: comment.to_string(),
                ..KeyPolicy::default()
            };
            for w in words {
                if let Some(list) = w.strip_prefix("allow=") {
                    let rules = list
                        .split(',')
                        .map(|r| r.parse::<Rule>())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| format!("{}: {e}", at()))?;
                    policy.allow = Some(Rules::new(rules, false));
                } else if let Some(list) = w.strip_prefix("bind=") {
                    let rules = list
                        .split(',')
                        .map(|r| r.parse::<BindRule>())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| format!("{}: {e}", at()))?;
                    policy.bind = Some(BindRules::new(rules, false));
                } else if let Some(a) = w.strip_prefix("files=") {
                    policy.files = Some(a.parse().map_err(|e| format!("{}: files={e}", at()))?);
                } else {
                    return Err(format!(
                        "{}: unknown option '{w}' (a key line is 'SHA256:… [allow=HOST:PORT,…] [bind=[ADDR:]PORT,…] [files=ro|rw] [# comment]')",
                        at()
                    ));
                }
            }
            if keys.insert(fp, policy).is_some() {
                return Err(format!("{}: key {fp} is listed twice", at()));
            }
        }
        Ok(AuthorizedKeys { keys })
    }

    pub fn load(path: &Path) -> Result<AuthorizedKeys, String> {
        use std::io::Read;
        let f = std::fs::File::open(path)
            .map_err(|e| format!("cannot read authorized keys {}: {e}", path.display()))?;
        let mut text = String::new();
        f.take(MAX_AUTHORIZED_KEYS_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read authorized keys {}: {e}", path.display()))?;
        AuthorizedKeys::parse(&text, &path.display().to_string())
    }

    pub fn get(&self, fp: &Fingerprint) -> Option<&KeyPolicy> {
        self.keys.get(fp)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The server's authentication settings.
#[derive(Debug, Clone, Default)]
pub struct ServerAuth {
    pub authorized_keys: Option<AuthorizedKeys>,
    pub token: Option<String>,
    /// Let in clients with neither key nor token (only when no key list and
    /// no token are configured).
    pub insecure: bool,
}

/// Who a carrier turned out to be.
#[derive(Debug, Clone)]
pub enum Authenticated {
    Key(Fingerprint, KeyPolicy),
    Token,
    Anonymous,
}

impl Authenticated {
    pub fn who(&self) -> String {
        match self {
            Authenticated::Key(fp, p) if p.comment.is_empty() => format!("key {fp}"),
            Authenticated::Key(fp, p) => format!("key {fp} ({})", p.comment),
            Authenticated::Token => "token".into(),
            Authenticated::Anonymous => "anonymous (--insecure)".into(),
        }
    }
}

impl ServerAuth {
    /// True when the server would accept anyone.
    pub fn is_open(&self) -> bool {
        self.authorized_keys.is_none() && self.token.is_none()
    }

    /// Decides from the client's key (if TLS showed one) and preamble token.
    pub fn decide(
        &self,
        key: Option<Fingerprint>,
        token: Option<&[u8]>,
    ) -> Result<Authenticated, String> {
        if let (Some(fp), Some(keys)) = (key, &self.authorized_keys) {
            if let Some(p) = keys.get(&fp) {
                return Ok(Authenticated::Key(fp, p.clone()));
            }
        }
        if let Some(want) = &self.token {
            match token {
                Some(t) if !t.is_empty() && secrets_equal(t, want.as_bytes()) => {
                    return Ok(Authenticated::Token)
                }
                Some(t) if !t.is_empty() => return Err("wrong token".into()),
                _ => {}
            }
        }
        if self.is_open() && self.insecure {
            return Ok(Authenticated::Anonymous);
        }
        Err(match key {
            Some(fp) if self.authorized_keys.is_some() => {
                format!("key {fp} is not in the authorized keys")
            }
            _ => "no authorized key and no token".into(),
        })
    }
}

/// Encodes the client's preamble.
pub fn preamble(token: Option<&str>) -> Result<Vec<u8>, String> {
    let t = token.unwrap_or("").as_bytes();
    if t.len() > MAX_TOKEN {
        return Err(format!("the token is longer than {MAX_TOKEN} bytes"));
    }
    let mut v = PREAMBLE_MAGIC.to_vec();
    v.push(t.len() as u8);
    v.extend_from_slice(t);
    Ok(v)
}

/// Reads the preamble (the caller bounds the time it may take).
pub async fn read_preamble<R: AsyncRead + Unpin>(r: &mut R) -> Result<Vec<u8>, String> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)
        .await
        .map_err(|e| format!("no authentication preamble: {e}"))?;
    if &head[..4] != PREAMBLE_MAGIC {
        return Err("not a longhaul client (bad authentication preamble; a client in --jmux mode, or a version mismatch?)".into());
    }
    let mut t = vec![0u8; head[4] as usize];
    r.read_exact(&mut t)
        .await
        .map_err(|e| format!("truncated authentication preamble: {e}"))?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(b: u8) -> Fingerprint {
        Fingerprint([b; 32])
    }

    #[test]
    fn parses_keys_with_rules_and_comments() {
        let text = format!(
            "# team keys\n\n{} allow=db.corp:5432,*.web:443 bind=8080 # alice laptop\n{}\n",
            fp(1),
            fp(2)
        );
        let k = AuthorizedKeys::parse(&text, "ak").unwrap();
        assert_eq!(k.len(), 2);
        let a = k.get(&fp(1)).unwrap();
        assert_eq!(a.comment, "alice laptop");
        let allow = a.allow.as_ref().unwrap();
        assert!(allow.allows_name(crate::rules::Transport::Tcp, "db.corp", 5432));
        assert!(allow.allows_name(crate::rules::Transport::Tcp, "x.web", 443));
        assert!(!allow.allows_name(crate::rules::Transport::Tcp, "db.corp", 22));
        let bind = a.bind.as_ref().unwrap();
        assert!(bind.allows(
            crate::rules::Transport::Tcp,
            "127.0.0.1".parse().unwrap(),
            8080
        ));
        assert!(!bind.allows(
            crate::rules::Transport::Tcp,
            "127.0.0.1".parse().unwrap(),
            8081
        ));
        assert!(k.get(&fp(2)).unwrap().allow.is_none());
        assert!(k.get(&fp(3)).is_none());
    }

    #[test]
    fn bad_lines_name_file_and_line() {
        for (text, want) in [
            ("SHA256:nope\n", "ak:1"),
            (&format!("\n{} color=red\n", fp(1)), "ak:2: unknown option"),
            (&format!("{} allow=db:x\n", fp(1)), "ak:1: invalid rule"),
            (&format!("{}\n{}\n", fp(1), fp(1)), "listed twice"),
        ] {
            let e = AuthorizedKeys::parse(text, "ak").unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn decisions() {
        let keys = AuthorizedKeys::parse(&format!("{}\n", fp(1)), "ak").unwrap();
        let auth = ServerAuth {
            authorized_keys: Some(keys),
            token: Some("s3cret".into()),
            insecure: false,
        };
        assert!(matches!(
            auth.decide(Some(fp(1)), Some(b"")),
            Ok(Authenticated::Key(..))
        ));
        assert!(matches!(
            auth.decide(Some(fp(9)), Some(b"s3cret")),
            Ok(Authenticated::Token)
        ));
        assert!(auth.decide(None, Some(b"wrong")).is_err());
        let e = auth.decide(Some(fp(9)), Some(b"")).unwrap_err();
        assert!(e.contains("not in the authorized keys"), "{e}");
        // --insecure opens the door only when nothing else is configured.
        let open = ServerAuth {
            insecure: true,
            ..ServerAuth::default()
        };
        assert!(matches!(
            open.decide(None, Some(b"")),
            Ok(Authenticated::Anonymous)
        ));
        let both = ServerAuth {
            insecure: true,
            token: Some("t".into()),
            ..ServerAuth::default()
        };
        assert!(both.decide(None, Some(b"")).is_err());
    }

    #[test]
    fn preamble_round_trip() {
        let p = preamble(Some("tok")).unwrap();
        let got = futures_lite_block(read_preamble(&mut &p[..]));
        assert_eq!(got.unwrap(), b"tok");
        assert!(futures_lite_block(read_preamble(&mut &b"GET / HTTP/1.1"[..])).is_err());
        assert!(futures_lite_block(read_preamble(&mut &b"LHA1\x05ab"[..])).is_err());
        assert!(preamble(Some(&"x".repeat(300))).is_err());
    }

    fn futures_lite_block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }
}
