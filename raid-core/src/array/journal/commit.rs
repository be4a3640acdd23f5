//! Group commit: degraded writes that reach the journal while groups of
//! records are being written and flushed (as many as may be at once) wait
//! together and become the next group, written by one of them (its
//! leader) in one submission (each run of records to the members that keep
//! it, `write_group`) and made durable: with FUA on members that take it,
//! by one flush of each other member written (`Array::write_durably`). A
//! lone writer is a group of one: it writes its own record at once. Where
//! no member's flush waits (members in memory), each record is written
//! alone under the journal's lock instead: there a group's wake-ups would
//! cost more than its copies.
//!
//! Records take their places in the ring under the journal's lock, in
//! sequence order, and a group takes every record queued so far: so each
//! group is the ring's next stretch (wrapping at its end, `ring.rs`), and
//! its records are all durable before any of them is written in place. A
//! group's writes reach its members in any order, so a crash may leave
//! one of its records durable past a missing one: replay stops at the gap
//! (none of the group's in-place writes had begun), and recovery moves the
//! next sequence past every record it finds, so nothing written later
//! chains on to it (`mod.rs`). A group given up (its leader panicked, or
//! the array went past its redundancy) takes every record queued behind
//! it down with it, since replay would stop at the gap it leaves; the
//! journal then settles before the next record takes a place
//! (`JState::settle_first`), so no record chains on after them.
//!
//! Up to `GROUPS_IN_FLIGHT` groups are written at once: once its records
//! fill a run (`Groups::room`), the next group's writes go out while the
//! one before it is still being written and flushed (one group at a time,
//! large degraded writes waited a whole group's round trip on drives busy
//! with the in-place writes before it); a group of less waits for the one
//! before it to end, and gathers more.
//! A group still ends in ring order: its outcome is set only once the
//! group before it has ended, and it is durable only if that one is, so
//! no record's in-place write begins while a record before it in the ring
//! may be missing after a crash (replay would stop at that gap, leaving
//! the later stripe torn with no record to repair it).
//!
//! A writer that must not wait (a shard's, `journal_submit`) queues its
//! record with a callback instead. Its groups are led by whichever writer
//! waiting for one gets there first, or by the journal's committers:
//! threads of their own, one woken whenever such a record is queued and
//! another group may be written, so that a group of shards' records never
//! waits for a thread that will not come.

use super::{JState, Journal};
use crate::array::{Array, SlotState};
use crate::buf::AlignedBuf;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// Called once, when the group of a record queued by `journal_submit`
/// ends, with whether the record is durable (then its writer writes it in
/// place and calls `journal_write_done`) or not (nothing may be written
/// in place: the record was given up). Called with no lock held, on the
/// thread that led the group: it should hand the outcome on and return.
pub(crate) type JournalDone = Box<dyn FnOnce(bool) + Send>;

/// The records waiting for a group, and the groups being written.
#[derive(Default)]
pub(super) struct Groups {
    /// Records with a place in the ring (its offset, the bytes), waiting
    /// for the next group, in ring order.
    queued: Vec<(u64, AlignedBuf)>,
    /// Their bytes.
    queued_bytes: u64,
    /// The callbacks of the queued records whose writers do not wait
    /// (`journal_submit`), with each record's sequence and length.
    calls: Vec<(JournalDone, u64, u64)>,
    /// The group `queued` will be written as.
    forming: Arc<Group>,
    /// Groups taken by a leader whose outcome is not set yet (being
    /// written outside the journal's lock, or written and waiting for the
    /// group before them to end): at most `GROUPS_IN_FLIGHT`.
    writing: usize,
    /// The last group taken by a leader: the next one ends after it.
    last_taken: Option<Arc<Group>>,
}

/// How many groups may be written at once (`Groups::writing`): two keep
/// the drives busy with the next group's records while one is flushed,
/// where the next one's records fill a run (`Groups::room`).
const GROUPS_IN_FLIGHT: usize = 2;

