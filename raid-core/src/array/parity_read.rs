//! RAID5/6 reads through the blocking path: each piece from its member,
//! and the stripes with an unreadable chunk read whole under their locks
//! and recovered, in batches where the parity engine asks for them. A
//! member error during a read fails the member and the stripe is tried
//! again without it.

use super::parity_io::Piece;
use super::*;
use crate::buf::AlignedBuf;
use crate::member::{submit, IoOp, MemberIo};
use crate::parity::RecoverJob;

/// Most degraded stripes one read recovers together (one read submission,
/// one batched recovery), for an engine that asks for batches.
const DEGRADED_READ_BATCH: usize = 32;

impl Array {
    pub(super) fn parity_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let pieces = self.pieces(offset, buf.len() as u64);
        let handles = self.read_handles();
        let mut degraded: Vec<u64> = Vec::new();
        {
            let mut ios = Vec::new();
            let mut owner = Vec::new();
            let mut rest: &mut [u8] = &mut *buf;
            for p in &pieces {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(p.len as usize);
                rest = tail;
                let m = self.geo.stripe_map(p.stripe).members[p.idx];
                if self.readable(m, p.stripe) {
                    ios.push(MemberIo {
                        member: m,
                        offset: self.row_offset(p.stripe, p.within),
                        op: IoOp::Read(head),
                    });
                    owner.push(*p);
                } else {
                    degraded.push(p.stripe);
                }
            }
            for (r, (io, p)) in submit(&handles, &mut ios)
                .into_iter()
                .zip(ios.iter().zip(&owner))
            {
                if let Err(e) = r {
                    self.fail_slot_if(io.member, &handles[io.member], &format!("read error: {e}"));
                    degraded.push(p.stripe);
                }
            }
        }
        degraded.sort_unstable();
        degraded.dedup();
        // Stripes to rebuild columns of, grouped (consecutive, same column
        // range, at most DEGRADED_READ_BATCH) so each group is one read
        // submission and one batched recovery.
        // Pieces come in stripe order: each stripe's are one run of them.
        let of_stripe = |s: u64| -> &[Piece] {
            let start = pieces.partition_point(|p| p.stripe < s);
            let end = pieces.partition_point(|p| p.stripe <= s);
            &pieces[start..end]
        };
        let span = |ps: &[Piece]| {
            let lo = ps.iter().map(|p| p.within).min().unwrap();
            let hi = ps.iter().map(|p| p.within + p.len).max().unwrap();
            (lo, hi)
        };
        let most = self
            .engine
            .preferred_batch(self.geo.stripe_data_bytes())
            .clamp(1, DEGRADED_READ_BATCH);
        let mut groups: Vec<(Vec<u64>, (u64, u64))> = Vec::new();
        for s in degraded {
            let sp = span(of_stripe(s));
            match groups.last_mut() {
                Some((g, gsp)) if *gsp == sp && g.len() < most => g.push(s),
                _ => groups.push((vec![s], sp)),
            }
        }
        for (stripes, (lo, hi)) in groups {
            let _held = self.locks.lock(stripes.iter().copied());
            let cols = self.stripes_columns(&stripes, lo, hi)?;
            for (s, cols) in stripes.iter().zip(cols) {
                for p in of_stripe(*s) {
                    let from = (p.within - lo) as usize;
                    buf[p.pos..p.pos + p.len as usize]
                        .copy_from_slice(&cols[p.idx][from..from + p.len as usize]);
                }
            }
        }
        Ok(())
    }

    /// Every chunk of stripe `s`, columns [lo, hi), with unreadable chunks
    /// recovered. The caller holds the stripe lock.
    pub(super) fn stripe_columns(&self, s: u64, lo: u64, hi: u64) -> Result<Vec<AlignedBuf>> {
        Ok(self
            .stripes_columns(&[s], lo, hi)?
            .pop()
            .expect("one stripe asked, one given"))
    }

    /// [`Self::stripe_columns`] for several stripes at once: every present
    /// chunk read in one submission, the missing ones recovered in one
    /// batched engine call. The caller holds the stripes' locks. A read
    /// error fails its member and the whole group is read again.
    fn stripes_columns(&self, stripes: &[u64], lo: u64, hi: u64) -> Result<Vec<Vec<AlignedBuf>>> {
        let width = (hi - lo) as usize;
        loop {
            let mut layout: Vec<(Vec<usize>, Vec<usize>)> = Vec::with_capacity(stripes.len());
            let mut places: Vec<(usize, u64)> = Vec::new();
            for &s in stripes {
                let map = self.geo.stripe_map(s);
                let (present, missing): (Vec<usize>, Vec<usize>) =
                    (0..map.members.len()).partition(|&i| self.readable(map.members[i], s));
                if missing.len() > self.geo.level.parity_chunks() {
                    return Err(self.failed_error());
                }
                places.extend(
                    present
                        .iter()
                        .map(|&i| (map.members[i], self.row_offset(s, lo))),
                );
                layout.push((present, missing));
            }
            let mut got = match self.read_places(&places, width) {
                Ok(b) => b.into_iter(),
                Err(failed) => {
                    self.fail_slots(failed, "read error");
                    continue;
                }
            };
            let mut out: Vec<(Vec<AlignedBuf>, Vec<usize>)> = layout
                .into_iter()
                .map(|(present, missing)| {
                    let mut bufs: Vec<AlignedBuf> = (0..present.len() + missing.len())
                        .map(|_| AlignedBuf::new(0))
                        .collect();
                    for i in present {
                        bufs[i] = got.next().expect("one buffer per place");
                    }
                    for &i in &missing {
                        bufs[i] = AlignedBuf::new(width);
                    }
                    (bufs, missing)
                })
                .collect();
            let mut jobs: Vec<RecoverJob> = out
                .iter_mut()
                .filter(|(_, missing)| !missing.is_empty())
                .map(|(bufs, missing)| RecoverJob {
                    chunks: bufs.iter_mut().map(|b| &mut b[..]).collect(),
                    missing: missing.clone(),
                })
                .collect();
            match &mut jobs[..] {
                [] => {}
                // One stripe: the plain call, no batch machinery.
                [one] => self
                    .engine
                    .recover(self.kind(), &mut one.chunks, &one.missing)?,
                _ => self.engine.recover_batch(self.kind(), &mut jobs)?,
            }
            drop(jobs);
            return Ok(out.into_iter().map(|(bufs, _)| bufs).collect());
        }
    }
}
