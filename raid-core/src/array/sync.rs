//! Which rows of a rebuilding member are in sync.
//!
//! A rebuild pass moves a cursor over the rows; a member it rebuilds is in
//! sync from the row its rebuild began at (`Slot::rebuild_from`) up to the
//! pass's position for it (`Slot::rebuild_row`). Most rebuilds begin at row
//! 0, so that is a prefix. A member that joins a pass already under way
//! (a RAID6's second replacement while the first is being rebuilt) begins
//! at the cursor: the pass goes on to the last row, then from row 0 up to
//! where that member began (the position carries `WRAPPED` then), so one
//! pass of reads serves both, and the first member is not held back.
//!
//! Readers take no lock, so every change keeps each intermediate state a
//! subset of the rows really in sync: a position is read before the start
//! (`in_sync`), and a join stores the start before the position (both
//! moves of an empty range: `[0, 0)` to `[c, 0)` to `[c, c)`).
//!
//! The metadata keeps one row per slot, meaning "rows below it are in
//! sync" (`saved_row`): a member that joined a pass is saved at 0 until the
//! pass wraps, then at its position; after a restart it redoes what the
//! saved row leaves out, which costs time, never data. The row saved is
//! the one the rebuild last flushed the member at, not its position, so
//! metadata written by anyone (a failure, a spare) never counts rows
//! whose writes may still sit in the member's cache.
//!
//! Within a batch, the rows a rebuild's run has written count in
//! sync ahead of the position (`Ahead`): each step is locked on its own
//! (`rebuild_rows.rs`), so a writer into the batch waits for the step
//! under way, not for the whole batch, and must then write the new
//! member wherever the step before it already did. A row comes in sync
//! there only from a mark made after its write completed, under its
//! stripe's lock, so no writer sees it come in sync during its write.
//! Marks dropped without the locks (a new batch's, a new member's) only
//! take rows out of sync, which a writer may see mid-write: it then
//! skips the member, and the rebuild recomputes the row, under its lock,
//! after it.

use super::{Array, Slot, SlotState};
use std::sync::atomic::{AtomicU64, Ordering};

/// Marks a position past the last row and on from row 0.
pub(super) const WRAPPED: u64 = 1 << 63;

/// Most runs of a batch (`runs::run_and_batch_rows`).
pub(super) const MOST_RUNS: usize = 16;

/// Rows of the batch under way written ahead of the position, run by
/// run: each entry one run's first row and how many of its rows are
/// written, in one word (row << 16 | rows), so a reader never pairs one
/// run's start with another's count. An entry says only what was
/// written under the rows' locks, so one left from an earlier batch
/// still holds (its rows are below the position by then, or were written
/// and are written by every writer since); a new member of the slot
/// starts with none (`clear`).
#[derive(Default)]
pub(super) struct Ahead {
    runs: [AtomicU64; MOST_RUNS],
}

impl Ahead {
    fn pack(lo: u64, rows: u64) -> u64 {
        debug_assert!(rows < 1 << 16 && lo < 1 << 48);
        lo << 16 | rows
    }

    /// A batch's runs begin, nothing of them written: `runs` their first
    /// rows. Only while no run of the slot is under way.
    pub(super) fn begin(&self, runs: impl ExactSizeIterator<Item = u64>) {
        assert!(runs.len() <= MOST_RUNS, "a mark for each run");
        self.clear();
        for (e, lo) in self.runs.iter().zip(runs) {
            e.store(Self::pack(lo, 0), Ordering::Release);
        }
    }

    /// Counts nothing ahead of the position.
    pub(super) fn clear(&self) {
        for e in &self.runs {
            e.store(0, Ordering::Release);
        }
    }

    /// The run that begins at `lo` has written every row below `upto`.
    /// Callers hold those rows' locks, and the slot's member is the one
    /// written (`Array::mark_rebuilt`). A run with no mark begun would
    /// have its rows skipped by writers, then counted in sync as the
    /// batch ends: that stops the rebuild rather than lose the writes.
    pub(super) fn wrote(&self, lo: u64, upto: u64) {
        let e = self
            .runs
            .iter()
            .find(|e| e.load(Ordering::Acquire) >> 16 == lo)
            .expect("every run of a batch has a mark begun");
        e.store(Self::pack(lo, upto - lo), Ordering::Release);
    }

    /// Whether `row` is written ahead of the position.
    fn covers(&self, row: u64) -> bool {
        self.runs.iter().any(|e| {
            let v = e.load(Ordering::Acquire);
            let (lo, rows) = (v >> 16, v & 0xffff);
            lo <= row && row < lo + rows
        })
    }
}

