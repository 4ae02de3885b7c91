//! The session's driver: one tokio task per session polls every task of
//! that session — the carrier's reader and writer (or each lane's), every
//! stream's pumps, the session's timer — as futures of its own.
//!
//! Why: a byte crossing the relay goes from a stream's uplink to the
//! carrier writer (or from the carrier reader to a stream's downlink). As
//! separate tokio tasks, each of those hand-offs is a trip through the
//! scheduler, and under a multi-threaded runtime often a wake-up of another
//! thread (futex, context switch, a cold cache on the other core). Inside
//! one driver, a wake-up between two of the session's futures is a push on
//! the driver's ready queue, and the woken future runs in the same pass,
//! on the same thread, with the bytes still warm. Sessions are still spread
//! over the runtime's threads (a server with many sessions uses every
//! core); one session uses one thread at a time.
//!
//! The driver holds no protocol state: which future runs when is decided
//! by the wake-ups the futures give each other, as before.
//!
//! Bounds: the driver holds the futures of the session's tasks, which the
//! session bounds already (one per stream, two for a service's stream,
//! `max_streams`; two per carrier or lane; the timer). A panic in one of them is caught, logged, and ends
//! that future only, as it would have ended a task of its own.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::task::{Wake, Waker};

use futures_util::future::FutureExt;
use futures_util::task::AtomicWaker;

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Hands futures to the session's driver task.
pub(crate) struct Driver {
    queue: Arc<ReadyQueue>,
}

impl Driver {
    /// Starts the driver task (on the current runtime). It ends once every
    /// future it was given has ended and the `Driver` is dropped (the
    /// session's state with it).
    pub fn start() -> Driver {
        let queue = Arc::new(ReadyQueue {
            slots: Mutex::new(VecDeque::new()),
            incoming: Mutex::new(Incoming::default()),
            has_incoming: AtomicBool::new(false),
            dropped: AtomicBool::new(false),
            polling: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        // The struct itself, not an `async fn` building it: a task dropped
        // before its first poll (runtime shutdown) still drops `Drive`, whose
        // `Drop` ends the futures handed over and refuses later ones.
        tokio::spawn(Drive {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            queue: queue.clone(),
        });
        Driver { queue }
    }

    /// Runs `fut` in the driver. The [`Task`] can stop it, tell whether it
    /// ended, and be awaited; dropping it lets the future run on.
    pub fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) -> Task {
        let state = Arc::new(JobState {
            slot: AtomicUsize::new(0),
            // Not in the queue, but not to be queued either until the
            // driver has it (it polls it first thing).
            queued: AtomicBool::new(true),
            aborted: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            joiner: AtomicWaker::new(),
            queue: self.queue.clone(),
        });
        // A combinator, not an async block: a block would keep `fut` both
        // as its capture and as the wrapper's field (twice the memory of
        // every idle stream's pumps).
        let job: Job = Box::pin(AssertUnwindSafe(fut).catch_unwind().map(|r| {
            if let Err(panic) = r {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!("a session task panicked: {what}");
            }
        }));
        let refused = {
            let mut incoming = self.queue.incoming();
            if incoming.gone {
                Some(job)
            } else {
                incoming.jobs.push((job, state.clone()));
                None
            }
        };
        match refused {
            // The driver is gone (its runtime is shutting down): the
            // session's tasks are gone with it.
            Some(job) => {
                drop_quietly(job);
                state.finish();
            }
            None => {
                self.queue.has_incoming.store(true, Ordering::SeqCst);
                self.queue.wake_driver();
            }
        }
        Task { state }
    }
}

/// Every handle is gone: the driver ends once its futures have.
impl Drop for Driver {
    fn drop(&mut self) {
        self.queue.dropped.store(true, Ordering::SeqCst);
        self.queue.task.wake();
    }
}

/// One future in the driver: its place, its wake-up, how it ended, and
/// who waits for that.
struct JobState {
    slot: AtomicUsize,
    /// In the ready queue already (each future at most once).
    queued: AtomicBool,
    /// Stop it: the driver drops it the next time it looks.
    aborted: AtomicBool,
    finished: AtomicBool,
    /// The task awaiting its end, if any.
    joiner: AtomicWaker,
    queue: Arc<ReadyQueue>,
}

impl JobState {
    fn finish(&self) {
        self.finished.store(true, Ordering::Release);
        self.joiner.wake();
    }
}

impl Wake for JobState {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        self.queue.push(self.slot.load(Ordering::Acquire));
        self.queue.wake_driver();
    }
}

