//! Wire codec.
//!
//! Every message starts with JMUX's 4-byte header:
//!
//! ```text
//! u8 msgType | u16 msgSize (whole message, header included, big endian) | u8 msgFlags
//! ```
//!
//! Types 100–106 are JMUX's and keep JMUX's exact layout, so longhaul can talk
//! to `jetsocat jmux-proxy`. Types 110 and above are longhaul extensions and
//! are only accepted once the native handshake has been made.
//!
//! Decoding never panics and never allocates more than the declared frame
//! size, which is itself bounded by `u16::MAX` and by the caller's limit.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub use crate::dest::{format_dest, format_target, parse_dest, parse_target, Transport};

/// Size of the common header.
pub const HEADER_LEN: usize = 4;
/// Largest message the 16-bit size field can describe.
pub const MAX_FRAME_LEN: usize = u16::MAX as usize;
/// Header of a DATA message: common header + recipient channel id.
pub const DATA_HEADER_LEN: usize = HEADER_LEN + 4;
/// Largest DATA payload a single message can carry.
pub const MAX_DATA_PAYLOAD: usize = MAX_FRAME_LEN - DATA_HEADER_LEN;

pub const T_OPEN: u8 = 100;
pub const T_OPEN_SUCCESS: u8 = 101;
pub const T_OPEN_FAILURE: u8 = 102;
pub const T_WINDOW_ADJUST: u8 = 103;
pub const T_DATA: u8 = 104;
pub const T_EOF: u8 = 105;
pub const T_CLOSE: u8 = 106;
// longhaul extensions (native mode only)
pub const T_PING: u8 = 110;
pub const T_PONG: u8 = 111;
pub const T_BIND: u8 = 112;
pub const T_BIND_SUCCESS: u8 = 113;
pub const T_BIND_FAILURE: u8 = 114;
/// Link layer (native mode with resume): not part of the multiplexer.
pub const T_ACK: u8 = 115;
/// Link layer: the session is over on purpose; do not wait for a resume.
pub const T_GOODBYE: u8 = 116;
/// Link layer, striped sessions only: `len` bytes of the sequenced frame
/// stream, starting at byte `offset`, follow this header on the lane.
pub const T_CHUNK: u8 = 117;
/// One datagram of a UDP flow (a stream opened to `udp://host:port`):
/// delivered whole or not at all, outside the stream's window.
pub const T_DATAGRAM: u8 = 118;
/// The sender is going away (a server draining for a restart): open new
/// streams through a new session; the streams open now go on.
pub const T_DRAIN: u8 = 119;

/// Why an OPEN (or a BIND) failed. The values are JMUX's, which are SOCKS5's
/// reply codes, so a SOCKS5 front end can pass them straight through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reason(pub u32);

impl Reason {
    pub const GENERAL_FAILURE: Reason = Reason(1);
    pub const NOT_ALLOWED: Reason = Reason(2);
    pub const NETWORK_UNREACHABLE: Reason = Reason(3);
    pub const HOST_UNREACHABLE: Reason = Reason(4);
    pub const CONNECTION_REFUSED: Reason = Reason(5);
    pub const TTL_EXPIRED: Reason = Reason(6);
    pub const ADDRESS_TYPE_NOT_SUPPORTED: Reason = Reason(8);

