//! The degraded-write journal: closes the RAID5/6 write hole while a member
//! is missing.
//!
//! With every member in sync, a torn stripe write is repaired after a crash
//! by recomputing parity from data (the bitmap says where). With a member
//! missing that is impossible: its chunk exists only as parity, and a stripe
//! whose data and parity were half updated would reconstruct it wrong. So a
//! degraded stripe write first writes its new chunks, as a checksummed
//! record, to the journal area of members, durably (with FUA, or then a
//! flush: `Array::write_durably`); only then does it
//! write them in place (where every parity chunk of the stripe is missing,
//! nothing exists only as parity and nothing is journaled:
//! `Array::data_alone`). A record goes to as many members in sync as the array
//! can still lose, plus one, taking turns, and to none being brought in sync
//! (`journal_copies`): a RAID5 missing a member writes it once, where a copy
//! on every member cost a member write and a flush each. After a crash the
//! next start replays every record not yet known to be in place, in sequence
//! order, which completes the torn writes. A record holds every column the
//! write puts in place, or, where the array can lose no more members and
//! the write has them, only the new columns of the chunks that exist only
//! as parity (`Kind::Parity`: one chunk for a whole stripe, not the
//! stripe), whose replay recomputes the parity from the data as it lies;
//! `kinds.rs` keeps the two kinds composable in one stripe.
//!
//! Layout (from JOURNAL_OFFSET on each member): one 4 KiB header block
//! (magic, the sequence number up to which every record is known to be in
//! place, where the record after it lies, the array's UUID, CRC-32C), then
//! records, each a 4 KiB header (magic, sequence, stripe, column range,
//! the chunk indices and slots it carries, the array's UUID, CRC-32C of
//! header and payload) followed by the chunks' columns. A record lies at
//! the same place on every member that holds it. The area is a
//! ring reclaimed in place (`ring.rs`): a checkpoint moves the header past
//! the records at its front already in place, once every member is
//! flushed, while later records stay and writers go on. A settle empties
//! it (every record in place): a stop, a rebuild, and a flush with every
//! slot in sync do that (`journal_settles_at_flush`); `create` writes a
//! fresh header.
//!
//! Records are made durable in groups (`commit.rs`): the writers that
//! arrive while a group is being written and flushed form the next, so
//! concurrent degraded writes share their writes (one per run of records
//! one after another in the ring, at most 256 KiB, to the members whose
//! turn it is) and one flush of each member written (none where a
//! member takes the writes with FUA); two groups may be
//! written at once, each ending after the one before it.
//!
//! Replay trusts a record only if all of these hold, since the ring also
//! holds older records (and, past the newest, the bytes of records from
//! before the last wrap, client data among them): its checksum; its
//! array's UUID (a member reused by a new array keeps the old array's
//! records); its place in the chain (the first after the header carries the
//! header's sequence + 1, each next one the sequence after it, where the
//! one before ended, on whichever member in sync holds it); and its
//! fields against the geometry (a stripe that exists, columns inside a
//! chunk, each chunk index once, each slot the one the layout puts it on).

use super::*;
use crate::buf::AlignedBuf;
use crate::metadata::JOURNAL_OFFSET;

mod commit;
mod format;
mod kinds;
mod replay;
mod ring;

use format::{encode_head, Record, Unsealed, BLOCK, MAX_ENTRIES, RECORDS};

pub(crate) use format::Kind;

use parking_lot::MutexGuard;
use ring::wake_room_waiters;

pub(crate) use commit::JournalDone;

/// Called once there may be room in the journal's ring again (a
/// checkpoint or a settle ended): for a writer `journal_submit` told to
/// come back later. Called with no lock held.
pub(crate) type RoomWake = Box<dyn FnOnce() + Send>;

/// Why `journal_submit` queued nothing.
pub(crate) enum NotQueued {
    /// The ring has no room now, or a settle is emptying it: the `room`
    /// given is called once there may be; submit again then.
    Later,
    /// The blocking path's (`journal_submit`'s doc says which).
    Blocking,
}

