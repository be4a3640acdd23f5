//! Re-add: a member that left its slot briefly (failed by mistake, a
//! cable, a reboot of its enclosure, a network member's server back) taken
//! back into that slot, its rebuild copying only what the write-intent
//! bitmap marked since it left, or whole where it may be an older copy of
//! itself. A membership change like the others (`membership.rs`: checked,
//! applied and persisted under the `meta` lock).

use super::membership::refuse;
use super::*;

impl Array {
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
}
