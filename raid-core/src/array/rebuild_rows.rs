//! A rebuild's work on rows: the stripes' missing chunks recovered from
//! the chunks present (RAID5/6), or a mirror's copy read, and written to
//! the members being rebuilt. `rebuild.rs` decides which rows and members,
//! under which locks.

use super::*;
use crate::buf::AlignedBuf;
use crate::layout::ChunkRole;
use crate::member::{submit, IoOp, MemberIo};
use crate::parity::RecoverJob;

/// A step's rows as planned: each stripe's map, its missing chunks
/// (positions in the map), and the (stripe, position) of each chunk read.
struct Reading {
    maps: Vec<crate::layout::StripeMap>,
    missing: Vec<Vec<usize>>,
    wanted: Vec<(usize, usize)>,
}

/// A step recovered: every chunk of each of its stripes, from row `lo`.
struct Recovered {
    lo: u64,
    maps: Vec<crate::layout::StripeMap>,
    bufs: Vec<Vec<AlignedBuf>>,
}

impl Recovered {
    /// The writes of this step to the `targets`, target by target.
    fn writes<'a>(
        &'a self,
        a: &Array,
        targets: &[(usize, &'a MemberRef)],
    ) -> Vec<(&'a MemberRef, &'a [u8], u64)> {
        targets
            .iter()
            .flat_map(|&(slot, target)| {
                self.bufs
                    .iter()
                    .zip(&self.maps)
                    .enumerate()
                    .map(move |(k, (stripe, map))| {
                        let i = map.members.iter().position(|&m| m == slot).unwrap();
                        (target, &stripe[i][..], a.row_offset_of(self.lo + k as u64))
                    })
            })
            .collect()
    }
}

impl Array {
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

