//! Model-based tests of the array: random writes, reads, flushes, zeroing,
//! member failures and rebuilds against an in-memory reference image, for
//! every level, on RAM and file members; concurrent writers; a rebuild under
//! load. Fixed seeds. `RAID_SOAK=1` runs many more operations.

mod support;

use raid_core::array::{Array, ArrayState, RebuildEnd, RebuildOptions};
use raid_core::layout::Level;
use raid_core::member::{FileMember, MemberRef, RamMember};
use raid_core::metadata::{SlotState, MIN_DATA_OFFSET};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use support::array::{assert_consistent, assert_matches, create, Members};

const BLOCK: u64 = 4096;

fn soak() -> u64 {
    if std::env::var("RAID_SOAK").is_ok_and(|v| v == "1") {
        20
    } else {
        1
    }
}

/// (level, members) combinations exercised.
const SHAPES: [(Level, usize); 9] = [
    (Level::Raid0, 3),
    (Level::Raid1, 2),
    (Level::Raid1, 3),
    (Level::Raid5, 3),
    (Level::Raid5, 5),
    (Level::Raid6, 4),
    (Level::Raid6, 7),
    (Level::Raid10, 4),
    (Level::Raid10, 3),
];

fn random_range(rng: &mut StdRng, cap: u64, max_blocks: u64) -> (u64, u64) {
    let blocks = cap / BLOCK;
    let n = rng.gen_range(1..=max_blocks.min(blocks));
    let start = rng.gen_range(0..=blocks - n);
    (start * BLOCK, n * BLOCK)
}

