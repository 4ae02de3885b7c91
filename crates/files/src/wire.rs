//! The file service's messages, and a reader that checks every length.
//!
//! One stream carries requests one after another. A request is `LHF1`, an
//! operation byte, a path (u16 length, relative to the served folder,
//! `/`-separated) and the operation's fields; the reply starts with a
//! status byte (0 ok, 1 error followed by a message). File contents travel
//! in blocks (`u32` length, at most [`MAX_BLOCK`]; 0 ends them) followed by
//! a trailer (0 and the BLAKE3 hash of the whole file, or 1 and an error), so a
//! sender that fails half-way can still say why. Integers are big-endian.
//!
//! A listing is a stream too: after the ok status, items one after another
//! (an entry, the end, or an error), so neither side holds a whole tree to
//! send it. The first listing format (operation 4: a count, then every
//! entry) made the server build the whole list first; a server now refuses
//! it with a message, and an older server ends a stream that asks for the
//! new one (operation 6).

use std::io::{self, Read, Write};

pub const MAGIC: &[u8; 4] = b"LHF1";
/// Longest path in a request or a listing entry.
pub const MAX_PATH: usize = 4096;
/// Longest error message.
pub const MAX_MESSAGE: usize = 1024;
/// Largest data block; the receiver's buffer is at most this.
pub const MAX_BLOCK: usize = 1 << 20;
/// Most entries one listing may have (a tree larger than this is copied
/// in parts).
pub const MAX_LIST_ENTRIES: u32 = 200_000;
/// Most bytes of paths one listing may carry: what a client holds for the
/// copy it plans (the server holds none of it).
pub const MAX_LIST_BYTES: u64 = 32 << 20;

pub type Hash = [u8; 32];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// What is at the path: nothing, a file (and its size) or a folder.
    Stat { path: Vec<u8> },
    /// The file, from byte `have` if the first `have` bytes hash to
    /// `have_hash` (the receiver's partial copy), else from the start.
    Get {
        path: Vec<u8>,
        have: u64,
        have_hash: Hash,
    },
    /// Stores a file of `size` bytes at `path` — or, when `path` is a
    /// folder and `into` is not empty, in it under the name `into` (scp's
    /// rule, without a round trip to ask first).
    Put {
        path: Vec<u8>,
        size: u64,
        mode: u32,
        into: Vec<u8>,
    },
    /// Every file and folder under the path, as a stream of [`ListItem`]s.
    List { path: Vec<u8> },
    /// The first listing format (a count first): refused.
    ListCounted { path: Vec<u8> },
    /// Makes a folder (and its parents).
    Mkdir { path: Vec<u8> },
}

const OP_STAT: u8 = 1;
const OP_GET: u8 = 2;
const OP_PUT: u8 = 3;
const OP_LIST: u8 = 4;
const OP_MKDIR: u8 = 5;
const OP_LIST_STREAM: u8 = 6;

