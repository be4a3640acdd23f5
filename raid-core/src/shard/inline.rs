//! Reads served in the caller's thread. Where every chunk a read touches
//! has a readable copy on a member in memory (a file on tmpfs or ramfs),
//! its member I/O is a copy that never waits for a device: handing it to a
//! shard would cost two thread crossings (the shard's wake-up, then the
//! caller's) for a few microseconds of copying, which is most of the cost
//! of a 4 KiB read. So the engine runs it where it was asked for, and its
//! completion runs there too, before `Engine::read` returns. A shard
//! serves the same read the same way (`Shard::start_io`, members in
//! memory): only the thread differs.
//!
//! Writes likewise, where every member a write touches is in memory: the
//! same state machine a shard runs (`array::async_write`: its guards, its
//! read step, then its write step), its member I/Os copied here one after
//! another. A write that would wait (a stripe another write holds, a bit
//! not yet durable, the first write since clean) or that must be journaled
//! (a degraded stripe: its record waits for a group) is handed back with
//! nothing written, for its shard, which queues it behind the write that
//! holds its stripe or sends it to the blocking path; one whose member
//! erred goes where a shard's does.
//!
//! A mirror read of chunks an unclean stop may have torn reads every copy
//! here the same way, and is answered where they agree
//! (`array::copies_read`).
//!
//! Anything else goes to the shard as before. A read whose member copy
//! fails goes where a shard sends one (`Fallback::Read` with the member
//! that erred): the blocking path fails the member and reads the chunk
//! from the others, so a member that erred is not trusted again, whichever
//! thread saw the error. Reads are never
//! ordered against writes in flight on any path (a read in flight with a
//! write returns either), so serving one here breaks no promise.

use super::{answer, Blocking, Engine, Fallback, ReadDone, ReadJob, WriteDone, WriteJob};
use crate::array::async_write::{AsyncWrite, Next, Start};
use crate::array::copies_read::CopiesRead;
use crate::array::LocalArray;
use crate::buf::AlignedBuf;
use crate::member::{read_counted, write_counted, Member};
use crate::stats::Started;
use std::sync::atomic::Ordering;

/// Chunks a read may touch, and bytes it may copy, and still be copied
/// here: a larger read is a long copy that holds up the caller (a front
/// end's one reader of a connection), which the shards spread better.
const MAX_PIECES: usize = 16;
const MAX_BYTES: usize = 256 << 10;
/// Member bytes a write may move and still be run here. Through NBD on
/// tmpfs members, against the shards: RAID0 4-64 KiB writes 1.15-1.59x,
/// 128 KiB 0.93x; RAID5 (a read-modify-write moves four times its bytes)
/// 4 KiB 1.37x, 16 KiB 1.05x, 64 KiB 0.84x. Past this the copies hold up
/// the caller (a connection's one reader) more than the shards' spread
/// over the cores costs.
const MAX_WRITE_MEMBER_BYTES: usize = 64 << 10;

/// Member bytes a small write of `len` bytes moves: each copy written;
/// for RAID5/6, the old data and parity read and the new written.
pub(super) fn member_bytes(geo: &crate::layout::Geometry, len: usize) -> usize {
    match geo.level.parity_chunks() {
        0 => len * geo.copies(),
        p => 2 * (1 + p) * len,
    }
}

impl Engine {
    /// Serves the read in this thread and answers it, where it can (see
    /// the module's doc), or sends it to the blocking path if a member
    /// erred; otherwise hands `buf` and `done` back for a shard.
    pub(super) fn read_inline(
        &self,
        offset: u64,
        mut buf: AlignedBuf,
        done: ReadDone,
    ) -> Result<(), (AlignedBuf, ReadDone)> {
        // No shards (no io_uring): every request runs on the blocking
        // threads, as `Engine::start` says.
        if self.shards.is_empty() || buf.len() > MAX_BYTES || !self.array.any_in_memory() {
            return Err((buf, done));
        }
        let len = buf.len() as u64;
        // Mirror chunks an unclean stop may have torn: every copy read
        // into a buffer of its own, and compared (`array::copies_read`).
        let (plan, mut copies) = match self.local.direct_read(offset, len) {
            Some(plan) => (plan, None),
            None => match CopiesRead::start(
                &self.local,
                self.local.read_handles(),
                offset,
                len,
                MAX_PIECES,
            ) {
                Some((plan, c)) => (plan, Some(c)),
                None => return Err((buf, done)),
            },
        };
        if plan.pieces.len() > MAX_PIECES
            || copies.as_ref().is_some_and(|c| c.bytes() > MAX_BYTES)
            || !plan.pieces.iter().all(|p| plan.handles[p.slot].in_memory())
        {
            return Err((buf, done));
        }
        let handles = plan.handles;
        let started = Started::now();
        for p in &plan.pieces {
            let m: &dyn Member = handles[p.slot].as_ref();
            let into = match &mut copies {
                Some(c) => c.scratch(),
                None => &mut buf,
            };
            if let Err(e) = read_counted(m, &mut into[p.pos..p.pos + p.len], p.at) {
                let failed = Some((p.slot, handles[p.slot].clone(), e));
                let job = ReadJob { offset, buf, done };
                self.blocking(Fallback::Read { job, failed });
                return Ok(());
            }
        }
        // Copies that differ: the blocking path makes them agree first.
        if copies.is_some_and(|c| !c.finish(&mut buf)) {
            let job = ReadJob { offset, buf, done };
            self.blocking(Fallback::Read { job, failed: None });
            return Ok(());
        }
        self.array.count_direct_read(buf.len(), started, true);
        self.counts.inline.fetch_add(1, Ordering::Relaxed);
        answer(done, Ok(buf));
        Ok(())
    }

