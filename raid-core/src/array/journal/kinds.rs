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
        if !self.journal_parity_unflushed(s) {
            return Ok(());
        }
        let written = self.journal_parity_written();
        self.flush_present(false)?;
        // Takes `s` out too: its record's in-place writes ended under the
        // stripe's lock, which the caller holds.
        self.journal_parity_flushed(&written);
        self.activity.journal_parity_barriers.add(1);
        Ok(())
    }

    /// The stripes whose last parity-only record's in-place writes have
    /// ended, with that record's sequence: what a flush of every member
    /// begun after this makes durable (`journal_parity_flushed`).
    pub(in crate::array) fn journal_parity_written(&self) -> Vec<(u64, u64)> {
        let Some(j) = &self.journal else {
            return Vec::new();
        };
        if !j.any_unsettled.load(Ordering::Acquire) {
            return Vec::new();
        }
        let st = j.state.lock();
        let unflushed = j.parity_unflushed.lock();
        unflushed
            .iter()
            .filter(|&(_, &seq)| st.is_done(seq))
            .map(|(&s, &seq)| (s, seq))
            .collect()
    }

    /// After a flush of every member that began after `written` was
    /// taken (`journal_parity_written`): those stripes' parity-only
    /// records are durable in place, unless a newer one has come since.
    /// A client's flush calls this, so that a stripe's writes go back to
    /// the shards, by read-modify-write, at the next flush rather than
    /// the next checkpoint.
    pub(in crate::array) fn journal_parity_flushed(&self, written: &[(u64, u64)]) {
        let Some(j) = &self.journal else { return };
        if written.is_empty() {
            return;
        }
        let mut unflushed = j.parity_unflushed.lock();
        for (s, seq) in written {
            if unflushed.get(s) == Some(seq) {
                unflushed.remove(s);
            }
        }
    }
}
