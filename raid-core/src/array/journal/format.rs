//! The journal's on-disk format: header and record blocks, how a record
//! is built and sealed, and how the bytes of a member's journal area are
//! read back (docs/on-disk-format.md). No state: `mod.rs` keeps the ring.

use crate::buf::AlignedBuf;
use crate::metadata::Uuid;
use crate::metadata::JOURNAL_OFFSET;

const HEAD_MAGIC: &[u8; 8] = b"NVRAIDJH";
/// A header's first sector checks itself: the array's UUID at 24 and the
/// CRC of the sector's first 508 bytes at 508, besides the whole block's
/// (the UUID at `UUID_AT`, the CRC at 4092) that every version reads. A
/// drive writes a sector whole or not at all, so a power cut during a
/// header's write leaves the first sector old or new, and the header reads
/// as one or the other. With the block's CRC alone (all earlier versions
/// wrote), the cut tore the header on every member in sync, and the next
/// start replayed the ring from its oldest record, records long in place
/// and overwritten since among them. (Found by the deterministic
/// simulation.)
const HEAD_SECTOR: usize = 512;
/// Where the first sector's copy of the UUID sits.
const HEAD_UUID_AT: usize = 24;
pub(super) const REC_MAGIC: &[u8; 8] = b"NVRAIDJR";
/// A record of the other kind (`Kind::Parity`). A magic of its own, not
/// a flag: a version that does not know the kind stops its chain there,
/// rather than write the columns as if they went in place as they are.
pub(super) const PARITY_REC_MAGIC: &[u8; 8] = b"NVRAIDJP";
pub(super) const BLOCK: u64 = 4096;
pub(super) const RECORDS: u64 = JOURNAL_OFFSET + BLOCK;
/// Most chunk entries one record header can list.
pub(super) const MAX_ENTRIES: usize = 400;
/// Where the array's UUID sits in a header or record block (after the
/// entry table's last byte, 48 + 8 * MAX_ENTRIES, before the CRC).
pub(super) const UUID_AT: usize = 4060;

/// What a record's columns are, and so how replay puts it in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Every column the write puts in place, data and parity, each
    /// written as it is.
    Columns,
    /// Only the new columns of the data chunks that exist only as parity
    /// (their members missing, or not to be trusted after a crash).
    /// Replay reads the other data chunks' columns from their members,
    /// computes the parity from them and these, and writes it (and these
    /// columns, where their members are present). A whole-stripe write
    /// to a RAID5 missing a data member records one chunk, not all
    /// seven of eight (`Array::parity_record`).
    Parity,
}

impl Kind {
    fn magic(self) -> &'static [u8; 8] {
        match self {
            Kind::Columns => REC_MAGIC,
            Kind::Parity => PARITY_REC_MAGIC,
        }
    }

    fn of_magic(m: &[u8]) -> Option<Kind> {
        [Kind::Columns, Kind::Parity]
            .into_iter()
            .find(|k| k.magic() == m)
    }
}

/// One record: which stripe and columns, its kind, and per chunk (index
/// in the stripe, slot) its new columns.
pub(super) struct Record {
    pub(super) kind: Kind,
    pub(super) seq: u64,
    pub(super) stripe: u64,
    pub(super) lo: u64,
    pub(super) hi: u64,
    pub(super) entries: Vec<(usize, usize, Vec<u8>)>,
}

/// A header: every record up to `tail` is in place, and the next lies at
/// `tail_at`.
pub(super) fn encode_head(tail: u64, tail_at: u64, uuid: &Uuid) -> AlignedBuf {
    let mut b = encode_head_spread(tail, tail_at, uuid);
    b[HEAD_UUID_AT..HEAD_UUID_AT + 16].copy_from_slice(&uuid.0);
    let sector = crc32c::crc32c(&b[..HEAD_SECTOR - 4]);
    b[HEAD_SECTOR - 4..HEAD_SECTOR].copy_from_slice(&sector.to_le_bytes());
    let block = crc32c::crc32c(&b[..4092]);
    b[4092..].copy_from_slice(&block.to_le_bytes());
    b
}

