//! Power cuts with writes in flight on the shards (fixed seeds): rounds of
//! writes through `shard::Engine` (many at once, some across stripes: cut
//! into a write per stripe on the shards, or on the blocking path where
//! they cover a stripe whole), flushes and drives draining their caches on
//! their own, then every member loses its unflushed writes while a last
//! round is in flight (and the drives drain their caches meanwhile). The next start must recover on its own: every
//! block acknowledged before the last flush reads back intact, every other
//! block holds one of the values it had since, and once every slot is in
//! sync again, every stripe's parity agrees with its data. The RAID5/6
//! runs repeat with one member failed before the rounds: their writes are
//! journaled on the shards, records committed in groups by the journal's
//! committer; and again with that member replaced and rebuilt through the
//! rounds and the cut (writes to rows the rebuild passed but has not saved
//! as in sync journaled too: written in place without a record, both
//! levels lost a flushed block at their first seed).
//! `RAID_SOAK=1` runs ten times the seeds; a failure names its seed, and
//! `CUT_SEED=K cargo test -p raid-core --test shard_power_cuts` runs that
//! one alone (its plan is the seed's; where the cut lands among the writes
//! in flight depends on thread timing, so a rerun may pass).

use raid_core::array::{Array, CreateOptions};
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{FaultyMember, Member, MemberRef, NvmeModel, SimNvme};
use raid_core::metadata::MIN_DATA_OFFSET;
use raid_core::shard::Engine;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;
use support::power_cut::{paced_rebuild, rebuild_and_scrub, CutModel};

mod support;

const BLOCK: usize = 4096;
const CHUNK: u64 = 4096;
const ROWS: u64 = 128;

/// The seeds each level runs from its first: `CUT_SEED=K` only K (a
/// failure names its seed), `RAID_SOAK=1` 300, else 30.
fn seeds(first: u64) -> std::ops::Range<u64> {
    if let Some(k) = std::env::var("CUT_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        // Only the level whose seeds hold it.
        return if (first..first + 1000).contains(&k) {
            k..k + 1
        } else {
            0..0
        };
    }
    let n = if std::env::var("RAID_SOAK").is_ok_and(|v| v == "1") {
        300
    } else {
        30
    };
    first..first + n
}

fn drive(name: String) -> Arc<FaultyMember> {
    let model = NvmeModel {
        read: Duration::from_micros(6),
        write: Duration::from_micros(3),
        queue: 64,
        read_bw: 0,
        write_bw: 0,
    };
    let d = SimNvme::new(name, MIN_DATA_OFFSET + ROWS * CHUNK, model);
    Arc::new(FaultyMember::new(Arc::new(d)))
}

/// One round: up to `n` writes of 1 to `most` blocks at once (no two on a
/// block), through the shards, each noted in `WRITTEN`. Each answer comes
/// on the channel returned: whether the write succeeded.
fn round(
    e: &Engine,
    rng: &mut StdRng,
    blocks: usize,
    n: usize,
    most: usize,
) -> mpsc::Receiver<bool> {
    let mut taken = vec![false; blocks];
    let (tx, rx) = mpsc::channel();
    for _ in 0..n {
        let nb = rng.gen_range(1..=most);
        let b0 = rng.gen_range(0..=blocks - nb);
        if taken[b0..b0 + nb].iter().any(|&t| t) {
            continue;
        }
        taken[b0..b0 + nb].iter_mut().for_each(|t| *t = true);
        let mut data = AlignedBuf::new(nb * BLOCK);
        rng.fill(&mut data[..]);
        let tx = tx.clone();
        WRITTEN.with(|w| w.borrow_mut().push((b0, data[..].to_vec())));
        e.write(
            (b0 * BLOCK) as u64,
            data,
            Box::new(move |r| {
                let _ = tx.send(r.is_ok());
            }),
        );
    }
    rx
}

