//! Membership: who is in the array, and every change to it.
//!
//! One owner, one lock. Every change (a member failing, the operator's
//! fail, remove, add, replace, a spare taking a slot, a rebuild advancing
//! and finishing, forced assembly) is made here, under the `meta` lock, in
//! three steps that nothing can interleave with:
//!
//! 1. **check** the change against the current state: a refusal is
//!    `ArrayError::Refused`, naming the `Rule` that refused it and the fix;
//! 2. **apply** it to the slots and bump the membership epoch;
//! 3. **persist** it: the metadata goes to every member that is not failed
//!    (and the spares) before the lock is released.
//!
//! The data path reads slot states without this lock (atomics), so a
//! failure is visible to writers a moment before it is durable. `flush`
//! closes that gap: it takes this lock after flushing the members, so it
//! returns only once every failure a write acted on is on disk.
//!
//! Background work holds a ticket naming the member it works for. A
//! rebuild advances and finishes only while its slot still holds the member
//! it started with (a fresh member uuid is drawn at every replace), so a
//! member failed or replaced under a running rebuild is never marked in
//! sync by it. Scrub reads the epoch before and after each batch: a batch
//! that saw any membership change is dropped, never repaired from.
//!
//! Failures (by I/O error or the operator) are in `failing.rs`; taking
//! back a member that left its slot, in `re_add.rs`.
//!
//! Lock order: stripe locks, then `meta`. Nothing here takes a stripe lock.

use super::*;
use crate::member::DeviceKey;
use parking_lot::MutexGuard;

/// The rules a membership change must pass. Each refusal names one, so the
/// operator (and a test) can tell which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The change would leave the array without its data (more members
    /// down than the level tolerates). `--force` overrides.
    WouldLoseData,
    /// The device is already in this array (same file or device, by
    /// identity, whatever path names it).
    AlreadyMember,
    /// No slot or spare holds this member.
    NotAMember,
    /// The member is already failed.
    AlreadyFailed,
    /// The slot is not in the state the change needs (replace needs a
    /// failed slot; remove needs a failed member or a spare).
    WrongSlotState,
    /// The level has no redundancy to rebuild from (RAID0).
    NoRedundancy,
    /// The array has failed: nothing can be rebuilt until enough members
    /// are back (`start --force`).
    ArrayFailed,
    /// The device is smaller than a member of this array must be.
    TooSmall,
    /// Every spare place in the metadata is taken.
    TooManySpares,
    /// The work (a rebuild) was for a member the slot no longer holds.
    Superseded,
    /// The device is not a member that left this array's slot (another
    /// array's, or its slot was given to another device since).
    NotReAddable,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::WouldLoseData => "would-lose-data",
            Rule::AlreadyMember => "already-a-member",
            Rule::NotAMember => "not-a-member",
            Rule::AlreadyFailed => "already-failed",
            Rule::WrongSlotState => "wrong-slot-state",
            Rule::NoRedundancy => "no-redundancy",
            Rule::ArrayFailed => "array-failed",
            Rule::TooSmall => "too-small",
            Rule::TooManySpares => "too-many-spares",
            Rule::Superseded => "superseded",
            Rule::NotReAddable => "not-re-addable",
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a RAID0 takes no spare: a failed member loses the array's data,
/// and nothing can be rebuilt onto a spare.
pub(super) const RAID0_SPARE: &str =
    "RAID0 has no redundancy: a member that fails takes the array's data with it, and nothing can be rebuilt onto a spare. Keep the device for another array";

pub(super) fn refuse(rule: Rule, detail: String) -> ArrayError {
    ArrayError::Refused { rule, detail }
}

pub(super) type Guard<'a> = MutexGuard<'a, Meta>;

impl Array {
    /// The membership epoch: bumped by every change of who is in the array
    /// or in which state. Background work compares it across a step.
    pub fn membership_epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether the array still serves every byte with `also_down` out as
    /// well as the slots already down (`Geometry::serves_all_without`).
    pub(super) fn within_redundancy_without(&self, also_down: Option<usize>) -> bool {
        self.serves_all_without(also_down.as_slice())
    }

