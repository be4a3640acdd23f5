//! The write-intent bitmap: one bit per region of rows, set durably on every
//! member before the first write into the region, cleared after a flush that
//! covers every write into it. After a crash, only regions with their bit set
//! can hold stripes whose parity (or mirror copies) disagree with the data,
//! so the next start resyncs just those (`resync.rs`).
//!
//! Clearing uses generations: `flush` bumps the generation, flushes the
//! members, then clears the bits of regions that have no write in flight and
//! whose last write finished before the bump, once they have lingered
//! (below). A write that finished after the bump may not be durable yet, so
//! its region stays dirty until the next flush. Setting and clearing happen
//! under one lock, so a write can never start in a region whose bit a
//! concurrent flush is clearing.
//!
//! Bits linger: a region is cleared only once no write has touched it for
//! `BITMAP_LINGER` (md's bitmap waits its `daemon_sleep` the same way),
//! as the flushes see it: the first flush to find a region's last write
//! generation as it was starts its idle time, so the write path reads no
//! clock.
//! Clearing at every flush made each write of an `fsync` loop (a database's
//! log, a journal's commits) pay a bitmap write to set its region's bit and
//! another to clear it, each a write and a flush of every member. A bit
//! left set costs only the resync of its region after a crash. Regions left
//! set when writes stop are cleared by the next flush after their linger,
//! or by `settle_bitmap` (the daemon's monitor calls it), and all of them
//! at an orderly stop.

use super::*;
use crate::buf::AlignedBuf;
use crate::metadata::{BITMAP_BYTES, BITMAP_OFFSET};
use std::ops::RangeInclusive;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

/// How long a region's bit stays set after its last write ended, by
/// default (`Array::set_bitmap_linger`).
pub const BITMAP_LINGER: Duration = Duration::from_secs(5);
/// `linger_ms` for bits cleared only at an orderly stop.
const NEVER: u64 = u64::MAX;

/// The block's last bytes: its write sequence and the sequence of the last
/// write that cleared a bit (`Bitmap::seq`), where the array's regions
/// leave them free.
const STAMP_BYTES: usize = 16;
/// Regions an array created now may have: the block, less its stamp. (An
/// array created before the stamp may have up to `BITMAP_BYTES * 8`; its
/// block then has no room for one, and carries none.)
const MAX_REGIONS: u64 = ((BITMAP_BYTES - STAMP_BYTES) * 8) as u64;
/// Smallest region: fewer rows would set bits more often than it saves in
/// resync time.
const MIN_REGION_ROWS: u64 = 16;

pub(super) struct Bitmap {
    pub region_rows: u64,
    /// The bits, 64 regions a word, as they are or are about to be on disk.
    words: Vec<AtomicU64>,
    /// The bits known to be on every member's disk: a write into a region
    /// whose durable bit is set takes no lock at all. A bit set in `words`
    /// but not here is being written: later writers wait for it (on `io`)
    /// rather than write data a crash could leave unmarked.
    durable: Vec<AtomicU64>,
    /// Serialises the bitmap's writes to the members (and so the order in
    /// which set and cleared states reach the disk).
    io: Mutex<()>,
    in_flight: Vec<AtomicU32>,
    last_gen: Vec<AtomicU64>,
    gen: AtomicU64,
    /// Per region, the `last_gen` a flush last found there, and since
    /// when (ms since `born`) it has been found so: the region's idle
    /// time. Touched under `io` only.
    idle_gen: Vec<AtomicU64>,
    idle_since: Vec<AtomicU64>,
    born: Instant,
    /// When the last flush's clearing ran (ms since `born`).
    last_clear_ms: AtomicU64,
    /// Held by `settle_bitmap` while it flushes, and by `close`: a stop
    /// waits for a settle under way (whose caller may hold the array) and
    /// no settle starts during one.
    settling: Mutex<()>,
    /// How long (ms) a region's bit lingers after its last write (`NEVER`:
    /// until an orderly stop).
    linger_ms: AtomicU64,
    /// The stamp, where the block has room for it (`stamped`): `seq` is
    /// bumped by every write of the block, `cleared_at` is the `seq` of the
    /// last one that cleared a bit. Bits are set before a write and cleared
    /// once it is durable everywhere, so a member whose own block's `seq`
    /// is at least `cleared_at` holds every write not in a region marked
    /// now; one below it is an older copy of itself (an image put back)
    /// that may lack writes whose bits were cleared since (`re_add`).
    stamped: bool,
    seq: AtomicU64,
    cleared_at: AtomicU64,
}

