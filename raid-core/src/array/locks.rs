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
        let mut idx: Vec<usize> = keys.into_iter().map(Self::index).collect();
        idx.sort_unstable();
        idx.dedup();
        Held {
            _guards: idx.into_iter().map(|i| self.shards[i].lock()).collect(),
        }
    }
}