pub(super) struct Journal {
    state: Mutex<JState>,
    /// Where the journal's area ends: the array's data offset.
    area_end: u64,
    /// Whether `unsettled` may be non-empty: the data path's check needs no
    /// lock in the usual case (nothing journaled since the last flush).
    /// Set under `state` before a stripe is added; a writer of stripe s
    /// holds s's lock, so a record of s was added (and this set) before.
    any_unsettled: AtomicBool,
    /// Signalled when `in_flight` reaches zero, the ring's first record not
    /// done is done, or a settle or a checkpoint ends.
    changed: parking_lot::Condvar,
    /// The threads that lead groups of records whose writers do not wait
    /// (`commit.rs`).
    committer: Arc<commit::Committer>,
    /// Of the stripes with a record unsettled, those with a `Kind::Parity`
    /// record whose in-place writes may still be in the drives' caches,
    /// and its last sequence: a write to such a stripe takes a
    /// `Kind::Parity` record too, or waits for a flush before a
    /// `Kind::Columns` one (`journal/kinds.rs`); a flush of every member
    /// takes out the stripes whose records had ended (`flush_checked`,
    /// `journal_parity_barrier`), a checkpoint those it passes. A lock of its
    /// own, never held across anything but the map's own work: a shard
    /// asks it for each degraded write, and `state`'s lock is held
    /// across a group's placing (asked under a `try_lock` of that, a
    /// shard that found it held went to the blocking path: degraded 4
    /// KiB writes at depth 128 ran at 0.8-0.9x on simulated drives).
    /// Taken inside `state`'s, never the other way.
    parity_unflushed: Mutex<std::collections::HashMap<u64, u64>>,
    /// Counts the runs of records written: whose turn it is to keep a
    /// copy (`journal_copies`).
    turns: std::sync::atomic::AtomicU64,
    /// The most bytes of records one write of a group carries, and what
    /// the records of a group must fill to be written beside the group
    /// before it (`commit::MAX_RUN`, `limit_journal_runs` aside).
    run_bytes: std::sync::atomic::AtomicU64,
}

struct JState {
    /// Where the next record goes, if it fits before the ring's end
    /// (`ring.rs`).
    head: u64,
    /// Where the ring ends: the area's end (`limit_journal_ring` aside).
    end: u64,
    next_seq: u64,
    /// Every record up to this sequence is in place: the header's.
    tail_seq: u64,
    /// Where the record after `tail_seq` lies (or the next will): the
    /// header's.
    tail_at: u64,
    /// The records past `tail_seq`, in sequence (and ring) order.
    live: std::collections::VecDeque<ring::Live>,
    /// Their bytes.
    live_bytes: u64,
    /// How many records at `live`'s front are done, and their bytes: what
    /// a checkpoint would free. Kept as records end, so that a record's
    /// end costs no walk over the ring (up to half of a 16 MiB ring of 12
    /// KiB records waits for a checkpoint).
    done_front: (usize, u64),
    /// How many of them are shards' (`journal_submit`) and not yet done:
    /// while any is, no record is written under the lock
    /// (`commit_record`), since their writers take the lock to say they
    /// are done and must not wait behind a write.
    queued_live: usize,
    /// Stripes with a record past `tail_seq`, and the last such records'
    /// sequences. A later write to such a stripe is journaled too, even
    /// with every member present: replay (after a crash or kill) writes
    /// records in sequence order, and a newer write that skipped the
    /// journal would be reverted by an older record of the same stripe.
    unsettled: std::collections::HashMap<u64, ring::Unsettled>,
    /// Records given a place in the ring whose in-place write has not
    /// finished yet (queued for a group, being written, or durable and
    /// being written in place): a settle waits for them (settling one
    /// would leave its stripe torn with no record to repair it after a
    /// crash).
    in_flight: usize,
    /// A settle is waiting for `in_flight` to drain: no new record takes
    /// a place meanwhile.
    settling: bool,
    /// A checkpoint is writing the header (`ring.rs`).
    checkpointing: bool,
    /// Writers waiting for room (`NotQueued::Later`).
    room_waiters: Vec<RoomWake>,
    /// The group commit's state (`commit.rs`).
    group: commit::Groups,
    /// A record took its place and sequence, then was not written (its
    /// group failed, or its writer panicked), though some members may hold
    /// it: settle before the next record takes a place, or a later record
    /// of its stripe would chain on after it and a replay would apply both
    /// (the stale one's columns against parity computed without them).
    settle_first: bool,
}