/// A header as versions before the first sector's own check wrote it:
/// the block's CRC alone.
pub(super) fn encode_head_spread(tail: u64, tail_at: u64, uuid: &Uuid) -> AlignedBuf {
    let mut b = AlignedBuf::new(BLOCK as usize);
    b[..8].copy_from_slice(HEAD_MAGIC);
    b[8..16].copy_from_slice(&tail.to_le_bytes());
    b[16..24].copy_from_slice(&tail_at.to_le_bytes());
    b[UUID_AT..UUID_AT + 16].copy_from_slice(&uuid.0);
    let crc = crc32c::crc32c(&b[..4092]);
    b[4092..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A header's tail sequence and the place of the record after it (zero
/// in headers from before the ring was reclaimed in place: the area's
/// start, where the records then always began), in an area ending at
/// `end`.
pub(super) fn decode_head(b: &[u8], uuid: &Uuid, end: u64) -> Option<(u64, u64)> {
    if &b[..8] != HEAD_MAGIC {
        return None;
    }
    // The first sector's own check, else the whole block's (a header an
    // earlier version wrote).
    let checks = |crc_end: usize, uuid_at: usize| {
        crc32c::crc32c(&b[..crc_end]).to_le_bytes() == b[crc_end..crc_end + 4]
            && b[uuid_at..uuid_at + 16] == uuid.0
    };
    if !checks(HEAD_SECTOR - 4, HEAD_UUID_AT) && !checks(4092, UUID_AT) {
        return None;
    }
    let get = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let at = match get(16) {
        0 => RECORDS,
        at => at,
    };
    (RECORDS..=end).contains(&at).then_some((get(8), at))
}

/// A record's bytes before it has a sequence: built (the payload copied)
/// outside the journal's lock; under it, the sequence and the checksum go
/// in (`seal`). The checksum covers the header first, sequence included,
/// so it is computed there: joining a payload's checksum computed before
/// (`crc32c_combine`) cost more, per record, than the hardware CRC of the
/// payload itself.
pub(super) struct Unsealed {
    pub(super) b: AlignedBuf,
}

impl Unsealed {
    /// A record of `kind` of `entries` (chunk index, slot, new columns
    /// [lo, hi)) of stripe `stripe`.
    pub(super) fn new(
        kind: Kind,
        stripe: u64,
        lo: u64,
        hi: u64,
        entries: &[(usize, usize, &[u8])],
        uuid: &Uuid,
    ) -> Self {
        let width = (hi - lo) as usize;
        // Every byte is written below: the header block zeroed, then each
        // column copied whole (`entries.len()` columns of `width`).
        let mut b = AlignedBuf::for_overwrite(BLOCK as usize + entries.len() * width);
        b[..BLOCK as usize].fill(0);
        b[..8].copy_from_slice(kind.magic());
        b[UUID_AT..UUID_AT + 16].copy_from_slice(&uuid.0);
        let mut put = |o: usize, v: u64| b[o..o + 8].copy_from_slice(&v.to_le_bytes());
        put(16, stripe);
        put(24, lo);
        put(32, hi);
        put(40, entries.len() as u64);
        for (k, (idx, slot, data)) in entries.iter().enumerate() {
            let o = 48 + k * 8;
            b[o..o + 4].copy_from_slice(&(*idx as u32).to_le_bytes());
            b[o + 4..o + 8].copy_from_slice(&(*slot as u32).to_le_bytes());
            let p = BLOCK as usize + k * width;
            b[p..p + width].copy_from_slice(data);
        }
        Unsealed { b }
    }

    /// Puts in the sequence, then the CRC over the header (less its last 4
    /// bytes) and the payload.
    pub(super) fn seal(&mut self, seq: u64) {
        let b = &mut self.b;
        b[8..16].copy_from_slice(&seq.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..4092]), &b[BLOCK as usize..]);
        b[4092..4096].copy_from_slice(&crc.to_le_bytes());
    }
}
/// How many records a journal area written by an earlier version (no
/// array UUID: zeros where it now sits) holds past its header's tail, if
/// any: those were not yet in place when it stopped.
pub(super) fn legacy_records_owed(area: &[u8]) -> Option<usize> {
    let none = Uuid([0; 16]);
    let (tail, _) = decode_head(
        &area[..BLOCK as usize],
        &none,
        JOURNAL_OFFSET + area.len() as u64,
    )?;
    let mut at = BLOCK as usize;
    let mut owed = 0;
    while let Some((rec, len)) = decode_record(&area[at..], &none) {
        if rec.seq > tail {
            owed += 1;
        }
        at += len;
    }
    (owed > 0).then_some(owed)
}

/// Every whole record of this array in `ring` (the area after the
/// header) at any block boundary, chained or not: its sequence, where it
/// starts in `ring`, its length.
pub(super) fn sealed_records<'r>(
    ring: &'r [u8],
    uuid: &'r Uuid,
) -> impl Iterator<Item = (u64, usize, usize)> + 'r {
    (0..ring.len())
        .step_by(512)
        .filter_map(move |at| sealed_record(&ring[at..], uuid).map(|(seq, len)| (seq, at, len)))
}

/// Whether `b` starts with a whole record of this array (magic, UUID,
/// fields that make sense, checksum): its sequence and length.
fn sealed_record(b: &[u8], uuid: &Uuid) -> Option<(u64, usize)> {
    if b.len() < BLOCK as usize
        || Kind::of_magic(&b[..8]).is_none()
        || b[UUID_AT..UUID_AT + 16] != uuid.0
    {
        return None;
    }
    let get = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (seq, lo, hi, count) = (get(8), get(24), get(32), get(40) as usize);
    // Columns lie within one chunk, of at most MAX_CHUNK bytes.
    if hi <= lo || count == 0 || count > MAX_ENTRIES || (hi - lo) > crate::layout::MAX_CHUNK {
        return None;
    }
    let len = count
        .checked_mul((hi - lo) as usize)?
        .checked_add(BLOCK as usize)?;
    if b.len() < len {
        return None;
    }
    let mut crc = crc32c::crc32c(&b[..4092]);
    crc = crc32c::crc32c_append(crc, &b[BLOCK as usize..len]);
    (crc.to_le_bytes() == b[4092..4096]).then_some((seq, len))
}

/// A record at the start of `b`, and its length; None at the end of the
/// records (no magic, torn, or a checksum that does not match).
pub(super) fn decode_record(b: &[u8], uuid: &Uuid) -> Option<(Record, usize)> {
    let (seq, len) = sealed_record(b, uuid)?;
    let kind = Kind::of_magic(&b[..8])?;
    let get = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (stripe, lo, hi, count) = (get(16), get(24), get(32), get(40) as usize);
    let width = (hi - lo) as usize;
    let entries = (0..count)
        .map(|k| {
            let o = 48 + k * 8;
            let idx = u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
            let slot = u32::from_le_bytes(b[o + 4..o + 8].try_into().unwrap()) as usize;
            let p = BLOCK as usize + k * width;
            (idx, slot, b[p..p + width].to_vec())
        })
        .collect();
    Some((
        Record {
            kind,
            seq,
            stripe,
            lo,
            hi,
            entries,
        },
        len,
    ))
}
