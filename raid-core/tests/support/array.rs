//! Helpers for the array tests: members with fault handles, a reference
//! image, and a consistency check that reads the members directly.

use raid_core::array::{Array, CreateOptions};
use raid_core::layout::{ChunkRole, Level};
use raid_core::member::{FaultyMember, Member, MemberRef, RamMember};
use raid_core::metadata::{SlotState, MIN_DATA_OFFSET};
use raid_core::parity::{CpuEngine, ParityEngine};
use std::sync::Arc;

pub struct Members {
    pub faulty: Vec<Arc<FaultyMember>>,
}

impl Members {
    pub fn ram(n: usize, data_bytes: u64, tag: &str) -> Members {
        Members {
            faulty: (0..n)
                .map(|i| {
                    let ram: MemberRef = Arc::new(RamMember::new(
                        format!("ram:{tag}{i}"),
                        MIN_DATA_OFFSET + data_bytes,
                    ));
                    Arc::new(FaultyMember::new(ram))
                })
                .collect(),
        }
    }
    pub fn refs(&self) -> Vec<MemberRef> {
        self.faulty.iter().map(|f| f.clone() as MemberRef).collect()
    }
    /// Flips 3 bytes at `offset` of `member`, behind the array's back.
    pub fn corrupt(&self, member: usize, offset: u64) {
        let mut b = [0u8; 3];
        self.faulty[member].read_at(&mut b, offset).unwrap();
        for x in b.iter_mut() {
            *x ^= 0x5c;
        }
        self.faulty[member].write_at(&b, offset).unwrap();
    }
}

pub fn create(level: Level, members: &Members, chunk: u64) -> Array {
    Array::create(
        members.refs(),
        vec![],
        CreateOptions {
            name: "t".into(),
            level,
            chunk,
            data_offset: None,
        },
    )
    .expect("create")
}

/// An array of `level` over `members`, every byte written (4 KiB blocks
/// of their own values) and flushed, so that every region of its bitmap is
/// marked: dropped without a stop, it is a crash to start again from.
/// Returns it with the image written.
pub fn written_whole(level: Level, members: &Members, chunk: u64) -> (Array, Vec<u8>) {
    let a = create(level, members, chunk);
    let image = fill_whole(&a);
    (a, image)
}

/// Writes every byte of `a` (4 KiB blocks of their own values) and
/// flushes it: every region of its bitmap marked. Returns the image.
pub fn fill_whole(a: &Array) -> Vec<u8> {
    let image: Vec<u8> = (0..a.capacity())
        .map(|i| (i / 4096 * 7 + 1) as u8)
        .collect();
    a.write(0, &image).unwrap();
    a.flush().unwrap();
    image
}

/// The first `n` stripes where slot `missing` holds a data chunk: a write
/// there while it is missing is journaled. (Where it holds the parity, the
/// write is its data alone: nothing of the stripe exists only as parity.)
pub fn journaled_rows(a: &Array, missing: usize, n: usize) -> Vec<u64> {
    let g = a.geometry();
    (0..)
        .filter(|&s| g.stripe_map(s).members[..g.data_chunks()].contains(&missing))
        .take(n)
        .collect()
}

/// An array named `tag` over `members`, shared (as the shards take it).
pub fn create_shared(level: Level, members: Vec<MemberRef>, tag: &str, chunk: u64) -> Arc<Array> {
    Arc::new(
        Array::create(
            members,
            vec![],
            CreateOptions {
                name: tag.into(),
                level,
                chunk,
                data_offset: None,
            },
        )
        .expect("create"),
    )
}

/// `n` file members in `dir`, each of `data_bytes` after the metadata.
pub fn files(dir: &std::path::Path, n: usize, data_bytes: u64) -> Vec<MemberRef> {
    (0..n)
        .map(|i| {
            let p = dir.join(format!("m{i}.img"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(MIN_DATA_OFFSET + data_bytes)
                .unwrap();
            Arc::new(raid_core::member::FileMember::open(&p).unwrap()) as MemberRef
        })
        .collect()
}

/// A folder in memory for member files, `/dev/shm/<tag>-<pid>`, where
/// /dev/shm exists (tmpfs): members there are copies in memory
/// (`Member::in_memory`), which the engine serves differently.
pub fn memory_dir(tag: &str) -> Option<std::path::PathBuf> {
    let shm = std::path::Path::new("/dev/shm");
    shm.is_dir()
        .then(|| shm.join(format!("{tag}-{}", std::process::id())))
}

/// A simulated datacenter drive (80 us reads, 20 us writes, 128 at once)
/// of `data_bytes` after the metadata.
pub fn sim_drive(name: String, data_bytes: u64) -> raid_core::member::SimNvme {
    let model = raid_core::member::NvmeModel::datacenter();
    raid_core::member::SimNvme::new(name, MIN_DATA_OFFSET + data_bytes, model)
}

/// Reads the whole array and compares it with the model.
pub fn assert_matches(array: &Array, model: &[u8]) {
    let mut got = vec![0u8; model.len()];
    array.read(0, &mut got).expect("full read");
    if got != model {
        let first = got.iter().zip(model).position(|(a, b)| a != b).unwrap();
        panic!(
            "array differs from the model at byte {first} (block {})",
            first / 4096
        );
    }
}

/// Checks redundancy on the members themselves: every stripe's P (and Q)
/// equal the parity of its data; every copy of a mirrored chunk is equal.
/// Only active members are looked at.
pub fn assert_consistent(array: &Array, members: &[MemberRef]) {
    let g = array.geometry();
    let slots = array.slots();
    let active: Vec<bool> = slots.iter().map(|s| s.state == SlotState::Active).collect();
    let chunk = g.chunk as usize;
    let read = |m: usize, row: u64| {
        let mut b = vec![0u8; chunk];
        members[m]
            .read_at(&mut b, MIN_DATA_OFFSET + row * g.chunk)
            .unwrap();
        b
    };
    match g.level {
        Level::Raid5 | Level::Raid6 => {
            if active.iter().any(|a| !a) {
                return; // degraded: parity is what holds the missing data
            }
            let e = CpuEngine::new();
            for s in 0..g.rows() {
                let map = g.stripe_map(s);
                let chunks: Vec<Vec<u8>> = map.members.iter().map(|&m| read(m, s)).collect();
                let nd = g.data_chunks();
                let data: Vec<&[u8]> = chunks[..nd].iter().map(|c| &c[..]).collect();
                let (mut p, mut q) = (vec![0u8; chunk], vec![0u8; chunk]);
                if g.level == Level::Raid6 {
                    e.gen_pq(&data, &mut p, &mut q).unwrap();
                    assert!(q == chunks[nd + 1], "stripe {s}: Q mismatch");
                } else {
                    e.gen_p(&data, &mut p).unwrap();
                }
                assert!(p == chunks[nd], "stripe {s}: P mismatch");
            }
        }
        Level::Raid1 | Level::Raid10 => {
            let chunks = g.capacity() / g.chunk;
            for c in 0..chunks {
                let copies: Vec<Vec<u8>> = g
                    .chunk_copies(c)
                    .iter()
                    .filter(|p| active[p.member])
                    .map(|p| read(p.member, p.offset / g.chunk))
                    .collect();
                for w in copies.windows(2) {
                    assert!(w[0] == w[1], "chunk {c}: copies differ");
                }
            }
        }
        Level::Raid0 => {
            let _ = ChunkRole::Data(0);
        }
    }
}