/// Largest sequence a stamp this code wrote can carry: far beyond any
/// count of bitmap writes, and far enough below `u64::MAX` that bumping it
/// never wraps. A block claiming more (a device's old bytes, 0xFF fill) was
/// not stamped by an array and is no stamp.
const MAX_SEQ: u64 = 1 << 62;

/// The stamp of a bitmap block, (seq, cleared_at), if it is one this code
/// could have written: a clear is one of the block's writes, so never
/// later than the last (`cleared_at <= seq`), and `seq <= MAX_SEQ`.
/// Devices whose block an array never wrote (a new disk, a spare, one that
/// held something else) can carry any bytes there.
pub(super) fn stamp_of(block: &[u8]) -> Option<(u64, u64)> {
    let at = BITMAP_BYTES - STAMP_BYTES;
    let word = |i: usize| u64::from_le_bytes(block[at + i..at + i + 8].try_into().unwrap());
    let (seq, cleared) = (word(0), word(8));
    (cleared <= seq && seq <= MAX_SEQ).then_some((seq, cleared))
}

/// Whether an array of `rows` rows in regions of `region_rows` leaves its
/// bitmap block room for the stamp.
pub(super) fn stamped(region_rows: u64, rows: u64) -> bool {
    rows.div_ceil(region_rows) <= MAX_REGIONS
}

/// The bitmap an array starts with from its slot members' blocks (spares
/// hold none: the bitmap is written to slots only): the union of their
/// bits (a dirty bit too many costs a resync of one region, one too few a
/// torn stripe), and the newest of their valid stamps (`stamp_of`).
pub(super) fn union_of(region_rows: u64, rows: u64, blocks: &[Vec<u8>]) -> Vec<u8> {
    let mut union = vec![0u8; BITMAP_BYTES];
    for b in blocks {
        union.iter_mut().zip(b.iter()).for_each(|(u, x)| *u |= x);
    }
    if stamped(region_rows, rows) {
        let (seq, cleared) = blocks
            .iter()
            .filter_map(|b| stamp_of(b))
            .fold((0, 0), |a, s| (a.0.max(s.0), a.1.max(s.1)));
        union[BITMAP_BYTES - STAMP_BYTES..].copy_from_slice(&stamp_bytes(seq, cleared));
    }
    union
}

/// The stamp's bytes, as `stamp_of` reads them.
fn stamp_bytes(seq: u64, cleared_at: u64) -> [u8; STAMP_BYTES] {
    let mut b = [0u8; STAMP_BYTES];
    b[..8].copy_from_slice(&seq.to_le_bytes());
    b[8..].copy_from_slice(&cleared_at.to_le_bytes());
    b
}

/// The bitmap block a device gets as it joins an array (created, added as
/// a spare, put in a slot): no bits, stamp (0, 0), so whatever it held
/// before is never read as this array's bitmap.
pub(super) fn blank_block() -> AlignedBuf {
    AlignedBuf::new(BITMAP_BYTES)
}

/// Rows per region for an array of `rows` rows.
pub(super) fn region_rows_for(rows: u64) -> u64 {
    rows.div_ceil(MAX_REGIONS).max(MIN_REGION_ROWS)
}

