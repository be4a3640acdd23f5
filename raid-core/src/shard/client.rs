//! Front ends run on a shard's own thread, as SPDK runs an application's
//! pollers on its reactors: a `Client` is polled at each turn of the
//! shard's loop and gives its requests straight to that shard, where a
//! caller on a thread of its own (`Engine::read`, `Engine::write`) hands
//! each one across: into the shard's inbox, with a wake-up, and its
//! completion back out to the caller's thread, with another. Given here,
//! a read crosses no thread of the engine's own (on the simulated drives,
//! none at all: the shard reaps their I/O itself), and its completion runs on the shard,
//! where the client's next poll sees it.
//!
//! Reads are served by the shard the client runs on: a read takes no
//! stripe's ownership (a degraded one takes its stripe's lock, as on any
//! shard). Except a long read from members in memory, copied by the shard
//! owning its first chunk where that one runs no front end of its own
//! (`SPREAD_READ`). A write goes to the shard that owns its stripe (chunk, for
//! RAID0/1/10), which may be another: it crosses to it, as an
//! `Engine::write` does, so that a stripe's writes still meet on one shard.
//! Except on members in memory: there a small write is copied on the
//! client's own shard under its stripe's lock (`inline.rs`), as the
//! crossing would cost more than the copies, unless it moves four member
//! copies or more (RAID5/6, a RAID1 of four) and its owner runs no front
//! end of its own (`Local::idle_owner_of_write`).
//! A request that completes on another thread than its client's shard
//! (that other shard, or the blocking path's) has its completion posted
//! back to the client's shard and run there: the client, which is polled
//! only when its shard turns, sees it then, and its state stays on one
//! thread.

use super::event_loop::Shard;
use super::{Done, Fallback, Inbox, Job, ReadDone, ReadJob, Request, WriteDone, WriteJob};
use crate::array::Array;
use crate::buf::AlignedBuf;
use crossbeam_channel as channel;
use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::Arc;

thread_local! {
    /// The inbox of the shard whose loop runs on this thread (null on
    /// any other thread, and on a `Stepped` shard's caller outside its
    /// turns).
    static ON_SHARD: Cell<*const Inbox> = const { Cell::new(std::ptr::null()) };
    /// Completions that ran to their end inside a client's poll (a write
    /// copied in place), to be called once the poll is over
    /// (`Shard::run_later`): on this thread, without the inbox's lock.
    static LATER: std::cell::RefCell<Vec<Box<dyn FnOnce() + Send>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `done`, run on the shard with inbox `home` after the poll it is called
/// in where it is called there (`LATER`), posted to it otherwise.
fn after_poll<T: Send + 'static>(
    home: &Arc<Inbox>,
    done: Box<dyn FnOnce(T) + Send>,
) -> Box<dyn FnOnce(T) + Send> {
    on_home(home, done, true)
}

/// Calls the completions `after_poll` kept on this thread; how many.
pub(super) fn run_later() -> usize {
    let jobs = LATER.with(|l| std::mem::take(&mut *l.borrow_mut()));
    let n = jobs.len();
    jobs.into_iter().for_each(super::call);
    n
}

/// Marks this thread as the one running the shard with `inbox`.
pub(super) fn running_shard(inbox: &Arc<Inbox>) {
    ON_SHARD.with(|s| s.set(Arc::as_ptr(inbox)));
}

