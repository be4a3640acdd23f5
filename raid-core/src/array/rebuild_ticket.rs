//! The membership side of a rebuild: the ticket a rebuild works under
//! (the slot and the member it was for), and every change a rebuild makes
//! to who is in sync where, each under the metadata lock and only while
//! the slot still holds the ticket's member.

use super::membership::{refuse, Rule};
use super::*;

/// What a rebuild works for: the slot, and the member uuid the slot held
/// when the rebuild began.
#[derive(Clone, Copy, Debug)]
pub(super) struct RebuildTicket {
    pub slot: usize,
    member_uuid: Uuid,
    /// The slot's incarnation: a fail and re-add of the same member (same
    /// uuid) starts a new one, and this rebuild must not finish it.
    incarnation: u64,
}

impl Array {
    /// The ticket of a rebuild of `slot`, which must be rebuilding.
    pub(super) fn rebuild_ticket(&self, slot: usize) -> Result<RebuildTicket> {
        let _meta = self.meta.lock();
        let s = self
            .slots
            .get(slot)
            .ok_or_else(|| ArrayError::Invalid(format!("no slot {slot}")))?;
        if s.state() != SlotState::Rebuilding || s.member.read().is_none() {
            return Err(refuse(
                Rule::WrongSlotState,
                format!(
                    "{} is {}, not rebuilding",
                    self.slot_name(slot),
                    s.state().name()
                ),
            ));
        }
        Ok(RebuildTicket {
            slot,
            member_uuid: *s.uuid.read(),
            incarnation: s.incarnation.load(Ordering::Acquire),
        })
    }

    pub(super) fn ticket_holds(&self, t: &RebuildTicket) -> Result<()> {
        let s = &self.slots[t.slot];
        if s.state() == SlotState::Rebuilding
            && *s.uuid.read() == t.member_uuid
            && s.incarnation.load(Ordering::Acquire) == t.incarnation
        {
            Ok(())
        } else {
            Err(self.superseded(t.slot))
        }
    }

    /// Why a rebuild of `slot` stops when the slot no longer holds its
    /// member: failed (a new member is needed), or given another (whose
    /// own rebuild follows).
    pub(super) fn superseded(&self, slot: usize) -> ArrayError {
        let what = match self.slots[slot].state() {
            SlotState::Failed => "failed while it was being rebuilt: this rebuild stops; replace the member to rebuild the slot",
            _ => "was given another member while it was being rebuilt: this rebuild stops; one for the new member follows",
        };
        refuse(Rule::Superseded, format!("{} {what}", self.slot_name(slot)))
    }

    /// Moves the rebuilt position of the ticket's slot to `row` (with
    /// `sync::WRAPPED` once past the last row), if the slot still holds the
    /// ticket's member. Callers hold the rows' stripe locks, or marked
    /// every one of them rebuilt (`mark_rebuilt`).
    pub(super) fn advance_rebuild(&self, t: &RebuildTicket, row: u64) -> Result<()> {
        let _meta = self.meta.lock();
        self.ticket_holds(t)?;
        self.slots[t.slot].rebuild_row.store(row, Ordering::Release);
        Ok(())
    }

    /// A batch of the ticket's slot begins: runs from `runs`' rows, none
    /// of their rows written yet (`sync::Ahead`).
    pub(super) fn begin_rebuilt_ahead(
        &self,
        t: &RebuildTicket,
        runs: impl ExactSizeIterator<Item = u64>,
    ) {
        let _meta = self.meta.lock();
        if self.ticket_holds(t).is_ok() {
            self.slots[t.slot].ahead.begin(runs);
        }
    }

    /// The run of the ticket's slot that begins at `lo` wrote every row
    /// below `upto` of its member, if the slot still holds the ticket's
    /// member: those rows are in sync from now on. Callers hold the rows'
    /// stripe locks, and the writes completed.
    pub(super) fn mark_rebuilt(&self, t: &RebuildTicket, lo: u64, upto: u64) {
        let _meta = self.meta.lock();
        if self.ticket_holds(t).is_ok() {
            self.slots[t.slot].ahead.wrote(lo, upto);
        }
    }

