//! Which way a RAID5/6 stripe write runs: read-modify-write or
//! reconstruct-write, by the member reads each needs, for an optimal
//! stripe and for one with chunks missing, or its data alone where no
//! parity chunk is left. One rule for the blocking path
//! (`parity_io.rs`) and the shards (`async_write.rs`).

use super::async_write::{IoBuf, MemberOp};
use super::parity_io::{columns, full_piece, Piece};
use super::*;

impl Array {
    /// Whether read-modify-write reads fewer chunks than reconstruct-write
    /// for the pieces `ps` of stripe `s` (every member readable).
    pub(super) fn prefers_rmw(&self, s: u64, ps: &[Piece]) -> bool {
        self.rmw_reads_fewer(s, ps, |_| true)
    }

    /// Whether read-modify-write can run on the pieces `ps` of one stripe,
    /// whose chunk `i` is `readable(i)` or not, and reads fewer chunks
    /// than reconstruct-write. It can while the chunks it reads are
    /// readable (the pieces' own and the parity): a chunk missing
    /// elsewhere in the stripe is in the parity already, and the change is
    /// applied to it (as md does). Reconstruct-write reads the data chunks
    /// the request does not cover whole, or, if one of those is missing,
    /// every chunk present (to recover it). Never on a stripe an unclean
    /// stop may have torn that the resync has not reached yet
    /// (`resync::Owed::may_be_torn`).
    pub(super) fn rmw_reads_fewer(
        &self,
        s: u64,
        ps: &[Piece],
        readable: impl Fn(usize) -> bool,
    ) -> bool {
        let nd = self.geo.data_chunks();
        let np = self.geo.level.parity_chunks();
        if self.resync.may_be_torn(s) {
            return false;
        }
        if !ps.iter().all(|p| readable(p.idx)) || !(nd..nd + np).all(&readable) {
            return false;
        }
        let (lo, hi) = columns(ps);
        // The data chunks reconstruct-write needs, and whether all are there.
        let (need, all_there) = (0..nd)
            .filter(|&i| full_piece(ps, i, lo, hi).is_none())
            .fold((0, true), |(n, all), i| (n + 1, all && readable(i)));
        let rcw_reads = if all_there {
            need
        } else {
            (0..nd + np).filter(|&i| readable(i)).count()
        };
        ps.len() + np < rcw_reads
    }

    /// Whether a write to a stripe whose chunk `i` is `readable(i)` now,
    /// and `kept(i)` after a crash too, is its data chunks' writes alone:
    /// none of its parity chunks is readable (their members failed,
    /// missing, or being rebuilt and not yet there) and every data chunk
    /// is, and stays so after a crash. Nothing of the stripe then exists
    /// only as parity, and no parity is left to disagree with the data, so
    /// the write hole has nothing to tear: the pieces go to their members
    /// in place, with no reads, no parity and no journal record, and a
    /// crash leaves each sector old or new, as on a lone drive (md writes
    /// such a stripe the same way). The rebuild computes the parity from the
    /// data. A RAID5 missing a member writes one stripe in N so; a RAID6
    /// only where both its parity chunks are missing (with one left, a
    /// torn write would leave it disagreeing, which the journal covers).
    /// The caller also asks that the stripe has no unsettled journal
    /// record, whose replay would write older columns over these.
    pub(super) fn data_alone(
        &self,
        readable: impl Fn(usize) -> bool,
        kept: impl Fn(usize) -> bool,
    ) -> bool {
        let nd = self.geo.data_chunks();
        let np = self.geo.level.parity_chunks();
        np > 0 && (nd..nd + np).all(|i| !readable(i)) && (0..nd).all(kept)
    }

    /// The columns a `Kind::Parity` journal record of a degraded write of
    /// stripe `s` carries, where one may stand for the record of every
    /// column it writes (`known(i)`: chunk `i`'s columns, new or, for
    /// chunks the write leaves as they are, as they stand, where the write
    /// has them): those of the data chunks that would exist only as parity
    /// after a crash (`readable_after_a_crash`: members missing, or
    /// rebuilt there but not yet saved so). None unless the write has
    /// each of those and the stripe can lose no more chunks (a
    /// RAID5 missing one, a RAID6 missing two). A whole-stripe write to a
    /// RAID5 of 8 missing a data member then records one chunk, not seven.
    ///
    /// Replay reads the stripe's other data chunks from their members to
    /// compute the parity; with a chunk of margin left (a RAID6 missing
    /// one), a member lost at the same crash would leave it without them,
    /// where a record of every column needs no read: such stripes keep
    /// that record. The chunks recorded are those not readable after a
    /// crash, not those not readable now: a rebuild's saved position only
    /// moves on, so every chunk left out is readable at replay unless a
    /// member fails meanwhile, which takes the stripe past its redundancy
    /// (a slot being rebuilt counts as down until its rebuild ends).
    /// Callers also ask `journal_parity_allowed`.
    pub(super) fn parity_record<'b>(
        &self,
        s: u64,
        known: impl Fn(usize) -> Option<&'b [u8]>,
    ) -> Option<Vec<(usize, &'b [u8])>> {
        let nd = self.geo.data_chunks();
        let np = self.geo.level.parity_chunks();
        let map = self.geo.stripe_map(s);
        let lost: crate::layout::PerMember<usize> = (0..nd + np)
            .filter(|&i| !self.readable_after_a_crash(map.members[i], s))
            .collect();
        if np == 0 || lost.len() != np || lost.iter().all(|&i| i >= nd) {
            return None;
        }
        lost.iter()
            .filter(|&&i| i < nd)
            .map(|&i| known(i).map(|b| (i, b)))
            .collect()
    }

    /// The member writes of a shard's write of stripe `s` `data_alone`:
    /// each piece to its member, from the request (no reads, no parity,
    /// no record).
    pub(super) fn alone_writes(&self, s: u64, ps: &[Piece]) -> Vec<MemberOp> {
        let map = self.geo.stripe_map(s);
        ps.iter()
            .map(|p| MemberOp {
                slot: map.members[p.idx],
                offset: self.row_offset(s, p.within),
                buf: IoBuf::Data {
                    pos: p.pos,
                    len: p.len as usize,
                },
                write: true,
            })
            .collect()
    }

    /// How a shard writes the pieces `ps` of a stripe with a chunk
    /// missing (chunk `i` is `readable(i)` or not), through the journal:
    /// Some(true) by read-modify-write, Some(false) by reconstruct-write,
    /// whichever reads fewer of the two that need only chunks present;
    /// None where neither does (a chunk the request does not cover whole
    /// is missing, and so is one the read-modify-write reads: recovering
    /// it is the blocking path's), or the stripe is past its redundancy,
    /// or the array keeps no journal.
    pub(super) fn degraded_plan(
        &self,
        s: u64,
        ps: &[Piece],
        readable: impl Fn(usize) -> bool,
    ) -> Option<bool> {
        let nd = self.geo.data_chunks();
        let np = self.geo.level.parity_chunks();
        if !self.has_journal() || (0..nd + np).filter(|&i| !readable(i)).count() > np {
            return None;
        }
        let (lo, hi) = columns(ps);
        let rmw_can = ps.iter().all(|p| readable(p.idx)) && (nd..nd + np).all(&readable);
        let rcw_can = (0..nd)
            .filter(|&i| full_piece(ps, i, lo, hi).is_none())
            .all(&readable);
        match (rmw_can, rcw_can) {
            (true, true) => Some(self.rmw_reads_fewer(s, ps, readable)),
            (true, false) => Some(true),
            (false, true) => Some(false),
            (false, false) => None,
        }
    }
}
