//! Parity writes in flight without a journal record, and the wait a member
//! failure makes for them.
//!
//! A RAID5/6 stripe write planned while every member of the stripe is
//! readable goes to the members in place, with no journal record: a crash
//! that tears it is repaired at the next start by the bitmap's resync, which
//! needs every member. Once a failure is durable the next start is degraded
//! and cannot repair it. So a failure, before it is written, waits for every
//! such write planned before it (`drain`), then flushes the survivors (see
//! `membership::persist_failure`); writes planned after it see the member
//! failed and go through the journal (or, where the failure leaves a
//! stripe no parity at all, write its data alone: `Array::data_alone`,
//! which has nothing to tear).
//!
//! Two counters and a phase bit, like a grace period: a writer counts itself
//! in the current phase; `drain` flips the phase and waits for the old one's
//! count to fall to zero. A writer never takes the metadata lock while it is
//! counted in (its member errors are handled after it leaves), so a failure
//! can wait while holding that lock.

use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Default)]
pub(super) struct Unjournaled {
    phase: AtomicUsize,
    count: [AtomicUsize; 2],
}

/// A writer counted in; leaving is dropping it.
pub(super) struct InFlight<'a> {
    gate: &'a Unjournaled,
    phase: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.gate.leave(self.phase);
    }
}

impl Unjournaled {
    /// Counts a writer in. Call it before checking whether the stripe's
    /// members are all readable: a failure marked before that check is
    /// seen by it, and one marked after waits for this writer.
    pub fn enter(&self) -> InFlight<'_> {
        InFlight {
            gate: self,
            phase: self.enter_raw(),
        }
    }

    /// `enter` for a writer that outlives a borrow (`async_write`): the
    /// phase returned goes back to `leave` exactly once.
    pub fn enter_raw(&self) -> usize {
        loop {
            let p = self.phase.load(Ordering::SeqCst);
            self.count[p].fetch_add(1, Ordering::SeqCst);
            if self.phase.load(Ordering::SeqCst) == p {
                return p;
            }
            // A drain flipped the phase meanwhile and may have seen this
            // phase empty: count in again in the new one.
            self.count[p].fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A writer counted in at `phase` leaves.
    pub fn leave(&self, phase: usize) {
        self.count[phase].fetch_sub(1, Ordering::SeqCst);
    }

    /// Waits for every writer counted in before this call. Callers are
    /// serialised (they hold the metadata lock).
    pub fn drain(&self) {
        let old = self.phase.fetch_xor(1, Ordering::SeqCst);
        let mut spins = 0u32;
        while self.count[old].load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }
}