    /// A rebuild pass under way at `row` takes `slot` on: its ticket, if the
    /// slot is rebuilding, its rebuild may run now, and nothing of it is in
    /// sync yet. It is then rebuilt from `row` (`sync.rs`).
    pub(super) fn join_rebuild(&self, slot: usize, row: u64) -> Option<RebuildTicket> {
        let _meta = self.meta.lock();
        let s = &self.slots[slot];
        let epoch = self.epoch.load(Ordering::Acquire);
        if s.state() != SlotState::Rebuilding
            || s.member.read().is_none()
            || s.rebuild_failed_epoch.load(Ordering::Acquire) == epoch
            || !s.sync_empty()
        {
            return None;
        }
        // The start first, then the position: every state between is an
        // empty range (see sync.rs); no rows ahead of it.
        s.ahead.clear();
        s.rebuild_from.store(row, Ordering::Release);
        s.rebuild_row.store(row, Ordering::Release);
        Some(RebuildTicket {
            slot,
            member_uuid: *s.uuid.read(),
            incarnation: s.incarnation.load(Ordering::Acquire),
        })
    }

    /// Saves rebuilt positions in the metadata (a restart resumes from
    /// them): each ticket's slot, flushed after every row below its
    /// `prefix` was written, may say so from now on, if it still holds
    /// the ticket's member (a slot failed or replaced since is left as
    /// it is: its new rebuild starts at row 0).
    pub(super) fn checkpoint_rebuilds(&self, flushed: &[(RebuildTicket, u64)]) {
        let mut meta = self.meta.lock();
        for (t, prefix) in flushed {
            if self.ticket_holds(t).is_ok() {
                self.slots[t.slot].flushed_to(*prefix);
            }
        }
        self.persist(&mut meta);
    }

    /// Marks the ticket's member in sync: only if the slot still holds it.
    pub(super) fn finish_rebuild(&self, t: &RebuildTicket, rows_copied: u64) -> Result<()> {
        let mut meta = self.meta.lock();
        self.ticket_holds(t)?;
        let s = &self.slots[t.slot];
        // rebuild_row stays at the end (every row in sync): a writer that
        // read the state as Rebuilding just before this reads the row next,
        // and must find its row readable. Resetting it to 0 here made such
        // a writer skip the member it had just been rebuilt onto.
        s.set_state(SlotState::Active);
        s.resync_dirty_below.store(0, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.record(
            &mut meta,
            ArrayEvent::RebuildFinished {
                slot: t.slot,
                rows_copied,
                rows: self.geo.rows(),
            },
        );
        self.persist(&mut meta);
        Ok(())
    }

    /// Records that the ticket's rebuild failed for a reason other than its
    /// own member (the array lost a source): it is not tried again until
    /// membership changes, so a failed array cannot start a retry storm.
    pub(super) fn rebuild_blocked(&self, t: &RebuildTicket, reason: &str) {
        let mut meta = self.meta.lock();
        let s = &self.slots[t.slot];
        let epoch = self.epoch.load(Ordering::Acquire);
        if s.rebuild_failed_epoch.swap(epoch, Ordering::AcqRel) != epoch {
            self.record(
                &mut meta,
                ArrayEvent::RebuildFailed {
                    slot: t.slot,
                    reason: reason.into(),
                },
            );
        }
    }

    /// The first slot whose rebuild is pending and may run now: rebuilding,
    /// and not blocked at the current membership epoch.
    pub fn rebuild_wanted(&self) -> Option<usize> {
        self.rebuilds_wanted().first().copied()
    }

    /// Every slot whose rebuild is pending and may run now.
    pub fn rebuilds_wanted(&self) -> Vec<usize> {
        let epoch = self.epoch.load(Ordering::Acquire);
        (0..self.slots.len())
            .filter(|&i| {
                let s = &self.slots[i];
                s.state() == SlotState::Rebuilding
                    && s.rebuild_failed_epoch.load(Ordering::Acquire) != epoch
            })
            .collect()
    }

    /// Whether a rebuild is pending but cannot run (the array lost what it
    /// would rebuild from).
    pub fn rebuild_stalled(&self) -> bool {
        let epoch = self.epoch.load(Ordering::Acquire);
        self.slots.iter().any(|s| {
            s.state() == SlotState::Rebuilding
                && s.rebuild_failed_epoch.load(Ordering::Acquire) == epoch
        })
    }
}
