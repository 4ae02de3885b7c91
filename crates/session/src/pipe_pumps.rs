//! The two pumps of a stream whose local end is an in-process pipe
//! (`pipe`): the same rules as a socket's (`stream`) —
//! the peer's credit limits the uplink, and credit goes back only for
//! bytes the pipe took — with buffers handed over instead of copied.

use std::sync::Arc;

use crate::inbound::Part;
use crate::pipe::{PipeSink, PipeSource, Refused, Taken};
use crate::pump::{credit_delivered, fail, send_room, take_inbound, Inbound, LocalClosed};
use crate::runtime::Shared;
use crate::stream_io::StreamIo;

/// The service's bytes → DATA frames, as the peer's credit allows.
pub(crate) async fn uplink(shared: Arc<Shared>, id: u32, io: Arc<StreamIo>, src: PipeSource) {
    loop {
        let Some(room) = send_room(&shared, id, &io, None).await else {
            return;
        };
        // The room is asked for again after every wait: the session's
        // queue is bounded in total, and others may have taken it.
        match src.take(room) {
            Taken::Data(d) => shared.with(|m, _| m.send(id, d)),
            Taken::End => return shared.with(|m, _| m.send_eof(id)),
            Taken::Empty => src.wait().await,
        }
    }
}

/// Inbound DATA → the service.
pub(crate) async fn downlink(shared: Arc<Shared>, id: u32, io: Arc<StreamIo>, sink: PipeSink) {
    let _closed = LocalClosed(shared.clone(), id);
    let mut pending: Vec<Part> = Vec::new();
    loop {
        let Inbound {
            eof,
            closed,
            reset,
            abort,
        } = take_inbound(&io, &mut pending);
        if abort {
            return sink.reset();
        }
        if pending.is_empty() && !eof {
            if closed {
                if reset {
                    sink.reset();
                }
                return;
            }
            io.down.notified().await;
            continue;
        }
        let mut blocked = false;
        while !pending.is_empty() {
            match sink.push(&mut pending) {
                Ok(n) => credit_delivered(&shared, id, n),
                Err(Refused::Full) => {
                    if !blocked {
                        // As on a full socket: what the stream still holds
                        // keeps only its own bytes.
                        blocked = true;
                        crate::inbound::compact_parts(&mut pending);
                        let mut ib = io.inbox();
                        ib.blocked = true;
                        ib.q.compact();
                    }
                    // A service that stops taking must not keep the task
                    // (and its session) once the session is gone.
                    tokio::select! {
                        () = sink.wait() => {}
                        _ = io.down.notified() => {
                            if io.inbox().abort {
                                return sink.reset();
                            }
                        }
                    }
                }
                Err(Refused::Gone) => {
                    return fail(
                        &shared,
                        id,
                        std::io::Error::from(std::io::ErrorKind::BrokenPipe),
                    )
                }
            }
        }
        if blocked {
            io.inbox().blocked = false;
        }
        pending = Vec::new();
        if eof {
            sink.end();
            shared.with(|m, _| m.eof_delivered(id));
            return;
        }
    }
}
