//! Layout geometry: where each byte of the array lives on the members.
//!
//! Pure functions, no I/O. Offsets here are relative to each member's data
//! area (the metadata lives in front of it, see `metadata`).
//!
//! - RAID0: chunk c on member c % n, row c / n.
//! - RAID1: every member holds the whole array.
//! - RAID5: rotating parity, md's default "left-symmetric": in stripe s, P is
//!   on member n-1-(s mod n) and data chunk i on (P + 1 + i) mod n, so
//!   sequential chunks walk across every member.
//! - RAID6: md's left-symmetric for RAID6: P on n-1-(s mod n), Q on (P+1) mod
//!   n, data chunk i on (P + 2 + i) mod n.
//! - RAID10: md's "near" layout with 2 copies: copy k of chunk c goes to slot
//!   2c+k of a row-major grid n members wide; odd member counts work (a chunk's
//!   two copies then straddle two rows), as in md.

use arrayvec::ArrayVec;
use std::fmt;

/// The RAID levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    Raid0,
    Raid1,
    Raid5,
    Raid6,
    Raid10,
}

impl Level {
    /// Every level, in the order the tables list them.
    pub const ALL: [Level; 5] = [
        Level::Raid0,
        Level::Raid1,
        Level::Raid5,
        Level::Raid6,
        Level::Raid10,
    ];

    pub fn from_number(n: u32) -> Option<Level> {
        Some(match n {
            0 => Level::Raid0,
            1 => Level::Raid1,
            5 => Level::Raid5,
            6 => Level::Raid6,
            10 => Level::Raid10,
            _ => return None,
        })
    }

    pub fn number(self) -> u32 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid10 => 10,
        }
    }

    /// Fewest members the level takes.
    pub fn min_members(self) -> usize {
        match self {
            Level::Raid0 => 1,
            Level::Raid1 => 2,
            Level::Raid5 => 3,
            Level::Raid6 => 4,
            Level::Raid10 => 2,
        }
    }

    /// Members that may fail at once without losing data, in the worst case.
    pub fn tolerated_failures(self, members: usize) -> usize {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => members - 1,
            Level::Raid5 => 1,
            Level::Raid6 => 2,
            Level::Raid10 => 1,
        }
    }

    /// The parity a stripe carries: P for RAID5, P+Q for RAID6, none else.
    pub fn parity_kind(self) -> Option<crate::parity::ParityKind> {
        match self {
            Level::Raid5 => Some(crate::parity::ParityKind::P),
            Level::Raid6 => Some(crate::parity::ParityKind::PQ),
            _ => None,
        }
    }

    /// Parity chunks per stripe (RAID5/6), or 0.
    pub fn parity_chunks(self) -> usize {
        match self {
            Level::Raid5 => 1,
            Level::Raid6 => 2,
            _ => 0,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raid{}", self.number())
    }
}

/// Smallest and largest chunk, and the default.
pub const MIN_CHUNK: u64 = 4 * 1024;
pub const MAX_CHUNK: u64 = 1024 * 1024;
/// 64 KiB: a 4 KiB random write on RAID5/6 then reads and writes 4 KiB pieces
/// of one chunk, while a 128 KiB-1 MiB sequential write covers whole stripes
/// of a 4-8 member array (full-stripe writes, no reads). md's 512 KiB default
/// makes full stripes rarer for ordinary request sizes; SPDK's raid5f and GPU
/// RAID cards use 64 KiB-128 KiB strips for the same reason.
pub const DEFAULT_CHUNK: u64 = 64 * 1024;

/// Why a geometry was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GeometryError {
    #[error(
        "{level} needs at least {min} members, {got} given: add members or choose another level"
    )]
    TooFewMembers {
        level: Level,
        got: usize,
        min: usize,
    },
    #[error("{level} takes at most {max} members, {got} given")]
    TooManyMembers {
        level: Level,
        got: usize,
        max: usize,
    },
    #[error("chunk size {0} bytes is not a power of two between 4 KiB and 1 MiB")]
    BadChunk(u64),
    #[error("members are too small: each needs its first MiB for the metadata and at least one chunk of {chunk} bytes after it (two for raid10): use larger devices, or a smaller --chunk")]
    TooSmall { chunk: u64 },
    #[error("spare {spare} is {size} bytes, smaller than the {need} bytes each member uses: name a spare at least as large as the members")]
    SpareTooSmall { spare: String, size: u64, need: u64 },
}