impl Groups {
    /// Whether the group forming may be taken now: where none is being
    /// written, or where one is and the records queued fill a run (`run`:
    /// the most bytes one write of a group carries). A group costs a flush
    /// of each member it writes: one of a few small records, written
    /// beside the group before it, costs its flushes for little (ext4's
    /// 128 KiB writes each followed by fsync, on members sharing one disk,
    /// ran 0.81-0.90x with a second group of any size), where waiting for
    /// the group before it to end lets it gather more.
    fn room(&self, run: u64) -> bool {
        self.writing == 0 || (self.writing < GROUPS_IN_FLIGHT && self.queued_bytes >= run)
    }

    /// Queues a record at ring offset `at`.
    fn queue(&mut self, at: u64, block: AlignedBuf) {
        self.queued_bytes += block.len() as u64;
        self.queued.push((at, block));
    }

    /// Takes every record queued.
    fn take_queued(&mut self) -> Vec<(u64, AlignedBuf)> {
        self.queued_bytes = 0;
        std::mem::take(&mut self.queued)
    }
}

impl Journal {
    /// The most bytes of records one write of a group carries.
    fn run(&self) -> u64 {
        self.run_bytes.load(Ordering::Acquire)
    }
}

/// One group, as its writers wait for it.
#[derive(Default)]
struct Group {
    /// Set once the group is written: whether the array is still within
    /// its redundancy.
    outcome: OnceLock<bool>,
    /// Its writers wait here (with the journal's lock), so that a group's
    /// end wakes its own writers, one writer of the forming group to lead
    /// it, and the leader of the group taken after it, not every writer
    /// waiting on the journal.
    wake: Condvar,
}

/// The journal's committer threads (`GROUPS_IN_FLIGHT` of them, so that
/// one leads a group while another's is written): started by the first
/// record queued with a callback, woken through `due`.
#[derive(Default)]
pub(super) struct Committer {
    started: AtomicBool,
    /// Run by its caller, not a thread (`Array::step_journal_commits`).
    stepped: AtomicBool,
    /// Held while the thread is being started.
    starting: Mutex<()>,
    /// A group of records with callbacks may be waiting for a leader.
    due: Mutex<bool>,
    wake: Condvar,
}

impl Journal {
    /// Whether the committer is run by its caller (`step_journal_commits`).
    pub(super) fn committer_stepped(&self) -> bool {
        self.committer.stepped.load(Ordering::Acquire)
    }
}

impl Committer {
    /// Wakes a committer thread (started by now: one is asked for only
    /// once a record with a callback was queued).
    fn call(&self) {
        *self.due.lock() = true;
        self.wake.notify_one();
    }

    /// The ring's front may be reclaimed (`ring.rs`): the committer does
    /// it, if there is one; without one, the writer that finds the ring
    /// full does.
    pub(super) fn checkpoint_due(&self) {
        if self.started.load(Ordering::Acquire) {
            self.call();
        }
    }
}

/// A committer thread: leads groups while records with callbacks wait and
/// another group may be written, then reclaims the ring's front if it
/// is half full (`Array::checkpoint`). It holds the array only while it
/// works, and ends once the array is gone.
fn committer(array: Weak<Array>, c: Arc<Committer>) {
    loop {
        {
            let mut due = c.due.lock();
            while !*due {
                let waited = c.wake.wait_for(&mut due, Duration::from_secs(1));
                if waited.timed_out() && array.strong_count() == 0 {
                    return;
                }
            }
            *due = false;
        }
        let Some(a) = array.upgrade() else { return };
        a.committer_work();
    }
}