impl Slot {
    /// The rebuild's (start, position, wrapped): the position read before
    /// and after the start, until both reads agree, so the pair is never
    /// the start of a new rebuild of the slot with the position of the
    /// one before (`start_rebuilding` stores the position, then the
    /// start).
    fn sync_state(&self) -> (u64, u64, bool) {
        loop {
            let pos = self.rebuild_row.load(Ordering::Acquire);
            let from = self.rebuild_from.load(Ordering::Acquire);
            if self.rebuild_row.load(Ordering::Acquire) == pos {
                return (from, pos & !WRAPPED, pos & WRAPPED != 0);
            }
        }
    }

    /// Whether `row` of a rebuilding member is in sync: within the
    /// position, or written ahead of it. The position first, the rows most
    /// asked about, without a look at the marks; where it says no, the
    /// marks, then the position again: a batch's end moves the position
    /// before a later batch resets the marks, so a reader that finds a
    /// row's mark gone finds the position past it on its second look.
    pub(super) fn in_sync(&self, row: u64) -> bool {
        self.within_position(row) || self.ahead.covers(row) || self.within_position(row)
    }

    fn within_position(&self, row: u64) -> bool {
        let (from, pos, wrapped) = self.sync_state();
        match wrapped {
            false => from <= row && row < pos,
            true => row >= from || row < pos,
        }
    }

    /// The rows of a rebuilding member in sync, as at most two ranges
    /// `[lo, hi)` of `rows` (empty ones left out).
    pub(super) fn sync_ranges(&self, rows: u64) -> Vec<(u64, u64)> {
        let (from, pos, wrapped) = self.sync_state();
        let ranges = match wrapped {
            false => vec![(from, pos)],
            true => vec![(0, pos), (from, rows)],
        };
        ranges.into_iter().filter(|(lo, hi)| lo < hi).collect()
    }

    /// How many rows of a rebuilding member are in sync.
    pub(super) fn rows_in_sync(&self, rows: u64) -> u64 {
        self.sync_ranges(rows).iter().map(|(lo, hi)| hi - lo).sum()
    }

    /// The row the metadata keeps (`persist`, whoever calls it): every row
    /// below it is in sync, and was on the member's medium when the
    /// rebuild last flushed it (`flushed_to`).
    pub(super) fn saved_row(&self) -> u64 {
        self.rebuild_saved.load(Ordering::Acquire)
    }

    /// Where the rows in sync make a prefix: every row below the result
    /// (see the module's doc).
    pub(super) fn prefix_in_sync(&self) -> u64 {
        let (from, pos, wrapped) = self.sync_state();
        match (from, wrapped) {
            (0, _) | (_, true) => pos,
            _ => 0,
        }
    }

    /// The rebuild flushed the member after writing every row below
    /// `prefix` (a `prefix_in_sync` read before the flush): the metadata
    /// may say so from now on. Never lower within one rebuild (a new one
    /// starts it at 0): a rebuild's end saves the last row, and a later
    /// save of the pass (`prefix_in_sync`, the row a member that joined
    /// late began at) must not take back what writes since have relied on.
    pub(super) fn flushed_to(&self, prefix: u64) {
        self.rebuild_saved.fetch_max(prefix, Ordering::AcqRel);
    }

    /// The metadata on every member not failed says rows below `row` are
    /// in sync (`persist`).
    pub(super) fn durable_to(&self, row: u64) {
        self.rebuild_durable.store(row, Ordering::Release);
    }

    /// Whether `row` of a rebuilding member is in sync and stays so after
    /// a crash: below the row the metadata on disk says. A crash takes the
    /// member back there, and its rows from there on are rebuilt from the
    /// other members'.
    pub(super) fn durably_in_sync(&self, row: u64) -> bool {
        self.in_sync(row) && row < self.rebuild_durable.load(Ordering::Acquire)
    }

    /// Whether nothing of the member is in sync yet.
    pub(super) fn sync_empty(&self) -> bool {
        let (from, pos, wrapped) = self.sync_state();
        !wrapped && from == pos
    }

    /// Whether every row of the member is in sync (`rows` in all).
    pub(super) fn sync_full(&self, rows: u64) -> bool {
        let (from, pos, wrapped) = self.sync_state();
        match wrapped {
            false => from == 0 && pos == rows,
            true => pos >= from,
        }
    }
}

