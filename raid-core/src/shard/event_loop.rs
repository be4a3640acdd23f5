//! A shard: one thread, its own io_uring, and the requests in flight on
//! it. The loop, from its inbox (requests from clients, completions of
//! timed I/O, the journal's word on a record), its ring's completions and
//! its due I/Os whose time has come (`Member::start_due`), sleeps only in
//! the ring (no later than the soonest due I/O), and otherwise waits only for locks held for
//! short stretches (the stripe lock table's, the journal's state, whose
//! holders give it up for their I/O): a sleeping shard is
//! woken by an eventfd read it keeps armed on the ring, written only when
//! it sleeps.
//!
//! Each request in flight has a key in the slab; a member I/O's ring
//! user_data (or the value a timed I/O posts back, or a due I/O's place
//! in `due`) is the key and the I/O's index within its request (`ud`).

use super::client::{Client, Peers};
use super::ops::Op;
use super::{Blocking, Inbox, Job, Request, WriteJob};
use crate::array::{Array, LocalArray};
use crate::member::{on_ring, rw_entry, IoKind, IoOp, Member, MemberRef};
use io_uring::{opcode, squeue, types, IoUring};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Ring entries per shard, and the member I/Os in flight on its ring at
/// which it starts no new request (those wait in its inbox). A write's
/// later steps, and a degraded read (one read per member of the stripe,
/// where it was counted for one per chunk asked), may go past it: their
/// entries wait in `overflow` for room in the submission queue.
pub(super) const RING: u32 = 256;
/// Passes in which clients gave requests after which a turn of a shard
/// its caller turns (`Stepped`) ends, where something still moves: a
/// client that gives a request per completion on members that complete at
/// once would otherwise hold the turn for ever.
const CALLER_PASSES: usize = 64;
/// user_data of the eventfd read that wakes a sleeping shard.
const WAKE: u64 = u64::MAX;
/// The bit of user_data that marks a client's poll of a file
/// (`Local::watch`), its token in the bits below: a request's key never
/// reaches it (a slab of 2^46 requests).
const POLL: u64 = 1 << 62;
/// Bits of user_data that hold the I/O's index within its request.
const SUB_BITS: u32 = 16;
/// Most member I/Os one request may have in flight (its index must fit
/// in `SUB_BITS`, and its entries on the ring): a read of more chunks
/// takes the blocking path.
pub(super) const MAX_IOS: usize = RING as usize;
/// The result of an I/O the member could not start (no ring, no timed
/// I/O): says nothing against the member. A read so ended goes to the
/// blocking path; a write step cannot meet it (its members are asked
/// first), and if one did, the write would count as not in place.
pub(super) const NOT_SERVED: i32 = i32::MIN;

/// How a member I/O ended, from its result (`res` as in
/// `Shard::complete`) and the bytes it still had to move.
pub(super) enum IoEnd {
    /// It moved all its bytes.
    Done,
    /// It moved these, fewer than it had to: the rest goes again.
    Short(usize),
    Failed(std::io::Error),
    /// It moved nothing, or its member could not start it: nothing said
    /// against the member.
    Nothing,
}

pub(super) fn io_end(res: Option<i32>, left: usize) -> IoEnd {
    match res {
        None => IoEnd::Done,
        Some(0) | Some(NOT_SERVED) => IoEnd::Nothing,
        Some(r) if r < 0 => IoEnd::Failed(std::io::Error::from_raw_os_error(-r)),
        Some(r) if (r as usize) < left => IoEnd::Short(r as usize),
        Some(_) => IoEnd::Done,
    }
}

/// The user_data of I/O `sub` of the request with slab key `key`.
pub(super) fn ud(key: usize, sub: usize) -> u64 {
    ((key as u64) << SUB_BITS) | sub as u64
}

