//! Rows the long jobs need not read. Where every chunk a rebuild would
//! read to recover a row (RAID5/6), or the copy it would read a mirror's
//! chunk from, is a hole on its device, the row's chunks on the new member
//! are zeros: recovering from zeros gives zeros, whatever the stripe's
//! layout. The rebuild then makes those rows of the new member read as
//! zeros (`Member::write_zeroes_allocated`: a file's range zeroed with its
//! blocks reserved, as the rows written would hold them; a zeroing
//! discard) instead of reading the row and writing what it recovers, so
//! that rebuilding an array mostly never written takes the time of its
//! data, as a ZFS resilver does. The zeros are written, not assumed: a
//! used device holds old bytes. A hot replace's copy does the same with
//! the old device's holes. A scrub skips the rows where every member holds
//! a hole: zeros everywhere are consistent, and no sector is stored there
//! to go bad; so does the resync after an unclean stop, in the regions the
//! crash left marked (`resync.rs`).
//!
//! Holes are believed where a copy of the array believes them
//! (`zero_extents.rs`), on devices that say where their data starts
//! without a round trip (`Member::data_start_from`): a file on a
//! filesystem trusted to count data not yet written back as data. Every
//! other device's chunks are data, read as before: a block device, a
//! file elsewhere, and a network member (asked chunk by chunk, a job
//! would wait on its server for each). Rows a job zeroes are asked about
//! under locks every writer of them takes (a rebuild's or a hot
//! replace's run's), so no write lands between the answer and the zeros. A scrub asks without: a write that lands in rows
//! it skips is left unchecked, never wrongly judged.

use super::zero_extents::KnownRuns;
use super::*;
use crate::layout::{ChunkRole, Place};