    /// Whether the array would still serve every byte with `slots` out as
    /// well as the slots down now (a stop's members whose files were
    /// deleted: `check_member_files`).
    pub fn serves_all_without(&self, slots: &[usize]) -> bool {
        // Inline, not on the heap: asked at every write's start.
        let down: crate::layout::PerMember<bool> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| s.state() != SlotState::Active || slots.contains(&i))
            .collect();
        self.geo.serves_all_without(&down)
    }

    /// The slot whose member is the device `key`.
    pub fn slot_by_key(&self, key: DeviceKey) -> Option<usize> {
        self.slots.iter().position(|s| {
            s.member
                .read()
                .as_ref()
                .is_some_and(|m| m.device_key() == key)
        })
    }

    /// The device in `slot`, if any.
    pub fn member_of(&self, slot: usize) -> Option<MemberRef> {
        self.slots.get(slot)?.member.read().clone()
    }

    /// Whether `key` is a member or a spare of this array.
    pub fn holds(&self, key: DeviceKey) -> bool {
        self.slot_by_key(key).is_some()
            || self.is_replacement(key)
            || self
                .meta
                .lock()
                .spares
                .iter()
                .any(|(_, m)| m.device_key() == key)
    }

    /// The device keys of every member and spare.
    pub fn device_keys(&self) -> Vec<DeviceKey> {
        let mut keys: Vec<DeviceKey> = self
            .slots
            .iter()
            .filter_map(|s| s.member.read().as_ref().map(|m| m.device_key()))
            .collect();
        keys.extend(self.meta.lock().spares.iter().map(|(_, m)| m.device_key()));
        keys
    }

    pub(super) fn check_new_device(&self, meta: &Meta, m: &MemberRef) -> Result<()> {
        let key = m.device_key();
        if self.is_replacement(key) {
            return Err(refuse(
                Rule::AlreadyMember,
                format!(
                    "{} is being copied to as the replacement of a member of '{}'",
                    m.identity(),
                    self.name
                ),
            ));
        }
        if let Some(slot) = self.slot_by_key(key) {
            return Err(refuse(
                Rule::AlreadyMember,
                format!(
                    "{} is the member of slot {slot} of '{}' (the same {key}, whatever its path): name a device that is in no array",
                    m.identity(),
                    self.name
                ),
            ));
        }
        if meta.spares.iter().any(|(_, s)| s.device_key() == key) {
            return Err(refuse(
                Rule::AlreadyMember,
                format!(
                    "{} is already a spare of '{}' (the same {key})",
                    m.identity(),
                    self.name
                ),
            ));
        }
        self.not_a_member_by_metadata(meta, m)?;
        self.not_the_hot_replacement_by_content(m)?;
        let need = self.data_offset + self.geo.member_size;
        if m.size() < need {
            return Err(refuse(
                Rule::TooSmall,
                format!(
                    "{} is {} bytes; each member of '{}' needs {need} ({} of metadata and journal, then {} of data): use a device at least that large",
                    m.identity(),
                    m.size(),
                    self.name,
                    self.data_offset,
                    self.geo.member_size
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a device whose own metadata says it is a member or spare of
    /// this array in use now: the same device under another name, which
    /// its device key cannot tell where the device is on another host (one
    /// export by two URIs: another host name or address, a socket). Taken
    /// in as a new device it would be written over, and with it the member
    /// it is. A copy of a member (an image, a dd) looks the same and is
    /// refused too: its metadata must go before it is reused.
    fn not_a_member_by_metadata(&self, meta: &Meta, m: &MemberRef) -> Result<()> {
        let Ok(sb) = metadata::read_superblock(m.as_ref()) else {
            return Ok(());
        };
        if sb.array_uuid != self.uuid {
            return Ok(());
        }
        let as_slot = self
            .slots
            .iter()
            .position(|s| s.state() != SlotState::Failed && *s.uuid.read() == sb.member_uuid);
        let spare = meta.spares.iter().find(|(u, _)| *u == sb.member_uuid);
        let what = match (as_slot, spare) {
            (Some(slot), _) => format!("the member of {}", self.slot_name(slot)),
            (None, Some((_, s))) => format!("spare {}", s.identity()),
            (None, None) => return Ok(()),
        };
        Err(refuse(
            Rule::AlreadyMember,
            format!(
                "{} carries the metadata of {what} of '{}', in the array now (member uuid {}): it is that device under another name (the same export by another URI?) or a copy of it. Name a device that is in no array; a copy whose data is not wanted must have its metadata erased first",
                m.identity(),
                self.name,
                sb.member_uuid
            ),
        ))
    }

    // ---- persist ----------------------------------------------------------

    /// Bumps the event counter and writes metadata to every member that is
    /// not failed, and to the spares. A member that cannot take its metadata
    /// is failed, and the round repeats so the survivors record that.
    pub(super) fn write_metadata(&self) {
        let mut meta = self.meta.lock();
        self.persist(&mut meta);
    }

    pub(super) fn persist(&self, meta: &mut Guard<'_>) {
        self.persist_from(meta, None)
    }

    /// `persist`, writing slot `first`'s member before the others: a member
    /// that just took a slot over (a hot replace's switch) must hold the
    /// metadata that names it before the others say it is the member, or a
    /// crash in between leaves them naming a device that does not know it
    /// belongs (and the device that held the slot refused as replaced).
    pub(super) fn persist_from(&self, meta: &mut Guard<'_>, first: Option<usize>) {
        let order: Vec<usize> = first
            .into_iter()
            .chain((0..self.slots.len()).filter(|&i| Some(i) != first))
            .collect();
        // The rows the metadata will say: read before it is written (they
        // only grow while it is, `meta` held), made durable by the round.
        let saved: Vec<u64> = self.slots.iter().map(|s| s.saved_row()).collect();
        'round: loop {
            meta.events += 1;
            for &i in &order {
                let s = &self.slots[i];
                if s.state() == SlotState::Failed {
                    continue;
                }
                let Some(m) = s.member.read().clone() else {
                    continue;
                };
                let sb = self.superblock(meta, i as u32, *s.uuid.read());
                if let Err(e) = metadata::write_superblock(m.as_ref(), &sb) {
                    // A new failure: like any, only after the survivors
                    // hold every write made while it looked readable.
                    self.fail_locked(meta, i, &format!("metadata write failed: {e}"));
                    self.quiesce_survivors(meta);
                    continue 'round;
                }
                s.member_events.store(sb.events, Ordering::Release);
            }
            let mut dropped = false;
            for (u, m) in meta.spares.clone() {
                let sb = self.superblock(meta, ROLE_SPARE, u);
                if let Err(e) = metadata::write_superblock(m.as_ref(), &sb) {
                    let at = meta.spares.iter().position(|(x, _)| *x == u);
                    let at = at.expect("a spare of this round");
                    self.drop_spare(meta, at, &m, format!("metadata write failed: {e}"));
                    dropped = true;
                }
            }
            if dropped {
                // The members' metadata just written names it as a spare,
                // which a start would take back: written again without it
                // (each round more drops one more spare, so this ends).
                continue 'round;
            }
            // Every member not failed now holds this event: the next
            // change's metadata says so (a crash in this one may have left
            // a member a round or two behind, and that is no older copy).
            meta.settled = meta.events;
            for (s, row) in self.slots.iter().zip(saved) {
                s.durable_to(row);
            }
            return;
        }
    }

    /// Waits until every membership change begun so far is durable.
    pub(super) fn membership_settled(&self) {
        drop(self.meta.lock());
    }

    /// "slot 2 (/path)" or "slot 2 (missing)".
    pub(super) fn slot_name(&self, slot: usize) -> String {
        match self.slots[slot].member.read().as_ref() {
            Some(m) => format!("slot {slot} ({})", m.identity()),
            None => format!("slot {slot} (missing)"),
        }
    }

    // ---- spares, remove -----------------------------------------------------

    /// Adds a hot spare (its metadata is written now).
    pub fn add_spare(&self, m: MemberRef) -> Result<()> {
        if self.geo.level == Level::Raid0 {
            return Err(refuse(Rule::NoRedundancy, RAID0_SPARE.into()));
        }
        let mut meta = self.meta.lock();
        self.check_new_device(&meta, &m)?;
        if meta.spares.len() >= metadata::MAX_SPARES {
            return Err(refuse(
                Rule::TooManySpares,
                format!(
                    "array '{}' already has {} spares: remove one first",
                    self.name,
                    metadata::MAX_SPARES
                ),
            ));
        }
        self.blank_bitmap_of(&m)?;
        let member = m.identity().to_string();
        meta.spares.push((Uuid::random(), m));
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.record(&mut meta, ArrayEvent::SpareAdded { member });
        self.persist(&mut meta);
        Ok(())
    }

    /// Takes the spare `key` out of the array, or the failed member `key`
    /// out of its slot (the slot stays failed, waiting for a replacement).
    /// Returns the slot emptied, if a slot was.
    pub fn remove_member(&self, key: DeviceKey) -> Result<Option<usize>> {
        let mut meta = self.meta.lock();
        if let Some(at) = meta.spares.iter().position(|(_, m)| m.device_key() == key) {
            let (_, m) = meta.spares.remove(at);
            self.epoch.fetch_add(1, Ordering::AcqRel);
            let member = m.identity().to_string();
            self.record(&mut meta, ArrayEvent::SpareRemoved { member });
            self.persist(&mut meta);
            return Ok(None);
        }
        let slot = self.slot_by_key(key).ok_or_else(|| {
            refuse(
                Rule::NotAMember,
                format!("{key} is neither a member nor a spare of '{}'", self.name),
            )
        })?;
        let state = self.slots[slot].state();
        if state != SlotState::Failed {
            return Err(refuse(
                Rule::WrongSlotState,
                format!(
                    "{} is {}: fail it first (raidctl fail {} ...), which is refused if it would lose data",
                    self.slot_name(slot),
                    state.name(),
                    self.name
                ),
            ));
        }
        let member = self.slots[slot]
            .member
            .write()
            .take()
            .map_or_else(String::new, |m| m.identity().to_string());
        self.handles.put(slot, Arc::new(Absent));
        self.slots[slot]
            .vacancy
            .store(VACANT_REMOVED, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.record(&mut meta, ArrayEvent::MemberRemoved { slot, member });
        self.persist(&mut meta);
        Ok(Some(slot))
    }

    // ---- replace, spare activation -------------------------------------------

    /// Puts `new` into failed slot `slot` as a rebuilding member (in sync
    /// up to row 0). A rebuild brings it in sync.
    pub fn replace(&self, slot: usize, new: MemberRef) -> Result<()> {
        let mut meta = self.meta.lock();
        self.check_new_device(&meta, &new)?;
        self.replace_locked(&mut meta, slot, new)?;
        drop(meta);
        self.rewrite_bitmap();
        Ok(())
    }

    /// Checks and applies a replacement; `new` passed `check_new_device`
    /// (or is this array's own spare).
    pub(super) fn replace_locked(
        &self,
        meta: &mut Guard<'_>,
        slot: usize,
        new: MemberRef,
    ) -> Result<()> {
        self.replace_holding(meta, slot, new, 0)
    }

    /// `replace_locked` of a device that already holds the slot's rows
    /// below `dirty_below` but for writes it missed (each in a region the
    /// bitmap marks): they are resynced where marked, not copied whole.
    pub(super) fn replace_holding(
        &self,
        meta: &mut Guard<'_>,
        slot: usize,
        new: MemberRef,
        dirty_below: u64,
    ) -> Result<()> {
        let s = self
            .slots
            .get(slot)
            .ok_or_else(|| ArrayError::Invalid(format!("no slot {slot}")))?;
        if self.geo.level == Level::Raid0 {
            return Err(refuse(
                Rule::NoRedundancy,
                "RAID0 has no redundancy to rebuild a member from".into(),
            ));
        }
        match s.state() {
            SlotState::Failed => {}
            SlotState::Rebuilding => {
                return Err(refuse(
                    Rule::WrongSlotState,
                    format!(
                        "{} is already being rebuilt: fail that member first to put another device in its place",
                        self.slot_name(slot)
                    ),
                ))
            }
            SlotState::Active => {
                return Err(refuse(
                    Rule::WrongSlotState,
                    format!(
                        "{} is active and in sync: fail it first (raidctl fail {} ...), which keeps the array serving, degraded, until the rebuild ends",
                        self.slot_name(slot),
                        self.name
                    ),
                ))
            }
        }
        if !self.within_redundancy() {
            return Err(refuse(
                Rule::ArrayFailed,
                format!(
                    "array '{}' has failed: there is nothing to rebuild {} from. Bring the members back first (raidctl stop {n}; raidctl start {n} --force)",
                    self.name,
                    self.slot_name(slot),
                    n = self.name
                ),
            ));
        }
        let key = new.device_key();
        if let Err(e) = self.blank_bitmap_of(&new) {
            // A spare that cannot take a write is no spare: dropped, so
            // the next activation takes the next one.
            if let Some(at) = meta.spares.iter().position(|(_, m)| m.device_key() == key) {
                self.drop_spare(meta, at, &new, e.to_string());
                self.persist(meta);
            }
            return Err(e);
        }
        let ident = new.identity().to_string();
        meta.spares.retain(|(_, m)| m.device_key() != key);
        *s.uuid.write() = Uuid::random();
        self.start_rebuilding(slot, new, dirty_below);
        self.persist(meta);
        tracing::info!(array = %self.name, slot, member = %ident, "replacement member added; rebuild pending");
        Ok(())
    }

    /// Puts `m` into failed `slot` as rebuilding from row 0, a new
    /// incarnation of the slot. The row is set before the state, so a
    /// reader never sees the slot rebuilding with a stale row. Callers hold
    /// `meta` and persist.
    pub(super) fn start_rebuilding(&self, slot: usize, m: MemberRef, dirty_below: u64) {
        let s = &self.slots[slot];
        self.set_member(slot, m);
        // The position first, then the start (see sync.rs).
        s.rebuild_row.store(0, Ordering::Release);
        s.rebuild_from.store(0, Ordering::Release);
        s.rebuild_saved.store(0, Ordering::Release);
        s.rebuild_durable.store(0, Ordering::Release);
        s.ahead.clear();
        s.rebuild_failed_epoch.store(NO_EPOCH, Ordering::Release);
        s.resync_dirty_below.store(dirty_below, Ordering::Release);
        s.missed_bitmap_seq.store(0, Ordering::Release);
        s.clear_vacancy();
        s.incarnation.fetch_add(1, Ordering::AcqRel);
        s.set_state(SlotState::Rebuilding);
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Moves the first spare into failed slot `slot`, if there is one: the
    /// check and the move under one lock, so a concurrent `replace` of the
    /// same slot either wins or is refused.
    pub fn activate_spare(&self, slot: usize) -> Result<Option<String>> {
        let mut meta = self.meta.lock();
        if self.slots.get(slot).map(|s| s.state()) != Some(SlotState::Failed)
            || !self.within_redundancy()
        {
            return Ok(None);
        }
        let Some(m) = meta.spares.first().map(|(_, m)| m.clone()) else {
            return Ok(None);
        };
        let ident = m.identity().to_string();
        self.replace_locked(&mut meta, slot, m)?;
        self.record(
            &mut meta,
            ArrayEvent::SpareActivated {
                slot,
                member: ident.clone(),
            },
        );
        drop(meta);
        self.rewrite_bitmap();
        Ok(Some(ident))
    }

    /// Drops the spare at `at` of `meta.spares` (`m`, which could not be
    /// written): the next activation takes the next one, the membership
    /// epoch moves, and a warning says so.
    fn drop_spare(&self, meta: &mut Meta, at: usize, m: &MemberRef, reason: String) {
        meta.spares.remove(at);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let member = m.identity().to_string();
        self.record(meta, ArrayEvent::SpareDropped { member, reason });
    }
}

/// `rebuild_failed_epoch` when no rebuild failed.
pub(super) const NO_EPOCH: u64 = u64::MAX;