    /// Recovers rows [row, end) of every stripe's missing chunks and writes
    /// those of the `targets` (slot, device).
    ///
    /// The rows go in steps of `step` rows, each step's writes in the
    /// same submission as the next step's reads. Nothing about which rows
    /// are in sync changes: the caller holds every row's lock until all
    /// are written.
    pub(super) fn rebuild_parity_rows(
        &self,
        targets: &[(usize, &MemberRef)],
        (row, end): (u64, u64),
        step: u64,
        pool: &mut crate::buf::BufPool,
    ) -> Result<()> {
        let step = match self.shares_a_disk_with_sources(targets, row) {
            true => end - row,
            false => step,
        };
        // The step recovered, its writes not yet made.
        let mut pending: Option<Recovered> = None;
        let mut lo = row;
        loop {
            let hi = (lo + step).min(end);
            let reading = self.plan_recovery(lo, hi)?;
            // Every present chunk of every stripe of the step.
            let places: Vec<(usize, u64)> = reading
                .wanted
                .iter()
                .map(|&(k, i)| {
                    let row_off = self.row_offset_of(lo + k as u64);
                    (reading.maps[k].members[i], row_off)
                })
                .collect();
            let mut got = pool.take(places.len());
            let writes = pending
                .as_ref()
                .map_or_else(Vec::new, |p| p.writes(self, targets));
            let (read, wrote) = self.read_places_writing(&places, &mut got, &writes);
            drop(writes);
            // Submitted: the step before is written (or its target failed).
            let submitted = wrote.is_some();
            if let Some(done) = pending.take_if(|_| submitted) {
                // Target by target, a write per stripe of the step: every
                // target that erred is failed (and a source whose read
                // erred beside it), the first error ends the rebuild.
                let per = done.bufs.len();
                let mut failed_targets = vec![false; targets.len()];
                let mut first = None;
                for (k, r) in wrote.into_iter().flatten().enumerate() {
                    if let (Err(e), false) = (r, failed_targets[k / per]) {
                        failed_targets[k / per] = true;
                        let (slot, target) = targets[k / per];
                        let err = self.rebuild_write_failed(slot, target, e);
                        first.get_or_insert(err);
                    }
                }
                if let Some(e) = first {
                    if let Err(failed) = read {
                        self.fail_slots(failed, "read error during rebuild");
                    }
                    return Err(e);
                }
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
            pending = Some(self.recover_step(lo, reading, got, pool)?);
            lo = hi;
        }
    }

    /// Whether a target is a file on the filesystem of a member the run
    /// reads (a slot in sync at `row` that is not a target: the targets'
    /// own slots hold them, a failed slot is not read): then one disk does
    /// both, and the run is one step.
    fn shares_a_disk_with_sources(&self, targets: &[(usize, &MemberRef)], row: u64) -> bool {
        let reads = self.read_handles();
        let sources: Vec<crate::member::DeviceKey> = (0..reads.len())
            .filter(|&slot| !targets.iter().any(|&(t, _)| t == slot))
            .filter(|&slot| self.readable(slot, row))
            .map(|slot| reads[slot].device_key())
            .collect();
        targets.iter().any(|(_, t)| {
            let k = t.device_key();
            sources.iter().any(|&s| k.shares_a_disk_with(s))
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
        let wanted = (0..maps.len())
            .flat_map(|k| {
                (0..n)
                    .filter(|i| !missing[k].contains(i))
                    .map(move |i| (k, i))
                    .collect::<Vec<_>>()
            })
            .collect();
        Ok(Reading {
            maps,
            missing,
            wanted,
        })
    }

    /// Recovers the missing chunks of the step read into `got` (in
    /// `reading.wanted`'s order).
    fn recover_step(
        &self,
        lo: u64,
        reading: Reading,
        got: Vec<AlignedBuf>,
        pool: &mut crate::buf::BufPool,
    ) -> Result<Recovered> {
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
        Ok(Recovered {
            lo,
            maps: reading.maps,
            bufs,
        })
    }

    /// Writes rebuilt chunks to the new member; an error fails it and ends
    /// the rebuild.
    fn write_target(&self, slot: usize, target: &MemberRef, outs: &[(&[u8], u64)]) -> Result<()> {
        let tmembers = std::slice::from_ref(target);
        let mut writes: Vec<MemberIo> = outs
            .iter()
            .map(|&(b, offset)| MemberIo {
                member: 0,
                offset,
                op: IoOp::Write(b),
            })
            .collect();
        for r in submit(tmembers, &mut writes) {
            if let Err(e) = r {
                return Err(self.rebuild_write_failed(slot, target, e));
            }
        }
        Ok(())
    }

    /// A rebuild's write to the member it rebuilds failed: the member is
    /// failed, and the rebuild ends with the error.
    fn rebuild_write_failed(&self, slot: usize, target: &MemberRef, e: io::Error) -> ArrayError {
        self.fail_slot_if(slot, target, &format!("write error during rebuild: {e}"));
        ArrayError::Member {
            member: target.identity().into(),
            source: e,
        }
    }

    fn row_offset_of(&self, row: u64) -> u64 {
        self.data_offset + row * self.geo.chunk
    }

    pub(super) fn rebuild_mirror_rows(
        &self,
        slot: usize,
        target: &MemberRef,
        row: u64,
        end: u64,
    ) -> Result<()> {
        let chunk = self.geo.chunk as usize;
        loop {
            let mut places = Vec::new();
            for r in row..end {
                let ChunkRole::Data(c) = self.geo.chunk_at(slot, r) else {
                    unreachable!("mirrors hold data only")
                };
                let src = self
                    .geo
                    .chunk_copies(c)
                    .into_iter()
                    .find(|p| {
                        p.member != slot && self.readable(p.member, p.offset / self.geo.chunk)
                    })
                    .ok_or_else(|| self.failed_error())?;
                places.push((src.member, self.data_offset + src.offset));
            }
            let bufs = match self.read_places(&places, chunk) {
                Ok(b) => b,
                Err(failed) => {
                    self.fail_slots(failed, "read error during rebuild");
                    continue;
                }
            };
            let outs: Vec<(&[u8], u64)> = bufs
                .iter()
                .zip(row..end)
                .map(|(b, r)| (&b[..], self.row_offset_of(r)))
                .collect();
            return self.write_target(slot, target, &outs);
        }
    }
}