/// Runs `f` with this thread marked as running the shard with `inbox`
/// (a `Stepped` shard's turn, on its caller's thread).
pub(super) fn on_shard<R>(inbox: &Arc<Inbox>, f: impl FnOnce() -> R) -> R {
    /// Puts the mark back, a panic in the turn too (a stale mark would
    /// name an inbox that may be freed and its address reused).
    struct Restore(*const Inbox);
    impl Drop for Restore {
        fn drop(&mut self) {
            ON_SHARD.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(ON_SHARD.with(|s| s.replace(Arc::as_ptr(inbox))));
    f()
}

/// Drops a client; a panic in its drop is logged, and must not unwind
/// through a shard.
pub(super) fn drop_quietly(c: Box<dyn Client>) {
    let drop_it = std::panic::AssertUnwindSafe(move || drop(c));
    if std::panic::catch_unwind(drop_it).is_err() {
        tracing::error!("shard: a client panicked as it was dropped");
    }
}

/// `done`, run on the shard with inbox `home`: at once where it is called
/// there, posted to it otherwise.
fn at_home<T: Send + 'static>(
    home: &Arc<Inbox>,
    done: Box<dyn FnOnce(T) + Send>,
) -> Box<dyn FnOnce(T) + Send> {
    on_home(home, done, false)
}

/// `done`, run on the shard with inbox `home`: posted there from another
/// thread; there, at once or (`after_poll`) once the poll is over.
fn on_home<T: Send + 'static>(
    home: &Arc<Inbox>,
    done: Box<dyn FnOnce(T) + Send>,
    after_poll: bool,
) -> Box<dyn FnOnce(T) + Send> {
    let home = home.clone();
    Box::new(move |r| {
        if ON_SHARD.with(|s| s.get()) != Arc::as_ptr(&home) {
            return home.push(Job::Call(Box::new(move || done(r))));
        }
        match after_poll {
            true => LATER.with(|l| l.borrow_mut().push(Box::new(move || done(r)))),
            false => done(r),
        }
    })
}

/// A front end that runs on a shard's thread (`Engine::run_client`).
///
/// Its completions (the `done` of each request it gives) run on the same
/// thread, between its polls (but see `poll` for the engine's stop): they
/// should note what they need where the client sees it (a queue it shares
/// with them) and return. A client that
/// waits (for a lock another thread holds, a socket) holds up every
/// request on its shard.
///
/// Like a completion (`ReadDone`), it must not hold the last handle to
/// the `Engine`: dropping that joins the shard's thread, which would be
/// the thread dropping it.
pub trait Client: Send {
    /// Called when it joins its shard and then after each pass of the
    /// shard's loop, once the completions that pass reaped have run (a
    /// turn makes passes until nothing moves): the shard turns when a
    /// member I/O, a request or a completion arrives, and sleeps when none
    /// did, so a client that has nothing in flight may not be polled again
    /// until its shard turns for something else.
    /// Returns false when the client is finished: it is dropped, on the
    /// shard's thread. Requests it gave still complete; where the engine
    /// stops meanwhile, their completions may run on whichever thread
    /// ends them, or be answered that the engine is stopping.
    fn poll(&mut self, io: &mut Local<'_>) -> bool;
}

/// The shard a client runs on, for the requests it gives.
pub struct Local<'a> {
    pub(super) shard: &'a mut Shard,
    /// Requests given during this poll.
    pub(super) given: usize,
}

