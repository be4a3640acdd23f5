//! The engine's fallback pool: the threads that run requests on the
//! blocking path (every request where there is no io_uring; a request to a
//! member the shards cannot serve; work a shard hands over, such as a
//! degraded write's journal record). Each waits for a member with one
//! request, so the pool's size is the queue depth of what it serves.
//!
//! It starts at what the members need (`fallback_threads`: a few where the
//! shards serve every member, one per request a device may hold
//! otherwise) and grows, up to `threads_waiting_on_devices`, while a
//! member the shards cannot serve (a network member) is in the array and
//! requests wait with every thread busy. Such a member can join after the
//! start, by a hot replace or a rebuild onto it: before, the array's I/O
//! to it then went a few requests at a time for the rest of the run. The
//! pool does not shrink: the threads it grew sleep on the queue until the
//! engine stops.

use super::event_loop;
use super::{run_blocking, Fallback};
use crate::array::Array;
use crossbeam_channel as channel;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

pub(super) struct Pool {
    array: Arc<Array>,
    rx: channel::Receiver<Fallback>,
    /// Threads started (grown by `grow`, never lowered but by a failed
    /// spawn).
    threads: AtomicUsize,
    /// Threads running a request.
    busy: AtomicUsize,
    /// Threads it may grow to: lowered to what it has when a thread
    /// cannot be started, so that it stops trying.
    max: AtomicUsize,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    /// A pool taking requests from `rx`, with no thread yet (`add`), able
    /// to grow to `max`. It ends once every sender of `rx` is dropped
    /// (`join`).
    pub fn new(array: Arc<Array>, rx: channel::Receiver<Fallback>, max: usize) -> Arc<Pool> {
        Arc::new(Pool {
            array,
            rx,
            threads: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            max: AtomicUsize::new(max),
            handles: Mutex::new(Vec::new()),
        })
    }

    /// Starts one thread, whatever the pool's state (its first ones).
    pub fn add(self: &Arc<Self>) -> std::io::Result<()> {
        let i = self.threads.fetch_add(1, Ordering::SeqCst);
        self.spawn(i).inspect_err(|_| {
            self.threads.fetch_sub(1, Ordering::SeqCst);
        })
    }

    /// Threads started so far.
    pub fn threads(&self) -> usize {
        self.threads.load(Ordering::Relaxed)
    }

    /// Starts one more thread where a request waits with every thread
    /// busy, the pool may grow, and a member the shards cannot serve is
    /// in the array (where they serve every member, the pool's few
    /// threads only run short work, and more would only share the cores).
    /// Called as a request is queued and as a thread takes one, so that a
    /// burst queued faster than threads wake still grows the pool; that
    /// thread (a shard's, a requester's, a pool thread) pays for the check
    /// of the members and the spawn, at most once per thread the pool
    /// gains, and only while it is saturated. A panic
    /// in it (a member's bug, met through `every_member`) is logged, not
    /// passed to the caller: a shard's loop or a request in hand.
    pub fn grow(self: &Arc<Self>) {
        let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.try_grow()));
        if tried.is_err() {
            tracing::error!("array I/O engine: growing the fallback pool panicked");
        }
    }

    fn try_grow(self: &Arc<Self>) {
        let n = self.threads.load(Ordering::SeqCst);
        // SeqCst with the increment in `run`: a thread that took a request
        // and a caller that queued one cannot both miss the other.
        if n >= self.max.load(Ordering::Acquire)
            || self.busy.load(Ordering::SeqCst) < n
            || self.rx.is_empty()
        {
            return;
        }
        if self.array.every_member(event_loop::non_blocking) {
            return;
        }
        if self
            .threads
            .compare_exchange(n, n + 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            // Another caller grew it just now.
            return;
        }
        match self.spawn(n) {
            Ok(()) => tracing::debug!(threads = n + 1, "array I/O engine: fallback pool grew"),
            Err(e) => {
                self.threads.fetch_sub(1, Ordering::SeqCst);
                // Said once: the pool stays at what it has.
                if self.max.swap(n, Ordering::AcqRel) > n {
                    tracing::warn!(
                        "array I/O engine: cannot grow the fallback pool past {n} threads: {e}"
                    );
                }
            }
        }
    }

    fn spawn(self: &Arc<Self>, i: usize) -> std::io::Result<()> {
        let p = self.clone();
        let h = std::thread::Builder::new()
            .name(format!("io-fallback-{i}"))
            .spawn(move || p.run())?;
        self.handles.lock().push(h);
        Ok(())
    }

    fn run(self: Arc<Self>) {
        while let Ok(f) = self.rx.recv() {
            self.busy.fetch_add(1, Ordering::SeqCst);
            self.grow();
            run_blocking(&self.array, f);
            self.busy.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Joins every thread; the senders must be gone (each thread ends when
    /// the queue is closed and empty).
    pub fn join(&self) {
        // Until none is left: a thread draining the last requests may
        // have grown the pool while the others were joined.
        loop {
            let handles = std::mem::take(&mut *self.handles.lock());
            if handles.is_empty() {
                return;
            }
            for h in handles {
                let _ = h.join();
            }
        }
    }
}