impl Request {
    pub fn path(&self) -> &[u8] {
        match self {
            Request::Stat { path }
            | Request::Get { path, .. }
            | Request::Put { path, .. }
            | Request::List { path }
            | Request::ListCounted { path }
            | Request::Mkdir { path } => path,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        let op = match self {
            Request::Stat { .. } => OP_STAT,
            Request::Get { .. } => OP_GET,
            Request::Put { .. } => OP_PUT,
            Request::List { .. } => OP_LIST_STREAM,
            Request::ListCounted { .. } => OP_LIST,
            Request::Mkdir { .. } => OP_MKDIR,
        };
        b.push(op);
        put_bytes(&mut b, self.path());
        match self {
            Request::Get {
                have, have_hash, ..
            } => {
                b.extend_from_slice(&have.to_be_bytes());
                b.extend_from_slice(have_hash);
            }
            Request::Put {
                size, mode, into, ..
            } => {
                b.extend_from_slice(&size.to_be_bytes());
                b.extend_from_slice(&mode.to_be_bytes());
                put_bytes(&mut b, into);
            }
            _ => {}
        }
        b
    }

    /// Reads one request; `Ok(None)` when the stream ends cleanly before it.
    pub fn read(r: &mut impl Read) -> Result<Option<Request>, WireError> {
        let mut magic = [0u8; 4];
        match r.read(&mut magic[..1])? {
            0 => return Ok(None),
            _ => r.read_exact(&mut magic[1..])?,
        }
        if &magic != MAGIC {
            return Err(WireError::Bad("not a file-service request"));
        }
        let op = read_u8(r)?;
        let path = read_bytes(r, MAX_PATH)?;
        Ok(Some(match op {
            OP_STAT => Request::Stat { path },
            OP_GET => Request::Get {
                path,
                have: read_u64(r)?,
                have_hash: read_hash(r)?,
            },
            OP_PUT => Request::Put {
                path,
                size: read_u64(r)?,
                mode: read_u32(r)?,
                into: read_bytes(r, MAX_PATH)?,
            },
            OP_LIST_STREAM => Request::List { path },
            OP_LIST => Request::ListCounted { path },
            OP_MKDIR => Request::Mkdir { path },
            _ => return Err(WireError::Bad("unknown operation")),
        }))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("protocol error: {0}")]
    Bad(&'static str),
}

/// What a STAT found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Missing,
    File,
    Dir,
}

impl Kind {
    pub fn to_byte(self) -> u8 {
        match self {
            Kind::Missing => 0,
            Kind::File => 1,
            Kind::Dir => 2,
        }
    }
    pub fn from_byte(b: u8) -> Result<Kind, WireError> {
        match b {
            0 => Ok(Kind::Missing),
            1 => Ok(Kind::File),
            2 => Ok(Kind::Dir),
            _ => Err(WireError::Bad("unknown kind")),
        }
    }
}

/// One entry of a listing: a path below the listed folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub size: u64,
    pub path: Vec<u8>,
}

/// Writes an ok status.
pub fn write_ok(w: &mut impl Write) -> io::Result<()> {
    w.write_all(&[0])
}

/// Writes an error status and its message (cut to [`MAX_MESSAGE`]).
pub fn write_err(w: &mut impl Write, msg: &str) -> io::Result<()> {
    let mut b = vec![1];
    put_bytes(&mut b, truncate(msg.as_bytes(), MAX_MESSAGE));
    w.write_all(&b)
}

/// Reads a status: `Ok(Ok(()))`, or the peer's error message.
pub fn read_status(r: &mut impl Read) -> Result<Result<(), String>, WireError> {
    match read_u8(r)? {
        0 => Ok(Ok(())),
        1 => Ok(Err(
            String::from_utf8_lossy(&read_bytes(r, MAX_MESSAGE)?).into_owned()
        )),
        _ => Err(WireError::Bad("bad status byte")),
    }
}

pub fn write_entry(b: &mut Vec<u8>, e: &Entry) {
    b.push(e.kind.to_byte());
    b.extend_from_slice(&e.size.to_be_bytes());
    put_bytes(b, &e.path);
}

pub fn read_entry(r: &mut impl Read) -> Result<Entry, WireError> {
    Ok(Entry {
        kind: Kind::from_byte(read_u8(r)?)?,
        size: read_u64(r)?,
        path: read_bytes(r, MAX_PATH)?,
    })
}

/// One item of a streamed listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListItem {
    Entry(Entry),
    /// The listing is complete.
    End,
    /// The listing stopped here, for this reason (nothing after it).
    Failed(String),
}

const ITEM_END: u8 = 0;
const ITEM_ENTRY: u8 = 1;
const ITEM_FAILED: u8 = 2;

pub fn write_item(b: &mut Vec<u8>, item: &ListItem) {
    match item {
        ListItem::Entry(e) => {
            b.push(ITEM_ENTRY);
            write_entry(b, e);
        }
        ListItem::End => b.push(ITEM_END),
        ListItem::Failed(msg) => {
            b.push(ITEM_FAILED);
            put_bytes(b, truncate(msg.as_bytes(), MAX_MESSAGE));
        }
    }
}