impl Local<'_> {
    /// Reads `buf.len()` bytes at `offset`, as `Engine::read` (but never
    /// copied in the caller's place: members in memory are copied by the
    /// shard, as its own turn), on this shard, or on the shard that owns
    /// its first chunk where that one runs no front end of its own and the
    /// read is a long copy from members in memory (`SPREAD_READ`); `done`
    /// runs on this shard's thread (as `Client` says).
    pub fn read(&mut self, offset: u64, buf: AlignedBuf, done: ReadDone) {
        self.given += 1;
        let done = at_home(&self.shard.inbox, done);
        let array = &self.shard.array;
        let to = (buf.len() >= SPREAD_READ && array.any_in_memory())
            .then(|| offset / array.geometry().chunk)
            .and_then(|chunk| self.idle_owner(chunk));
        self.give(to, Request::Read(ReadJob { offset, buf, done }));
    }

    /// Writes `data` at `offset`, as `Engine::write`, on the shard that
    /// owns its stripe, or here (a small write to members in memory);
    /// `done` runs on this shard's thread (as `Client` says), never inside
    /// this poll.
    pub fn write(&mut self, offset: u64, data: AlignedBuf, done: WriteDone) {
        self.write_as(offset, data, false, done)
    }

    /// `write`, with FUA (`Engine::write_fua`): on its shard, never here.
    pub fn write_fua(&mut self, offset: u64, data: AlignedBuf, done: WriteDone) {
        self.write_as(offset, data, true, done)
    }

    fn write_as(&mut self, offset: u64, data: AlignedBuf, fua: bool, done: WriteDone) {
        self.given += 1;
        // A small write to members in memory runs here, as
        // `Engine::write` runs it on its caller's thread (`inline.rs`),
        // rather than crossing to its owner and back, unless its owner
        // is another shard with no front end of its own, whose core this
        // one's clients leave idle (`idle_owner_of_write`).
        let shard = &*self.shard;
        let in_memory = shard.array.any_in_memory();
        let idle = in_memory
            .then(|| self.idle_owner_of_write(offset, data.len()))
            .flatten();
        if !in_memory || idle.is_some() || fua {
            let to = idle.or_else(|| self.owner_of_write(offset));
            let done = at_home(&shard.inbox, done);
            return self.give(to, Request::Write(WriteJob::new(offset, data, fua, done)));
        }
        let posted = after_poll(&shard.inbox, done);
        if let Err((data, done)) =
            super::inline::write_here(&shard.array, &shard.blocking, offset, data, posted)
        {
            let to = self.owner_of_write(offset);
            self.give(to, Request::Write(WriteJob::new(offset, data, false, done)))
        }
    }

    /// The shard that owns the write at `offset` (`write_owner`).
    fn owner_of_write(&self, offset: u64) -> Option<usize> {
        write_owner(&self.shard.array, offset, self.shard.peers.len())
    }

    /// The shard that owns the write of `len` bytes at `offset`, where it
    /// moves four member copies or more (a RAID5/6 read-modify-write, a
    /// RAID1 of four) and that shard is another that runs no front end of
    /// its own: there its copies use a core this shard's clients leave
    /// idle. Through NBD on tmpfs members, one connection on two shards, 4
    /// KiB random writes: RAID5 1.11-1.30x, RAID6 1.07-1.13x, RAID1 of
    /// four 1.12-1.16x. Fewer copies cost less than the crossing to the
    /// owner and back (RAID0: 0.93-0.96x; RAID10, two: 1.01x). Where every
    /// shard runs front ends each is busy with its own, and copying here
    /// saves the crossing (four connections on two shards: 0.74x when
    /// they crossed).
    fn idle_owner_of_write(&self, offset: u64, len: usize) -> Option<usize> {
        let array = &self.shard.array;
        let many = super::inline::member_bytes(&array.geometry(), len) >= 4 * len;
        let key = array.write_lock_key(offset).filter(|_| many)?;
        self.idle_owner(key)
    }

    /// The shard that owns `key` (a chunk, or a write's stripe), where it
    /// is another than this one and runs no front end of its own.
    fn idle_owner(&self, key: u64) -> Option<usize> {
        let peers = &self.shard.peers;
        super::owner(key, peers.len()).filter(|&i| i != self.shard.index && !peers[i].has_fronts())
    }

    /// Gives `job` to shard `to`, or runs it on this shard where `to` is
    /// this one or none, or where that shard ended (the engine is
    /// stopping, and it holds no stripe): then it starts after this poll,
    /// so that no completion runs inside it.
    fn give(&mut self, to: Option<usize>, job: Request) {
        if let Some(job) = self.shard.give_to_peer(to, job) {
            self.shard.waiting.push_back(job);
        }
    }

    /// `Engine::flush`: `done` runs on this shard's thread (as `Client`
    /// says).
    pub fn flush(&mut self, done: Done) {
        self.given += 1;
        let done = at_home(&self.shard.inbox, done);
        if let Err(channel::SendError(done)) = self.shard.blocking.flusher.send(done) {
            super::answer(done, Err(super::stopping()));
        }
    }

    /// `Engine::write_zeroes`: `done` runs on this shard's thread (as
    /// `Client` says).
    pub fn write_zeroes(&mut self, offset: u64, len: u64, done: Done) {
        self.given += 1;
        let done = at_home(&self.shard.inbox, done);
        self.shard
            .blocking
            .send(Fallback::Zeroes { offset, len, done });
    }

    /// Polls `fd` once for `events` (`libc::POLLIN`, `POLLOUT`) on this
    /// shard's ring: when it is ready (or shut, or in error), the shard
    /// turns, and the client's next poll finds `fired(token)` true. For a
    /// client that waits for a socket: without it, a client is polled only
    /// when its shard turns for something else. `token` (below 2^62) names
    /// the poll among this shard's clients' (a file descriptor, say); one
    /// poll per token at a time, the client re-arming it once it fired.
    pub fn watch(&mut self, fd: RawFd, events: u32, token: u64) {
        self.shard.watch(fd, events, token)
    }

    /// Whether the poll named `token` fired since the last poll of the
    /// clients (true once per firing).
    pub fn fired(&mut self, token: u64) -> bool {
        match self.shard.fired.iter().position(|&t| t == token) {
            Some(i) => {
                self.shard.fired.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// A handle another thread runs closures on this shard with (a front
    /// end's work that must wait, such as a lock held for a long time, run
    /// elsewhere and its outcome brought back).
    pub fn home(&self) -> Home {
        Home(self.shard.inbox.clone())
    }

    /// Which of the engine's shards this is (0 to `Engine::shard_count`).
    pub fn shard(&self) -> usize {
        self.shard.index
    }
}

/// A shard, for another thread to run a closure on (`Local::home`).
#[derive(Clone)]
pub struct Home(Arc<Inbox>);

impl Home {
    /// Runs `f` on the shard's thread at its next turn (waking it), after
    /// which its clients are polled; on this thread where the shard ended.
    pub fn call(&self, f: impl FnOnce() + Send + 'static) {
        self.0.push(Job::Call(Box::new(f)));
    }

    /// Whether this thread is the one running the shard (its loop, or its
    /// turn on a `Stepped` shard's caller).
    pub fn is_current(&self) -> bool {
        ON_SHARD.with(|s| s.get()) == Arc::as_ptr(&self.0)
    }
}

/// The shard of `shards` that runs the writes at `offset`: a RAID5/6
/// stripe's writes go to one shard, which holds its lock for each in turn
/// and queues the others behind it; other levels spread by chunk. None
/// where there is no shard.
pub(super) fn write_owner(array: &Array, offset: u64, shards: usize) -> Option<usize> {
    let key = array
        .write_lock_key(offset)
        .unwrap_or(offset / array.geometry().chunk);
    super::owner(key, shards)
}

impl Shard {
    /// Gives `job` to shard `to` where that is another shard, and it takes
    /// it; else hands it back to be run on this one (`to` is this shard or
    /// none, or that shard ended: the engine is stopping).
    pub(super) fn give_to_peer(&self, to: Option<usize>, job: Request) -> Option<Request> {
        match to.filter(|&i| i != self.index) {
            Some(i) => match self.peers[i].offer(Job::Request(job)) {
                Ok(()) => None,
                Err(Job::Request(job)) => Some(job),
                Err(_) => unreachable!("given back as given"),
            },
            None => Some(job),
        }
    }

    /// Drops every client (the engine stops); their requests in flight
    /// still complete.
    pub(super) fn drop_clients(&mut self) {
        for c in self.clients.drain(..) {
            drop_quietly(c);
        }
    }

    /// Polls every client once; returns how many requests they gave. A
    /// client that panics is dropped (the panic must not unwind through
    /// the shard, whose ring may hold I/Os into its requests' buffers).
    pub(super) fn poll_clients(&mut self) -> usize {
        if self.clients.is_empty() {
            return 0;
        }
        let mut clients = std::mem::take(&mut self.clients);
        let mut local = Local {
            shard: self,
            given: 0,
        };
        let mut i = 0;
        while i < clients.len() {
            let poll = std::panic::AssertUnwindSafe(|| clients[i].poll(&mut local));
            let goes_on = std::panic::catch_unwind(poll).unwrap_or_else(|_| {
                tracing::error!("shard: a client panicked; it is dropped");
                false
            });
            match goes_on {
                true => i += 1,
                false => drop_quietly(clients.swap_remove(i)),
            }
        }
        let given = local.given;
        // A client joins through the inbox, which is not read meanwhile:
        // none joined.
        debug_assert!(self.clients.is_empty());
        self.inbox.set_fronts(clients.len());
        self.clients = clients;
        given
    }
}

/// Bytes from which a client's read from members in memory is copied by
/// the shard that owns its first chunk, where that shard runs no front end
/// of its own (its core otherwise idle). Through NBD on tmpfs members, one
/// connection on two shards: 128 KiB reads 1.14-1.17x (RAID0, RAID5, three
/// runs); 64 KiB reads 0.99-1.12x and 4 KiB reads 0.67-0.69x, whose copies
/// cost less than the crossing to the other shard and back.
const SPREAD_READ: usize = 128 << 10;

/// The inboxes of an engine's shards, by index, that a shard's clients
/// send writes to.
pub(super) type Peers = Arc<Vec<Arc<Inbox>>>;