impl Array {
    /// What the committer does each time it is called.
    fn committer_work(&self) {
        // A panic here would leave the shards' records with no leader: it
        // is logged, and the committer goes on.
        let worked = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let j = self.journal.as_ref().expect("started by the journal");
            let mut st = j.state.lock();
            while st.group.room(j.run()) && !st.group.calls.is_empty() {
                if self.lead_group(j, &mut st).is_err() {
                    tracing::error!(array = %self.name, "degraded-write journal: writing a group panicked; its records were given up");
                }
            }
            if st.wants_checkpoint() {
                if let Err(e) = self.checkpoint(j, &mut st) {
                    tracing::error!(array = %self.name, "degraded-write journal: freeing its ring failed: {e}");
                }
            }
        }));
        if worked.is_err() {
            tracing::error!(array = %self.name, "degraded-write journal: its committer panicked; it goes on");
        }
    }

    /// For the deterministic simulation: the journal's committer is not a
    /// thread but `commit_journal_step`, run by the caller when it
    /// chooses, and a shard's degraded writes queue their records for
    /// groups even where no member's flush waits (where each record would
    /// otherwise be written alone, on the blocking path), so that groups
    /// of shards' records, their leaders and a cut anywhere among their
    /// writes are played in an order the seed picks. Call before any write.
    #[doc(hidden)]
    pub fn step_journal_commits(&self) {
        if let Some(j) = &self.journal {
            assert!(
                !j.committer.started.load(Ordering::Acquire),
                "step_journal_commits must be called before the array's first degraded write: its journal's committer has already started"
            );
            j.committer.stepped.store(true, Ordering::Release);
        }
    }

    /// Whether the stepped committer (`step_journal_commits`) was called
    /// for: records wait for a leader, or the ring's front for freeing.
    #[doc(hidden)]
    pub fn journal_commit_due(&self) -> bool {
        self.journal
            .as_ref()
            .is_some_and(|j| *j.committer.due.lock())
    }

    /// Does the stepped committer's work, if it was called for; returns
    /// whether it was.
    #[doc(hidden)]
    pub fn commit_journal_step(&self) -> bool {
        let Some(j) = &self.journal else { return false };
        if !std::mem::take(&mut *j.committer.due.lock()) {
            return false;
        }
        self.committer_work();
        true
    }

    /// Records whose writes are not all in place yet, or that wait for a
    /// group: a flush (which settles the journal) waits for them, so a
    /// caller that alone moves them (the simulation) must not flush now.
    #[doc(hidden)]
    pub fn journal_records_in_flight(&self) -> usize {
        self.journal
            .as_ref()
            .map_or(0, |j| j.state.lock().in_flight)
    }
}

impl Array {
    /// Queues a record (`block`, at ring offset `at`) whose writer does
    /// not wait: `done` is called when its group ends. Called with the
    /// journal's lock held. A committer is woken where another group may
    /// be written now, so that it is written beside one being flushed.
    pub(super) fn queue_record(
        self: &Arc<Self>,
        j: &Journal,
        st: &mut MutexGuard<'_, JState>,
        at: u64,
        seq: u64,
        block: AlignedBuf,
        done: JournalDone,
    ) {
        let len = block.len() as u64;
        st.group.queue(at, block);
        st.group.calls.push((done, seq, len));
        if st.group.room(j.run()) {
            j.committer.call();
        }
    }

    /// Starts the journal's committer threads, if not yet: false if none
    /// could be (the caller queues nothing then).
    pub(super) fn start_committer(self: &Arc<Self>, j: &Journal) -> bool {
        if j.committer.started.load(Ordering::Acquire) {
            return true;
        }
        let _one = j.committer.starting.lock();
        if j.committer.started.load(Ordering::Acquire) {
            return true;
        }
        if j.committer_stepped() {
            // Its caller leads the groups (`commit_journal_step`).
            j.committer.started.store(true, Ordering::Release);
            return true;
        }
        // One is enough to lead every group (one at a time); the others
        // let groups overlap.
        let mut spawned = 0;
        for _ in 0..GROUPS_IN_FLIGHT {
            let (a, c) = (Arc::downgrade(self), j.committer.clone());
            match std::thread::Builder::new()
                .name("journal-commit".into())
                .spawn(move || committer(a, c))
            {
                Ok(_) => spawned += 1,
                Err(e) => {
                    tracing::warn!(array = %self.name, "degraded-write journal: a committer thread could not be started ({e})")
                }
            }
        }
        if spawned == 0 {
            tracing::warn!(array = %self.name, "degraded-write journal: no committer thread; degraded writes take the blocking path");
        }
        j.committer.started.store(spawned > 0, Ordering::Release);
        spawned > 0
    }

