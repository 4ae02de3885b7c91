//! What a stream's pumps share with the rest of the session without
//! taking the session lock: their wake-ups and the inbound queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

use crate::inbound::InQueue;

/// A wake-up for the one future that waits on it (a stream's uplink, or
/// its downlink). As with tokio's `Notify::notify_one`, a signal given
/// while nobody waits is kept for the next wait; a wait may also end
/// early, so a waiter looks again at what it waits for. One flag and one
/// waker instead of `Notify`'s list of waiters under a lock: a 1-byte
/// round trip gives and takes two of these in each relay.
#[derive(Default)]
pub(crate) struct Signal {
    set: AtomicBool,
    waker: AtomicWaker,
}

impl Signal {
    pub fn notify_one(&self) {
        self.set.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Ready once a signal was given since the last wait ended.
    pub fn notified(&self) -> Notified<'_> {
        Notified(self)
    }
}

pub(crate) struct Notified<'a>(&'a Signal);

impl Signal {
    /// Ready (and the signal taken) once one was given since the last
    /// wait ended; otherwise `cx` is woken when one is.
    pub fn poll_notified(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.set.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // Given between the first look and the registration.
        match self.set.swap(false, Ordering::AcqRel) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    }
}

impl Future for Notified<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.poll_notified(cx)
    }
}

/// What a stream's pumps share with the rest of the session without taking
/// the session lock: their wake-ups and the inbound queue.
#[derive(Default)]
pub(crate) struct StreamIo {
    /// Wakes the uplink: credit arrived, queue room freed, or closing.
    pub up: Signal,
    /// Wakes the downlink: data or EOF queued, or closing.
    pub down: Signal,
    /// The stream is closed: its uplink stops reading (see
    /// `StreamRt::stop_uplink`).
    uplink_stopped: AtomicBool,
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
    /// Tells the uplink to stop; the caller wakes its task.
    pub fn stop_uplink(&self) {
        self.uplink_stopped.store(true, Ordering::Release);
        self.up.notify_one();
    }

    pub fn uplink_stopped(&self) -> bool {
        self.uplink_stopped.load(Ordering::Acquire)
    }

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
