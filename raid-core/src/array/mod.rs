//! The array: members in slots, their states, metadata updates, and the
//! public I/O entry points. The per-level data paths live in `parity_io`
//! (RAID5/6) and `mirror_io` (RAID0/1/10); rebuild in `rebuild`.
//!
//! I/O is in 4 KiB logical blocks. Durability: a write that returned Ok may
//! still sit in member caches; once `flush` returns Ok, every write that
//! completed before the flush began is durable on every in-sync member.

mod assemble;
pub(crate) mod async_write;
mod bitmap;
mod block_io;
mod clean_mark;
pub(crate) mod copies_read;
mod create;
pub(crate) mod degraded_read;
mod events;
mod failing;
mod hot_copy;
mod hot_replace;
mod jobs;
mod journal;
mod local;
mod locks;
mod member_io;
mod membership;
mod mirror_io;
mod parity_io;
mod parity_read;
mod re_add;
mod rebuild;
mod rebuild_rows;
mod rebuild_ticket;
mod resync;
mod runs;
mod scrub;
mod skip_holes;
mod step_io;
mod sync;
mod unjournaled;
mod write_guards;
mod write_keys;
mod write_plan;
mod zero_extents;

pub use assemble::{AssembleOptions, Assembly, Refusal, RefusalKind};
pub use bitmap::BITMAP_LINGER;
pub(crate) use block_io::{DirectPiece, DirectRead};
pub use events::{ArrayEvent, Severity};
pub use jobs::{CopyDone, CopyKind, CopyProgress, ResyncProgress, ScrubDone, ScrubProgress};
pub(crate) use journal::{JournalDone, NotQueued, RoomWake};
pub use local::LocalArray;
pub(crate) use member_io::MemberTable;
pub use membership::Rule;
pub use rebuild::{RebuildEnd, RebuildOptions};
pub use resync::ResyncAt;
pub use scrub::{Mismatch, ScrubOptions, ScrubReport};

use crate::layout::{Geometry, GeometryError, Level};
use crate::member::{Member, MemberRef};
use crate::metadata::{self, SlotEntry, SlotState, Superblock, Uuid, ROLE_SPARE};
use crate::parity::{CpuEngine, ParityEngine, ParityError};
use locks::StripeLocks;
use member_io::{pace, Absent, ReadFailure};
use parking_lot::{Mutex, RwLock};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

/// The logical block size: every offset and length is a multiple of it.
pub const BLOCK: u64 = 4096;

/// Why an array operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("request at byte {offset}, {len} bytes, is not aligned to {BLOCK}-byte blocks: align offset and length to {BLOCK}")]
    Unaligned { offset: u64, len: u64 },
    #[error(
        "request at byte {offset}, {len} bytes, ends past the end of the array ({capacity} bytes)"
    )]
    OutOfRange {
        offset: u64,
        len: u64,
        capacity: u64,
    },
    #[error("array '{name}' has failed: {detail}; data that depends on the lost members cannot be served. Reassemble with the missing members if they can be brought back")]
    Failed { name: String, detail: String },
    #[error("member {member}: {source}")]
    Member { member: String, source: io::Error },
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    #[error(transparent)]
    Parity(#[from] ParityError),
    #[error("{0}")]
    Assembly(String),
    /// A member's filesystem (or quota) is full: the array takes no writes
    /// until space is freed and it is started again; no member was failed.
    #[error("array '{name}' is out of space: member {member} is on a full filesystem (ENOSPC). No member was failed and every byte written before is intact; the array takes no more writes until space is freed and it is started again (raidctl stop {name}; free space; raidctl start {name})")]
    NoSpace { name: String, member: String },
    /// A membership change the rules refuse (see `membership`).
    #[error("{detail} [refused: {rule}]")]
    Refused { rule: Rule, detail: String },
    #[error("{0}")]
    Invalid(String),
}

