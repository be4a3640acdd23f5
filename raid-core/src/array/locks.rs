//! Stripe locks: writers to one stripe (or mirrored chunk) never interleave,
//! while writers to different stripes run in parallel.
//!
//! A fixed table of mutexes indexed by key modulo its size. Whoever needs
//! several keys takes their slots in ascending order, so two lockers
//! can never wait on each other in a cycle.
//!
//! The order is the index's; where each lock lies in memory is another
//! matter (`StripeLocks::at`): consecutive indices lie on different
//! 128-byte lines (a line and the one the CPU prefetches with it), each
//! holding indices equal modulo `LINES`. The engine's shards own stripes by
//! key modulo their count (`crate::shard`), so with a count that divides
//! `LINES` each line is one engine shard's, and taking a stripe's lock no
//! longer takes the line from another core (side by side, every line held
//! locks of every engine shard: a profile of RAID5 4 KiB writes on two
//! engine shards put half of the release of a write's hold on the
//! unlock's `lock cmpxchg`).

use parking_lot::{Mutex, MutexGuard};
use std::ops::RangeInclusive;

const SLOTS: usize = 4096;
/// Locks on one 128-byte line (a parking_lot mutex is a byte), and lines.
const PER_LINE: usize = 128;
const LINES: usize = SLOTS / PER_LINE;
const _: () = assert!(LINES * PER_LINE == SLOTS);
const _: () = assert!(std::mem::size_of::<Line>() == 128);

pub struct StripeLocks {
    lines: Box<[Line]>,
}

/// One line of locks.
#[repr(align(128))]
struct Line([Mutex<()>; PER_LINE]);

pub struct Held<'a> {
    _guards: Vec<MutexGuard<'a, ()>>,
    /// The highest slot held (None: none).
    top: Option<usize>,
}

impl StripeLocks {
    pub fn new() -> StripeLocks {
        StripeLocks {
            lines: (0..LINES)
                .map(|_| Line(std::array::from_fn(|_| Mutex::new(()))))
                .collect(),
        }
    }

