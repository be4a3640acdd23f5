//! Degraded reads a shard runs without a thread waiting on them
//! (`crate::shard`): a RAID5/6 read inside one stripe, one of whose
//! chunks has no readable member (failed, missing, or not rebuilt that
//! far). Its columns are read from every readable member of the stripe,
//! all in flight together, and the missing chunks recovered from them on
//! the shard's thread.
//!
//! The blocking path's rule (`parity_read.rs`: `parity_read`, `stripes_columns`), in its
//! order: the stripe's lock first, then the member table, then which
//! members are readable; the lock held until every column is in, so that
//! no write of the stripe lands between two of the reads (a chunk
//! recovered from a half-written stripe would be data nobody wrote). Every
//! other degraded read (across stripes, a lock another holds, beyond the
//! level's redundancy, a member the caller cannot read without blocking)
//! is the blocking path's.

use super::block_io::DirectRead;
use super::parity_io::{columns, Piece};
use super::write_guards::Guards;
use super::*;
use crate::buf::AlignedBuf;
use crate::parity::ParityKind;

/// A degraded read in progress (see the module's doc).
pub(crate) struct DegradedRead {
    /// The stripe's lock, given up when this is dropped.
    _lock: Guards,
    ps: Vec<Piece>,
    lo: u64,
    /// Chunk `i` of the stripe (its `StripeMap` order) is
    /// `scratch[i * width..(i + 1) * width]`, read or recovered.
    scratch: AlignedBuf,
    width: usize,
    missing: Vec<usize>,
    kind: ParityKind,
}

impl DegradedRead {
    /// Plans a degraded read of `len` bytes at `offset`, holding its
    /// stripe's lock; None: the blocking path's, nothing held. With it,
    /// the reads to run: for each readable chunk of the stripe, its
    /// columns [lo, hi) into `scratch` (each piece's `pos` is its offset
    /// there, not in the request), on the member table they were planned
    /// on. Whether the caller can run them without blocking is its own
    /// rule, as for any read it plans; dropping this gives the lock up.
    pub(crate) fn start(
        array: &LocalArray,
        offset: u64,
        len: u64,
    ) -> Option<(DirectRead, DegradedRead)> {
        let a = array.as_ref();
        if len == 0 || a.check_range(offset, len).is_err() {
            return None;
        }
        let kind = a.geo.level.parity_kind()?;
        let (s, ps) = a.stripe_pieces(offset, len)?;
        let lock = Guards::stripe_lock(array, a.write_lock_key(offset)?)?;
        let handles = array.member_handles();
        let map = a.geo.stripe_map(s);
        let (present, missing): (Vec<usize>, Vec<usize>) =
            (0..map.members.len()).partition(|&i| a.readable(map.members[i], s));
        if missing.is_empty() || missing.len() > a.geo.level.parity_chunks() {
            return None;
        }
        let (lo, hi) = columns(&ps);
        let width = (hi - lo) as usize;
        let pieces = present
            .iter()
            .map(|&i| DirectPiece {
                slot: map.members[i],
                at: a.row_offset(s, lo),
                pos: i * width,
                len: width,
            })
            .collect();
        let plan = DirectRead { handles, pieces };
        Some((
            plan,
            DegradedRead {
                _lock: lock,
                ps,
                lo,
                scratch: AlignedBuf::new(map.members.len() * width),
                width,
                missing,
                kind,
            },
        ))
    }

    /// Where the reads land (see `plan`).
    pub(crate) fn scratch(&mut self) -> &mut AlignedBuf {
        &mut self.scratch
    }

    /// Every read is in: the missing chunks recovered, the request's bytes
    /// copied into `out`, the stripe's lock given up.
    pub(crate) fn finish(mut self, array: &Array, out: &mut [u8]) -> Result<()> {
        let width = self.width;
        let mut chunks: Vec<&mut [u8]> = self.scratch.chunks_mut(width).collect();
        array
            .engine
            .recover(self.kind, &mut chunks, &self.missing)?;
        for p in &self.ps {
            let from = p.idx * width + (p.within - self.lo) as usize;
            out[p.pos..p.pos + p.len as usize]
                .copy_from_slice(&self.scratch[from..from + p.len as usize]);
        }
        Ok(())
    }
}
