//! The clean mark in the metadata: set dirty before the first write since
//! the array was last clean, clean again at an orderly stop, so that a
//! crash is known at the next start (and the bitmap's regions resynced).

use super::*;

impl Array {
    /// Marks the array dirty (once) before its first write since it was
    /// last clean, so a crash is known at the next start.
    pub(super) fn mark_dirty(&self) {
        if self.dirty_marked.load(Ordering::Acquire) {
            return;
        }
        // Under the lock, and flagged only once durable: a second writer
        // must not pass while the dirty mark is still on its way to disk.
        let mut meta = self.meta.lock();
        if self.dirty_marked.load(Ordering::Acquire) {
            return;
        }
        meta.clean = false;
        self.persist(&mut meta);
        self.dirty_marked.store(true, Ordering::Release);
    }

    /// Flushes and marks the array clean: the orderly stop. Left dirty
    /// where `dirty_reason` says why.
    pub fn close(&self) -> Result<()> {
        self.stop_jobs();
        let _settles = self.hold_settles();
        // Every bit cleared that can be: no write follows to use them. (Not
        // `flush`: no client asked for this one, and its metrics count
        // clients' flushes.)
        self.flush_checked(true)?;
        let why = self.dirty_reason();
        let mut meta = self.meta.lock();
        meta.clean = why.is_none();
        self.dirty_marked.store(false, Ordering::Release);
        self.persist(&mut meta);
        self.closed.store(true, Ordering::Release);
        drop(meta);
        match why {
            None => tracing::info!(array = %self.name, "array stopped clean"),
            Some(why) => {
                tracing::warn!(array = %self.name, "array stopped, left dirty ({why}): the next start resyncs the regions the bitmap kept")
            }
        }
        Ok(())
    }

    /// Why `close` left the array marked dirty, if it did: None when the
    /// metadata says clean.
    pub fn left_dirty_because(&self) -> Option<String> {
        if self.meta.lock().clean {
            return None;
        }
        Some(
            self.dirty_reason()
                .unwrap_or_else(|| "it was not stopped clean".into()),
        )
    }

    /// Why the array cannot be marked clean now, if it cannot: after a
    /// write failed on a full filesystem a stripe may be torn (the next
    /// start resyncs the regions the bitmap kept); a resync an unclean,
    /// degraded start had to put off is put off again until a rebuild.
    fn dirty_reason(&self) -> Option<String> {
        if let Some(m) = self.out_of_space.lock().as_ref() {
            Some(format!(
                "a write failed on the full filesystem of {m}, so a stripe there may be torn"
            ))
        } else if self.resync.pending() {
            Some(match self.resync_runnable() {
                true => "the resync after an unclean stop had not run to its end: the next start resyncs again".into(),
                false => "the regions an unclean stop (or a forced start) left could not be resynced with a member missing (it started degraded, or a member failed during the resync): the rebuild does it, or the next start once the array is whole".into(),
            })
        } else {
            None
        }
    }
}