/// Most members an array may have (also bounded by the metadata's member table).
pub const MAX_MEMBERS: usize = 64;

/// One value per member (of a stripe, or of the array), held inline: the
/// data path asks these at every request, where a heap allocation each
/// time cost more than the asking.
pub type PerMember<T> = ArrayVec<T, MAX_MEMBERS>;

/// The shape of an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub level: Level,
    pub members: usize,
    /// Chunk (strip) size in bytes.
    pub chunk: u64,
    /// Bytes of each member's data area in use: a multiple of `chunk` (and,
    /// for RAID10, such that the grid has whole rows).
    pub member_size: u64,
}

/// Where one chunk of a stripe lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub member: usize,
    /// Byte offset of the chunk within the member's data area.
    pub offset: u64,
}

/// The members of one RAID5/6 stripe: the data chunks in order, then P, then
/// Q: exactly the order the parity engine takes chunks in. Held inline
/// (at most `MAX_MEMBERS`), not on the heap: every parity write and
/// degraded read asks for its stripe's map, several times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeMap {
    pub members: PerMember<usize>,
}

impl Geometry {
    /// Checks a proposed shape; `member_size` is the smallest member's data
    /// area and is rounded down to whole chunks.
    pub fn new(
        level: Level,
        members: usize,
        chunk: u64,
        member_size: u64,
    ) -> Result<Geometry, GeometryError> {
        if members < level.min_members() {
            return Err(GeometryError::TooFewMembers {
                level,
                got: members,
                min: level.min_members(),
            });
        }
        if members > MAX_MEMBERS {
            return Err(GeometryError::TooManyMembers {
                level,
                got: members,
                max: MAX_MEMBERS,
            });
        }
        if !chunk.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
            return Err(GeometryError::BadChunk(chunk));
        }
        let mut rows = member_size / chunk;
        if level == Level::Raid10 && members % 2 == 1 {
            // Whole chunks' pairs only: 2 * chunks = rows * members.
            rows -= rows % 2;
        }
        if rows == 0 {
            return Err(GeometryError::TooSmall { chunk });
        }
        Ok(Geometry {
            level,
            members,
            chunk,
            member_size: rows * chunk,
        })
    }

    /// Rows of chunks on each member (= stripes for RAID0/5/6).
    pub fn rows(&self) -> u64 {
        self.member_size / self.chunk
    }

    /// Data chunks per stripe.
    pub fn data_chunks(&self) -> usize {
        match self.level {
            Level::Raid0 => self.members,
            Level::Raid1 => 1,
            Level::Raid5 | Level::Raid6 => self.members - self.level.parity_chunks(),
            Level::Raid10 => 1,
        }
    }

    /// Usable bytes of the array.
    pub fn capacity(&self) -> u64 {
        match self.level {
            Level::Raid1 => self.member_size,
            Level::Raid10 => self.rows() * self.members as u64 / 2 * self.chunk,
            _ => self.rows() * self.data_chunks() as u64 * self.chunk,
        }
    }

    /// Bytes of data in one stripe (the unit of a full-stripe write).
    pub fn stripe_data_bytes(&self) -> u64 {
        self.data_chunks() as u64 * self.chunk
    }

    /// The members of parity stripe `s` (RAID5/6 only), data then P[, Q].
    pub fn stripe_map(&self, s: u64) -> StripeMap {
        let n = self.members;
        let p = n - 1 - (s % n as u64) as usize;
        let first_data = (p + self.level.parity_chunks()) % n;
        let mut members: PerMember<usize> = (0..self.data_chunks())
            .map(|i| (first_data + i) % n)
            .collect();
        members.push(p);
        if self.level == Level::Raid6 {
            members.push((p + 1) % n);
        }
        StripeMap { members }
    }

    /// Member holding data chunk `idx` of parity stripe `s` (RAID5/6), the
    /// same answer as `stripe_map(s).members[idx]` without building the map.
    #[inline]
    pub fn stripe_member(&self, s: u64, idx: usize) -> usize {
        let n = self.members;
        let p = n - 1 - (s % n as u64) as usize;
        if idx < self.data_chunks() {
            (p + self.level.parity_chunks() + idx) % n
        } else {
            (p + idx - self.data_chunks()) % n
        }
    }

    /// The copy of chunk `c` a read goes to first (RAID1, RAID10; 0 for
    /// the others): every member the first copy of as many chunks as any
    /// other, so that reads at random keep every member busy. RAID1 takes
    /// turns by chunk. RAID10's two copies of chunk `c` lie on places
    /// `2c` and `2c + 1` of the member rows: with an even member count,
    /// chunk `c` sits on the same two members as chunk `c + n/2`, and
    /// where `n/2` is even too (4, 8, 12 members) taking turns by chunk
    /// (`c % 2`) left half the members with no reads at all. Turns by row
    /// spread them for every even count (and by row and chunk with an odd
    /// count, where a pair's members change row by row).
    #[inline]
    pub fn read_copy(&self, c: u64) -> usize {
        let n = self.members as u64;
        match self.level {
            Level::Raid1 => (c % n) as usize,
            Level::Raid10 => ((2 * c / n + (n % 2) * c) % 2) as usize,
            _ => 0,
        }
    }

    /// Copy `k` of logical chunk `c` for RAID0 (k = 0), RAID1 and RAID10:
    /// `chunk_copies(c)[k]` without the vector.
    #[inline]
    pub fn copy_place(&self, c: u64, k: usize) -> Place {
        let n = self.members as u64;
        match self.level {
            Level::Raid1 => Place {
                member: k,
                offset: c * self.chunk,
            },
            Level::Raid10 => {
                let slot = 2 * c + k as u64;
                Place {
                    member: (slot % n) as usize,
                    offset: slot / n * self.chunk,
                }
            }
            _ => Place {
                member: (c % n) as usize,
                offset: c / n * self.chunk,
            },
        }
    }

    /// Copies per logical chunk.
    pub fn copies(&self) -> usize {
        match self.level {
            Level::Raid1 => self.members,
            Level::Raid10 => 2,
            _ => 1,
        }
    }

    /// Whether every byte can still be served with the members marked in
    /// `down` (by slot) out: RAID10 is judged pair by pair (each chunk needs
    /// one of its copies; the pattern repeats every `members` chunks), the
    /// others by count. The one rule for a running array's state, its
    /// membership checks, and the status of a stopped one.
    pub fn serves_all_without(&self, down: &[bool]) -> bool {
        match self.level {
            Level::Raid10 => (0..self.members as u64)
                .all(|c| self.chunk_copies(c).iter().any(|p| !down[p.member])),
            l => down.iter().filter(|&&d| d).count() <= l.tolerated_failures(self.members),
        }
    }

    /// Every copy of logical chunk `c` (RAID0: one, RAID1: all members,
    /// RAID10: two). For RAID5/6 use `stripe_map`.
    pub fn chunk_copies(&self, c: u64) -> Vec<Place> {
        let n = self.members as u64;
        match self.level {
            Level::Raid0 => vec![Place {
                member: (c % n) as usize,
                offset: c / n * self.chunk,
            }],
            Level::Raid1 => (0..self.members)
                .map(|m| Place {
                    member: m,
                    offset: c * self.chunk,
                })
                .collect(),
            Level::Raid10 => (0..2)
                .map(|k| {
                    let slot = 2 * c + k;
                    Place {
                        member: (slot % n) as usize,
                        offset: slot / n * self.chunk,
                    }
                })
                .collect(),
            Level::Raid5 | Level::Raid6 => {
                let s = c / self.data_chunks() as u64;
                let map = self.stripe_map(s);
                vec![Place {
                    member: map.members[(c % self.data_chunks() as u64) as usize],
                    offset: s * self.chunk,
                }]
            }
        }
    }

    /// Which logical chunks (and which copy) have a chunk on `member` at row
    /// `row`: the inverse of the maps above, used by rebuild and tests.
    pub fn chunk_at(&self, member: usize, row: u64) -> ChunkRole {
        let n = self.members as u64;
        match self.level {
            Level::Raid0 => ChunkRole::Data(row * n + member as u64),
            Level::Raid1 => ChunkRole::Data(row),
            Level::Raid10 => ChunkRole::Data((row * n + member as u64) / 2),
            Level::Raid5 | Level::Raid6 => {
                let map = self.stripe_map(row);
                let i = map
                    .members
                    .iter()
                    .position(|&m| m == member)
                    .expect("every member is in every stripe");
                let d = self.data_chunks();
                match i.cmp(&d) {
                    std::cmp::Ordering::Less => ChunkRole::Data(row * d as u64 + i as u64),
                    std::cmp::Ordering::Equal => ChunkRole::P(row),
                    std::cmp::Ordering::Greater => ChunkRole::Q(row),
                }
            }
        }
    }
}