impl Bitmap {
    pub fn new(region_rows: u64, rows: u64, bits: Vec<u8>) -> Bitmap {
        let regions = rows.div_ceil(region_rows) as usize;
        let mut bits = bits;
        bits.resize(BITMAP_BYTES, 0);
        let stamped = stamped(region_rows, rows);
        let (seq, cleared_at) = if stamped {
            stamp_of(&bits).unwrap_or((0, 0))
        } else {
            (0, 0)
        };
        // Bits past the last region (the stamp among them) mark nothing.
        for r in regions..BITMAP_BYTES * 8 {
            bits[r / 8] &= !(1 << (r % 8));
        }
        let words = |bits: &[u8]| -> Vec<AtomicU64> {
            bits.chunks(8)
                .map(|c| AtomicU64::new(u64::from_le_bytes(c.try_into().unwrap())))
                .collect()
        };
        Bitmap {
            region_rows,
            words: words(&bits),
            durable: words(&bits),
            io: Mutex::new(()),
            in_flight: (0..regions).map(|_| AtomicU32::new(0)).collect(),
            last_gen: (0..regions).map(|_| AtomicU64::new(0)).collect(),
            gen: AtomicU64::new(1),
            idle_gen: (0..regions).map(|_| AtomicU64::new(0)).collect(),
            idle_since: (0..regions).map(|_| AtomicU64::new(0)).collect(),
            born: Instant::now(),
            last_clear_ms: AtomicU64::new(0),
            settling: Mutex::new(()),
            linger_ms: AtomicU64::new(BITMAP_LINGER.as_millis() as u64),
            stamped,
            seq: AtomicU64::new(seq),
            cleared_at: AtomicU64::new(cleared_at),
        }
    }

    pub(super) fn stamped(&self) -> bool {
        self.stamped
    }

    pub(super) fn cleared_at(&self) -> u64 {
        self.cleared_at.load(Ordering::Acquire)
    }

    fn is_set(&self, r: usize) -> bool {
        self.words[r / 64].load(Ordering::SeqCst) & (1 << (r % 64)) != 0
    }

    fn is_durable(&self, r: usize) -> bool {
        self.durable[r / 64].load(Ordering::SeqCst) & (1 << (r % 64)) != 0
    }

    /// The on-disk form: bit r is byte r/8, bit r%8 (little-endian words).
    fn block(&self) -> Vec<u8> {
        self.words
            .iter()
            .flat_map(|w| w.load(Ordering::SeqCst).to_le_bytes())
            .collect()
    }

    /// How many regions' bits are set (bits past the last region are
    /// never set).
    fn dirty_count(&self) -> usize {
        self.words
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones() as usize)
            .sum()
    }

    pub fn dirty_regions(&self) -> Vec<usize> {
        (0..self.in_flight.len())
            .filter(|&r| self.is_set(r))
            .collect()
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Whether region `r`'s bit has lingered long enough to be cleared
    /// (`now`: `now_ms`); any region when `forced` (an orderly stop). A
    /// region whose last write generation changed since the last flush
    /// looked starts its idle time now. Callers hold `io`.
    fn lingered(&self, r: usize, now: u64, forced: bool) -> bool {
        let g = self.last_gen[r].load(Ordering::SeqCst);
        if self.idle_gen[r].swap(g, Ordering::Relaxed) != g {
            self.idle_since[r].store(now, Ordering::Relaxed);
        }
        let linger = self.linger_ms.load(Ordering::Relaxed);
        forced
            || (linger != NEVER
                && now.saturating_sub(self.idle_since[r].load(Ordering::Relaxed)) >= linger)
    }

    /// Whether a flush now would be worth it for the bits alone: a region
    /// set with no writer counted in, and no flush for a linger (a flush
    /// looks at the regions, and clears those idle for their linger).
    fn settle_due(&self) -> bool {
        let linger = self.linger_ms.load(Ordering::Relaxed);
        linger != NEVER
            && self
                .now_ms()
                .saturating_sub(self.last_clear_ms.load(Ordering::Relaxed))
                >= linger
            && (0..self.in_flight.len())
                .any(|r| self.is_set(r) && self.in_flight[r].load(Ordering::SeqCst) == 0)
    }
}

