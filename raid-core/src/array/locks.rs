//! Stripe locks: writers to one stripe (or mirrored chunk) never interleave,
//! while writers to different stripes run in parallel.
//!
//! A fixed table of mutexes indexed by key modulo its size. Whoever needs
//! several keys takes their shards in ascending shard order, so two lockers
//! can never wait on each other in a cycle.

use parking_lot::{Mutex, MutexGuard};

const SHARDS: usize = 4096;

pub struct StripeLocks {
    shards: Box<[Mutex<()>]>,
}

pub struct Held<'a> {
    _guards: Vec<MutexGuard<'a, ()>>,
    /// The highest shard held (None: none).
    top: Option<usize>,
}

impl StripeLocks {
    pub fn new() -> StripeLocks {
        StripeLocks {
            shards: (0..SHARDS).map(|_| Mutex::new(())).collect(),
        }
    }

    /// Every shard, ascending: no writer is between its first read and its
    /// last write while this is held (a membership switch waits for them).
    pub fn lock_all(&self) -> Held<'_> {
        Held {
            _guards: self.shards.iter().map(|m| m.lock()).collect(),
            top: SHARDS.checked_sub(1),
        }
    }

    /// Takes `key`'s lock if it is free, without a guard, for a writer
    /// that holds it across completions (`async_write`): true when taken,
    /// and then the caller must `unlock_raw(key)` exactly once.
    pub fn try_lock_raw(&self, key: u64) -> bool {
        match self.shards[Self::index(key)].try_lock() {
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
        unsafe { self.shards[Self::index(key)].force_unlock() }
    }

    fn index(key: u64) -> usize {
        (key % SHARDS as u64) as usize
    }

    /// Locks every key's shard, ascending, each once.
    pub fn lock<I: IntoIterator<Item = u64>>(&self, keys: I) -> Held<'_> {
        Self::take(self.sorted(keys), |i| self.shards[i].lock())
    }

    /// Locks every key's shard while `held` is kept, where every one of
    /// them comes after every shard `held` holds (the order that keeps
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
            _ => Some(Self::take(idx, |i| self.shards[i].lock())),
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
        let last = l.lock(SHARDS as u64 - 2..SHARDS as u64);
        assert!(l
            .lock_above(&last, SHARDS as u64..SHARDS as u64 + 2)
            .is_none());
        assert!(l.try_lock_raw(SHARDS as u64));
        // SAFETY: taken by the try_lock_raw just above.
        unsafe { l.unlock_raw(SHARDS as u64) };
    }
}
