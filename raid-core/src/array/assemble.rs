//! Assembly: from a set of members to a running array, trusting the newest
//! metadata and refusing what does not belong.

use super::*;
use crate::metadata::{read_superblock, Superblock};

/// An assembled array and what assembly had to say.
pub struct Assembly {
    pub array: Array,
    /// Members that were given but not taken, with why (stale: failed
    /// earlier and not rebuilt since; or no readable metadata).
    pub refused: Vec<(String, Refusal)>,
    /// Members taken back by a forced assembly though marked failed, with
    /// why each was chosen.
    pub forced: Vec<(String, String)>,
}

/// The devices of `read` that ran as the array apart from the newest
/// metadata's (`truth`'s) members in use, each said with its slot and
/// events: split brain. Both sides must have gone on without the other:
/// the device took changes after the truth had it leave, and a device the
/// truth has in use took changes after that device's own metadata had it
/// leave. One side alone is a member that merely lags or took one landed
/// copy as it failed, or one re-added since the other left.
fn run_apart(read: &[(MemberRef, Superblock)], truth: &Superblock) -> Vec<String> {
    let slot_of = |sb: &Superblock| {
        (sb.array_uuid == truth.array_uuid)
            .then(|| truth.slots.iter().position(|s| s.uuid == sb.member_uuid))
            .flatten()
    };
    let in_use: Vec<(usize, &MemberRef, &Superblock)> = read
        .iter()
        .filter_map(|(m, sb)| {
            let j = slot_of(sb)?;
            (truth.slots[j].state != SlotState::Failed).then_some((j, m, sb))
        })
        .collect();
    read.iter()
        .filter_map(|(m, sb)| {
            let i = slot_of(sb)?;
            if !sb.went_on_after(truth, i) {
                return None;
            }
            // And its side had the other leave after it left itself: a
            // member that failed long before (and was re-added since) is
            // no sign of two sides.
            let (j, t, tsb) = in_use.iter().find(|(j, _, tsb)| {
                tsb.went_on_after(sb, *j)
                    && sb.slots[*j].left_events >= truth.slots[i].left_events
            })?;
            Some(format!(
                "{} (slot {i}; its metadata, of event {}, has slot {j}'s {} leave at event {}, which carries {} now)",
                m.identity(),
                sb.events,
                t.identity(),
                sb.slots[*j].left_events,
                tsb.events
            ))
        })
        .collect()
}

/// Why assembly left out a device it was given: what is wrong with it
/// (`reason`), and what kind of trouble that is, which says the way back
/// for its slot (`RefusalKind::way_back`). Kept apart so that a caller
/// can tell of the device in its own terms (a spare, a slot its record
/// names) without cutting the advice out of a sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub kind: RefusalKind,
    /// What is wrong with the device, in words.
    pub reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalKind {
    /// Neither metadata copy could be read: the device cannot say which
    /// slot it held (a caller with a record of the array can).
    NoMetadata,
    /// Smaller than the array's members: cut short, or the wrong device.
    CutShort,
    /// Its slot failed, and its own metadata records it as the last
    /// member in sync when the array failed.
    FailedLast,
    /// Its slot failed before the newest metadata was written.
    Failed,
    /// An older copy of its slot's member (an image put back).
    OlderCopy,
    /// Once this array's, and no longer recorded in it.
    NotRecorded,
}

impl RefusalKind {
    /// What brings the device's slot back, where anything does.
    pub fn way_back(self) -> Option<&'static str> {
        match self {
            RefusalKind::NoMetadata | RefusalKind::CutShort => {
                Some("replace it to rebuild its slot")
            }
            RefusalKind::FailedLast => Some(
                "raidctl start --force takes it back with every write the array acknowledged",
            ),
            RefusalKind::Failed => Some(
                "it is not used until rebuilt (raidctl replace), or taken back by raidctl start --force if the array cannot start without it",
            ),
            RefusalKind::OlderCopy => Some("raidctl re-add copies it whole, or replace it"),
            RefusalKind::NotRecorded => None,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; left out", self.reason)?;
        match self.kind.way_back() {
            Some(w) => write!(f, ": {w}"),
            None => Ok(()),
        }
    }
}

impl Refusal {
    fn new(kind: RefusalKind, reason: String) -> Refusal {
        Refusal { kind, reason }
    }
}

