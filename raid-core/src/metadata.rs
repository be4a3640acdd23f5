//! On-disk metadata: one 4 KiB superblock per member, kept in two copies (at
//! byte 0 and byte 4096) so a torn write of one leaves the other valid.
//! The byte layout is documented in docs/on-disk-format.md; the constants
//! below are the single source of it.

use crate::layout::{Geometry, Level, MAX_MEMBERS};
use std::fmt;

pub const MAGIC: [u8; 8] = *b"NVRAIDSB";
pub const VERSION: u32 = 1;
pub const SB_SIZE: usize = 4096;
/// Where the two copies live on each member.
pub const SB_OFFSETS: [u64; 2] = [0, 4096];
/// Where the write-intent bitmap lives on every member: one 4 KiB block
/// after the two superblock copies, one bit per region of rows.
pub const BITMAP_OFFSET: u64 = 8192;
pub const BITMAP_BYTES: usize = 4096;

/// The journal that closes the write hole of degraded RAID5/6 writes: from
/// here to the data, on every member (the same records on each).
pub const JOURNAL_OFFSET: u64 = BITMAP_OFFSET + BITMAP_BYTES as u64;

/// Where member data starts on arrays with the small journal: 1 MiB,
/// leaving room after the superblocks for a write-intent bitmap and a
/// journal ring of a little under 1 MiB, and keeping data 1 MiB-aligned.
/// Every array made before the larger ring (and every RAID0/1/10, which
/// keeps no journal) has its data here.
pub const MIN_DATA_OFFSET: u64 = 1 << 20;
/// Where member data starts on a RAID5/6 of members of at least
/// `LARGE_RING_MEMBERS`: a 16 MiB journal ring. A degraded write's record
/// holds its new chunks and parity (260 KiB for a 128 KiB write at a 128
/// KiB chunk), so the small ring holds three such records, and every
/// checkpoint that frees it flushes each member: degraded 128 KiB writes
/// ran 3.1-3.8x faster on a virtual disk with the large ring
/// (`docs/benchmarks.md`). 15 MiB more per member is 1.5% of a 1 GiB
/// member and nothing on a drive.
pub const LARGE_RING_DATA_OFFSET: u64 = 16 << 20;
/// The smallest member that gets the large ring.
pub const LARGE_RING_MEMBERS: u64 = 1 << 30;
/// The largest data offset this version reads (the journal ring is read
/// whole at every start).
pub const MAX_DATA_OFFSET: u64 = 64 << 20;

/// Where a new array's data starts on its members: after a large journal
/// ring where the level keeps a journal (RAID5/6) and the smallest member
/// can spare it, else at `MIN_DATA_OFFSET`.
pub fn data_offset_for(level: Level, smallest_member: u64) -> u64 {
    if level.parity_chunks() > 0 && smallest_member >= LARGE_RING_MEMBERS {
        LARGE_RING_DATA_OFFSET
    } else {
        MIN_DATA_OFFSET
    }
}

/// Whether this version can place a journal and data by `offset`: a
/// whole number of MiB from `MIN_DATA_OFFSET` to `MAX_DATA_OFFSET`.
pub fn data_offset_is_valid(offset: u64) -> bool {
    (MIN_DATA_OFFSET..=MAX_DATA_OFFSET).contains(&offset) && offset.is_multiple_of(MIN_DATA_OFFSET)
}
/// Spare slots recorded in the superblock.
pub const MAX_SPARES: usize = 16;
/// `role` of a spare.
pub const ROLE_SPARE: u32 = u32::MAX;
/// Layout code of the layouts in `layout.rs` (md left-symmetric, near-2).
pub const LAYOUT_DEFAULT: u32 = 0;
/// Name field length.
pub const NAME_LEN: usize = 64;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_FLAGS: usize = 12;
const OFF_ARRAY_UUID: usize = 16;
const OFF_MEMBER_UUID: usize = 32;
const OFF_ROLE: usize = 48;
const OFF_LEVEL: usize = 52;
const OFF_LAYOUT: usize = 56;
const OFF_CHUNK: usize = 60;
const OFF_MEMBERS: usize = 64;
const OFF_SPARES: usize = 68;
const OFF_DATA_OFFSET: usize = 72;
const OFF_DATA_SIZE: usize = 80;
const OFF_EVENTS: usize = 88;
const OFF_CTIME: usize = 96;
const OFF_NAME: usize = 104;
const OFF_BITMAP_ROWS: usize = 168;
const OFF_UTIME: usize = 176;
const OFF_SETTLED: usize = 184;
const OFF_TABLE: usize = 256;
const ENTRY: usize = 32;
const OFF_SPARE_TABLE: usize = OFF_TABLE + MAX_MEMBERS * ENTRY; // 2304
/// `SlotEntry::left_events`, 8 bytes per slot (zero in metadata written
/// before the field: read as "not known").
const OFF_LEFT_TABLE: usize = OFF_SPARE_TABLE + MAX_SPARES * 16; // 2560
const OFF_CRC: usize = SB_SIZE - 4; // 4092