    /// Serves the write in this thread and answers it, where every member
    /// it touches is in memory (see the module's doc); otherwise hands
    /// `data` and `done` back, nothing written, for a shard.
    pub(super) fn write_inline(
        &self,
        offset: u64,
        data: AlignedBuf,
        done: WriteDone,
    ) -> Result<(), (AlignedBuf, WriteDone)> {
        if self.shards.is_empty() {
            return Err((data, done));
        }
        let blocking = self.blocking.as_ref().expect("set until drop");
        write_here(&self.local, blocking, offset, data, done)
    }
}

/// `Engine::write_inline`'s work, on whichever thread calls it (a
/// caller's, or a shard's for its clients: `Local::write`), given an
/// engine with shards.
pub(super) fn write_here(
    array: &LocalArray,
    blocking: &Blocking,
    offset: u64,
    data: AlignedBuf,
    done: WriteDone,
) -> Result<(), (AlignedBuf, WriteDone)> {
    let geo = array.geometry();
    let len = data.len() as u64;
    // Inside one chunk, so `member_bytes` holds (one across chunks may
    // rewrite whole columns).
    let small = len > 0
        && offset / geo.chunk == (offset + len - 1) / geo.chunk
        && member_bytes(&geo, data.len()) <= MAX_WRITE_MEMBER_BYTES;
    if !small || !array.any_in_memory() {
        return Err((data, done));
    }
    let mut w = match AsyncWrite::start(array, offset, data, in_memory) {
        // A degraded stripe's write is journaled, and its record waits
        // for a group: its shard runs it, reads and all.
        Start::Go(w) if w.degraded() => return Err((w.give_up(), done)),
        Start::Go(w) => w,
        Start::Blocking(data) => return Err((data, done)),
    };
    // One vector for every step's results (`AsyncWrite::advance`).
    let mut results = Vec::with_capacity(geo.members);
    let next = loop {
        debug_assert!(
            !w.journal_due(),
            "only a degraded stripe's write is journaled, and it was handed back at its start"
        );
        results.extend((0..w.ios().len()).map(|i| {
            let io = w.ios()[i];
            let (ptr, len) = w.io_buf(i);
            let m = w.handles()[io.slot].as_ref();
            // SAFETY: `io_buf` is a buffer of `w` (its own, or its
            // request's data), alive and unmoved while `w` is, and
            // nothing else uses it during this call: this thread
            // owns `w`, and a step's reads go to buffers no other
            // I/O of the step uses (its writes only read theirs).
            unsafe {
                match io.write {
                    true => write_counted(m, std::slice::from_raw_parts(ptr, len), io.offset),
                    false => read_counted(m, std::slice::from_raw_parts_mut(ptr, len), io.offset),
                }
            }
        }));
        match w.advance(&mut results) {
            Next::Io => continue,
            next => break next,
        }
    };
    if matches!(next, Next::Done(_) | Next::Finish(_)) {
        blocking
            .counts
            .writes_inline
            .fetch_add(1, Ordering::Relaxed);
    }
    match next {
        Next::Io => unreachable!("looped on above"),
        Next::Done(r) => {
            // Its guards go before the client hears.
            let data = w.give_up();
            answer(done, r.map(|()| data));
        }
        Next::Blocking(failed) => {
            let job = WriteJob::new(offset, w.give_up(), false, done);
            blocking.send(Fallback::Write { job, failed });
        }
        // Failing a member waits for writers in flight: on the
        // engine's finishing thread, as a shard's write.
        Next::Finish(results) => blocking.send(Fallback::Finish { w, results, done }),
    }
    Ok(())
}

/// Whether a member's I/O is a copy in memory (`write_inline`'s members).
fn in_memory(m: &dyn Member) -> bool {
    m.in_memory()
}
