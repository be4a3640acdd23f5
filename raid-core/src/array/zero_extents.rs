//! Which parts of the array read as zeros without being stored: where
//! every device a read would use has a hole (a sparse member file never
//! written there, or a range zeroed by a trim). The NBD export answers a
//! client's block-status query with it, so a copy (nbdcopy, qemu-img
//! convert) skips those parts instead of reading zeros.
//!
//! The answer must never say "zero" where a read would return anything
//! else: a copy would then lose that data. So a part counts as zero only
//! where every device that serves it answers from its filesystem's own
//! word that it holds a hole there (`Member::data_from`: a file on a
//! trusted filesystem, or a network member whose server says so in its
//! block status, where the operator trusts it), and an unknown answer (a
//! block device, a server not trusted or with no block status, a hot
//! replace's pair) is data. Holes on every device that serves a part
//! mean zeros whichever of them a read uses: a mirror's copies all hold
//! zeros; a RAID5/6 chunk
//! is read from its own member while that one is readable (so its hole
//! alone decides, chunk by chunk, whatever its stripe's parity holds),
//! and one recovered from its stripe's others (all zeros, the parity
//! too) is zeros, since the parity of zeros is zeros.

use super::Array;

impl Array {
    /// The array's extents from `offset` on, as (length, reads as zeros),
    /// in order, covering `offset` up to `offset + len` (at most to the
    /// end of the array) and at least one byte where `offset` is inside
    /// it. A snapshot: a write that lands meanwhile may make it stale, as
    /// NBD allows (a client that writes while it asks sees either).
    pub fn zero_extents(&self, offset: u64, len: u64) -> Vec<(u64, bool)> {
        self.zero_extents_upto(offset, len, usize::MAX)
    }

    /// `zero_extents`, at most `most` of them: the walk stops where the
    /// next would begin, so each returned is whole (the last may end at
    /// `offset + len`). A caller looking for the next hole or data
    /// (SEEK_HOLE, SEEK_DATA) asks for one, and so does not walk what
    /// lies past it.
    pub fn zero_extents_upto(&self, offset: u64, len: u64, most: usize) -> Vec<(u64, bool)> {
        let end = offset.saturating_add(len).min(self.geo.capacity());
        let mut out: Vec<(u64, bool)> = Vec::new();
        if offset >= end {
            return out;
        }
        let all_data = || vec![(end - offset, false)];
        let unit = self.geo.chunk;
        self.with_members(|members| {
            let mut known = KnownRuns::new(members);
            let mut at = offset;
            while at < end {
                let u = at / unit;
                let upto = (u + 1).saturating_mul(unit).min(end);
                let zero = self.unit_is_hole(u, |slot, from| known.data_start(slot, from));
                let full = out.len() == most;
                match out.last_mut() {
                    Some((l, z)) if *z == zero => *l += upto - at,
                    _ if full => break,
                    _ => out.push((upto - at, zero)),
                }
                at = upto;
            }
            out
        })
        .unwrap_or_else(all_data)
    }

    /// A client read of `offset..offset + len` answered from the holes:
    /// true where all of it reads as zeros (`reads_as_zeros`), counted
    /// then as a client read served, which the caller answers without
    /// reading (the NBD export's hole chunk).
    pub fn read_of_holes(&self, offset: u64, len: u64) -> bool {
        let t = crate::stats::Started::now();
        let zero = self.reads_as_zeros(offset, len);
        if zero {
            self.client_io.read.record(len, t.took(), true);
        }
        zero
    }

