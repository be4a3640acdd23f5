//! The journal's ring: where records go, and how their space comes back
//! without stopping the writers.
//!
//! Records past the header's sequence (`live`) lie one after another from
//! the header's place (`tail_at`) on; a record that does not fit before
//! the ring's end goes to its start instead (a reader that does not find
//! the next record where the last one ended looks there). A record's space
//! is reused only once the header has moved past it, and the header moves
//! past a run of records at the ring's front only once their in-place
//! writes are done and the members flushed (`checkpoint`): every record a
//! crash could leave half in place is still in the chain after it. Nothing
//! waits for the records still in flight behind that run, so degraded
//! writes go on while the ring is reclaimed; only a settle (a stop, a
//! rebuild, a flush with every slot in sync) waits for every record, and
//! empties the ring.

use super::{encode_head, JState, Journal, Kind, JOURNAL_OFFSET, RECORDS};
use crate::array::{Array, Result};
use parking_lot::MutexGuard;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

/// A stripe's records past the header's tail (`JState::unsettled`).
#[derive(Default)]
pub(super) struct Unsettled {
    /// The last one's sequence.
    pub(super) last: u64,
    /// The last `Kind::Columns` one's, if any is past the tail: such a
    /// stripe takes no `Kind::Parity` record (`journal_parity_allowed`).
    pub(super) columns: Option<u64>,
}

impl Unsettled {
    /// Forgets what a header now at `tail` has passed; whether any of the
    /// stripe's records is still past it.
    pub(super) fn keep_past(&mut self, tail: u64) -> bool {
        self.columns = self.columns.filter(|&c| c > tail);
        self.last > tail
    }
}

/// A record past the header's sequence.
pub(super) struct Live {
    seq: u64,
    /// Where it lies, and its length.
    at: u64,
    len: u64,
    /// Its in-place write is done (or it was given up: none follows).
    done: bool,
    /// Its writer does not wait (a shard's: `journal_submit`).
    queued: bool,
}

impl JState {
    /// Where a record of `size` bytes can go now, if anywhere: after the
    /// last record, or at the ring's start when it does not fit before its
    /// end, never over a record the header has not moved past.
    pub(super) fn room(&self, size: u64) -> Option<u64> {
        let fits_at_head = self.head + size <= self.end;
        let Some(front) = self.live.front().map(|r| r.at) else {
            return Some(if fits_at_head { self.head } else { RECORDS });
        };
        if self.head > front {
            // The records run from `front` to `head`: room after them, or
            // before them from the start.
            if fits_at_head {
                Some(self.head)
            } else {
                (RECORDS + size <= front).then_some(RECORDS)
            }
        } else {
            // Wrapped: room only between the last record and the first.
            (self.head + size <= front).then_some(self.head)
        }
    }

    /// Takes the ring's place `at` (from `room`) and the next sequence for
    /// a record of `len` bytes of stripe `s` (`queued`: its writer does not
    /// wait): its sequence.
    pub(super) fn place(&mut self, at: u64, len: u64, (s, kind): (u64, Kind), queued: bool) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.head = at + len;
        self.live.push_back(Live {
            seq,
            at,
            len,
            done: false,
            queued,
        });
        self.queued_live += queued as usize;
        self.live_bytes += len;
        let u = self.unsettled.entry(s).or_default();
        u.last = seq;
        if kind == Kind::Columns {
            u.columns = Some(seq);
        }
        self.in_flight += 1;
        seq
    }

    /// Whether record `seq`'s in-place write is done (or none follows),
    /// or the header is past it.
    pub(super) fn is_done(&self, seq: u64) -> bool {
        let Some(first) = self.live.front().map(|r| r.seq) else {
            return seq < self.next_seq;
        };
        match seq.checked_sub(first) {
            None => true,
            Some(i) => self.live.get(i as usize).is_none_or(|r| r.done),
        }
    }

    /// Record `seq`'s in-place write is done (or none follows). Returns
    /// whether every record before it is done too: the front may be
    /// reclaimed further now.
    pub(super) fn record_done(&mut self, seq: u64) -> bool {
        self.in_flight -= 1;
        let Some(first) = self.live.front().map(|r| r.seq) else {
            return false;
        };
        let Some(i) = seq.checked_sub(first) else {
            // The header is past it already.
            return true;
        };
        let i = i as usize;
        if let Some(r) = self.live.get_mut(i) {
            r.done = true;
            if std::mem::take(&mut r.queued) {
                self.queued_live -= 1;
            }
        }
        // The front grows by the run of records done from its end on.
        let (mut n, mut bytes) = self.done_front;
        while let Some(r) = self.live.get(n).filter(|r| r.done) {
            n += 1;
            bytes += r.len;
        }
        self.done_front = (n, bytes);
        i < n || n == self.live.len()
    }

    /// Takes the first `n` records off the ring's front (done, and the
    /// header moved past them): returns their bytes.
    fn free_front(&mut self, n: usize) -> u64 {
        let (done, done_bytes) = self.done_front;
        assert!(n <= done, "only records done are freed");
        let freed: u64 = self.live.drain(..n).map(|r| r.len).sum();
        self.live_bytes -= freed;
        self.done_front = (done - n, done_bytes - freed);
        freed
    }

    /// Whether a checkpoint would free enough to pay for its flush of
    /// every member and its header's durable write there: a quarter of the
    /// ring, or every record in it (none left in flight to wait for). One
    /// per record done would cost more than the records.
    pub(super) fn worth_checkpoint(&self) -> bool {
        let (n, bytes) = self.done_front;
        n > 0 && (bytes >= (self.end - RECORDS) / 4 || n == self.live.len())
    }

    /// Whether a checkpoint is worth running ahead of need: the ring is
    /// half full (or a shard waits for room), and its front can be
    /// reclaimed.
    pub(super) fn wants_checkpoint(&self) -> bool {
        !self.checkpointing
            && !self.settling
            && (self.live_bytes > (self.end - RECORDS) / 2 || !self.room_waiters.is_empty())
            && self.worth_checkpoint()
    }

    /// An empty ring after the header that says `tail_seq`, the next
    /// record at the area's start.
    pub(super) fn emptied(&mut self, tail_seq: u64) {
        self.tail_seq = tail_seq;
        self.tail_at = RECORDS;
        self.head = RECORDS;
        self.live.clear();
        self.live_bytes = 0;
        self.done_front = (0, 0);
        self.queued_live = 0;
        self.unsettled.clear();
    }
}