    /// Every slot, ascending: no writer is between its first read and its
    /// last write while this is held (a membership switch waits for them).
    pub fn lock_all(&self) -> Held<'_> {
        Held {
            _guards: (0..SLOTS).map(|i| self.at(i).lock()).collect(),
            top: SLOTS.checked_sub(1),
        }
    }

    /// Takes `key`'s lock if it is free, without a guard, for a writer
    /// that holds it across completions (`async_write`): true when taken,
    /// and then the caller must `unlock_raw(key)` exactly once.
    pub fn try_lock_raw(&self, key: u64) -> bool {
        match self.at(Self::index(key)).try_lock() {
            Some(g) => {
                std::mem::forget(g);
                true
            }
            None => false,
        }
    }

    /// Releases a lock taken by `try_lock_raw`, from any thread (a
    /// parking_lot mutex belongs to no thread).
    ///
    /// # Safety
    /// The caller took `key`'s lock with `try_lock_raw` and has not
    /// released it since.
    pub unsafe fn unlock_raw(&self, key: u64) {
        // SAFETY: the caller holds the lock, its guard forgotten.
        unsafe { self.at(Self::index(key)).force_unlock() }
    }

    /// `try_lock_raw` for every key of `keys`, all or none: true when all
    /// were taken, and then the caller must `unlock_range_raw(keys)` once.
    /// Nothing waits, so the order the keys are taken in cannot make a
    /// cycle with lockers that wait (`lock`). A run of keys shorter than
    /// the table lies on distinct slots; a longer one takes nothing.
    pub fn try_lock_range_raw(&self, keys: RangeInclusive<u64>) -> bool {
        if keys.end() - keys.start() >= SLOTS as u64 {
            return false;
        }
        for k in keys.clone() {
            if !self.try_lock_raw(k) {
                for taken in *keys.start()..k {
                    // SAFETY: taken by `try_lock_raw` just above, once.
                    unsafe { self.unlock_raw(taken) };
                }
                return false;
            }
        }
        true
    }

    /// Releases the locks `try_lock_range_raw(keys)` took.
    ///
    /// # Safety
    /// The caller took them with `try_lock_range_raw(keys)` (true) and has
    /// not released them since.
    pub unsafe fn unlock_range_raw(&self, keys: RangeInclusive<u64>) {
        for k in keys {
            // SAFETY: each held since `try_lock_range_raw`, as the caller
            // promises.
            unsafe { self.unlock_raw(k) };
        }
    }

    fn index(key: u64) -> usize {
        (key % SLOTS as u64) as usize
    }

    /// Index `i`'s lock: on line `i % LINES`, at `i / LINES` there (see
    /// the module doc).
    fn at(&self, i: usize) -> &Mutex<()> {
        &self.lines[i % LINES].0[i / LINES]
    }

    /// Locks every key's slot, ascending, each once.
    pub fn lock<I: IntoIterator<Item = u64>>(&self, keys: I) -> Held<'_> {
        Self::take(self.sorted(keys), |i| self.at(i).lock())
    }

    /// Locks every key's slot while `held` is kept, where every one of
    /// them comes after every slot `held` holds (the order that keeps
    /// lockers out of a cycle); None, taking nothing, where one does not
    /// (keys that wrap around the table): the caller then lets `held` go
    /// first. A rebuild holds one step's rows this way while it locks the
    /// next step's.
    pub fn lock_above<I: IntoIterator<Item = u64>>(
        &self,
        held: &Held<'_>,
        keys: I,
    ) -> Option<Held<'_>> {
        let idx = self.sorted(keys);
        match (held.top, idx.first()) {
            (Some(top), Some(&first)) if first <= top => None,
            _ => Some(Self::take(idx, |i| self.at(i).lock())),
        }
    }

    /// The locks of a job's next step: taken plainly where it holds
    /// nothing (`before` None), else beside what it holds (`lock_above`;
    /// None where refused).
    pub fn lock_next<I: IntoIterator<Item = u64>>(
        &self,
        before: Option<&Held<'_>>,
        keys: I,
    ) -> Option<Held<'_>> {
        match before {
            Some(held) => self.lock_above(held, keys),
            None => Some(self.lock(keys)),
        }
    }

    fn sorted<I: IntoIterator<Item = u64>>(&self, keys: I) -> Vec<usize> {
        let mut idx: Vec<usize> = keys.into_iter().map(Self::index).collect();
        idx.sort_unstable();
        idx.dedup();
        idx
    }

    fn take<'a>(idx: Vec<usize>, lock: impl Fn(usize) -> MutexGuard<'a, ()>) -> Held<'a> {
        Held {
            top: idx.last().copied(),
            _guards: idx.into_iter().map(lock).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_is_locked_while_held_only_above_what_is_held() {
        let l = StripeLocks::new();
        let held = l.lock(10..14);
        // Above: taken beside what is held.
        let next = l.lock_above(&held, 14..18).expect("rows above");
        assert!(l.lock_above(&next, 18..20).is_some());
        // Below, or around the table's end: refused, nothing taken.
        assert!(l.lock_above(&held, 2..4).is_none());
        let last = l.lock(SLOTS as u64 - 2..SLOTS as u64);
        assert!(l
            .lock_above(&last, SLOTS as u64..SLOTS as u64 + 2)
            .is_none());
        assert!(l.try_lock_raw(SLOTS as u64));
        // SAFETY: taken by the try_lock_raw just above.
        unsafe { l.unlock_raw(SLOTS as u64) };
    }

    #[test]
    fn a_run_of_keys_is_taken_whole_or_not_at_all() {
        let l = StripeLocks::new();
        assert!(l.try_lock_raw(12));
        // 12 is held: nothing of 10..=14 is taken.
        assert!(!l.try_lock_range_raw(10..=14));
        for k in [10, 11, 13, 14] {
            assert!(l.try_lock_raw(k), "key {k} was left locked");
            // SAFETY: taken by the try_lock_raw just above.
            unsafe { l.unlock_raw(k) };
        }
        // SAFETY: taken at the start.
        unsafe { l.unlock_raw(12) };
        assert!(l.try_lock_range_raw(10..=14));
        assert!(!l.try_lock_raw(14));
        // SAFETY: taken whole just above.
        unsafe { l.unlock_range_raw(10..=14) };
        assert!(l.try_lock_range_raw(10..=14));
        // SAFETY: taken whole just above.
        unsafe { l.unlock_range_raw(10..=14) };
        // A run across the table's end lies on distinct slots: taken.
        let end = SLOTS as u64 - 1;
        assert!(l.try_lock_range_raw(end..=end + 1));
        assert!(!l.try_lock_raw(0));
        // SAFETY: taken whole just above.
        unsafe { l.unlock_range_raw(end..=end + 1) };
        // As many keys as slots: each once, taken; one more would take a
        // slot twice: refused.
        assert!(l.try_lock_range_raw(0..=end));
        // SAFETY: taken whole just above.
        unsafe { l.unlock_range_raw(0..=end) };
        assert!(!l.try_lock_range_raw(0..=SLOTS as u64));
        assert!(l.try_lock_raw(0));
        // SAFETY: taken by the try_lock_raw just above.
        unsafe { l.unlock_raw(0) };
    }
}
