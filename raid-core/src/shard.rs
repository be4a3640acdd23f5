//! The first piece of the asynchronous data path (`docs/architecture.md`,
//! "shards and completions"): reads answered through a completion, many
//! in flight per thread, on shards that each run an event loop over their
//! own io_uring.
//!
//! A read inside one chunk whose member is readable (the common 4 KiB
//! read) is served by a shard without a thread waiting for it: on a
//! member with a file descriptor it is a read SQE on the shard's ring; on
//! a member that completes I/O at a time of its own (the simulated drive:
//! `Member::read_timed`) it is started and its completion posted back to
//! the shard. Every other read (across chunks, degraded, on a member that
//! can do neither, or one whose member erred) goes to a small pool of
//! threads running the blocking `Array::read`, so each rule of the read
//! path (reconstruction, failing a member, membership changes) stays in
//! one place.
//!
//! Writes, rebuild and scrub still run on the blocking engine: their move
//! to shards (stripe ownership instead of the lock table) is the next
//! step. Reads take no stripe lock on either path, so the two engines
//! serve one array side by side.
//!
//! A shard's loop, from its inbox (jobs from clients, completions from
//! the simulated drives' timer thread) and its ring's completions, never
//! blocks on anything but the ring: a sleeping shard is woken by an
//! eventfd read it keeps armed on the ring, written only when it sleeps.

use crate::array::{Array, ArrayError};
use crate::buf::AlignedBuf;
use crate::member::{io_path, IoPath, MemberRef};
use crate::stats::Started;
use io_uring::{opcode, types, IoUring};
use parking_lot::Mutex;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

/// What a read hands back: its buffer (exactly the length asked), or why
/// it failed.
pub type ReadResult = std::result::Result<AlignedBuf, ArrayError>;
/// Called once when a read completes, on a shard's thread or a fallback
/// thread: it should hand the result on and return, not block, and must
/// not drop the last handle to the `Engine` (its drop joins that thread).
pub type ReadDone = Box<dyn FnOnce(ReadResult) + Send>;

/// Ring entries per shard: reads in flight on a shard's ring at once
/// (more wait in its inbox).
const RING: u32 = 256;
/// Threads running reads the shards do not serve themselves.
const FALLBACK_THREADS: usize = 8;
/// user_data of the eventfd read that wakes a sleeping shard.
const WAKE: u64 = u64::MAX;

/// How many reads the shards served themselves, and how many they sent
/// to the blocking path.
#[derive(Default, Debug)]
pub struct Counts {
    pub on_shards: AtomicU64,
    pub blocking: AtomicU64,
}

/// Shards serving one array's reads.
pub struct Engine {
    array: Arc<Array>,
    counts: Arc<Counts>,
    shards: Vec<Arc<Inbox>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    fallback: Option<mpsc::Sender<Fallback>>,
}

struct ReadJob {
    offset: u64,
    len: usize,
    done: ReadDone,
}

/// A read for the blocking path; `failed`: the member that erred on the
/// shard's attempt, to be failed first.
struct Fallback {
    job: ReadJob,
    failed: Option<(usize, MemberRef, std::io::Error)>,
}

enum Job {
    Read(ReadJob),
    /// A `read_timed` read (its slab key) reached its completion time.
    Timed(usize),
    Stop,
}

/// A shard's inbox, shared with clients and the timer thread.
struct Inbox {
    jobs: Mutex<Vec<Job>>,
    sleeping: AtomicBool,
    wake: OwnedFd,
}

impl Inbox {
    fn push(&self, j: Job) {
        self.jobs.lock().push(j);
        // The shard sets `sleeping` before its last look at the inbox, so
        // either it sees this job or this sees it asleep (SeqCst on both
        // sides, and the inbox lock between them).
        if self.sleeping.swap(false, Ordering::SeqCst) {
            self.ring_bell();
        }
    }

