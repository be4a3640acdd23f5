//! RAID0, RAID1 and RAID10 data paths: every logical chunk has one (RAID0)
//! or several copies; reads take one readable copy, writes go to every
//! readable copy. Writes to one chunk hold its lock so concurrent writers
//! cannot leave the copies different.

use super::*;
use crate::layout::Place;
use crate::member::{submit, IoOp, MemberIo};

/// One chunk's part of a request.
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    pub(super) chunk: u64,
    /// Offset in the chunk.
    pub(super) within: u64,
    pub(super) len: u64,
    /// Offset in the request.
    pub(super) pos: usize,
}

impl Array {
    /// The chunks `len` bytes at `offset` cover, in order.
    pub(super) fn chunk_pieces(&self, offset: u64, len: u64) -> Vec<Piece> {
        let chunk = self.geo.chunk;
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < len {
            let at = offset + pos;
            let n = (chunk - at % chunk).min(len - pos);
            out.push(Piece {
                chunk: at / chunk,
                within: at % chunk,
                len: n,
                pos: pos as usize,
            });
            pos += n;
        }
        out
    }

    /// The copy of chunk `c` a read tries first: one that spreads reads
    /// over every member (`Geometry::read_copy`); the first copy
    /// while a resync is owed, since where a crash left the copies
    /// different the resync writes the first readable one over the others,
    /// and a read of a copy it then overwrites would have returned data
    /// the block never holds again (two reads of it, no write between,
    /// disagreeing).
    pub(super) fn first_copy_first(&self, c: u64) -> usize {
        match self.resync.pending() {
            true => 0,
            false => self.geo.read_copy(c),
        }
    }

    pub(super) fn copy_readable(&self, p: &Place) -> bool {
        self.readable(p.member, p.offset / self.geo.chunk)
    }