    /// Queues a record (`block`, at ring offset `at`) and waits until its
    /// group is written and flushed, leading the group itself when another
    /// group may be written. Called, and returns, with the journal's lock
    /// held; gives it up while it waits or writes. Returns whether the
    /// array was within its redundancy after the group's writes and the
    /// group before it is durable (false: the record's stripe must not be
    /// written in place), or the panic that ended the leading of its group
    /// (the group's other writers get false, so no one waits for ever on a
    /// group nobody will finish).
    pub(super) fn commit_record(
        &self,
        st: &mut MutexGuard<'_, JState>,
        at: u64,
        block: AlignedBuf,
    ) -> std::thread::Result<bool> {
        if st.group.writing == 0
            && st.group.queued.is_empty()
            && st.queued_live == 0
            && self.flushes_wait_for_nothing()
        {
            // Members in memory: a record is written and flushed in
            // microseconds, less than waking the writers of a group
            // costs; so each is written alone, under the lock (writers
            // arriving meanwhile wait on the lock itself), and no group
            // is in flight to keep ahead of it.
            return std::panic::catch_unwind(AssertUnwindSafe(|| {
                let ok = self.write_group(&[(at, block)]);
                self.activity.journal_commits.add(ok as u64);
                ok
            }));
        }
        st.group.queue(at, block);
        let j = self.journal.as_ref().expect("journaled");
        let mine = st.group.forming.clone();
        loop {
            if let Some(&ok) = mine.outcome.get() {
                return Ok(ok);
            }
            // Taken by a leader (its outcome comes), or no room for
            // another group: wait.
            if !Arc::ptr_eq(&mine, &st.group.forming) || !st.group.room(j.run()) {
                mine.wake.wait(st);
                continue;
            }
            // Lead: every record queued so far, this one among them.
            self.lead_group(j, st)?;
        }
    }

