//! The resync after an unclean stop: the regions the write-intent bitmap
//! (`bitmap.rs`) marks, where a crash may have left parity (or a mirror's
//! copies) disagreeing with the data, are made to agree again, a step of
//! rows at a time under the locks their writers take.

use super::step_io::StepJob;
use super::*;
use crate::buf::BufPool;

impl Array {
    /// After an unclean stop: makes redundancy agree with the data in every
    /// region the bitmap marks (all regions when there is no bitmap).
    /// Returns the number of regions resynced.
    pub(super) fn resync_dirty(&self) -> Result<usize> {
        let Some(bm) = &self.bitmap else { return Ok(0) };
        let regions = bm.dirty_regions();
        if regions.is_empty() || self.geo.level == Level::Raid0 {
            return Ok(0);
        }
        let parity = matches!(self.geo.level, Level::Raid5 | Level::Raid6);
        let write_hole = |why: &str| {
            self.resync_pending.store(true, Ordering::Release);
            tracing::error!(array = %self.name, regions = regions.len(),
                "array stopped uncleanly {why}: stripes being written at the crash cannot be checked (the write hole) until it is rebuilt; the rebuild resyncs them when it ends");
        };
        // Mirrors are resynced between the copies that remain, degraded or
        // not: a crash can leave two surviving copies different, and reads
        // alternate between them. Parity cannot be checked with a member
        // missing (the journal covers writes made while degraded).
        if parity && self.state() != ArrayState::Optimal {
            write_hole("while degraded");
            return Ok(0);
        }
        tracing::warn!(array = %self.name, regions = regions.len(), "unclean stop: resyncing the regions the write-intent bitmap marks");
        let total = match self.geo.level {
            Level::Raid5 | Level::Raid6 => self.geo.rows(),
            _ => self.capacity() / self.geo.chunk,
        };
        let mut pool = BufPool::new(self.geo.chunk as usize);
        for &r in &regions {
            let lo = r as u64 * bm.region_rows;
            let hi = (lo + bm.region_rows).min(self.geo.rows());
            if parity {
                let step =
                    super::runs::step_rows(super::runs::STEP_BYTES, self.geo.chunk, hi - lo, false);
                for (a, b) in super::runs::runs_of((lo, hi), step) {
                    let _held = self.locks.lock(a..b);
                    if let Err(e) = self.resync_stripes(a..b, &mut pool) {
                        if !self.within_redundancy() {
                            return Err(e);
                        }
                        // A member failed under the resync: what is left
                        // is the degraded case above. The bits stay set.
                        write_hole(&format!("and a member failed during the resync ({e})"));
                        return Ok(0);
                    }
                }
            } else {
                // Chunks with a copy in rows [lo, hi): RAID1 row = chunk;
                // RAID10 chunk c sits in grid slots 2c and 2c+1.
                let n = self.geo.members as u64;
                let (c0, c1) = match self.geo.level {
                    Level::Raid10 => (lo * n / 2, (hi * n).div_ceil(2).min(total)),
                    _ => (lo, hi.min(total)),
                };
                // A step reads about `STEP_BYTES` of each member: a row
                // holds `n / copies` chunks.
                let rows =
                    super::runs::step_rows(super::runs::STEP_BYTES, self.geo.chunk, 1, false);
                let copies = self.geo.chunk_copies(c0).len().max(1) as u64;
                let step = (rows * n / copies).max(1);
                for (a, b) in super::runs::runs_of((c0, c1), step) {
                    let _held = self.locks.lock(a..b);
                    self.resync_mirror_chunks(a..b, &mut pool)?;
                }
            }
        }
        Ok(regions.len())
    }

    /// After a rebuild made the array optimal: the regions an unclean,
    /// degraded start could not resync are resynced now.
    pub(super) fn resync_deferred(&self) -> Result<()> {
        if self.state() == ArrayState::Optimal && self.resync_pending.load(Ordering::Acquire) {
            // Owed until it has run to the end: meanwhile no flush clears
            // the regions, and a stop does not mark the array clean.
            let n = self.resync_dirty()?;
            if self.state() == ArrayState::Optimal {
                self.resync_pending.store(false, Ordering::Release);
                tracing::warn!(array = %self.name, regions = n, "resynced the regions left by the unclean, degraded start");
            }
        }
        Ok(())
    }

