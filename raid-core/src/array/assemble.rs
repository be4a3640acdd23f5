//! Assembly: from a set of members to a running array, trusting the newest
//! metadata and refusing what does not belong.

use super::*;
use crate::metadata::{read_superblock, Superblock};

/// An assembled array and what assembly had to say.
pub struct Assembly {
    pub array: Array,
    /// Members that carry this array's metadata but were not taken, with why
    /// (stale: failed earlier and not rebuilt since).
    pub refused: Vec<(String, String)>,
}

pub(super) fn assemble(members: Vec<MemberRef>) -> Result<Assembly> {
    if members.is_empty() {
        return Err(ArrayError::Assembly("no members given".into()));
    }
    let mut read: Vec<(MemberRef, Superblock)> = Vec::new();
    for m in members {
        match read_superblock(m.as_ref()) {
            Ok(sb) => read.push((m, sb)),
            Err(e) => {
                return Err(ArrayError::Assembly(format!(
                    "member {} has no usable array metadata: {e}. Check the path; a member whose both metadata copies are corrupt must be replaced",
                    m.identity()
                )))
            }
        }
    }
    // The newest metadata is the truth.
    let truth = read
        .iter()
        .max_by_key(|(_, sb)| sb.events)
        .map(|(_, sb)| sb.clone())
        .unwrap();
    // The bitmap as the newest member has it.
    let bitmap_bits = if truth.bitmap_region_rows > 0 {
        let from = read
            .iter()
            .find(|(_, sb)| sb.events == truth.events)
            .map(|(m, _)| m.clone())
            .unwrap();
        let mut b = crate::buf::AlignedBuf::new(crate::metadata::BITMAP_BYTES);
        from.read_at(&mut b, crate::metadata::BITMAP_OFFSET)
            .map_err(|e| {
                ArrayError::Assembly(format!(
                    "member {}: cannot read the write-intent bitmap: {e}",
                    from.identity()
                ))
            })?;
        Some(b.to_vec())
    } else {
        None
    };
    for (m, sb) in &read {
        if sb.array_uuid != truth.array_uuid {
            return Err(ArrayError::Assembly(format!(
                "member {} belongs to array '{}' (uuid {}), not to '{}' (uuid {}): leave it out of this array's member list",
                m.identity(),
                sb.name,
                sb.array_uuid,
                truth.name,
                truth.array_uuid
            )));
        }
    }
    let geo = truth.geometry();
    let mut refused = Vec::new();
    let mut slot_member: Vec<Option<MemberRef>> = vec![None; geo.members];
    let mut spares = Vec::new();
    for (m, sb) in read {
        if m.size() < truth.data_offset + truth.data_size {
            return Err(ArrayError::Assembly(format!(
                "member {} is {} bytes, smaller than the array's {} bytes per member: it was truncated or is the wrong device",
                m.identity(),
                m.size(),
                truth.data_offset + truth.data_size
            )));
        }
        if let Some(i) = truth.slots.iter().position(|s| s.uuid == sb.member_uuid) {
            if truth.slots[i].state == SlotState::Failed {
                let why = format!(
                    "stale: slot {i} was failed (metadata event {} against this member's {}); it is not used until rebuilt (raidctl replace)",
                    truth.events, sb.events
                );
                tracing::warn!(member = m.identity(), "{why}");
                refused.push((m.identity().to_string(), why));
                continue;
            }
            if slot_member[i].is_some() {
                return Err(ArrayError::Assembly(format!(
                    "two members claim slot {i} of '{}' (the second is {}): one is a copy of the other; leave one out",
                    truth.name,
                    m.identity()
                )));
            }
            slot_member[i] = Some(m);
        } else if truth.spares.contains(&sb.member_uuid) {
            spares.push((sb.member_uuid, m));
        } else {
            let why = format!(
                "stale: it was part of '{}' up to event {} but is no longer recorded in the array (newest event {})",
                truth.name, sb.events, truth.events
            );
            refused.push((m.identity().to_string(), why));
        }
    }
    let slots: Vec<Slot> = truth
        .slots
        .iter()
        .zip(slot_member)
        .map(|(e, m)| {
            let state = if m.is_none() {
                SlotState::Failed
            } else {
                e.state
            };
            let slot = Slot {
                member: RwLock::new(m),
                uuid: RwLock::new(e.uuid),
                state: AtomicU8::new(ST_ACTIVE),
                rebuild_row: AtomicU64::new(e.rebuild_row),
            };
            slot.set_state(state);
            slot
        })
        .collect();
    let newly_missing: Vec<usize> = truth
        .slots
        .iter()
        .enumerate()
        .filter(|(i, e)| e.state != SlotState::Failed && slots[*i].state() == SlotState::Failed)
        .map(|(i, _)| i)
        .collect();
    let array = Array {
        geo,
        name: truth.name.clone(),
        uuid: truth.array_uuid,
        ctime: truth.ctime,
        engine: Arc::new(CpuEngine::new()),
        handles: Array::handles_of(&slots),
        slots,
        locks: StripeLocks::new(),
        meta: Mutex::new(Meta {
            events: truth.events,
            clean: truth.clean,
            spares,
            log: Vec::new(),
        }),
        dirty_marked: AtomicBool::new(false),
        bitmap: bitmap_bits
            .map(|bits| super::bitmap::Bitmap::new(truth.bitmap_region_rows, geo.rows(), bits)),
        journal: matches!(geo.level, Level::Raid5 | Level::Raid6)
            .then(|| super::journal::Journal::new(0)),
        rr: AtomicUsize::new(0),
    };
    if !array.within_redundancy() {
        return Err(ArrayError::Assembly(format!(
            "array '{}' cannot start: {}",
            array.name,
            match array.failed_error() {
                ArrayError::Failed { detail, .. } => detail,
                e => e.to_string(),
            }
        )));
    }
    // Complete any degraded write a crash tore, before anything else.
    let replayed = array.journal_recover()?;
    if replayed > 0 {
        tracing::warn!(array = %array.name, records = replayed, "replayed the degraded-write journal");
    }
    if !truth.clean {
        let n = array.resync_dirty()?;
        tracing::warn!(array = %array.name, regions = n, "array was not stopped cleanly: resynced the regions the bitmap marked");
    }
    if !newly_missing.is_empty() {
        {
            let mut meta = array.meta.lock();
            for &i in &newly_missing {
                array.record(&mut meta, ArrayEvent::MemberMissing { slot: i });
            }
            array.record(&mut meta, ArrayEvent::ArrayDegraded);
        }
        array.write_metadata();
    }
    tracing::info!(array = %array.name, state = array.state().name(), events = array.events(), "array assembled");
    Ok(Assembly { array, refused })
}
