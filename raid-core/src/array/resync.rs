//! The resync after an unclean stop: the regions the write-intent bitmap
//! (`bitmap.rs`) marks, where a crash may have left parity (or a mirror's
//! copies) disagreeing with the data, are made to agree again, a step of
//! rows at a time under the locks their writers take.
//!
//! It runs before the array is served (`ResyncAt::Start`, what a library
//! caller gets), or, as md does, while it is served (`ResyncAt::Background`,
//! the daemon's way: a big array whose every region was being written would
//! otherwise stay unserved for as long as reading all of it takes). Until a
//! resync has run to its end it is owed (`Owed`): no flush clears a bit, a
//! stop does not mark the array clean (so the next start resyncs again), a
//! scrub is refused, a mirror's reads go to the first readable copy of
//! each chunk (the one the resync keeps), and a read of a mirror chunk the
//! resync has not reached reads every copy and is answered where they agree
//! (`copies_read.rs`), and resyncs the chunk first, under its lock, where
//! they do not, so that a block reads the
//! same whatever member fails after; a RAID5/6 stripe it has not reached
//! is written by reconstruct-write.

use super::step_io::StepJob;
use super::*;
use crate::buf::BufPool;

/// How an unclean start resyncs the regions its bitmap marks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResyncAt {
    /// Before the assembly returns: the array is served only once its
    /// redundancy agrees with its data.
    #[default]
    Start,
    /// While the array is served: owed at the assembly, and run by
    /// `Array::kick_resync` on a thread of its own.
    Background,
}

/// A resync owed, and the one pass that runs at a time.
#[derive(Default)]
pub(super) struct Owed {
    /// Regions an unclean stop marked are not all resynced yet.
    pending: AtomicBool,
    /// Held by a resync pass for its whole length: a background resync and
    /// the one a rebuild's end runs never overlap.
    pass: Mutex<()>,
    /// How far the pass running (or the last one) is.
    count: ResyncCount,
    /// A parity array's rows (a mirror's chunks) below this have been
    /// resynced since the start, by any pass: a write there may
    /// read-modify-write again, a read there reads as it always does.
    resynced_below: AtomicU64,
    /// The shortest run of holes a resync skips, per member; 0: the
    /// jobs' default (`skip_holes::HOLE_BYTES`).
    hole_bytes: AtomicU64,
}

impl Owed {
    pub(super) fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Whether stripe `s` (a mirror's chunk `s`) may still be as an
    /// unclean stop tore it (its parity not agreeing with its data, its
    /// copies not with each other): a resync is owed and has not passed
    /// it. A read-modify-write there would carry the parity's error into
    /// the new parity, and a member failing before the resync comes would
    /// then be rebuilt wrong from it, this write's data included; so such
    /// a stripe is written by reconstruct-write, which computes the parity
    /// from the data and makes the stripe agree (md forces the same ahead
    /// of its resync). Such a mirror chunk's copies are compared before it
    /// is read (`copies_read.rs`), and resynced first where they differ
    /// (`resync_chunk_before_read`).
    pub(super) fn may_be_torn(&self, s: u64) -> bool {
        self.pending() && s >= self.resynced_below.load(Ordering::Acquire)
    }
}

/// How far a resync pass is: regions done and in all.
#[derive(Default)]
struct ResyncCount {
    done: AtomicU64,
    total: AtomicU64,
}

/// How a resync pass ended.
enum ResyncEnd {
    /// Every region marked was resynced (how many).
    Done(usize),
    /// Asked to stop, or out of the steps it was given: still owed.
    Stopped,
    /// A parity array is (or became) degraded: owed until its rebuild.
    WriteHole,
}

impl Array {
    /// Whether a resync is owed (an unclean start's, not run to its end).
    pub fn resync_owed(&self) -> bool {
        self.resync.pending()
    }

