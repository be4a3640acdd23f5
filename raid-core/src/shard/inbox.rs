//! A shard's inbox: where clients, other shards, the blocking threads and
//! whatever completes timed I/O (the drives' timer, for a wrapper over the
//! simulated drive) give it work, and how a sleeping shard is woken for it.

use super::{answer, call, client, stopping, Job, Request};
use parking_lot::Mutex;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A shard's inbox, shared with clients and whatever completes timed I/O
/// (the drives' timer thread, or the shard itself).
pub(super) struct Inbox {
    pub(super) jobs: Mutex<Vec<Job>>,
    pub(super) sleeping: AtomicBool,
    pub(super) wake: OwnedFd,
    /// Set (under `jobs`' lock) as its shard ends: a job given later is
    /// handled by whoever gives it (`Inbox::closed_job`).
    closed: AtomicBool,
    /// How many front ends its shard runs (`client.rs`), read by the
    /// other shards' clients at each small write to members in memory
    /// that moves four member copies or more, and each long read, that
    /// this shard owns (`Local::idle_owner`).
    fronts: Fronts,
}

/// A count on a cache line of its own: read that often, it must not
/// share a line with `jobs`' lock and `sleeping`, which the shard writes
/// at every turn and givers at every job.
#[repr(align(128))]
#[derive(Default)]
struct Fronts(AtomicUsize);

impl Inbox {
    pub(super) fn new() -> std::io::Result<Inbox> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Inbox {
            jobs: Mutex::new(Vec::new()),
            sleeping: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            fronts: Fronts::default(),
            // SAFETY: `fd` is a descriptor we just opened and own.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Queues `j` and wakes the shard if it sleeps and no one owes it a
    /// wake-up already. One that is owed (by an open `Batch` of another
    /// caller) wakes when that batch ends: `j` waits as long.
    pub(super) fn push(&self, j: Job) {
        if let Err(j) = self.offer(j) {
            Inbox::closed_job(j);
        }
    }

    /// `push`, but a job for a shard that ended comes back, for the giver
    /// to run another way.
    pub(super) fn offer(&self, j: Job) -> std::result::Result<(), Job> {
        if self.try_push(j)? {
            self.ring_bell();
        }
        Ok(())
    }

    /// Queues `j`; true if the shard sleeps and must be woken (by the
    /// caller, which owes it that bell: no one else will ring it, and every
    /// job given meanwhile, by anyone, waits for it). A shard that ended
    /// has `j` handled here (`closed_job`).
    pub(super) fn push_quietly(&self, j: Job) -> bool {
        self.try_push(j).unwrap_or_else(|j| {
            Inbox::closed_job(j);
            false
        })
    }

    /// `push_quietly`, but a job for a shard that ended comes back.
    pub(super) fn try_push(&self, j: Job) -> std::result::Result<bool, Job> {
        let mut jobs = self.jobs.lock();
        if self.closed.load(Ordering::Relaxed) {
            return Err(j);
        }
        jobs.push(j);
        drop(jobs);
        // The shard sets `sleeping` before its last look at the inbox, so
        // either it sees this job or this sees it asleep (SeqCst on both
        // sides, and the inbox lock between them).
        Ok(self.sleeping.swap(false, Ordering::SeqCst))
    }

    /// Closes the inbox as its shard ends (with nothing in flight); returns
    /// what it held, for the shard to hand to `closed_job`. Once shards
    /// stop one after another, a shard still running may give a job to one
    /// that ended: its client's write to a stripe the ended one owns, or
    /// the completion of a request of a client of the ended one, which
    /// another shard or a blocking thread ran.
    pub(super) fn close(&self) -> Vec<Job> {
        let mut jobs = self.jobs.lock();
        self.closed.store(true, Ordering::Relaxed);
        std::mem::take(&mut *jobs)
    }

    /// A job for a shard that ended, handled where it was given: a
    /// completion runs there, a request is answered that the engine is
    /// stopping, a client is dropped. Nothing else can come (the shard
    /// ended with no member I/O or journal record in flight).
    pub(super) fn closed_job(j: Job) {
        match j {
            Job::Call(f) => call(f),
            Job::Request(Request::Read(job)) => answer(job.done, Err(stopping())),
            Job::Request(Request::Write(job)) => answer(job.done, Err(stopping())),
            Job::Client(c) => client::drop_quietly(c),
            Job::Timed(..) | Job::Journaled(..) | Job::Room(_) => {
                tracing::error!("shard: a completion for a shard that ended")
            }
            Job::Stop => {}
        }
    }

    /// Whether its shard runs a front end (`Client`) of its own.
    pub(super) fn has_fronts(&self) -> bool {
        self.fronts.0.load(Ordering::Relaxed) > 0
    }

    /// Its shard now runs `n` front ends (called by that shard only).
    pub(super) fn set_fronts(&self, n: usize) {
        if self.fronts.0.load(Ordering::Relaxed) != n {
            self.fronts.0.store(n, Ordering::Relaxed);
        }
    }

    /// Completes the shard's armed eventfd read.
    pub(super) fn ring_bell(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}
