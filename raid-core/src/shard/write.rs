//! Writes on a shard: each step's member I/Os (`AsyncWrite::ios`) started
//! together, on the ring or as timed I/Os, their results gathered, and the
//! write advanced when the last one is in. A short transfer goes on from
//! where it stopped, as the blocking path's ring does.

use super::event_loop::{non_blocking, ud, Shard, NOT_SERVED};
use super::ops::{Op, WriteOp};
use super::{answer, Fallback, WriteJob};
use crate::array::async_write::{AsyncWrite, Next, Start};
use crate::layout::Level;
use crate::stats::Started;
use std::io;
use std::sync::atomic::Ordering;

impl Shard {
    /// Starts a write on this shard, or hands it to the blocking path.
    pub(super) fn start_write(&mut self, job: WriteJob) {
        // Behind a write of this shard's that holds the stripe, started
        // when it ends (what the stripe lock would do, with no thread
        // waiting). They start in arrival order, but one that then takes
        // the blocking path may land after those behind it: writes in
        // flight together have no order among them.
        let stripe = self.lock_key_of(job.offset);
        if let Some(q) = stripe.and_then(|s| self.held.get_mut(&s)) {
            return q.push_back(job);
        }
        let WriteJob { offset, data, done } = job;
        match AsyncWrite::start(&self.array, offset, data, non_blocking) {
            Start::Go(w) => {
                if let Some(s) = w.stripe() {
                    self.held.insert(s, Default::default());
                }
                let op = WriteOp {
                    w,
                    done,
                    moved: Vec::new(),
                    results: Vec::new(),
                    left: 0,
                    started: Started::now(),
                };
                let k = self.key(Op::Write(Box::new(op)));
                self.start_step(k);
            }
            Start::Blocking(data) => {
                let job = WriteJob { offset, data, done };
                self.blocking.send(Fallback::Write {
                    job,
                    failed: Vec::new(),
                });
            }
        }
    }

    /// The lock a write at `offset` takes (`AsyncWrite::stripe`): its
    /// stripe (RAID5/6) or chunk (RAID1/10); RAID0 takes none.
    fn lock_key_of(&self, offset: u64) -> Option<u64> {
        let geo = self.array.geometry();
        match geo.level {
            Level::Raid5 | Level::Raid6 => Some(offset / geo.stripe_data_bytes()),
            Level::Raid1 | Level::Raid10 => Some(offset / geo.chunk),
            Level::Raid0 => None,
        }
    }

    /// A write of this shard's gave up stripe `s`'s lock (or handed it to
    /// the thread that ends it): the next write waiting for it starts.
    fn release(&mut self, s: Option<u64>) {
        let Some(s) = s else { return };
        let next = self.held.get_mut(&s).and_then(|q| q.pop_front());
        let rest = self.held.remove(&s).unwrap_or_default();
        if let Some(job) = next {
            self.start_write(job);
            // It holds the stripe again (or went to the blocking path):
            // the others wait behind it, or follow it there.
            for job in rest {
                self.start_write(job);
            }
        }
    }

    fn op(&mut self, k: usize) -> &mut WriteOp {
        match self.slab[k].as_mut() {
            Some(Op::Write(op)) => op,
            _ => unreachable!("a write in flight"),
        }
    }

    /// Starts every I/O of write `k`'s current step.
    fn start_step(&mut self, k: usize) {
        let op = self.op(k);
        let n = op.w.ios().len();
        op.moved = vec![0; n];
        op.results = (0..n).map(|_| None).collect();
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
        let m = op.w.handles()[io.slot].clone();
        let from = op.moved[i];
        let (start, all) = op.w.io_buf(i);
        // SAFETY: `from` <= the I/O's length (bytes it moved so far).
        let ptr = unsafe { start.add(from) };
        let (len, at) = (all - from, io.offset + from as u64);
        // SAFETY: the buffer belongs to the write in slab entry `k` (heap
        // memory that does not move), which stays there until this I/O's
        // completion is reaped, and so do the member handles `m` is from.
        unsafe { self.start_io(ud(k, i), &m, io.write, ptr, len, at) }
    }

    /// I/O `i` of write `k` completed (`res` as in `Shard::complete`).
    pub(super) fn write_io_done(&mut self, k: usize, i: usize, res: Option<i32>) {
        let array = self.array.clone();
        let op = self.op(k);
        let len = op.w.io_buf(i).1;
        let r = match res {
            None => Ok(len),
            Some(NOT_SERVED) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the member could not start the I/O",
            )),
            Some(r) if r < 0 => Err(io::Error::from_raw_os_error(-r)),
            Some(0) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the member moved no bytes",
            )),
            Some(r) => Ok(op.moved[i] + r as usize),
        };
        let r = match r {
            Ok(n) if n < len => {
                op.moved[i] = n;
                return self.issue(k, i);
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        let io = op.w.ios()[i];
        let m = op.w.handles()[io.slot].clone();
        crate::member::count_took(m.as_ref(), !io.write, len, op.started.took(), r.is_ok());
        drop(array);
        op.results[i] = Some(r);
        op.left -= 1;
        if op.left == 0 {
            self.advance(k);
        }
    }

    /// Every I/O of write `k`'s step is in: the next step, or its end.
    fn advance(&mut self, k: usize) {
        let op = self.op(k);
        let results: Vec<io::Result<()>> = op
            .results
            .drain(..)
            .map(|r| r.expect("every I/O is in"))
            .collect();
        match op.w.advance(&results) {
            Next::Io => self.start_step(k),
            Next::Done(r) => {
                let Op::Write(op) = self.remove(k) else {
                    unreachable!("a write")
                };
                // Its guards go before the client hears.
                let s = op.w.stripe();
                let data = op.w.give_up();
                let counts = &self.blocking.counts;
                counts.writes_on_shards.fetch_add(1, Ordering::Relaxed);
                answer(op.done, r.map(|()| data));
                self.release(s);
            }
            Next::Blocking(failed) => {
                let Op::Write(op) = self.remove(k) else {
                    unreachable!("a write")
                };
                let (offset, s) = (op.w.offset(), op.w.stripe());
                let data = op.w.give_up();
                let job = WriteJob {
                    offset,
                    data,
                    done: op.done,
                };
                self.blocking.send(Fallback::Write { job, failed });
                self.release(s);
            }
            Next::Finish => {
                let Op::Write(op) = self.remove(k) else {
                    unreachable!("a write")
                };
                // The lock goes with it to the finishing thread: the writes
                // waiting for it try again, and take the blocking path
                // while that thread holds it.
                let s = op.w.stripe();
                self.blocking.send(Fallback::Finish {
                    w: op.w,
                    results,
                    done: op.done,
                });
                self.release(s);
            }
        }
    }
}