    /// Completes the shard's armed eventfd read.
    fn ring_bell(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

impl Engine {
    /// Starts `shards` shards (at least one) and the fallback threads.
    pub fn start(array: Arc<Array>, shards: usize) -> std::io::Result<Engine> {
        // Every shard's eventfd and ring first: a machine without io_uring
        // fails here, with nothing started.
        let mut parts = Vec::new();
        for _ in 0..shards.max(1) {
            // SAFETY: eventfd returns a new descriptor or -1.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let inbox = Arc::new(Inbox {
                jobs: Mutex::new(Vec::new()),
                sleeping: AtomicBool::new(false),
                // SAFETY: `fd` is a descriptor we just opened and own.
                wake: unsafe { OwnedFd::from_raw_fd(fd) },
            });
            parts.push((inbox, IoUring::new(RING + 1)?));
        }
        let (ftx, frx) = mpsc::channel::<Fallback>();
        let frx = Arc::new(Mutex::new(frx));
        let counts = Arc::new(Counts::default());
        let mut engine = Engine {
            array: array.clone(),
            counts: counts.clone(),
            shards: Vec::new(),
            threads: Vec::new(),
            fallback: Some(ftx.clone()),
        };
        for i in 0..FALLBACK_THREADS {
            let (a, rx) = (array.clone(), frx.clone());
            engine.threads.push(
                std::thread::Builder::new()
                    .name(format!("read-fallback-{i}"))
                    .spawn(move || fallback_loop(&a, &rx))?,
            );
        }
        for (i, (inbox, ring)) in parts.into_iter().enumerate() {
            let shard = Shard {
                array: array.clone(),
                inbox: inbox.clone(),
                ring,
                slab: Vec::new(),
                free: Vec::new(),
                waiting: Default::default(),
                on_ring: 0,
                fallback: ftx.clone(),
                counts: counts.clone(),
                wake_buf: Box::new(0),
                armed: false,
            };
            // On an error here, dropping `engine` stops what started.
            engine.threads.push(
                std::thread::Builder::new()
                    .name(format!("shard-{i}"))
                    .spawn(move || shard.run())?,
            );
            engine.shards.push(inbox);
        }
        Ok(engine)
    }

    /// Reads served so far, by path.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Reads `len` bytes at `offset` (4 KiB aligned, inside the array);
    /// `done` gets the data or the error. Returns at once.
    pub fn read(&self, offset: u64, len: usize, done: ReadDone) {
        let chunk = offset / self.array.geometry().chunk;
        let shard = &self.shards[(chunk % self.shards.len() as u64) as usize];
        shard.push(Job::Read(ReadJob { offset, len, done }));
    }
}

impl Drop for Engine {
    /// Stops the shards once the reads they hold completed, then the
    /// fallback threads once theirs did.
    fn drop(&mut self) {
        for s in &self.shards {
            s.push(Job::Stop);
        }
        let n = self.threads.len();
        let shard_threads: Vec<_> = self.threads.drain(FALLBACK_THREADS.min(n)..n).collect();
        for t in shard_threads {
            let _ = t.join();
        }
        drop(self.fallback.take());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Runs a caller's `done`: a panic in it is the caller's, and must not
/// unwind through a shard (whose ring may hold reads into its buffers) or
/// end a fallback thread.
fn answer(done: ReadDone, r: ReadResult) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(r))).is_err() {
        tracing::error!("shard: a read's completion callback panicked");
    }
}

fn fallback_loop(array: &Array, rx: &Mutex<mpsc::Receiver<Fallback>>) {
    loop {
        let f = match rx.lock().recv() {
            Ok(f) => f,
            Err(_) => return,
        };
        if let Some((slot, m, e)) = &f.failed {
            array.direct_read_failed(*slot, m, e);
        }
        let mut buf = AlignedBuf::new(f.job.len);
        let r = array.read(f.job.offset, &mut buf).map(|()| buf);
        answer(f.job.done, r);
    }
}

/// A read in flight on a shard.
struct InFlight {
    job: ReadJob,
    buf: AlignedBuf,
    /// The member table the read was planned on: keeps its device open.
    handles: Arc<Vec<MemberRef>>,
    slot: usize,
    started: Started,
}