const FLAG_CLEAN: u32 = 1;

/// The state of a member slot as recorded in metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// In sync, trusted.
    Active,
    /// Failed or missing: never read until rebuilt.
    Failed,
    /// Being rebuilt; rows below `rebuild_row` are in sync.
    Rebuilding,
}

impl SlotState {
    fn code(self) -> u32 {
        match self {
            SlotState::Active => 1,
            SlotState::Failed => 2,
            SlotState::Rebuilding => 3,
        }
    }
    fn from_code(c: u32) -> Option<SlotState> {
        Some(match c {
            1 => SlotState::Active,
            2 => SlotState::Failed,
            3 => SlotState::Rebuilding,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            SlotState::Active => "active",
            SlotState::Failed => "failed",
            SlotState::Rebuilding => "rebuilding",
        }
    }
}

/// One member slot of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotEntry {
    pub uuid: Uuid,
    pub state: SlotState,
    /// For Rebuilding: rows (chunks of the member) already in sync.
    pub rebuild_row: u64,
    /// For Failed: the event counter of the last metadata its member took
    /// before it failed (0: not known, as in metadata written before this
    /// field). A re-add resyncs only the bitmap's regions onto a member
    /// whose own metadata is at least that new; an older copy of it (a
    /// server restarted on an old image, a disk put back from a backup)
    /// lacks writes the bitmap no longer marks, and is copied whole.
    pub left_events: u64,
}

/// A 16-byte UUID, printed in the usual 8-4-4-4-12 form.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    pub fn random() -> Uuid {
        Uuid(*uuid::Uuid::new_v4().as_bytes())
    }
    pub fn is_nil(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", uuid::Uuid::from_bytes(self.0).hyphenated())
    }
}

impl fmt::Debug for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Everything one superblock says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub array_uuid: Uuid,
    pub member_uuid: Uuid,
    /// Slot index of this member, or ROLE_SPARE.
    pub role: u32,
    pub level: Level,
    pub layout: u32,
    pub chunk: u32,
    pub clean: bool,
    pub data_offset: u64,
    /// Bytes of each member's data area in use.
    pub data_size: u64,
    /// Bumped on every metadata change: the newest copy across members wins.
    pub events: u64,
    /// Creation time, seconds since the Unix epoch.
    pub ctime: u64,
    /// When this superblock was written, seconds since the Unix epoch (0 in
    /// metadata written before the field existed).
    pub utime: u64,
    /// The event counter of the last metadata change every member not
    /// failed took (0: not known, as in metadata written before the field).
    /// A member of a slot serving in the newest metadata whose own metadata
    /// is older than this is an older copy of the member, not one a crash
    /// left behind (see `array::assemble`).
    pub settled: u64,
    /// Rows per bit of the write-intent bitmap; 0 when there is none.
    pub bitmap_region_rows: u64,
    pub name: String,
    pub slots: Vec<SlotEntry>,
    pub spares: Vec<Uuid>,
}

/// Why a superblock was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MetaError {
    #[error("no array metadata (magic not found)")]
    NoMagic,
    #[error("metadata checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the block is corrupt")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("metadata format version {0} is not supported (this build reads version {VERSION})")]
    BadVersion(u32),
    #[error("metadata field {field} is invalid: {why}")]
    BadField { field: &'static str, why: String },
}

fn get_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn get_u64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}
fn get_uuid(b: &[u8], o: usize) -> Uuid {
    Uuid(b[o..o + 16].try_into().unwrap())
}
fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

fn bad(field: &'static str, why: impl Into<String>) -> MetaError {
    MetaError::BadField {
        field,
        why: why.into(),
    }
}