impl Array {
    /// Whether slot `slot` holds valid data at `row` (chunk row of the member).
    pub(super) fn readable(&self, slot: usize, row: u64) -> bool {
        let s = &self.slots[slot];
        match s.state() {
            SlotState::Active => true,
            SlotState::Rebuilding => s.in_sync(row),
            SlotState::Failed => false,
        }
    }

    /// Whether slot `slot` holds valid data at `row` that a crash keeps
    /// valid (`readable`, and for a rebuilding member `durably_in_sync`).
    /// A stripe write whose members are all readable but not all so goes
    /// through the journal, as a degraded one does: after a crash that
    /// member's row counts as missing and is rebuilt from the others,
    /// which the write, torn, would leave disagreeing; rebuilt from them,
    /// the member's chunk would be wrong, though no one wrote it.
    pub(super) fn readable_after_a_crash(&self, slot: usize, row: u64) -> bool {
        let s = &self.slots[slot];
        match s.state() {
            SlotState::Active => true,
            SlotState::Rebuilding => s.durably_in_sync(row),
            SlotState::Failed => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::Slot;
    use crate::metadata::{SlotState, Uuid};

    fn slot(from: u64, pos: u64) -> Slot {
        let s = Slot::new(None, Uuid::random(), SlotState::Rebuilding, pos);
        s.rebuild_from.store(from, Ordering::Release);
        s
    }

    fn synced(s: &Slot, rows: u64) -> Vec<u64> {
        (0..rows).filter(|&r| s.in_sync(r)).collect()
    }

    #[test]
    fn a_rebuild_from_row_zero_is_a_prefix() {
        let s = slot(0, 3);
        assert_eq!(synced(&s, 6), [0, 1, 2]);
        assert_eq!(s.sync_ranges(6), [(0, 3)]);
        assert_eq!((s.rows_in_sync(6), s.prefix_in_sync()), (3, 3));
        assert!(!s.sync_empty() && !s.sync_full(6));
        assert!(slot(0, 6).sync_full(6) && slot(0, 0).sync_empty());
    }

    #[test]
    fn a_member_that_joined_mid_pass_is_saved_at_zero_until_the_wrap() {
        // Joined at row 4 of 8, rebuilt to row 6.
        let s = slot(4, 6);
        assert_eq!(synced(&s, 8), [4, 5]);
        assert_eq!((s.rows_in_sync(8), s.prefix_in_sync()), (2, 0));
        assert!(slot(4, 4).sync_empty());
        // Past the last row, then on to row 2 from 0.
        let w = slot(4, WRAPPED | 2);
        assert_eq!(synced(&w, 8), [0, 1, 4, 5, 6, 7]);
        assert_eq!(w.sync_ranges(8), [(0, 2), (4, 8)]);
        assert_eq!((w.rows_in_sync(8), w.prefix_in_sync()), (6, 2));
        assert!(!w.sync_empty() && !w.sync_full(8));
        // Just wrapped: what phase one left, nothing more.
        assert_eq!(synced(&slot(4, WRAPPED), 8), [4, 5, 6, 7]);
        assert!(slot(4, WRAPPED | 4).sync_full(8));
    }

    #[test]
    fn rows_written_ahead_of_the_position_are_in_sync_until_the_next_batch() {
        let s = slot(0, 4);
        // A batch of two runs from row 4: [4, 8) and [8, 12).
        s.ahead.begin([4, 8].into_iter());
        assert_eq!(synced(&s, 12), [0, 1, 2, 3]);
        s.ahead.wrote(8, 10);
        s.ahead.wrote(4, 5);
        assert_eq!(synced(&s, 12), [0, 1, 2, 3, 4, 8, 9]);
        // The batch ends: the position past it, then the next begins.
        s.rebuild_row.store(12, Ordering::Release);
        s.ahead.begin([12].into_iter());
        assert_eq!(synced(&s, 16), (0..12).collect::<Vec<_>>());
        // A new member of the slot has none.
        s.ahead.wrote(12, 14);
        s.ahead.clear();
        s.rebuild_row.store(0, Ordering::Release);
        assert!(synced(&s, 16).is_empty());
    }

    #[test]
    fn every_step_of_a_join_is_empty() {
        // [0, 0) -> [c, 0) -> [c, c): a reader between any two sees none.
        for (from, pos) in [(0, 0), (5, 0), (5, 5)] {
            assert!(synced(&slot(from, pos), 8).is_empty(), "{from} {pos}");
        }
    }
}