    /// Whether all of `offset..offset + len` reads as zeros, as
    /// `zero_extents` would say, asking each device only where its next
    /// data starts (`Member::data_start_from`) and stopping at the first
    /// unit that holds data: an NBD read asks this of every large read,
    /// and finding where a run of data ends can cost a walk of the whole
    /// run (tmpfs).
    fn reads_as_zeros(&self, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len);
        if len == 0 || end > self.geo.capacity() {
            return false;
        }
        let unit = self.geo.chunk;
        self.with_members(|members| {
            (offset / unit..end.div_ceil(unit))
                .all(|u| self.unit_is_hole(u, |slot, from| members[slot].data_start_from(from)))
        })
        .unwrap_or(false)
    }

    /// `f` over the members by slot, as they are now; None (nothing is
    /// said to be zeros) beyond the array's redundancy, where it fails
    /// reads the holes would not, or where membership changed while `f`
    /// ran (a member failed, a spare took a slot): each device is asked
    /// only while its slot holds it. The epoch is read first, so that a
    /// failure after the redundancy check changes the answer too.
    fn with_members<T>(&self, f: impl FnOnce(&[crate::member::MemberRef]) -> T) -> Option<T> {
        let epoch = self.membership_epoch();
        if !self.within_redundancy() {
            return None;
        }
        let r = f(&self.member_handles());
        (self.membership_epoch() == epoch).then_some(r)
    }

    /// Whether unit `u` (logical chunk `u`) reads as zeros: every device
    /// that serves it, and at least one, holds a hole over its whole
    /// chunk there. Judged chunk by chunk, finer than a RAID5/6 stripe
    /// (whose parity is written when any of its chunks is): a piece of
    /// data written into a stripe leaves its other chunks holes on their
    /// own members, and a copy skips them. `data_start(slot, at)`: where
    /// the slot's device holds data first at or after device offset `at`
    /// (`Member::data_from`'s start), None where it cannot tell.
    fn unit_is_hole(&self, u: u64, mut data_start: impl FnMut(usize, u64) -> Option<u64>) -> bool {
        use crate::layout::{Level, Place};
        let chunk = self.geo.chunk;
        let places: Vec<Place> = match self.geo.level {
            Level::Raid5 | Level::Raid6 => {
                // A read of a RAID5/6 chunk reads its own member where
                // that is readable, whatever the stripe's parity holds;
                // else it recovers the chunk from the stripe's others,
                // which are zeros where they all are (the parity of
                // zeros is zeros).
                let d = self.geo.data_chunks() as u64;
                let (s, idx) = (u / d, (u % d) as usize);
                let own = self.geo.stripe_member(s, idx);
                let at = |member| Place {
                    member,
                    offset: s * chunk,
                };
                if self.readable(own, s) {
                    vec![at(own)]
                } else {
                    (0..self.geo.members)
                        .filter(|&m| m != own)
                        .map(at)
                        .collect()
                }
            }
            _ => self.geo.chunk_copies(u),
        };
        let mut serving = 0;
        for p in places {
            if !self.readable(p.member, p.offset / chunk) {
                continue;
            }
            serving += 1;
            let from = self.data_offset + p.offset;
            match data_start(p.member, from) {
                // A hole over the whole chunk.
                Some(start) if start >= from + chunk => {}
                _ => return false,
            }
        }
        serving > 0
    }
}

/// What each slot's device said last about where its data starts
/// (`Member::data_from`), so that a walk over many chunks asks each device
/// once per run of holes or of data, not once per chunk.
pub(super) struct KnownRuns<'a> {
    members: &'a [crate::member::MemberRef],
    /// Whether runs of data are asked for with their ends
    /// (`Member::data_from`), or as their starts alone
    /// (`Member::data_start_from`: a run of data then holds only the
    /// place asked).
    ends: bool,
    /// Per slot, the place last asked and the first run of data at or
    /// after it.
    known: Vec<Option<(u64, std::ops::Range<u64>)>>,
}

impl<'a> KnownRuns<'a> {
    /// Runs of data with their ends: a walk that crosses long runs of
    /// data asks once per run.
    pub(super) fn new(members: &'a [crate::member::MemberRef]) -> KnownRuns<'a> {
        KnownRuns {
            members,
            ends: true,
            known: vec![None; members.len()],
        }
    }

    /// Starts of data alone: finding where a run of data ends can cost a
    /// walk of the whole run (tmpfs), which a walk that asks chunk by
    /// chunk and mostly meets data (a rebuild) would pay for every chunk.
    /// A device that cannot say where its data starts without a round
    /// trip (a network member, `data_start_from` None) is data here: a
    /// walk chunk by chunk would wait on it for every chunk, up to its
    /// timeout where its server is slow to answer.
    pub(super) fn starts(members: &'a [crate::member::MemberRef]) -> KnownRuns<'a> {
        KnownRuns {
            ends: false,
            ..KnownRuns::new(members)
        }
    }

    /// Whether `slot`'s device holds a hole over all of [from, from+len).
    pub(super) fn hole(&mut self, slot: usize, from: u64, len: u64) -> bool {
        self.data_start(slot, from)
            .is_some_and(|start| start >= from + len)
    }

    /// Where `slot`'s device holds data first at or after device offset
    /// `from` (before `from` where `from` is inside a run of data); None
    /// where it cannot tell.
    pub(super) fn data_start(&mut self, slot: usize, from: u64) -> Option<u64> {
        match &self.known[slot] {
            // Asked at or before `from`: still the answer where `from`
            // lies in the hole before the run or inside the run.
            Some((asked, r)) if *asked <= from && (r.start >= from || r.end > from) => {
                Some(r.start)
            }
            _ => {
                let m = &self.members[slot];
                let r = match self.ends {
                    true => m.data_from(from)?,
                    false => m.data_start_from(from).map(|s| s..s)?,
                };
                self.known[slot] = Some((from, r.clone()));
                Some(r.start)
            }
        }
    }
}