/// Held while a write is in flight in some regions.
pub(super) struct WriteIntent<'a> {
    bm: &'a Bitmap,
    regions: RangeInclusive<usize>,
}

impl Drop for WriteIntent<'_> {
    fn drop(&mut self) {
        self.bm.leave(self.regions.clone());
    }
}

impl Bitmap {
    /// Counts a writer into `regions` at the current generation.
    fn enter(&self, regions: RangeInclusive<usize>) {
        let g = self.gen.load(Ordering::SeqCst);
        for r in regions {
            self.in_flight[r].fetch_add(1, Ordering::SeqCst);
            self.last_gen[r].fetch_max(g, Ordering::SeqCst);
        }
    }

    /// A writer counted into `regions` leaves them.
    pub(super) fn leave(&self, regions: RangeInclusive<usize>) {
        let g = self.gen.load(Ordering::Acquire);
        for r in regions {
            // fetch_max, not store: between the load above and here another
            // writer of this region may have recorded a later generation,
            // and lowering it would let `clear_settled` clear the region
            // after a flush that did not cover that writer's data.
            self.last_gen[r].fetch_max(g, Ordering::AcqRel);
            self.in_flight[r].fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Array {
    /// Member rows a write of [offset, offset+len) touches.
    fn rows_touched(&self, offset: u64, len: u64) -> (u64, u64) {
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => {
                let sdb = self.geo.stripe_data_bytes();
                (offset / sdb, (offset + len - 1) / sdb)
            }
            _ => {
                let first = offset / self.geo.chunk;
                let last = (offset + len - 1) / self.geo.chunk;
                let rows = |c: u64| {
                    self.geo
                        .chunk_copies(c)
                        .into_iter()
                        .map(|p| p.offset / self.geo.chunk)
                };
                (rows(first).min().unwrap(), rows(last).max().unwrap())
            }
        }
    }

    fn regions_touched(&self, bm: &Bitmap, offset: u64, len: u64) -> RangeInclusive<usize> {
        let (lo, hi) = self.rows_touched(offset, len);
        (lo / bm.region_rows) as usize..=(hi / bm.region_rows) as usize
    }

    /// `intend_write` for a writer that must not block (`async_write`):
    /// counted in only where every region's bit is durable already and the
    /// array is within its redundancy. `Some(None)`: no bitmap;
    /// `Some(Some(regions))`: counted in, to `Bitmap::leave` once; `None`:
    /// nothing held, the blocking `intend_write` is the way.
    pub(super) fn try_intend_write(
        &self,
        offset: u64,
        len: u64,
    ) -> Option<Option<RangeInclusive<usize>>> {
        let Some(bm) = &self.bitmap else {
            return Some(None);
        };
        let regions = self.regions_touched(bm, offset, len);
        // Counted in before reading the bits, as `intend_write` does.
        bm.enter(regions.clone());
        if regions.clone().all(|r| bm.is_durable(r)) && self.within_redundancy() {
            return Some(Some(regions));
        }
        bm.leave(regions);
        None
    }

    /// Records the intent to write [offset, offset+len): the regions' bits
    /// are durable on every member before this returns.
    ///
    /// Lock-free when the bits are set already. Against a concurrent
    /// `clear_settled`, the order is: the writer counts itself in, then
    /// reads the bit; the cleaner clears the bit, then re-reads the count
    /// and puts the bit back if a writer came in. (All SeqCst: whichever
    /// way they interleave, either the writer sees the bit cleared and
    /// takes the slow path, or the cleaner sees the writer and keeps it.)
    pub(super) fn intend_write(&self, offset: u64, len: u64) -> Result<Option<WriteIntent<'_>>> {
        let Some(bm) = &self.bitmap else {
            return Ok(None);
        };
        let regions = self.regions_touched(bm, offset, len);
        bm.enter(regions.clone());
        let missing = !regions.clone().all(|r| bm.is_durable(r));
        let intent = WriteIntent {
            bm,
            regions: regions.clone(),
        };
        // Group commit: the bits go into `words` before the lock, so the
        // writer holding it writes every bit set by those waiting behind it,
        // and marks all of them durable; a waiter then finds its bits
        // durable and writes nothing. (A bit in `words` and not durable is
        // only ever trusted as "maybe dirty": resync and re-add treat it as
        // set, `clear_settled` skips it while its writer is counted in.)
        if missing {
            for r in regions.clone() {
                bm.words[r / 64].fetch_or(1 << (r % 64), Ordering::SeqCst);
            }
            let _io = bm.io.lock();
            if !regions.clone().all(|r| bm.is_durable(r)) {
                let snap: Vec<u64> = bm.words.iter().map(|w| w.load(Ordering::SeqCst)).collect();
                let block: Vec<u8> = snap.iter().flat_map(|w| w.to_le_bytes()).collect();
                self.write_bitmap(&block, false);
                // On disk now: writers of these regions may pass without the lock.
                for (d, w) in bm.durable.iter().zip(&snap) {
                    d.fetch_or(*w, Ordering::SeqCst);
                }
            }
        }
        if !self.within_redundancy() {
            return Err(self.failed_error());
        }
        Ok(Some(intent))
    }

    /// Whether bits may be cleared at all. Not while a slot is out of sync:
    /// then the set bits say which regions were written since the member
    /// left, and `re_add` resyncs only those when it comes back (and a
    /// degraded start keeps what a crash left). Nor after a write failed on
    /// a full filesystem: its stripe may be torn, and the next start
    /// resyncs it from this bit. Nor while a resync is owed (an unclean,
    /// degraded start could not do it): its regions must stay marked until
    /// it has run.
    fn may_clear(&self) -> bool {
        self.every_slot_in_sync() && self.out_of_space.lock().is_none() && !self.resync.pending()
    }

    /// Clears the regions every write of which finished before
    /// `flushed_gen`, and long enough ago that their bits have lingered
    /// (`BITMAP_LINGER`), or all such regions where `forced` (an orderly
    /// stop: no write follows).
    pub(super) fn clear_settled(&self, flushed_gen: u64, forced: bool) {
        let Some(bm) = &self.bitmap else { return };
        if !self.may_clear() {
            return;
        }
        let _io = bm.io.lock();
        // Nor after an orderly stop (whose own flush came before it): the
        // devices may be another start's by now.
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let mut changed = false;
        let now = bm.now_ms();
        bm.last_clear_ms.store(now, Ordering::Relaxed);
        for r in 0..bm.in_flight.len() {
            if !bm.is_set(r)
                || bm.in_flight[r].load(Ordering::SeqCst) != 0
                || bm.last_gen[r].load(Ordering::SeqCst) >= flushed_gen
                || !bm.lingered(r, now, forced)
            {
                continue;
            }
            // The durable bit first: a writer arriving from now on takes the
            // slow path, which waits for this lock.
            bm.durable[r / 64].fetch_and(!(1 << (r % 64)), Ordering::SeqCst);
            bm.words[r / 64].fetch_and(!(1 << (r % 64)), Ordering::SeqCst);
            if bm.in_flight[r].load(Ordering::SeqCst) != 0 {
                // A writer came in meanwhile: it may have seen the bit set
                // (and it still is, on disk: nothing was written yet).
                bm.words[r / 64].fetch_or(1 << (r % 64), Ordering::SeqCst);
                bm.durable[r / 64].fetch_or(1 << (r % 64), Ordering::SeqCst);
            } else {
                changed = true;
            }
        }
        if changed {
            self.write_bitmap(&bm.block(), true);
        }
    }

    /// Regions of the write-intent bitmap whose bits are set: what a crash
    /// now would resync (none without a bitmap: RAID0).
    pub fn bitmap_dirty_regions(&self) -> usize {
        self.bitmap.as_ref().map_or(0, |bm| bm.dirty_count())
    }

    /// Regions the write-intent bitmap has (None without one: RAID0).
    pub fn bitmap_regions(&self) -> Option<usize> {
        self.bitmap.as_ref().map(|bm| bm.in_flight.len())
    }

    /// How long a region's bit stays set after its last write ended
    /// (`BITMAP_LINGER` unless set here): zero clears it at the first flush
    /// after the write, `None` only at an orderly stop (`close`).
    pub fn set_bitmap_linger(&self, linger: Option<Duration>) {
        if let Some(bm) = &self.bitmap {
            let ms = linger.map_or(NEVER, |d| (d.as_millis() as u64).min(NEVER - 1));
            bm.linger_ms.store(ms, Ordering::Relaxed);
        }
    }

    /// Clears the bits of regions no write has touched for their linger,
    /// after the flush that makes their writes durable: for an array whose
    /// writes stopped with no flush after them. Does nothing (no flush)
    /// where a flush ran within the linger (it looked at the regions) or
    /// no region's bit is set with no writer in it, so it flushes at most
    /// once a linger. The daemon calls it every few seconds.
    pub fn settle_bitmap(&self) -> Result<()> {
        let Some(_settling) = self.bitmap.as_ref().and_then(|bm| bm.settling.try_lock()) else {
            return Ok(());
        };
        match self.bitmap_settle_due() {
            true => self.flush_checked(false),
            false => Ok(()),
        }
    }

    /// Waits for a `settle_bitmap` under way and holds off others: `close`.
    pub(super) fn hold_settles(&self) -> Option<parking_lot::MutexGuard<'_, ()>> {
        self.bitmap.as_ref().map(|bm| bm.settling.lock())
    }

