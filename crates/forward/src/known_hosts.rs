//! Trust on first use: `HOST:PORT SHA256:…` lines remembering each server's
//! key, as ssh's known_hosts does. A server whose key later differs is
//! refused loudly; the user removes the line if the change was expected.

use std::io::Write;
use std::path::{Path, PathBuf};

use longhaul_carrier::Fingerprint;

/// Largest known-hosts file read.
pub const MAX_KNOWN_HOSTS_BYTES: u64 = 4 << 20;

#[derive(Debug, Clone)]
pub struct KnownHosts {
    path: PathBuf,
}

/// What the file says about one server.
#[derive(Debug, PartialEq, Eq)]
pub enum Known {
    Unknown,
    /// Its key and the file's line number.
    Key(Fingerprint, usize),
}

impl KnownHosts {
    pub fn new(path: impl Into<PathBuf>) -> KnownHosts {
        KnownHosts { path: path.into() }
    }

    /// `$HOME/.config/longhaul/known_hosts`.
    pub fn default_path() -> Option<PathBuf> {
        std::env::var_os("HOME").map(|h| Path::new(&h).join(".config/longhaul/known_hosts"))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn lookup(&self, host: &str) -> Result<Known, String> {
        use std::io::Read;
        let f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Known::Unknown),
            Err(e) => return Err(format!("cannot read {}: {e}", self.path.display())),
        };
        let mut text = String::new();
        f.take(MAX_KNOWN_HOSTS_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read {}: {e}", self.path.display()))?;
        for (i, line) in text.lines().enumerate() {
            let mut w = line.split_whitespace();
            let (Some(h), Some(fp)) = (w.next(), w.next()) else {
                continue;
            };
            if h == host {
                let fp = fp
                    .parse()
                    .map_err(|e| format!("{}:{}: {e}", self.path.display(), i + 1))?;
                return Ok(Known::Key(fp, i + 1));
            }
        }
        Ok(Known::Unknown)
    }

    pub fn remember(&self, host: &str, fp: Fingerprint) -> Result<(), String> {
        let err = |e: std::io::Error| format!("cannot write {}: {e}", self.path.display());
        // A line is HOST and key split on whitespace: a host with any would
        // never be found again (every connection a first use).
        if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "cannot remember '{}' in {}: not a host name",
                host.escape_debug(),
                self.path.display()
            ));
        }
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(err)?;
        writeln!(f, "{host} {fp}").map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_and_finds() {
        let path = std::env::temp_dir().join(format!("lh-kh-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let kh = KnownHosts::new(&path);
        assert_eq!(kh.lookup("a:1").unwrap(), Known::Unknown);
        kh.remember("a:1", Fingerprint([1; 32])).unwrap();
        kh.remember("b:2", Fingerprint([2; 32])).unwrap();
        assert_eq!(
            kh.lookup("b:2").unwrap(),
            Known::Key(Fingerprint([2; 32]), 2)
        );
        assert_eq!(
            kh.lookup("a:1").unwrap(),
            Known::Key(Fingerprint([1; 32]), 1)
        );
        std::fs::write(&path, "a:1 SHA256:broken\n").unwrap();
        assert!(kh.lookup("a:1").unwrap_err().contains(":1:"));
        let _ = std::fs::remove_file(&path);
    }
}