    /// Writes every record queued so far as one group, outside the lock,
    /// waits for the group taken before it to end, then tells their
    /// writers how it went: those waiting through their group, those with
    /// callbacks by calling them (a record given up is accounted for here
    /// first, as `journal_record` does for its own). The group is durable
    /// (its outcome, `Group::outcome`) only if its writes left the array
    /// within its redundancy and the group before it is durable. Returns
    /// the panic that ended its writes, if one did.
    fn lead_group(&self, j: &Journal, st: &mut MutexGuard<'_, JState>) -> std::thread::Result<()> {
        debug_assert!(st.group.room(j.run()) && !st.group.queued.is_empty());
        st.group.writing += 1;
        let records = st.group.take_queued();
        let group = std::mem::take(&mut st.group.forming);
        let before = st.group.last_taken.replace(group.clone());
        let mut calls = std::mem::take(&mut st.group.calls);
        let written = MutexGuard::unlocked(st, || {
            std::panic::catch_unwind(AssertUnwindSafe(|| self.write_group(&records)))
        });
        // Ends in ring order: after the group before it, and durable only
        // if that one is.
        let before_ok = match before {
            Some(b) => loop {
                match b.outcome.get() {
                    Some(&ok) => break ok,
                    None => b.wake.wait(st),
                }
            },
            None => true,
        };
        let ok = *written.as_ref().unwrap_or(&false) && before_ok;
        self.activity.journal_commits.add(ok as u64);
        group.outcome.set(ok).expect("a group is written once");
        st.group.writing -= 1;
        if st
            .group
            .last_taken
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(l, &group))
        {
            st.group.last_taken = None;
        }
        group.wake.notify_all();
        if !ok {
            // Given up, and with it every record queued behind it: none
            // is durable or in place yet, and one written in place now
            // could not be replayed after a crash (replay stops at the
            // first record missing, one of these).
            st.group.take_queued();
            let next = std::mem::take(&mut st.group.forming);
            next.outcome.set(false).expect("not yet written");
            next.wake.notify_all();
            calls.append(&mut st.group.calls);
        }
        // The next group's records wait for a leader: one of them, or
        // the committer for those whose writers do not wait.
        st.group.forming.wake.notify_one();
        if !st.group.calls.is_empty() {
            j.committer.call();
        }
        if !calls.is_empty() {
            for &(_, seq, len) in &calls {
                match ok {
                    true => self.count_record(len),
                    false => record_given_up(j, st, seq),
                }
            }
            MutexGuard::unlocked(st, || {
                for (done, ..) in calls {
                    // Each told, even if one before it panics.
                    let told = std::panic::catch_unwind(AssertUnwindSafe(|| done(ok)));
                    if told.is_err() {
                        tracing::error!(array = %self.name, "degraded-write journal: a record's callback panicked");
                    }
                }
            });
        }
        written.map(|_| ())
    }

    /// Whether no present member's flush waits for anything
    /// (`Member::flush_waits`): members in memory.
    pub(super) fn flushes_wait_for_nothing(&self) -> bool {
        let handles = self.member_handles();
        (0..handles.len())
            .all(|i| self.slots[i].state() == SlotState::Failed || !handles[i].flush_waits())
    }

    /// Writes a group's records (or one written alone, `commit_record`) to
    /// the members that keep them; returns whether the array is within
    /// its redundancy after. Records that lie one after another in the
    /// ring go as one write (`runs`), each run to members of its own
    /// (`journal_copies`, the next turn each), so that a group's bytes
    /// spread over the members in sync: a group of large records (a 128
    /// KiB write's is 260 KiB at a 128 KiB chunk) on one drive would run
    /// at that drive's write rate while the others idle. A group of small
    /// ones is one run. All runs go in one submission and are flushed
    /// together: none of the group's records counts durable before every
    /// member written is flushed.
    pub(super) fn write_group(&self, records: &[(u64, AlignedBuf)]) -> bool {
        let j = self.journal.as_ref().expect("journaled");
        // Read once: the runs must fit the buffers they are joined in.
        let max = j.run();
        let spans = runs(records, max);
        let joined: Vec<Option<(AlignedBuf, usize)>> = spans
            .iter()
            .map(|r| (r.len() > 1).then(|| join(&records[r.clone()], max)))
            .collect();
        let first_turn = j.turns.fetch_add(spans.len() as u64, Ordering::Relaxed);
        let mut placed: Vec<(usize, u64, &[u8])> = Vec::new();
        for (k, (r, whole)) in spans.iter().zip(&joined).enumerate() {
            let (at, first) = &records[r.start];
            let bytes = whole.as_ref().map_or(&first[..], |(b, len)| &b[..*len]);
            for m in self.journal_copies(first_turn + k as u64) {
                placed.push((m, *at, bytes));
            }
        }
        let (handles, failed) = self.write_placed_durably(&placed);
        self.fail_erred(&handles, failed, "journal write")
    }

    /// The members a record goes to. A record is needed only while the
    /// array is degraded, and only as long as some member in sync holds
    /// it: so it goes to as many members in sync as the array can still
    /// lose, plus one (a RAID5 missing a member: one; a RAID6 missing one:
    /// two), taking turns by `turn` so that no one member takes every
    /// record. Each member that fails later takes a copy and the array's
    /// margin down by one together, so a member in sync keeps a copy for
    /// as long as the array lives. Members present but not in sync (being
    /// rebuilt, re-added) get none: every record placed before one of them
    /// counts in sync is settled as it does (`journal_in_sync`), so it
    /// never adds to the margin short of a copy. (They used to get every
    /// record, so that each record's copy on the drive being rebuilt,
    /// behind the rebuild's own writes there, held up every degraded
    /// write.) Replay finds each record on whichever member in sync holds
    /// it (`journal_recover`).
    fn journal_copies(&self, turn: u64) -> Vec<usize> {
        let in_sync: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].state() == SlotState::Active)
            .collect();
        let missing = self.slots.len() - in_sync.len();
        let margin = self.geo.level.parity_chunks().saturating_sub(missing);
        let first = (turn % in_sync.len().max(1) as u64) as usize;
        let mut to: Vec<usize> = in_sync
            .iter()
            .copied()
            .cycle()
            .skip(first)
            .take((margin + 1).min(in_sync.len()))
            .collect();
        to.sort_unstable();
        to
    }

    /// Writes `blocks` (member offset, bytes) durably to every member not
    /// failed in one submission (`write_durably`); a member that fails its
    /// write or its flush is failed. Returns whether the array is within its
    /// redundancy after.
    pub(super) fn write_everywhere(&self, blocks: &[(u64, &[u8])]) -> bool {
        let (handles, failed) = self.write_durably(&self.present_slots(), blocks);
        self.fail_erred(&handles, failed, "journal write")
    }
}

/// The most bytes of records one write of a group carries. Joining costs
/// a copy; past a few hundred KiB a drive's cost per command is paid off
/// by the transfer anyway, so the records of large writes (a 128 KiB
/// write's is 260 KiB) go as they are, and small ones (12 KiB for a 4 KiB
/// write) about twenty to a write.
pub(super) const MAX_RUN: u64 = 256 << 10;

