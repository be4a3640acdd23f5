//! Where a write runs: the lock it takes (its stripe, or chunk), whether
//! it stays inside one (the writes a shard may merge), and whether a shard
//! cuts it into a write per stripe. The blocking path and the shards both
//! route by these.

use super::*;
use std::ops::RangeInclusive;

impl Array {
    /// The key of the lock a write starting at `offset` takes, in the
    /// blocking path and on the shards: its stripe (RAID5/6) or chunk
    /// (RAID1/10); RAID0 takes none.
    pub(crate) fn write_lock_key(&self, offset: u64) -> Option<u64> {
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => Some(offset / self.geo.stripe_data_bytes()),
            Level::Raid1 | Level::Raid10 => Some(offset / self.geo.chunk),
            Level::Raid0 => None,
        }
    }

    /// The keys of the locks a write of `len` bytes at `offset` takes
    /// (`write_lock_key`): every stripe (chunk) it touches. None also
    /// where its end is past any offset (a bad request, answered later).
    pub(crate) fn write_lock_keys(&self, offset: u64, len: u64) -> Option<RangeInclusive<u64>> {
        let last = offset.checked_add(len.max(1) - 1)?;
        Some(self.write_lock_key(offset)?..=self.write_lock_key(last)?)
    }

    /// Whether a write of `len` bytes at `offset` is well formed (whole
    /// blocks, inside the array, not empty) and lies inside lock `key`'s
    /// stripe (chunk): the writes a shard may merge (`shard/merge.rs`).
    pub(crate) fn inside_lock(&self, key: u64, offset: u64, len: u64) -> bool {
        len > 0
            && self.check_range(offset, len).is_ok()
            && self.write_lock_key(offset) == Some(key)
            && self.write_lock_key(offset + len - 1) == Some(key)
    }

    /// Whether a write of `len` bytes at `offset` is a well formed RAID5/6
    /// write that touches two stripes or more and covers none of them whole, on
    /// an array with no member failed, missing or being rebuilt and none in
    /// memory: one a shard cuts into a write per stripe (`shard/split.rs`). A
    /// write that covers a stripe whole stays the blocking path's, which writes
    /// such stripes together, their parity in one call: cut on the shards, 1
    /// MiB random writes at depth 128 ran 0.90-0.94x its rate with a p99 four
    /// times its own (the large I/O bench). So does every such write to members
    /// in memory, where the copies are the cost and the blocking path's threads
    /// take them on whichever core is free: cut on the shards, sequential 128
    /// KiB writes through NBD on tmpfs ran 0.74-0.75x. And so does every such
    /// write while a member is out, each part of which would put a journal
    /// record in the ring: cut, with every write on the shards, the records in
    /// flight outgrew the 16 MiB ring (at depth 128 of 128 KiB writes, 16,000
    /// waits for room a run against 70), and the writes ran 0.90-0.94x.
    pub(crate) fn split_on_shards(&self, offset: u64, len: u64) -> bool {
        let sdb = self.geo.stripe_data_bytes();
        matches!(self.geo.level, Level::Raid5 | Level::Raid6)
            && len > 0
            && self.check_range(offset, len).is_ok()
            && offset / sdb != (offset + len - 1) / sdb
            && offset.div_ceil(sdb) * sdb + sdb > offset + len
            && self.slots.iter().all(|s| s.state() == SlotState::Active)
            && !self.any_in_memory()
    }
}
