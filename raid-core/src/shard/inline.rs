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
//! Anything else goes to the shard as before. A read whose member copy
//! fails goes where a shard sends one (`Fallback::Read` with the member
//! that erred): the blocking path fails the member and reads the chunk
//! from the others, so a member that erred is not trusted again, whichever
//! thread saw the error. Reads are never
//! ordered against writes in flight on any path (a read in flight with a
//! write returns either), so serving one here breaks no promise.

use super::{answer, Engine, Fallback, ReadDone, ReadJob};
use crate::buf::AlignedBuf;
use crate::member::{count_took, Member};
use crate::stats::Started;
use std::sync::atomic::Ordering;

/// Chunks a read may touch, and bytes it may copy, and still be copied
/// here: a larger read is a long copy that holds up the caller (a front
/// end's one reader of a connection), which the shards spread better.
const MAX_PIECES: usize = 16;
const MAX_BYTES: usize = 256 << 10;

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
        let Some(plan) = self.array.direct_read(offset, buf.len() as u64) else {
            return Err((buf, done));
        };
        if plan.pieces.len() > MAX_PIECES
            || !plan.pieces.iter().all(|p| plan.handles[p.slot].in_memory())
        {
            return Err((buf, done));
        }
        let handles = crate::member::read_devices(plan.handles);
        let started = Started::now();
        for p in &plan.pieces {
            let m: &dyn Member = handles[p.slot].as_ref();
            let t = Started::now();
            let r = m.read_at(&mut buf[p.pos..p.pos + p.len], p.at);
            count_took(m, true, p.len, t.took(), r.is_ok());
            if let Err(e) = r {
                let failed = Some((p.slot, handles[p.slot].clone(), e));
                let job = ReadJob { offset, buf, done };
                self.blocking(Fallback::Read { job, failed });
                return Ok(());
            }
        }
        self.array.count_direct_read(buf.len(), started, true);
        self.counts.inline.fetch_add(1, Ordering::Relaxed);
        answer(done, Ok(buf));
        Ok(())
    }
}