impl JState {
    /// An empty ring, ending at `end`, after the header that says
    /// `tail_seq`.
    fn fresh(tail_seq: u64, end: u64) -> JState {
        JState {
            head: RECORDS,
            end,
            next_seq: tail_seq + 1,
            tail_seq,
            tail_at: RECORDS,
            live: Default::default(),
            live_bytes: 0,
            done_front: (0, 0),
            queued_live: 0,
            unsettled: Default::default(),
            in_flight: 0,
            settling: false,
            checkpointing: false,
            room_waiters: Vec::new(),
            group: Default::default(),
            settle_first: false,
        }
    }
}

impl Journal {
    /// A journal whose area ends at `area_end` (the array's data offset).
    pub fn new(tail_seq: u64, area_end: u64) -> Journal {
        Journal {
            state: Mutex::new(JState::fresh(tail_seq, area_end)),
            area_end,
            changed: parking_lot::Condvar::new(),
            any_unsettled: AtomicBool::new(false),
            committer: Default::default(),
            parity_unflushed: Default::default(),
            turns: Default::default(),
            run_bytes: commit::MAX_RUN.into(),
        }
    }
}

impl Array {
    /// `journal_record` of every column: the tests' record.
    #[cfg(test)]
    pub(super) fn journal_stripe(&self, s: u64, lo: u64, chunks: &[(usize, &[u8])]) -> Result<u64> {
        self.journal_record(Kind::Columns, s, lo, chunks)
    }

    /// Writes `chunks` (stripe index, new columns [lo, hi)) of degraded
    /// stripe `s` to the journal as a record of `kind`, durably (on the
    /// members `journal_copies` picks). The caller writes the stripe's
    /// new columns in place afterwards, under the stripe lock, and then
    /// calls `journal_write_done` (on success only).
    ///
    /// The record takes the ring's next place and sequence, then waits for
    /// its group to be written and flushed (`commit.rs`); records take
    /// their places in the order their groups are written, so a group is
    /// always the ring's next stretch, and no record is written in place
    /// before every record ahead of it is durable.
    pub(super) fn journal_record(
        &self,
        kind: Kind,
        s: u64,
        lo: u64,
        chunks: &[(usize, &[u8])],
    ) -> Result<u64> {
        let Some(j) = &self.journal else {
            return Ok(0);
        };
        let width = chunks[0].1.len() as u64;
        let size = BLOCK + chunks.len() as u64 * width;
        let rec = self.unsealed(kind, s, lo, chunks);
        let mut st = j.state.lock();
        assert!(
            size <= st.end - RECORDS && chunks.len() <= MAX_ENTRIES,
            "caller slices records to fit"
        );
        let at = loop {
            while st.settling {
                j.changed.wait(&mut st);
            }
            if st.settle_first {
                // A record left unwritten: every earlier record's in-place
                // write made durable, and the header past them all.
                self.settle_locked(j, &mut st)?;
                continue;
            }
            if let Some(at) = st.room(size) {
                break at;
            }
            // The ring is full: free the records at its front already in
            // place, or wait until one is (or another's checkpoint ends).
            if !self.checkpoint(j, &mut st)? {
                j.changed.wait(&mut st);
            }
        };
        let (seq, block) = self.take_place(j, &mut st, at, (s, kind), rec, false);
        let len = block.len() as u64;
        let committed = self.commit_record(&mut st, at, block);
        if let Ok(true) = committed {
            self.count_record(len);
            if kind == Kind::Parity {
                self.activity.journal_parity_records.add(1);
            }
            return Ok(seq);
        }
        // Its group could not be made durable with the array within its
        // redundancy (or its leader panicked): no in-place write follows.
        commit::record_given_up(j, &mut st, seq);
        if let Err(panic) = committed {
            drop(st);
            std::panic::resume_unwind(panic);
        }
        Err(self.journal_unwritten_error())
    }