/// Leaves `m` out of the start, logged, with `why` (the assembly says
/// which devices it left out and why: `Assembly::refused`).
fn left_out(refused: &mut Vec<(String, Refusal)>, m: &MemberRef, why: Refusal) {
    tracing::warn!(member = m.identity(), "{why}");
    refused.push((m.identity().to_string(), why));
}

impl Array {
    /// Assembles from members that carry this array's metadata (any order).
    pub fn assemble(members: Vec<MemberRef>) -> Result<Assembly> {
        assemble(members, AssembleOptions::default())
    }

    /// Assembles as `opts` say (`assemble`, `assemble_all` and
    /// `assemble_forced` are its common cases; the daemon resyncs in the
    /// background).
    pub fn assemble_with(members: Vec<MemberRef>, opts: AssembleOptions) -> Result<Assembly> {
        assemble(members, opts)
    }

    /// Assembles like `assemble`, but refuses, with nothing written, where
    /// a slot the metadata has in sync has no member among those given:
    /// for a start that names its members, where one left out by mistake
    /// would turn an optimal array degraded and that member stale (a
    /// resync when it comes back). `assemble_forced` starts without them.
    pub fn assemble_all(members: Vec<MemberRef>) -> Result<Assembly> {
        let opts = AssembleOptions {
            every_member: true,
            ..Default::default()
        };
        assemble(members, opts)
    }

    /// Assembles like `assemble`; when the members in sync are too few,
    /// takes back members marked failed, newest metadata first, until the
    /// array can serve (`Assembly::forced` says which and why).
    pub fn assemble_forced(members: Vec<MemberRef>) -> Result<Assembly> {
        let opts = AssembleOptions {
            force: true,
            ..Default::default()
        };
        assemble(members, opts)
    }
}

/// How an assembly goes (`Array::assemble_with`); the default is
/// `Array::assemble`'s.
#[derive(Clone, Copy, Debug, Default)]
pub struct AssembleOptions {
    /// Takes back members marked failed where those in sync are too few
    /// (`Array::assemble_forced`).
    pub force: bool,
    /// Refuses where a slot the metadata has in sync has no member among
    /// those given (`Array::assemble_all`).
    pub every_member: bool,
    /// Whether an unclean start resyncs before it returns or while served.
    pub resync: ResyncAt,
}

