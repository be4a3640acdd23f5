//! Which kind of record a stripe may take (`Kind`), and the flush a
//! record of every column waits for after a parity-only one: the rules
//! that let the two kinds follow each other in one stripe's replay.

use super::*;

impl Array {
    /// Whether stripe `s` may take a `Kind::Parity` record: it has no
    /// `Kind::Columns` record unsettled. Replay writes such a record's
    /// columns as they are, which would undo a later write's data
    /// columns that a parity record (which holds none of them) would
    /// not write back. Callers hold the stripe's lock.
    pub(in crate::array) fn journal_parity_allowed(&self, s: u64) -> bool {
        self.journal.as_ref().is_some_and(|j| {
            !j.any_unsettled.load(Ordering::Acquire)
                || j.state
                    .lock()
                    .unsettled
                    .get(&s)
                    .is_none_or(|u| u.columns.is_none())
        })
    }

    /// Whether stripe `s` has a `Kind::Parity` record whose in-place
    /// writes may not be durable yet (`journal_parity_barrier`). Callers
    /// hold the stripe's lock (such records are added only under it).
    /// Waits for nothing but the map's own short lock: a shard's question.
    pub(in crate::array) fn journal_parity_unflushed(&self, s: u64) -> bool {
        self.journal.as_ref().is_some_and(|j| {
            j.any_unsettled.load(Ordering::Acquire) && j.parity_unflushed.lock().contains_key(&s)
        })
    }

    /// Before a `Kind::Columns` record of stripe `s`, where `s` has a
    /// `Kind::Parity` record whose in-place writes may still be in the
    /// drives' caches: every member present flushed first. The columns
    /// record's parity was computed from those writes; replay puts the
    /// parity record in place from the data on the members, then writes
    /// the columns record's parity as it is, so the data it was computed
    /// from must be what a cut leaves there. (A parity record replayed
    /// over a columns record needs nothing: it reads the data as it lies.)
    /// Callers hold the stripe's lock, and the parity record's in-place
    /// writes ended under it, before this flush.
    pub(in crate::array) fn journal_parity_barrier(&self, s: u64) -> Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        if !self.journal_parity_unflushed(s) {
            return Ok(());
        }
        self.flush_present(false)?;
        j.parity_unflushed.lock().remove(&s);
        self.activity.journal_parity_barriers.add(1);
        Ok(())
    }
}