    /// `journal_record` for a writer that must not wait (a shard's): the
    /// record queued for the next group and its sequence returned, `done`
    /// called when that group ends (`commit.rs`). The caller writes the
    /// chunks in place only if `done` says the record is durable, then
    /// calls `journal_write_done`.
    ///
    /// Where the ring has no room (or a settle is emptying it), nothing is
    /// queued and `room` is called once there may be: `NotQueued::Later`
    /// (the committer frees the ring's front meanwhile). The blocking path
    /// (`journal_record`) takes the writes whose record would wait for
    /// something else (a settle due after a record was given up, the
    /// journal's lock held for long), that do not fit the ring, that the array
    /// cannot take (past its redundancy), or whose members' flushes wait
    /// for nothing (members in memory: there a record is written alone,
    /// `commit_record`).
    pub(crate) fn journal_submit(
        self: &Arc<Self>,
        s: u64,
        lo: u64,
        chunks: &[(usize, &[u8])],
        done: JournalDone,
        room: RoomWake,
    ) -> std::result::Result<u64, NotQueued> {
        let Some(j) = &self.journal else {
            return Err(NotQueued::Blocking);
        };
        let width = chunks.first().map_or(0, |c| c.1.len() as u64);
        let size = BLOCK + chunks.len() as u64 * width;
        if width == 0
            || chunks.len() > MAX_ENTRIES
            || (self.flushes_wait_for_nothing() && !j.committer_stepped())
            || !self.within_redundancy()
            || !self.start_committer(j)
        {
            return Err(NotQueued::Blocking);
        }
        let rec = self.unsealed(Kind::Columns, s, lo, chunks);
        // Held only for short stretches: every holder gives it up for its
        // I/O (a group's writes, a checkpoint, a settle), but for a record
        // written alone, which is not done while a shard's is live, nor
        // where a shard gets here (members whose flushes wait). Should
        // that change under it (members failing meanwhile), the shard
        // gives up after a while rather than wait on a write whose member
        // error waits for the shard's own writes.
        let Some(mut st) = j.state.try_lock_for(std::time::Duration::from_millis(10)) else {
            return Err(NotQueued::Blocking);
        };
        if st.settle_first || size > st.end - RECORDS {
            return Err(NotQueued::Blocking);
        }
        let Some(at) = st.room(size).filter(|_| !st.settling) else {
            st.room_waiters.push(room);
            drop(st);
            j.committer.checkpoint_due();
            return Err(NotQueued::Later);
        };
        let (seq, block) = self.take_place(j, &mut st, at, (s, Kind::Columns), rec, true);
        self.queue_record(j, &mut st, at, seq, block, done);
        Ok(seq)
    }

    /// The bytes of a record of `kind` of `chunks` (stripe index, new
    /// columns [lo, ..)) of stripe `s`, but for its sequence
    /// (`take_place`): built before the journal's lock is taken.
    fn unsealed(&self, kind: Kind, s: u64, lo: u64, chunks: &[(usize, &[u8])]) -> Unsealed {
        let map = self.geo.stripe_map(s);
        let entries: Vec<(usize, usize, &[u8])> = chunks
            .iter()
            .map(|&(i, d)| (i, map.members[i], d))
            .collect();
        Unsealed::new(
            kind,
            s,
            lo,
            lo + chunks[0].1.len() as u64,
            &entries,
            &self.uuid,
        )
    }

    /// Gives record `rec` (of stripe `s`, of `kind`) the ring's place `at` (from
    /// `JState::room`) and the next sequence, with its stripe unsettled and
    /// counted in flight: its sequence and sealed bytes. The caller has
    /// checked that no settle is due or running. `queued`: its writer does
    /// not wait (`journal_submit`).
    fn take_place(
        &self,
        j: &Journal,
        st: &mut JState,
        at: u64,
        (s, kind): (u64, Kind),
        mut rec: Unsealed,
        queued: bool,
    ) -> (u64, AlignedBuf) {
        j.any_unsettled.store(true, Ordering::Release);
        let seq = st.place(at, rec.b.len() as u64, (s, kind), queued);
        if kind == Kind::Parity {
            j.parity_unflushed.lock().insert(s, seq);
        }
        rec.seal(seq);
        (seq, rec.b)
    }

    /// A record of `len` bytes is durable.
    fn count_record(&self, len: u64) {
        self.activity.journal_records.add(1);
        self.activity.journal_bytes.add(len);
    }

    /// The error of a write whose record was given up (its group could not
    /// be made durable, or its leader panicked): nothing of it was written
    /// in place.
    pub(crate) fn journal_unwritten_error(&self) -> ArrayError {
        if self.within_redundancy() {
            // Back within redundancy since: a member came back in sync
            // meanwhile.
            return ArrayError::Member {
                member: "the degraded-write journal".into(),
                source: io::Error::other(
                    "this write's journal record could not be made durable (members failed, or its group's writer stopped); nothing was written in place: write it again",
                ),
            };
        }
        self.failed_error()
    }

