//! A rebuild's work on rows: the stripes' missing chunks recovered from
//! the chunks present (RAID5/6), or a mirror's copy read, and written to
//! the members being rebuilt. `rebuild.rs` decides which rows and members,
//! under which locks.

use super::*;
use crate::buf::AlignedBuf;
use crate::layout::ChunkRole;
use crate::member::{submit, IoOp, MemberIo};
use crate::parity::RecoverJob;

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
    pub(super) fn rebuild_parity_rows(
        &self,
        targets: &[(usize, &MemberRef)],
        row: u64,
        end: u64,
        pool: &mut crate::buf::BufPool,
    ) -> Result<()> {
        let n = self.geo.members;
        // Every byte of a buffer taken from `pool` is read into or
        // recovered before it is used.
        loop {
            let maps: Vec<_> = (row..end).map(|s| self.geo.stripe_map(s)).collect();
            let missing: Vec<Vec<usize>> = maps
                .iter()
                .zip(row..end)
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
            // Every present chunk of every stripe of the batch, in one submission.
            let wanted: Vec<(usize, usize)> = (0..maps.len())
                .flat_map(|k| {
                    (0..n)
                        .filter(|i| !missing[k].contains(i))
                        .map(move |i| (k, i))
                        .collect::<Vec<_>>()
                })
                .collect();
            let places: Vec<(usize, u64)> = wanted
                .iter()
                .map(|&(k, i)| (maps[k].members[i], self.row_offset_of(row + k as u64)))
                .collect();
            let mut got = pool.take(places.len());
            if let Err(failed) = self.read_places_into(&places, &mut got) {
                pool.put(got);
                self.fail_slots(failed, "read error during rebuild");
                continue;
            }
            // The chunks as read, in `wanted`'s order (stripe by stripe,
            // present chunks ascending); another buffer only where a chunk
            // is missing, for the recovery to fill.
            let mut got = got.into_iter();
            let mut bufs: Vec<Vec<AlignedBuf>> = missing
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
            {
                let mut jobs: Vec<RecoverJob> = bufs
                    .iter_mut()
                    .zip(&missing)
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
            }
            let mut written = Ok(());
            for &(slot, target) in targets {
                let outs: Vec<(&[u8], u64)> = bufs
                    .iter()
                    .zip(&maps)
                    .enumerate()
                    .map(|(k, (stripe, map))| {
                        let i = map.members.iter().position(|&m| m == slot).unwrap();
                        (&stripe[i][..], self.row_offset_of(row + k as u64))
                    })
                    .collect();
                written = self.write_target(slot, target, &outs);
                if written.is_err() {
                    break;
                }
            }
            pool.put(bufs.into_iter().flatten());
            return written;
        }
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
                self.fail_slot_if(slot, target, &format!("write error during rebuild: {e}"));
                return Err(ArrayError::Member {
                    member: target.identity().into(),
                    source: e,
                });
            }
        }
        Ok(())
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