impl Array {
    /// Moves the header past the records at the ring's front whose
    /// in-place writes are done, and frees their space: the members
    /// flushed (those writes durable), then the header written. Called with
    /// the journal's lock, given up for the I/O; returns whether it freed
    /// any. Waits for nothing in flight; one runs at a time, none during
    /// a settle, and none that would free too little (`worth_checkpoint`).
    pub(super) fn checkpoint(&self, j: &Journal, st: &mut MutexGuard<'_, JState>) -> Result<bool> {
        if !st.worth_checkpoint() || st.checkpointing || st.settling {
            return Ok(false);
        }
        let (n, _) = st.done_front;
        let tail = st.live[n - 1].seq;
        // Where the record after it lies, or the next will: a reader that
        // does not find it there looks at the area's start (`room`).
        let tail_at = st.live.get(n).map_or(st.head, |r| r.at);
        st.checkpointing = true;
        let written = MutexGuard::unlocked(st, || {
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.flush_members().and_then(|()| {
                    let head = encode_head(tail, tail_at, &self.uuid);
                    self.write_journal_block(&head, JOURNAL_OFFSET)
                })
            }))
        });
        // Ended, even by a panic: a checkpoint that never ends would keep
        // every settle (a flush, a rebuild) waiting.
        st.checkpointing = false;
        j.changed.notify_all();
        let written = written.unwrap_or_else(|p| std::panic::resume_unwind(p));
        if written.is_err() {
            // Those waiting for room try again (and meet the failure).
            wake_room_waiters(st);
        }
        written?;
        // Only now, with the header durable, is their space free.
        st.tail_seq = tail;
        st.tail_at = tail_at;
        st.free_front(n);
        st.unsettled.retain(|_, u| u.keep_past(tail));
        j.parity_unflushed.lock().retain(|_, last| *last > tail);
        j.any_unsettled
            .store(!st.unsettled.is_empty(), Ordering::Release);
        self.activity.journal_checkpoints.add(1);
        wake_room_waiters(st);
        Ok(true)
    }
}

/// Calls the writers waiting for room (`NotQueued::Later`), with the
/// journal's lock given up meanwhile.
pub(super) fn wake_room_waiters(st: &mut MutexGuard<'_, JState>) {
    let waiters = std::mem::take(&mut st.room_waiters);
    if !waiters.is_empty() {
        MutexGuard::unlocked(st, || waiters.into_iter().for_each(|w| w()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// What `done_front` keeps, walked out over the ring instead.
    fn walked(st: &JState) -> (usize, u64) {
        st.live
            .iter()
            .take_while(|r| r.done)
            .fold((0, 0), |(n, b), r| (n + 1, b + r.len))
    }

    /// Records placed, ended in any order (each once), and freed from the
    /// front as checkpoints free it: the front kept as
    /// records end is the one a walk finds, and `record_done` says the
    /// front may move exactly where no record before it is still out.
    #[test]
    fn the_front_kept_as_records_end_is_the_walked_one() {
        for seed in 0..200 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut st = JState::fresh(7, 1 << 30);
            let mut out: Vec<u64> = Vec::new();
            for _ in 0..300 {
                match rng.gen_range(0..10) {
                    0..4 => {
                        let len = rng.gen_range(1..4) * 4096;
                        let at = st.head;
                        let s = rng.gen_range(0..16);
                        out.push(st.place(at, len, (s, Kind::Columns), rng.gen()));
                    }
                    4..8 if !out.is_empty() => {
                        let seq = out.swap_remove(rng.gen_range(0..out.len()));
                        let first_out = st.live.iter().find(|r| !r.done).map(|r| r.seq);
                        let moved = st.record_done(seq);
                        assert_eq!(moved, first_out.is_none_or(|f| f >= seq), "seed {seed}");
                    }
                    _ => {
                        let (n, _) = st.done_front;
                        if n > 0 {
                            let n = rng.gen_range(1..=n);
                            let bytes: u64 = st.live.iter().take(n).map(|r| r.len).sum();
                            assert_eq!(st.free_front(n), bytes);
                        }
                    }
                }
                assert_eq!(st.done_front, walked(&st), "seed {seed}");
                assert_eq!(st.live_bytes, st.live.iter().map(|r| r.len).sum::<u64>());
            }
        }
    }
}