    /// Whether `settle_bitmap` would flush now (cheap: no I/O).
    pub fn bitmap_settle_due(&self) -> bool {
        self.bitmap.as_ref().is_some_and(|bm| {
            !self.closed.load(Ordering::Acquire) && self.may_clear() && bm.settle_due()
        })
    }

    /// Whether no region holding member rows [lo, hi) has its bit set: no
    /// write reached them since the bitmap was last clean. Callers hold the
    /// rows' stripe locks (a writer sets its bits before taking them).
    pub(super) fn rows_clean(&self, lo: u64, hi: u64) -> bool {
        let Some(bm) = &self.bitmap else { return false };
        let (first, last) = (
            (lo / bm.region_rows) as usize,
            ((hi - 1) / bm.region_rows) as usize,
        );
        (first..=last).all(|r| !bm.is_set(r))
    }

    /// Blanks `m`'s bitmap block (`blank_block`) as it joins the array, and
    /// flushes it there before any metadata names it: otherwise the next
    /// start would read what the device held before (another array's
    /// block, old bytes) as this array's bits and stamp.
    pub(super) fn blank_bitmap_of(&self, m: &MemberRef) -> Result<()> {
        if self.bitmap.is_none() {
            return Ok(());
        }
        m.write_at(&blank_block(), BITMAP_OFFSET)
            .and_then(|_| m.flush())
            .map_err(|source| ArrayError::Member {
                member: m.identity().into(),
                source,
            })
    }