/// The shortest run of holes a job skips by default, in bytes per member
/// (`RebuildOptions::hole_bytes`): a step's worth (`runs::STEP_BYTES`).
pub(super) const HOLE_BYTES: u64 = 256 << 10;

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
        rows: (u64, u64),
        hole_bytes: u64,
    ) -> Vec<(u64, u64, bool)> {
        self.spans_of_holes(rows, hole_bytes, |row| match (self.geo.level, targets) {
            (Level::Raid5 | Level::Raid6, _) => {
                let read = self.row_places(row, |slot| self.readable(slot, row));
                let enough = self.geo.members - read.len() <= self.geo.level.parity_chunks();
                enough.then_some(read)
            }
            (_, &[slot]) => self.mirror_source(slot, row).map(|p| vec![p]),
            _ => None,
        })
    }

    /// Rows [lo, hi) of a scrub (stripes on RAID5/6, logical chunks on a
    /// mirror) as `rebuild_spans`: `holes` where every member holds a hole
    /// over the row's chunks (a scrub runs with every member in sync; a
    /// mirror's resync may not, and a slot with no device is never a hole,
    /// so its rows are read).
    pub(super) fn scrub_spans(&self, rows: (u64, u64), hole_bytes: u64) -> Vec<(u64, u64, bool)> {
        self.spans_of_holes(rows, hole_bytes, |row| match self.geo.level {
            Level::Raid5 | Level::Raid6 => Some(self.row_places(row, |_| true)),
            _ => Some(self.geo.chunk_copies(row)),
        })
    }

    /// Rows [lo, hi) of a hot replace's copy of `slot` as runs (first row,
    /// end, holes): `holes` where the old device (the slot's device to
    /// read, `read_handles`, throughout the copy) holds a hole over each
    /// row's chunk, which the copy then zeros on the new device rather
    /// than read.
    pub(super) fn copy_spans(
        &self,
        slot: usize,
        rows: (u64, u64),
        hole_bytes: u64,
    ) -> Vec<(u64, u64, bool)> {
        self.spans_of_holes(rows, hole_bytes, |row| {
            Some(self.row_places(row, |s| s == slot))
        })
    }

    /// The chunks of row `row` on the slots `keep` takes, ascending.
    fn row_places(&self, row: u64, keep: impl Fn(usize) -> bool) -> Vec<Place> {
        let offset = row * self.geo.chunk;
        (0..self.geo.members)
            .filter(|&member| keep(member))
            .map(|member| Place { member, offset })
            .collect()
    }

    /// `hole_bytes` per member as rows, at least one.
    fn hole_rows(&self, hole_bytes: u64) -> u64 {
        (hole_bytes / self.geo.chunk).max(1)
    }

    /// Rows [lo, hi) as runs (first row, end, holes): `holes` where every
    /// place `reads(row)` names (a slot's chunk), and at least one, is a
    /// hole on the slot's device, over at least `hole_bytes` per member
    /// (`runs_of_holes`); None from `reads` is data. All data where
    /// membership changed while the devices were asked (a device asked may
    /// no longer be the one its slot holds).
    fn spans_of_holes(
        &self,
        (lo, hi): (u64, u64),
        hole_bytes: u64,
        mut reads: impl FnMut(u64) -> Option<Vec<Place>>,
    ) -> Vec<(u64, u64, bool)> {
        let epoch = self.membership_epoch();
        let devices = self.read_handles();
        let mut known = KnownRuns::starts(&devices);
        let chunk = self.geo.chunk;
        let out = runs_of_holes((lo, hi), self.hole_rows(hole_bytes), |row| {
            reads(row).is_some_and(|places| {
                !places.is_empty()
                    && places
                        .iter()
                        .all(|p| known.hole(p.member, self.data_offset + p.offset, chunk))
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

    /// Makes rows [lo, hi) of each target (slot, device) read as zeros,
    /// its blocks kept or reserved as a write of them would
    /// (`Member::write_zeroes_allocated`). Each target that errs is failed
    /// and the first error ends the rebuild, as writes of recovered chunks
    /// do.
    pub(super) fn rebuild_zero_rows(
        &self,
        targets: &[(usize, &MemberRef)],
        lo: u64,
        hi: u64,
    ) -> Result<()> {
        let (at, len) = (self.row_offset_of(lo), (hi - lo) * self.geo.chunk);
        let mut first = None;
        for &(slot, target) in targets {
            if let Err(e) = target.write_zeroes_allocated(at, len) {
                first.get_or_insert(self.rebuild_write_failed(slot, target, e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Rows [lo, hi) as runs (first row, end, holes), in order, covering
/// them: `holes` for each run of at least `least` rows whose every row is
/// a hole (`holes(row)`), the rest data. `holes` is asked of every
/// `least`-th row, and around each that is a hole: every run of `least`
/// rows holds one of those, so rows of data cost one question per
/// `least` (one `lseek` on each device, where rows of data and of holes
/// in turn made one per row cost a rebuild a sixth of its time).
fn runs_of_holes(
    (lo, hi): (u64, u64),
    least: u64,
    mut holes: impl FnMut(u64) -> bool,
) -> Vec<(u64, u64, bool)> {
    let least = least.max(1);
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    // Rows below `settled` are in `out`, or data.
    let (mut probe, mut settled) = (lo, lo);
    while probe < hi {
        if !holes(probe) {
            probe += least;
            continue;
        }
        let mut a = probe;
        while a > settled && holes(a - 1) {
            a -= 1;
        }
        let mut b = probe + 1;
        while b < hi && holes(b) {
            b += 1;
        }
        if b - a >= least {
            if settled < a {
                out.push((settled, a, false));
            }
            out.push((a, b, true));
            settled = b;
        }
        // The first row of the next `least` from `lo` at or after `b`
        // (row `b` is data, or the end).
        probe = lo + (b - lo).div_ceil(least) * least;
    }
    if settled < hi {
        out.push((settled, hi, false));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::runs_of_holes;
    use rand::{Rng, SeedableRng};

    /// The plain rule `runs_of_holes` keeps while asking fewer rows:
    /// every row asked, runs of holes shorter than `least` made data.
    fn every_row(
        lo: u64,
        hi: u64,
        least: u64,
        hole: impl Fn(u64) -> bool,
    ) -> Vec<(u64, u64, bool)> {
        let mut out: Vec<(u64, u64, bool)> = Vec::new();
        for row in lo..hi {
            let h = hole(row);
            match out.last_mut() {
                Some((_, end, was)) if *was == h => *end = row + 1,
                _ => out.push((row, row + 1, h)),
            }
        }
        let mut merged: Vec<(u64, u64, bool)> = Vec::new();
        for (a, b, h) in out {
            let h = h && b - a >= least.max(1);
            match merged.last_mut() {
                Some((_, end, was)) if *was == h => *end = b,
                _ => merged.push((a, b, h)),
            }
        }
        merged
    }

    #[test]
    fn runs_of_holes_shorter_than_the_least_are_data() {
        // Rows 10..30: holes at 12..14, 15, 20..28.
        let hole = |r: u64| (12..14).contains(&r) || r == 15 || (20..28).contains(&r);
        let asked = std::cell::Cell::new(0);
        let counted = |r: u64| {
            asked.set(asked.get() + 1);
            hole(r)
        };
        assert_eq!(
            runs_of_holes((10, 30), 1, counted),
            vec![
                (10, 12, false),
                (12, 14, true),
                (14, 15, false),
                (15, 16, true),
                (16, 20, false),
                (20, 28, true),
                (28, 30, false)
            ]
        );
        assert_eq!(
            runs_of_holes((10, 30), 2, hole),
            vec![
                (10, 12, false),
                (12, 14, true),
                (14, 20, false),
                (20, 28, true),
                (28, 30, false)
            ]
        );
        asked.set(0);
        assert_eq!(
            runs_of_holes((10, 30), 8, counted),
            vec![(10, 20, false), (20, 28, true), (28, 30, false)]
        );
        // Probes at 10 and 18 (data), 26 (holes: 20..28 found around
        // it, seven rows to its left, two to its right).
        assert_eq!(asked.get(), 3 + 7 + 2);
        assert_eq!(runs_of_holes((10, 30), 9, hole), vec![(10, 30, false)]);
        assert_eq!(runs_of_holes((5, 9), 8, |_| true), vec![(5, 9, false)]);
        assert_eq!(runs_of_holes((5, 13), 8, |_| true), vec![(5, 13, true)]);
        assert!(runs_of_holes((5, 5), 1, |_| true).is_empty());
    }

    /// Random rows of holes and data, runs short and long: the runs said
    /// are those of asking every row.
    #[test]
    fn runs_of_holes_are_those_of_every_row_asked() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..2000 {
            let lo = rng.gen_range(0..50u64);
            let hi = lo + rng.gen_range(0..120u64);
            let least = rng.gen_range(0..12u64);
            let p = rng.gen_range(0.0..1.0);
            let rows: Vec<bool> = (0..hi).map(|_| rng.gen_bool(p)).collect();
            let hole = |r: u64| rows[r as usize];
            assert_eq!(
                runs_of_holes((lo, hi), least, hole),
                every_row(lo, hi, least, hole),
                "{lo}..{hi}, least {least}: {rows:?}"
            );
        }
    }
}
