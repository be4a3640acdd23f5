//! Group commit: degraded writes that reach the journal while a group of
//! records is being written and flushed wait together and become the next
//! group, written by one of them (its leader) in one submission to every
//! present member and made durable by one flush per member. A lone writer
//! is a group of one: it writes and flushes its own record at once. Where
//! no member's flush waits (members in memory), each record is written
//! alone under the journal's lock instead: there a group's wake-ups would
//! cost more than its copies.
//!
//! Records take their places in the ring under the journal's lock, in
//! sequence order, and a group takes every record queued so far: so each
//! group is the ring's next stretch, and its records are all durable
//! before any of them is written in place. A group's writes reach a member
//! in any order, so a crash may leave one of its records durable past a
//! missing one: replay stops at the gap (none of the group's in-place
//! writes had begun), and recovery moves the next sequence past every
//! record it finds, so nothing written later chains on to it (`mod.rs`).

use super::JState;
use crate::array::{member_io, Array, SlotState};
use crate::buf::AlignedBuf;
use crate::member::{submit_uncounted, IoOp, MemberIo};
use parking_lot::{Condvar, MutexGuard};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

/// The records waiting for a group, and whether one is being written.
#[derive(Default)]
pub(super) struct Groups {
    /// Records with a place in the ring (its offset, the bytes), waiting
    /// for the next group, in ring order.
    queued: Vec<(u64, AlignedBuf)>,
    /// The group `queued` will be written as.
    forming: Arc<Group>,
    /// A leader is writing a group, outside the journal's lock.
    writing: bool,
}

/// One group, as its writers wait for it.
#[derive(Default)]
struct Group {
    /// Set once the group is written: whether the array is still within
    /// its redundancy.
    outcome: OnceLock<bool>,
    /// Its writers wait here (with the journal's lock), so that a group's
    /// end wakes its own writers, and one writer of the next group to lead
    /// it, not every writer waiting on the journal.
    wake: Condvar,
}

impl Array {
    /// Queues a record (`block`, at ring offset `at`) and waits until its
    /// group is written and flushed, leading the group itself when no other
    /// is being written. Called, and returns, with the journal's lock held;
    /// gives it up while it waits or writes. Returns whether the array was
    /// within its redundancy after the group's writes (false: the record's
    /// stripe must not be written in place), or the panic that ended the
    /// leading of its group (the group's other writers get false, so no
    /// one waits for ever on a group nobody will finish).
    pub(super) fn commit_record(
        &self,
        st: &mut MutexGuard<'_, JState>,
        at: u64,
        block: AlignedBuf,
    ) -> std::thread::Result<bool> {
        if !st.group.writing && st.group.queued.is_empty() && self.flushes_wait_for_nothing() {
            // Members in memory: a record is written and flushed in
            // microseconds, less than waking the writers of a group
            // costs; so each is written alone, under the lock (writers
            // arriving meanwhile wait on the lock itself), and no group
            // is in flight to keep ahead of it.
            return std::panic::catch_unwind(AssertUnwindSafe(|| {
                let ok = self.write_journal_block(&block, at).is_ok();
                self.activity.journal_commits.add(ok as u64);
                ok
            }));
        }
        st.group.queued.push((at, block));
        let mine = st.group.forming.clone();
        loop {
            if let Some(&ok) = mine.outcome.get() {
                return Ok(ok);
            }
            if st.group.writing {
                mine.wake.wait(st);
                continue;
            }
            // Lead: every record queued so far (this one among them: a
            // leader that took it would have set its outcome before
            // giving up `writing`).
            st.group.writing = true;
            let records = std::mem::take(&mut st.group.queued);
            let group = std::mem::take(&mut st.group.forming);
            let written = MutexGuard::unlocked(st, || {
                std::panic::catch_unwind(AssertUnwindSafe(|| self.write_group(&records)))
            });
            group
                .outcome
                .set(*written.as_ref().unwrap_or(&false))
                .expect("a group is written once");
            st.group.writing = false;
            group.wake.notify_all();
            // The next group's records wait for a leader: one of them.
            st.group.forming.wake.notify_one();
            written?;
        }
    }

    /// Whether no present member's flush waits for anything
    /// (`Member::flush_waits`): members in memory.
    fn flushes_wait_for_nothing(&self) -> bool {
        let handles = self.member_handles();
        (0..handles.len())
            .all(|i| self.slots[i].state() == SlotState::Failed || !handles[i].flush_waits())
    }

    /// Writes a group's records to every member not failed, then flushes
    /// them; a member that fails either is failed (as a lone journal write
    /// does). Returns whether the array is within its redundancy after.
    fn write_group(&self, records: &[(u64, AlignedBuf)]) -> bool {
        let handles = self.member_handles();
        let present = self.present_slots();
        let mut ios: Vec<MemberIo> = present
            .iter()
            .flat_map(|&m| {
                records.iter().map(move |(at, b)| MemberIo {
                    member: m,
                    offset: *at,
                    op: IoOp::Write(&b[..]),
                })
            })
            .collect();
        let results = submit_uncounted(&handles, &mut ios);
        let mut failed: Vec<(usize, std::io::Error)> = Vec::new();
        for (io, r) in ios.iter().zip(results) {
            if let Err(e) = r {
                if !failed.iter().any(|(m, _)| *m == io.member) {
                    failed.push((io.member, e));
                }
            }
        }
        let written: Vec<usize> = present
            .into_iter()
            .filter(|m| !failed.iter().any(|(f, _)| f == m))
            .collect();
        failed.extend(member_io::flush_each(&handles, &written, |m| m.flush()));
        let ok = self.fail_erred(&handles, failed, "journal write");
        self.activity.journal_commits.add(ok as u64);
        ok
    }
}