impl Superblock {
    /// Whether this, the metadata a device holds for `slot`, is older than
    /// `truth` (the newest metadata) says that slot's member took: for a
    /// slot serving, the event every member took (`settled`: a crash mid-
    /// change leaves a member behind the newest event, never behind that);
    /// for a slot failed, the event its member had taken when it left (0:
    /// not known). Such a device is an older copy of the member (an image
    /// put back, a clone swapped in), missing the writes since. Returns the
    /// event it should hold at least.
    pub fn older_copy_in(&self, truth: &Superblock, slot: usize) -> Option<u64> {
        let entry = truth.slots.get(slot)?;
        let expected = match entry.state {
            SlotState::Failed => entry.left_events,
            _ => truth.settled,
        };
        (self.events < expected).then_some(expected)
    }

    /// Whether this member, of slot `slot` in `view` (another member's
    /// metadata), took metadata changes after `view` had it leave: `view`
    /// holds the slot failed, with this member's uuid, at a known event,
    /// and this member carries a later one. A failed member gets no
    /// metadata from the array it left, save one change whose first copy
    /// landed as it failed; more, only an assembly without the members
    /// that failed it writes on it. Alone this is no proof of a split
    /// brain (that one landed copy; a member re-added since); that takes
    /// both sides having gone on (`array::assemble`).
    pub fn went_on_after(&self, view: &Superblock, slot: usize) -> bool {
        view.slots.get(slot).is_some_and(|e| {
            e.state == SlotState::Failed
                && e.uuid == self.member_uuid
                && e.left_events > 0
                && self.events > e.left_events
        })
    }

    /// The geometry this superblock describes.
    pub fn geometry(&self) -> Geometry {
        Geometry {
            level: self.level,
            members: self.slots.len(),
            chunk: self.chunk as u64,
            member_size: self.data_size,
        }
    }

    /// Serialises into one 4 KiB block with its checksum.
    pub fn encode(&self) -> [u8; SB_SIZE] {
        assert!(self.slots.len() <= MAX_MEMBERS && self.spares.len() <= MAX_SPARES);
        let mut b = [0u8; SB_SIZE];
        b[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&MAGIC);
        put_u32(&mut b, OFF_VERSION, VERSION);
        put_u32(&mut b, OFF_FLAGS, if self.clean { FLAG_CLEAN } else { 0 });
        b[OFF_ARRAY_UUID..OFF_ARRAY_UUID + 16].copy_from_slice(&self.array_uuid.0);
        b[OFF_MEMBER_UUID..OFF_MEMBER_UUID + 16].copy_from_slice(&self.member_uuid.0);
        put_u32(&mut b, OFF_ROLE, self.role);
        put_u32(&mut b, OFF_LEVEL, self.level.number());
        put_u32(&mut b, OFF_LAYOUT, self.layout);
        put_u32(&mut b, OFF_CHUNK, self.chunk);
        put_u32(&mut b, OFF_MEMBERS, self.slots.len() as u32);
        put_u32(&mut b, OFF_SPARES, self.spares.len() as u32);
        put_u64(&mut b, OFF_DATA_OFFSET, self.data_offset);
        put_u64(&mut b, OFF_DATA_SIZE, self.data_size);
        put_u64(&mut b, OFF_EVENTS, self.events);
        put_u64(&mut b, OFF_CTIME, self.ctime);
        put_u64(&mut b, OFF_BITMAP_ROWS, self.bitmap_region_rows);
        put_u64(&mut b, OFF_UTIME, self.utime);
        put_u64(&mut b, OFF_SETTLED, self.settled);
        let name = self.name.as_bytes();
        let n = name.len().min(NAME_LEN);
        b[OFF_NAME..OFF_NAME + n].copy_from_slice(&name[..n]);
        for (i, s) in self.slots.iter().enumerate() {
            let o = OFF_TABLE + i * ENTRY;
            b[o..o + 16].copy_from_slice(&s.uuid.0);
            put_u32(&mut b, o + 16, s.state.code());
            put_u64(&mut b, o + 24, s.rebuild_row);
            put_u64(&mut b, OFF_LEFT_TABLE + i * 8, s.left_events);
        }
        for (i, u) in self.spares.iter().enumerate() {
            let o = OFF_SPARE_TABLE + i * 16;
            b[o..o + 16].copy_from_slice(&u.0);
        }
        let crc = crc32c::crc32c(&b[..OFF_CRC]);
        put_u32(&mut b, OFF_CRC, crc);
        b
    }

