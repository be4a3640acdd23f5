//! Rows the long jobs need not read. Where every chunk a rebuild would
//! read to recover a row (RAID5/6), or the copy it would read a mirror's
//! chunk from, is a hole on its device, the row's chunks on the new member
//! are zeros: recovering from zeros gives zeros, whatever the stripe's
//! layout. The rebuild then makes those rows of the new member read as
//! zeros (`Member::write_zeroes`: a hole punched in a file, a zeroing
//! discard) instead of reading the row and writing what it recovers, so
//! that rebuilding an array mostly never written takes the time of its
//! data, as a ZFS resilver does. The zeros are written, not assumed: a
//! used device holds old bytes. A hot replace's copy does the same with
//! the old device's holes. A scrub skips the rows where every member holds
//! a hole: zeros everywhere are consistent, and no sector is stored there
//! to go bad.
//!
//! Holes are believed where a copy of the array believes them
//! (`zero_extents.rs`), on devices that say where their data starts
//! without a round trip (`Member::data_start_from`): a file on a
//! filesystem trusted to count data not yet written back as data. Every
//! other device's chunks are data, read as before: a block device, a
//! file elsewhere, and a network member (asked chunk by chunk, a job
//! would wait on its server for each). The rows are asked about under the
//! batch's locks, which every writer of them takes, so no write lands
//! between the answer and what the job does with it.

use super::zero_extents::KnownRuns;
use super::*;
use crate::layout::{ChunkRole, Place};

impl Array {
    /// Rows [lo, hi) of a rebuild as runs (first row, end, holes), in
    /// order, covering them: `holes` where, on every row of the run, each
    /// device the rebuild of `targets` (slots) would read holds a hole
    /// over the row's chunk (on RAID5/6 each slot readable at the row,
    /// those `plan_recovery` reads, at least as many as the level needs;
    /// on a mirror the copy `mirror_source` picks for the one target).
    pub(super) fn rebuild_spans(
        &self,
        targets: &[usize],
        lo: u64,
        hi: u64,
    ) -> Vec<(u64, u64, bool)> {
        let chunk = self.geo.chunk;
        self.spans_of_holes(lo, hi, |row| match (self.geo.level, targets) {
            (Level::Raid5 | Level::Raid6, _) => {
                let read: Vec<Place> = (0..self.geo.members)
                    .filter(|&slot| self.readable(slot, row))
                    .map(|member| Place {
                        member,
                        offset: row * chunk,
                    })
                    .collect();
                let enough = self.geo.members - read.len() <= self.geo.level.parity_chunks();
                enough.then_some(read)
            }
            (_, &[slot]) => self.mirror_source(slot, row).map(|p| vec![p]),
            _ => None,
        })
    }

    /// Rows [lo, hi) of a scrub (stripes on RAID5/6, logical chunks on a
    /// mirror) as `rebuild_spans`: `holes` where every member holds a hole
    /// over the row's chunks (a scrub runs with every member in sync).
    pub(super) fn scrub_spans(&self, lo: u64, hi: u64) -> Vec<(u64, u64, bool)> {
        let chunk = self.geo.chunk;
        self.spans_of_holes(lo, hi, |row| match self.geo.level {
            Level::Raid5 | Level::Raid6 => Some(
                (0..self.geo.members)
                    .map(|member| Place {
                        member,
                        offset: row * chunk,
                    })
                    .collect(),
            ),
            _ => Some(self.geo.chunk_copies(row)),
        })
    }

    /// Rows [lo, hi) of a hot replace's copy as runs (first row, end,
    /// holes): `holes` where the old device holds a hole over each row's
    /// chunk, which the copy then zeros on the new device rather than
    /// read (the old device is the slot's member throughout the copy).
    pub(super) fn copy_spans(&self, old: &MemberRef, lo: u64, hi: u64) -> Vec<(u64, u64, bool)> {
        let chunk = self.geo.chunk;
        let mut known = KnownRuns::starts(std::slice::from_ref(old));
        spans(lo, hi, |row| {
            let from = self.row_offset_of(row);
            known
                .data_start(0, from)
                .is_some_and(|start| start >= from + chunk)
        })
    }

    /// Rows [lo, hi) as runs (first row, end, holes): `holes` where every
    /// place `reads(row)` names (a slot's chunk), and at least one, is a
    /// hole on the slot's device; None from `reads` is data. All data
    /// where membership changed while the devices were asked (a device
    /// asked may no longer be the one its slot holds).
    fn spans_of_holes(
        &self,
        lo: u64,
        hi: u64,
        mut reads: impl FnMut(u64) -> Option<Vec<Place>>,
    ) -> Vec<(u64, u64, bool)> {
        let epoch = self.membership_epoch();
        let devices = self.read_handles();
        let mut known = KnownRuns::starts(&devices);
        let chunk = self.geo.chunk;
        let out = spans(lo, hi, |row| {
            reads(row).is_some_and(|places| {
                !places.is_empty()
                    && places.iter().all(|p| {
                        let from = self.data_offset + p.offset;
                        known
                            .data_start(p.member, from)
                            .is_some_and(|start| start >= from + chunk)
                    })
            })
        });
        match self.membership_epoch() == epoch {
            true => out,
            false => vec![(lo, hi, false)],
        }
    }

    /// The copy a mirror's rebuild of `slot` reads its chunk at `row` from:
    /// the first copy on another slot readable there.
    pub(super) fn mirror_source(&self, slot: usize, row: u64) -> Option<Place> {
        let ChunkRole::Data(c) = self.geo.chunk_at(slot, row) else {
            unreachable!("mirrors hold data only")
        };
        self.geo
            .chunk_copies(c)
            .into_iter()
            .find(|p| p.member != slot && self.readable(p.member, p.offset / self.geo.chunk))
    }

    /// Makes rows [lo, hi) of each target (slot, device) read as zeros.
    /// An error fails that target and ends the rebuild, as a write of
    /// recovered chunks does.
    pub(super) fn rebuild_zero_rows(
        &self,
        targets: &[(usize, &MemberRef)],
        lo: u64,
        hi: u64,
    ) -> Result<()> {
        let (at, len) = (self.row_offset_of(lo), (hi - lo) * self.geo.chunk);
        for &(slot, target) in targets {
            target
                .write_zeroes(at, len)
                .map_err(|e| self.rebuild_write_failed(slot, target, e))?;
        }
        Ok(())
    }
}

/// Rows [lo, hi) as runs (first row, end, `holes(row)`), in order.
fn spans(lo: u64, hi: u64, mut holes: impl FnMut(u64) -> bool) -> Vec<(u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    for row in lo..hi {
        let h = holes(row);
        match out.last_mut() {
            Some((_, end, was)) if *was == h => *end = row + 1,
            _ => out.push((row, row + 1, h)),
        }
    }
    out
}
