//! A rebuild's work on rows: the stripes' missing chunks recovered from
//! the chunks present (RAID5/6), or a mirror's copy read, and written to
//! the members being rebuilt. `rebuild.rs` decides which rows and members,
//! under which locks.

use super::member_io::{ReadFailure, TargetWrite};
use super::*;
use crate::buf::AlignedBuf;
use crate::layout::ChunkRole;
use crate::parity::RecoverJob;

/// A step's rows as planned: the places read (slot, member offset), and
/// for RAID5/6 each stripe's map and missing chunks (positions in the
/// map), stripe by stripe, present chunks ascending; a mirror reads one
/// copy of each row's chunk and has neither.
struct Reading {
    maps: Vec<crate::layout::StripeMap>,
    missing: Vec<Vec<usize>>,
    places: Vec<(usize, u64)>,
}

/// A step recovered, from row `lo`: each row's buffers (a stripe's every
/// chunk, or the mirror copy read), and for each target the index in each
/// row's buffers of the chunk it is written.
struct Recovered {
    lo: u64,
    bufs: Vec<Vec<AlignedBuf>>,
    at: Vec<Vec<usize>>,
}

impl Recovered {
    /// The writes of this step to the `targets`: (index in `targets`, the
    /// bytes, the member offset).
    fn writes<'a>(&'a self, a: &Array) -> Vec<TargetWrite<'a>> {
        let mut out = Vec::with_capacity(self.at.len() * self.bufs.len());
        for (t, at) in self.at.iter().enumerate() {
            for (k, (row, &i)) in self.bufs.iter().zip(at).enumerate() {
                out.push((t, &row[i][..], a.row_offset_of(self.lo + k as u64)));
            }
        }
        out
    }
}

/// The members of `all` a run writes (`write`, as `judge_run` says), as
/// (slot, device).
fn written<'j>(all: &'j [super::rebuild::Joined], write: &[bool]) -> Vec<(usize, &'j MemberRef)> {
    all.iter()
        .zip(write)
        .filter(|(_, &w)| w)
        .map(|(j, _)| (j.ticket.slot, &j.member))
        .collect()
}

impl Array {
    /// Rebuilds one run of a batch onto the members `all` joined, and
    /// returns the rows written to each (a re-added member's clean rows
    /// are skipped). A run of data alone, written to every member, goes
    /// step by step, each step locking its own rows (`rebuild_steps`); one
    /// with holes or rows skipped is locked whole while it is judged again
    /// and worked, so that what the judgement spared (zeroed rather than
    /// read, or not written) cannot change before the member counts it in
    /// sync. Rows are marked rebuilt for every member, so that writers
    /// write them.
    pub(super) fn rebuild_run(
        &self,
        all: &[super::rebuild::Joined],
        (lo, hi): super::runs::Run,
        opts: &RebuildOptions,
        pool: &mut crate::buf::BufPool,
    ) -> Result<Vec<u64>> {
        let mark = |upto| {
            for j in all {
                self.mark_rebuilt(&j.ticket, lo, upto);
            }
        };
        let first = all.first().map_or(0, |j| j.ticket.slot);
        let (write, spans) = self.judge_run(all, (lo, hi), opts.hole_bytes);
        if write.iter().all(|&w| w) && spans.iter().all(|&(.., holes)| !holes) {
            // What was judged without the locks may change: recovering
            // every row from the others and writing it is right whatever
            // does.
            let to = written(all, &write);
            self.rebuild_steps(&to, (lo, hi), opts.step_bytes, pool, Some(&mark))?;
            return Ok(vec![hi - lo; all.len()]);
        }
        let _held = self.locks.lock(self.rebuild_lock_keys(first, lo, hi));
        let written = self.rebuild_run_judged(all, (lo, hi), opts, pool)?;
        mark(hi);
        Ok(written)
    }

