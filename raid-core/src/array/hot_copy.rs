//! A hot replace's copy of one run of the slot's rows, from the old
//! device to the new one (`hot_replace.rs` decides which runs, and what
//! happens when either device fails).
//!
//! The run's chunks are read from the old device together (in flight at
//! once where it takes io_uring) and written to the new one together, in
//! steps whose writes go out with the next step's reads
//! (`runs::step_rows`), into chunk buffers the run's thread keeps (a
//! fresh buffer per run would be a new mapping of memory each time). Only
//! the old device's error ends the copy (the slot fails); the new one's
//! drops the replacement at the next batch (`hot_replace_broken`), and the
//! run writes no more to it.
//!
//! A write to the pair writes both devices, so a step need only keep
//! writers out between its read and its write: each step locks its own
//! rows, and the next step's while the step before still holds its own
//! where the lock table's order allows (else the step before is written
//! alone first), as a rebuild's do (`rebuild_steps`). A writer
//! into the run waits for a step or two, not for the run or its batch. A
//! run with rows of holes is locked whole instead, while they are judged
//! again and zeroed on the new device, so that no write lands between the
//! judgement and the zeros.

use super::hot_replace::Mirrored;
use super::locks::Held;
use super::runs;
use super::*;
use crate::buf::{AlignedBuf, BufPool};
use crate::member::{submit, IoOp, MemberIo};

/// What copies a hot replace's runs.
pub(super) struct Copier<'a> {
    a: &'a Array,
    slot: usize,
    pair: &'a Arc<Mirrored>,
    opts: &'a RebuildOptions,
    /// The pair's devices, the old one first, as `submit` takes them.
    devices: [MemberRef; 2],
    /// Whether one disk holds both (then a run is one step).
    one_disk: bool,
}

/// A step read and not yet written: its first row, its buffers, its
/// locks (where steps lock their own).
type Read<'l> = (u64, Vec<AlignedBuf>, Option<Held<'l>>);

impl<'a> Copier<'a> {
    pub(super) fn new(
        a: &'a Array,
        slot: usize,
        pair: &'a Arc<Mirrored>,
        opts: &'a RebuildOptions,
    ) -> Copier<'a> {
        Copier {
            a,
            slot,
            pair,
            opts,
            devices: [pair.old.clone(), pair.new.clone()],
            one_disk: pair
                .new
                .device_key()
                .shares_a_disk_with(pair.old.device_key()),
        }
    }

    /// Copies rows [lo, hi): runs of data alone step by step, others
    /// under the run's locks (see the module's doc).
    pub(super) fn run(&self, (lo, hi): runs::Run, pool: &mut BufPool) -> Result<()> {
        let (a, chunk) = (self.a, self.a.geo.chunk);
        let spans = |a: &Array| a.copy_spans(self.slot, (lo, hi), self.opts.hole_bytes);
        if spans(a).iter().all(|&(.., holes)| !holes) {
            return self.copy((lo, hi), pool, true);
        }
        let _held = a.locks.lock(self.keys(lo, hi));
        for (r0, r1, holes) in spans(a) {
            if self.pair.new_failed.load(Ordering::Acquire) {
                break;
            }
            match holes {
                true => {
                    let at = a.row_offset_of(r0);
                    if let Err(e) = self.pair.new.write_zeroes_allocated(at, (r1 - r0) * chunk) {
                        self.pair.new_err(e);
                    }
                }
                false => self.copy((r0, r1), pool, false)?,
            }
        }
        Ok(())
    }

    /// The lock keys of rows [row, end): those their writers take.
    fn keys(&self, row: u64, end: u64) -> Vec<u64> {
        self.a.rebuild_lock_keys(self.slot, row, end)
    }

    /// Copies rows [lo, hi) in steps; with `step_locks` each step locks
    /// its own rows, else the caller holds them all.
    fn copy(&self, (lo, hi): runs::Run, pool: &mut BufPool, step_locks: bool) -> Result<()> {
        let (a, pair) = (self.a, self.pair);
        let step = runs::step_rows(self.opts.step_bytes, a.geo.chunk, hi - lo, self.one_disk);
        let mut pending: Option<Read<'_>> = None;
        let mut row = lo;
        loop {
            let mut end = (row + step).min(hi);
            // The locks of the step at `row`.
            let mut held = None;
            if step_locks && row < hi {
                let before = pending.as_ref().and_then(|(.., h)| h.as_ref());
                held = a.locks.lock_next(before, self.keys(row, end));
                if held.is_none() {
                    // The step before's writes alone, then this step.
                    end = row;
                }
            }
            // Every byte is read into before it is written out.
            let mut bufs = pool.take((end - row) as usize);
            let reads = (row..end).zip(bufs.iter_mut()).map(|(r, b)| MemberIo {
                member: 0,
                offset: a.row_offset_of(r),
                op: IoOp::Read(&mut b[..]),
            });
            let writes = pending.iter().flat_map(|(first, w, _)| {
                (*first..).zip(w.iter()).map(|(r, b)| MemberIo {
                    member: 1,
                    offset: a.row_offset_of(r),
                    op: IoOp::Write(&b[..]),
                })
            });
            let mut ios: Vec<MemberIo> = reads.chain(writes).collect();
            let mut results = submit(&self.devices, &mut ios);
            drop(ios);
            let written = results.split_off((end - row) as usize);
            if let Some((_, w, its_locks)) = pending.take() {
                drop(its_locks);
                pool.put(w);
            }
            // The new device's error is said whatever the old one did,
            // so that the replacement is dropped, not rebuilt onto.
            let new_erred = match written.into_iter().find_map(|r| r.err()) {
                Some(e) => {
                    pair.new_err(e);
                    true
                }
                None => false,
            };
            if let Some(e) = results.into_iter().find_map(|r| r.err()) {
                pool.put(bufs);
                return Err(ArrayError::Member {
                    member: pair.old.identity().into(),
                    source: e,
                });
            }
            if new_erred {
                pool.put(bufs);
                return Ok(());
            }
            if row == hi {
                return Ok(());
            }
            if end == row {
                // Only the step before was written: now this one.
                pool.put(bufs);
                continue;
            }
            pending = Some((row, bufs, held));
            row = end;
        }
    }
}
