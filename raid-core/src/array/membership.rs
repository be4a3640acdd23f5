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
//! Failures (by I/O error or the operator) are in `failing.rs`.
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
        let down: Vec<bool> = self
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
                    meta.spares.retain(|(x, _)| *x != u);
                    self.record(
                        meta,
                        ArrayEvent::SpareDropped {
                            member: m.identity().to_string(),
                            reason: format!("metadata write failed: {e}"),
                        },
                    );
                    dropped = true;
                }
            }
            if dropped {
                // The members' metadata just written names it as a spare,
                // which a start would take back: written again without it
                // (each round more drops one more spare, so this ends).
                self.epoch.fetch_add(1, Ordering::AcqRel);
                continue 'round;
            }
            // Every member not failed now holds this event: the next
            // change's metadata says so (a crash in this one may have left
            // a member a round or two behind, and that is no older copy).
            meta.settled = meta.events;
            return;
        }
    }

    /// Waits until every membership change begun so far is durable.
    pub(super) fn membership_settled(&self) {
        drop(self.meta.lock());
    }

    // ---- re-add -------------------------------------------------------------

    /// Takes back a member that left its slot briefly (failed by mistake, a
    /// cable, a reboot of its enclosure): it returns to the slot it held,
    /// as rebuilding, and its rebuild copies only the regions the
    /// write-intent bitmap marked since it left. Allowed only while its slot
    /// still waits for it (failed, not given to another device since) and
    /// the array can rebuild. Returns the slot.
    pub fn re_add(&self, m: MemberRef) -> Result<usize> {
        self.re_add_as(m, true)
    }

    /// `re_add`, refused (nothing changed) where the device is an older
    /// copy of the member, which would be copied whole: for the daemon's
    /// own re-add of a network member that answers again, which leaves
    /// such a device (a server restarted on an old image) to the operator.
    pub fn re_add_if_current(&self, m: MemberRef) -> Result<usize> {
        self.re_add_as(m, false)
    }

    fn re_add_as(&self, m: MemberRef, older_copy_ok: bool) -> Result<usize> {
        let sb = metadata::read_superblock(m.as_ref()).map_err(|e| {
            let d = m.identity();
            let n = &self.name;
            // Its slot's own device (a disk swapped behind the same path
            // or URI) must leave the slot before it can come back as new.
            let how = match self.slot_by_key(m.device_key()) {
                Some(_) => format!(
                    "to rebuild onto it whole, raidctl remove {n} {d}, then raidctl replace {n} {d} {d}"
                ),
                None => format!("put it in as a new member (raidctl replace {n} FAILED_MEMBER {d})"),
            };
            refuse(
                Rule::NotReAddable,
                format!("{d} has no readable array metadata ({e}): it cannot be re-added; {how}"),
            )
        })?;
        let own_bitmap = {
            let mut b = crate::buf::AlignedBuf::new(crate::metadata::BITMAP_BYTES);
            m.read_at(&mut b, crate::metadata::BITMAP_OFFSET)
                .map(|()| b.to_vec())
        };
        let mut meta = self.meta.lock();
        let not_ours = |why: String| refuse(Rule::NotReAddable, why);
        if sb.array_uuid != self.uuid {
            return Err(not_ours(format!(
                "{} belongs to array '{}' (uuid {}), not to '{}'",
                m.identity(),
                sb.name,
                sb.array_uuid,
                self.name
            )));
        }
        if sb.data_offset != self.data_offset {
            return Err(not_ours(format!(
                "{} puts the data of '{}' at byte {}, the array at {}: its metadata does not agree with the array's; put it in as a new member (raidctl replace)",
                m.identity(),
                self.name,
                sb.data_offset,
                self.data_offset
            )));
        }
        let need = self.data_offset + self.geo.member_size;
        if m.size() < need {
            return Err(refuse(
                Rule::TooSmall,
                format!(
                    "{} is {} bytes now, under the {need} each member of '{}' needs: it was cut short (or another device answers there); it cannot come back",
                    m.identity(),
                    m.size(),
                    self.name
                ),
            ));
        }
        if self.bitmap.is_none() {
            return Err(refuse(
                Rule::NoRedundancy,
                format!(
                    "{} keeps no write-intent bitmap: nothing to resync from",
                    self.geo.level
                ),
            ));
        }
        let slot = self
            .slots
            .iter()
            .position(|s| *s.uuid.read() == sb.member_uuid)
            .ok_or_else(|| {
                not_ours(format!(
                    "{} left '{}' and its slot was given to another device since: add it as a new member (raidctl replace or add), which copies it whole",
                    m.identity(),
                    self.name
                ))
            })?;
        let s = &self.slots[slot];
        if s.state() != SlotState::Failed {
            return Err(refuse(
                Rule::WrongSlotState,
                format!(
                    "{} is {}, not failed: there is nothing to re-add",
                    self.slot_name(slot),
                    s.state().name()
                ),
            ));
        }
        if let Some(held) = s.member.read().as_ref() {
            if held.device_key() != m.device_key() {
                return Err(not_ours(format!(
                    "slot {slot} holds {}: remove it first",
                    held.identity()
                )));
            }
        }
        if let Some(other) = self.slot_by_key(m.device_key()).filter(|&i| i != slot) {
            return Err(refuse(
                Rule::AlreadyMember,
                format!("{} is the member of slot {other}", m.identity()),
            ));
        }
        if !self.within_redundancy() {
            return Err(refuse(
                Rule::ArrayFailed,
                format!(
                    "array '{}' has failed: a re-add needs the others to resync from. raidctl stop {n}; raidctl start {n} --force takes back the newest failed members",
                    self.name,
                    n = self.name
                ),
            ));
        }
        // Only a member that was in sync when it left holds the rows no
        // write touched since: one that left mid-rebuild is copied whole,
        // and so is an older copy of it (the bitmap no longer marks what
        // was written between that copy and its leaving).
        let left = s.left_events.load(Ordering::Acquire);
        let whole = if sb
            .slots
            .get(slot)
            .is_none_or(|e| e.state != SlotState::Active)
        {
            Some("it left while being rebuilt".to_string())
        } else if left == 0 {
            Some("when it left is not recorded".to_string())
        } else if let Some(why) = (sb.events < left)
            .then(|| format!(
                "it carries metadata event {} but had taken event {left} when it left: an older copy of the member (a server restarted on an old image, a disk put back from a backup?)",
                sb.events
            ))
            .or_else(|| self.bitmap_older_than_last_clear(slot, &own_bitmap))
        {
            if !older_copy_ok {
                return Err(refuse(
                    Rule::NotReAddable,
                    format!(
                        "{} is back, but {why}: not taken back by itself. raidctl re-add {} {} copies it whole; or replace it",
                        m.identity(),
                        self.name,
                        m.identity()
                    ),
                ));
            }
            Some(why)
        } else if sb.events > left + 1 {
            // One more is a metadata write whose first copy landed as the
            // member failed; more, something else wrote to it since.
            Some(format!(
                "it carries metadata event {}, newer than the {left} it had taken when it left: something else wrote to it since (assembled elsewhere?)",
                sb.events
            ))
        } else {
            None
        };
        if let Some(why) = &whole {
            tracing::warn!(array = %self.name, slot, member = m.identity(), "re-add copies the member whole: {why}");
        }
        let ident = m.identity().to_string();
        self.start_rebuilding(slot, m, if whole.is_none() { u64::MAX } else { 0 });
        self.record(
            &mut meta,
            ArrayEvent::MemberReAdded {
                slot,
                member: ident.clone(),
                whole,
            },
        );
        // The member first: the others then name it rebuilding only once it
        // holds metadata of this change, not its older metadata, which the
        // next start would take for an older copy of it.
        self.persist_from(&mut meta, Some(slot));
        drop(meta);
        self.rewrite_bitmap();
        tracing::info!(array = %self.name, slot, member = %ident, "member re-added");
        Ok(slot)
    }

    /// Why `m`'s own write-intent bitmap says it is an older copy of itself,
    /// if it does: its stamp is from before the last write of the bitmap
    /// that cleared a bit, so it may lack writes the bitmap no longer marks
    /// (an image put back, a server restarted on an old copy of its disk:
    /// its metadata event is the same as when it left, for writes move no
    /// event). Where it cannot be read, it cannot be trusted either. Arrays
    /// whose bitmap has no room for the stamp (created before it, with more
    /// than 32640 regions) have only the event to go by.
    /// `own`: its block, as read (before `meta`: a network member may take
    /// its time).
    ///
    /// Bits are not cleared while a slot is out of sync, so the last clear
    /// is from before the member left: its own block holds it, unless the
    /// member failed on that very write (it then holds the one before, and
    /// every write the clear covered, flushed before it). Known only in
    /// this run (`Slot::missed_bitmap_seq`); after a restart such a member
    /// is copied whole.
    fn bitmap_older_than_last_clear(
        &self,
        slot: usize,
        own: &io::Result<Vec<u8>>,
    ) -> Option<String> {
        let bm = self.bitmap.as_ref().filter(|bm| bm.stamped())?;
        let (seq, _) = match own {
            Ok(b) => match super::bitmap::stamp_of(b) {
                Some(stamp) => stamp,
                None => return Some("its write-intent bitmap carries no stamp this array wrote (overwritten since it left?)".into()),
            },
            Err(e) => return Some(format!("its write-intent bitmap cannot be read ({e})")),
        };
        let cleared = bm.cleared_at();
        let missed_it = seq + 1 == cleared
            && self.slots[slot].missed_bitmap_seq.load(Ordering::Acquire) == cleared;
        (seq < cleared && !missed_it).then(|| format!(
            "its write-intent bitmap is from write {seq}, before write {cleared}, the last that cleared regions: an older copy of the member (a server restarted on an old image, a disk put back from a backup?), which may lack writes the bitmap no longer marks"
        ))
    }

    /// Whether the member being rebuilt in `slot` is resynced only where
    /// the write-intent bitmap marks writes (a re-add), not copied whole.
    pub fn resyncs_dirty_only(&self, slot: usize) -> bool {
        self.slots.get(slot).is_some_and(|s| {
            s.state() == SlotState::Rebuilding
                && s.resync_dirty_below.load(Ordering::Acquire) == u64::MAX
        })
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
                meta.spares.remove(at);
                self.epoch.fetch_add(1, Ordering::AcqRel);
                self.record(
                    meta,
                    ArrayEvent::SpareDropped {
                        member: new.identity().to_string(),
                        reason: e.to_string(),
                    },
                );
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
    fn start_rebuilding(&self, slot: usize, m: MemberRef, dirty_below: u64) {
        let s = &self.slots[slot];
        self.set_member(slot, m);
        // The position first, then the start (see sync.rs).
        s.rebuild_row.store(0, Ordering::Release);
        s.rebuild_from.store(0, Ordering::Release);
        s.rebuild_saved.store(0, Ordering::Release);
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
}

/// `rebuild_failed_epoch` when no rebuild failed.
pub(super) const NO_EPOCH: u64 = u64::MAX;