struct Shard {
    array: Arc<Array>,
    inbox: Arc<Inbox>,
    ring: IoUring,
    /// Reads in flight, by key (the ring's user_data, or the key a timed
    /// read's completion posts back).
    slab: Vec<Option<InFlight>>,
    free: Vec<usize>,
    /// Reads that found the ring full, in arrival order.
    waiting: std::collections::VecDeque<ReadJob>,
    on_ring: u32,
    fallback: mpsc::Sender<Fallback>,
    counts: Arc<Counts>,
    /// Where the eventfd read lands: boxed, so it does not move while the
    /// kernel holds its address.
    wake_buf: Box<u64>,
    armed: bool,
}

impl Drop for Shard {
    /// A shard that ends with reads or its wake-up read still on the ring
    /// (only by a panic in its own code) leaks their buffers: the kernel
    /// may still write into them after the ring is closed.
    fn drop(&mut self) {
        if self.on_ring > 0 || self.armed {
            std::mem::forget(std::mem::take(&mut self.slab));
            std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new(0)));
        }
    }
}

impl Shard {
    fn run(mut self) {
        let mut stopping = false;
        loop {
            let jobs = std::mem::take(&mut *self.inbox.jobs.lock());
            for j in jobs {
                match j {
                    // In arrival order, behind any read waiting for room.
                    Job::Read(r) => self.waiting.push_back(r),
                    Job::Timed(k) => self.finish(k, Ok(())),
                    Job::Stop => stopping = true,
                }
            }
            // Until nothing moves: reap what completed, start what waits
            // while the ring has room, and submit (reads on files in the
            // page cache complete inside the submission).
            loop {
                let reaped = self.reap();
                let mut started = 0;
                while self.on_ring < RING {
                    let Some(r) = self.waiting.pop_front() else {
                        break;
                    };
                    self.start(r);
                    started += 1;
                }
                self.submit();
                if reaped == 0 && started == 0 {
                    break;
                }
            }
            let busy = self.slab.len() > self.free.len();
            if stopping && !busy && self.waiting.is_empty() {
                return self.disarm_wake();
            }
            if !self.inbox.jobs.lock().is_empty() {
                continue;
            }
            // Nothing to do now (what waits, waits for the ring's room):
            // sleep in the ring until a completion or a wake-up.
            self.arm_wake();
            self.inbox.sleeping.store(true, Ordering::SeqCst);
            if !self.inbox.jobs.lock().is_empty() {
                self.inbox.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            self.enter(1);
            self.inbox.sleeping.store(false, Ordering::SeqCst);
        }
    }

    /// Submits what is queued on the ring, waiting for `want` completions.
    fn enter(&mut self, want: usize) {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    // The completion queue is full: the caller reaps.
                    return;
                }
                Err(e) => {
                    tracing::error!("shard: io_uring_enter: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    return;
                }
            }
        }
    }

    fn submit(&mut self) {
        if !self.ring.submission().is_empty() {
            self.enter(0);
        }
    }

    /// At the end: the eventfd read must not outlive `wake_buf`, so it is
    /// completed (by a write of our own) and reaped before the shard goes.
    fn disarm_wake(&mut self) {
        while self.armed {
            self.inbox.ring_bell();
            self.enter(1);
            self.reap();
        }
    }

    /// Keeps one read of the eventfd on the ring.
    fn arm_wake(&mut self) {
        if self.armed {
            return;
        }
        let e = opcode::Read::new(
            types::Fd(self.inbox.wake.as_raw_fd()),
            (&mut *self.wake_buf as *mut u64).cast(),
            8,
        )
        .build()
        .user_data(WAKE);
        // SAFETY: `wake_buf` is boxed; the shard completes this read
        // before it ends (`disarm_wake`), or leaks the buffer if it ends
        // otherwise (`Drop for Shard`).
        for _ in 0..2 {
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                self.armed = true;
                return;
            }
            // The submission queue is full: send it, then there is room.
            self.enter(0);
        }
        tracing::error!("shard: no room on the ring for its wake-up read");
    }

    fn key(&mut self, f: InFlight) -> usize {
        match self.free.pop() {
            Some(k) => {
                self.slab[k] = Some(f);
                k
            }
            None => {
                self.slab.push(Some(f));
                self.slab.len() - 1
            }
        }
    }

    /// Starts a read: on the ring, as a timed read, or on the blocking path.
    fn start(&mut self, job: ReadJob) {
        let Some((handles, slot, at)) = self.array.direct_read(job.offset, job.len as u64) else {
            return self.to_fallback(job, None);
        };
        let m = handles[slot].clone();
        let on_ring = m.uring_fd().is_some() && io_path() == IoPath::IoUring;
        if on_ring && self.on_ring >= RING {
            return self.waiting.push_back(job);
        }
        let mut f = InFlight {
            buf: AlignedBuf::new(job.len),
            job,
            handles,
            slot,
            started: Started::now(),
        };
        if on_ring {
            let fd = m.uring_fd().expect("checked");
            let (ptr, len) = (f.buf.as_mut_ptr(), f.buf.len() as u32);
            let k = self.key(f);
            let e = opcode::Read::new(types::Fd(fd), ptr, len)
                .offset(at)
                .build()
                .user_data(k as u64);
            // SAFETY: the buffer is owned by the slab entry `k` (its heap
            // memory does not move) and freed only after this read's
            // completion is reaped; the fd stays open through the member
            // handles held with it.
            if unsafe { self.ring.submission().push(&e) }.is_err() {
                let f = self.slab[k].take().expect("just put");
                self.free.push(k);
                return self.waiting.push_back(f.job);
            }
            self.on_ring += 1;
            return;
        }
        // A member that completes on its own time, or the blocking path.
        let inbox = self.inbox.clone();
        let buf: *mut [u8] = &mut f.buf[..];
        let k = self.key(f);
        // SAFETY: `buf` points into the slab entry's buffer, alive until
        // `finish(k)`; read_timed copies into it before returning.
        let started = m.read_timed(
            unsafe { &mut *buf },
            at,
            Box::new(move || inbox.push(Job::Timed(k))),
        );
        match started {
            Some(Ok(())) => {}
            Some(Err(e)) => self.finish(k, Err(e)),
            None => {
                let f = self.slab[k].take().expect("just put");
                self.free.push(k);
                self.to_fallback(f.job, None);
            }
        }
    }

    fn to_fallback(&self, job: ReadJob, failed: Option<(usize, MemberRef, std::io::Error)>) {
        self.counts.blocking.fetch_add(1, Ordering::Relaxed);
        if let Err(mpsc::SendError(f)) = self.fallback.send(Fallback { job, failed }) {
            answer(
                f.job.done,
                Err(ArrayError::Invalid(
                    "the array's read engine is stopping".into(),
                )),
            );
        }
    }

    /// Reaps the ring's completions; returns how many reads ended.
    fn reap(&mut self) -> usize {
        let done: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        let mut ended = 0;
        for (k, res) in done {
            if k == WAKE {
                self.armed = false;
                continue;
            }
            ended += 1;
            self.on_ring -= 1;
            let k = k as usize;
            let want = self.slab[k].as_ref().map_or(0, |f| f.buf.len());
            if res >= 0 && res as usize != want {
                // A short read says nothing against the member: the
                // blocking path reads it whole.
                let f = self.slab[k].take().expect("a read in flight");
                self.free.push(k);
                self.to_fallback(f.job, None);
                continue;
            }
            let r = if res < 0 {
                Err(std::io::Error::from_raw_os_error(-res))
            } else {
                Ok(())
            };
            self.finish(k, r);
        }
        ended
    }

    /// A read reached its end: counted, answered, or sent to the blocking
    /// path after failing its member.
    fn finish(&mut self, k: usize, r: std::io::Result<()>) {
        let f = self.slab[k].take().expect("a read in flight");
        self.free.push(k);
        let m = &f.handles[f.slot];
        self.array
            .count_direct_read(m.as_ref(), f.buf.len(), f.started, r.is_ok());
        match r {
            Ok(()) => {
                self.counts.on_shards.fetch_add(1, Ordering::Relaxed);
                answer(f.job.done, Ok(f.buf));
            }
            Err(e) => {
                let m = m.clone();
                self.to_fallback(f.job, Some((f.slot, m, e)));
            }
        }
    }
}