/// A future running in a session's driver, like a tokio `JoinHandle`.
pub(crate) struct Task {
    state: Arc<JobState>,
}

/// Stops a future running in a session's driver.
#[derive(Clone)]
pub(crate) struct AbortHandle(Arc<JobState>);

impl AbortHandle {
    /// Stops the future: it is dropped the next time the driver looks.
    pub fn abort(&self) {
        self.0.aborted.store(true, Ordering::Release);
        self.0.wake_by_ref();
    }

    /// Polls the future again (it looks at what it waits for).
    pub fn wake(&self) {
        self.0.wake_by_ref();
    }
}

impl Task {
    pub fn abort(&self) {
        self.abort_handle().abort();
    }

    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.state.clone())
    }

    pub fn is_finished(&self) -> bool {
        self.state.finished.load(Ordering::Acquire)
    }
}

/// Ready once the future has ended (however it ended).
impl Future for Task {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_finished() {
            return Poll::Ready(());
        }
        self.state.joiner.register(cx.waker());
        match self.is_finished() {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    }
}

/// Most futures polled in one turn of the driver before it lets the
/// runtime's other tasks run (tokio's own budget usually ends a turn first).
const MAX_POLLS_PER_TURN: usize = 1024;

/// The futures woken and waiting to be polled, by slot; and futures
/// handed over and not yet taken in. (A plain list under a lock rather than
/// a channel: the driver looks for new futures before every poll, and an
/// empty channel's receive cost more than the rest of a driver's turn.)
struct ReadyQueue {
    slots: Mutex<VecDeque<usize>>,
    incoming: Mutex<Incoming>,
    /// `incoming` has futures: a load, not a lock, on the driver's path.
    has_incoming: AtomicBool,
    /// The [`Driver`] is gone: no more futures will come.
    dropped: AtomicBool,
    /// The driver is in its turn: a future woken now is polled in the same
    /// turn, so the driver's own task is not woken (a woken tokio task in
    /// its own poll is scheduled again as a yield, which on a
    /// multi-threaded runtime wakes another thread to steal it: a futex
    /// call and a context switch per hand-off).
    polling: AtomicBool,
    task: AtomicWaker,
}

#[derive(Default)]
struct Incoming {
    jobs: Vec<(Job, Arc<JobState>)>,
    /// The driver task is gone: nothing handed over would ever run.
    gone: bool,
}

impl ReadyQueue {
    fn incoming(&self) -> MutexGuard<'_, Incoming> {
        self.incoming.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After a push: a driver ending its turn clears `polling` and then
    /// looks at the queue once more, so one of the two sees it.
    fn wake_driver(&self) {
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }

    /// Nothing woken and nothing handed over.
    fn is_idle(&self) -> bool {
        !self.has_incoming.load(Ordering::SeqCst) && self.is_empty()
    }

    fn push(&self, slot: usize) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(slot);
    }
    fn pop(&self) -> Option<usize> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }
    fn push_front(&self, slot: usize) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_front(slot);
    }
    fn is_empty(&self) -> bool {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

struct Slot {
    /// Taken only by `drop`.
    job: Option<Job>,
    state: Arc<JobState>,
    waker: Waker,
}

/// However a future leaves the driver (ended, stopped, or the driver
/// dropped), it is dropped first (its sockets closed), then whoever waits
/// for it is told, as with a tokio `JoinHandle`.
impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            drop_quietly(job);
        }
        self.state.finish();
    }
}

/// Drops a future; a panic in its drop ends only that future, not the
/// driver and the rest of the session (as tokio does for a cancelled task).
fn drop_quietly(job: Job) {
    if std::panic::catch_unwind(AssertUnwindSafe(move || drop(job))).is_err() {
        tracing::error!("a session task panicked while being dropped");
    }
}

/// Futures handed over but never taken in (the driver dropped at runtime
/// shutdown) still end, and say so; later ones are refused.
impl Drop for Drive {
    fn drop(&mut self) {
        let jobs = {
            let mut incoming = self.queue.incoming();
            incoming.gone = true;
            std::mem::take(&mut incoming.jobs)
        };
        for (job, state) in jobs {
            drop_quietly(job);
            state.finish();
        }
    }
}

