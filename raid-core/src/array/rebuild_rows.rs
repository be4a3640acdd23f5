//! A rebuild's work on rows: the stripes' missing chunks recovered from
//! the chunks present (RAID5/6), or a mirror's copy read, and written to
//! the members being rebuilt. `rebuild.rs` decides which rows and members,
//! under which locks.

use super::member_io::{ReadFailure, TargetWrite};
use super::*;
use crate::buf::AlignedBuf;
use crate::layout::ChunkRole;
use crate::member::{submit, IoOp, MemberIo};
use crate::parity::RecoverJob;

/// A step's rows as planned: each stripe's map, its missing chunks
/// (positions in the map), and the places read (slot, member offset),
/// stripe by stripe, present chunks ascending.
struct Reading {
    maps: Vec<crate::layout::StripeMap>,
    missing: Vec<Vec<usize>>,
    places: Vec<(usize, u64)>,
}

/// A step recovered: every chunk of each of its stripes, from row `lo`.
struct Recovered {
    lo: u64,
    maps: Vec<crate::layout::StripeMap>,
    bufs: Vec<Vec<AlignedBuf>>,
}

impl Recovered {
    /// The writes of this step to the `targets`: (index in `targets`, the
    /// bytes, the member offset).
    fn writes<'a>(&'a self, a: &Array, targets: &[(usize, &MemberRef)]) -> Vec<TargetWrite<'a>> {
        let mut out = Vec::with_capacity(targets.len() * self.bufs.len());
        for (t, &(slot, _)) in targets.iter().enumerate() {
            for (k, (stripe, map)) in self.bufs.iter().zip(&self.maps).enumerate() {
                let i = map.members.iter().position(|&m| m == slot).unwrap();
                out.push((t, &stripe[i][..], a.row_offset_of(self.lo + k as u64)));
            }
        }
        out
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
    /// The rows go in steps (`runs::step_rows`), each step's writes in
    /// the same submission as the next step's reads. Nothing about which
    /// rows are in sync changes: the caller holds every row's lock until
    /// all are written.
    pub(super) fn rebuild_parity_rows(
        &self,
        targets: &[(usize, &MemberRef)],
        (row, end): (u64, u64),
        step_bytes: u64,
        pool: &mut crate::buf::BufPool,
    ) -> Result<()> {
        let one_disk = self.shares_a_disk_with_sources(targets, row);
        let step = super::runs::step_rows(step_bytes, self.geo.chunk, end - row, one_disk);
        let to: Vec<&MemberRef> = targets.iter().map(|&(_, m)| m).collect();
        // The step recovered, its writes not yet made.
        let mut pending: Option<Recovered> = None;
        let mut lo = row;
        loop {
            let hi = (lo + step).min(end);
            let reading = self.plan_recovery(lo, hi)?;
            let mut got = pool.take(reading.places.len());
            let writes = pending
                .as_ref()
                .map_or_else(Vec::new, |p| p.writes(self, targets));
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
            if let Some(done) = pending.take_if(|_| submitted) {
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
    /// `reading.places`' order).
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
                let src = self
                    .mirror_source(slot, r)
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