/// One model run: random operations, failures within redundancy, rebuilds
/// onto fresh members, and a reassembly at the end.
fn model_run(
    level: Level,
    chunk: u64,
    seed: u64,
    ops: u64,
    mut new_member: impl FnMut(usize) -> MemberRef,
    members: Vec<MemberRef>,
    faults: Option<&Members>,
) {
    let n = members.len();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut current = members.clone();
    let array = Array::create(
        members,
        vec![],
        raid_core::array::CreateOptions {
            name: "m".into(),
            level,
            chunk,
            data_offset: None,
        },
    )
    .unwrap();
    let cap = array.capacity();
    let mut model = vec![0u8; cap as usize];
    let stripe_blocks = array.geometry().stripe_data_bytes() / BLOCK;
    let mut replaced = 0;
    // Slots whose member has a fault armed but has not met it yet.
    let mut doomed: Vec<usize> = Vec::new();
    for op in 0..ops {
        match rng.gen_range(0..100) {
            0..=49 => {
                let (off, len) = random_range(&mut rng, cap, stripe_blocks * 2 + 3);
                let mut data = vec![0u8; len as usize];
                rng.fill(&mut data[..]);
                array
                    .write(off, &data)
                    .unwrap_or_else(|e| panic!("op {op}: write {off}+{len}: {e}"));
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
            50..=79 => {
                let (off, len) = random_range(&mut rng, cap, stripe_blocks * 2 + 3);
                let mut got = vec![0u8; len as usize];
                array
                    .read(off, &mut got)
                    .unwrap_or_else(|e| panic!("op {op}: read {off}+{len}: {e}"));
                assert!(
                    got[..] == model[off as usize..(off + len) as usize],
                    "op {op}: read {off}+{len} differs"
                );
            }
            80..=84 => array.flush().unwrap(),
            85..=89 => {
                let (off, len) = random_range(&mut rng, cap, stripe_blocks * 3 + 2);
                array.write_zeroes(off, len).unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            }
            _ => {
                // Fail a member if redundancy allows, else replace and rebuild.
                let mut failed: Vec<usize> = array
                    .slots()
                    .iter()
                    .filter(|s| s.state != SlotState::Active)
                    .map(|s| s.slot)
                    .collect();
                let down = {
                    let mut d = failed.clone();
                    d.extend(doomed.iter().filter(|x| !failed.contains(x)));
                    d.len()
                };
                if down < level.tolerated_failures(n) && level != Level::Raid10
                    || (level == Level::Raid10 && down == 0)
                {
                    let victim = rng.gen_range(0..n);
                    if failed.contains(&victim) || doomed.contains(&victim) {
                        continue;
                    }
                    match faults {
                        // A real I/O error: the next I/O to it fails the member.
                        Some(f) if rng.gen_bool(0.5) => {
                            f.faulty[victim].fail_all();
                            doomed.push(victim);
                        }
                        _ => {
                            array.fail_slot(victim, "test");
                        }
                    }
                } else if let Some(&slot) = failed.first().or(doomed.first()) {
                    if !failed.contains(&slot) {
                        // Armed but not met yet: make it official.
                        array.fail_slot(slot, "test");
                        failed.push(slot);
                    }
                    doomed.retain(|&d| d != slot);
                    if array.slots()[slot].state == SlotState::Failed {
                        replaced += 1;
                        let m = new_member(replaced);
                        current[slot] = m.clone();
                        array.replace(slot, m).unwrap();
                    }
                    let opts = RebuildOptions {
                        batch_rows: rng.gen_range(1..8),
                        ..Default::default()
                    };
                    assert_eq!(
                        array.rebuild(slot, &opts, &AtomicBool::new(false)).unwrap(),
                        RebuildEnd::Finished
                    );
                }
            }
        }
    }
    assert_matches(&array, &model);
    // Whatever is failed now, rebuild it, then redundancy must be exact.
    for d in doomed {
        array.fail_slot(d, "test");
    }
    for s in array.slots() {
        if s.state != SlotState::Active {
            if s.state == SlotState::Failed {
                replaced += 1;
                let m = new_member(replaced);
                current[s.slot] = m.clone();
                array.replace(s.slot, m).unwrap();
            }
            array
                .rebuild(s.slot, &RebuildOptions::default(), &AtomicBool::new(false))
                .unwrap();
        }
    }
    assert_eq!(array.state(), ArrayState::Optimal);
    assert_matches(&array, &model);
    assert_consistent(&array, &current);
    array.close().unwrap();
    drop(array);
    // Everything survives a stop and a fresh assembly from the members.
    let again = Array::assemble(current).unwrap();
    assert!(again.refused.is_empty());
    assert_eq!(again.array.state(), ArrayState::Optimal);
    assert_matches(&again.array, &model);
}

#[test]
fn model_every_level_on_ram_members() {
    for (k, &(level, n)) in SHAPES.iter().enumerate() {
        for chunk in [4096, 16384] {
            let data = 48 * chunk * if level == Level::Raid1 { 4 } else { 1 };
            let m = Members::ram(n, data, &format!("{level}-{n}-{chunk}-"));
            let tag = format!("{level}-{n}-{chunk}-new");
            model_run(
                level,
                chunk,
                1000 + k as u64 * 7 + chunk,
                600 * soak(),
                |i| {
                    Arc::new(RamMember::new(
                        format!("ram:{tag}{i}"),
                        MIN_DATA_OFFSET + data,
                    ))
                },
                m.refs(),
                Some(&m),
            );
        }
    }
}

#[test]
fn model_every_level_on_file_members() {
    let dir = tempdir();
    for (k, &(level, n)) in SHAPES.iter().enumerate() {
        let chunk = 8192;
        let data = 32 * chunk;
        let mk = |name: String| -> MemberRef {
            let p = dir.join(name);
            let f = std::fs::File::create(&p).unwrap();
            f.set_len(MIN_DATA_OFFSET + data).unwrap();
            Arc::new(FileMember::open(&p).unwrap())
        };
        let members: Vec<MemberRef> = (0..n).map(|i| mk(format!("{level}-{n}-{i}.img"))).collect();
        model_run(
            level,
            chunk,
            77 + k as u64,
            120 * soak(),
            |i| mk(format!("{level}-{n}-new{i}.img")),
            members,
            None,
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "raid-core-test-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Threads write their own interleaved blocks (so they share stripes) while
/// readers check; the final image and every stripe's parity must be exact.
#[test]
fn concurrent_writers_share_stripes_without_corrupting_parity() {
    for &(level, n) in &[
        (Level::Raid5, 4),
        (Level::Raid6, 6),
        (Level::Raid1, 2),
        (Level::Raid10, 3),
    ] {
        let m = Members::ram(n, 64 * 4096 * 4, &format!("cw-{level}-"));
        let array = Arc::new(create(level, &m, 4096));
        let cap = array.capacity();
        let threads = 4u64;
        let blocks = cap / BLOCK;
        let models: Vec<Vec<u8>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let array = array.clone();
                    sc.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(t + 5);
                        let mut mine = vec![0u8; cap as usize];
                        for _ in 0..400 * soak() {
                            // A block of this thread: b % threads == t.
                            let b = rng.gen_range(0..blocks / threads) * threads + t;
                            let mut data = vec![0u8; BLOCK as usize];
                            rng.fill(&mut data[..]);
                            array.write(b * BLOCK, &data).unwrap();
                            mine[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]
                                .copy_from_slice(&data);
                            let mut back = vec![0u8; BLOCK as usize];
                            array.read(b * BLOCK, &mut back).unwrap();
                            assert_eq!(back, data, "thread {t} block {b}");
                        }
                        mine
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut model = vec![0u8; cap as usize];
        for b in 0..blocks {
            let t = (b % threads) as usize;
            let r = (b * BLOCK) as usize..((b + 1) * BLOCK) as usize;
            model[r.clone()].copy_from_slice(&models[t][r]);
        }
        assert_matches(&array, &model);
        assert_consistent(&array, &m.refs());
    }
}

/// A member fails, a replacement rebuilds online while two writers keep
/// writing; afterwards the image is exact and parity/copies are consistent.
#[test]
fn online_rebuild_under_concurrent_writes() {
    for &(level, n) in &[
        (Level::Raid5, 4),
        (Level::Raid6, 5),
        (Level::Raid1, 3),
        (Level::Raid10, 4),
    ] {
        let data = 256 * 4096;
        let m = Members::ram(n, data, &format!("orb-{level}-"));
        let array = Arc::new(create(level, &m, 4096));
        let cap = array.capacity();
        let mut seed_model = vec![0u8; cap as usize];
        let mut rng = StdRng::seed_from_u64(9);
        rng.fill(&mut seed_model[..]);
        array.write(0, &seed_model).unwrap();
        array.fail_slot(1, "test");
        let new: MemberRef = Arc::new(RamMember::new(
            format!("ram:orb-{level}-new"),
            MIN_DATA_OFFSET + data,
        ));
        array.replace(1, new.clone()).unwrap();
        let blocks = cap / BLOCK;
        let models: Vec<Vec<(u64, Vec<u8>)>> = std::thread::scope(|sc| {
            let rb = {
                let array = array.clone();
                sc.spawn(move || {
                    let opts = RebuildOptions {
                        batch_rows: 4,
                        ..Default::default()
                    };
                    array.rebuild(1, &opts, &AtomicBool::new(false)).unwrap()
                })
            };
            let ws: Vec<_> = (0..2u64)
                .map(|t| {
                    let array = array.clone();
                    sc.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(100 + t);
                        let mut log = Vec::new();
                        for _ in 0..300 {
                            let b = rng.gen_range(0..blocks / 2) * 2 + t;
                            let mut d = vec![0u8; BLOCK as usize];
                            rng.fill(&mut d[..]);
                            array.write(b * BLOCK, &d).unwrap();
                            log.push((b, d));
                        }
                        log
                    })
                })
                .collect();
            assert_eq!(rb.join().unwrap(), RebuildEnd::Finished);
            ws.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut model = seed_model;
        for log in models {
            for (b, d) in log {
                model[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize].copy_from_slice(&d);
            }
        }
        assert_eq!(array.state(), ArrayState::Optimal, "{level}");
        assert_matches(&array, &model);
        let mut members = m.refs();
        members[1] = new;
        assert_consistent(&array, &members);
    }
}