    /// Which members a run writes (a re-added member's clean rows hold
    /// what they should, as do those a hot replace copied before its
    /// source failed), and its spans (first row, end, holes): rows whose
    /// every source holds holes are zeroed, not read (`skip_holes.rs`).
    fn judge_run(
        &self,
        all: &[super::rebuild::Joined],
        (lo, hi): super::runs::Run,
        hole_bytes: u64,
    ) -> (Vec<bool>, Vec<(u64, u64, bool)>) {
        let write: Vec<bool> = all
            .iter()
            .map(|j| !(hi <= j.dirty_below && self.rows_clean(lo, hi)))
            .collect();
        let slots: Vec<usize> = written(all, &write).iter().map(|&(s, _)| s).collect();
        let spans = match slots.is_empty() {
            true => Vec::new(),
            false => self.rebuild_spans(&slots, (lo, hi), hole_bytes),
        };
        (write, spans)
    }

    /// Rebuilds a run as judged (`judge_run`) now; callers hold its rows'
    /// locks.
    fn rebuild_run_judged(
        &self,
        all: &[super::rebuild::Joined],
        (lo, hi): super::runs::Run,
        opts: &RebuildOptions,
        pool: &mut crate::buf::BufPool,
    ) -> Result<Vec<u64>> {
        let (write, spans) = self.judge_run(all, (lo, hi), opts.hole_bytes);
        let to = written(all, &write);
        for (a, b, holes) in spans {
            match holes {
                true => self.rebuild_zero_rows(&to, a, b)?,
                false => self.rebuild_steps(&to, (a, b), opts.step_bytes, pool, None)?,
            }
        }
        Ok(write.iter().map(|&w| if w { hi - lo } else { 0 }).collect())
    }

