//! Writes on a shard: each step's member I/Os (`AsyncWrite::ios`) started
//! together, on the ring or as timed I/Os, their results gathered, and the
//! write advanced when the last one is in. A short transfer goes on from
//! where it stopped, as the blocking path's ring does.

use super::event_loop::{io_end, non_blocking, non_blocking_fua, ud, IoEnd, Shard};
use super::ops::{Op, WriteOp};
use super::{answer, Fallback, Job, WriteJob};
use crate::array::async_write::{AsyncWrite, Next, Start};
use crate::array::{JournalDone, NotQueued, RoomWake};
use crate::member::{IoKind, MemberRef};
use crate::stats::Started;
use std::collections::VecDeque;
use std::io;
use std::ops::RangeInclusive;
use std::sync::atomic::Ordering;

impl Shard {
    /// Starts a write on this shard, or hands it to the blocking path.
    pub(super) fn start_write(&mut self, job: WriteJob) {
        if self.splits(&job) {
            return self.split(job);
        }
        // Behind a write of this shard's that holds the stripe, started
        // when it ends (what the stripe lock would do, with no thread
        // waiting). They start in arrival order, but one that then takes
        // the blocking path may land after those behind it: writes in
        // flight together have no order among them.
        //
        // A write across chunks that meets one of them held goes to the
        // blocking path instead, whose thread takes its locks in order and
        // waits holding those it has: waiting here, holding none, it could
        // be overtaken again and again by writes to its other chunks, with
        // no bound on its wait. (Either way measured the same on the
        // large-I/O bench; the bound is the reason.)
        let keys = self
            .array
            .write_lock_keys(job.offset, job.data.len() as u64);
        if let Some(keys) = keys {
            if let Some(k) = keys.clone().find(|k| self.held.contains_key(k)) {
                if keys.start() != keys.end() {
                    let failed = Vec::new();
                    return self.blocking.send(Fallback::Write { job, failed });
                }
                return self.held.get_mut(&k).expect("found").push_back(job);
            }
        }
        let WriteJob {
            offset,
            data,
            mut done,
            part,
            mut fua,
        } = job;
        let can = if fua { non_blocking_fua } else { non_blocking };
        match AsyncWrite::start(&self.array, offset, data, can) {
            Start::Go(mut w) => {
                if fua && w.skips_a_member() {
                    // With FUA, a write that skips a missing member is
                    // durable only once that member's failure is, which
                    // a flush of the array waits for: written here as any
                    // (through the journal), then the array flushed.
                    done = self.blocking.flushed_after(done);
                    fua = false;
                }
                if part {
                    w.uncounted();
                }
                for k in w.lock_keys().into_iter().flatten() {
                    self.held.insert(k, Default::default());
                }
                let n = self.array.geometry().members;
                let op = WriteOp {
                    w,
                    done,
                    moved: Vec::with_capacity(n),
                    results: Vec::with_capacity(n),
                    left: 0,
                    started: Started::now(),
                    fua,
                };
                let k = self.key(Op::Write(Box::new(op)));
                self.run_step(k);
            }
            Start::Blocking(data) => {
                let job = WriteJob {
                    offset,
                    data,
                    done,
                    part,
                    fua,
                };
                self.blocking.send(Fallback::Write {
                    job,
                    failed: Vec::new(),
                });
            }
        }
    }

    /// A write of this shard's gave up the locks `keys` (or handed them
    /// to the thread that ends it): the writes waiting for each start
    /// again, those that meet merged (`merge.rs`); the first that takes a
    /// lock has the others wait behind it.
    fn release(&mut self, keys: Option<RangeInclusive<u64>>) {
        for k in keys.into_iter().flatten() {
            if let Some(waiting) = self.held.remove(&k) {
                self.start_together(k, waiting);
            }
        }
    }

    /// Starts `jobs` (oldest first), writes all under lock `k`: those that
    /// meet merged (`merge.rs`); the first that takes the lock has the
    /// others wait behind it.
    pub(super) fn start_together(&mut self, k: u64, jobs: VecDeque<WriteJob>) {
        let (array, counts) = (&self.array, &self.blocking.counts);
        let fits = |j: &WriteJob| array.inside_lock(k, j.offset, j.data.len() as u64);
        let join = |run: Vec<WriteJob>| super::merge::merged(run, array, counts);
        for job in super::merge::runs(jobs, fits, &join) {
            self.start_write(job);
        }
    }

    fn op(&mut self, k: usize) -> &mut WriteOp {
        match self.slab[k].as_mut() {
            Some(Op::Write(op)) => op,
            _ => unreachable!("a write in flight"),
        }
    }

    /// Starts write `k`'s next step: a degraded stripe's journal record
    /// first, the step's I/Os once it is durable (`journaled`). Where the
    /// journal's ring has no room the write waits on the shard, its stripe
    /// held, until the journal says there may be (`Job::Room`: this step
    /// again); a record the journal does not take for another reason sends
    /// the write, nothing written, to the blocking path.
    pub(super) fn run_step(&mut self, k: usize) {
        let op = self.op(k);
        if op.w.journal_due() {
            let inbox = self.inbox.clone();
            let done: JournalDone = Box::new(move |ok| inbox.push(Job::Journaled(k, ok)));
            let inbox = self.inbox.clone();
            let room: RoomWake = Box::new(move || inbox.push(Job::Room(k)));
            match self.op(k).w.journal(done, room) {
                Ok(()) => {}
                Err(NotQueued::Later) => {
                    let counts = &self.blocking.counts;
                    counts.journal_waits.fetch_add(1, Ordering::Relaxed);
                }
                Err(NotQueued::Blocking) => self.hand_to_blocking(k, Vec::new()),
            }
            return;
        }
        self.start_step(k)
    }