    /// Parses and validates one block. Never panics, whatever the bytes.
    pub fn decode(b: &[u8]) -> Result<Superblock, MetaError> {
        if b.len() < SB_SIZE || b[..8] != MAGIC {
            return Err(MetaError::NoMagic);
        }
        let stored = get_u32(b, OFF_CRC);
        let computed = crc32c::crc32c(&b[..OFF_CRC]);
        if stored != computed {
            return Err(MetaError::BadChecksum { stored, computed });
        }
        let version = get_u32(b, OFF_VERSION);
        if version != VERSION {
            return Err(MetaError::BadVersion(version));
        }
        let level_n = get_u32(b, OFF_LEVEL);
        let level = Level::from_number(level_n)
            .ok_or_else(|| bad("level", format!("{level_n} is not 0, 1, 5, 6 or 10")))?;
        let layout = get_u32(b, OFF_LAYOUT);
        if layout != LAYOUT_DEFAULT {
            return Err(bad("layout", format!("unknown layout code {layout}")));
        }
        let members = get_u32(b, OFF_MEMBERS) as usize;
        if members < level.min_members() || members > MAX_MEMBERS {
            return Err(bad(
                "member count",
                format!("{members} members for {level}"),
            ));
        }
        let spares = get_u32(b, OFF_SPARES) as usize;
        if spares > MAX_SPARES {
            return Err(bad("spare count", format!("{spares} > {MAX_SPARES}")));
        }
        let chunk = get_u32(b, OFF_CHUNK);
        let data_size = get_u64(b, OFF_DATA_SIZE);
        let geo = Geometry::new(level, members, chunk as u64, data_size)
            .map_err(|e| bad("geometry", e.to_string()))?;
        if geo.member_size != data_size {
            return Err(bad(
                "data size",
                format!("{data_size} is not a whole number of rows"),
            ));
        }
        let data_offset = get_u64(b, OFF_DATA_OFFSET);
        // The journal ring ends, and the data starts, here: an offset this
        // version does not place data by (a later format) would be read at
        // the wrong place, so it is refused.
        if !data_offset_is_valid(data_offset) {
            return Err(bad(
                "data offset",
                format!(
                    "{data_offset} (this version reads arrays whose data starts at a whole number of MiB from {MIN_DATA_OFFSET} to {MAX_DATA_OFFSET})"
                ),
            ));
        }
        let bitmap_region_rows = get_u64(b, OFF_BITMAP_ROWS);
        if bitmap_region_rows != 0
            && geo.rows().div_ceil(bitmap_region_rows) > (BITMAP_BYTES * 8) as u64
        {
            return Err(bad(
                "bitmap region",
                format!(
                    "{bitmap_region_rows} rows per bit cannot cover {} rows",
                    geo.rows()
                ),
            ));
        }
        let role = get_u32(b, OFF_ROLE);
        if role != ROLE_SPARE && role as usize >= members {
            return Err(bad("role", format!("slot {role} of {members}")));
        }
        let name_raw = &b[OFF_NAME..OFF_NAME + NAME_LEN];
        let name_end = name_raw.iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
        let name = std::str::from_utf8(&name_raw[..name_end])
            .map_err(|_| bad("name", "not UTF-8"))?
            .to_string();
        let mut slots = Vec::with_capacity(members);
        for i in 0..members {
            let o = OFF_TABLE + i * ENTRY;
            let code = get_u32(b, o + 16);
            let state = SlotState::from_code(code)
                .ok_or_else(|| bad("slot state", format!("slot {i}: code {code}")))?;
            let rebuild_row = get_u64(b, o + 24);
            if rebuild_row > geo.rows() {
                return Err(bad(
                    "rebuild position",
                    format!("slot {i}: row {rebuild_row} > {}", geo.rows()),
                ));
            }
            slots.push(SlotEntry {
                uuid: get_uuid(b, o),
                state,
                rebuild_row,
                left_events: get_u64(b, OFF_LEFT_TABLE + i * 8),
            });
        }
        let spares = (0..spares)
            .map(|i| get_uuid(b, OFF_SPARE_TABLE + i * 16))
            .collect();
        let (events, settled) = (get_u64(b, OFF_EVENTS), get_u64(b, OFF_SETTLED));
        if settled > events {
            return Err(bad(
                "settled event",
                format!("{settled}, past the metadata's own event {events}"),
            ));
        }
        Ok(Superblock {
            array_uuid: get_uuid(b, OFF_ARRAY_UUID),
            member_uuid: get_uuid(b, OFF_MEMBER_UUID),
            role,
            level,
            layout,
            chunk,
            clean: get_u32(b, OFF_FLAGS) & FLAG_CLEAN != 0,
            data_offset,
            data_size,
            events,
            ctime: get_u64(b, OFF_CTIME),
            utime: get_u64(b, OFF_UTIME),
            settled,
            bitmap_region_rows,
            name,
            slots,
            spares,
        })
    }
}

