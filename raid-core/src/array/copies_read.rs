//! Mirror reads where an unclean stop may have torn the chunks they touch:
//! a resync is owed and has not passed them
//! (`Array::mirror_chunk_may_be_torn`). What such a read returns must be
//! on every copy, so that it reads the same whatever member fails after.
//! Every readable copy of the blocks read is read, in flight together
//! where the members allow (on a shard, in the caller's thread for members
//! in memory, or on the blocking path: `read_agreeing_copies`), and the
//! copies compared: where they agree, that is the answer, already on every
//! copy. Where they differ (or a copy's read erred), the read's torn chunks
//! are resynced, whole and under their locks, before it is read
//! (`resync_chunk_before_read`, on the blocking path). A crash tears
//! few chunks, and after one nearly every region of a busy array is
//! marked: before this, every read of a mirror until its resync passed
//! went to the blocking threads, took the chunk's lock and read every copy
//! of the whole chunk.
//!
//! No lock is taken. A write in flight to the same blocks (it holds the
//! chunk's lock, and writes every copy) may land between two copies'
//! reads: they then differ, and the blocking path waits for it. Copies
//! that agree hold the blocks as they were or as that write makes them,
//! which is what a read in flight with a write may return; and they keep
//! agreeing, since every later write goes to every copy (a copy whose
//! write fails is failed: a compare planned before may still read it,
//! which can only make it find a difference, never hide one).

use super::block_io::DirectRead;
use super::*;
use crate::buf::AlignedBuf;
use crate::member::{IoOp, MemberIo};

/// The most bytes of copies the blocking path reads to compare: a larger
/// read resyncs its torn chunks first (it covers whole chunks, or nearly).
const COMPARED_BYTES: usize = 4 << 20;

/// A read of mirror chunks in progress (see the module's doc).
pub(crate) struct CopiesRead {
    pieces: Vec<Compared>,
    /// Where the reads land: each piece's copies back to back.
    scratch: AlignedBuf,
}

/// One chunk's part of the request: `len` bytes at `pos` in it, read from
/// `copies` copies, the first at `at` in the scratch buffer, the next
/// `len` bytes after it, and so on.
struct Compared {
    pos: usize,
    len: usize,
    at: usize,
    copies: usize,
}

impl CopiesRead {
    /// Plans a read of `len` bytes at `offset` of a mirror (RAID1/10):
    /// every readable copy of the chunks an unclean stop may have torn,
    /// one copy (`direct_target`'s) of the others, into `scratch` (each
    /// piece's `pos` is its offset there, the pieces end to end). None: a
    /// chunk has no readable copy, the array is no mirror, or it would take
    /// more than `max_reads` member reads: the blocking path's. `handles`:
    /// the reads' table (`Array::read_handles`, or a shard's copy), taken
    /// by the caller before this checks readability, as `direct_read`
    /// plans.
    pub(crate) fn start(
        a: &Array,
        handles: Arc<MemberTable>,
        offset: u64,
        len: u64,
        max_reads: usize,
    ) -> Option<(DirectRead, CopiesRead)> {
        if len == 0 || a.check_range(offset, len).is_err() || a.geo.copies() < 2 {
            return None;
        }
        let chunk = a.geo.chunk;
        let (mut pieces, mut plan) = (Vec::new(), Vec::new());
        let (mut pos, mut at) = (0u64, 0usize);
        while pos < len {
            let off = offset + pos;
            let (c, n) = (off / chunk, (chunk - off % chunk).min(len - pos));
            let targets: Vec<(usize, u64)> = match a.mirror_chunk_may_be_torn(c) {
                true => a
                    .geo
                    .chunk_copies(c)
                    .iter()
                    .filter(|p| a.copy_readable(p))
                    .map(|p| (p.member, a.data_offset + p.offset + off % chunk))
                    .collect(),
                false => a.direct_target(off, n).into_iter().collect(),
            };
            if targets.is_empty() || plan.len() + targets.len() > max_reads {
                return None;
            }
            for (k, &(slot, member_at)) in targets.iter().enumerate() {
                plan.push(DirectPiece {
                    slot,
                    at: member_at,
                    pos: at + k * n as usize,
                    len: n as usize,
                });
            }
            pieces.push(Compared {
                pos: pos as usize,
                len: n as usize,
                at,
                copies: targets.len(),
            });
            at += targets.len() * n as usize;
            pos += n;
        }
        Some((
            DirectRead {
                handles,
                pieces: plan,
            },
            CopiesRead {
                pieces,
                // Read whole before a byte of it is: `finish` runs only
                // once every piece is in, and hands out none of it else.
                scratch: AlignedBuf::for_overwrite(at),
            },
        ))
    }

    /// Where the reads land (see `start`).
    pub(crate) fn scratch(&mut self) -> &mut AlignedBuf {
        &mut self.scratch
    }

    /// Bytes of copies it reads, every copy of a torn chunk counted.
    pub(crate) fn bytes(&self) -> usize {
        self.scratch.len()
    }

    /// Every read is in. Where each piece's copies agree, its bytes are
    /// copied into `out` and true returned; false: some differ, and the
    /// read is the blocking path's (`out` then holds nothing to answer).
    pub(crate) fn finish(&self, out: &mut [u8]) -> bool {
        for p in &self.pieces {
            let first = &self.scratch[p.at..p.at + p.len];
            let agree = (1..p.copies).all(|k| {
                let other = p.at + k * p.len;
                self.scratch[other..other + p.len] == *first
            });
            if !agree {
                return false;
            }
            out[p.pos..p.pos + p.len].copy_from_slice(first);
        }
        true
    }
}

impl Array {
    /// The blocking path's form of the same read (`mirror_read`, before it
    /// resyncs torn chunks under their locks): `buf` filled from copies
    /// that agree, and true; false where they differ or a copy's read
    /// erred (its member then failed, where its slot still holds it, as
    /// any read error fails it), or where the copies of a read this large
    /// would take more than `COMPARED_BYTES`: `buf` then holds nothing to
    /// answer.
    pub(super) fn read_agreeing_copies(&self, offset: u64, buf: &mut [u8]) -> bool {
        if buf.len() * self.geo.copies() > COMPARED_BYTES {
            return false;
        }
        let len = buf.len() as u64;
        let Some((plan, mut copies)) = CopiesRead::start(
            self,
            Arc::clone(&self.read_handles()),
            offset,
            len,
            usize::MAX,
        ) else {
            return false;
        };
        // Disjoint slices of the scratch buffer, in the plan's order (its
        // pieces go up the buffer one after another).
        let mut ios = Vec::with_capacity(plan.pieces.len());
        let mut rest: &mut [u8] = copies.scratch();
        let mut at = 0;
        for p in &plan.pieces {
            debug_assert_eq!(p.pos, at, "the copies' pieces lie end to end");
            at += p.len;
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(p.len);
            rest = tail;
            ios.push(MemberIo {
                member: p.slot,
                offset: p.at,
                op: IoOp::Read(head),
            });
        }
        let results = crate::member::submit(&plan.handles, &mut ios);
        let mut all_read = true;
        for (p, r) in plan.pieces.iter().zip(results) {
            if let Err(e) = r {
                let m = &plan.handles[p.slot];
                self.fail_slot_if(p.slot, m, &format!("read error: {e}"));
                all_read = false;
            }
        }
        all_read && copies.finish(buf)
    }
}