    /// Write `k`'s journal record is durable (`ok`): its writes start; or
    /// it was given up: the write ends with nothing written.
    pub(super) fn journaled(&mut self, k: usize, ok: bool) {
        if ok {
            self.op(k).w.journaled();
            return self.start_step(k);
        }
        let Op::Write(op) = self.remove(k) else {
            unreachable!("a write")
        };
        let keys = op.w.lock_keys();
        let (e, _) = op.w.journal_failed();
        answer(op.done, Err(e));
        self.release(keys);
    }

    /// Ends write `k` with nothing written and hands it to the blocking
    /// path, which fails `failed` first.
    fn hand_to_blocking(&mut self, k: usize, failed: Vec<(usize, MemberRef, io::Error)>) {
        let Op::Write(op) = self.remove(k) else {
            unreachable!("a write")
        };
        let (offset, keys, part) = (op.w.offset(), op.w.lock_keys(), !op.w.is_counted());
        let data = op.w.give_up();
        let job = WriteJob {
            offset,
            data,
            done: op.done,
            part,
            fua: op.fua,
        };
        self.blocking.send(Fallback::Write { job, failed });
        self.release(keys);
    }

    /// Starts every I/O of write `k`'s current step.
    fn start_step(&mut self, k: usize) {
        let op = self.op(k);
        let n = op.w.ios().len();
        op.moved.clear();
        op.moved.resize(n, 0);
        op.results.clear();
        op.results.resize_with(n, || Ok(()));
        op.left = n;
        op.started = Started::now();
        for i in 0..n {
            self.issue(k, i);
        }
    }

    /// Starts I/O `i` of write `k`'s step, from the bytes it has moved.
    fn issue(&mut self, k: usize, i: usize) {
        let op = self.op(k);
        let io = op.w.ios()[i];
        let kind = match (io.write, op.fua) {
            (false, _) => IoKind::Read,
            (true, false) => IoKind::Write,
            (true, true) => IoKind::WriteFua,
        };
        // Pointed to, not cloned: the handle's count is shared by every
        // shard (two atomic operations per I/O on one cache line).
        let m: *const MemberRef = &op.w.handles()[io.slot];
        let from = op.moved[i];
        let (start, all) = op.w.io_buf(i);
        // SAFETY: `from` <= the I/O's length (bytes it moved so far).
        let ptr = unsafe { start.add(from) };
        let (len, at) = (all - from, io.offset + from as u64);
        // SAFETY: the buffer belongs to the write in slab entry `k` (heap
        // memory that does not move), which stays there until this I/O's
        // completion is reaped, and so do the member handles `m` points
        // into (an `Arc`'d vector, which does not move either): `m`
        // outlives the call, in which no I/O completes (one that ends as
        // it starts is handled at the next reap).
        unsafe { self.start_io(ud(k, i), &*m, kind, ptr, len, at) }
    }

    /// I/O `i` of write `k` completed (`res` as in `Shard::complete`).
    pub(super) fn write_io_done(&mut self, k: usize, i: usize, res: Option<i32>) {
        let op = self.op(k);
        let len = op.w.io_buf(i).1;
        let r = match io_end(res, len - op.moved[i]) {
            IoEnd::Short(n) => {
                op.moved[i] += n;
                return self.issue(k, i);
            }
            IoEnd::Done => Ok(()),
            IoEnd::Failed(e) => Err(e),
            // Not against the member in a read step (see
            // `AsyncWrite::advance`); in a write step, the write not in place.
            IoEnd::Nothing => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the member moved no bytes, or could not start the I/O",
            )),
        };
        let io = op.w.ios()[i];
        let (m, took) = (&op.w.handles()[io.slot], op.started.took());
        crate::member::count_took(m.as_ref(), !io.write, len, took, r.is_ok());
        op.results[i] = r;
        op.left -= 1;
        if op.left == 0 {
            self.advance(k);
        }
    }

    /// Every I/O of write `k`'s step is in: the next step, or its end.
    fn advance(&mut self, k: usize) {
        let op = self.op(k);
        let next = op.w.advance(&mut op.results);
        match next {
            Next::Io => return self.run_step(k),
            Next::Blocking(failed) => return self.hand_to_blocking(k, failed),
            _ => {}
        }
        let Op::Write(op) = self.remove(k) else {
            unreachable!("a write")
        };
        let keys = op.w.lock_keys();
        // Done or Finish (the others are handled above): served here.
        let counts = &self.blocking.counts;
        counts.writes_on_shards.fetch_add(1, Ordering::Relaxed);
        match next {
            Next::Io | Next::Blocking(_) => unreachable!("handled above"),
            Next::Done(r) => {
                if op.fua && r.is_ok() {
                    counts.fua_on_shards.fetch_add(1, Ordering::Relaxed);
                }
                // Its guards go before the client hears.
                let data = op.w.give_up();
                answer(op.done, r.map(|()| data));
            }
            // The lock goes with it to the finishing thread: the writes
            // waiting for it try again, and take the blocking path while
            // that thread holds it.
            Next::Finish(results) => {
                let done = match op.fua {
                    true => self.blocking.flushed_after(op.done),
                    false => op.done,
                };
                let (w, f) = (op.w, &self.blocking);
                f.send(Fallback::Finish { w, results, done })
            }
        }
        self.release(keys);
    }
}