    pub(super) fn mirror_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let pieces = self.chunk_pieces(offset, buf.len() as u64);
        // Chunks an unclean stop may have torn: every copy read and
        // compared, and the read answered where they agree; where they
        // differ, made to agree first (`copies_read.rs`).
        let torn: Vec<u64> = pieces
            .iter()
            .map(|p| p.chunk)
            .filter(|&c| self.mirror_chunk_may_be_torn(c))
            .collect();
        if !torn.is_empty() {
            if self.read_agreeing_copies(offset, buf) {
                return Ok(());
            }
            for c in torn {
                self.resync_chunk_before_read(c)?;
            }
        }
        let mut pending: Vec<usize> = (0..pieces.len()).collect();
        while !pending.is_empty() {
            let handles = self.read_handles();
            // While a resync is owed, the copy it keeps (see
            // `first_copy_first`); else spread over the mirrors.
            let keep_first = self.resync.pending();
            let start = match keep_first {
                true => 0,
                false => self.rr.fetch_add(1, Ordering::Relaxed),
            };
            let mut plan = Vec::new();
            let mut load = vec![0usize; self.geo.members];
            for &k in &pending {
                let p = pieces[k];
                let copies = self.geo.chunk_copies(p.chunk);
                let n = copies.len();
                // The readable copy on the least-used member so far, so one
                // large read spreads over every mirror.
                let mut readable = (0..n)
                    .map(|j| copies[(start + j) % n])
                    .filter(|c| self.copy_readable(c));
                let pick = match keep_first {
                    true => readable.next(),
                    false => readable.min_by_key(|c| load[c.member]),
                };
                if let Some(c) = pick {
                    load[c.member] += 1;
                }
                match pick {
                    Some(c) => plan.push((k, c)),
                    None => return Err(self.failed_error()),
                }
            }
            // Hand out disjoint slices of the bounce buffer, in request order.
            plan.sort_by_key(|(k, _)| *k);
            let mut ios = Vec::new();
            let mut rest: &mut [u8] = &mut *buf;
            let mut at = 0usize;
            for &(k, c) in &plan {
                let p = pieces[k];
                let (_, r) = std::mem::take(&mut rest).split_at_mut(p.pos - at);
                let (head, tail) = r.split_at_mut(p.len as usize);
                rest = tail;
                at = p.pos + p.len as usize;
                ios.push(MemberIo {
                    member: c.member,
                    offset: self.data_offset + c.offset + p.within,
                    op: IoOp::Read(head),
                });
            }
            let results = submit(&handles, &mut ios);
            pending.clear();
            for ((k, c), r) in plan.iter().zip(results) {
                if let Err(e) = r {
                    self.fail_slot_if(c.member, &handles[c.member], &format!("read error: {e}"));
                    pending.push(*k);
                }
            }
        }
        Ok(())
    }

    /// Keys for the chunk locks; RAID0 has one copy and needs none.
    fn mirror_lock_keys(&self, pieces: &[Piece]) -> Vec<u64> {
        if self.geo.level == Level::Raid0 {
            Vec::new()
        } else {
            pieces.iter().map(|p| p.chunk).collect()
        }
    }

    pub(super) fn mirror_write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let pieces = self.chunk_pieces(offset, data.len() as u64);
        let _held = self.locks.lock(self.mirror_lock_keys(&pieces));
        let handles = self.member_handles();
        let mut ios = Vec::new();
        let mut owner = Vec::new();
        for (k, p) in pieces.iter().enumerate() {
            for c in self.geo.chunk_copies(p.chunk) {
                if self.copy_readable(&c) {
                    ios.push(MemberIo {
                        member: c.member,
                        offset: self.data_offset + c.offset + p.within,
                        op: IoOp::Write(&data[p.pos..p.pos + p.len as usize]),
                    });
                    owner.push((k, c));
                }
            }
        }
        let writes = ios.iter().map(|io| (io.member, io.offset, io.len() as u64));
        self.reserve_writes(&handles, writes)?;
        let results = submit(&handles, &mut ios);
        let mut written = vec![false; pieces.len()];
        let mut full = false;
        let mut took = Vec::new();
        for ((io, kc), r) in ios.iter().zip(&owner).zip(results) {
            match r {
                Ok(()) => took.push(*kc),
                Err(e) => full |= self.member_write_failed(io.member, &handles[io.member], &e),
            }
        }
        // Written where a copy took it and is still in sync: one failed
        // meanwhile (by this write's errors or another thread) holds nothing.
        for (k, c) in took {
            if self.copy_readable(&c) {
                written[k] = true;
            }
        }
        // A copy left behind on a full filesystem: the write did not
        // complete (its region stays dirty until the next start resyncs).
        if let Some(e) = self.no_space_error().filter(|_| full) {
            return Err(e);
        }
        if written.iter().all(|&w| w) {
            Ok(())
        } else {
            Err(self.failed_error())
        }
    }

    pub(super) fn mirror_zero(&self, offset: u64, len: u64) -> Result<()> {
        // In groups of chunks, so the lock set and plan stay small.
        let group = 4096 * self.geo.chunk;
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(group - at % group);
            let pieces = self.chunk_pieces(at, n);
            let _held = self.locks.lock(self.mirror_lock_keys(&pieces));
            // (member, offset, len), merged where contiguous on a member.
            let mut ranges: Vec<(usize, u64, u64)> = Vec::new();
            for p in &pieces {
                for c in self.geo.chunk_copies(p.chunk) {
                    if self.copy_readable(&c) {
                        ranges.push((c.member, self.data_offset + c.offset + p.within, p.len));
                    }
                }
            }
            ranges.sort_unstable();
            let mut merged: Vec<(usize, u64, u64)> = Vec::new();
            for r in ranges {
                match merged.last_mut() {
                    Some(l) if l.0 == r.0 && l.1 + l.2 == r.1 => l.2 += r.2,
                    _ => merged.push(r),
                }
            }
            let handles = self.member_handles();
            for (m, off, l) in merged {
                if self.slots[m].state() == SlotState::Failed {
                    continue;
                }
                if let Err(e) = handles[m].write_zeroes(off, l) {
                    self.member_write_failed(m, &handles[m], &e);
                }
            }
            if !self.within_redundancy() {
                return Err(self.failed_error());
            }
            if let Some(e) = self.no_space_error() {
                return Err(e);
            }
            at += n;
        }
        Ok(())
    }
}