/// Whether a shard can run member I/O on `m` without blocking (a copy in
/// memory counts: it may wait for a page to be reclaimed or swapped in,
/// never for a device's queue).
pub(super) fn non_blocking(m: &dyn Member) -> bool {
    match m.pair() {
        Some(p) => super::pair::pair_non_blocking(p),
        None => on_ring(m) || m.timed() || m.in_memory(),
    }
}

/// `non_blocking`, for the writes of a write asked for with FUA
/// (`IoKind::WriteFua`): on its ring (`RWF_DSYNC`), in memory
/// (`Member::write_fua_at`), or timed where the member takes FUA writes
/// so (`Member::fua_timed`). Not a pair of devices: a hot replace's
/// writes go the blocking way, then the array is flushed.
pub(super) fn non_blocking_fua(m: &dyn Member) -> bool {
    m.pair().is_none() && (on_ring(m) || m.in_memory() || (m.timed() && m.fua_timed()))
}

pub(super) struct Shard {
    /// The array, with a count and member tables of this shard's own
    /// (`LocalArray`): each request holds a clone.
    pub(super) array: LocalArray,
    pub(super) inbox: Arc<Inbox>,
    ring: IoUring,
    /// Requests in flight, by key.
    pub(super) slab: Vec<Option<Op>>,
    free: Vec<usize>,
    /// Requests waiting for room on the ring, in arrival order.
    pub(super) waiting: VecDeque<Request>,
    /// Ring entries in flight (pushed, not yet reaped).
    pub(super) on_ring: u32,
    /// Entries that found the submission queue full, pushed at the next
    /// turn (their buffers are held by their requests in the slab).
    overflow: VecDeque<squeue::Entry>,
    /// Member I/Os that ended as they started (a timed or due I/O's
    /// error, an I/O done in place on a member in memory): handled at the next
    /// reap, as completions are, with a ring's result (bytes or -errno).
    pub(super) ended: Vec<(u64, i32)>,
    /// I/Os whose members said when they complete (`Member::start_due`),
    /// soonest first: the shard reaps them as their times pass, as it reaps
    /// its ring, and sleeps no later than the soonest, so a simulated
    /// drive's completion wakes no thread but this one (a real drive's
    /// comes to the ring the same way).
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Whether the ring can wait for a time (`IORING_FEAT_EXT_ARG`, Linux
    /// 5.11): without it, no I/O is taken as due.
    waits_for_time: bool,
    pub(super) blocking: Blocking,
    /// Stripes whose lock a write of this shard holds, each with the
    /// writes that arrived for it meanwhile, in arrival order. Looked up
    /// three times a write: foldhash instead of std's SipHash, which took
    /// 2-3% of the shards' time on RAID5 4 KiB writes. foldhash resists a
    /// client choosing colliding keys far less than SipHash; the keys are
    /// stripes a client's writes pick, but the map holds only those with a
    /// write in flight on this shard, so a collision costs a few probes.
    pub(super) held: foldhash::HashMap<u64, VecDeque<WriteJob>>,
    /// Where the eventfd read lands: boxed, so it does not move while the
    /// kernel holds its address.
    wake_buf: Box<u64>,
    armed: bool,
    /// Tokens of the clients' polls that completed since the clients were
    /// last polled (`Local::fired`).
    pub(super) fired: Vec<u64>,
    /// Which of the engine's shards this is, and every shard's inbox (its
    /// own at `index`), where its clients' writes go (`client.rs`).
    pub(super) index: usize,
    pub(super) peers: Peers,
    /// Front ends run on this shard's thread, polled after each pass.
    pub(super) clients: Vec<Box<dyn Client>>,
    /// Run by its caller one turn at a time (`Stepped`), not by `run`.
    pub(super) caller_turns: bool,
}

/// Closes a shard's inbox when dropped (`Inbox::close`), handling what
/// it held as jobs given after (`Inbox::closed_job`).
struct CloseOnExit(Arc<Inbox>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        for j in self.0.close() {
            Inbox::closed_job(j);
        }
    }
}