    /// Maps an I/O error from a connect attempt to the closest reason.
    pub fn from_io(kind: std::io::ErrorKind) -> Reason {
        use std::io::ErrorKind::*;
        match kind {
            ConnectionRefused => Reason::CONNECTION_REFUSED,
            TimedOut => Reason::TTL_EXPIRED,
            HostUnreachable => Reason::HOST_UNREACHABLE,
            NetworkUnreachable => Reason::NETWORK_UNREACHABLE,
            NotFound => Reason::HOST_UNREACHABLE,
            _ => Reason::GENERAL_FAILURE,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self.0 {
            1 => "general failure",
            2 => "not allowed",
            3 => "network unreachable",
            4 => "host unreachable",
            5 => "connection refused",
            6 => "timed out",
            8 => "address type not supported",
            _ => "other failure",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Open {
        sender: u32,
        window: u32,
        max_packet: u16,
        /// `tcp://host:port`
        dest: String,
    },
    OpenSuccess {
        recipient: u32,
        sender: u32,
        window: u32,
        max_packet: u16,
    },
    OpenFailure {
        recipient: u32,
        reason: Reason,
        description: String,
    },
    WindowAdjust {
        recipient: u32,
        increment: u32,
    },
    Data {
        recipient: u32,
        payload: Bytes,
    },
    Eof {
        recipient: u32,
    },
    Close {
        recipient: u32,
    },
    /// Liveness and RTT probe; the peer echoes `nonce` in a PONG.
    Ping {
        nonce: u64,
    },
    Pong {
        nonce: u64,
    },
    /// Ask the peer to listen on `bind` (`host:port`) and to OPEN a stream to
    /// `dest` back to us for every connection it accepts there (`-R`).
    Bind {
        request: u32,
        bind: String,
        dest: String,
    },
    BindSuccess {
        request: u32,
        port: u16,
    },
    BindFailure {
        request: u32,
        reason: Reason,
        description: String,
    },
    /// Link layer: every byte of frames up to `received` (counted from the
    /// start of the session, link frames excluded) has arrived. Never
    /// sequenced itself, so never replayed.
    Ack {
        received: u64,
    },
    /// Link layer: the sender ends the session on purpose (after its CLOSEs);
    /// the carrier closing next is not a drop to resume from.
    Goodbye,
    /// Link layer, on the lanes of a striped session: the next `len` bytes
    /// on this lane (not part of this frame's size) are the session's
    /// sequenced bytes from `offset` on. See `stripe`.
    Chunk {
        offset: u64,
        len: u32,
    },
    /// One datagram for flow `recipient`; never split, never flow
    /// controlled (dropped instead when it cannot be queued).
    Datagram {
        recipient: u32,
        payload: Bytes,
    },
    /// The sender is draining (see [`T_DRAIN`]); `reason` says why.
    Drain {
        reason: String,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame declares size {0}, smaller than its header")]
    TooSmall(usize),
    #[error("frame of {size} bytes exceeds the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("{0} message truncated")]
    Truncated(&'static str),
    #[error("{0} carries a string that is not UTF-8")]
    BadString(&'static str),
    #[error("message would be {0} bytes, more than a frame can hold")]
    Oversized(usize),
}

impl Frame {
    pub fn type_code(&self) -> u8 {
        match self {
            Frame::Open { .. } => T_OPEN,
            Frame::OpenSuccess { .. } => T_OPEN_SUCCESS,
            Frame::OpenFailure { .. } => T_OPEN_FAILURE,
            Frame::WindowAdjust { .. } => T_WINDOW_ADJUST,
            Frame::Data { .. } => T_DATA,
            Frame::Eof { .. } => T_EOF,
            Frame::Close { .. } => T_CLOSE,
            Frame::Ping { .. } => T_PING,
            Frame::Pong { .. } => T_PONG,
            Frame::Bind { .. } => T_BIND,
            Frame::BindSuccess { .. } => T_BIND_SUCCESS,
            Frame::BindFailure { .. } => T_BIND_FAILURE,
            Frame::Ack { .. } => T_ACK,
            Frame::Goodbye => T_GOODBYE,
            Frame::Chunk { .. } => T_CHUNK,
            Frame::Datagram { .. } => T_DATAGRAM,
            Frame::Drain { .. } => T_DRAIN,
        }
    }

    /// Whether this message is a longhaul extension (not valid in JMUX mode).
    pub fn is_extension(&self) -> bool {
        self.type_code() >= T_PING
    }

    fn body_len(&self) -> usize {
        match self {
            Frame::Open { dest, .. } => 10 + dest.len(),
            Frame::OpenSuccess { .. } => 14,
            Frame::OpenFailure { description, .. } => 8 + description.len(),
            Frame::WindowAdjust { .. } => 8,
            Frame::Data { payload, .. } | Frame::Datagram { payload, .. } => 4 + payload.len(),
            Frame::Eof { .. } | Frame::Close { .. } => 4,
            Frame::Ping { .. } | Frame::Pong { .. } => 8,
            Frame::Bind { bind, dest, .. } => 4 + 2 + bind.len() + dest.len(),
            Frame::BindSuccess { .. } => 6,
            Frame::BindFailure { description, .. } => 8 + description.len(),
            Frame::Ack { .. } => 8,
            Frame::Goodbye => 0,
            Frame::Chunk { .. } => 12,
            Frame::Drain { reason } => reason.len(),
        }
    }

    /// Encoded size, header included.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.body_len()
    }

    /// Appends the encoded message to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), FrameError> {
        let len = self.encoded_len();
        if len > MAX_FRAME_LEN {
            return Err(FrameError::Oversized(len));
        }
        dst.reserve(len);
        dst.put_u8(self.type_code());
        dst.put_u16(len as u16);
        dst.put_u8(0);
        match self {
            Frame::Open {
                sender,
                window,
                max_packet,
                dest,
            } => {
                dst.put_u32(*sender);
                dst.put_u32(*window);
                dst.put_u16(*max_packet);
                dst.put_slice(dest.as_bytes());
            }
            Frame::OpenSuccess {
                recipient,
                sender,
                window,
                max_packet,
            } => {
                dst.put_u32(*recipient);
                dst.put_u32(*sender);
                dst.put_u32(*window);
                dst.put_u16(*max_packet);
            }
            Frame::OpenFailure {
                recipient,
                reason,
                description,
            } => {
                dst.put_u32(*recipient);
                dst.put_u32(reason.0);
                dst.put_slice(description.as_bytes());
            }
            Frame::WindowAdjust {
                recipient,
                increment,
            } => {
                dst.put_u32(*recipient);
                dst.put_u32(*increment);
            }
            Frame::Data { recipient, payload } | Frame::Datagram { recipient, payload } => {
                dst.put_u32(*recipient);
                dst.put_slice(payload);
            }
            Frame::Eof { recipient } | Frame::Close { recipient } => dst.put_u32(*recipient),
            Frame::Ping { nonce } | Frame::Pong { nonce } => dst.put_u64(*nonce),
            Frame::Ack { received } => dst.put_u64(*received),
            Frame::Goodbye => {}
            Frame::Drain { reason } => dst.put_slice(reason.as_bytes()),
            Frame::Chunk { offset, len } => {
                dst.put_u64(*offset);
                dst.put_u32(*len);
            }
            Frame::Bind {
                request,
                bind,
                dest,
            } => {
                dst.put_u32(*request);
                dst.put_u16(bind.len() as u16);
                dst.put_slice(bind.as_bytes());
                dst.put_slice(dest.as_bytes());
            }
            Frame::BindSuccess { request, port } => {
                dst.put_u32(*request);
                dst.put_u16(*port);
            }
            Frame::BindFailure {
                request,
                reason,
                description,
            } => {
                dst.put_u32(*request);
                dst.put_u32(reason.0);
                dst.put_slice(description.as_bytes());
            }
        }
        Ok(())
    }

    /// Encodes into a fresh buffer.
    pub fn to_bytes(&self) -> Result<Bytes, FrameError> {
        let mut b = BytesMut::with_capacity(self.encoded_len());
        self.encode(&mut b)?;
        Ok(b.freeze())
    }
}

/// Writes a DATA header for a payload of `payload_len` bytes, so a payload
/// read straight from a socket can go out behind it without another copy.
pub fn write_data_header(dst: &mut [u8; DATA_HEADER_LEN], recipient: u32, payload_len: usize) {
    write_payload_header(dst, T_DATA, recipient, payload_len);
}

/// Writes a DATAGRAM header (same layout as DATA's).
pub fn write_datagram_header(dst: &mut [u8; DATA_HEADER_LEN], recipient: u32, payload_len: usize) {
    write_payload_header(dst, T_DATAGRAM, recipient, payload_len);
}

fn write_payload_header(dst: &mut [u8; DATA_HEADER_LEN], ty: u8, recipient: u32, len: usize) {
    debug_assert!(len <= MAX_DATA_PAYLOAD);
    let total = (DATA_HEADER_LEN + len) as u16;
    dst[0] = ty;
    dst[1..3].copy_from_slice(&total.to_be_bytes());
    dst[3] = 0;
    dst[4..8].copy_from_slice(&recipient.to_be_bytes());
}

/// Options for [`decode`].
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    /// Largest frame accepted (≤ 65535).
    pub max_frame: usize,
    /// Accept longhaul extension messages (native mode).
    pub extensions: bool,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_frame: MAX_FRAME_LEN,
            extensions: true,
        }
    }
}

/// The size the message starting `buf` declares (header included), once
/// its header is there; not checked (that is [`decode`]'s part).
pub fn declared_len(buf: &[u8]) -> Option<usize> {
    (buf.len() >= HEADER_LEN).then(|| u16::from_be_bytes([buf[1], buf[2]]) as usize)
}

/// Takes one complete message off the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed (nothing is consumed), and an
/// error for a message that can never be valid; the caller then closes the
/// session. DATA payloads are zero-copy slices of `buf`'s storage.
pub fn decode(buf: &mut BytesMut, limits: DecodeLimits) -> Result<Option<Frame>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let ty = buf[0];
    let size = u16::from_be_bytes([buf[1], buf[2]]) as usize;
    if size < HEADER_LEN {
        return Err(FrameError::TooSmall(size));
    }
    if size > limits.max_frame {
        return Err(FrameError::TooLarge {
            size,
            limit: limits.max_frame,
        });
    }
    let known =
        (T_OPEN..=T_CLOSE).contains(&ty) || (limits.extensions && (T_PING..=T_DRAIN).contains(&ty));
    if !known {
        return Err(FrameError::UnknownType(ty));
    }
    if buf.len() < size {
        return Ok(None);
    }
    let mut frame = buf.split_to(size).freeze();
    frame.advance(HEADER_LEN);
    decode_body(ty, frame).map(Some)
}