pub(super) fn assemble(members: Vec<MemberRef>, opts: AssembleOptions) -> Result<Assembly> {
    let (force, allow_missing) = (opts.force, !opts.every_member);
    if members.is_empty() {
        return Err(ArrayError::Assembly("no members given".into()));
    }
    let mut read: Vec<(MemberRef, Superblock)> = Vec::new();
    let mut refused = Vec::new();
    let mut unreadable = Vec::new();
    for m in members {
        match read_superblock(m.as_ref()) {
            Ok(sb) => read.push((m, sb)),
            // One member with bad metadata must not keep the others from
            // starting: it is left out (its slot counts as missing), and
            // assembly goes on if the level tolerates that.
            Err(e) => {
                let why = Refusal::new(
                    RefusalKind::NoMetadata,
                    format!("no usable array metadata ({e})"),
                );
                unreadable.push(format!("member {}: {e}", m.identity()));
                left_out(&mut refused, &m, why);
            }
        }
    }
    if read.is_empty() {
        return Err(ArrayError::Assembly(format!(
            "no member given has usable array metadata ({}). Check the paths; a device given to a later create (even one cut short) holds this array no more; a member whose both metadata copies are corrupt must be replaced",
            unreadable.join("; ")
        )));
    }
    // The newest metadata is the truth.
    let truth = read
        .iter()
        .max_by_key(|(_, sb)| sb.events)
        .map(|(_, sb)| sb.clone())
        .unwrap();
    // Split brain: two members of this array at the same event count that
    // disagree on who is in it were run apart (each side assembled without
    // the other, both written). Picking one by argument order would drop
    // the other side's writes without a word: refuse, and say which.
    for (m, sb) in &read {
        if sb.array_uuid == truth.array_uuid
            && sb.events == truth.events
            && (sb.slots != truth.slots || sb.spares != truth.spares)
        {
            let first = read
                .iter()
                .find(|(_, x)| x.events == truth.events && x.slots == truth.slots)
                .map(|(m, _)| m.identity().to_string())
                .unwrap_or_default();
            return Err(ArrayError::Assembly(format!(
                "split brain: {first} and {} both hold the newest metadata of '{}' (event {}) but disagree on its members: the array was run in two halves. Start it from one half only (raidctl start {} --members ...), after raidctl examine shows which devices belong to which; the other half's writes since the split are not in it",
                m.identity(),
                truth.name,
                truth.events,
                truth.name
            )));
        }
    }
    // The bitmap: the union of every slot member's of this array. A member
    // that joined lately may not hold the newest block yet, and a dirty bit
    // too many costs a resync of one region, a bit too few a torn stripe.
    // Spares are left out: the bitmap is written to slots only, so a
    // spare's block holds no bits and no stamp of this array.
    let bitmap_bits = if truth.bitmap_region_rows > 0 {
        let mut blocks = Vec::new();
        let mut slot_members = 0;
        let mut b = crate::buf::AlignedBuf::new(crate::metadata::BITMAP_BYTES);
        for (m, sb) in &read {
            if sb.array_uuid != truth.array_uuid || sb.role == crate::metadata::ROLE_SPARE {
                continue;
            }
            slot_members += 1;
            match m.read_at(&mut b, crate::metadata::BITMAP_OFFSET) {
                Ok(()) => blocks.push(b.to_vec()),
                Err(e) => tracing::warn!(
                    member = m.identity(),
                    "cannot read the write-intent bitmap: {e}"
                ),
            }
        }
        // (With spares alone, the count of members says what is wrong.)
        if blocks.is_empty() && slot_members > 0 {
            return Err(ArrayError::Assembly(
                "no member's write-intent bitmap could be read".into(),
            ));
        }
        Some(super::bitmap::union_of(
            truth.bitmap_region_rows,
            truth.geometry().rows(),
            &blocks,
        ))
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
        // Never so by the rules (the offset is set at create and every
        // superblock is written from it): a member that says otherwise
        // would be read at the wrong place, so it is not read at all.
        if sb.data_offset != truth.data_offset {
            return Err(ArrayError::Assembly(format!(
                "member {} of '{}' puts the data at byte {}, the newest metadata at {}: its metadata does not agree with the others'; leave it out and replace it",
                m.identity(),
                truth.name,
                sb.data_offset,
                truth.data_offset
            )));
        }
    }
    let geo = truth.geometry();
    // Members marked failed that a forced assembly may take back, newest
    // metadata first (md's --assemble --force rule).
    let mut failed_but_present: Vec<(usize, MemberRef, Superblock)> = Vec::new();
    let mut slot_member: Vec<Option<MemberRef>> = vec![None; geo.members];
    // The event counter of the metadata each slot's member carries.
    let mut slot_events: Vec<u64> = vec![0; geo.members];
    // Who claims each slot, a device cut short included: a second device
    // with the same member uuid (a copy) is refused whichever of the two
    // was cut, never taken in the cut one's place.
    let mut claimed: Vec<Option<String>> = vec![None; geo.members];
    let mut spares = Vec::new();
    // Slots whose device was given but is an older copy of their member.
    let mut stale: Vec<Option<String>> = vec![None; geo.members];
    let apart = run_apart(&read, &truth);
    for (m, sb) in read {
        if let Some(i) = truth.slots.iter().position(|s| s.uuid == sb.member_uuid) {
            if truth.slots[i].state != SlotState::Failed {
                if let Some(first) = claimed[i].replace(m.identity().to_string()) {
                    return Err(ArrayError::Assembly(format!(
                        "two devices claim slot {i} of '{}' ({first} and {}): one is a copy of the other; leave one out",
                        truth.name,
                        m.identity()
                    )));
                }
            }
        }
        // Left out as one with unreadable metadata is: its slot counts as
        // missing (a stale device that was cut, in a scanned folder, must
        // not keep the array from starting; a member cut is a drive gone).
        if m.size() < truth.data_offset + truth.data_size {
            let why = Refusal::new(
                RefusalKind::CutShort,
                format!(
                    "{} bytes, smaller than the array's {} bytes per member: it was truncated or is the wrong device",
                    m.size(),
                    truth.data_offset + truth.data_size
                ),
            );
            left_out(&mut refused, &m, why);
            continue;
        }
        if let Some(i) = truth.slots.iter().position(|s| s.uuid == sb.member_uuid) {
            if truth.slots[i].state == SlotState::Failed {
                let why = if sb
                    .slots
                    .get(i)
                    .is_some_and(|e| e.state == SlotState::Failed)
                {
                    // Its own record (`fail_and_persist`): not stale.
                    Refusal::new(
                        RefusalKind::FailedLast,
                        format!(
                            "slot {i} was failed: its own metadata (event {}) records it, as the last member in sync when the array failed",
                            sb.events
                        ),
                    )
                } else {
                    Refusal::new(
                        RefusalKind::Failed,
                        format!(
                            "stale: slot {i} was failed (metadata event {} against this member's {})",
                            truth.events, sb.events
                        ),
                    )
                };
                left_out(&mut refused, &m, why);
                failed_but_present.push((i, m, sb));
                continue;
            }
            // Every member not failed took event `settled`: one whose own
            // metadata is older was not there for it. A crash in the middle
            // of a change leaves members behind the newest event but never
            // behind `settled` (each change's rounds are written in full, a
            // member at a time, before the next begins), so this is an older
            // copy of the member: an image put back, a clone swapped in,
            // whose data misses the writes since. md refuses such a member
            // the same way (an event counter too old); `--force` may still
            // take it back where the array cannot start without it.
            if let Some(settled) = sb.older_copy_in(&truth, i) {
                let why = Refusal::new(
                    RefusalKind::OlderCopy,
                    format!(
                        "stale: it holds slot {i}'s metadata of event {}, but every member took event {settled} since: an older copy of the member (an image put back, a clone swapped in?), missing the writes made since then",
                        sb.events
                    ),
                );
                stale[i] = Some(format!("{}: {why}", m.identity()));
                left_out(&mut refused, &m, why);
                failed_but_present.push((i, m, sb));
                continue;
            }
            // A second claim was refused above.
            slot_member[i] = Some(m);
            slot_events[i] = sb.events;
        } else if truth.spares.contains(&sb.member_uuid) {
            spares.push((sb.member_uuid, m));
        } else {
            let why = Refusal::new(
                RefusalKind::NotRecorded,
                format!(
                    "stale: it was part of '{}' up to event {} but is no longer recorded in the array (newest event {})",
                    truth.name, sb.events, truth.events
                ),
            );
            refused.push((m.identity().to_string(), why));
        }
    }
    if !apart.is_empty() {
        // The newest metadata is one half's view, not the newer data:
        // each half took writes the other never saw. Starting from either
        // (forced or not) would mark the other failed and have it rebuilt
        // over, its writes since the split gone without a word.
        let newest: Vec<&str> = slot_member.iter().flatten().map(|m| m.identity()).collect();
        return Err(ArrayError::Assembly(format!(
            "split brain: {} ran as '{name}' apart from {} after leaving it (the one half failed the other, then both went on): each half holds writes the other lacks, and nothing was started. Start it from one half only: raidctl start {name} --members DEVICE... with that half's devices (raidctl examine DEVICE shows each one's event and view of the array); the other half's devices are then re-added or replaced, which overwrites what they took since the split",
            apart.join(", "),
            if newest.is_empty() { "the others".to_string() } else { newest.join(", ") },
            name = truth.name,
        )));
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
            Slot::new(m, e.uuid, state, e.rebuild_row)
        })
        .collect();
    for (i, (s, e)) in slots.iter().zip(&truth.slots).enumerate() {
        s.member_events.store(slot_events[i], Ordering::Release);
        // A slot failed before keeps when it left; one whose member is
        // missing now was in the newest metadata, so it left at its event.
        let left = match e.state {
            SlotState::Failed => e.left_events,
            _ => truth.events,
        };
        s.left_events.store(left, Ordering::Release);
    }
    let newly_missing: Vec<usize> = truth
        .slots
        .iter()
        .enumerate()
        .filter(|(i, e)| e.state != SlotState::Failed && slots[*i].state() == SlotState::Failed)
        .map(|(i, _)| i)
        .collect();
    let array = Array::from_parts(super::Parts {
        geo,
        data_offset: truth.data_offset,
        name: truth.name.clone(),
        uuid: truth.array_uuid,
        ctime: truth.ctime,
        slots,
        meta: Meta {
            events: truth.events,
            // Set below, once the members are known.
            settled: 0,
            clean: truth.clean,
            spares,
            log: Vec::new(),
            last_standing: None,
        },
        bitmap: bitmap_bits
            .map(|bits| super::bitmap::Bitmap::new(truth.bitmap_region_rows, geo.rows(), bits)),
    });
    let mut forced = Vec::new();
    if !array.within_redundancy() && force {
        forced = force_back(&array, failed_but_present, &truth);
        refused.retain(|(m, _)| !forced.iter().any(|(f, _)| f == m));
    }
    // An older copy forced back serves its slot: not missing.
    let newly_missing: Vec<usize> = newly_missing
        .into_iter()
        .filter(|&i| array.slots[i].state() == SlotState::Failed)
        .collect();
    for &i in &newly_missing {
        array.slots[i]
            .vacancy
            .store(VACANT_MISSING_AT_START, Ordering::Release);
    }
    // What every member taken holds: the oldest of their events (a crash
    // may have left one behind the newest; it is written with the others
    // at the first change).
    array.meta.lock().settled = array
        .slots
        .iter()
        .filter(|s| s.state() != SlotState::Failed && s.member.read().is_some())
        .map(|s| s.member_events.load(Ordering::Acquire))
        .min()
        .unwrap_or(truth.events);
    // The devices given and not used, and why (marked failed, stale,
    // another array's): said with either refusal below, as a slot without
    // a device may have had one at hand.
    let unusable = match refused.is_empty() {
        true => String::new(),
        false => format!(
            " (given but not usable: {})",
            refused
                .iter()
                .map(|(m, why)| format!("{m}: {why}"))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    };
    if !array.within_redundancy() {
        return Err(ArrayError::Assembly(format!(
            "array '{}' cannot start: {}{}.{}",
            array.name,
            match array.failed_error() {
                ArrayError::Failed { detail, .. } => detail,
                e => e.to_string(),
            },
            unusable,
            if force {
                " Not enough members marked failed are present to force it either: find the missing ones (raidctl examine DEV shows what a device holds)"
            } else {
                " If members were marked failed but their data is intact (failed by mistake, a cable, a full filesystem), raidctl start NAME --force takes back the newest of them"
            }
        )));
    }
    // After the check above, so that an array too short of members to
    // start at all says that instead; before anything is written.
    if !allow_missing && !newly_missing.is_empty() {
        let list: Vec<String> = newly_missing.iter().map(|i| i.to_string()).collect();
        return Err(ArrayError::Assembly(format!(
            "slot {} of '{}' was serving in the metadata, and none of the members given fills it{}: started without it, the array would run degraded and that member would need a resync when it comes back. Give that member too, or, if it is really gone, add --force (which also takes back members marked failed, newest first, where the array needs them)",
            list.join(", "),
            truth.name,
            unusable
        )));
    }
    if !forced.is_empty() {
        // Taken back durably, and dirty: the stripes written around the
        // failure are resynced where the level allows.
        let mut meta = array.meta.lock();
        meta.clean = false;
        for (m, why) in &forced {
            tracing::warn!(array = %array.name, member = %m, "{why}");
        }
        array.persist(&mut meta);
    }
    // Both metadata copies of every member written anew, first: a crash
    // can leave one copy torn (assembly read the other), and a crash during
    // the next update, which writes the good copy first, would then leave
    // the member with none. (Found by the deterministic simulation.)
    {
        let mut meta = array.meta.lock();
        array.persist(&mut meta);
    }
    // The bitmap is the union of the members' blocks (and of devices that
    // held this array's slots, stale or refused), and taken as durable (a
    // writer into a marked region writes no bit): so it is written to
    // every member now, clean start or not. A crash during a bitmap write
    // leaves the new bit on some members only; had the union stayed only
    // in memory, losing those members would lose the mark, and a crash
    // after that would leave that region's copies or parity unchecked.
    // (Found by the deterministic simulation, once bits lingered past
    // flushes.)
    array.rewrite_bitmap();
    // Complete any degraded write a crash tore, before anything else.
    let replayed = array.journal_recover()?;
    if replayed > 0 {
        tracing::warn!(array = %array.name, records = replayed, "replayed the degraded-write journal");
    }
    if !truth.clean {
        let (n, background) = match opts.resync {
            ResyncAt::Start => match array.resync_dirty() {
                Ok(n) => {
                    tracing::warn!(array = %array.name, regions = n, "array was not stopped cleanly: resynced the regions the bitmap marked");
                    (n, false)
                }
                // A repair a full filesystem refused: the array starts
                // with writes stopped and the rest of the resync owed, as
                // a start that resyncs while served (the next start, with
                // space freed, runs it).
                Err(ArrayError::NoSpace { .. }) => (array.owe_resync(), true),
                Err(e) => return Err(e),
            },
            ResyncAt::Background => (array.owe_resync(), true),
        };
        let deferred = array.resync.pending() && !array.resync_runnable();
        array.record_event(ArrayEvent::UncleanStop {
            regions: n as u64,
            deferred,
            background: background && !deferred && n > 0,
        });
    }
    // Slots that failed before this start: said again, since the start
    // may follow a reboot that no one watched.
    {
        let mut meta = array.meta.lock();
        for (i, s) in array.slots.iter().enumerate() {
            if s.state() == SlotState::Failed && !newly_missing.contains(&i) {
                let member = s.identity();
                array.record(&mut meta, ArrayEvent::StartedDegraded { slot: i, member });
            }
        }
    }
    if !newly_missing.is_empty() {
        {
            let mut meta = array.meta.lock();
            for &i in &newly_missing {
                let left_out = stale[i].take();
                array.record(&mut meta, ArrayEvent::MemberMissing { slot: i, left_out });
            }
            array.record(&mut meta, ArrayEvent::ArrayDegraded);
        }
        array.write_metadata();
    }
    tracing::info!(array = %array.name, state = array.state().name(), events = array.events(), "array assembled");
    Ok(Assembly {
        array,
        refused,
        forced,
    })
}