    /// An unclean start's resync, before the array is served. Returns the
    /// number of regions resynced (0 where a degraded parity array leaves
    /// it owed until the rebuild).
    pub(super) fn resync_dirty(&self) -> Result<usize> {
        let _one = self.resync.pass.lock();
        match self.resync_regions(&AtomicBool::new(false), false, usize::MAX)? {
            ResyncEnd::Done(n) => Ok(n),
            ResyncEnd::Stopped | ResyncEnd::WriteHole => Ok(0),
        }
    }

    /// An unclean start that resyncs while served: the resync is owed
    /// from now (or, for a degraded parity array, until its rebuild).
    /// Returns the number of regions marked.
    pub(super) fn owe_resync(&self) -> usize {
        let regions = self.regions_to_resync().len();
        // As a start that resyncs first says: none resynced now.
        if regions == 0 || self.owed_while_degraded(regions) {
            return 0;
        }
        self.resync.pending.store(true, Ordering::Release);
        tracing::warn!(array = %self.name, regions,
            "unclean stop: the regions the write-intent bitmap marks are resynced while the array is served");
        regions
    }

    /// Whether an owed resync can run now: a parity array's needs every
    /// member in sync; a mirror's runs between the copies there are.
    pub(super) fn resync_runnable(&self) -> bool {
        let state = self.state();
        self.resync.pending()
            && match self.geo.level.parity_chunks() {
                0 => state != ArrayState::Failed,
                _ => state == ArrayState::Optimal,
            }
    }

    /// The resync owed, where it can run now (running, or about to: the
    /// daemon's monitor starts it, a rebuild's end runs it).
    pub fn resync_progress(&self) -> Option<super::ResyncProgress> {
        self.resync_runnable().then(|| super::ResyncProgress {
            regions_done: self.resync.count.done.load(Ordering::Acquire),
            regions_total: self.resync.count.total.load(Ordering::Acquire),
        })
    }

    /// Runs an owed resync to its end (`stop` ends it early, still owed);
    /// nothing to do where none is owed or it cannot run yet. The
    /// background resync's and a rebuild's end's.
    pub(super) fn resync_owed_pass(&self, stop: &AtomicBool) -> Result<()> {
        self.resync_owed_steps(stop, usize::MAX)
    }

    /// `resync_owed_pass`, which stops, still owed, after `steps` steps.
    fn resync_owed_steps(&self, stop: &AtomicBool, steps: usize) -> Result<()> {
        let _one = self.resync.pass.lock();
        if !self.resync_runnable() || stop.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.resync_regions(stop, true, steps)? {
            ResyncEnd::Done(n) => {
                // Its repairs durable before it is no longer owed: from
                // then on a flush may clear the regions' bits, and one
                // whose members' flush came before the last repairs would
                // otherwise clear them with those repairs still in the
                // drives' caches (a cut would then keep the clear bit and
                // lose the repair: a stripe torn and never resynced).
                self.flush_present(false)?;
                self.resync.pending.store(false, Ordering::Release);
                tracing::warn!(array = %self.name, regions = n, "resynced the regions an unclean stop left");
                self.record_event(ArrayEvent::ResyncFinished { regions: n as u64 });
            }
            ResyncEnd::Stopped => {
                tracing::warn!(array = %self.name, "resync stopped before its end: still owed (a later pass goes on from where it stopped; after a restart, the next start resyncs again)");
            }
            ResyncEnd::WriteHole => {}
        }
        Ok(())
    }

    /// Before a read of mirror chunk `c` that an unclean stop may have torn
    /// and the resync has not reached: its copies are made to agree first,
    /// the first readable one written over the others, under the chunk's
    /// lock. What the read returns is then on every copy, so no member
    /// failing later makes the block read as a copy that never took the
    /// write in flight at the crash (md's resync leaves that window open:
    /// a read returns the first copy, and losing that disk before the
    /// resync has come reverts the block to the other's). A read comes
    /// here where it found its copies differing, or could not compare
    /// them (`copies_read.rs`).
    pub(super) fn resync_chunk_before_read(&self, c: u64) -> Result<()> {
        let _held = self.locks.lock([c]);
        if !self.mirror_chunk_may_be_torn(c) {
            return Ok(());
        }
        self.resync_mirror_chunks(c..c + 1, &mut BufPool::new(self.geo.chunk as usize))
    }

