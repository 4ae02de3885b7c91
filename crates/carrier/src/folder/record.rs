//! Records of the folder carrier: how bytes sit in a segment file.
//!
//! ```text
//! kind u8 | 0 u8 ×3 | length u32 | sequence u64 | crc32 u32 | payload (length bytes)
//! ```
//!
//! Little endian; the CRC covers the first 16 bytes and the payload. The
//! sequence counts records from 0 in each direction of one carrier and goes
//! on across segments, so a record from another carrier, an old file or a
//! reordered cache page is refused. A reader that finds too few bytes, or a
//! CRC that does not match, has not failed: the writer (or the share's
//! cache) may simply not be done, so it reads the same offset again later.

/// Bytes in front of every payload.
pub const HEADER: usize = 20;
/// Largest payload of one record: bounds the reader's buffer.
pub const MAX_PAYLOAD: usize = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Carrier bytes.
    Data = 1,
    /// This segment ends here; the next one goes on.
    Next = 2,
    /// The writer closed its half: end of stream.
    End = 3,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Data),
            2 => Some(Kind::Next),
            3 => Some(Kind::End),
            _ => None,
        }
    }
}

/// What the bytes at a reader's offset hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A whole, valid record and the bytes it takes in the file.
    Record {
        kind: Kind,
        seq: u64,
        payload: &'a [u8],
        size: usize,
    },
    /// Not all there yet: read again from the same offset later.
    Incomplete,
    /// All there but the CRC (or the header) is wrong: a torn write still
    /// being completed, a stale cache page — or corruption, if it stays so.
    Bad,
}

/// Writes a record's header for `payload` into `out[..HEADER]`.
pub fn encode_header(kind: Kind, seq: u64, payload: &[u8], out: &mut [u8; HEADER]) {
    out[0] = kind as u8;
    out[1..4].fill(0);
    // MAX_PAYLOAD fits in u32; callers never pass more.
    out[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&out[..16]);
    h.update(payload);
    out[16..20].copy_from_slice(&h.finalize().to_le_bytes());
}

/// A whole record (header and payload) as one buffer.
pub fn encode(kind: Kind, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut hdr = [0u8; HEADER];
    encode_header(kind, seq, payload, &mut hdr);
    let mut v = Vec::with_capacity(HEADER + payload.len());
    v.extend_from_slice(&hdr);
    v.extend_from_slice(payload);
    v
}

/// Parses the record at the start of `buf` (what was read from the file at
/// the reader's offset). Never panics, whatever the bytes.
pub fn parse(buf: &[u8]) -> Parsed<'_> {
    let Some(hdr) = buf.get(..HEADER) else {
        return Parsed::Incomplete;
    };
    let word = |r: std::ops::Range<usize>| -> u64 {
        hdr[r]
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
    };
    let len = word(4..8) as usize;
    let kind = Kind::from_u8(hdr[0]);
    // A length no writer produces cannot be waited for: the header itself
    // is torn or garbage (a zero-filled page reads as kind 0).
    let Some(kind) = kind.filter(|_| len <= MAX_PAYLOAD && hdr[1..4] == [0, 0, 0]) else {
        return Parsed::Bad;
    };
    let Some(payload) = buf.get(HEADER..HEADER + len) else {
        return Parsed::Incomplete;
    };
    let mut h = crc32fast::Hasher::new();
    h.update(&hdr[..16]);
    h.update(payload);
    if h.finalize() as u64 != word(16..20) {
        return Parsed::Bad;
    }
    Parsed::Record {
        kind,
        seq: word(8..16),
        payload,
        size: HEADER + len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_torn_records() {
        let rec = encode(Kind::Data, 7, b"hello");
        match parse(&rec) {
            Parsed::Record {
                kind,
                seq,
                payload,
                size,
            } => {
                assert_eq!(
                    (kind, seq, payload, size),
                    (Kind::Data, 7, &b"hello"[..], 25)
                );
            }
            other => panic!("{other:?}"),
        }
        for cut in 0..rec.len() {
            assert_eq!(parse(&rec[..cut]), Parsed::Incomplete, "cut at {cut}");
        }
        let mut flipped = rec.clone();
        flipped[22] ^= 1;
        assert_eq!(parse(&flipped), Parsed::Bad);
        assert_eq!(parse(&[0u8; 64]), Parsed::Bad);
    }

    proptest! {
        #[test]
        fn any_bytes_parse_without_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse(&b);
        }

        #[test]
        fn records_back_to_back(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..8)) {
            let mut file = Vec::new();
            for (i, p) in payloads.iter().enumerate() {
                file.extend(encode(Kind::Data, i as u64, p));
            }
            let mut at = 0;
            for (i, p) in payloads.iter().enumerate() {
                match parse(&file[at..]) {
                    Parsed::Record { seq, payload, size, .. } => {
                        prop_assert_eq!(seq, i as u64);
                        prop_assert_eq!(payload, &p[..]);
                        at += size;
                    }
                    other => prop_assert!(false, "{:?}", other),
                }
            }
            prop_assert_eq!(at, file.len());
        }
    }
}