thread_local! {
    /// Writes sent in the current round: (first block, bytes).
    static WRITTEN: std::cell::RefCell<Vec<(usize, Vec<u8>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What the array is before the rounds.
#[derive(Clone, Copy, PartialEq)]
enum Before {
    Optimal,
    /// One member failed.
    Degraded,
    /// One member failed and replaced, its rebuild running (paced, its
    /// position saved every 16 rows) through the rounds and the cut.
    Rebuilding,
}

/// What one run saw before its cut.
struct Run {
    /// Writes the shards served themselves.
    on_shards: u64,
    /// The cut came in the middle of a rebuild.
    mid_rebuild: bool,
}

/// One seed's run: the array as `before` says, the rounds, the cut during
/// the last, recovery and its checks.
fn run(level: Level, n: usize, seed: u64, before: Before) -> Run {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut members: Vec<Arc<FaultyMember>> =
        (0..n).map(|i| drive(format!("sim:pc{seed}-{i}"))).collect();
    let refs: Vec<MemberRef> = members.iter().map(|f| f.clone() as MemberRef).collect();
    let a = Arc::new(
        Array::create(
            refs.clone(),
            vec![],
            CreateOptions {
                name: format!("pc{seed}"),
                level,
                chunk: CHUNK,
                data_offset: None,
            },
        )
        .unwrap(),
    );
    let initial: Vec<u8> = (0..a.capacity() as usize)
        .map(|i| ((i as u64 * 2654435761) >> 13) as u8)
        .collect();
    a.write(0, &initial).unwrap();
    a.flush().unwrap();
    let mut refs = refs;
    if before != Before::Optimal {
        let i = rng.gen_range(0..n);
        a.fail_member(i, false).unwrap();
        if before == Before::Rebuilding {
            members[i] = drive(format!("sim:pc{seed}-r{i}"));
            refs[i] = members[i].clone() as MemberRef;
            a.replace(i, refs[i].clone()).unwrap();
        }
    }
    let blocks = a.capacity() as usize / BLOCK;
    // Writes of up to 6 blocks; on the mirrors (one block per chunk) one,
    // so that every write is the shards' (a write across chunks is the
    // blocking path's, and its bitmap bits would cover for theirs).
    let most = match level {
        Level::Raid1 | Level::Raid10 => 1,
        _ => 6,
    };
    let mut model = CutModel::new(initial.clone(), BLOCK);
    for f in &members {
        f.track_power_cut();
    }
    let e = Engine::start(a.clone(), 2).unwrap();
    let stop_rebuild = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rebuild = (before == Before::Rebuilding).then(|| {
        let (a, stop) = (a.clone(), stop_rebuild.clone());
        std::thread::spawn(move || {
            let _ = a.rebuild_all(&paced_rebuild(4 << 20, 16 * CHUNK), &stop);
        })
    });
    let note = |model: &mut CutModel| {
        for (b0, bytes) in WRITTEN.with(|w| std::mem::take(&mut *w.borrow_mut())) {
            model.wrote(b0, &bytes);
        }
    };
    for _ in 0..rng.gen_range(2..12) {
        match rng.gen_range(0..10) {
            0..=5 => {
                let n = rng.gen_range(1..48);
                let rx = round(&e, &mut rng, blocks, n, most);
                note(&mut model);
                for ok in rx {
                    assert!(ok, "{level} seed {seed}: a write failed with the power on");
                }
            }
            6..=7 => {
                // Quiet (every write answered): a flush through the engine
                // covers them all. Asked for three times at once, the
                // flushing thread may answer them with one flush.
                let (tx, rx) = mpsc::channel();
                for _ in 0..3 {
                    let tx = tx.clone();
                    e.flush(Box::new(move |r| tx.send(r.is_ok()).unwrap()));
                }
                for _ in 0..3 {
                    assert!(rx.recv().unwrap(), "{level} seed {seed}: a flush failed");
                }
                model.flushed();
            }
            _ => {
                let i = rng.gen_range(0..n);
                members[i].flush().unwrap();
            }
        }
    }
    let on_shards = e.counts().writes_on_shards.load(Ordering::Relaxed);
    // The cut, with a round in flight: every drive at one instant, each
    // losing what it had not flushed.
    let last = rng.gen_range(8..64);
    let rx = round(&e, &mut rng, blocks, last, most);
    note(&mut model);
    // Meanwhile the drives drain their caches on their own, each at its
    // own moments: what is durable at the cut is not all or nothing.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut drains = StdRng::seed_from_u64(seed + 1_000_000);
    let cut_after = Duration::from_micros(rng.gen_range(0..300));
    let mut mid_rebuild = false;
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_micros(drains.gen_range(10..100)));
                let _ = members[drains.gen_range(0..n)].flush();
            }
        });
        std::thread::sleep(cut_after);
        mid_rebuild = (0..n).any(|i| a.rebuild_progress(i).is_some_and(|(d, t)| d > 0 && d < t));
        FaultyMember::power_cut_together(&members).unwrap();
        stop.store(true, Ordering::Release);
    });
    stop_rebuild.store(true, Ordering::Release);
    if let Some(r) = rebuild {
        r.join().unwrap();
    }
    // Every write is answered, Ok or not.
    let answered = rx.iter().count();
    assert!(answered > 0);
    drop(e);
    drop(a);
    for f in &members {
        f.power_on();
    }
    let asm =
        Array::assemble(refs).unwrap_or_else(|e| panic!("{level} seed {seed}: no recovery: {e}"));
    let a = asm.array;
    let mut got = vec![0u8; a.capacity() as usize];
    a.read(0, &mut got).unwrap();
    let what = format!("{level} seed {seed}");
    model.check(&got, &what);
    // A member the cut failed is rebuilt.
    let new = |slot| drive(format!("sim:pc{seed}-new{slot}")) as MemberRef;
    rebuild_and_scrub(&a, &got, new, &what);
    Run {
        on_shards,
        mid_rebuild,
    }
}

