//! What a stream's pumps share with the rest of the session without
//! taking the session lock: their wake-ups and the inbound queue.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::inbound::InQueue;

/// What a stream's pumps share with the rest of the session without taking
/// the session lock: their wake-ups and the inbound queue.
#[derive(Default)]
pub(crate) struct StreamIo {
    /// Wakes the uplink: credit arrived, queue room freed, or closing.
    pub up: Notify,
    /// Wakes the downlink: data or EOF queued, or closing.
    pub down: Notify,
    inbox: Mutex<Inbox>,
}

#[derive(Default)]
pub(crate) struct Inbox {
    pub q: InQueue,
    /// Nothing more will be queued; the downlink ends once `q` is written.
    pub closed: bool,
    /// The local socket is full: queue copies, not slices of carrier buffers.
    pub blocked: bool,
    /// The session died under the stream: drop what is queued and reset
    /// the local connection now (also while a write waits for room).
    pub abort: bool,
    /// The stream was cut short at the other end: once what is queued is
    /// written, reset the local connection, so the application sees a
    /// failure, not a clean end of data.
    pub reset: bool,
}

impl StreamIo {
    pub fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session died: drop what is queued and reset the local socket.
    pub fn abort_inbox(&self) {
        let mut ib = self.inbox();
        ib.closed = true;
        ib.abort = true;
        ib.q = InQueue::default();
        drop(ib);
        self.down.notify_one();
    }

    /// No more inbound data: the downlink writes what it has and ends.
    /// `discard` drops what is queued or being written as well (the stream
    /// failed: nothing is waited for); `reset` ends the local socket with a
    /// reset rather than a FIN.
    pub fn close_inbox(&self, discard: bool, reset: bool) {
        let mut ib = self.inbox();
        ib.closed = true;
        ib.reset |= reset;
        if discard {
            ib.abort = true;
            ib.q = InQueue::default();
        }
        drop(ib);
        self.down.notify_one();
    }
}
