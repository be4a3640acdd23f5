//! Rebuild: bring a replacement member in sync, online, batch by batch.
//!
//! Each batch of rows is rebuilt under the locks of its stripes (or
//! mirrored chunks), a step at a time, not all together: each step's rows
//! count as rebuilt once written, before their locks go (`sync::Ahead`),
//! and the member's in-sync position moves past the batch once all are
//! (`rebuild_rows.rs`). So a writer either finds a row not yet rebuilt
//! (and skips the member: the rebuild will compute it) or rebuilt (and
//! writes the member). The position is saved in the metadata every
//! `checkpoint_bytes` or `checkpoint_every`, whichever comes first, after
//! a flush of the new member and of every other member present (what its
//! rows were computed from: `flush_before_saving`), so a stop or crash
//! resumes from there. A
//! RAID5/6 write to rows rebuilt but not yet saved goes through the
//! journal, as a degraded one (`Array::readable_after_a_crash`): a crash
//! takes the member back to the saved row and rebuilds what follows from
//! the others, which a torn write with no record would leave disagreeing.
//!
//! A batch is cut into `parallel` runs of `batch_rows` rows (at most 256
//! rows in all), rebuilt side by side on threads made for the rebuild
//! (`runs.rs`), each run locking its steps' rows. The position moves
//! only once the whole batch is written.

use super::runs;
use super::sync::WRAPPED;
use super::*;
use std::time::{Duration, Instant};

/// How a rebuild runs.
#[derive(Clone, Debug)]
pub struct RebuildOptions {
    /// Most bytes written to the new member per second (None: as fast as it goes).
    pub rate_limit: Option<u64>,
    /// A rate the operator can change while the rebuild runs (bytes per
    /// second, 0: none); replaces `rate_limit` when set.
    pub live_rate: Option<Arc<AtomicU64>>,
    /// Rows (stripes) per batch: the parity engine's batch size.
    pub batch_rows: u64,
    /// Runs of `batch_rows` rebuilt side by side, each on a thread (see
    /// the module's doc); 1: one at a time. By default the cores, at most
    /// 4. A rebuild on a rayon thread runs them one at a time whatever
    /// this says. A hot replace's copy runs the same way. Writers into a
    /// batch wait for the step or two of its run under way (`step_bytes`),
    /// not for all of it.
    pub parallel: usize,
    /// Member bytes a RAID5/6 rebuild's or a hot replace's run reads per
    /// member at a time, each step's writes going out with the next
    /// step's reads (`runs::step_rows`; 256 KiB by default), a mirror's
    /// copies as a parity level's recovered chunks. The deterministic
    /// simulation makes it a row, so that small arrays have runs of many
    /// steps.
    pub step_bytes: u64,
    /// The shortest run of holes, in bytes per member, that a rebuild or
    /// a hot replace zeroes on the new member rather than reads
    /// (`skip_holes.rs`; 256 KiB by default): a shorter one costs more in
    /// calls, and in steps that no longer overlap, than it spares (rows
    /// of data and of holes in turn rebuilt 1.2x slower each skipped).
    /// The deterministic simulation makes it a row.
    pub hole_bytes: u64,
    /// Save the restart position at least this often...
    pub checkpoint_bytes: u64,
    /// ...and at least this often in time, so a slow (rate-limited or
    /// loaded) rebuild loses little to a crash.
    pub checkpoint_every: Duration,
}

impl Default for RebuildOptions {
    fn default() -> Self {
        RebuildOptions {
            rate_limit: None,
            live_rate: None,
            batch_rows: 32,
            parallel: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
            step_bytes: runs::STEP_BYTES,
            hole_bytes: super::skip_holes::HOLE_BYTES,
            checkpoint_bytes: 256 << 20,
            checkpoint_every: Duration::from_secs(5),
        }
    }
}

/// A member a rebuild pass writes.
struct Target {
    ticket: rebuild_ticket::RebuildTicket,
    member: MemberRef,
    /// Written from the cursor on (its position is the cursor's).
    joined: bool,
    /// The row its rebuild began at (`Slot::rebuild_from` when the pass
    /// took it on): it is done when the pass comes back round to it.
    from: u64,
    /// Past the last row and on from row 0 (it joined the pass late).
    wrapped: bool,
    /// Rows this pass wrote to it.
    copied: u64,
}