#[test]
fn power_cuts_under_shard_writes_raid5() {
    for seed in seeds(0) {
        run(Level::Raid5, 5, seed, Before::Optimal);
    }
}

#[test]
fn power_cuts_under_shard_writes_raid6() {
    for seed in seeds(1000) {
        run(Level::Raid6, 6, seed, Before::Optimal);
    }
}

/// A member out (`before`: failed, or being rebuilt): the rounds' writes
/// inside one stripe are the shards', journaled there where the stripe
/// is degraded (a write across stripes, or the first since the array was
/// clean, is the blocking path's).
fn run_with_a_member_out(level: Level, n: usize, first: u64, before: Before) {
    let runs: Vec<Run> = seeds(first)
        .map(|seed| run(level, n, seed, before))
        .collect();
    let on_shards: u64 = runs.iter().map(|r| r.on_shards).sum();
    assert!(
        runs.is_empty() || on_shards > 0,
        "{level}: no degraded write on the shards"
    );
    // The rebuilding runs are about cuts in the middle of a rebuild.
    let mid = runs.iter().filter(|r| r.mid_rebuild).count();
    assert!(
        before != Before::Rebuilding || runs.len() < 4 || mid >= runs.len() / 4,
        "{level}: the cut came mid-rebuild in {mid} runs of {}",
        runs.len()
    );
}

#[test]
fn power_cuts_under_degraded_shard_writes_raid5() {
    run_with_a_member_out(Level::Raid5, 5, 4000, Before::Degraded);
}

#[test]
fn power_cuts_under_degraded_shard_writes_raid6() {
    run_with_a_member_out(Level::Raid6, 6, 5000, Before::Degraded);
}

/// Rebuilding: the rows the rebuild has passed are written in place, and
/// journaled too where they are past the position saved in the metadata
/// (a cut takes the member back there); the rows ahead are degraded.
#[test]
fn power_cuts_under_shard_writes_during_a_rebuild_raid5() {
    run_with_a_member_out(Level::Raid5, 5, 6000, Before::Rebuilding);
}

#[test]
fn power_cuts_under_shard_writes_during_a_rebuild_raid6() {
    run_with_a_member_out(Level::Raid6, 6, 7000, Before::Rebuilding);
}

#[test]
fn power_cuts_under_shard_writes_raid10() {
    for seed in seeds(2000) {
        run(Level::Raid10, 4, seed, Before::Optimal);
    }
}

#[test]
fn power_cuts_under_shard_writes_raid1() {
    for seed in seeds(3000) {
        run(Level::Raid1, 2, seed, Before::Optimal);
    }
}
