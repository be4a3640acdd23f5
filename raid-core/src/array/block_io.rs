//! The array as a block device: read, write, flush, write-zeroes and
//! discard, checked and sent to the level's path (`parity_io.rs`,
//! `mirror_io.rs`, or straight to one member when a request lies inside one
//! readable chunk).

use super::*;
use crate::stats::Started;

/// A read the shards serve straight from members (`Array::direct_read`).
pub(crate) struct DirectRead {
    pub handles: Arc<MemberTable>,
    pub pieces: Vec<DirectPiece>,
}

/// One chunk's part of a `DirectRead`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DirectPiece {
    pub slot: usize,
    /// Member byte offset.
    pub at: u64,
    /// Offset in the request.
    pub pos: usize,
    pub len: usize,
}

impl Array {
    pub(super) fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        if !offset.is_multiple_of(BLOCK) || !len.is_multiple_of(BLOCK) {
            return Err(ArrayError::Unaligned { offset, len });
        }
        if offset.checked_add(len).is_none_or(|e| e > self.capacity()) {
            return Err(ArrayError::OutOfRange {
                offset,
                len,
                capacity: self.capacity(),
            });
        }
        Ok(())
    }

    /// Where a request that lies inside one chunk can be read directly: the
    /// slot and member byte offset of a readable copy. None sends it down
    /// the general path.
    pub(super) fn direct_target(&self, offset: u64, len: u64) -> Option<(usize, u64)> {
        let chunk = self.geo.chunk;
        let c = offset / chunk;
        if (offset + len - 1) / chunk != c {
            return None;
        }
        let within = offset % chunk;
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => {
                let nd = self.geo.data_chunks() as u64;
                let s = c / nd;
                let m = self.geo.stripe_member(s, (c % nd) as usize);
                self.readable(m, s)
                    .then_some((m, self.data_offset + s * chunk + within))
            }
            // Torn by an unclean stop, perhaps: every copy is read and
            // compared (`copies_read.rs`).
            _ if self.mirror_chunk_may_be_torn(c) => None,
            _ => {
                let n = self.geo.copies();
                let first = self.first_copy_first(c);
                (0..n)
                    .map(|j| self.geo.copy_place(c, (first + j) % n))
                    .find_map(|p| {
                        self.readable(p.member, p.offset / chunk)
                            .then_some((p.member, self.data_offset + p.offset + within))
                    })
            }
        }
    }

    /// Where a read can go straight to its members, chunk by chunk, for a
    /// caller that reads without blocking (`crate::shard`): the member
    /// handles (held until the read completes) and, for each chunk the
    /// read touches, the slot, member offset, offset in the request and
    /// length of a readable copy. The fast path's rule, handles first and
    /// readability after; None (a chunk with no readable copy: degraded;
    /// a mirror chunk an unclean stop may have torn, whose copies must be
    /// compared: `copies_read.rs`) sends the read elsewhere. `handles`:
    /// the table reads are planned on (`read_handles`, or a thread's copy
    /// of it: `LocalArray::direct_read`), taken before this checks
    /// readability.
    pub(crate) fn direct_read(
        &self,
        handles: Arc<MemberTable>,
        offset: u64,
        len: u64,
    ) -> Option<DirectRead> {
        if len == 0 || self.check_range(offset, len).is_err() {
            return None;
        }
        let chunk = self.geo.chunk;
        let mut pieces = Vec::new();
        let mut pos = 0;
        while pos < len {
            let at = offset + pos;
            let n = (chunk - at % chunk).min(len - pos);
            let (slot, member_at) = self.direct_target(at, n)?;
            pieces.push(DirectPiece {
                slot,
                at: member_at,
                pos: pos as usize,
                len: n as usize,
            });
            pos += n;
        }
        Some(DirectRead { handles, pieces })
    }

    /// The member table reads are planned on (`member_io::Handles::reads`:
    /// a hot replace's pair as the device its reads go to).
    pub(super) fn read_handles(&self) -> arc_swap::Guard<Arc<MemberTable>> {
        self.handles.reads.load()
    }

    /// Whether any member is in memory: only then may a read be copied in
    /// its caller's thread (`crate::shard`), which checks each piece's
    /// member; a cheap test that spares every other array the plan.
    pub(crate) fn any_in_memory(&self) -> bool {
        self.member_handles().iter().any(|m| m.in_memory())
    }

    /// Whether every member is in memory (files on tmpfs or ramfs): its
    /// I/O then waits for no device, and a front end needs no more
    /// requests in flight than it has cores to copy with.
    pub fn all_in_memory(&self) -> bool {
        self.every_member(|m| m.in_memory())
    }

    /// Whether every member passes `f` (what the engine asks of them);
    /// a slot with no member (missing, removed) takes no I/O and is not
    /// asked.
    pub(crate) fn every_member(&self, f: impl Fn(&dyn crate::member::Member) -> bool) -> bool {
        let handles = self.member_handles();
        self.slots
            .iter()
            .zip(handles.iter())
            .filter(|(s, _)| s.member.read().is_some())
            .all(|(_, m)| f(m.as_ref()))
    }

    /// Counts a read the shards served from their members (each member's
    /// own I/O is counted where it completed), from `t`; `ok`: whether it
    /// was answered with its data.
    pub(crate) fn count_direct_read(&self, len: usize, t: Started, ok: bool) {
        self.client_io.read.record(len as u64, t.took(), ok);
    }

    /// Counts `n` client writes that were merged into another's (which
    /// was counted, with all their bytes, where it ran): the operations
    /// only, untimed (`shard/merge.rs`).
    pub(crate) fn count_merged_writes(&self, n: u64, ok: bool) {
        self.client_io.write.record_ops(n, ok);
    }

    /// A `direct_read` member returned an error: it is failed (if its slot
    /// still holds it), as the blocking fast path does.
    pub(crate) fn direct_read_failed(&self, slot: usize, m: &MemberRef, e: &io::Error) {
        self.fail_slot_if(slot, m, &format!("read error: {e}"));
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let t = Started::now();
        let r = self.read_checked(offset, buf, t);
        self.client_io
            .read
            .record(buf.len() as u64, t.took(), r.is_ok());
        r
    }

    /// `read`; `t` is when the request began (see `read_aligned`).
    fn read_checked(&self, offset: u64, buf: &mut [u8], t: Started) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.needs_bounce(buf) {
            let mut b = crate::buf::AlignedBuf::new(buf.len());
            self.read_aligned(offset, &mut b, t)?;
            buf.copy_from_slice(&b);
            return Ok(());
        }
        self.read_aligned(offset, buf, t)
    }

    /// Whether `buf` must be copied through aligned memory before members
    /// see it: the one place for the O_DIRECT rule, so the level paths below
    /// always get memory every member can take.
    pub(super) fn needs_bounce(&self, buf: &[u8]) -> bool {
        !crate::buf::is_aligned(buf) && self.member_handles().iter().any(|m| m.is_direct())
    }

    /// `read`, with a buffer every member can take. A read served by one
    /// member is counted for it from `t`, the request's start: one clock
    /// read fewer on the path where it shows most.
    fn read_aligned(&self, offset: u64, buf: &mut [u8], t: Started) -> Result<()> {
        // Fast path: inside one chunk, straight to a readable member. The
        // handles first, readability after (see `read_places`).
        let handles = self.read_handles();
        if let Some((slot, at)) = self.direct_target(offset, buf.len() as u64) {
            let r = handles[slot].read_at(buf, at);
            let len = buf.len();
            crate::member::count_took(handles[slot].as_ref(), true, len, t.took(), r.is_ok());
            match r {
                Ok(()) => return Ok(()),
                // Fail it and let the general path serve the read.
                Err(e) => self.fail_slot_if(slot, &handles[slot], &format!("read error: {e}")),
            }
        }
        drop(handles);
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => self.parity_read(offset, buf),
            _ => self.mirror_read(offset, buf),
        }
    }

    /// Writes `data` at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let t = Started::now();
        let r = self.write_checked(offset, data);
        self.client_io
            .write
            .record(data.len() as u64, t.took(), r.is_ok());
        r
    }

    /// `write`, not counted in the array's client statistics: a part of a
    /// client's write cut by the shards (or a merged write holding one),
    /// whose client writes the shards count.
    pub(crate) fn write_part(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_checked(offset, data)
    }

    /// Counts a client's write that the shards ran as parts not counted
    /// where they ran (`write_part`, `AsyncWrite::uncounted`): one cut at
    /// a stripe's end, or merged with such a part. `bytes`, `took`, `ok`
    /// as `stats::OpStats::record`.
    pub(crate) fn count_client_write(
        &self,
        bytes: u64,
        took: Option<std::time::Duration>,
        ok: bool,
    ) {
        self.client_io.write.record(bytes, took, ok);
    }

    /// Whether a write (or zeroing) of `len` bytes at `offset` may go
    /// ahead: in range, the array within its redundancy and not out of
    /// space; then marked dirty, with the write-intent bits it needs held
    /// by the returned guard. `Ok(None)` for an empty request: nothing to do.
    fn admit_write(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Option<Option<bitmap::WriteIntent<'_>>>> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(None);
        }
        if !self.within_redundancy() {
            return Err(self.failed_error());
        }
        if let Some(e) = self.no_space_error() {
            return Err(e);
        }
        self.mark_dirty();
        self.intend_write(offset, len).map(Some)
    }

    fn write_checked(&self, offset: u64, data: &[u8]) -> Result<()> {
        let Some(_intent) = self.admit_write(offset, data.len() as u64)? else {
            return Ok(());
        };
        if self.needs_bounce(data) {
            let mut b = crate::buf::AlignedBuf::new(data.len());
            b.copy_from_slice(data);
            return self.write_aligned(offset, &b);
        }
        self.write_aligned(offset, data)
    }

    /// `write`, with a buffer every member can take.
    fn write_aligned(&self, offset: u64, data: &[u8]) -> Result<()> {
        if self.geo.level == Level::Raid0 {
            // Fast path: one chunk, one copy, no lock needed.
            if let Some((slot, at)) = self.direct_target(offset, data.len() as u64) {
                let handles = self.member_handles();
                return crate::member::write_counted(handles[slot].as_ref(), data, at).map_err(
                    |e| {
                        if self.member_write_failed(slot, &handles[slot], &e) {
                            self.no_space_error().expect("just recorded")
                        } else {
                            self.failed_error()
                        }
                    },
                );
            }
        }
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => self.parity_write(offset, data),
            _ => self.mirror_write(offset, data),
        }
    }

    /// Makes every write completed before this call durable.
    pub fn flush(&self) -> Result<()> {
        let t = Started::now();
        let r = self.flush_checked(false);
        self.client_io.flush.record(0, t.took(), r.is_ok());
        r
    }

    /// The flush; `stopping` (an orderly stop, no write after it) clears
    /// every settled region's bit, lingering or not.
    pub(super) fn flush_checked(&self, stopping: bool) -> Result<()> {
        let generation = self.bitmap_generation();
        let parity_written = self.journal_parity_written();
        self.flush_present(true)?;
        self.journal_parity_flushed(&parity_written);
        // A member failure a write acted on (skipping the member) must be
        // on disk before that write is called durable.
        self.membership_settled();
        // After a write failed on a full filesystem, its journal record may
        // be all that can complete it: kept until the next start replays it.
        // Settled before any bit is cleared: a record replayed after a
        // crash may carry parity a resync has repaired since (a rebuild's
        // deferred resync rewrites parity without a record), which only
        // the region's bit would have the start resync again.
        if !self.full.load(Ordering::Acquire) && self.journal_settles_at_flush(stopping) {
            self.journal_settle()?;
        }
        // Every write finished before this flush began is durable now.
        self.clear_settled(generation, stopping);
        Ok(())
    }

    /// Makes the range read back as zeros, discarding it on the members
    /// where whole chunks (or whole stripes) are covered. Counted as a
    /// write of `len` bytes.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        let t = Started::now();
        let r = self.zero_checked(offset, len);
        self.client_io.write.record(len, t.took(), r.is_ok());
        r
    }

    fn zero_checked(&self, offset: u64, len: u64) -> Result<()> {
        let Some(_intent) = self.admit_write(offset, len)? else {
            return Ok(());
        };
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => self.parity_zero(offset, len),
            _ => self.mirror_zero(offset, len),
        }
    }

    /// Discard: the same as write_zeroes here (a discarded range reads as
    /// zeros, which keeps parity and mirrors consistent).
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.write_zeroes(offset, len)
    }
}