impl Target {
    fn new(a: &Array, ticket: rebuild_ticket::RebuildTicket) -> Target {
        let s = &a.slots[ticket.slot];
        Target {
            member: s
                .member
                .read()
                .clone()
                .expect("a rebuilding slot has a member"),
            wrapped: s.rebuild_row.load(Ordering::Acquire) & WRAPPED != 0,
            from: s.rebuild_from.load(Ordering::Acquire),
            ticket,
            joined: false,
            copied: 0,
        }
    }

    fn slot<'a>(&self, a: &'a Array) -> &'a Slot {
        &a.slots[self.ticket.slot]
    }

    /// The row its rebuild has reached.
    fn position(&self, a: &Array) -> u64 {
        self.slot(a).rebuild_row.load(Ordering::Acquire) & !WRAPPED
    }

    /// Whether the slot still holds the member this rebuild is for.
    fn holds(&self, a: &Array) -> bool {
        a.ticket_holds(&self.ticket).is_ok()
    }
}

/// A member a batch writes, as its runs see it.
#[derive(Clone)]
pub(super) struct Joined {
    pub ticket: rebuild_ticket::RebuildTicket,
    pub member: MemberRef,
    /// The row below which it is resynced only where the bitmap marks
    /// writes (`Slot::resync_dirty_below`).
    pub dirty_below: u64,
}

/// Where a rebuild pass stands.
struct Pass<'p> {
    targets: Vec<Target>,
    /// The next row to rebuild.
    cursor: u64,
    /// Members that become rebuilding meanwhile join at the cursor.
    join_others: bool,
    batch: u64,
    run_rows: u64,
    /// The members a batch writes: what the runs read.
    joined: &'p Mutex<Vec<Joined>>,
    /// Members finished by the pass.
    finished: usize,
    /// Why the first member that left the pass (failed or replaced) did.
    dropped: Option<ArrayError>,
}

/// How a rebuild ended without error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebuildEnd {
    Finished,
    /// Stopped by the caller; resumes from the saved position.
    Interrupted,
}

impl Array {
    /// Rebuilt rows and total rows of a rebuilding slot.
    pub fn rebuild_progress(&self, slot: usize) -> Option<(u64, u64)> {
        let s = self.slots.get(slot)?;
        (s.state() == SlotState::Rebuilding)
            .then(|| (s.rows_in_sync(self.geo.rows()), self.geo.rows()))
    }