    /// The same lock keys the writers of these rows take.
    pub(super) fn rebuild_lock_keys(&self, slot: usize, row: u64, end: u64) -> Vec<u64> {
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => (row..end).collect(),
            _ => (row..end)
                .map(|r| match self.geo.chunk_at(slot, r) {
                    ChunkRole::Data(c) => c,
                    _ => unreachable!("mirrors hold data only"),
                })
                .collect(),
        }
    }

    /// Recovers rows [row, end) of every stripe's missing chunks (RAID5/6)
    /// or reads a copy of each row's chunk (a mirror, one target), and
    /// writes those of the `targets` (slot, device).
    ///
    /// The rows go in steps (`runs::step_rows`), each step's writes in
    /// the same submission as the next step's reads. With `marked`, each
    /// step locks its own rows, from before its reads until its writes
    /// are done, and `marked(upto)` says the rows below `upto` are written
    /// before that step lets them go (`sync::Ahead`), so writers into the
    /// run wait for a step or two, not for the whole of it. The next step's
    /// rows are locked while the step before still holds its own where the
    /// lock table's order allows (`StripeLocks::lock_above`); where it does
    /// not (the rows wrap around the table), the step before is written
    /// alone first. Without `marked` the caller holds every row's lock
    /// until all are written, and nothing about which rows are in sync
    /// changes here.
    pub(super) fn rebuild_steps(
        &self,
        targets: &[(usize, &MemberRef)],
        (row, end): (u64, u64),
        step_bytes: u64,
        pool: &mut crate::buf::BufPool,
        marked: Option<&dyn Fn(u64)>,
    ) -> Result<()> {
        let one_disk = self.shares_a_disk_with_sources(targets, (row, end));
        let step = super::runs::step_rows(step_bytes, self.geo.chunk, end - row, one_disk);
        let to: Vec<&MemberRef> = targets.iter().map(|&(_, m)| m).collect();
        // The lock keys are rows on RAID5/6, whichever slot; a mirror's
        // are its one target's chunks.
        let key_slot = targets.first().map_or(0, |&(slot, _)| slot);
        // The step recovered, its writes not yet made, with its rows'
        // locks (where steps lock their own).
        let mut pending: Option<(Recovered, Option<super::locks::Held<'_>>)> = None;
        // The locks of the step at `lo`, once taken.
        let mut held = None;
        let mut lo = row;
        loop {
            let mut hi = (lo + step).min(end);
            if marked.is_some() && lo < end && held.is_none() {
                let before = pending.as_ref().and_then(|(_, h)| h.as_ref());
                held = self
                    .locks
                    .lock_next(before, self.rebuild_lock_keys(key_slot, lo, hi));
                if held.is_none() {
                    // The step before's writes alone, then this step.
                    hi = lo;
                }
            }
            let reading = self.plan_step(key_slot, lo, hi)?;
            let mut got = pool.take(reading.places.len());
            let writes = pending
                .as_ref()
                .map_or_else(Vec::new, |(p, _)| p.writes(self));
            let (read, wrote) = self.read_places_writing(&reading.places, &mut got, (&to, &writes));
            // Each target that erred is failed (with a source whose read
            // erred beside it); the first error ends the rebuild.
            let mut erred: Vec<Option<io::Error>> = targets.iter().map(|_| None).collect();
            for (&(t, _, _), r) in writes.iter().zip(wrote) {
                if let Err(e) = r {
                    erred[t].get_or_insert(e);
                }
            }
            drop(writes);
            // Submitted (not `Changed`): the step before is written.
            let submitted = !matches!(read, Err(ReadFailure::Changed));
            if let Some((done, its_locks)) = pending.take_if(|_| submitted) {
                let mut first = None;
                for (&(slot, target), e) in targets.iter().zip(erred) {
                    if let Some(e) = e {
                        first.get_or_insert(self.rebuild_write_failed(slot, target, e));
                    }
                }
                if let Some(e) = first {
                    if let Err(failed) = read {
                        self.fail_slots(failed, "read error during rebuild");
                    }
                    return Err(e);
                }
                if let Some(marked) = marked {
                    marked(done.lo + done.bufs.len() as u64);
                }
                drop(its_locks);
                pool.put(done.bufs.into_iter().flatten());
            }
            if let Err(failed) = read {
                pool.put(got);
                self.fail_slots(failed, "read error during rebuild");
                continue;
            }
            if lo == end {
                debug_assert!(pending.is_none() && got.is_empty());
                return Ok(());
            }
            if hi == lo {
                // Only the step before was written: now this one.
                debug_assert!(got.is_empty());
                continue;
            }
            let done = self.recover_step(targets, lo, reading, got, pool)?;
            pending = Some((done, held.take()));
            lo = hi;
        }
    }

    /// Whether a target is a file on the filesystem of a member the run
    /// reads: on RAID5/6 a slot in sync at `row` that is not a target (the
    /// targets' own slots hold them, a failed slot is not read), on a
    /// mirror a slot holding a copy the run's rows read (on RAID10, one
    /// of the target's pair, not the other pairs). Then one disk does
    /// both, and the run is one step.
    fn shares_a_disk_with_sources(
        &self,
        targets: &[(usize, &MemberRef)],
        (row, end): (u64, u64),
    ) -> bool {
        let reads = self.read_handles();
        let mut read: Vec<usize> = match (self.geo.level, targets) {
            (Level::Raid5 | Level::Raid6, _) => (0..reads.len())
                .filter(|&slot| !targets.iter().any(|&(t, _)| t == slot))
                .filter(|&slot| self.readable(slot, row))
                .collect(),
            (_, &[(slot, _)]) => (row..end)
                .filter_map(|r| self.mirror_source(slot, r))
                .map(|p| p.member)
                .collect(),
            _ => Vec::new(),
        };
        read.sort_unstable();
        read.dedup();
        targets.iter().any(|(_, t)| {
            let k = t.device_key();
            read.iter()
                .any(|&s| k.shares_a_disk_with(reads[s].device_key()))
        })
    }

    /// What a step of rows [lo, hi) reads: on RAID5/6 the chunks that
    /// recover the missing ones (`plan_recovery`), on a mirror a readable
    /// copy of each row's chunk of `slot`. Err where a row has too few.
    fn plan_step(&self, slot: usize, lo: u64, hi: u64) -> Result<Reading> {
        if matches!(self.geo.level, Level::Raid5 | Level::Raid6) {
            return self.plan_recovery(lo, hi);
        }
        let places = (lo..hi)
            .map(|r| {
                let src = self
                    .mirror_source(slot, r)
                    .ok_or_else(|| self.failed_error())?;
                Ok((src.member, self.data_offset + src.offset))
            })
            .collect::<Result<_>>()?;
        Ok(Reading {
            maps: Vec::new(),
            missing: Vec::new(),
            places,
        })
    }

    /// Which chunks of rows [lo, hi) are missing and which are read to
    /// recover them; none for an empty range. Err where a stripe misses
    /// more than the level can recover.
    fn plan_recovery(&self, lo: u64, hi: u64) -> Result<Reading> {
        let n = self.geo.members;
        let maps: Vec<_> = (lo..hi).map(|s| self.geo.stripe_map(s)).collect();
        let missing: Vec<Vec<usize>> = maps
            .iter()
            .zip(lo..hi)
            .map(|(m, s)| {
                (0..n)
                    .filter(|&i| !self.readable(m.members[i], s))
                    .collect()
            })
            .collect();
        if missing
            .iter()
            .any(|m| m.len() > self.geo.level.parity_chunks())
        {
            return Err(self.failed_error());
        }
        let places = (lo..hi)
            .zip(maps.iter().zip(&missing))
            .flat_map(|(s, (map, miss))| {
                (0..n)
                    .filter(|i| !miss.contains(i))
                    .map(move |i| (map.members[i], self.row_offset_of(s)))
            })
            .collect();
        Ok(Reading {
            maps,
            missing,
            places,
        })
    }

    /// Recovers the missing chunks of the step read into `got` (in
    /// `reading.places`' order) for the `targets`; a mirror's copies, read,
    /// are its one target's chunks as they are.
    fn recover_step(
        &self,
        targets: &[(usize, &MemberRef)],
        lo: u64,
        reading: Reading,
        got: Vec<AlignedBuf>,
        pool: &mut crate::buf::BufPool,
    ) -> Result<Recovered> {
        if !matches!(self.geo.level, Level::Raid5 | Level::Raid6) {
            // One target's chunks are read (`plan_step`) and locked.
            assert!(targets.len() <= 1, "mirrors are rebuilt one slot per pass");
            let rows = got.len();
            return Ok(Recovered {
                lo,
                bufs: got.into_iter().map(|b| vec![b]).collect(),
                at: targets.iter().map(|_| vec![0; rows]).collect(),
            });
        }
        let n = self.geo.members;
        // Every byte of a buffer taken from `pool` is read into or
        // recovered before it is used: the chunks as read, stripe by
        // stripe, present chunks ascending; another buffer only where a
        // chunk is missing, for the recovery to fill.
        let mut got = got.into_iter();
        let mut bufs: Vec<Vec<AlignedBuf>> = reading
            .missing
            .iter()
            .map(|miss| {
                (0..n)
                    .map(|i| match miss.contains(&i) {
                        true => pool.take_one(),
                        false => got.next().expect("a read for each present chunk"),
                    })
                    .collect()
            })
            .collect();
        debug_assert!(got.next().is_none());
        let mut jobs: Vec<RecoverJob> = bufs
            .iter_mut()
            .zip(&reading.missing)
            .map(|(stripe, miss)| RecoverJob {
                chunks: stripe.iter_mut().map(|b| &mut b[..]).collect(),
                missing: miss.clone(),
            })
            .collect();
        let kind = if self.geo.level == Level::Raid6 {
            crate::parity::ParityKind::PQ
        } else {
            crate::parity::ParityKind::P
        };
        self.engine.recover_batch(kind, &mut jobs)?;
        drop(jobs);
        let at = targets
            .iter()
            .map(|&(slot, _)| {
                let at = |m: &crate::layout::StripeMap| m.members.iter().position(|&s| s == slot);
                reading.maps.iter().map(|m| at(m).unwrap()).collect()
            })
            .collect();
        Ok(Recovered { lo, bufs, at })
    }

    /// A rebuild's write to the member it rebuilds failed: the member is
    /// failed, and the rebuild ends with the error.
    pub(super) fn rebuild_write_failed(
        &self,
        slot: usize,
        target: &MemberRef,
        e: io::Error,
    ) -> ArrayError {
        self.fail_slot_if(slot, target, &format!("write error during rebuild: {e}"));
        ArrayError::Member {
            member: target.identity().into(),
            source: e,
        }
    }

    pub(super) fn row_offset_of(&self, row: u64) -> u64 {
        self.data_offset + row * self.geo.chunk
    }
}