/// What a member's chunk at some row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkRole {
    /// A copy of logical chunk c.
    Data(u64),
    /// Parity of stripe s.
    P(u64),
    Q(u64),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const LEVELS: [Level; 5] = Level::ALL;

    /// For RAID1 and RAID10 of 2 to 16 members: over a whole number of
    /// turns, each member is the first copy reads go to of as many chunks
    /// as any other.
    #[test]
    fn reads_go_first_to_every_member_alike() {
        for level in [Level::Raid1, Level::Raid10] {
            for n in level.min_members().max(2)..=16 {
                let g = Geometry::new(level, n, 4096, 4096 * 4 * n as u64).unwrap();
                let mut first = vec![0u64; n];
                let chunks = 4 * n as u64;
                for c in 0..chunks {
                    first[g.copy_place(c, g.read_copy(c)).member] += 1;
                }
                let each = chunks / n as u64;
                assert!(
                    first.iter().all(|&f| f == each),
                    "{level} of {n}: first reads per member {first:?}"
                );
            }
        }
    }

    /// For every level and member count 1..=12: every member row holds
    /// exactly one thing, every logical chunk has the level's number of
    /// copies on distinct members, and the forward and inverse maps agree.
    #[test]
    fn every_place_is_used_once_and_maps_agree() {
        for level in LEVELS {
            for n in level.min_members()..=12 {
                let g = Geometry::new(level, n, 4096, 4096 * 24).unwrap();
                let mut owner: HashMap<(usize, u64), ChunkRole> = HashMap::new();
                let chunks = g.capacity() / g.chunk;
                for c in 0..chunks {
                    let copies = g.chunk_copies(c);
                    let want = match level {
                        Level::Raid1 => n,
                        Level::Raid10 => 2,
                        _ => 1,
                    };
                    assert_eq!(copies.len(), want, "{level} n={n} c={c}");
                    let mut ms: Vec<usize> = copies.iter().map(|p| p.member).collect();
                    ms.sort();
                    ms.dedup();
                    assert_eq!(ms.len(), want, "{level} n={n} c={c}: copies share a member");
                    for p in copies {
                        assert!(p.offset + g.chunk <= g.member_size);
                        let row = p.offset / g.chunk;
                        assert_eq!(
                            g.chunk_at(p.member, row),
                            ChunkRole::Data(c),
                            "{level} n={n} c={c}"
                        );
                        assert!(
                            owner.insert((p.member, row), ChunkRole::Data(c)).is_none(),
                            "{level} n={n}: {p:?} used twice"
                        );
                    }
                }
                if level.parity_chunks() > 0 {
                    for s in 0..g.rows() {
                        let map = g.stripe_map(s);
                        assert_eq!(map.members.len(), n);
                        let d = g.data_chunks();
                        assert_eq!(g.chunk_at(map.members[d], s), ChunkRole::P(s));
                        assert!(owner.insert((map.members[d], s), ChunkRole::P(s)).is_none());
                        if level == Level::Raid6 {
                            assert_eq!(g.chunk_at(map.members[d + 1], s), ChunkRole::Q(s));
                            assert!(owner
                                .insert((map.members[d + 1], s), ChunkRole::Q(s))
                                .is_none());
                        }
                    }
                }
                // Every member row holds something (RAID1: each row of each member).
                assert_eq!(owner.len() as u64, g.rows() * n as u64, "{level} n={n}");
            }
        }
    }

    #[test]
    fn shortcuts_agree_with_the_maps() {
        for level in LEVELS {
            for n in level.min_members()..=9 {
                let g = Geometry::new(level, n, 4096, 4096 * 36).unwrap();
                if level.parity_chunks() > 0 {
                    for s in 0..g.rows() {
                        let map = g.stripe_map(s);
                        for (i, &m) in map.members.iter().enumerate() {
                            assert_eq!(g.stripe_member(s, i), m);
                        }
                    }
                } else {
                    for c in 0..g.capacity() / g.chunk {
                        let copies = g.chunk_copies(c);
                        assert_eq!(copies.len(), g.copies());
                        for (k, p) in copies.iter().enumerate() {
                            assert_eq!(g.copy_place(c, k), *p);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn raid5_left_symmetric_matches_md() {
        // md, 4 disks, left-symmetric: stripe 0 = D0 D1 D2 P, stripe 1 = D4 D5 P D3,
        // stripe 2 = D8 P D6 D7, stripe 3 = P D9 D10 D11.
        let g = Geometry::new(Level::Raid5, 4, 4096, 4096 * 8).unwrap();
        assert_eq!(g.stripe_map(0).members[..], [0, 1, 2, 3]);
        assert_eq!(g.stripe_map(1).members[..], [3, 0, 1, 2]);
        assert_eq!(g.stripe_map(2).members[..], [2, 3, 0, 1]);
        assert_eq!(g.stripe_map(3).members[..], [1, 2, 3, 0]);
        assert_eq!(g.stripe_map(4).members[..], [0, 1, 2, 3]);
    }

    #[test]
    fn raid6_left_symmetric_matches_md() {
        // md raid6 left-symmetric, 5 disks: pd_idx = 4 - (s mod 5), qd_idx =
        // pd_idx + 1 (wrapping), data from pd_idx + 2. Stripe 0: Q D0 D1 D2 P.
        let g = Geometry::new(Level::Raid6, 5, 4096, 4096 * 10).unwrap();
        assert_eq!(g.stripe_map(0).members[..], [1, 2, 3, 4, 0]);
        assert_eq!(g.stripe_map(1).members[..], [0, 1, 2, 3, 4]);
        assert_eq!(g.stripe_map(2).members[..], [4, 0, 1, 2, 3]);
    }

    #[test]
    fn capacities() {
        let m = 1 << 20;
        assert_eq!(
            Geometry::new(Level::Raid0, 4, 65536, m).unwrap().capacity(),
            4 * m
        );
        assert_eq!(
            Geometry::new(Level::Raid1, 3, 65536, m).unwrap().capacity(),
            m
        );
        assert_eq!(
            Geometry::new(Level::Raid5, 4, 65536, m).unwrap().capacity(),
            3 * m
        );
        assert_eq!(
            Geometry::new(Level::Raid6, 6, 65536, m).unwrap().capacity(),
            4 * m
        );
        assert_eq!(
            Geometry::new(Level::Raid10, 4, 65536, m)
                .unwrap()
                .capacity(),
            2 * m
        );
        assert_eq!(
            Geometry::new(Level::Raid10, 3, 65536, m)
                .unwrap()
                .capacity(),
            3 * m / 2
        );
        // Member size rounds down to whole chunks.
        assert_eq!(
            Geometry::new(Level::Raid0, 2, 65536, m + 5000)
                .unwrap()
                .member_size,
            m
        );
    }

    #[test]
    fn refusals() {
        assert_eq!(
            Geometry::new(Level::Raid6, 3, 65536, 1 << 20),
            Err(GeometryError::TooFewMembers {
                level: Level::Raid6,
                got: 3,
                min: 4
            })
        );
        assert_eq!(
            Geometry::new(Level::Raid5, 3, 3000, 1 << 20),
            Err(GeometryError::BadChunk(3000))
        );
        assert_eq!(
            Geometry::new(Level::Raid5, 3, 2 << 20, 1 << 30),
            Err(GeometryError::BadChunk(2 << 20))
        );
        assert_eq!(
            Geometry::new(Level::Raid5, 3, 65536, 1000),
            Err(GeometryError::TooSmall { chunk: 65536 })
        );
    }
}
