//! Members failing: by an I/O error or by the operator's `fail`, and what
//! makes a failure safe to record. Part of membership (`membership.rs`):
//! the same `meta` lock, the same check, apply, persist.
//!
//! A failure is written to the metadata only once the writes made while the
//! array was whole are durable on the survivors (see `persist_failure`):
//! from then on a start finds the array degraded, and a degraded start
//! cannot repair a stripe a crash tore.

use super::membership::{refuse, Guard};
use super::*;

impl Array {
    /// Applies a failure (no check: a member that errs is failed whatever
    /// the state). The caller persists.
    pub(super) fn fail_locked(&self, meta: &mut Meta, slot: usize, reason: &str) {
        let s = &self.slots[slot];
        if s.state() == SlotState::Failed {
            return;
        }
        let was_ok = self.within_redundancy();
        let last = s.state() == SlotState::Active
            && self
                .slots
                .iter()
                .enumerate()
                .all(|(i, o)| i == slot || o.state() == SlotState::Failed);
        if last {
            meta.last_standing = Some(slot);
        }
        s.left_events
            .store(s.member_events.load(Ordering::Acquire), Ordering::Release);
        s.clear_vacancy();
        s.set_state(SlotState::Failed);
        s.incarnation.fetch_add(1, Ordering::AcqRel);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let member = s.identity();
        tracing::error!(array = %self.name, slot, member = %member, reason, "member failed");
        self.record(
            meta,
            ArrayEvent::MemberFailed {
                slot,
                member,
                uuid: *s.uuid.read(),
                reason: reason.into(),
            },
        );
        if !self.within_redundancy() {
            if was_ok {
                self.record(meta, ArrayEvent::ArrayFailed);
            }
        } else {
            self.record(meta, ArrayEvent::ArrayDegraded);
        }
    }

    /// Marks a slot failed, for ever (until rebuilt): recorded in the
    /// metadata of every other member, durably, before this returns. For
    /// members that err: never refused.
    pub fn fail_slot(&self, slot: usize, reason: &str) {
        let mut meta = self.meta.lock();
        if self.slots[slot].state() == SlotState::Failed {
            return;
        }
        self.fail_and_persist(&mut meta, slot, reason);
    }

    /// Looks at each member file (one fstat each) for what can happen to
    /// it underneath the array. One that shrank under the part the array
    /// uses (truncated) is failed: a read past its new end comes back short
    /// and fails it by itself, but a write there first grows the file
    /// again with a hole, whose zeros later reads return with no error at
    /// all. Returns the slots (not failed) whose file was deleted while in
    /// use: it serves on through its open file, but the next start will
    /// not find it (the daemon warns, once per member). The daemon asks
    /// this every few hundred milliseconds.
    pub fn check_member_files(&self) -> Vec<(usize, MemberRef)> {
        let used = self.data_offset + self.geo.member_size;
        let handles = self.member_handles();
        let mut deleted = Vec::new();
        for (i, m) in handles.iter().enumerate() {
            if self.slots[i].state() == SlotState::Failed {
                continue;
            }
            let Some(Ok(now)) = m.file_now() else {
                continue;
            };
            if now.len < used {
                self.fail_slot_if(
                    i,
                    m,
                    &format!("the device shrank to {} bytes, under the {used} the array uses (truncated underneath it?)", now.len),
                );
            } else if !now.linked {
                deleted.push((i, m.clone()));
            }
        }
        deleted
    }

    /// Fails `slot` and makes the failure durable (`persist_failure`).
    ///
    /// Metadata goes to the members not failed, so the failure of the last
    /// of them (a mirror's last copy, failed with `--force` or by an error)
    /// would be recorded nowhere: the next start would find that member's
    /// own metadata naming it in sync and take it back without a word,
    /// though the operator was told a forced start undoes the failure. So
    /// the last member records its own failure, where it still takes a
    /// write: a start then refuses the array as failed, and `start --force`
    /// takes that member back as the newest failed one (its own slot failed
    /// in its own metadata says that: nothing else writes a failed slot's
    /// member). Only the last (`fail_locked` names it, here `slot` or one
    /// whose flush failed after it): where two fail together, the one
    /// failed first may miss writes the other acknowledged after it, and
    /// must not carry the newest metadata. Only one in sync: a member being
    /// rebuilt keeps its own metadata's word that it holds part of the data.
    fn fail_and_persist(&self, meta: &mut Guard<'_>, slot: usize, reason: &str) {
        // One a metadata write failed earlier took no record (it erred).
        meta.last_standing = None;
        self.fail_locked(meta, slot, reason);
        self.persist_failure(meta);
        let Some(slot) = meta.last_standing.take() else {
            return;
        };
        let s = &self.slots[slot];
        let Some(m) = s.member.read().clone() else {
            return;
        };
        let sb = self.superblock(meta, slot as u32, *s.uuid.read());
        match metadata::write_superblock(m.as_ref(), &sb) {
            Ok(()) => s.member_events.store(sb.events, Ordering::Release),
            Err(e) => tracing::warn!(
                array = %self.name,
                slot,
                member = m.identity(),
                "the last member cannot record its own failure ({e}): a start may take it back unasked"
            ),
        }
    }

    /// Persists a failure, after the parity writes in flight without a
    /// journal record have finished and every surviving member is flushed.
    ///
    /// Writes acknowledged while the array was whole went to every member
    /// without a journal record; until they are flushed a crash can tear
    /// their stripes, which the bitmap's resync repairs only while every
    /// member is there. Once a failure is durable the next start is
    /// degraded and cannot repair them (the write hole), so those writes
    /// must be durable first: flush, then write the failure.
    fn persist_failure(&self, meta: &mut Guard<'_>) {
        self.quiesce_survivors(meta);
        self.persist(meta);
    }