    /// Writes the bitmap as it is to every member not failed: a member that
    /// just joined holds it from now on, not only after the next change.
    pub(super) fn rewrite_bitmap(&self) {
        if let Some(bm) = &self.bitmap {
            let _io = bm.io.lock();
            self.write_bitmap(&bm.block(), false);
        }
    }

    /// Starts a flush generation; returns it for `clear_settled`.
    pub(super) fn bitmap_generation(&self) -> u64 {
        self.bitmap
            .as_ref()
            .map(|b| b.gen.fetch_add(1, Ordering::AcqRel) + 1)
            .unwrap_or(0)
    }

    /// Writes the bitmap block durably to every member not failed
    /// (`write_durably`: with FUA, or then a flush), stamped
    /// (`Bitmap::seq`; `clearing`: it clears a bit). A member that cannot
    /// take it is failed. Callers hold `io`.
    fn write_bitmap(&self, bits: &[u8], clearing: bool) {
        self.activity.bitmap_writes.add(1);
        let mut block = AlignedBuf::new(BITMAP_BYTES);
        block.copy_from_slice(&bits[..BITMAP_BYTES]);
        let mut stamp_seq = 0;
        if let Some(bm) = self.bitmap.as_ref().filter(|bm| bm.stamped) {
            // Callers hold `io`, so this is the only writer of both. The
            // start is at most MAX_SEQ (`stamp_of`): no wrap in 2^62 writes.
            let seq = bm.seq.load(Ordering::Acquire) + 1;
            bm.seq.store(seq, Ordering::Release);
            if clearing {
                bm.cleared_at.store(seq, Ordering::Release);
            }
            let cleared = bm.cleared_at.load(Ordering::Acquire);
            block[BITMAP_BYTES - STAMP_BYTES..].copy_from_slice(&stamp_bytes(seq, cleared));
            stamp_seq = seq;
        }
        // Every member's write in one submission, then every flush at once
        // (none where a member takes FUA): two device round trips at most,
        // where a write and a flush per member one after another were two
        // per member.
        let (handles, erred) =
            self.write_durably(&self.present_slots(), &[(BITMAP_OFFSET, &block)]);
        for (i, e) in erred {
            self.slots[i]
                .missed_bitmap_seq
                .store(stamp_seq, Ordering::Release);
            self.fail_slot_if(i, &handles[i], &format!("bitmap write failed: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_with(seq: u64, cleared: u64, fill: u8) -> Vec<u8> {
        let mut b = vec![fill; BITMAP_BYTES];
        b[BITMAP_BYTES - STAMP_BYTES..].copy_from_slice(&stamp_bytes(seq, cleared));
        b
    }

    #[test]
    fn only_stamps_an_array_could_have_written_are_stamps() {
        assert_eq!(stamp_of(&block_with(7, 5, 0)), Some((7, 5)));
        assert_eq!(
            stamp_of(&block_with(MAX_SEQ, MAX_SEQ, 0)),
            Some((MAX_SEQ, MAX_SEQ))
        );
        assert_eq!(stamp_of(&vec![0xFF; BITMAP_BYTES]), None);
        assert_eq!(
            stamp_of(&block_with(5, 7, 0)),
            None,
            "a clear after the last write"
        );
        assert_eq!(stamp_of(&block_with(MAX_SEQ + 1, 0, 0)), None);
    }

    #[test]
    fn the_union_keeps_every_bit_and_the_newest_valid_stamp() {
        let (region_rows, rows) = (16, 16 * 100);
        let mut a = block_with(40, 30, 0);
        a[0] = 0b01;
        let mut b = block_with(45, 20, 0);
        b[0] = 0b10;
        let junk = vec![0xFF; BITMAP_BYTES];
        let u = union_of(region_rows, rows, &[a, b, junk]);
        assert_eq!(stamp_of(&u), Some((45, 30)));
        let bm = Bitmap::new(region_rows, rows, u);
        assert_eq!(bm.seq.load(Ordering::Relaxed), 45);
        assert_eq!(bm.cleared_at(), 30);
        // The junk block's bits count (every region dirty), but not past
        // the last region.
        assert_eq!(bm.dirty_regions(), (0..100).collect::<Vec<_>>());
        assert!(bm
            .words
            .iter()
            .skip(2)
            .all(|w| w.load(Ordering::Relaxed) == 0));
    }
}