impl Drop for Shard {
    /// A shard that ends with I/O or its wake-up read still on the ring
    /// (only by a panic in its own code) leaks their buffers: the kernel
    /// may still write into them after the ring is closed. The writes in
    /// flight then keep their stripes' locks and their count in
    /// `unjournaled` for good, and degraded reads their stripes' locks:
    /// the array stops taking writes to those stripes (and reads that
    /// must recover them), and member failures wait, rather than let
    /// another writer in while these may still land. A journaled write's
    /// record stays in flight too, so whatever settles the journal (a
    /// stop, a rebuild, a flush with every slot in sync) or waits for room
    /// behind that record in its ring waits for ever: the array stops, it
    /// does not lose a write. A write whose record was queued keeps its
    /// stripe's lock even when the slab is dropped (`write_guards::Guards`).
    fn drop(&mut self) {
        if self.on_ring > 0 || self.armed {
            std::mem::forget(std::mem::take(&mut self.slab));
            std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new(0)));
        }
    }
}

impl Shard {
    /// Shard `index` of `peers` (its own inbox there).
    pub(super) fn new(
        array: Arc<Array>,
        index: usize,
        peers: Peers,
        ring: IoUring,
        blocking: Blocking,
    ) -> Shard {
        let inbox = peers[index].clone();
        let waits_for_time = ring.params().is_feature_ext_arg();
        Shard {
            array: LocalArray::new(&array),
            inbox,
            ring,
            slab: Vec::new(),
            free: Vec::new(),
            waiting: VecDeque::new(),
            on_ring: 0,
            overflow: VecDeque::new(),
            ended: Vec::new(),
            due: BinaryHeap::new(),
            waits_for_time,
            blocking,
            held: Default::default(),
            wake_buf: Box::new(0),
            armed: false,
            fired: Vec::new(),
            index,
            peers,
            clients: Vec::new(),
            caller_turns: false,
        }
    }