/// Reads both copies from a member and returns the valid one with the
/// highest event counter; when neither is valid, says what is wrong with each.
pub fn read_superblock(m: &dyn crate::member::Member) -> Result<Superblock, ReadError> {
    let mut buf = crate::buf::AlignedBuf::new(SB_SIZE);
    let mut best: Option<Superblock> = None;
    let mut errors = Vec::new();
    let mut damaged = false;
    let mut unreadable = false;
    for off in SB_OFFSETS {
        let r = if m.size() < off + SB_SIZE as u64 {
            Err(format!(
                "copy at byte {off}: the device is too small to hold it"
            ))
        } else {
            match m.read_at(&mut buf, off) {
                Err(e) => {
                    unreadable = true;
                    Err(format!("copy at byte {off}: read error: {e}"))
                }
                Ok(()) => Superblock::decode(&buf).map_err(|e| {
                    damaged |= e != MetaError::NoMagic;
                    format!("copy at byte {off}: {e}")
                }),
            }
        };
        match r {
            Ok(sb) => {
                if best.as_ref().is_none_or(|b| sb.events > b.events) {
                    best = Some(sb);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    best.ok_or(ReadError {
        why: errors.join("; "),
        damaged,
        unreadable,
    })
}

/// Why no copy of a member's metadata could be used (one reason per copy).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{why}")]
pub struct ReadError {
    pub why: String,
    /// A copy carried this format's magic but was not valid (corrupt, or
    /// of a newer version): a member whose metadata is damaged, not a
    /// device that never held any.
    pub damaged: bool,
    /// A copy could not be read at all (an I/O error): what the device
    /// holds is not known, which is not the same as holding nothing.
    pub unreadable: bool,
}

/// Erases both superblock copies of a member (zeros), then flushes: the
/// device then carries no array's metadata. Each copy, and the flush, is
/// tried whatever the others' outcome; the first error is returned.
pub fn erase_superblocks(m: &dyn crate::member::Member) -> std::io::Result<()> {
    let zero = crate::buf::AlignedBuf::new(SB_SIZE);
    let erased: Vec<std::io::Result<()>> = SB_OFFSETS
        .iter()
        .map(|&off| m.write_at(&zero, off))
        .collect();
    let flushed = m.flush();
    erased
        .into_iter()
        .collect::<std::io::Result<()>>()
        .and(flushed)
}

/// Writes a superblock to one member: copy 0, flush, copy 1, flush. A crash
/// between the two leaves one complete copy, old or new.
pub fn write_superblock(m: &dyn crate::member::Member, sb: &Superblock) -> std::io::Result<()> {
    let mut buf = crate::buf::AlignedBuf::new(SB_SIZE);
    buf.copy_from_slice(&sb.encode());
    for off in SB_OFFSETS {
        m.write_at(&buf, off)?;
        m.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            array_uuid: Uuid([1; 16]),
            member_uuid: Uuid([2; 16]),
            role: 1,
            level: Level::Raid6,
            layout: LAYOUT_DEFAULT,
            chunk: 65536,
            clean: true,
            data_offset: MIN_DATA_OFFSET,
            data_size: 65536 * 100,
            events: 42,
            ctime: 1_700_000_000,
            utime: 1_700_000_100,
            settled: 40,
            bitmap_region_rows: 16,
            name: "data".into(),
            slots: (0..5)
                .map(|i| SlotEntry {
                    uuid: Uuid([10 + i as u8; 16]),
                    state: match i {
                        3 => SlotState::Rebuilding,
                        4 => SlotState::Failed,
                        _ => SlotState::Active,
                    },
                    rebuild_row: if i == 3 { 7 } else { 0 },
                    left_events: if i == 4 { 41 } else { 0 },
                })
                .collect(),
            spares: vec![Uuid([99; 16])],
        }
    }

    #[test]
    fn round_trip() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode()), Ok(sb));
    }

    /// The documented byte positions (docs/on-disk-format.md), pinned.
    #[test]
    fn byte_layout_is_as_documented() {
        let b = sample().encode();
        assert_eq!(&b[0..8], b"NVRAIDSB");
        assert_eq!(get_u32(&b, 8), 1);
        assert_eq!(get_u32(&b, 12), 1); // clean
        assert_eq!(&b[16..32], &[1; 16]);
        assert_eq!(&b[32..48], &[2; 16]);
        assert_eq!(get_u32(&b, 48), 1);
        assert_eq!(get_u32(&b, 52), 6);
        assert_eq!(get_u32(&b, 60), 65536);
        assert_eq!(get_u32(&b, 64), 5);
        assert_eq!(get_u32(&b, 68), 1);
        assert_eq!(get_u64(&b, 72), 1 << 20);
        assert_eq!(get_u64(&b, 80), 65536 * 100);
        assert_eq!(get_u64(&b, 88), 42);
        assert_eq!(&b[104..108], b"data");
        assert_eq!(get_u64(&b, 168), 16);
        assert_eq!(get_u64(&b, 176), 1_700_000_100);
        assert_eq!(get_u64(&b, 184), 40);
        assert_eq!(&b[256 + 3 * 32..256 + 3 * 32 + 16], &[13; 16]);
        assert_eq!(get_u32(&b, 256 + 3 * 32 + 16), 3);
        assert_eq!(get_u64(&b, 256 + 3 * 32 + 24), 7);
        assert_eq!(&b[2304..2320], &[99; 16]);
        assert_eq!(get_u32(&b, 4092), crc32c::crc32c(&b[..4092]));
    }

    /// Well-formed metadata naming a data offset this version does not
    /// place data by is refused, not read at the wrong place; the offsets
    /// it does are read back.
    #[test]
    fn another_data_offset_is_refused() {
        for bad in [
            0,
            MIN_DATA_OFFSET / 2,
            MIN_DATA_OFFSET + 4096,
            2 * MAX_DATA_OFFSET,
        ] {
            let mut sb = sample();
            sb.data_offset = bad;
            let e = Superblock::decode(&sb.encode()).unwrap_err();
            assert!(format!("{e:?}").contains("data offset"), "{bad}: {e:?}");
        }
        for good in [MIN_DATA_OFFSET, LARGE_RING_DATA_OFFSET, MAX_DATA_OFFSET] {
            let mut sb = sample();
            sb.data_offset = good;
            assert_eq!(Superblock::decode(&sb.encode()).unwrap().data_offset, good);
        }
    }

    /// The large ring goes to RAID5/6 of large members only.
    #[test]
    fn the_large_ring_goes_where_a_journal_is_kept_on_large_members() {
        assert_eq!(
            data_offset_for(Level::Raid5, LARGE_RING_MEMBERS),
            LARGE_RING_DATA_OFFSET
        );
        assert_eq!(
            data_offset_for(Level::Raid6, 1 << 40),
            LARGE_RING_DATA_OFFSET
        );
        assert_eq!(
            data_offset_for(Level::Raid5, LARGE_RING_MEMBERS - 1),
            MIN_DATA_OFFSET
        );
        for level in [Level::Raid0, Level::Raid1, Level::Raid10] {
            assert_eq!(data_offset_for(level, 1 << 40), MIN_DATA_OFFSET);
        }
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let good = sample().encode();
        for byte in (0..SB_SIZE).step_by(7) {
            let mut b = good;
            b[byte] ^= 0x10;
            assert!(Superblock::decode(&b).is_err(), "flip at {byte} accepted");
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 1;
        // RAID_FUZZ_ITERS for a long run by hand.
        let iters: u64 = std::env::var("RAID_FUZZ_ITERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000);
        for _ in 0..iters {
            let mut b = [0u8; SB_SIZE];
            for c in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *c = x as u8;
            }
            // Valid magic and checksum over garbage fields: must be refused
            // field by field, never panic.
            b[..8].copy_from_slice(&MAGIC);
            put_u32(&mut b, OFF_VERSION, VERSION);
            let crc = crc32c::crc32c(&b[..OFF_CRC]);
            put_u32(&mut b, OFF_CRC, crc);
            let _ = Superblock::decode(&b);
        }
        assert_eq!(Superblock::decode(&[0u8; 10]), Err(MetaError::NoMagic));
    }
}
