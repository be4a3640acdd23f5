//! A shard's write's hold on the array (`async_write.rs`), and a shard's
//! degraded read's (`degraded_read.rs`): what it holds, given up in the
//! blocking path's order when it is dropped.

use super::*;
use std::ops::RangeInclusive;

/// The write's hold on the array, given up when dropped: its journal
/// record's in-place write done, out of `unjournaled`, then the stripe's
/// (chunk's) lock, then the write intent (the blocking path's order). A
/// degraded read on a shard holds only a stripe's lock
/// (`Guards::stripe_lock`).
pub(super) struct Guards {
    pub(super) array: LocalArray,
    /// The durable journal record whose in-place write this write makes.
    pub(super) record: Option<u64>,
    /// A journal record queued for this write, its outcome not yet heard:
    /// a write dropped meanwhile (only by a panic on its shard) keeps its
    /// stripe's lock and write intent for good, since the record may yet be
    /// durable, and then a later writer of the stripe must not chain its
    /// own record after it unsettled.
    pub(super) queued: bool,
    /// The keys of the locks held (`Array::write_lock_keys`): a stripe's,
    /// or a run of chunks'.
    pub(super) locks: Option<RangeInclusive<u64>>,
    pub(super) intent: Option<RangeInclusive<usize>>,
    pub(super) in_flight: Option<usize>,
}

impl Guards {
    /// Lock `key` (`Array::write_lock_key`), if no one holds it.
    pub(super) fn stripe_lock(array: &LocalArray, key: u64) -> Option<Guards> {
        array.locks.try_lock_raw(key).then(|| Guards {
            array: array.clone(),
            record: None,
            queued: false,
            locks: Some(key..=key),
            intent: None,
            in_flight: None,
        })
    }

    pub(super) fn leave_in_flight(&mut self) {
        if let Some(p) = self.in_flight.take() {
            self.array.unjournaled.leave(p);
        }
    }
}

impl Drop for Guards {
    fn drop(&mut self) {
        if self.queued {
            tracing::error!(array = %self.array.name, stripe = ?self.locks,
                "a write with its journal record queued was dropped; its stripe stays locked");
            self.locks = None;
            self.intent = None;
        }
        if let Some(seq) = self.record.take() {
            self.array.journal_write_done(seq);
        }
        self.leave_in_flight();
        if let Some(keys) = self.locks.take() {
            // SAFETY: taken with `try_lock_range_raw` (`AsyncWrite::start`)
            // or `try_lock_raw` (`Guards::stripe_lock`, one key), and
            // `take` makes this the one release.
            unsafe { self.array.locks.unlock_range_raw(keys) };
        }
        if let Some(r) = self.intent.take() {
            if let Some(bm) = &self.array.bitmap {
                bm.leave(r);
            }
        }
    }
}