/// The driver task: takes new futures and polls the woken ones, each turn
/// running every future woken meanwhile, including those woken by the
/// others in the same turn.
struct Drive {
    /// Futures by slot; freed slots are reused.
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    live: usize,
    queue: Arc<ReadyQueue>,
}

impl Drive {
    fn insert(&mut self, job: Job, state: Arc<JobState>) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        state.slot.store(slot, Ordering::Release);
        let waker = Waker::from(state.clone());
        self.slots[slot] = Some(Slot {
            job: Some(job),
            state,
            waker,
        });
        self.live += 1;
        self.queue.push(slot);
    }

    /// Takes in the futures handed over since the last look.
    fn take_incoming(&mut self) {
        if !self.queue.has_incoming.swap(false, Ordering::SeqCst) {
            return;
        }
        let jobs = std::mem::take(&mut self.queue.incoming().jobs);
        for (job, state) in jobs {
            self.insert(job, state);
        }
    }

    fn poll_slot(&mut self, slot: usize) {
        let Some(s) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
            // A slot freed since it was woken.
            return;
        };
        s.state.queued.store(false, Ordering::Release);
        let ended = s.state.aborted.load(Ordering::Acquire) || {
            let mut cx = Context::from_waker(&s.waker);
            s.job
                .as_mut()
                .is_none_or(|j| j.as_mut().poll(&mut cx).is_ready())
        };
        if ended {
            self.slots[slot] = None;
            self.free.push(slot);
            self.live -= 1;
        }
    }
}

impl Future for Drive {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        this.queue.task.register(cx.waker());
        this.queue.polling.store(true, Ordering::SeqCst);
        let mut polls = 0;
        loop {
            this.take_incoming();
            match this.queue.pop() {
                Some(slot) => {
                    if polls >= MAX_POLLS_PER_TURN || !tokio::task::coop::has_budget_remaining() {
                        // Let the runtime's other tasks run; come back.
                        this.queue.push_front(slot);
                        this.queue.polling.store(false, Ordering::SeqCst);
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    polls += 1;
                    this.poll_slot(slot);
                }
                None => {
                    this.queue.polling.store(false, Ordering::SeqCst);
                    if !this.queue.is_idle() {
                        // Woken between the pop and the store.
                        this.queue.polling.store(true, Ordering::SeqCst);
                        continue;
                    }
                    // Read after the last look at `incoming`: a future
                    // handed over before the drop is taken in first.
                    let closed = this.queue.dropped.load(Ordering::SeqCst)
                        && !this.queue.has_incoming.load(Ordering::SeqCst);
                    if closed && this.live == 0 {
                        return Poll::Ready(());
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn tasks_run_stop_and_can_be_awaited() {
        let driver = Driver::start();
        let (tx, rx) = oneshot::channel();
        let t = driver.spawn(async move {
            let _ = tx.send(7);
        });
        assert_eq!(rx.await.unwrap(), 7);
        t.await;

        let forever = driver.spawn(std::future::pending());
        assert!(!forever.is_finished());
        forever.abort();
        tokio::time::timeout(Duration::from_secs(2), forever)
            .await
            .expect("an aborted task ends");

        let boom = driver.spawn(async { panic!("on purpose") });
        tokio::time::timeout(Duration::from_secs(2), boom)
            .await
            .expect("a panicking task ends, and the driver goes on");
        let (tx, rx) = oneshot::channel();
        driver.spawn(async move {
            let _ = tx.send(());
        });
        rx.await.expect("the driver still runs");
    }

    /// Sets its flag when dropped.
    struct Dropped(Arc<AtomicBool>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// The runtime goes away before the driver task ever ran: the futures
    /// handed to it are dropped and end, and later ones are refused.
    #[test]
    fn a_driver_never_polled_drops_its_futures() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let flag = Arc::new(AtomicBool::new(false));
        let guard = Dropped(flag.clone());
        let (driver, task) = rt.block_on(async {
            let d = Driver::start();
            let t = d.spawn(async move {
                let _g = guard;
                std::future::pending::<()>().await
            });
            (d, t)
        });
        drop(rt);
        assert!(flag.load(Ordering::SeqCst), "a future was leaked");
        assert!(task.is_finished());
        let late_flag = Arc::new(AtomicBool::new(false));
        let late_guard = Dropped(late_flag.clone());
        let late = driver.spawn(async move {
            let _g = late_guard;
        });
        assert!(late.is_finished() && late_flag.load(Ordering::SeqCst));
    }
}