    /// The in-place write of record `seq` (from `journal_record` or
    /// `journal_submit`) has finished, or failed: a settle may pass it
    /// now, and a checkpoint once those ahead of it are done too.
    pub(super) fn journal_write_done(&self, seq: u64) {
        if let Some(j) = &self.journal {
            let mut st = j.state.lock();
            let front = st.record_done(seq);
            // Those waiting: a settle, for none in flight; a writer with
            // no room, for a front worth a checkpoint.
            if st.in_flight == 0 || (front && st.worth_checkpoint()) {
                j.changed.notify_all();
            }
            let reclaim = front && st.wants_checkpoint();
            drop(st);
            if reclaim {
                // Freed ahead of need, by the committer, where there is
                // one: the writers go on meanwhile.
                j.committer.checkpoint_due();
            }
        }
    }

    /// Whether stripe `s` has a record not yet settled: its writes must go
    /// through the journal too. Callers hold the stripe's lock (records of
    /// `s` are only added under it).
    pub(super) fn journal_pending(&self, s: u64) -> bool {
        self.journal.as_ref().is_some_and(|j| {
            j.any_unsettled.load(Ordering::Acquire) && j.state.lock().unsettled.contains_key(&s)
        })
    }

    /// `journal_pending` for a caller that must not wait (a shard's write):
    /// None where the journal's lock is held, which is held across I/O
    /// only by a record written alone (members in memory).
    pub(super) fn journal_pending_now(&self, s: u64) -> Option<bool> {
        let Some(j) = &self.journal else {
            return Some(false);
        };
        if !j.any_unsettled.load(Ordering::Acquire) {
            return Some(false);
        }
        j.state.try_lock().map(|st| st.unsettled.contains_key(&s))
    }

    /// Whether any record is not yet settled.
    pub(super) fn journal_any_pending(&self) -> bool {
        self.journal
            .as_ref()
            .is_some_and(|j| j.any_unsettled.load(Ordering::Acquire))
    }

    /// Most columns one record may carry for `count` chunks.
    pub(super) fn journal_slice(&self, count: usize) -> u64 {
        let end = self
            .journal
            .as_ref()
            .map_or(self.data_offset, |j| j.state.lock().end);
        ((end - RECORDS - BLOCK) / count as u64) / BLOCK * BLOCK
    }

    /// Keeps the journal's records in the first `bytes` of its ring, so
    /// that it wraps, and is reclaimed, every few records: for the
    /// deterministic simulation, whose runs are too short to fill the
    /// whole ring. Call before any record is written (after a start).
    #[doc(hidden)]
    pub fn limit_journal_ring(&self, bytes: u64) {
        if let Some(j) = &self.journal {
            let mut st = j.state.lock();
            assert!(
                st.live.is_empty() && st.head == RECORDS,
                "before any record"
            );
            // Room for a record of every member's chunk, one block each
            // (`journal_slice` slices no finer).
            let least = BLOCK * (1 + self.slots.len() as u64);
            st.end = RECORDS + bytes.clamp(least, j.area_end - RECORDS);
        }
    }

    /// Cuts each group of the journal's records into writes of at most
    /// `bytes` (a lone record may be larger), each to members of its own:
    /// for the tests and the simulation, whose records are small, so that
    /// a group's records lie on several members and a power cut can keep
    /// some of them and drop others, as it can a group of large records.
    /// A group then fills a run with less, so that one record is enough
    /// for it to be written beside the group before it (`Groups::room`).
    #[doc(hidden)]
    pub fn limit_journal_runs(&self, bytes: u64) {
        if let Some(j) = &self.journal {
            j.run_bytes.store(bytes, Ordering::Release);
        }
    }

    pub(super) fn has_journal(&self) -> bool {
        self.journal.is_some()
    }

    /// Whether a flush settles the journal (`flush_checked`): at a stop,
    /// and where every slot is in sync.
    ///
    /// While a slot is missing (or being rebuilt, on the rows the rebuild
    /// has not reached) every write to a stripe it serves is journaled
    /// anyway (but where the stripe has no parity left: `data_alone`),
    /// and a flush leaves the records to the ring's checkpoints
    /// (`ring.rs`), which free its front once it is half full: a settle
    /// costs a second flush of every member and a header written and
    /// flushed on each, which at every flush made a degraded write
    /// followed by a flush cost 35 drive commands where 14 do. Keeping
    /// them is as safe as between two flushes: a record's stripe stays
    /// journaled while it is unsettled, so a replay of it is never undone
    /// by an older record nor undoes a write that skipped the journal, and
    /// it keeps a copy on a member in sync while the array is within its
    /// redundancy (`journal_copies`). A rebuild settles before it writes
    /// its member.
    ///
    /// With every slot in sync, the records left from a degraded stretch
    /// are settled at the next flush, so that writes to their stripes stop
    /// being journaled; at a stop, so that an orderly stop leaves the ring
    /// empty.
    pub(super) fn journal_settles_at_flush(&self, stopping: bool) -> bool {
        stopping || self.every_slot_in_sync()
    }