/// Forced assembly: takes back members marked failed, the one with the
/// newest metadata first, until the array can serve every byte. A member
/// failed last saw every write the array took before it stopped serving
/// (a failed array takes no writes), so the newest ones are the consistent
/// set. A slot being rebuilt is never taken back: its data is partial.
fn force_back(
    array: &Array,
    mut candidates: Vec<(usize, MemberRef, Superblock)>,
    truth: &Superblock,
) -> Vec<(String, String)> {
    let newest = truth.events;
    candidates.sort_by_key(|(_, _, sb)| std::cmp::Reverse(sb.events));
    let mut taken = Vec::new();
    for (i, m, sb) in candidates {
        if array.within_redundancy() {
            break;
        }
        let s = &array.slots[i];
        if s.state() != SlotState::Failed || s.member.read().is_some() {
            continue;
        }
        // A member that left while being rebuilt holds partial data: its
        // own metadata says so. Never taken back as in sync; nor an older
        // copy of one whose slot the newest metadata has being rebuilt. Its
        // own slot failed in its own metadata is the last member in sync
        // recording its own failure (`fail_and_persist`): in sync.
        if sb
            .slots
            .get(i)
            .is_none_or(|e| e.state == SlotState::Rebuilding)
            || truth.slots[i].state == SlotState::Rebuilding
        {
            continue;
        }
        array.set_member(i, m.clone());
        s.incarnation.fetch_add(1, Ordering::AcqRel);
        s.member_events.store(sb.events, Ordering::Release);
        s.set_state(SlotState::Active);
        array.epoch.fetch_add(1, Ordering::AcqRel);
        // A member failed in order is not an older copy.
        let why = if let Some(took) = sb.older_copy_in(truth, i) {
            let who = match truth.slots[i].state {
                SlotState::Failed => "it had taken when it failed",
                _ => "every member took",
            };
            // Taken because nothing newer is at hand: say what it lacks.
            format!(
                "forced back into slot {i} though stale: its metadata is from event {}, older than event {took}, which {who}; an older copy of the member, it lacks the writes made since: check the filesystem (fsck) and run raidctl scrub --repair",
                sb.events
            )
        } else {
            format!(
                "forced back into slot {i} though marked failed: its metadata is from event {} (the newest is {newest}); it was the newest failed member, so it holds every write the array acknowledged while it could still serve",
                sb.events
            )
        };
        taken.push((m.identity().to_string(), why));
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::{Refusal, RefusalKind};

    /// A refusal reads as its reason, that it was left out, and its way
    /// back where it has one; a caller telling of it otherwise (a spare)
    /// takes the reason alone.
    #[test]
    fn a_refusal_says_its_reason_then_its_way_back() {
        let r = Refusal::new(RefusalKind::OlderCopy, "stale: an older copy".into());
        assert_eq!(
            r.to_string(),
            "stale: an older copy; left out: raidctl re-add copies it whole, or replace it"
        );
        assert_eq!(r.reason, "stale: an older copy");
        let r = Refusal::new(RefusalKind::NotRecorded, "stale: not recorded".into());
        assert_eq!(r.to_string(), "stale: not recorded; left out");
    }
}