    /// Makes the readable copies of each chunk of `chunks` equal: the
    /// first copy is written over the others where they differ. Every copy
    /// of the step is read in one submission into buffers from `pool` (a
    /// chunk at a time, into fresh buffers, a RAID10 resynced at about a
    /// third of a RAID5's rate, and an unclean start is not served until
    /// it ends). A member that fails (a read or a write) is left out, and
    /// what is left of the step is planned and read again: what was read
    /// from it is never written anywhere (on a RAID10 of an odd number of
    /// members, a member written for one chunk is the first copy of
    /// another). A chunk with fewer than two copies left has nothing to
    /// agree with.
    fn resync_mirror_chunks(&self, chunks: std::ops::Range<u64>, pool: &mut BufPool) -> Result<()> {
        let chunk = self.geo.chunk;
        let mut from = chunks.start;
        loop {
            let copies: Vec<Vec<(usize, u64)>> = (from..chunks.end)
                .map(|c| {
                    let places: Vec<(usize, u64)> = self
                        .geo
                        .chunk_copies(c)
                        .iter()
                        .filter(|p| self.readable(p.member, p.offset / chunk))
                        .map(|p| (p.member, self.data_offset + p.offset))
                        .collect();
                    if places.len() < 2 {
                        return Vec::new();
                    }
                    places
                })
                .collect();
            let places: Vec<(usize, u64)> = copies.iter().flatten().copied().collect();
            if places.is_empty() {
                return Ok(());
            }
            // Every byte of a buffer taken from `pool` is read into before
            // it is looked at.
            let mut bufs = pool.take(places.len());
            match self.read_places_into(&places, &mut bufs) {
                Ok(()) => {}
                Err(ReadFailure::Changed) => {
                    pool.put(bufs);
                    continue;
                }
                Err(failure) => {
                    pool.put(bufs);
                    self.fail_slots(failure, "read error during resync");
                    if !self.within_redundancy() {
                        return Err(self.failed_error());
                    }
                    continue;
                }
            }
            let mut at = 0;
            // The chunk whose write failed, if one did.
            let failed_at = (from..chunks.end).zip(&copies).find_map(|(c, cs)| {
                let (ps, bs) = (&cs[..], &bufs[at..at + cs.len()]);
                at += cs.len();
                let differing = ps
                    .iter()
                    .zip(bs)
                    .skip(1)
                    .filter(|(_, b)| b[..] != bs[0][..]);
                differing
                    .map(|(&(slot, off), _)| self.scrub_write(StepJob::Resync, slot, off, &bs[0]))
                    .any(|written| written.is_err())
                    .then_some(c)
            });
            pool.put(bufs);
            if !self.within_redundancy() {
                return Err(self.failed_error());
            }
            match failed_at {
                // Its member is failed: this chunk and the rest are planned
                // again without it.
                Some(c) => from = c,
                None => return Ok(()),
            }
        }
    }

    /// Rewrites the parity of stripes `rows` from their data where they
    /// disagree: every chunk of the step read in one submission (a stripe
    /// at a time, a resync after a crash waited for one round trip per
    /// stripe, and the array is not served until it ends), the parity
    /// recomputed in one batched call, and each chunk that differs written.
    fn resync_stripes(&self, rows: std::ops::Range<u64>, pool: &mut BufPool) -> Result<()> {
        let (nd, np) = (self.geo.data_chunks(), self.geo.level.parity_chunks());
        let width = nd + np;
        self.with_stripe_step(
            StepJob::Resync,
            rows,
            pool,
            || Ok(()),
            |places, chunks, parity| {
                let stripes = chunks.chunks(width).zip(parity.chunks(np));
                for (k, (st, want)) in stripes.enumerate() {
                    for (j, w) in want.iter().enumerate() {
                        if w[..] != st[nd + j][..] {
                            let (slot, off) = places[k * width + nd + j];
                            self.scrub_write(StepJob::Resync, slot, off, w)?;
                        }
                    }
                }
                Ok(())
            },
        )
    }
}