fn need(b: &Bytes, n: usize, what: &'static str) -> Result<(), FrameError> {
    if b.len() < n {
        Err(FrameError::Truncated(what))
    } else {
        Ok(())
    }
}

fn string(b: &[u8], what: &'static str) -> Result<String, FrameError> {
    // JMUX says implementations should ignore NUL terminators.
    let end = b.iter().rposition(|&c| c != 0).map_or(0, |i| i + 1);
    std::str::from_utf8(&b[..end])
        .map(str::to_owned)
        .map_err(|_| FrameError::BadString(what))
}

fn decode_body(ty: u8, mut b: Bytes) -> Result<Frame, FrameError> {
    let f = match ty {
        T_OPEN => {
            need(&b, 10, "OPEN")?;
            let sender = b.get_u32();
            let window = b.get_u32();
            let max_packet = b.get_u16();
            Frame::Open {
                sender,
                window,
                max_packet,
                dest: string(&b, "OPEN")?,
            }
        }
        T_OPEN_SUCCESS => {
            need(&b, 14, "OPEN_SUCCESS")?;
            Frame::OpenSuccess {
                recipient: b.get_u32(),
                sender: b.get_u32(),
                window: b.get_u32(),
                max_packet: b.get_u16(),
            }
        }
        T_OPEN_FAILURE => {
            need(&b, 8, "OPEN_FAILURE")?;
            let recipient = b.get_u32();
            let reason = Reason(b.get_u32());
            Frame::OpenFailure {
                recipient,
                reason,
                description: string(&b, "OPEN_FAILURE")?,
            }
        }
        T_WINDOW_ADJUST => {
            need(&b, 8, "WINDOW_ADJUST")?;
            Frame::WindowAdjust {
                recipient: b.get_u32(),
                increment: b.get_u32(),
            }
        }
        T_DATA => {
            need(&b, 4, "DATA")?;
            let recipient = b.get_u32();
            Frame::Data {
                recipient,
                payload: b,
            }
        }
        T_DATAGRAM => {
            need(&b, 4, "DATAGRAM")?;
            let recipient = b.get_u32();
            Frame::Datagram {
                recipient,
                payload: b,
            }
        }
        T_EOF => {
            need(&b, 4, "EOF")?;
            Frame::Eof {
                recipient: b.get_u32(),
            }
        }
        T_CLOSE => {
            need(&b, 4, "CLOSE")?;
            Frame::Close {
                recipient: b.get_u32(),
            }
        }
        T_PING => {
            need(&b, 8, "PING")?;
            Frame::Ping { nonce: b.get_u64() }
        }
        T_PONG => {
            need(&b, 8, "PONG")?;
            Frame::Pong { nonce: b.get_u64() }
        }
        T_BIND => {
            need(&b, 6, "BIND")?;
            let request = b.get_u32();
            let bind_len = b.get_u16() as usize;
            need(&b, bind_len, "BIND")?;
            let bind = string(&b.split_to(bind_len), "BIND")?;
            Frame::Bind {
                request,
                bind,
                dest: string(&b, "BIND")?,
            }
        }
        T_BIND_SUCCESS => {
            need(&b, 6, "BIND_SUCCESS")?;
            Frame::BindSuccess {
                request: b.get_u32(),
                port: b.get_u16(),
            }
        }
        T_BIND_FAILURE => {
            need(&b, 8, "BIND_FAILURE")?;
            let request = b.get_u32();
            let reason = Reason(b.get_u32());
            Frame::BindFailure {
                request,
                reason,
                description: string(&b, "BIND_FAILURE")?,
            }
        }
        T_ACK => {
            need(&b, 8, "ACK")?;
            Frame::Ack {
                received: b.get_u64(),
            }
        }
        T_GOODBYE => Frame::Goodbye,
        T_DRAIN => Frame::Drain {
            reason: string(&b, "DRAIN")?,
        },
        T_CHUNK => {
            need(&b, 12, "CHUNK")?;
            Frame::Chunk {
                offset: b.get_u64(),
                len: b.get_u32(),
            }
        }
        other => return Err(FrameError::UnknownType(other)),
    };
    Ok(f)
}

#[cfg(test)]
#[path = "frame_tests.rs"]
mod tests;
