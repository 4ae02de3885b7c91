//! WebSocket as a byte stream: each write becomes one binary message, reads
//! return message payloads in order. Lets longhaul sit behind an HTTP
//! reverse proxy (nginx, Caddy, a cloud load balancer) on a URL path.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

/// Largest message we send (bigger writes are cut). Small enough that the
/// one message tungstenite may hold while the socket is full keeps little
/// in front of an interactive frame.
pub const WS_MAX_SEND: usize = 64 * 1024;
/// Largest message or frame we accept from a peer: bounds what one message
/// can make us buffer.
pub const WS_MAX_MESSAGE: usize = 1024 * 1024;

pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig {
        max_message_size: Some(WS_MAX_MESSAGE),
        max_frame_size: Some(WS_MAX_MESSAGE),
        // Write each message out at once: the session batches already, and
        // bytes parked here would sit past its scheduler.
        write_buffer_size: 0,
        // Bounds the send side too: tungstenite errors instead of growing.
        max_write_buffer_size: 4 * WS_MAX_SEND,
        ..WebSocketConfig::default()
    }
}

/// A WebSocket carrying a byte stream.
pub struct WsIo<S> {
    ws: WebSocketStream<S>,
    /// Unread rest of the current message.
    pending: Vec<u8>,
    pos: usize,
    eof: bool,
}

impl<S> WsIo<S> {
    pub fn new(ws: WebSocketStream<S>) -> WsIo<S> {
        WsIo {
            ws,
            pending: Vec::new(),
            pos: 0,
            eof: false,
        }
    }
}

fn io_err(e: WsError) -> std::io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::ConnectionClosed | WsError::AlreadyClosed => std::io::ErrorKind::BrokenPipe.into(),
        other => std::io::Error::new(std::io::ErrorKind::InvalidData, other.to_string()),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = &mut *self;
        loop {
            if me.pos < me.pending.len() {
                let n = buf.remaining().min(me.pending.len() - me.pos);
                buf.put_slice(&me.pending[me.pos..me.pos + n]);
                me.pos += n;
                return Poll::Ready(Ok(()));
            }
            if me.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut me.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(b))) => {
                    me.pending = b;
                    me.pos = 0;
                }
                // tungstenite answers pings itself on the next write/flush.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "text message on a binary WebSocket carrier",
                    )))
                }
                Some(Ok(Message::Close(_))) | None => me.eof = true,
                Some(Err(e)) => return Poll::Ready(Err(io_err(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
    }

    /// Gathers the slices (a frame header and its payload, say) into one
    /// message rather than sending each as its own.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let me = &mut *self;
        ready!(Pin::new(&mut me.ws).poll_ready(cx)).map_err(io_err)?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut msg = Vec::with_capacity(total.min(WS_MAX_SEND));
        for b in bufs {
            let room = WS_MAX_SEND - msg.len();
            if room == 0 {
                break;
            }
            msg.extend_from_slice(&b[..b.len().min(room)]);
        }
        let n = msg.len();
        Pin::new(&mut me.ws)
            .start_send(Message::Binary(msg))
            .map_err(io_err)?;
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(io_err)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match ready!(Pin::new(&mut self.ws).poll_close(cx)) {
            Ok(()) | Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(io_err(e))),
        }
    }
}

/// Client side of the upgrade: `url` is the full `ws://host:port/path`
/// (the Host header and path come from it).
pub async fn connect<S>(io: S, url: &str) -> std::io::Result<WsIo<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    connect_to(io, url, None).await
}

/// The upgrade request's header naming the server instance that holds the
/// session (for a load balancer: nginx `$http_longhaul_instance`, HAProxy
/// `hdr(longhaul-instance)`).
pub const INSTANCE_HEADER: &str = "longhaul-instance";

/// [`connect`], naming the server `instance` in [`INSTANCE_HEADER`].
pub async fn connect_to<S>(io: S, url: &str, instance: Option<&str>) -> std::io::Result<WsIo<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::HeaderValue;
    let bad = |e: tokio_tungstenite::tungstenite::Error| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{url}: {e}"))
    };
    let mut req = url.into_client_request().map_err(bad)?;
    if let Some(v) = instance.and_then(|n| HeaderValue::from_str(n).ok()) {
        req.headers_mut().insert(INSTANCE_HEADER, v);
    }
    let (ws, _resp) = tokio_tungstenite::client_async_with_config(req, io, Some(ws_config()))
        .await
        .map_err(|e| {
            // What answers there speaks TLS, not HTTP: a tls:// listener.
            let hint = match e.to_string().contains("invalid HTTP version") {
                true => " (that port answers in TLS, not HTTP: is it a tls:// listener? then use tls://HOST:PORT; a WebSocket listener inside TLS is wss://)",
                false => "",
            };
            std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                format!("WebSocket upgrade at {url} failed: {e}{hint}"),
            )
        })?;
    Ok(WsIo::new(ws))
}

/// Server side of the upgrade; anything but `path` gets 404.
pub async fn accept<S>(io: S, path: &str) -> std::io::Result<WsIo<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let want = path.to_string();
    // The callback's error type is tungstenite's HTTP response.
    #[allow(clippy::result_large_err)]
    let check = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        if req.uri().path() == want {
            Ok(resp)
        } else {
            let mut r = ErrorResponse::new(Some("not found".into()));
            *r.status_mut() = StatusCode::NOT_FOUND;
            Err(r)
        }
    };
    let ws = tokio_tungstenite::accept_hdr_async_with_config(io, check, Some(ws_config()))
        .await
        .map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("WebSocket upgrade failed: {e}"),
            )
        })?;
    Ok(WsIo::new(ws))
}
