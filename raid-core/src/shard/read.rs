//! Reads on a shard: one member read per chunk the request touches, all
//! in flight together into the request's buffer, on the ring or as timed
//! I/O. A RAID5/6 read inside one stripe with a chunk that has no
//! readable member reads the stripe's other chunks instead, and recovers
//! it (`array::degraded_read`). A mirror read touching chunks an unclean
//! stop may have torn (a resync owed that has not passed them) reads every
//! copy of them and is answered where the copies agree
//! (`array::copies_read`); where they differ, the blocking path makes them
//! agree first. Any other read with a chunk that has no
//! readable copy, one of more than `MAX_IOS` member reads, on a member that can
//! do neither, or one whose member erred or came back empty, goes to the
//! blocking path (which reconstructs, and fails the member that erred);
//! nothing is answered until every piece is in.

use super::event_loop::{io_end, non_blocking, ud, IoEnd, Shard, MAX_IOS};
use super::ops::{Gathered, Op, ReadOp};
use super::{answer, Fallback, ReadJob};
use crate::array::copies_read::CopiesRead;
use crate::array::degraded_read::DegradedRead;
use crate::array::{DirectRead, LocalArray};
use crate::member::{IoKind, MemberRef};
use crate::stats::Started;
use std::sync::atomic::Ordering;

impl Shard {
    /// Starts a read on this shard, or hands it to the blocking path.
    pub(super) fn start_read(&mut self, job: ReadJob) {
        let len = job.buf.len() as u64;
        let (plan, gathered) = match self.array.direct_read(job.offset, len) {
            Some(p) => (p, None),
            None => match gather(&self.array, job.offset, len) {
                Some((p, g)) => (p, Some(g)),
                None => return self.read_to_fallback(job, None),
            },
        };
        let fits = plan.pieces.len() <= MAX_IOS
            && plan
                .pieces
                .iter()
                .all(|x| non_blocking(plan.handles[x.slot].as_ref()));
        if !fits {
            drop(gathered);
            return self.read_to_fallback(job, None);
        }
        let n = plan.pieces.len();
        let op = ReadOp {
            job,
            gathered,
            handles: plan.handles,
            pieces: plan.pieces,
            moved: vec![0; n],
            left: n,
            failed: None,
            short: false,
            started: Started::now(),
        };
        let k = self.key(Op::Read(Box::new(op)));
        for i in 0..n {
            self.issue_read(k, i);
        }
    }

    fn read_op(&mut self, k: usize) -> &mut ReadOp {
        match self.slab[k].as_mut() {
            Some(Op::Read(op)) => op,
            _ => unreachable!("a read in flight"),
        }
    }

    /// Starts piece `i` of read `k`, from the bytes it has moved.
    fn issue_read(&mut self, k: usize, i: usize) {
        let op = self.read_op(k);
        let p = op.pieces[i];
        // Pointed to, not cloned: the handle's count is shared by every
        // shard (two atomic operations per I/O on one cache line).
        let m: *const MemberRef = &op.handles[p.slot];
        let from = op.moved[i];
        let into = match &mut op.gathered {
            Some(g) => g.scratch(),
            None => &mut op.job.buf,
        };
        assert!(p.pos + p.len <= into.len());
        // A pointer into the buffer, not a slice of it: other pieces are
        // being written into the same buffer meanwhile.
        // SAFETY: in bounds (checked above).
        let ptr = unsafe { into.as_mut_ptr().add(p.pos + from) };
        let len = p.len - from;
        // SAFETY: the buffer belongs to the read in slab entry `k` (heap
        // memory that does not move), which stays there until every
        // piece's completion is reaped, and so do the member handles (in
        // the entry's `Arc`'d vector, which does not move either): `m`
        // outlives the call, in which no I/O completes (one that ends as
        // it starts is handled at the next reap).
        unsafe { self.start_io(ud(k, i), &*m, IoKind::Read, ptr, len, p.at + from as u64) }
    }

    /// Piece `i` of read `k` completed (`res` as in `Shard::complete`).
    pub(super) fn read_io_done(&mut self, k: usize, i: usize, res: Option<i32>) {
        let op = self.read_op(k);
        let p = op.pieces[i];
        let mut ok = true;
        match io_end(res, p.len - op.moved[i]) {
            IoEnd::Short(n) => {
                op.moved[i] += n;
                return self.issue_read(k, i);
            }
            IoEnd::Nothing => op.short = true,
            IoEnd::Failed(e) => {
                ok = false;
                op.failed.get_or_insert((p.slot, e));
            }
            IoEnd::Done => {}
        }
        // Borrowed, not cloned: a member's count is shared by every shard,
        // and so would its handle's.
        let took = op.started.took();
        crate::member::count_took(op.handles[p.slot].as_ref(), true, p.len, took, ok);
        op.left -= 1;
        if op.left > 0 {
            return;
        }
        let Op::Read(op) = self.remove(k) else {
            unreachable!("a read")
        };
        let ReadOp {
            mut job,
            gathered,
            handles,
            failed,
            short,
            started,
            ..
        } = *op;
        if failed.is_some() || short {
            // The stripe's lock goes before the blocking path reads it.
            drop(gathered);
            let failed = failed.map(|(slot, e)| (slot, handles[slot].clone(), e));
            return self.read_to_fallback(job, failed);
        }
        let counts = &self.blocking.counts;
        match gathered {
            None => {}
            Some(Gathered::Degraded(d)) => {
                if let Err(e) = d.finish(&self.array, &mut job.buf) {
                    self.array.count_direct_read(job.buf.len(), started, false);
                    return answer(job.done, Err(e));
                }
                counts.degraded_on_shards.fetch_add(1, Ordering::Relaxed);
            }
            // Copies that differ: the blocking path makes them agree
            // first, under the chunk's lock.
            Some(Gathered::Copies(c)) if !c.finish(&mut job.buf) => {
                return self.read_to_fallback(job, None);
            }
            Some(Gathered::Copies(_)) => {}
        }
        self.array.count_direct_read(job.buf.len(), started, true);
        counts.on_shards.fetch_add(1, Ordering::Relaxed);
        answer(job.done, Ok(job.buf));
    }

    fn read_to_fallback(&self, job: ReadJob, failed: Option<(usize, MemberRef, std::io::Error)>) {
        self.blocking.send(Fallback::Read { job, failed });
    }
}

/// A read that cannot go one member read per chunk into its buffer, as a
/// shard can still serve it: degraded inside one RAID5/6 stripe, or
/// touching mirror chunks an unclean stop may have torn. None: the
/// blocking path's.
fn gather(array: &LocalArray, offset: u64, len: u64) -> Option<(DirectRead, Gathered)> {
    if let Some((p, d)) = DegradedRead::start(array, offset, len) {
        return Some((p, Gathered::Degraded(d)));
    }
    CopiesRead::start(array, array.read_handles(), offset, len, MAX_IOS)
        .map(|(p, c)| (p, Gathered::Copies(c)))
}