/// A group's records (ring offset, bytes; in ring order) cut into runs that
/// each lie in one stretch of the ring, at most `max` bytes (a lone record
/// may be larger), as ranges of `records`: each run is one write to each
/// member that keeps it. A group is the ring's next stretch, so it is one run
/// unless it wraps at the ring's end or passes `max`: a drive takes one
/// command for some twenty records of small writes, not one each. A crash
/// tears a run no worse than it could separate writes of its records, whose
/// sectors a drive's cache may keep in any order too: each record has its own
/// checksum, replay stops at the first that does not check out, and none of
/// the group's in-place writes has begun before it is durable.
fn runs(records: &[(u64, AlignedBuf)], max: u64) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    let mut end = 0;
    let mut bytes = 0;
    for (i, (at, b)) in records.iter().enumerate() {
        let len = b.len() as u64;
        match runs.last_mut() {
            Some(r) if *at == end && bytes + len <= max => {
                r.end = i + 1;
                bytes += len;
            }
            _ => {
                runs.push(i..i + 1);
                bytes = len;
            }
        }
        end = at + len;
    }
    runs
}

/// The records of one run, one after another at the start of a buffer of
/// `max` bytes (the most a run of several records carries), and the
/// run's length: only those bytes are written. Every group's buffer has
/// that one length, so the leader's thread takes back the one its last
/// group gave up (`AlignedBuf` keeps spares by length); a buffer of each
/// run's own length came fresh from the heap nearly every time, its pages
/// zeroed by the kernel as the copy first touched them.
fn join(records: &[(u64, AlignedBuf)], max: u64) -> (AlignedBuf, usize) {
    let mut b = AlignedBuf::for_overwrite(max as usize);
    let mut at = 0;
    for (_, r) in records {
        b[at..at + r.len()].copy_from_slice(r);
        at += r.len();
    }
    (b, at)
}

/// A record took its place and sequence, and its group did not make it
/// durable: no in-place write follows, and the journal settles before the
/// next record takes a place (`JState::settle_first`).
pub(super) fn record_given_up(j: &Journal, st: &mut JState, seq: u64) {
    st.settle_first = true;
    st.record_done(seq);
    j.changed.notify_all();
    if st.wants_checkpoint() {
        j.committer.checkpoint_due();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(at: u64, blocks: usize, byte: u8) -> (u64, AlignedBuf) {
        let mut b = AlignedBuf::new(blocks * 4096);
        b.fill(byte);
        (at, b)
    }

    #[test]
    fn a_group_is_one_run_unless_it_wraps_or_passes_the_most_a_write_carries() {
        const K: u64 = 4096;
        // Three records one after another, then the ring's start (a wrap),
        // then one more after it.
        let g = [
            rec(100 * K, 3, 1),
            rec(103 * K, 3, 2),
            rec(106 * K, 2, 3),
            rec(2 * K, 3, 4),
            rec(5 * K, 1, 5),
        ];
        assert_eq!(runs(&g, MAX_RUN), vec![0..3, 3..5]);
        // At most 6 blocks a write: the first run splits, a lone larger
        // record stays whole.
        assert_eq!(runs(&g, 6 * K), vec![0..2, 2..3, 3..5]);
        assert_eq!(runs(&g, 2 * K), vec![0..1, 1..2, 2..3, 3..4, 4..5]);
        assert!(runs(&[], MAX_RUN).is_empty());
        // A run's buffer holds its records in order, byte for byte, at its
        // start; a second run's takes the first's buffer back.
        let (b, len) = join(&g[0..3], MAX_RUN);
        assert_eq!((b.len(), len), (MAX_RUN as usize, 8 * 4096));
        assert!(b[..3 * 4096].iter().all(|&b| b == 1));
        assert!(b[3 * 4096..6 * 4096].iter().all(|&b| b == 2));
        assert!(b[6 * 4096..len].iter().all(|&b| b == 3));
        let first = b.as_ptr();
        drop(b);
        let (b, len) = join(&g[3..5], MAX_RUN);
        assert_eq!((b.as_ptr(), len), (first, 4 * 4096));
        assert!(b[..3 * 4096].iter().all(|&b| b == 4));
        assert!(b[3 * 4096..len].iter().all(|&b| b == 5));
    }
}