    /// Marks every record so far as in place, so none is ever replayed:
    /// new records wait, the in-place writes of those in flight finish,
    /// the members are flushed, then the header moves past them all.
    ///
    /// A flush calls it where `journal_settles_at_flush` says (the journal
    /// is then empty again), and so does a rebuild before it writes its
    /// member: a record from before a slot got its new (or returning)
    /// member carries that slot's old contents, and replaying it over what
    /// the rebuild wrote would undo the rebuild.
    pub(super) fn journal_settle(&self) -> Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let mut st = j.state.lock();
        // Another settle (or a new member's ring being made) first: what it
        // leaves may be settled.
        while st.settling {
            j.changed.wait(&mut st);
        }
        if st.tail_seq + 1 == st.next_seq {
            return Ok(());
        }
        self.settle_locked(j, &mut st)
    }

    /// The settle itself, with the state's lock held (and given up only
    /// while waiting for the records in flight, whose groups' leaders and
    /// writers need it).
    fn settle_locked(&self, j: &Journal, st: &mut MutexGuard<'_, JState>) -> Result<()> {
        st.settling = true;
        let r = self.settle_held(j, st);
        st.settling = false;
        j.changed.notify_all();
        wake_room_waiters(st);
        r
    }

    /// `settle_locked` for a caller that set `settling` and clears it
    /// itself, so that nothing takes a place between the settle and what
    /// it does next under the same hold (`settled_then`).
    fn settle_held(&self, j: &Journal, st: &mut MutexGuard<'_, JState>) -> Result<()> {
        while st.in_flight > 0 || st.checkpointing {
            j.changed.wait(st);
        }
        // No record takes a place while `settling`: the I/O runs with the
        // lock given up, so no one waits on it behind a flush (a shard
        // saying its record is done, the committer).
        let tail = st.next_seq - 1;
        let r = MutexGuard::unlocked(st, || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.flush_members().and_then(|()| {
                    let head = encode_head(tail, RECORDS, &self.uuid);
                    self.write_journal_block(&head, JOURNAL_OFFSET)
                })
            }))
        });
        let r = r.unwrap_or_else(|p| {
            // Ended even by a panic, or every later settle waits for ever.
            st.settling = false;
            j.changed.notify_all();
            std::panic::resume_unwind(p)
        });
        if r.is_ok() {
            st.emptied(tail);
            j.parity_unflushed.lock().clear();
            j.any_unsettled.store(false, Ordering::Release);
        }
        st.settle_first &= r.is_err();
        r
    }

    /// Writes a journal block durably on every member not failed.
    pub(super) fn write_journal_block(&self, b: &[u8], at: u64) -> Result<()> {
        if !self.write_everywhere(&[(at, b)]) {
            return Err(self.failed_error());
        }
        Ok(())
    }

    /// Flushes every member not failed (uncounted: the journal's own).
    fn flush_members(&self) -> Result<()> {
        self.flush_present(false)
    }

    /// A member joining a slot (rebuild of a replacement or a re-added
    /// member, a hot replace's new device): its journal area gets the
    /// current header and a ring of zeros, so nothing it held from before
    /// (another array's records, or this array's never put in place, some
    /// perhaps past a gap a crash left) can chain on once it is in sync.
    /// Every record so far is settled first. Errs with the array's error
    /// where that settle cannot be done (the array is beyond its
    /// redundancy: not the member's fault), with `ArrayError::Member`
    /// where the member cannot take its ring.
    ///
    /// The zeros go first, durably, while records go on taking places:
    /// the ring is megabytes (16 MiB on members of 1 GiB and more), and
    /// every journaled write waited for them when they were written under
    /// the hold below (50-80 ms at a rebuild's start on the simulated
    /// drives of `benches/rebuild.rs`). That is safe because a member not
    /// in sync is never read by a replay (`journal_recover`) and takes no
    /// record's copy. A hot replace's new device is the exception: its
    /// slot is in sync, and a record's copy there goes to both devices of
    /// the pair, so one placed meanwhile may lose its copy on the new one
    /// to the zeros. What was placed is settled under the hold before the
    /// header is written, so after it every record lands on zeros.
    pub(super) fn journal_admit(&self, m: &MemberRef) -> Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let member_error = |source| ArrayError::Member {
            member: m.identity().into(),
            source,
        };
        // Kept allocated, as the other members' rings are (a filling
        // filesystem must not fail a record's write there).
        m.write_zeroes_allocated(RECORDS, j.area_end - RECORDS)
            .and_then(|()| m.flush())
            .map_err(member_error)?;
        // It gets the header as it stands, with nothing unsettled before
        // it, and no record placed nor checkpoint run until it has it.
        let made = self.settled_then(j, |tail, at| {
            m.write_at(&encode_head(tail, at, &self.uuid), JOURNAL_OFFSET)?;
            m.flush()
        })?;
        made.map_err(member_error)
    }

    /// Makes a slot count in sync, by `become_in_sync` (a rebuild's end:
    /// `finish_rebuild`), for the journal. A member not in sync gets no
    /// copy of a record (`journal_copies`), and once in sync it adds to the
    /// margin of copies each record must keep: so every record placed
    /// before is settled first, and none is placed between the two.
    /// `become_in_sync` takes the array's metadata lock; nothing waiting
    /// for the journal's hold holds that.
    pub(super) fn journal_in_sync<T>(
        &self,
        become_in_sync: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        match &self.journal {
            Some(j) => self.settled_then(j, |_, _| become_in_sync())?,
            None => become_in_sync(),
        }
    }

    /// Settles every record so far, then runs `then` before any record
    /// takes a place or a checkpoint moves the header: one hold of the
    /// journal (`settling`) for both, since a settle on its own lets the
    /// lock go as it ends (to wake the writers waiting for room) and
    /// another settle or a record could come between. `then` gets the
    /// header as it stands (its tail sequence and where the ring's front
    /// is) and runs with the journal's lock let go. Errs with the settle's
    /// error, `then` not run.
    fn settled_then<T>(&self, j: &Journal, then: impl FnOnce(u64, u64) -> T) -> Result<T> {
        let mut st = j.state.lock();
        while st.settling || st.checkpointing {
            j.changed.wait(&mut st);
        }
        st.settling = true;
        let settled = match st.tail_seq + 1 != st.next_seq {
            true => self.settle_held(j, &mut st),
            false => Ok(()),
        };
        let done = settled.map(|()| {
            let (tail, at) = (st.tail_seq, st.tail_at);
            MutexGuard::unlocked(&mut st, || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| then(tail, at)))
            })
        });
        st.settling = false;
        j.changed.notify_all();
        wake_room_waiters(&mut st);
        done.map(|r| r.unwrap_or_else(|p| std::panic::resume_unwind(p)))
    }

    /// A new array's journal: a header with nothing to replay, on every
    /// member, so that records an earlier array left there never chain on.
    pub(super) fn journal_init(&self) -> Result<()> {
        if self.journal.is_none() {
            return Ok(());
        }
        self.write_journal_block(&encode_head(0, RECORDS, &self.uuid), JOURNAL_OFFSET)
    }

    /// Whether a record's fields fit this array: a stripe that exists,
    /// columns inside one chunk, each chunk index at most once (a data
    /// chunk's, in a `Kind::Parity` record), and each slot the one the
    /// layout puts that chunk on.
    fn record_fits(&self, r: &Record) -> bool {
        let width = match r.kind {
            Kind::Columns => self.geo.data_chunks() + self.geo.level.parity_chunks(),
            Kind::Parity if self.geo.level.parity_chunks() > 0 => self.geo.data_chunks(),
            Kind::Parity => return false,
        };
        if r.stripe >= self.geo.rows() || r.hi > self.geo.chunk {
            return false;
        }
        let map = self.geo.stripe_map(r.stripe);
        let mut seen = vec![false; width];
        r.entries.iter().all(|(idx, slot, _)| {
            *idx < width && !std::mem::replace(&mut seen[*idx], true) && map.members[*idx] == *slot
        })
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_joining;
#[cfg(test)]
mod tests_settle;