pub fn read_item(r: &mut impl Read) -> Result<ListItem, WireError> {
    Ok(match read_u8(r)? {
        ITEM_END => ListItem::End,
        ITEM_ENTRY => ListItem::Entry(read_entry(r)?),
        ITEM_FAILED => {
            ListItem::Failed(String::from_utf8_lossy(&read_bytes(r, MAX_MESSAGE)?).into_owned())
        }
        _ => return Err(WireError::Bad("unknown listing item")),
    })
}

fn truncate(b: &[u8], max: usize) -> &[u8] {
    &b[..b.len().min(max)]
}

/// A u16 length and the bytes (cut to 65535).
pub fn put_bytes(b: &mut Vec<u8>, s: &[u8]) {
    let s = truncate(s, u16::MAX as usize);
    b.extend_from_slice(&(s.len() as u16).to_be_bytes());
    b.extend_from_slice(s);
}

pub fn read_bytes(r: &mut impl Read, max: usize) -> Result<Vec<u8>, WireError> {
    let n = read_u16(r)? as usize;
    if n > max {
        return Err(WireError::Bad("string too long"));
    }
    let mut v = vec![0; n];
    r.read_exact(&mut v)?;
    Ok(v)
}

pub fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

pub fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

pub fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

pub fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

pub fn read_hash(r: &mut impl Read) -> io::Result<Hash> {
    let mut b = [0; 32];
    r.read_exact(&mut b)?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_round_trip() {
        let all = [
            Request::Stat {
                path: b"a/b".to_vec(),
            },
            Request::Get {
                path: b"f".to_vec(),
                have: 7,
                have_hash: [3; 32],
            },
            Request::Put {
                path: b"x/y".to_vec(),
                size: 1 << 40,
                mode: 0o755,
                into: b"f.iso".to_vec(),
            },
            Request::List { path: vec![] },
            Request::ListCounted {
                path: b"x".to_vec(),
            },
            Request::Mkdir {
                path: b"d".to_vec(),
            },
        ];
        for r in all {
            let b = r.encode();
            assert_eq!(Request::read(&mut &b[..]).unwrap(), Some(r));
        }
        assert_eq!(Request::read(&mut &b""[..]).unwrap(), None);
    }

    #[test]
    fn status_and_entries_round_trip() {
        let mut b = vec![];
        write_err(&mut b, &"x".repeat(5000)).unwrap();
        assert_eq!(
            read_status(&mut &b[..]).unwrap().unwrap_err().len(),
            MAX_MESSAGE
        );
        let e = Entry {
            kind: Kind::Dir,
            size: 9,
            path: b"p/q".to_vec(),
        };
        let mut b = vec![];
        write_entry(&mut b, &e);
        assert_eq!(read_entry(&mut &b[..]).unwrap(), e);
        let items = [
            ListItem::Entry(e),
            ListItem::Failed("too deep".into()),
            ListItem::End,
        ];
        let mut b = vec![];
        for i in &items {
            write_item(&mut b, i);
        }
        let mut r = &b[..];
        for i in items {
            assert_eq!(read_item(&mut r).unwrap(), i);
        }
        assert!(r.is_empty());
    }

    proptest! {
        /// Any bytes: an error or a request, never a panic or a huge allocation.
        #[test]
        fn reading_garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Request::read(&mut &b[..]);
            let _ = read_status(&mut &b[..]);
            let _ = read_entry(&mut &b[..]);
            let _ = read_item(&mut &b[..]);
        }

        #[test]
        fn any_prefix_of_a_request_is_an_error(cut in 1usize..40) {
            let b = Request::Put { path: b"some/path".to_vec(), size: 1, mode: 0, into: vec![] }.encode();
            let cut = cut.min(b.len() - 1);
            prop_assert!(Request::read(&mut &b[..cut]).is_err());
        }
    }
}