    pub(super) fn run(mut self) {
        super::client::running_shard(&self.inbox);
        // However the loop ends (a panic in the shard's own code too), what
        // is given to this shard from then on is handled by its giver.
        let _closes = CloseOnExit(self.inbox.clone());
        let mut stopping = false;
        loop {
            stopping |= self.turn();
            if stopping && !self.busy() {
                self.drop_clients();
                drop(_closes);
                return self.disarm_wake();
            }
            if !self.inbox.jobs.lock().is_empty() || !self.ended.is_empty() {
                continue;
            }
            // Until the soonest due I/O's time, if one is due.
            let until = match self.due.peek() {
                None => None,
                Some(&Reverse((at, _))) if at > Instant::now() => Some(at),
                Some(_) => continue,
            };
            // Nothing to do now (what waits, waits for the ring's room):
            // sleep in the ring until a completion, a wake-up or that time.
            self.arm_wake();
            self.inbox.sleeping.store(true, Ordering::SeqCst);
            if !self.inbox.jobs.lock().is_empty() {
                self.inbox.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            self.enter_until(1, until);
            self.inbox.sleeping.store(false, Ordering::SeqCst);
        }
    }

    /// Whether requests are in flight on the shard, started or waiting for
    /// room on the ring (writes waiting behind a stripe's holder count
    /// with it).
    pub(super) fn busy(&self) -> bool {
        self.slab.len() > self.free.len() || !self.waiting.is_empty()
    }

    /// One turn of the loop, never waiting: takes the inbox's jobs, then,
    /// until nothing moves, reaps what completed, starts what waits while
    /// the ring has room, and submits (I/O on files in the page cache
    /// completes inside the submission). Returns whether a Stop came.
    pub(super) fn turn(&mut self) -> bool {
        let mut stopping = false;
        let jobs = std::mem::take(&mut *self.inbox.jobs.lock());
        for j in jobs {
            match j {
                // In arrival order, behind any waiting for room.
                Job::Request(r) => self.waiting.push_back(r),
                Job::Timed(ud, res) => self.complete(ud, res),
                Job::Journaled(k, ok) => self.journaled(k, ok),
                Job::Room(k) => self.run_step(k),
                Job::Client(c) => self.clients.push(c),
                Job::Call(f) => super::call(f),
                Job::Stop => stopping = true,
            }
        }
        if stopping {
            self.drop_clients();
        }
        self.inbox.set_fronts(self.clients.len());
        let mut passes = 0;
        loop {
            let reaped = self.reap();
            // After the completions, which their next requests follow.
            let given = self.poll_clients();
            // Each client looked at its own (a poll of a client that ended
            // meanwhile fires for no one).
            self.fired.clear();
            // Completions that ran to their end inside the polls: the next
            // pass polls their clients.
            let reaped = reaped + super::client::run_later();
            let mut started = 0;
            while let Some(r) = self.waiting.front() {
                // Ring entries it may take at once (a read: one per
                // chunk; a write step: one per member), at most `RING`
                // (larger reads take the blocking path).
                let geo = self.array.geometry();
                let need = match r {
                    Request::Read(j) => {
                        let first = j.offset / geo.chunk;
                        let end = j.offset.saturating_add(j.buf.len().max(1) as u64);
                        let last = (end - 1) / geo.chunk;
                        (last - first + 1).min(RING as u64) as u32
                    }
                    Request::Write(_) => (geo.members as u32).min(RING),
                };
                if self.on_ring + need > RING {
                    break;
                }
                match self.waiting.pop_front().expect("looked at") {
                    Request::Read(r) => self.start_read(r),
                    Request::Write(w) => self.start_arrived_write(w),
                }
                started += 1;
            }
            self.submit();
            if reaped == 0 && started == 0 && given == 0 {
                return stopping;
            }
            // A client that gives a request for each completion keeps this
            // loop going where members complete at once (in memory, in the
            // page cache): what waits in the inbox (a Stop, others'
            // requests, completions posted back) is taken at the next turn.
            // On a shard its caller turns, nothing may reach the inbox
            // meanwhile (members in memory end I/O in `ended`, RAM's is
            // due at once): there a
            // turn ends after `CALLER_PASSES` passes in which clients gave
            // (not at the first: `ended` may hold what its caller waits
            // for, such as a vanished disk's errors).
            passes += 1;
            let enough = self.caller_turns && passes >= CALLER_PASSES;
            if given > 0 && (enough || !self.inbox.jobs.lock().is_empty()) {
                return stopping;
            }
        }
    }

    /// Starts write `w`, the writes for its stripe (chunk) that arrived
    /// right behind it with it, where no write of this shard holds that
    /// stripe: merged where they meet (`merge.rs`), as writes that wait for
    /// a stripe are when it is given up, so a burst of small sequential
    /// writes does not leave its first one to run alone.
    fn start_arrived_write(&mut self, w: WriteJob) {
        let Some(k) = self.array.write_lock_key(w.offset) else {
            return self.start_write(w);
        };
        if self.held.contains_key(&k) {
            return self.start_write(w);
        }
        let mut jobs = VecDeque::new();
        while let Some(Request::Write(next)) = self.waiting.front() {
            if self.array.write_lock_key(next.offset) != Some(k) {
                break;
            }
            match self.waiting.pop_front() {
                Some(Request::Write(next)) => jobs.push_back(next),
                _ => unreachable!("looked at"),
            }
        }
        // Alone (the common case): nothing to merge it with.
        if jobs.is_empty() {
            return self.start_write(w);
        }
        jobs.push_front(w);
        self.start_together(k, jobs);
    }

    /// Submits what is queued on the ring, waiting for `want` completions.
    fn enter(&mut self, want: usize) {
        self.enter_until(want, None)
    }

    /// As `enter`, waiting no later than `until` where it is given (the
    /// wait reckoned here, so the time spent getting here is not waited
    /// again).
    fn enter_until(&mut self, want: usize, until: Option<Instant>) {
        loop {
            let r = match until {
                None => self.ring.submit_and_wait(want),
                Some(at) => {
                    let ts = types::Timespec::from(at.saturating_duration_since(Instant::now()));
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(want, &args)
                }
            };
            match r {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // The time came (ETIME), or the completion queue is full
                // (EBUSY): the caller reaps.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EBUSY)) => return,
                Err(e) => {
                    tracing::error!("shard: io_uring_enter: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    return;
                }
            }
        }
    }

    fn submit(&mut self) {
        while let Some(e) = self.overflow.pop_front() {
            // SAFETY: as when it was first pushed (see `push`).
            if unsafe { self.ring.submission().push(&e) }.is_err() {
                self.overflow.push_front(e);
                break;
            }
        }
        if !self.ring.submission().is_empty() {
            self.enter(0);
        }
    }

    /// Puts an entry on the ring (or, with the submission queue full, in
    /// `overflow` for the next turn), counted in flight.
    ///
    /// # Safety
    /// The entry's buffer and file stay valid until its completion is
    /// reaped: the request that owns them stays in the slab until then.
    pub(super) unsafe fn push(&mut self, e: squeue::Entry) {
        self.on_ring += 1;
        if !self.overflow.is_empty() {
            return self.overflow.push_back(e);
        }
        // SAFETY: the caller's promise.
        if unsafe { self.ring.submission().push(&e) }.is_err() {
            self.overflow.push_back(e);
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

    /// Puts a one-shot poll of `fd` for `events` on the ring for a client
    /// (`Local::watch`): its completion turns the shard, and the token is
    /// in `fired` for that pass's poll of the clients. It holds no buffer;
    /// the kernel holds the file until it completes (a shutdown of a
    /// socket completes it).
    pub(super) fn watch(&mut self, fd: std::os::fd::RawFd, events: u32, token: u64) {
        debug_assert!(token < POLL, "a token below the poll bit");
        let e = opcode::PollAdd::new(types::Fd(fd), events)
            .build()
            .user_data(POLL | token);
        // SAFETY: a poll points at no memory of ours.
        if unsafe { self.ring.submission().push(&e) }.is_err() {
            self.overflow.push_back(e);
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

    pub(super) fn key(&mut self, op: Op) -> usize {
        match self.free.pop() {
            Some(k) => {
                self.slab[k] = Some(op);
                k
            }
            None => {
                self.slab.push(Some(op));
                self.slab.len() - 1
            }
        }
    }

    /// Takes request `k` out of the slab.
    pub(super) fn remove(&mut self, k: usize) -> Op {
        let op = self.slab[k].take().expect("a request in flight");
        self.free.push(k);
        op
    }

    /// Starts a member I/O for the request whose I/O `ud` it is: on the
    /// ring when the member is on it, in place on a member in memory, as a
    /// due I/O where the member says when it completes (and this shard's
    /// ring can wait for a time), as a timed I/O otherwise (one done in
    /// place, or that fails as it starts, is handled at the next reap, as
    /// completions are); on a
    /// pair of devices, on each device's own way (`pair.rs`).
    ///
    /// # Safety
    /// `ptr` and `len` are a buffer of that request, heap memory that
    /// stays put and alive (the request stays in the slab) until this
    /// I/O's completion is reaped; `m` is held by the request too (it
    /// keeps the fd open).
    pub(super) unsafe fn start_io(
        &mut self,
        ud: u64,
        m: &MemberRef,
        kind: IoKind,
        ptr: *mut u8,
        len: usize,
        at: u64,
    ) {
        if m.pair().is_some() {
            // SAFETY: the caller's promise.
            return unsafe { self.start_pair_io(ud, m, kind, ptr, len, at) };
        }
        if on_ring(m.as_ref()) {
            let fd = types::Fd(m.uring_fd().expect("checked"));
            let e = rw_entry(fd, kind, ptr, len as u32, at);
            // SAFETY: the caller's promise.
            return unsafe { self.push(e.user_data(ud)) };
        }
        // SAFETY (both): the caller's promise; an I/O in place, a due
        // or a timed one moves its bytes before it returns. A write's
        // bytes are only read (other I/Os in flight may read the same
        // ones).
        let io_op = || match kind {
            IoKind::Read => IoOp::Read(unsafe { std::slice::from_raw_parts_mut(ptr, len) }),
            IoKind::Write => IoOp::Write(unsafe { std::slice::from_raw_parts(ptr, len) }),
            IoKind::WriteFua => IoOp::WriteFua(unsafe { std::slice::from_raw_parts(ptr, len) }),
        };
        if let Some(r) = self
            .waits_for_time
            .then(|| m.start_due(io_op(), at))
            .flatten()
        {
            return match r {
                Ok(at) => self.due.push(Reverse((at, ud))),
                Err(e) => self
                    .ended
                    .push((ud, -e.raw_os_error().unwrap_or(libc::EIO))),
            };
        }
        let mut op = io_op();
        if m.in_memory() {
            let res = match op.run_on(m.as_ref(), at) {
                // All of it moved (`read_at`/`write_at` move all or fail).
                Ok(()) => i32::try_from(len).unwrap_or(i32::MAX),
                // Past the file's end: what the ring reports as 0 bytes,
                // nothing said against the member.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::WriteZero
                    ) =>
                {
                    0
                }
                Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
            };
            return self.ended.push((ud, res));
        }
        let inbox = self.inbox.clone();
        let then: crate::member::TimedDone = Box::new(move |r: std::io::Result<()>| {
            let res = r.err().map(|e| -e.raw_os_error().unwrap_or(libc::EIO));
            inbox.push(Job::Timed(ud, res))
        });
        let started = m.start_timed(op, at, then);
        let res = match started {
            Some(Ok(())) => return,
            Some(Err(e)) => -e.raw_os_error().unwrap_or(libc::EIO),
            None => NOT_SERVED,
        };
        self.ended.push((ud, res));
    }

    /// Reaps the ring's completions and the I/Os that ended as they
    /// started; returns how many there were.
    fn reap(&mut self) -> usize {
        let mut n = 0;
        if !self.due.is_empty() {
            let now = Instant::now();
            while let Some(&Reverse((at, ud))) = self.due.peek() {
                if at > now {
                    break;
                }
                self.due.pop();
                n += 1;
                self.complete(ud, None);
            }
        }
        let mut done: Vec<(u64, i32)> = std::mem::take(&mut self.ended);
        let n_ended = done.len();
        done.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for (i, (ud, res)) in done.into_iter().enumerate() {
            if ud == WAKE {
                self.armed = false;
                continue;
            }
            if ud & POLL != 0 {
                // A client's file is ready: its next poll (this pass's)
                // sees it.
                self.fired.push(ud & !POLL);
                n += 1;
                continue;
            }
            if i >= n_ended {
                self.on_ring -= 1;
            }
            n += 1;
            self.complete(ud, Some(res));
        }
        n
    }

    /// Member I/O `ud` completed: `res` as a ring's (bytes moved or
    /// -errno), or None for a timed or due I/O that moved all its bytes.
    pub(super) fn complete(&mut self, ud: u64, res: Option<i32>) {
        let k = (ud >> SUB_BITS) as usize;
        let sub = (ud & ((1 << SUB_BITS) - 1)) as usize;
        match &self.slab[k] {
            Some(Op::Read(_)) => self.read_io_done(k, sub, res),
            Some(Op::Write(_)) => self.write_io_done(k, sub, res),
            Some(Op::Pair(_)) => self.pair_io_done(k, sub, res),
            None => tracing::error!("shard: a completion for no request ({ud:#x})"),
        }
    }
}