    /// Whether a read of mirror chunk `c` must compare its copies, or
    /// resync it first where they differ (`copies_read.rs`): the
    /// resync owed can still run (a failed array's cannot: its reads go
    /// on as before) and has not passed the chunk, and a region of the
    /// chunk's rows was marked (bits an unclean stop left stay set while
    /// the resync is owed; a region whose bit is clear held no write at
    /// the crash, whatever a writer sets meanwhile).
    pub(super) fn mirror_chunk_may_be_torn(&self, c: u64) -> bool {
        let chunk = self.geo.chunk;
        self.resync.may_be_torn(c)
            && self.resync_runnable()
            && self.geo.chunk_copies(c).iter().any(|p| {
                let row = p.offset / chunk;
                !self.rows_clean(row, row + 1)
            })
    }

    /// Skips runs of holes from `bytes` per member in the resyncs to come,
    /// not from `skip_holes::HOLE_BYTES`: for the deterministic
    /// simulation, whose disks are smaller than one such run (a rebuild's
    /// and a scrub's take it in their options).
    #[doc(hidden)]
    pub fn set_resync_hole_bytes(&self, bytes: u64) {
        self.resync.hole_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Runs the resync owed in the caller's thread, what `kick_resync`
    /// runs on a thread of its own: for a caller that schedules its work
    /// itself (the deterministic simulation).
    pub fn run_resync(&self) -> Result<()> {
        self.resync_owed_pass(&AtomicBool::new(false))
    }

    /// Runs at most `steps` steps of the resync owed in the caller's
    /// thread, as `run_resync` runs all of them, and says whether it is
    /// still owed: for the deterministic simulation, which plays requests
    /// between the steps, against rows the resync has passed and rows it
    /// has not (the next call goes on where this one stopped).
    #[doc(hidden)]
    pub fn run_resync_steps(&self, steps: usize) -> Result<bool> {
        self.resync_owed_steps(&AtomicBool::new(false), steps)?;
        Ok(self.resync_owed())
    }

    /// After a rebuild made the array optimal: the regions an unclean,
    /// degraded start could not resync (or a background resync had not
    /// reached yet) are resynced now, unless `stop` (the rebuild's) says
    /// the array is stopping: then they stay owed. So do they where a full
    /// filesystem refuses a repair: the rebuild itself finished, and the
    /// next start, with space freed, resyncs them.
    pub(super) fn resync_deferred(&self, stop: &AtomicBool) -> Result<()> {
        if self.state() != ArrayState::Optimal {
            return Ok(());
        }
        match self.resync_owed_pass(stop) {
            Err(ArrayError::NoSpace { .. }) => {
                tracing::warn!(array = %self.name, "the resync after the rebuild met a full filesystem: it stays owed until the next start");
                Ok(())
            }
            r => r,
        }
    }

    /// Rows [lo, hi) of a resync (stripes on RAID5/6, logical chunks on a
    /// mirror) as its steps of at most `step` rows, less the runs where
    /// every member holds a hole (`skip_holes.rs`, as a scrub skips them):
    /// zeros everywhere agree, parity and copies alike, so a crash that
    /// marked a region of a sparse array costs the resync the region's
    /// data, not its size. A write or discard a crash tore left data (new
    /// or old) on some device, so its rows are never skipped. Asked without the locks, as a scrub
    /// asks: a write that lands after the answer is one made while the
    /// resync is owed (a reconstruct-write, or every copy), which leaves
    /// its rows agreeing. The position moves past skipped rows with the
    /// next step resynced after them; writers there then trust the rows as
    /// they are (zeros, or what such a write made agree).
    fn resync_runs(&self, (lo, hi): (u64, u64), step: u64) -> Vec<(u64, u64)> {
        let hole_bytes = match self.resync.hole_bytes.load(Ordering::Relaxed) {
            0 => super::skip_holes::HOLE_BYTES,
            n => n,
        };
        self.scrub_spans((lo, hi), hole_bytes)
            .into_iter()
            .filter(|&(_, _, holes)| !holes)
            .flat_map(|(a, b, _)| super::runs::runs_of((a, b), step))
            .collect()
    }

    /// The regions the bitmap marks, which a resync has to do (none
    /// without a bitmap, or on RAID0), its count reset to them.
    fn regions_to_resync(&self) -> Vec<usize> {
        let regions = match &self.bitmap {
            Some(bm) if self.geo.level != Level::Raid0 => bm.dirty_regions(),
            _ => Vec::new(),
        };
        let count = &self.resync.count;
        count.done.store(0, Ordering::Release);
        count.total.store(regions.len() as u64, Ordering::Release);
        regions
    }

    /// Whether the `regions` marked are owed until a rebuild: parity
    /// cannot be checked with a member missing (the journal covers writes
    /// made while degraded); mirrors are resynced between the copies that
    /// remain, degraded or not (a crash can leave two surviving copies
    /// different).
    fn owed_while_degraded(&self, regions: usize) -> bool {
        let parity = self.geo.level.parity_chunks() > 0;
        let owed = parity && self.state() != ArrayState::Optimal;
        if owed {
            self.owe_after_write_hole(regions, "while degraded");
        }
        owed
    }

    /// A parity array's resync cannot run (`why`): owed until the rebuild.
    fn owe_after_write_hole(&self, regions: usize, why: &str) {
        self.resync.pending.store(true, Ordering::Release);
        tracing::error!(array = %self.name, regions,
            "array stopped uncleanly {why}: stripes being written at the crash cannot be checked (the write hole) until it is rebuilt; the rebuild resyncs them when it ends");
    }

    /// Makes redundancy agree with the data in every region the bitmap
    /// marks, a step at a time under the locks writers take; `paced`
    /// (the array is served meanwhile): at most the rebuild's rate limit,
    /// counted as a rebuild counts, per member (`raidctl rate --rebuild`).
    /// `stop` is asked before each step, and the pass stops after `steps`.
    ///
    /// A pass starts where the passes before it since the start stopped
    /// (`resynced_below`): the rows below were made to agree, and every
    /// write since has kept them so (read-modify-write there is allowed
    /// again), so a pass stopped midway, or one left owed by a member's
    /// failure until the rebuild's end, does not read them again.
    /// Callers hold `resync.pass`.
    fn resync_regions(&self, stop: &AtomicBool, paced: bool, steps: usize) -> Result<ResyncEnd> {
        let (began, live) = (std::time::Instant::now(), Some(self.rebuild_rate_live()));
        let mut moved = 0u64;
        let mut pace_after = |rows: u64| {
            moved += rows * self.geo.chunk;
            if paced {
                let stopped = || stop.load(Ordering::Acquire);
                super::pace(None, &live, moved, began, &stopped);
            }
        };
        let mut steps_left = steps;
        let mut may_step = || {
            let go = steps_left > 0 && !stop.load(Ordering::Acquire);
            steps_left = steps_left.saturating_sub(1);
            go
        };
        let regions = self.regions_to_resync();
        if regions.is_empty() {
            return Ok(ResyncEnd::Done(0));
        }
        if self.owed_while_degraded(regions.len()) {
            return Ok(ResyncEnd::WriteHole);
        }
        let (count, bm) = (
            &self.resync.count,
            self.bitmap.as_ref().expect("regions marked"),
        );
        let parity = matches!(self.geo.level, Level::Raid5 | Level::Raid6);
        tracing::warn!(array = %self.name, regions = regions.len(), "unclean stop: resyncing the regions the write-intent bitmap marks");
        let total = match self.geo.level {
            Level::Raid5 | Level::Raid6 => self.geo.rows(),
            _ => self.capacity() / self.geo.chunk,
        };
        let mut pool = BufPool::new(self.geo.chunk as usize);
        let n = self.geo.members as u64;
        // Region `r` as the rows (a mirror's chunks) the resync goes
        // through: a mirror's are the chunks with a copy in its rows
        // (RAID1 row = chunk; RAID10 chunk c sits in grid slots 2c and
        // 2c+1).
        let span = |r: usize| {
            let lo = r as u64 * bm.region_rows;
            let hi = (lo + bm.region_rows).min(self.geo.rows());
            match self.geo.level {
                Level::Raid5 | Level::Raid6 => (lo, hi),
                Level::Raid10 => (lo * n / 2, (hi * n).div_ceil(2).min(total)),
                _ => (lo, hi.min(total)),
            }
        };
        // The regions an earlier pass of this start passed count as done
        // from the start, so a resumed pass's progress goes on from where
        // the last one's stood.
        let below = self.resync.resynced_below.load(Ordering::Acquire);
        let passed = regions.iter().filter(|&&r| span(r).1 <= below).count();
        count.done.store(passed as u64, Ordering::Release);
        for &r in &regions {
            let (lo, hi) = span(r);
            if hi <= below {
                continue;
            }
            let lo = lo.max(below);
            if parity {
                let step =
                    super::runs::step_rows(super::runs::STEP_BYTES, self.geo.chunk, hi - lo, false);
                for (a, b) in self.resync_runs((lo, hi), step) {
                    if !may_step() {
                        return Ok(ResyncEnd::Stopped);
                    }
                    let held = self.locks.lock(a..b);
                    if let Err(e) = self.resync_stripes(a..b, &mut pool) {
                        // A full filesystem fails no member: the pass
                        // stops where it is, still owed (the bits stay
                        // set), and goes on once there is space.
                        if !self.within_redundancy() || matches!(e, ArrayError::NoSpace { .. }) {
                            return Err(e);
                        }
                        // A member failed under the resync: what is left
                        // is the degraded case above. The bits stay set.
                        let why = format!("and a member failed during the resync ({e})");
                        self.owe_after_write_hole(regions.len(), &why);
                        return Ok(ResyncEnd::WriteHole);
                    }
                    // Under the step's locks: a writer that finds its row
                    // below this finds it resynced.
                    self.resync.resynced_below.fetch_max(b, Ordering::AcqRel);
                    drop(held);
                    pace_after(b - a);
                }
            } else {
                // A step reads about `STEP_BYTES` of each member: a row
                // holds `n / copies` chunks.
                let rows =
                    super::runs::step_rows(super::runs::STEP_BYTES, self.geo.chunk, 1, false);
                let copies = self.geo.chunk_copies(lo).len().max(1) as u64;
                let step = (rows * n / copies).max(1);
                for (a, b) in self.resync_runs((lo, hi), step) {
                    if !may_step() {
                        return Ok(ResyncEnd::Stopped);
                    }
                    let held = self.locks.lock(a..b);
                    self.resync_mirror_chunks(a..b, &mut pool)?;
                    self.resync.resynced_below.fetch_max(b, Ordering::AcqRel);
                    drop(held);
                    // A member holds `copies / n` of a chunk per chunk.
                    pace_after(((b - a) * copies).div_ceil(n));
                }
            }
            count.done.fetch_add(1, Ordering::Release);
        }
        Ok(ResyncEnd::Done(regions.len()))
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
            // The chunk whose write failed, if one did, and why.
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
                    .find_map(|written| written.err())
                    .map(|e| (c, e))
            });
            pool.put(bufs);
            if !self.within_redundancy() {
                return Err(self.failed_error());
            }
            match failed_at {
                // A full filesystem fails no member, and the copies cannot
                // be made to agree until there is space: the caller (a
                // read of the chunk, the resync) gets the error.
                Some((_, e @ ArrayError::NoSpace { .. })) => return Err(e),
                // Its member is failed: this chunk and the rest are planned
                // again without it.
                Some((c, _)) => from = c,
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