impl ArrayError {
    /// The same error for another request that shared the operation that
    /// met it (writes merged into one): a copy, its I/O error rebuilt from
    /// its kind and text; the engine's own errors as their text.
    pub fn again(&self) -> ArrayError {
        use ArrayError::*;
        match self {
            Unaligned { offset, len } => Unaligned {
                offset: *offset,
                len: *len,
            },
            OutOfRange {
                offset,
                len,
                capacity,
            } => OutOfRange {
                offset: *offset,
                len: *len,
                capacity: *capacity,
            },
            Failed { name, detail } => Failed {
                name: name.clone(),
                detail: detail.clone(),
            },
            Member { member, source } => Member {
                member: member.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
            NoSpace { name, member } => NoSpace {
                name: name.clone(),
                member: member.clone(),
            },
            Refused { rule, detail } => Refused {
                rule: *rule,
                detail: detail.clone(),
            },
            Assembly(s) => Assembly(s.clone()),
            Invalid(s) => Invalid(s.clone()),
            Geometry(_) | Parity(_) => Invalid(self.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, ArrayError>;

/// What the array reports about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayState {
    Optimal,
    Degraded,
    Rebuilding,
    Failed,
}

impl ArrayState {
    pub fn name(self) -> &'static str {
        match self {
            ArrayState::Optimal => "optimal",
            ArrayState::Degraded => "degraded",
            ArrayState::Rebuilding => "rebuilding",
            ArrayState::Failed => "failed",
        }
    }
}

/// A slot: one position of the layout, and the member in it.
struct Slot {
    member: RwLock<Option<MemberRef>>,
    uuid: RwLock<Uuid>,
    state: AtomicU8,
    /// For a rebuilding member: where its rebuild stands (`sync.rs`): the
    /// position the pass has reached for it, with `sync::WRAPPED` once the
    /// pass went past the last row and on from row 0.
    rebuild_row: AtomicU64,
    /// For a rebuilding member: the row its rebuild began at (0, unless it
    /// joined a pass already under way). Rows from here up to the position
    /// are in sync.
    rebuild_from: AtomicU64,
    /// For a rebuilding member: the row its metadata may say it is in
    /// sync below (`sync::Slot::saved_row`): where its rebuild last
    /// flushed it.
    rebuild_saved: AtomicU64,
    /// The row the metadata on disk says (`Slot::durably_in_sync`).
    rebuild_durable: AtomicU64,
    /// Rows of the batch under way already rebuilt (`sync::Ahead`).
    ahead: sync::Ahead,
    /// The membership epoch at which this slot's rebuild last failed for a
    /// reason outside the slot (`membership::NO_EPOCH`: none).
    rebuild_failed_epoch: AtomicU64,
    /// Rows below this are resynced only in regions the write-intent
    /// bitmap marks (the rest the member still holds): every row for a
    /// re-added member (`u64::MAX`), the rows a hot replace had copied for
    /// a replacement that took over from a failed source, 0 for a member
    /// rebuilt whole. The bitmap's bits stay set while a slot is out of
    /// sync, so every write the member missed is in a marked region.
    resync_dirty_below: AtomicU64,
    /// Bumped whenever the slot fails or gets a device (even the same one
    /// back): a rebuild's ticket names the incarnation it works for.
    incarnation: AtomicU64,
    /// The event counter of the last metadata written whole to the slot's
    /// member (at assembly: the one it carried).
    member_events: AtomicU64,
    /// For a failed slot: `member_events` when it failed, kept in the
    /// metadata (`SlotEntry::left_events`; 0: not known). A re-add of an
    /// older copy of the member copies it whole.
    left_events: AtomicU64,
    /// The bitmap write (its stamp's sequence) the slot's member failed
    /// on, if it failed on one (0: not on one, or not since this start):
    /// a member that missed exactly the write that cleared bits last is
    /// one write behind, not an older copy (`bitmap_older_than_last_clear`).
    missed_bitmap_seq: AtomicU64,
    /// Why a failed slot has no device beyond its failure (`VACANT_*`):
    /// until it gets a device or fails again (`clear_vacancy`).
    vacancy: AtomicU8,
}

/// `Slot::vacancy`: nothing more than its failure.
const VACANT_FAILED: u8 = 0;
/// No device filled it at the start (it served in the metadata), not
/// failed before.
const VACANT_MISSING_AT_START: u8 = 1;
/// Its failed device was taken out (`remove_member`) while the array ran.
const VACANT_REMOVED: u8 = 2;

impl Slot {
    /// Whether the slot is failed and vacant for reason `why`.
    fn vacant(&self, why: u8) -> bool {
        self.state() == SlotState::Failed && self.vacancy.load(Ordering::Acquire) == why
    }

    /// The slot fails again or gets a device: the reason it was vacant no
    /// longer holds.
    fn clear_vacancy(&self) {
        self.vacancy.store(VACANT_FAILED, Ordering::Release);
    }

    fn new(member: Option<MemberRef>, uuid: Uuid, state: SlotState, rebuild_row: u64) -> Slot {
        let s = Slot {
            member: RwLock::new(member),
            uuid: RwLock::new(uuid),
            state: AtomicU8::new(ST_FAILED),
            rebuild_row: AtomicU64::new(rebuild_row),
            rebuild_from: AtomicU64::new(0),
            rebuild_saved: AtomicU64::new(rebuild_row),
            rebuild_durable: AtomicU64::new(rebuild_row),
            ahead: sync::Ahead::default(),
            rebuild_failed_epoch: AtomicU64::new(membership::NO_EPOCH),
            resync_dirty_below: AtomicU64::new(0),
            incarnation: AtomicU64::new(0),
            member_events: AtomicU64::new(0),
            left_events: AtomicU64::new(0),
            missed_bitmap_seq: AtomicU64::new(0),
            vacancy: AtomicU8::new(VACANT_FAILED),
        };
        s.set_state(state);
        s
    }
}

const ST_ACTIVE: u8 = 0;
const ST_FAILED: u8 = 1;
const ST_REBUILDING: u8 = 2;

impl Slot {
    fn state(&self) -> SlotState {
        match self.state.load(Ordering::Acquire) {
            ST_ACTIVE => SlotState::Active,
            ST_REBUILDING => SlotState::Rebuilding,
            _ => SlotState::Failed,
        }
    }
    fn set_state(&self, s: SlotState) {
        let code = match s {
            SlotState::Active => ST_ACTIVE,
            SlotState::Failed => ST_FAILED,
            SlotState::Rebuilding => ST_REBUILDING,
        };
        self.state.store(code, Ordering::Release);
    }
    /// Its device's name, "" where it holds none (events name it so).
    fn identity(&self) -> String {
        self.member
            .read()
            .as_ref()
            .map(|m| m.identity().to_string())
            .unwrap_or_default()
    }
}

/// What creation or assembly settles of an array; `Array::from_parts`
/// starts the rest (engine, locks, journal, counters) the same way for both.
struct Parts {
    geo: Geometry,
    data_offset: u64,
    name: String,
    uuid: Uuid,
    ctime: u64,
    slots: Vec<Slot>,
    meta: Meta,
    bitmap: Option<bitmap::Bitmap>,
}

/// The members' handles as loaded at one moment (`member_handles`).
type HandlesNow = arc_swap::Guard<Arc<MemberTable>>;

impl Array {
    /// An array of `p`, not yet serving: the CPU parity engine, no I/O in
    /// flight, and a degraded-write journal (empty, ending at the data)
    /// where the level keeps parity.
    fn from_parts(p: Parts) -> Array {
        Array {
            journal: (p.geo.level.parity_chunks() > 0)
                .then(|| journal::Journal::new(0, p.data_offset)),
            geo: p.geo,
            data_offset: p.data_offset,
            name: p.name,
            uuid: p.uuid,
            ctime: p.ctime,
            engine: Arc::new(CpuEngine::new()),
            handles: Array::handles_of(&p.slots),
            slots: p.slots,
            locks: StripeLocks::new(),
            epoch: AtomicU64::new(0),
            meta: Mutex::new(p.meta),
            dirty_marked: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            resync: Default::default(),
            unjournaled: Default::default(),
            bitmap: p.bitmap,
            rr: AtomicUsize::new(0),
            hot: Mutex::new(None),
            out_of_space: Mutex::new(None),
            full: AtomicBool::new(false),
            jobs: Default::default(),
            client_io: Default::default(),
            activity: Default::default(),
        }
    }
}

/// Metadata that changes: serialised by one lock so event counters only grow.
struct Meta {
    events: u64,
    /// The newest event every member not failed holds durably: the last
    /// metadata change whose every round was written in full (see
    /// `metadata::Superblock::settled`).
    settled: u64,
    clean: bool,
    spares: Vec<(Uuid, MemberRef)>,
    /// Each event with the array's state as it was recorded: a reader
    /// that comes later (the daemon's monitor, a quarter second on) would
    /// see the state after the events since (a short rebuild already over
    /// by then).
    log: Vec<(SystemTime, ArrayEvent, ArrayState)>,
    /// The member in sync that failed last, leaving none: it records its
    /// own failure (`failing::fail_and_persist`).
    last_standing: Option<usize>,
}

/// Options for `Array::create`.
pub struct CreateOptions {
    pub name: String,
    pub level: Level,
    pub chunk: u64,
    /// Where the data starts on every member; None (what the CLI gives):
    /// `metadata::data_offset_for` chooses. The deterministic simulation
    /// and tests set it to place data elsewhere than the default.
    pub data_offset: Option<u64>,
}

/// What `Array::check_create` found: the array's shape, and where its data
/// starts on every member.
#[derive(Clone, Copy, Debug)]
pub struct CreatePlan {
    pub geo: Geometry,
    pub data_offset: u64,
}

/// A member slot's state as reported.
#[derive(Clone, Debug)]
pub struct SlotStatus {
    pub slot: usize,
    pub member: Option<String>,
    pub uuid: Uuid,
    pub state: SlotState,
    pub rebuild_row: u64,
    /// A failed slot's: the metadata event its device had taken when it
    /// left (0: not recorded). A device of the slot that carries an older
    /// one is an older copy of it, not the device that failed.
    pub left_events: u64,
    /// A failed slot whose device was missing at the start (it served in
    /// the metadata until then), not one that had failed before.
    pub missing_at_start: bool,
    /// A failed slot whose device was taken out (`remove_member`) since
    /// the start.
    pub removed: bool,
    /// Its device takes writes with FUA (`Member::fua`): the journal's and
    /// the bitmap's writes go so there, with no flush after. False
    /// without a device.
    pub fua: bool,
}

/// One assembled, running array.
pub struct Array {
    geo: Geometry,
    /// Where the data area starts on every member (the superblock's
    /// `data_offset`): the journal's ring ends here
    /// (`metadata::data_offset_for`).
    data_offset: u64,
    name: String,
    uuid: Uuid,
    ctime: u64,
    engine: Arc<dyn ParityEngine>,
    slots: Vec<Slot>,
    /// The slots' members for the data path; see `set_member`.
    handles: member_io::Handles,
    locks: StripeLocks,
    /// The membership lock (see `membership`): every change of who is in
    /// the array, and every metadata write, happens under it.
    meta: Mutex<Meta>,
    /// The membership epoch: bumped by every membership change.
    epoch: AtomicU64,
    dirty_marked: AtomicBool,
    /// Stopped by `close` (set under `meta`): a late I/O error (a probe of a
    /// network member still waiting for its host) fails no member then; the
    /// array may be assembled again meanwhile, and its metadata is that
    /// array's to write.
    closed: AtomicBool,
    /// An unclean stop's resync not yet run to its end (`resync.rs`): run
    /// while the array is served, or, for a parity array started degraded,
    /// as soon as a rebuild makes it optimal again.
    resync: resync::Owed,
    /// Parity writes in flight without a journal record: a failure waits
    /// for them before it is durable (see unjournaled.rs).
    unjournaled: unjournaled::Unjournaled,
    /// The write-intent bitmap (None for RAID0, which has no redundancy).
    bitmap: Option<bitmap::Bitmap>,
    /// The degraded-write journal (RAID5/6 only).
    journal: Option<journal::Journal>,
    /// Spreads mirror reads over the copies.
    rr: AtomicUsize,
    /// A hot replacement in progress (see `hot_replace`). Lock order:
    /// after `meta`.
    hot: Mutex<Option<hot_replace::HotReplace>>,
    /// A member's filesystem filled up: writes are refused from then on
    /// (see `member_write_failed`), and the member that is full holds
    /// this name.
    out_of_space: Mutex<Option<String>>,
    /// `out_of_space` is set: checked lock-free on every write.
    full: AtomicBool,
    /// The background work (rebuild, hot replace, scrub) the array owns.
    jobs: jobs::Jobs,
    /// What clients asked of the array (see `io_stats`).
    client_io: crate::stats::IoStats,
    /// Journal records and bitmap writes made.
    activity: crate::stats::Activity,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Array {
    /// Uses `engine` for parity from now on (e.g. the GPU engine).
    pub fn set_engine(&mut self, engine: Arc<dyn ParityEngine>) {
        self.engine = engine;
    }

    pub fn engine_name(&self) -> String {
        self.engine.name()
    }
    pub fn geometry(&self) -> Geometry {
        self.geo
    }
    /// Where the data area starts on every member.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
    pub fn capacity(&self) -> u64 {
        self.geo.capacity()
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn uuid(&self) -> Uuid {
        self.uuid
    }
    pub fn events(&self) -> u64 {
        self.meta.lock().events
    }
    /// Events seen since assembly, oldest first.
    pub fn event_log(&self) -> Vec<(SystemTime, ArrayEvent)> {
        self.event_log_from(0)
    }

    /// Events since assembly from the `first`th on: what a reader that has
    /// seen `first` of them has not, without copying the rest.
    pub fn event_log_from(&self, first: usize) -> Vec<(SystemTime, ArrayEvent)> {
        self.event_log_with_states_from(first)
            .into_iter()
            .map(|(t, e, _)| (t, e))
            .collect()
    }

    /// `event_log_from`, each event with the array's state as it was
    /// recorded.
    pub fn event_log_with_states_from(
        &self,
        first: usize,
    ) -> Vec<(SystemTime, ArrayEvent, ArrayState)> {
        let meta = self.meta.lock();
        meta.log
            .get(first..)
            .map(|l| l.to_vec())
            .unwrap_or_default()
    }

    pub fn slots(&self) -> Vec<SlotStatus> {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                // One read of the slot's device, its lock given up at once.
                let (member, fua) = match s.member.read().as_ref() {
                    Some(m) => (Some(m.identity().to_string()), m.fua()),
                    None => (None, false),
                };
                SlotStatus {
                    slot: i,
                    member,
                    fua,
                    uuid: *s.uuid.read(),
                    state: s.state(),
                    rebuild_row: if s.state() == SlotState::Rebuilding {
                        s.saved_row()
                    } else {
                        0
                    },
                    left_events: if s.state() == SlotState::Failed {
                        s.left_events.load(Ordering::Acquire)
                    } else {
                        0
                    },
                    missing_at_start: s.vacant(VACANT_MISSING_AT_START),
                    removed: s.vacant(VACANT_REMOVED),
                }
            })
            .collect()
    }

    /// The array's I/O counters now: its clients', each member's in a
    /// slot, and its journal and bitmap work (see `crate::stats`).
    pub fn io_stats(&self) -> crate::stats::ArrayIoSnapshot {
        let members = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let m = s.member.read().clone()?;
                let io = m.io_stats().map(|st| st.snapshot()).unwrap_or_default();
                Some(crate::stats::MemberIoSnapshot {
                    slot: i,
                    member: m.identity().to_string(),
                    io,
                })
            })
            .collect();
        crate::stats::ArrayIoSnapshot {
            client: self.client_io.snapshot(),
            members,
            journal_records: self.activity.journal_records.get(),
            journal_bytes: self.activity.journal_bytes.get(),
            journal_commits: self.activity.journal_commits.get(),
            journal_checkpoints: self.activity.journal_checkpoints.get(),
            journal_parity_records: self.activity.journal_parity_records.get(),
            journal_parity_barriers: self.activity.journal_parity_barriers.get(),
            bitmap_writes: self.activity.bitmap_writes.get(),
        }
    }

    pub fn spares(&self) -> Vec<String> {
        self.meta
            .lock()
            .spares
            .iter()
            .map(|(_, m)| m.identity().to_string())
            .collect()
    }

    pub fn state(&self) -> ArrayState {
        let failed = self
            .slots
            .iter()
            .filter(|s| s.state() == SlotState::Failed)
            .count();
        let rebuilding = self
            .slots
            .iter()
            .filter(|s| s.state() == SlotState::Rebuilding)
            .count();
        // A slot failed with none to rebuild onto says degraded even while
        // another is rebuilt (a RAID6 down one member and rebuilding
        // another survives no further loss): a dashboard keyed on the
        // state must not read that as a rebuild with margin to spare.
        if !self.within_redundancy() {
            ArrayState::Failed
        } else if failed > 0 {
            ArrayState::Degraded
        } else if rebuilding > 0 {
            ArrayState::Rebuilding
        } else {
            ArrayState::Optimal
        }
    }

    /// Whether every slot's member is in sync: none failed, none being
    /// rebuilt. The rule for clearing write-intent bits (`may_clear`) and
    /// for a flush settling the journal (`journal_settles_at_flush`): a
    /// flush clears a bit only where it has settled the journal first.
    fn every_slot_in_sync(&self) -> bool {
        self.slots.iter().all(|s| s.state() == SlotState::Active)
    }

    /// Whether every byte can still be served.
    fn within_redundancy(&self) -> bool {
        self.within_redundancy_without(None)
    }

    /// The members by slot, for the data path (missing ones stand in).
    fn member_handles(&self) -> HandlesNow {
        self.handles.all.load()
    }

    /// The slots whose member is not failed: those a flush or a journal
    /// write reaches.
    fn present_slots(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].state() != SlotState::Failed)
            .collect()
    }

    fn failed_error(&self) -> ArrayError {
        let down: Vec<String> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state() != SlotState::Active)
            .map(|(i, s)| match s.member.read().as_ref() {
                Some(m) => format!("slot {i} ({})", m.identity()),
                None => format!("slot {i} (no device in use)"),
            })
            .collect();
        ArrayError::Failed {
            name: self.name.clone(),
            detail: format!(
                "{} down ({}), more than {} tolerates",
                match down.len() {
                    1 => "1 slot is".to_string(),
                    n => format!("{n} slots are"),
                },
                down.join(", "),
                self.geo.level
            ),
        }
    }

    /// Records an event that happened outside the array's own code (the
    /// parity engine falling back, say): logged, kept in the event log, and
    /// alerted on by the daemon like any other.
    pub fn record_event(&self, ev: ArrayEvent) {
        let mut meta = self.meta.lock();
        self.record(&mut meta, ev);
    }

    /// `record_event` where the metadata lock is free now; the event back
    /// where it is not. For a caller that must not wait for it: one on the
    /// data path, which a member failure holding that lock may be waiting
    /// for.
    pub fn try_record_event(&self, ev: ArrayEvent) -> std::result::Result<(), ArrayEvent> {
        match self.meta.try_lock() {
            Some(mut meta) => {
                self.record(&mut meta, ev);
                Ok(())
            }
            None => Err(ev),
        }
    }

    fn record(&self, meta: &mut Meta, ev: ArrayEvent) {
        let what = ev.describe();
        match ev.severity() {
            Severity::Critical => tracing::error!(array = %self.name, event = ev.kind(), "{what}"),
            Severity::Warning => tracing::warn!(array = %self.name, event = ev.kind(), "{what}"),
            Severity::Info => tracing::info!(array = %self.name, event = ev.kind(), "{what}"),
        }
        meta.log.push((SystemTime::now(), ev, self.state()));
    }

    pub fn slot_of(&self, identity: &str) -> Result<usize> {
        self.slots
            .iter()
            .position(|s| {
                s.member
                    .read()
                    .as_ref()
                    .is_some_and(|m| m.identity() == identity)
            })
            .ok_or_else(|| {
                ArrayError::Invalid(format!(
                    "{identity} is not a member of array '{}'",
                    self.name
                ))
            })
    }

    /// The superblock this array writes to the member in `role`.
    fn superblock(&self, meta: &Meta, role: u32, member_uuid: Uuid) -> Superblock {
        Superblock {
            array_uuid: self.uuid,
            member_uuid,
            role,
            level: self.geo.level,
            layout: metadata::LAYOUT_DEFAULT,
            chunk: self.geo.chunk as u32,
            clean: meta.clean,
            data_offset: self.data_offset,
            data_size: self.geo.member_size,
            events: meta.events,
            ctime: self.ctime,
            utime: now_secs(),
            settled: meta.settled,
            bitmap_region_rows: self.bitmap.as_ref().map(|b| b.region_rows).unwrap_or(0),
            name: self.name.clone(),
            slots: self
                .slots
                .iter()
                .map(|s| {
                    let state = s.state();
                    SlotEntry {
                        uuid: *s.uuid.read(),
                        state,
                        // Meaningful for a rebuilding slot only.
                        rebuild_row: if state == SlotState::Rebuilding {
                            s.saved_row()
                        } else {
                            0
                        },
                        // And this for a failed one.
                        left_events: if state == SlotState::Failed {
                            s.left_events.load(Ordering::Acquire)
                        } else {
                            0
                        },
                    }
                })
                .collect(),
            spares: meta.spares.iter().map(|(u, _)| *u).collect(),
        }
    }

    /// Like `write_metadata`, but any failure is an error (used at create).
    fn write_metadata_strict(&self) -> Result<()> {
        let mut meta = self.meta.lock();
        meta.events += 1;
        for (i, s) in self.slots.iter().enumerate() {
            let m = s.member.read().clone().expect("create fills every slot");
            self.blank_bitmap_of(&m)?;
            let sb = self.superblock(&meta, i as u32, *s.uuid.read());
            metadata::write_superblock(m.as_ref(), &sb).map_err(|e| ArrayError::Member {
                member: m.identity().into(),
                source: e,
            })?;
            s.member_events.store(sb.events, Ordering::Release);
        }
        for (u, m) in meta.spares.clone() {
            self.blank_bitmap_of(&m)?;
            let sb = self.superblock(&meta, ROLE_SPARE, u);
            metadata::write_superblock(m.as_ref(), &sb).map_err(|e| ArrayError::Member {
                member: m.identity().into(),
                source: e,
            })?;
        }
        meta.settled = meta.events;
        Ok(())
    }
}
