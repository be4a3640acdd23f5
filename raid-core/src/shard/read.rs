//! Reads on a shard: one member read per chunk the request touches, all
//! in flight together into the request's buffer, on the ring or as timed
//! I/O. A read with a chunk that has no readable copy, of more than
//! `MAX_IOS` chunks, on a member that can do neither, or one whose member
//! erred or came back empty, goes to
//! the blocking path (which reconstructs, and fails the member that
//! erred); nothing is answered until every piece is in.

use super::event_loop::{io_end, non_blocking, ud, IoEnd, Shard, MAX_IOS};
use super::ops::{Op, ReadOp};
use super::{answer, Fallback, ReadJob};
use crate::member::MemberRef;
use crate::stats::Started;
use std::sync::atomic::Ordering;

impl Shard {
    /// Starts a read on this shard, or hands it to the blocking path.
    pub(super) fn start_read(&mut self, job: ReadJob) {
        let plan = self.array.direct_read(job.offset, job.buf.len() as u64);
        let Some(plan) = plan.filter(|p| {
            p.pieces.len() <= MAX_IOS
                && p.pieces
                    .iter()
                    .all(|x| non_blocking(p.handles[x.slot].as_ref()))
        }) else {
            return self.read_to_fallback(job, None);
        };
        let n = plan.pieces.len();
        let op = ReadOp {
            job,
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
        let m = op.handles[p.slot].clone();
        let from = op.moved[i];
        assert!(p.pos + p.len <= op.job.buf.len());
        // A pointer into the buffer, not a slice of it: other pieces are
        // being written into the same buffer meanwhile.
        // SAFETY: in bounds (checked above).
        let ptr = unsafe { op.job.buf.as_mut_ptr().add(p.pos + from) };
        let len = p.len - from;
        // SAFETY: the buffer belongs to the read in slab entry `k` (heap
        // memory that does not move), which stays there until every
        // piece's completion is reaped, and so do the member handles.
        unsafe { self.start_io(ud(k, i), &m, false, ptr, len, p.at + from as u64) }
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
        let m = op.handles[p.slot].clone();
        crate::member::count_took(m.as_ref(), true, p.len, op.started.took(), ok);
        op.left -= 1;
        if op.left > 0 {
            return;
        }
        let Op::Read(op) = self.remove(k) else {
            unreachable!("a read")
        };
        match (op.failed, op.short) {
            (Some((slot, e)), _) => {
                let m = op.handles[slot].clone();
                self.read_to_fallback(op.job, Some((slot, m, e)));
            }
            (None, true) => self.read_to_fallback(op.job, None),
            (None, false) => {
                self.array.count_direct_read(op.job.buf.len(), op.started);
                self.blocking
                    .counts
                    .on_shards
                    .fetch_add(1, Ordering::Relaxed);
                answer(op.job.done, Ok(op.job.buf));
            }
        }
    }

    fn read_to_fallback(&self, job: ReadJob, failed: Option<(usize, MemberRef, std::io::Error)>) {
        self.blocking.send(Fallback::Read { job, failed });
    }
}
