//! A frame waiting for the carrier: an optional inline header plus a body.
//!
//! DATA frames keep their 8-byte header inline and their payload as a slice
//! of the buffer the uplink read into, so one large socket read becomes
//! several frames without copying; control frames are fully encoded in
//! `body`. The writer sends header and body as separate iovecs.

use crate::drr::HasLen;
use crate::frame::{
    write_data_header, DATA_HEADER_LEN, T_ACK, T_CLOSE, T_DATA, T_DATAGRAM, T_GOODBYE,
    T_OPEN_SUCCESS,
};
use bytes::{Buf, Bytes};
use std::collections::VecDeque;

/// Marks `n` bytes at the front of `batch` as written; `starting` sees
/// each frame as its first byte goes out (in wire order).
pub fn advance_batch(
    batch: &mut VecDeque<OutFrame>,
    mut n: usize,
    mut starting: impl FnMut(&OutFrame),
) {
    while n > 0 {
        let Some(front) = batch.front_mut() else {
            break;
        };
        if !front.started {
            starting(front);
        }
        n = front.advance(n);
        if front.remaining() == 0 {
            batch.pop_front();
        }
    }
}

/// The peer's stream id of an encoded frame addressed to a stream
/// (OPEN_SUCCESS … CLOSE all carry it first): frames whose order relative to
/// others of the same stream must not change.
pub fn stream_recipient(encoded: &[u8]) -> Option<u32> {
    match encoded.first() {
        Some(t) if (T_OPEN_SUCCESS..=T_CLOSE).contains(t) => encoded
            .get(4..8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        _ => None,
    }
}

#[derive(Debug)]
pub struct OutFrame {
    head: [u8; DATA_HEADER_LEN],
    /// Bytes of `head` not yet written, counted from its end.
    head_left: u8,
    pub body: Bytes,
    /// Some of it has been written: nothing may be sent before the rest.
    pub started: bool,
    /// The stream it belongs to (peer's id) when its order matters.
    pub recipient: Option<u32>,
}

impl OutFrame {
    /// A frame already encoded in full.
    pub fn encoded(body: Bytes) -> OutFrame {
        OutFrame {
            head: [0; DATA_HEADER_LEN],
            head_left: 0,
            recipient: stream_recipient(&body),
            body,
            started: false,
        }
    }

    /// A DATA frame with its header kept apart from the payload.
    pub fn data(head: [u8; DATA_HEADER_LEN], payload: Bytes) -> OutFrame {
        OutFrame {
            recipient: stream_recipient(&head),
            head,
            head_left: DATA_HEADER_LEN as u8,
            body: payload,
            started: false,
        }
    }

    /// A copy as it was before any of it was written (payload shared, not
    /// copied): what the link layer keeps for a replay.
    pub fn pristine(&self) -> OutFrame {
        debug_assert!(!self.started, "a frame is recorded before it is written");
        OutFrame {
            head: self.head,
            head_left: self.head_left,
            body: self.body.clone(),
            started: false,
            recipient: self.recipient,
        }
    }

    /// A stream's DATA or a flow's datagram (not control or link frames).
    pub fn carries_data(&self) -> bool {
        matches!(self.head[0], T_DATA | T_DATAGRAM)
    }

    /// A link-layer frame (ACK, GOODBYE): not sequenced, never replayed.
    pub fn is_link(&self) -> bool {
        self.head_left == 0 && matches!(self.body.first(), Some(&T_ACK | &T_GOODBYE))
    }

    /// A datagram of a UDP flow (see `mux::datagram`).
    pub fn is_datagram(&self) -> bool {
        self.head[0] == T_DATAGRAM
    }

    /// Outside a link layer's sequenced stream: never counted, recorded or
    /// replayed (link frames, and datagrams: stale after an outage).
    pub fn is_unsequenced(&self) -> bool {
        self.is_link() || self.is_datagram()
    }

    /// The frame's bytes, for a vectored write (header, then body).
    pub fn into_pieces(self) -> impl Iterator<Item = Bytes> {
        let head = Bytes::copy_from_slice(self.head());
        [head, self.body].into_iter().filter(|b| !b.is_empty())
    }

    /// The frame's bytes in one buffer (a copy): one message on a
    /// carrier's datagram path.
    pub fn to_message(&self) -> Bytes {
        let mut m = bytes::BytesMut::with_capacity(self.remaining());
        m.extend_from_slice(self.head());
        m.extend_from_slice(&self.body);
        m.freeze()
    }

    /// Cuts the first `n` payload bytes of a DATA frame not yet started
    /// into a frame of their own (each part gets its own header; the
    /// payload is shared, not copied): how a striped session fits a large
    /// frame to a small chunk. `None` for other frames, or when `n` is not
    /// within the payload.
    pub fn split_data(&mut self, n: usize) -> Option<OutFrame> {
        let whole = self.head_left as usize == DATA_HEADER_LEN && !self.started;
        if !whole || self.head[0] != T_DATA || n == 0 || n >= self.body.len() {
            return None;
        }
        let recipient = self.recipient?;
        let first = self.body.split_to(n);
        let mut h = [0u8; DATA_HEADER_LEN];
        write_data_header(&mut h, recipient, n);
        write_data_header(&mut self.head, recipient, self.body.len());
        Some(OutFrame::data(h, first))
    }

    pub fn head(&self) -> &[u8] {
        &self.head[DATA_HEADER_LEN - self.head_left as usize..]
    }

    pub fn remaining(&self) -> usize {
        self.head_left as usize + self.body.len()
    }

    /// Marks `n` bytes as written; returns what was left of `n` past this frame.
    pub fn advance(&mut self, mut n: usize) -> usize {
        self.started |= n > 0;
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
    fn recipients_of_ordered_frames() {
        use crate::frame::{write_data_header, Frame};
        let mut h = [0u8; DATA_HEADER_LEN];
        write_data_header(&mut h, 77, 3);
        assert_eq!(
            OutFrame::data(h, Bytes::from_static(b"abc")).recipient,
            Some(77)
        );
        let eof = Frame::Eof { recipient: 9 }.to_bytes().unwrap();
        assert_eq!(OutFrame::encoded(eof).recipient, Some(9));
        let adj = Frame::WindowAdjust {
            recipient: 9,
            increment: 1,
        }
        .to_bytes()
        .unwrap();
        assert_eq!(OutFrame::encoded(adj).recipient, Some(9));
        let ping = Frame::Ping { nonce: 9 }.to_bytes().unwrap();
        assert_eq!(OutFrame::encoded(ping).recipient, None);
    }

    #[test]
    fn a_data_frame_splits_into_two_with_their_own_headers() {
        use crate::frame::{decode, DecodeLimits, Frame};
        let mut h = [0u8; DATA_HEADER_LEN];
        write_data_header(&mut h, 5, 10);
        let mut f = OutFrame::data(h, Bytes::from_static(b"0123456789"));
        assert!(f.split_data(0).is_none());
        assert!(f.split_data(10).is_none());
        let first = f.split_data(4).unwrap();
        let mut wire = bytes::BytesMut::new();
        for p in [&first, &f] {
            wire.extend_from_slice(p.head());
            wire.extend_from_slice(&p.body);
        }
        let lim = DecodeLimits::default();
        let data = |p: &[u8]| Frame::Data {
            recipient: 5,
            payload: Bytes::copy_from_slice(p),
        };
        assert_eq!(decode(&mut wire, lim).unwrap(), Some(data(b"0123")));
        assert_eq!(decode(&mut wire, lim).unwrap(), Some(data(b"456789")));
        let ping = Frame::Ping { nonce: 1 }.to_bytes().unwrap();
        assert!(OutFrame::encoded(ping).split_data(2).is_none());
    }

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
