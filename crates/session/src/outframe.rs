//! A frame waiting for the carrier: an optional inline header plus a body.
//!
//! DATA frames keep their 8-byte header inline and their payload as a slice
//! of the buffer the uplink read into, so one large socket read becomes
//! several frames without copying; control frames are fully encoded in
//! `body`. The writer sends header and body as separate iovecs.

use bytes::{Buf, Bytes};
use longhaul_proto::drr::HasLen;
use longhaul_proto::frame::DATA_HEADER_LEN;

pub(crate) struct OutFrame {
    head: [u8; DATA_HEADER_LEN],
    /// Bytes of `head` not yet written, counted from its end.
    head_left: u8,
    pub body: Bytes,
}

impl OutFrame {
    /// A frame already encoded in full.
    pub fn encoded(body: Bytes) -> OutFrame {
        OutFrame {
            head: [0; DATA_HEADER_LEN],
            head_left: 0,
            body,
        }
    }

    /// A DATA frame with its header kept apart from the payload.
    pub fn data(head: [u8; DATA_HEADER_LEN], payload: Bytes) -> OutFrame {
        OutFrame {
            head,
            head_left: DATA_HEADER_LEN as u8,
            body: payload,
        }
    }

    pub fn head(&self) -> &[u8] {
        &self.head[DATA_HEADER_LEN - self.head_left as usize..]
    }

    pub fn remaining(&self) -> usize {
        self.head_left as usize + self.body.len()
    }

    /// Marks `n` bytes as written; returns what was left of `n` past this frame.
    pub fn advance(&mut self, mut n: usize) -> usize {
        let h = (self.head_left as usize).min(n);
        self.head_left -= h as u8;
        n -= h;
        let b = self.body.len().min(n);
        self.body.advance(b);
        n - b
    }
}

impl HasLen for OutFrame {
    fn size(&self) -> usize {
        self.remaining()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_across_head_and_body() {
        let mut f = OutFrame::data([1; 8], Bytes::from_static(b"abcdef"));
        assert_eq!(f.remaining(), 14);
        assert_eq!(f.advance(5), 0);
        assert_eq!(f.head(), &[1, 1, 1]);
        assert_eq!(f.advance(5), 0);
        assert_eq!(f.head(), &[] as &[u8]);
        assert_eq!(&f.body[..], b"cdef");
        assert_eq!(f.advance(10), 6);
        assert_eq!(f.remaining(), 0);
    }
}