    /// Waits for the parity writes in flight that were planned while the
    /// failed members looked readable (they carry no journal record; later
    /// ones see the failure), then flushes every member not failed. A flush
    /// that fails is a failure too, so it goes round again until a round
    /// fails nobody.
    pub(super) fn quiesce_survivors(&self, meta: &mut Meta) {
        loop {
            self.unjournaled.drain();
            let mut failed = false;
            for (i, s) in self.slots.iter().enumerate() {
                if s.state() == SlotState::Failed {
                    continue;
                }
                if let Some(m) = s.member.read().clone() {
                    if let Err(e) = m.flush() {
                        self.fail_locked(meta, i, &format!("flush failed: {e}"));
                        failed = true;
                    }
                }
            }
            if !failed {
                return;
            }
        }
    }

    /// Fails `slot` for an error of the device `m`, only if the slot still
    /// holds that device: an error from a device that was replaced since
    /// (a stale handle) must not fail its successor. A hot replace's pair
    /// counts as its old device (see `hot_replace`).
    pub(super) fn fail_slot_if(&self, slot: usize, m: &MemberRef, reason: &str) {
        // By device, not by handle: the same device behind a handle taken
        // before a hot replace's pair was dropped is still this member; a
        // device that was replaced since is not.
        self.fail_if_held(slot, reason, |cur| cur.device_key() == m.device_key());
    }

    /// Fails `slot` (durably, as `fail_slot` does) if its member passes
    /// `held`, it is not failed already and the array is not closed (a late
    /// error then writes nothing: the array may be assembled again
    /// meanwhile). Returns whether it failed it.
    fn fail_if_held(&self, slot: usize, reason: &str, held: impl Fn(&MemberRef) -> bool) -> bool {
        let mut meta = self.meta.lock();
        let Some(s) = self.slots.get(slot) else {
            return false;
        };
        let holds = s.member.read().as_ref().is_some_and(held);
        if !holds || s.state() == SlotState::Failed || self.closed.load(Ordering::Acquire) {
            return false;
        }
        self.fail_and_persist(&mut meta, slot, reason);
        true
    }

    /// Fails `slot` for an error `m` gave outside the array's own I/O (the
    /// daemon's probe of a network member: a read of its metadata block
    /// every few seconds, so that a host gone while the array sat idle is
    /// found then, not at the next request). Only if the slot still holds
    /// that very handle (not the same device re-added since under a new
    /// one) and the array is not closed. Returns whether it failed it.
    pub fn fail_probed(&self, slot: usize, m: &MemberRef, reason: &str) -> bool {
        self.fail_if_held(slot, reason, |cur| Arc::ptr_eq(cur, m))
    }

    /// Marks the array closed without `close`'s flush and clean mark: for
    /// a failed array the daemon stops all the same. Nothing then fails a
    /// member or writes its metadata for a late error (see `closed`).
    pub fn retire(&self) {
        let _meta = self.meta.lock();
        self.closed.store(true, Ordering::Release);
    }

    /// The operator's `fail`: refused when the member is already failed, or
    /// when it would leave the array without its data, unless `force`.
    pub fn fail_member(&self, slot: usize, force: bool) -> Result<usize> {
        let mut meta = self.meta.lock();
        let s = self
            .slots
            .get(slot)
            .ok_or_else(|| ArrayError::Invalid(format!("no slot {slot}")))?;
        let who = self.slot_name(slot);
        if s.state() == SlotState::Failed {
            return Err(refuse(
                Rule::AlreadyFailed,
                format!("{who} is already failed"),
            ));
        }
        let would_fail = self.within_redundancy() && !self.within_redundancy_without(Some(slot));
        if would_fail && !force {
            let down: Vec<usize> = (0..self.slots.len())
                .filter(|&i| self.slots[i].state() != SlotState::Active)
                .collect();
            // RAID10 loses data when every copy of a chunk is down, not by
            // a count: name the slots, already down, that hold the other
            // copies of this one's chunks.
            let why = match self.geo.level {
                Level::Raid10 => {
                    let mut partners: Vec<usize> = (0..self.geo.members as u64)
                        .map(|c| self.geo.chunk_copies(c))
                        .filter(|copies| copies.iter().any(|p| p.member == slot))
                        .flat_map(|copies| copies.into_iter().map(|p| p.member))
                        .filter(|m| *m != slot && down.contains(m))
                        .collect();
                    partners.sort_unstable();
                    partners.dedup();
                    format!(
                        "it holds the only copy left of chunks whose other copy is on slot{} {}, already down",
                        if partners.len() == 1 { "" } else { "s" },
                        partners.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
                    )
                }
                l => format!(
                    "{l} tolerates {} lost member(s) and {} already down",
                    l.tolerated_failures(self.geo.members),
                    down.len()
                ),
            };
            return Err(refuse(
                Rule::WouldLoseData,
                format!(
                    "failing {who} would leave '{}' without its data: {why}. If the drive is really gone, add --force (the array then stops serving I/O)",
                    self.name,
                ),
            ));
        }
        let why = if would_fail {
            "failed by operator (forced past redundancy)"
        } else {
            "failed by operator"
        };
        self.fail_and_persist(&mut meta, slot, why);
        Ok(slot)
    }
}