    /// Slots waiting for or in rebuild (`rebuild_wanted` says which may run).
    pub fn rebuilding_slots(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].state() == SlotState::Rebuilding)
            .collect()
    }

    /// Rebuilds `slot` from its saved position to the end. Blocks; run it
    /// on its own thread to keep serving I/O. `stop` interrupts it.
    pub fn rebuild(
        &self,
        slot: usize,
        opts: &RebuildOptions,
        stop: &AtomicBool,
    ) -> Result<RebuildEnd> {
        self.rebuild_pass(&[slot], false, opts, stop)
    }

    /// Rebuilds, in one pass, every slot whose rebuild may run now
    /// (`rebuild_wanted`); on RAID5/6 a slot that becomes rebuilding while
    /// the pass runs joins it at the row it has reached (see `sync.rs`), so
    /// a RAID6's second replacement is read for once, not after the first.
    /// Mirrors are rebuilt one slot per pass. Blocks; `stop` interrupts it.
    pub fn rebuild_all(&self, opts: &RebuildOptions, stop: &AtomicBool) -> Result<RebuildEnd> {
        let wanted = self.rebuilds_wanted();
        let Some(&first) = wanted.first() else {
            return Ok(RebuildEnd::Finished);
        };
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => self.rebuild_pass(&wanted, true, opts, stop),
            _ => self.rebuild_pass(&[first], false, opts, stop),
        }
    }

    /// The pass: a cursor over the rows from the lowest position of a
    /// member partly rebuilt, each member written from its own position on
    /// (`join_others`: members that become rebuilding meanwhile taken on
    /// at the cursor), past the last row and on from row 0 while a member
    /// that joined late still needs those rows.
    fn rebuild_pass(
        &self,
        slots: &[usize],
        join_others: bool,
        opts: &RebuildOptions,
        stop: &AtomicBool,
    ) -> Result<RebuildEnd> {
        let mut targets = Vec::new();
        for (k, &slot) in slots.iter().enumerate() {
            match self.rebuild_ticket(slot) {
                Ok(ticket) => targets.push(Target::new(self, ticket)),
                // Asked for by name (the first): say why not.
                Err(e) if k == 0 => return Err(e),
                Err(_) => {}
            }
        }
        // From the lowest position of a member partly rebuilt (none held
        // back from where it stands); members with nothing in sync yet
        // start there too, unless they already wait further on. A member
        // in sync to the last row (saved so by a rebuild's end that a
        // crash cut short of making it active) is finished at the pass's
        // first turn, and sets no cursor: at the last row, the others
        // would join there with nothing left to do before the wrap.
        let total = self.geo.rows();
        let cursor = targets
            .iter()
            .filter(|t| {
                let s = t.slot(self);
                !s.sync_empty() && !s.sync_full(total)
            })
            .map(|t| t.position(self))
            .min()
            .unwrap_or(0);
        for t in targets.iter_mut() {
            if t.slot(self).sync_empty() && t.position(self) < cursor {
                if let Some(ticket) = self.join_rebuild(t.ticket.slot, cursor) {
                    *t = Target::new(self, ticket);
                }
            }
        }
        for t in &targets {
            self.rebuild_began(t, cursor);
        }
        *self.jobs.pass.lock() = targets.iter().map(|t| t.ticket.slot).collect();
        self.jobs.pass_moved.store(0, Ordering::Release);
        let (run_rows, batch) = runs::run_and_batch_rows(opts.batch_rows, opts.parallel);
        let joined: Mutex<Vec<Joined>> = Mutex::new(Vec::new());
        let work = |run: runs::Run, pool: &mut crate::buf::BufPool| -> Result<Vec<u64>> {
            let all = joined.lock().clone();
            self.rebuild_run(&all, run, opts, pool)
        };
        std::thread::scope(|sc| {
            let mut runs = self.run_threads(sc, (run_rows, batch), "rebuild-run", &work);
            let mut pass = Pass {
                targets,
                cursor,
                join_others,
                batch,
                run_rows,
                joined: &joined,
                finished: 0,
                dropped: None,
            };
            let r = self.rebuild_rows(&mut pass, opts, stop, &mut runs);
            if let Err(e) = &r {
                self.pass_ended_by(&pass.targets, e);
            }
            self.jobs.pass.lock().clear();
            r
        })
    }

    /// Records that a member's rebuild begins (or goes on) in a pass whose
    /// cursor is at `row`.
    fn rebuild_began(&self, t: &Target, row: u64) {
        let from_row = t.slot(self).saved_row();
        let mut meta = self.meta.lock();
        self.record(
            &mut meta,
            ArrayEvent::RebuildStarted {
                slot: t.ticket.slot,
                member: t.member.identity().into(),
                from_row,
                rows: self.geo.rows(),
            },
        );
        drop(meta);
        tracing::info!(array = %self.name, slot = t.ticket.slot, member = t.member.identity(), from_row, pass_row = row, rows = self.geo.rows(), "rebuild started");
    }

    /// The pass's batches (see `rebuild_pass`), then each member's end.
    fn rebuild_rows(
        &self,
        pass: &mut Pass<'_>,
        opts: &RebuildOptions,
        stop: &AtomicBool,
        runs: &mut runs::RunThreads<'_, Vec<u64>>,
    ) -> Result<RebuildEnd> {
        let total = self.geo.rows();
        let chunk = self.geo.chunk;
        let started = Instant::now();
        let mut moved = 0u64;
        let mut since_saved = 0u64;
        let mut saved_at = Instant::now();
        let mut next_report = 0u64;
        let ckpt_rows = (opts.checkpoint_bytes / chunk).max(1);
        // Records from before these members arrived hold their slots' old
        // contents: settle them before the rebuild writes (see journal.rs).
        self.journal_settle()?;
        self.admit_targets(&mut pass.targets);
        loop {
            if stop.load(Ordering::Acquire) {
                self.save_positions(&pass.targets)?;
                tracing::info!(array = %self.name, row = pass.cursor, "rebuild interrupted; will resume here");
                return Ok(RebuildEnd::Interrupted);
            }
            self.drop_superseded(pass);
            if pass.join_others {
                self.join_pass(pass)?;
            }
            self.finish_synced(pass)?;
            self.publish(pass);
            for t in pass.targets.iter_mut().filter(|t| !t.joined) {
                t.joined = t.position(self) == pass.cursor;
            }
            if pass.targets.is_empty() {
                break;
            }
            // Up to the next member still to join, or the last row.
            let waiting = pass
                .targets
                .iter()
                .filter(|t| !t.joined)
                .map(|t| t.position(self))
                .filter(|&p| p > pass.cursor)
                .min();
            // Nor past where a member that wrapped began: its rows from
            // there on are in sync, and are not written again.
            let done_at = pass
                .targets
                .iter()
                .filter(|t| t.joined && t.wrapped)
                .map(|t| t.from)
                .min();
            let end = (pass.cursor + pass.batch)
                .min(total)
                .min(waiting.unwrap_or(total))
                .min(done_at.unwrap_or(total));
            if pass.targets.iter().all(|t| !t.joined) {
                // Nobody needs these rows: on to the next to join.
                pass.cursor = waiting.unwrap_or(0);
                continue;
            }
            assert!(end > pass.cursor, "a rebuild batch must move on");
            let began = Instant::now();
            let rows = self.rebuild_batch(pass, end, runs)?;
            moved += end - pass.cursor;
            since_saved += end - pass.cursor;
            self.jobs
                .pass_moved
                .fetch_add(end - pass.cursor, Ordering::AcqRel);
            pass.cursor = end;
            self.finish_synced(pass)?;
            self.publish(pass);
            if pass.cursor == total {
                self.wrap_pass(pass)?;
            }
            if !pass.targets.is_empty()
                && (since_saved >= ckpt_rows || saved_at.elapsed() >= opts.checkpoint_every)
            {
                self.save_positions(&pass.targets)?;
                since_saved = 0;
                saved_at = Instant::now();
            }
            let least = pass
                .targets
                .iter()
                .map(|t| t.slot(self).rows_in_sync(total))
                .min()
                .unwrap_or(total);
            let pct = least * 100 / total;
            if pct >= next_report {
                let secs = started.elapsed().as_secs_f64().max(1e-9);
                let rate = (moved * chunk) as f64 / secs;
                let left = ((total - least) * chunk) as f64 / rate.max(1.0);
                let slots: Vec<usize> = pass.targets.iter().map(|t| t.ticket.slot).collect();
                tracing::info!(array = %self.name, ?slots, percent = pct, rate_mib_s = format!("{:.1}", rate / 1048576.0),
                    eta_s = format!("{left:.0}"), "rebuild progress");
                next_report = pct + 5;
            }
            pace(
                opts.rate_limit,
                &opts.live_rate,
                rows * chunk,
                began,
                &|| stop.load(Ordering::Acquire),
            );
        }
        self.resync_deferred(stop)?;
        match (pass.finished, pass.dropped.take()) {
            // Every member it was for left it: say why.
            (0, Some(e)) => Err(e),
            _ => Ok(RebuildEnd::Finished),
        }
    }

    /// Rebuilds rows [cursor, end) onto every member joined, under the
    /// rows' locks, and moves their positions past them. Returns the most
    /// rows written to one member (a re-added member's clean rows are
    /// skipped, not paced).
    fn rebuild_batch(
        &self,
        pass: &mut Pass<'_>,
        end: u64,
        runs: &mut runs::RunThreads<'_, Vec<u64>>,
    ) -> Result<u64> {
        let row = pass.cursor;
        let on: Vec<usize> = (0..pass.targets.len())
            .filter(|&i| pass.targets[i].joined)
            .collect();
        *pass.joined.lock() = on
            .iter()
            .map(|&i| {
                let t = &pass.targets[i];
                Joined {
                    ticket: t.ticket,
                    member: t.member.clone(),
                    dirty_below: t.slot(self).resync_dirty_below.load(Ordering::Acquire),
                }
            })
            .collect();
        // The runs lock their own rows and mark what they wrote
        // (`rebuild_run`).
        let its_runs = runs::runs_of((row, end), pass.run_rows);
        for &i in &on {
            let firsts = its_runs.iter().map(|&(lo, _)| lo);
            self.begin_rebuilt_ahead(&pass.targets[i].ticket, firsts);
        }
        let mut written = vec![0u64; on.len()];
        for r in runs.batch((row, end), pass.run_rows) {
            for (w, n) in written.iter_mut().zip(r?) {
                *w += n;
            }
        }
        for (&i, n) in on.iter().zip(&written) {
            let t = &mut pass.targets[i];
            let at = if t.wrapped { WRAPPED | end } else { end };
            self.advance_rebuild(&t.ticket, at)?;
            t.copied += n;
        }
        Ok(written.into_iter().max().unwrap_or(0))
    }

    /// The slots the pass writes, for status (`Array::copy_progress`).
    fn publish(&self, pass: &Pass<'_>) {
        *self.jobs.pass.lock() = pass.targets.iter().map(|t| t.ticket.slot).collect();
    }

    /// Members that became rebuilding since the pass began, with nothing
    /// in sync yet, join it at its cursor.
    fn join_pass(&self, pass: &mut Pass<'_>) -> Result<()> {
        let mut new = Vec::new();
        for slot in self.rebuilds_wanted() {
            if pass.targets.iter().any(|t| t.ticket.slot == slot) {
                continue;
            }
            let here = self.slots[slot].rebuild_row.load(Ordering::Acquire);
            if here > pass.cursor {
                continue;
            }
            if let Some(ticket) = self.join_rebuild(slot, pass.cursor) {
                let t = Target::new(self, ticket);
                self.rebuild_began(&t, pass.cursor);
                new.push(t);
            }
        }
        if new.is_empty() {
            return Ok(());
        }
        // In the pass before anything can fail, so that its end accounts
        // for them too.
        let first_new = pass.targets.len();
        pass.targets.extend(new);
        self.journal_settle()?;
        let mut new = pass.targets.split_off(first_new);
        self.admit_targets(&mut new);
        pass.targets.extend(new);
        Ok(())
    }

    /// Gives each new member's journal area the current header and an
    /// empty ring (see `journal_admit`); one that cannot take it is failed
    /// and left out.
    fn admit_targets(&self, new: &mut Vec<Target>) {
        let mut kept = Vec::new();
        for t in new.drain(..) {
            match self.journal_admit(&t.member) {
                Ok(()) => kept.push(t),
                Err(e @ ArrayError::Member { .. }) => {
                    let slot = t.ticket.slot;
                    self.fail_slot_if(slot, &t.member, &format!("journal write failed: {e}"));
                    self.rebuild_ended_by(&t.ticket, &t.member, &e);
                }
                // The array's own (beyond its redundancy): the new member
                // is not to blame.
                Err(e) => self.rebuild_ended_by(&t.ticket, &t.member, &e),
            }
        }
        *new = kept;
    }

    /// Members whose every row is in sync now: flushed, then marked so,
    /// and out of the pass (one that fails at it stays, for the pass's
    /// end to account for).
    fn finish_synced(&self, pass: &mut Pass<'_>) -> Result<()> {
        let total = self.geo.rows();
        let mut i = 0;
        while i < pass.targets.len() {
            let t = &pass.targets[i];
            if !t.slot(self).sync_full(total) {
                i += 1;
                continue;
            }
            self.flush_before_saving(std::slice::from_ref(t))?;
            // Every row saved as in sync before the member is: from the
            // moment it is, writes take no journal record, and until the
            // metadata on disk says so a crash would take it back to the
            // row last saved and rebuild the rows after it from stripes
            // those writes may have torn (`readable_after_a_crash`).
            self.checkpoint_rebuilds(&[(t.ticket, total)]);
            // Records placed during the rebuild have no copy on it.
            self.journal_in_sync(|| self.finish_rebuild(&t.ticket, t.copied))?;
            pass.finished += 1;
            let t = pass.targets.remove(i);
            tracing::info!(array = %self.name, slot = t.ticket.slot, rows_copied = t.copied, rows = total, "rebuild finished");
        }
        Ok(())
    }

    /// Members whose slot no longer holds them (failed, or replaced) leave
    /// the pass; the others go on. A failed one's end is recorded; the
    /// first one's error is the pass's if no member is finished by it.
    fn drop_superseded(&self, pass: &mut Pass<'_>) {
        let (gone, kept): (Vec<Target>, Vec<Target>) = std::mem::take(&mut pass.targets)
            .into_iter()
            .partition(|t| !t.holds(self));
        pass.targets = kept;
        for t in gone {
            let superseded = self.superseded(t.ticket.slot);
            if t.slot(self).state() == SlotState::Failed {
                let e = ArrayError::Invalid("it failed while it was being rebuilt".into());
                self.rebuild_ended_by(&t.ticket, &t.member, &e);
            } else {
                self.rebuild_ended_by(&t.ticket, &t.member, &superseded);
            }
            pass.dropped.get_or_insert(superseded);
        }
    }

    /// The cursor past the last row: members that joined the pass late go
    /// on from row 0 (their rows before it are still to do). Their rows
    /// in sync stay the same (`[from, rows)`), so no lock is needed.
    fn wrap_pass(&self, pass: &mut Pass<'_>) -> Result<()> {
        for t in pass.targets.iter_mut().filter(|t| t.joined && !t.wrapped) {
            self.advance_rebuild(&t.ticket, WRAPPED)?;
            t.wrapped = true;
        }
        pass.cursor = 0;
        Ok(())
    }

    /// A pass that ended with `e`: each member's end recorded: one failed
    /// (by `e` if it is about that member), one superseded (a rebuild of
    /// its new member follows), or, where `e` is about none of them, the
    /// array unable to rebuild (blocked until membership changes).
    /// Members the error was not about keep their positions for the next
    /// pass.
    fn pass_ended_by(&self, targets: &[Target], e: &ArrayError) {
        let about_one = targets.iter().any(|t| !t.holds(self));
        for t in targets {
            let failed = self.slots[t.ticket.slot].state() == SlotState::Failed;
            let its_own =
                matches!(e, ArrayError::Member { member, .. } if member == t.member.identity());
            if failed && !its_own {
                let other = ArrayError::Invalid("it failed while it was being rebuilt".into());
                self.rebuild_ended_by(&t.ticket, &t.member, &other);
            } else if failed || !about_one {
                self.rebuild_ended_by(&t.ticket, &t.member, e);
            } else if !t.holds(self) {
                tracing::warn!(array = %self.name, slot = t.ticket.slot, "{}", self.superseded(t.ticket.slot));
            } else if let Err(e) = self.save_positions(std::slice::from_ref(t)) {
                tracing::warn!(array = %self.name, slot = t.ticket.slot, "saving the rebuild's position: {e}");
            }
        }
    }

    /// Records why a rebuild ended with an error, once: its own member
    /// failed (the slot is failed now: a new member is needed), it was
    /// superseded (a rebuild for the new member follows), or the array lost
    /// what it rebuilds from (blocked until membership changes, so no retry
    /// storm).
    fn rebuild_ended_by(
        &self,
        t: &rebuild_ticket::RebuildTicket,
        target: &MemberRef,
        e: &ArrayError,
    ) {
        let s = &self.slots[t.slot];
        if matches!(
            e,
            ArrayError::Refused {
                rule: Rule::Superseded,
                ..
            }
        ) {
            tracing::warn!(array = %self.name, slot = t.slot, "{e}");
        } else if s.state() == SlotState::Failed {
            let mut meta = self.meta.lock();
            self.record(
                &mut meta,
                ArrayEvent::RebuildFailed {
                    slot: t.slot,
                    reason: format!(
                        "{e}; the new member {} is failed: replace it",
                        target.identity()
                    ),
                },
            );
        } else {
            self.rebuild_blocked(t, &e.to_string());
        }
    }

    /// Flushes (`flush_before_saving`), then saves where each member is in
    /// sync (once, for all).
    fn save_positions(&self, targets: &[Target]) -> Result<()> {
        let prefixes: Vec<u64> = targets
            .iter()
            .map(|t| t.slot(self).prefix_in_sync())
            .collect();
        self.flush_before_saving(targets)?;
        let flushed: Vec<_> = targets.iter().map(|t| t.ticket).zip(prefixes).collect();
        self.checkpoint_rebuilds(&flushed);
        Ok(())
    }

    /// Makes durable what the metadata is about to call in sync: the rows
    /// the `targets` were written (a member whose flush fails is failed),
    /// and what they were computed from, on every other member present. A
    /// write to a stripe whose parity is all missing takes no journal
    /// record (`Array::data_alone`) and may still be in its drive's cache
    /// when a rebuild reads it; were the metadata saved, on some members,
    /// before that drive flushed, a power cut would take the write back
    /// while the parity computed from it stayed, called in sync, and a
    /// member lost later would be rebuilt from it wrong (with a RAID6 still
    /// missing its other parity member, the resync that would repair it
    /// waits for that member's rebuild). One flush per member per save:
    /// every `checkpoint_bytes` or `checkpoint_every`. Those others are
    /// flushed as a client's flush does (`flush_present`): one that errs
    /// is failed, and past its redundancy the array's error is returned.
    fn flush_before_saving(&self, targets: &[Target]) -> Result<()> {
        for t in targets {
            t.member.flush().map_err(|e| {
                self.fail_slot_if(t.ticket.slot, &t.member, &format!("flush failed: {e}"));
                ArrayError::Member {
                    member: t.member.identity().into(),
                    source: e,
                }
            })?;
        }
        let others: Vec<usize> = (self.present_slots().into_iter())
            .filter(|&i| targets.iter().all(|t| t.ticket.slot != i))
            .collect();
        self.flush_slots(&others, false)
    }
}

#[cfg(test)]
mod tests;
