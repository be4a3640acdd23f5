//! Space reserved on a sparse member file before the array writes there.
//!
//! A member file created sparse (`raidctl create --sparse`) gets its
//! blocks as they are first written. On a filesystem that fills, such a
//! write fails with ENOSPC, and a RAID5/6 stripe whose data write landed
//! while its parity write did not (or a mirror chunk one of whose copies
//! did) disagrees with itself: a member failing before the next start's
//! resync would then rebuild the stripe's other chunks wrong. So the
//! array reserves the blocks of every region a write is about to touch
//! (`Member::reserve`: `fallocate`, which allocates without changing the
//! bytes) before any of a stripe's member writes goes out, and a full
//! filesystem refuses them together (`Array::reserve_writes`; a
//! shard sends a write into rows not reserved yet to the blocking path,
//! which reserves them: `array::async_write`).
//!
//! Regions of 1 MiB: one `fallocate` per region per start, and at most
//! 1 MiB more allocated than written per region touched. A region is
//! marked once its `fallocate` succeeded, and unmarked when a hole is
//! punched in it (a discard), under one lock with the punch, so a mark
//! never outlives the blocks it stands for. Where the filesystem has no
//! `fallocate` there is nothing to reserve with: the region counts as
//! reserved, and a full filesystem meets the write itself, as before
//! (`docs/reliability.md`). So does a copy-on-write filesystem (btrfs),
//! whose overwrites may need new blocks whatever was reserved.

use parking_lot::Mutex;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// log2 of a region's bytes.
const REGION_SHIFT: u32 = 20;

/// Which regions of a member have their blocks reserved.
pub(super) struct Reserved {
    size: u64,
    words: Box<[AtomicU64]>,
    /// Held over a region's `fallocate` and its mark, and over a punch
    /// and its unmarking, so the two never interleave.
    change: Mutex<()>,
}

impl Reserved {
    /// None marked, for a member of `size` bytes.
    pub(super) fn new(size: u64) -> Reserved {
        let regions = size.div_ceil(1 << REGION_SHIFT);
        Reserved {
            size,
            words: (0..regions.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            change: Mutex::new(()),
        }
    }

    /// The regions [offset, offset+len) touches, within the member.
    fn regions(&self, offset: u64, len: u64) -> Range<u64> {
        let end = (offset.saturating_add(len)).min(self.size);
        if len == 0 || offset >= end {
            return 0..0;
        }
        offset >> REGION_SHIFT..(end - 1) / (1 << REGION_SHIFT) + 1
    }

    fn is_marked(&self, r: u64) -> bool {
        self.words[(r / 64) as usize].load(Ordering::Acquire) & (1 << (r % 64)) != 0
    }

    /// Whether every region [offset, offset+len) touches is reserved.
    pub(super) fn covers(&self, offset: u64, len: u64) -> bool {
        self.regions(offset, len).all(|r| self.is_marked(r))
    }

    /// Reserves every region [offset, offset+len) touches that is not yet,
    /// with `allocate(start, len)` (the file's `fallocate`); stops at the
    /// first error, the regions before it kept.
    pub(super) fn reserve(
        &self,
        offset: u64,
        len: u64,
        allocate: impl Fn(u64, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        if self.covers(offset, len) {
            return Ok(());
        }
        let _change = self.change.lock();
        for r in self.regions(offset, len) {
            if self.is_marked(r) {
                continue;
            }
            let start = r << REGION_SHIFT;
            match allocate(start, (1 << REGION_SHIFT).min(self.size - start)) {
                Ok(()) => {}
                // Nothing to reserve with: the write meets what it meets.
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
                Err(e) => return Err(e),
            }
            self.words[(r / 64) as usize].fetch_or(1 << (r % 64), Ordering::AcqRel);
        }
        Ok(())
    }

    /// Runs `punch` (a hole punched in [offset, offset+len)) with every
    /// region it touches unmarked first, under the lock `reserve` takes.
    pub(super) fn punching<T>(&self, offset: u64, len: u64, punch: impl FnOnce() -> T) -> T {
        let _change = self.change.lock();
        for r in self.regions(offset, len) {
            self.words[(r / 64) as usize].fetch_and(!(1 << (r % 64)), Ordering::AcqRel);
        }
        punch()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    const R: u64 = 1 << REGION_SHIFT;

    #[test]
    fn a_region_is_allocated_once_and_whole() {
        let res = Reserved::new(3 * R + 100);
        let calls = Mutex::new(Vec::new());
        let alloc = |s, l| {
            calls.lock().push((s, l));
            Ok(())
        };
        assert!(!res.covers(R + 5, 10));
        res.reserve(R + 5, 10, alloc).unwrap();
        assert!(res.covers(R, R) && !res.covers(0, 1) && !res.covers(2 * R, 1));
        res.reserve(R + 100, 4096, alloc).unwrap();
        // Across the last two regions: the last one is the file's tail.
        res.reserve(2 * R + R / 2, R, alloc).unwrap();
        assert_eq!(*calls.lock(), vec![(R, R), (2 * R, R), (3 * R, 100)]);
        assert!(res.covers(R, 2 * R + 100) && res.covers(0, 0));
    }

    #[test]
    fn a_full_filesystem_leaves_the_region_unreserved() {
        let res = Reserved::new(4 * R);
        let n = AtomicUsize::new(0);
        let alloc = |_, _| match n.fetch_add(1, Ordering::SeqCst) {
            0 => Ok(()),
            _ => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        };
        let e = res.reserve(0, 3 * R, alloc).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert!(res.covers(0, R) && !res.covers(R, 1) && !res.covers(2 * R, 1));
        // No fallocate: counted as reserved, nothing to do it with.
        let none = |_, _| Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        res.reserve(R, R, none).unwrap();
        assert!(res.covers(R, R));
    }

    #[test]
    fn a_punched_hole_unmarks_its_regions() {
        let res = Reserved::new(4 * R);
        res.reserve(0, 4 * R, |_, _| Ok(())).unwrap();
        let inside = res.punching(R + 10, R, || res.covers(R, 1));
        assert!(!inside, "unmarked before the punch");
        assert!(res.covers(0, R) && !res.covers(R, 1) && !res.covers(2 * R, 1));
        assert!(res.covers(3 * R, R));
    }
}
