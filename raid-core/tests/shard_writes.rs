//! Writes through the shards (`raid_core::shard::Engine::write`): many in
//! flight from one thread, on file members (the shard's io_uring) and
//! simulated drives (timed I/O), beside writers on the blocking engine in
//! the same stripes, and with a member failing under them. Each run ends
//! with every block read back against a model and, for RAID5/6, a scrub
//! that finds every stripe's parity right.

use raid_core::array::{Array, ArrayState, ScrubOptions};
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{io_path, FaultyMember, IoPath, MemberRef, SimNvme};
use raid_core::metadata::{SlotState, MIN_DATA_OFFSET};
use raid_core::shard::{Engine, ReadResult, WriteResult};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

mod support;

const CHUNK: u64 = 64 << 10;
const DATA: u64 = 8 << 20;

fn array(level: Level, members: Vec<MemberRef>, tag: &str) -> Arc<Array> {
    support::array::create_shared(level, members, tag, CHUNK)
}

fn files(dir: &std::path::Path, n: usize) -> Vec<MemberRef> {
    support::array::files(dir, n, DATA)
}

fn drive(i: usize) -> SimNvme {
    support::array::sim_drive(format!("sim:w{i}"), DATA)
}

/// Simulated drives `sim:w0` to `sim:w{n-1}`.
fn drives(n: usize) -> Vec<MemberRef> {
    (0..n).map(|i| Arc::new(drive(i)) as MemberRef).collect()
}

/// A first write through the blocking engine (the array was clean: the
/// shards leave marking it dirty to that path), and the model.
fn start_model(a: &Array) -> Vec<u8> {
    let model = vec![0u8; a.capacity() as usize];
    a.write(0, &AlignedBuf::new(4096)).unwrap();
    model
}

/// `n` random writes through the shards, `depth` in flight from this one
/// thread: mostly 4 KiB, some up to a stripe and across stripes (RAID5/6:
/// cut into a write per stripe on the shards where they cover neither
/// whole and no member is in memory, else the blocking path's). Blocks are drawn from those `mine` accepts, so other
/// writers may own the rest. The model follows.
fn writes(
    e: &Engine,
    model: &mut [u8],
    n: usize,
    depth: usize,
    seed: u64,
    mine: impl Fn(u64) -> bool,
) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let blocks = model.len() as u64 / 4096;
    // Blocks with a write in flight: two writes of one block in flight at
    // once may land in either order, so the model could not say which.
    let busy = std::cell::RefCell::new(std::collections::HashMap::<u64, u64>::new());
    let send = |_, answer: Box<dyn FnOnce((u64, WriteResult)) + Send>| {
        let (first, len) = loop {
            let len = if rng.gen_bool(0.8) {
                1
            } else {
                rng.gen_range(1..=40u64)
            };
            let first = rng.gen_range(0..blocks - len);
            let busy = busy.borrow();
            if (first..first + len).all(|b| mine(b) && !busy.contains_key(&b)) {
                break (first, len);
            }
        };
        busy.borrow_mut()
            .extend((first..first + len).map(|b| (b, first * 4096)));
        let off = first * 4096;
        let mut b = AlignedBuf::new((len * 4096) as usize);
        rng.fill(&mut b[..]);
        model[off as usize..off as usize + b.len()].copy_from_slice(&b);
        e.write(off, b, Box::new(move |r| answer((off, r))));
    };
    support::in_flight(n, depth, send, |(off, r)| {
        r.unwrap_or_else(|err| panic!("write at {off}: {err}"));
        busy.borrow_mut().retain(|_, o| *o != off);
    });
}

/// Every block reads back as the model says (through the blocking
/// engine, reconstructing where a member is missing).
fn matches(a: &Array, model: &[u8]) {
    let mut b = AlignedBuf::new(1 << 20);
    for (i, want) in model.chunks(1 << 20).enumerate() {
        a.read(i as u64 * (1 << 20), &mut b[..want.len()]).unwrap();
        if &b[..want.len()] != want {
            let at = b.iter().zip(want).position(|(x, y)| x != y).unwrap();
            panic!("wrong data at {}", i as u64 * (1 << 20) + at as u64);
        }
    }
}

/// Every region written once (zeros) through the blocking engine: its
/// write-intent bit is then durable (no flush clears it here), and a first
/// write into a region, which must wait for its bit, is the blocking
/// path's on any level.
fn every_region_written(a: &Array) {
    let b = AlignedBuf::new(1 << 20);
    for i in 0..a.capacity() >> 20 {
        a.write(i << 20, &b).unwrap();
    }
}

/// Gives `writes` (offset, length) of random data together, in one batch
/// (the model follows), and waits until each is answered, Ok. Returns the
/// channel of answers, to see that none comes twice.
fn given_together(
    e: &Engine,
    model: &mut [u8],
    writes: &[(u64, u64)],
    seed: u64,
) -> mpsc::Receiver<(usize, Result<(), raid_core::array::ArrayError>)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (tx, rx) = mpsc::channel();
    {
        let mut batch = e.batch();
        for (i, &(off, len)) in writes.iter().enumerate() {
            let mut b = AlignedBuf::new(len as usize);
            rng.fill(&mut b[..]);
            model[off as usize..(off + len) as usize].copy_from_slice(&b);
            let tx = tx.clone();
            batch.write(
                off,
                b,
                Box::new(move |r| tx.send((i, r.map(|_| ()))).unwrap()),
            );
        }
    }
    for _ in 0..writes.len() {
        let (i, r) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("every write answered");
        r.unwrap_or_else(|err| panic!("write {i}: {err}"));
    }
    rx
}

/// An engine of `n` shards over `a`; None, said, where it gets none (no
/// io_uring here): the blocking path then serves every write, and a test
/// of the shards' writes has nothing to test.
fn shards(a: &Arc<Array>, n: usize) -> Option<Engine> {
    let e = Engine::start(a.clone(), n).unwrap();
    if e.shard_count() == 0 {
        eprintln!("no shards here (no io_uring): the blocking path serves every write");
        return None;
    }
    Some(e)
}

fn scrub_clean(a: &Array) {
    if a.geometry().level != Level::Raid0 {
        let r = a
            .scrub(&ScrubOptions::default(), &AtomicBool::new(false))
            .unwrap();
        assert!(r.mismatches.is_empty(), "parity wrong: {:?}", r.mismatches);
    }
}

#[test]
fn writes_on_file_members_and_simulated_drives() {
    let dir = std::env::temp_dir().join(format!("raid-shard-w-{}", std::process::id()));
    let mem = support::array::memory_dir("raid-shard-w");
    if mem.is_none() {
        eprintln!("no /dev/shm here: files in memory not tried");
    }
    for (level, n) in [
        (Level::Raid0, 4),
        (Level::Raid1, 2),
        (Level::Raid10, 4),
        (Level::Raid5, 5),
        (Level::Raid6, 6),
    ] {
        // Files on the disk (on the ring), files in memory (small writes
        // run in this thread, the rest copied in place by the shard),
        // simulated drives (timed).
        for kind in ["disk", "memory", "sim"] {
            let base = match kind {
                "memory" => match &mem {
                    Some(m) => m,
                    None => continue,
                },
                _ => &dir,
            };
            let sub = base.join(format!("{level:?}-{kind}"));
            std::fs::create_dir_all(&sub).unwrap();
            let members = match kind {
                "sim" => drives(n),
                _ => files(&sub, n),
            };
            let all_in_memory = members.iter().all(|m| m.in_memory());
            if kind == "memory" {
                assert!(all_in_memory, "files on tmpfs");
            }
            let a = array(level, members, "shard-writes");
            let mut model = start_model(&a);
            let e = Engine::start(a.clone(), 2).unwrap();
            writes(&e, &mut model, 3000, 128, 1, |_| true);
            // Writes inside a stripe (RAID0: chunk) run on the shards (on
            // members in memory, most in the caller's thread), those that
            // find their stripe held by another of the shard's writes wait
            // behind it; only writes across stripes or chunks (not cut:
            // `writes_across_two_stripes_run_on_the_shards`) take the
            // blocking path.
            let inline = e.counts().writes_inline.load(Ordering::Relaxed);
            let runs_inline = all_in_memory && e.shard_count() > 0;
            assert_eq!(inline > 0, runs_inline, "{level:?} {kind}: {inline} inline");
            let on = e.counts().writes_on_shards.load(Ordering::Relaxed) + inline;
            let off = e.counts().writes_blocking.load(Ordering::Relaxed);
            if kind != "disk" || io_path() == IoPath::IoUring {
                assert!(
                    on > 4 * off,
                    "{level:?} {kind}: {on} writes on the shards, {off} blocking"
                );
            }
            drop(e);
            matches(&a, &model);
            scrub_clean(&a);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    if let Some(m) = mem {
        std::fs::remove_dir_all(m).unwrap();
    }
}

/// Shard writes and blocking writers in the same stripes at once, each
/// owning its own blocks: no write of one may be computed into parity
/// from the other's half-written stripe. On files in memory the engine's
/// writes run in the writer's own thread (inline), beside the blocking
/// writers' threads.
/// Bare RAM members, whose I/O a shard reaps at its next pass as due at
/// once (`Member::start_due`), with no completion through its inbox:
/// RAID5, RAID6 and RAID10 writes, then every block read back, through
/// the shards and the blocking engine, and parity scrubbed clean.
#[test]
fn writes_on_bare_ram_members_reaped_as_due() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4)] {
        let members: Vec<MemberRef> = (0..n)
            .map(|i| {
                Arc::new(raid_core::member::RamMember::new(
                    format!("ram:due-{level}-{i}"),
                    MIN_DATA_OFFSET + DATA,
                )) as MemberRef
            })
            .collect();
        let a = array(level, members, &format!("shard-w-ram-{level}"));
        let mut model = start_model(&a);
        let e = Engine::start(a.clone(), 2).unwrap();
        if e.shard_count() == 0 {
            return eprintln!("skipped: no io_uring here");
        }
        writes(&e, &mut model, 3000, 64, 41, |_| true);
        assert!(
            e.counts().writes_on_shards.load(Ordering::Relaxed) > 0,
            "{level}: no write ran on the shards"
        );
        reads(&e, &model, 2000, 43);
        drop(e);
        matches(&a, &model);
        scrub_clean(&a);
    }
}

#[test]
fn shard_and_blocking_writers_share_stripes() {
    let mem = support::array::memory_dir("raid-shard-shared");
    for (level, kind) in [
        (Level::Raid5, "sim"),
        (Level::Raid6, "sim"),
        (Level::Raid5, "memory"),
        (Level::Raid6, "memory"),
    ] {
        let members: Vec<MemberRef> = match (kind, &mem) {
            ("sim", _) => drives(6),
            (_, Some(m)) => {
                let sub = m.join(format!("{level:?}"));
                std::fs::create_dir_all(&sub).unwrap();
                files(&sub, 6)
            }
            (_, None) => continue,
        };
        let all_in_memory = members.iter().all(|m| m.in_memory());
        let a = array(level, members, "shard-shared");
        let mut model = start_model(&a);
        let e = Engine::start(a.clone(), 2).unwrap();
        // Blocks 4k+1 and 4k+3 belong to two blocking writers.
        let blocking: Vec<_> = [1u64, 3]
            .into_iter()
            .map(|r| {
                let a = a.clone();
                std::thread::spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(r);
                    let blocks = a.capacity() / 4096;
                    let mut written = Vec::new();
                    for _ in 0..1500 {
                        let blk = rng.gen_range(0..blocks / 4) * 4 + r;
                        let mut b = AlignedBuf::new(4096);
                        rng.fill(&mut b[..]);
                        a.write(blk * 4096, &b).unwrap();
                        written.push((blk, b));
                    }
                    written
                })
            })
            .collect();
        writes(&e, &mut model, 4000, 64, 2, |b| b % 2 == 0);
        for t in blocking {
            for (blk, b) in t.join().unwrap() {
                let at = (blk * 4096) as usize;
                model[at..at + 4096].copy_from_slice(&b);
            }
        }
        let inline = e.counts().writes_inline.load(Ordering::Relaxed);
        let runs_inline = all_in_memory && e.shard_count() > 0;
        assert_eq!(inline > 0, runs_inline, "{level:?} {kind}: {inline} inline");
        drop(e);
        matches(&a, &model);
        scrub_clean(&a);
    }
    if let Some(m) = mem {
        std::fs::remove_dir_all(m).unwrap();
    }
}

/// Small sequential writes at depth: those that wait for their stripe
/// merge into one write when the one ahead of them ends (whole stripes
/// among them). Every client write is answered once with its own buffer,
/// every block reads back, parity is right. On RAID1/10 the same within a
/// chunk.
#[test]
fn sequential_writes_that_wait_for_a_stripe_merge() {
    for level in [Level::Raid5, Level::Raid6, Level::Raid10] {
        let members = drives(6);
        let a = array(level, members, "shard-merge");
        let model = start_model(&a);
        let e = Engine::start(a.clone(), 2).unwrap();
        let blocks = 2048u64;
        let mut rng = SmallRng::seed_from_u64(5);
        let model = std::cell::RefCell::new(model);
        let mut answered = std::collections::HashSet::new();
        let send = |i: usize, answer: Box<dyn FnOnce((u64, WriteResult)) + Send>| {
            let off = i as u64 * 4096;
            let mut b = AlignedBuf::new(4096);
            rng.fill(&mut b[..]);
            model.borrow_mut()[off as usize..off as usize + 4096].copy_from_slice(&b);
            e.write(off, b, Box::new(move |r| answer((off, r))));
        };
        support::in_flight(blocks as usize, 64, send, |(off, r)| {
            let b = r.unwrap_or_else(|err| panic!("write at {off}: {err}"));
            assert!(
                answered.insert(off),
                "{level:?}: write at {off} answered twice"
            );
            // Its own buffer back, not the merged write's.
            assert_eq!(b.len(), 4096);
            assert!(b[..] == model.borrow()[off as usize..off as usize + 4096]);
        });
        // Every write answered once (none twice: each offset once above).
        assert_eq!(answered.len() as u64, blocks);
        let model = model.into_inner();
        let merged = e.counts().writes_merged.load(Ordering::Relaxed);
        drop(e);
        matches(&a, &model);
        scrub_clean(&a);
        if io_path() == IoPath::IoUring {
            assert!(
                merged >= blocks / 4,
                "{level:?}: {merged} writes merged of {blocks}"
            );
        }
    }
}

/// A member fails (every I/O errs) while writes are in flight on the
/// shards: each write still succeeds (the array is within its
/// redundancy), the member is failed, and every block reads back right.
#[test]
fn a_member_failing_under_shard_writes() {
    let faulty: Vec<Arc<FaultyMember>> = (0..5)
        .map(|i| Arc::new(FaultyMember::new(Arc::new(drive(i)))))
        .collect();
    let members: Vec<MemberRef> = faulty.iter().map(|f| f.clone() as MemberRef).collect();
    let a = array(Level::Raid5, members, "shard-fail");
    let mut model = start_model(&a);
    let e = Engine::start(a.clone(), 2).unwrap();
    writes(&e, &mut model, 1000, 64, 3, |_| true);
    let f = faulty[2].clone();
    let breaker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        f.fail_all();
    });
    writes(&e, &mut model, 4000, 64, 4, |_| true);
    breaker.join().unwrap();
    assert_eq!(a.state(), ArrayState::Degraded);
    assert_eq!(
        a.slots()[2].state,
        SlotState::Failed,
        "the member that erred"
    );
    // Degraded: the shards journal the writes inside one stripe (each
    // record durable before the write in place) and hand the rest to the
    // blocking path; all of them land.
    writes(&e, &mut model, 500, 32, 5, |_| true);
    drop(e);
    matches(&a, &model);
}

/// Degraded writes on the shards, with the journal's ring kept small so
/// that it fills: a write whose record finds no room waits on its shard
/// (its stripe held) until a checkpoint frees the ring's front, rather
/// than going to the blocking path. Every write lands, and the array
/// rebuilds and scrubs clean.
#[test]
fn degraded_shard_writes_wait_for_room_in_the_journal() {
    let members = drives(5);
    let a = array(Level::Raid5, members, "shard-room");
    let mut model = start_model(&a);
    a.fail_member(1, false).unwrap();
    a.limit_journal_ring(256 << 10);
    let e = Engine::start(a.clone(), 2).unwrap();
    writes(&e, &mut model, 3000, 64, 11, |_| true);
    let c = e.counts();
    let on_shards = c.writes_on_shards.load(Ordering::Relaxed);
    let blocking = c.writes_blocking.load(Ordering::Relaxed);
    assert!(
        c.journal_waits.load(Ordering::Relaxed) > 0,
        "no write waited for room"
    );
    assert!(a.io_stats().journal_checkpoints > 0);
    // Those inside one stripe are the shards'; those across stripes (not
    // cut with a member out) are the blocking path's.
    assert!(
        on_shards > 2 * blocking,
        "{on_shards} on the shards, {blocking} not"
    );
    drop(e);
    matches(&a, &model);
    support::power_cut::rebuild_and_scrub(&a, &model, |i| Arc::new(drive(10 + i)), "room");
}

/// A shard write whose member write errs (a full-stripe write: nothing to
/// read first) is ended off the shard: the member is failed, and the
/// write succeeds, its block readable from the parity written with it.
#[test]
fn a_member_write_error_fails_the_member_and_the_write_stands() {
    let faulty: Vec<Arc<FaultyMember>> = (0..5)
        .map(|i| Arc::new(FaultyMember::new(Arc::new(drive(i)))))
        .collect();
    let members: Vec<MemberRef> = faulty.iter().map(|f| f.clone() as MemberRef).collect();
    let a = array(Level::Raid5, members, "shard-werr");
    let mut model = start_model(&a);
    let Some(e) = shards(&a, 1) else { return };
    faulty[2].fail_all();
    let stripe = a.geometry().stripe_data_bytes() as usize;
    let mut b = AlignedBuf::new(stripe);
    SmallRng::seed_from_u64(6).fill(&mut b[..]);
    model[stripe..2 * stripe].copy_from_slice(&b);
    let (tx, rx) = mpsc::channel();
    e.write(stripe as u64, b, Box::new(move |r| tx.send(r).unwrap()));
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(e.counts().write_errors.load(Ordering::Relaxed), 1);
    assert_eq!(a.slots()[2].state, SlotState::Failed);
    drop(e);
    matches(&a, &model);
}

/// RAID0/1/10 writes across chunks (2 to 40 blocks, over one boundary or
/// several) run on the shards, each chunk's part written to every copy of
/// it in one step: one at a time none takes the blocking path; many in
/// flight, RAID0 (which locks nothing) none either. Every block reads back
/// as written and the copies agree.
#[test]
fn writes_across_chunks_run_on_the_shards() {
    for (level, n) in [(Level::Raid0, 4), (Level::Raid1, 2), (Level::Raid10, 4)] {
        let a = array(level, drives(n), "across-chunks");
        let mut model = start_model(&a);
        let Some(e) = shards(&a, 2) else { return };
        let per_chunk = CHUNK / 4096;
        let blocks = model.len() as u64 / 4096;
        let mut rng = SmallRng::seed_from_u64(11);
        // Every region written once through the blocking engine: its
        // write-intent bit is then durable (no flush clears it here), and
        // a first write into a region, which must wait for its bit, is
        // the blocking path's on any level.
        let mut b = AlignedBuf::new(1 << 20);
        for (i, m) in model.chunks_mut(1 << 20).enumerate() {
            rng.fill(&mut b[..m.len()]);
            a.write(i as u64 * (1 << 20), &b[..m.len()]).unwrap();
            m.copy_from_slice(&b[..m.len()]);
        }
        let mut one = |e: &Engine, model: &mut [u8], first: u64, len: u64| {
            let off = first * 4096;
            let mut b = AlignedBuf::new((len * 4096) as usize);
            rng.fill(&mut b[..]);
            model[off as usize..off as usize + b.len()].copy_from_slice(&b);
            let (tx, rx) = mpsc::channel();
            e.write(off, b, Box::new(move |r| tx.send(r).unwrap()));
            let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            r.unwrap_or_else(|err| panic!("{level:?}: write at {off}: {err}"));
        };
        for i in 0..200 {
            // Starting in chunk k, ending past its end.
            let k = (i * 7919) % (blocks / per_chunk - 1);
            let first = k * per_chunk + (i % per_chunk);
            let len = (per_chunk - i % per_chunk + 1 + (i % 40)).min(blocks - first);
            one(&e, &mut model, first, len);
        }
        let off = e.counts().writes_blocking.load(Ordering::Relaxed);
        assert_eq!(
            off, 0,
            "{level:?}: {off} writes across chunks took the blocking path"
        );
        let on = e.counts().writes_on_shards.load(Ordering::Relaxed);
        assert!(on >= 200, "{level:?}: {on} writes on the shards");
        writes(&e, &mut model, 1500, 32, 12, |_| true);
        if level == Level::Raid0 {
            let off = e.counts().writes_blocking.load(Ordering::Relaxed);
            assert_eq!(off, 0, "RAID0: {off} writes took the blocking path");
        }
        drop(e);
        matches(&a, &model);
        scrub_clean(&a);
    }
}

/// RAID5 and RAID6 writes across two stripes, covering neither whole,
/// run on the shards: each is cut into a write per stripe, given to that
/// stripe's shard, and answered once, when both parts are in. With a
/// member missing they are not cut (each part's journal record would
/// crowd the ring) and go to the blocking path. Each reads back as
/// written once answered. The array's statistics count each as one write
/// of its bytes, wherever its parts ran, and so for many writes at once.
/// A write that covers a stripe whole stays the blocking path's. Every
/// block reads back as written, and parity scrubs clean.
#[test]
fn writes_across_two_stripes_run_on_the_shards() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let a = array(level, drives(n), "across-stripes");
        let mut model = start_model(&a);
        let Some(e) = shards(&a, 2) else { return };
        let sdb = a.geometry().stripe_data_bytes();
        let mut rng = SmallRng::seed_from_u64(21);
        // Every region's bit durable first (see writes_across_chunks_...).
        let mut b = AlignedBuf::new(1 << 20);
        for (i, m) in model.chunks_mut(1 << 20).enumerate() {
            rng.fill(&mut b[..m.len()]);
            a.write(i as u64 * (1 << 20), &b[..m.len()]).unwrap();
            m.copy_from_slice(&b[..m.len()]);
        }
        let stripes = a.capacity() / sdb;
        // (offset, len) of the i-th write: from inside stripe s to inside
        // stripe s + 1, shorter than two stripes.
        let across = |i: u64| {
            let s = (i * 7919) % (stripes - 1);
            let before = 4096 * (1 + i % (sdb / 4096 - 1));
            let after = 4096 * (1 + (i * 13) % (sdb / 4096 - 1));
            ((s + 1) * sdb - before, before + after)
        };
        let one = |e: &Engine, model: &mut [u8], rng: &mut SmallRng, (off, len): (u64, u64)| {
            let mut b = AlignedBuf::new(len as usize);
            rng.fill(&mut b[..]);
            let (tx, rx) = mpsc::channel();
            e.write(off, b.clone(), Box::new(move |r| tx.send(r).unwrap()));
            let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            let back = r.unwrap_or_else(|err| panic!("{level:?}: write at {off}: {err}"));
            assert!(back[..] == b[..], "the client's buffer handed back");
            assert!(
                rx.recv_timeout(Duration::from_millis(50)).is_err(),
                "answered twice"
            );
            // Both parts in place when it is answered.
            let mut r = AlignedBuf::new(len as usize);
            a.read(off, &mut r).unwrap();
            assert!(r[..] == b[..], "{level:?}: write at {off} read back");
            model[off as usize..(off + len) as usize].copy_from_slice(&b);
        };
        let c = e.counts();
        let count = |n: &raid_core::stats::StripedCounter| n.load(Ordering::Relaxed);
        for degraded in [false, true] {
            if degraded {
                a.fail_slot(1, "test");
            }
            let (on0, off0) = (count(&c.writes_on_shards), count(&c.writes_blocking));
            let split0 = count(&c.writes_split);
            let before = a.io_stats().client.write;
            for i in 0..150 {
                one(&e, &mut model, &mut rng, across(i));
            }
            let after = a.io_stats().client.write;
            let bytes: u64 = (0..150).map(|i| across(i).1).sum();
            assert_eq!(
                after.ops - before.ops,
                150,
                "{level:?}: client writes counted"
            );
            assert_eq!(after.bytes - before.bytes, bytes, "{level:?}: their bytes");
            let (on, off) = (count(&c.writes_on_shards), count(&c.writes_blocking));
            // Healthy, two parts each on the shards; degraded, whole on
            // the blocking path.
            let (on, off, split) = (on - on0, off - off0, count(&c.writes_split) - split0);
            match degraded {
                false => assert_eq!((on, off, split), (300, 0, 150), "{level:?}: cut"),
                true => assert_eq!(
                    (on, off, split),
                    (0, 150, 0),
                    "{level:?}, degraded: not cut"
                ),
            }
            let off = count(&c.writes_blocking);
            // A stripe whole and a block on either side: the blocking path's.
            one(&e, &mut model, &mut rng, (3 * sdb - 4096, sdb + 8192));
            assert_eq!(
                count(&c.writes_blocking) - off,
                1,
                "{level:?}: a whole stripe's write"
            );
            // Many at once, some across stripes: each counted once.
            let before = a.io_stats().client.write;
            writes(&e, &mut model, 1500, 32, 22, |_| true);
            let after = a.io_stats().client.write;
            assert_eq!(
                (after.ops - before.ops, after.errors - before.errors),
                (1500, 0),
                "{level:?}, degraded {degraded}: client writes counted"
            );
            matches(&a, &model);
            if !degraded {
                scrub_clean(&a);
            }
        }
    }
}

/// A write across two stripes, cut on the shards, whose every member
/// then errs: both parts fail, and the client hears once, with an error,
/// counted once as an error with no bytes.
#[test]
fn a_cut_write_whose_members_fail_is_answered_once() {
    let faulty: Vec<Arc<FaultyMember>> = (0..4)
        .map(|i| Arc::new(FaultyMember::new(Arc::new(drive(i)))))
        .collect();
    let members: Vec<MemberRef> = faulty.iter().map(|f| f.clone() as MemberRef).collect();
    let a = array(Level::Raid5, members, "cut-werr");
    start_model(&a);
    let Some(e) = shards(&a, 2) else { return };
    every_region_written(&a);
    for f in &faulty {
        f.fail_all();
    }
    let sdb = a.geometry().stripe_data_bytes();
    let (off, len) = (5 * sdb - 65536, 131072);
    let before = a.io_stats().client.write;
    let split = e.counts().writes_split.load(Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    e.write(
        off,
        AlignedBuf::new(len as usize),
        Box::new(move |r| tx.send(r.map(|_| ())).unwrap()),
    );
    let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(r.is_err(), "a write no member took succeeded");
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "answered twice"
    );
    assert_eq!(
        e.counts().writes_split.load(Ordering::Relaxed) - split,
        1,
        "not cut"
    );
    let after = a.io_stats().client.write;
    assert_eq!(
        (
            after.ops - before.ops,
            after.errors - before.errors,
            after.bytes - before.bytes
        ),
        (1, 1, 0)
    );
}

/// On one shard, a write holding stripe t, then a write across stripes
/// t - 1 and t and a write inside t right after it, given together: the
/// second is cut, its part in t waits behind the first with the third,
/// and the two start merged when the first ends. The array's statistics
/// count three client writes of their bytes (the merged write is counted
/// as the third, the part by the write it was cut from), and every block
/// reads back as written.
#[test]
fn a_part_merged_with_a_client_write_counts_once() {
    let a = array(Level::Raid5, drives(4), "part-merged");
    let mut model = start_model(&a);
    let Some(e) = shards(&a, 1) else { return };
    every_region_written(&a);
    let t = 20 * a.geometry().stripe_data_bytes();
    let writes = [(t + 40960, 4096), (t - 8192, 16384), (t + 8192, 8192)];
    let before = a.io_stats().client.write;
    let merged = e.counts().writes_merged.load(Ordering::Relaxed);
    let rx = given_together(&e, &mut model, &writes, 23);
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "answered twice"
    );
    let after = a.io_stats().client.write;
    let c = e.counts();
    assert_eq!(
        c.writes_merged.load(Ordering::Relaxed) - merged,
        1,
        "the part and the third merged"
    );
    assert_eq!(after.ops - before.ops, 3, "client writes counted");
    let bytes: u64 = writes.iter().map(|w| w.1).sum();
    assert_eq!(after.bytes - before.bytes, bytes, "their bytes");
    drop(e);
    matches(&a, &model);
    scrub_clean(&a);
}

/// On one shard, a RAID10 write across chunks k and k+1 in flight, then,
/// given with it, a write inside chunk k+1 and one across k+1 and k+2
/// (no block of the three overlapping another): the second waits on the
/// shard for k+1 and starts once the first gives both chunks up; the
/// third, meeting k+1 held, goes to the blocking path. None is left
/// waiting, and every block reads back as written.
#[test]
fn writes_across_chunks_meeting_a_held_chunk() {
    let a = array(Level::Raid10, drives(4), "across-held");
    let mut model = start_model(&a);
    let Some(e) = shards(&a, 1) else { return };
    every_region_written(&a);
    let c = CHUNK;
    let k = 5 * c;
    // The last block of chunk k and the first of k+1; the second block of
    // k+1; its third to the first block of k+2.
    let writes = [
        (k + c - 4096, 8192),
        (k + c + 4096, 4096),
        (k + c + 8192, c - 8192 + 4096),
    ];
    given_together(&e, &mut model, &writes, 14);
    let off = e.counts().writes_blocking.load(Ordering::Relaxed);
    assert!(off >= 1, "the write meeting a held chunk ran on the shard");
    let on = e.counts().writes_on_shards.load(Ordering::Relaxed);
    assert!(on >= 1, "the first write was not the shard's");
    drop(e);
    matches(&a, &model);
}

/// A write across chunks whose member writes fail on one member: on
/// RAID10 the member is failed and the write stands on the other copies
/// (every block reads back); on RAID0, which has no other copy, the write
/// fails and so does the array.
#[test]
fn a_write_across_chunks_with_a_member_failing() {
    for level in [Level::Raid10, Level::Raid0] {
        let faulty: Vec<Arc<FaultyMember>> = (0..4)
            .map(|i| Arc::new(FaultyMember::new(Arc::new(drive(i)))))
            .collect();
        let members: Vec<MemberRef> = faulty.iter().map(|f| f.clone() as MemberRef).collect();
        let a = array(level, members, "across-werr");
        let mut model = start_model(&a);
        let Some(e) = shards(&a, 1) else { return };
        faulty[1].fail_all();
        // Chunks 1 to 4: member 1 holds a copy of some (RAID10) or one of
        // them (RAID0).
        let len = 4 * CHUNK as usize;
        let mut b = AlignedBuf::new(len);
        SmallRng::seed_from_u64(13).fill(&mut b[..]);
        model[CHUNK as usize..CHUNK as usize + len].copy_from_slice(&b);
        let (tx, rx) = mpsc::channel();
        e.write(CHUNK, b, Box::new(move |r| tx.send(r.map(|_| ())).unwrap()));
        let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(e.counts().write_errors.load(Ordering::Relaxed), 1);
        assert_eq!(e.counts().writes_blocking.load(Ordering::Relaxed), 0);
        assert_eq!(a.slots()[1].state, SlotState::Failed);
        drop(e);
        match level {
            Level::Raid10 => {
                r.unwrap();
                matches(&a, &model);
            }
            _ => {
                assert!(
                    r.is_err(),
                    "RAID0: a write with a chunk not written succeeded"
                );
                assert_eq!(a.state(), ArrayState::Failed);
            }
        }
    }
}

/// A hot replace, then a member failed, replaced and rebuilt, while the
/// shards keep writing: no healthy member is failed on the way (a slot
/// holding a pair of devices during the hot replace takes its writes on
/// both devices at once), both copies finish, and every block and every
/// stripe's parity is right at the end.
#[test]
fn hot_replace_and_rebuild_under_shard_writes() {
    use raid_core::array::{RebuildEnd, RebuildOptions};
    let members = drives(5);
    let a = array(Level::Raid5, members, "shard-churn");
    let mut model = start_model(&a);
    let e = Engine::start(a.clone(), 2).unwrap();
    writes(&e, &mut model, 500, 64, 7, |_| true);
    let churn = {
        let a = a.clone();
        std::thread::spawn(move || {
            let opts = RebuildOptions {
                batch_rows: 4,
                ..Default::default()
            };
            let go = AtomicBool::new(false);
            // Each start lands among writes in flight (three, for the
            // chance that one meets a write between its reads and writes).
            for slot in [1, 2, 4] {
                a.hot_replace(slot, Arc::new(drive(10 + slot))).unwrap();
                let r = a.hot_replace_copy(&opts, &go).unwrap();
                assert!(matches!(r, RebuildEnd::Finished));
            }
            a.fail_member(3, false).unwrap();
            a.replace(3, Arc::new(drive(13))).unwrap();
            let r = a.rebuild(3, &opts, &go).unwrap();
            assert!(matches!(r, RebuildEnd::Finished));
        })
    };
    let mut seed = 8;
    while !churn.is_finished() {
        writes(&e, &mut model, 300, 64, seed, |_| true);
        seed += 1;
    }
    churn.join().unwrap();
    writes(&e, &mut model, 500, 64, seed, |_| true);
    drop(e);
    assert_eq!(a.state(), ArrayState::Optimal);
    assert!(a.slots().iter().all(|s| s.state == SlotState::Active));
    matches(&a, &model);
    scrub_clean(&a);
}

/// Requests given through one `Batch` (a front end's burst) on sleeping
/// shards all complete once the batch ends, however many each shard got:
/// writes to many stripes, then reads of them, each batch dropped while
/// its requests may still be queued.
#[test]
fn a_batch_wakes_its_shards_when_it_ends() {
    let dir = std::env::temp_dir().join(format!("raid-shard-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = array(Level::Raid5, files(&dir, 5), "shard-batch");
    let model = start_model(&a);
    let e = Engine::start(a.clone(), 3).unwrap();
    let blocks = (model.len() / 4096) as u64;
    let block = |i: u64| -> AlignedBuf {
        let mut b = AlignedBuf::new(4096);
        b.fill((i % 251) as u8 + 1);
        b
    };
    for round in 0..20u64 {
        // The shards fall asleep between rounds.
        std::thread::sleep(Duration::from_millis(2));
        let picked: Vec<u64> = (0..40).map(|k| (round * 977 + k * 131) % blocks).collect();
        let (tx, rx) = mpsc::channel();
        {
            let mut b = e.batch();
            for &i in &picked {
                let tx = tx.clone();
                b.write(
                    i * 4096,
                    block(i),
                    Box::new(move |r| tx.send(r.map(|_| ())).unwrap()),
                );
            }
        }
        for _ in &picked {
            rx.recv_timeout(Duration::from_secs(10))
                .expect("a write given in a batch completes")
                .unwrap();
        }
        let (tx, rx) = mpsc::channel();
        {
            let mut b = e.batch();
            for &i in &picked {
                let tx = tx.clone();
                b.read(
                    i * 4096,
                    AlignedBuf::new(4096),
                    Box::new(move |r| tx.send((i, r)).unwrap()),
                );
            }
        }
        for _ in &picked {
            let (i, r) = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("a read given in a batch completes");
            assert!(r.unwrap()[..] == block(i)[..], "block {i}");
        }
    }
    drop(e);
    scrub_clean(&a);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A request given by another caller to a shard that an open batch owes a
/// wake-up (that caller finds the shard marked awake and rings nothing)
/// completes once the batch ends: the wake-up is late, never lost.
#[test]
fn a_request_behind_an_open_batch_completes_when_it_ends() {
    let members = support::array::Members::ram(4, DATA, "batch-owed");
    let a = array(Level::Raid0, members.refs(), "batch-owed");
    // One shard: every request goes to it.
    let e = Arc::new(Engine::start(a.clone(), 1).unwrap());
    for _ in 0..20 {
        // Let the shard fall asleep.
        std::thread::sleep(Duration::from_millis(2));
        let (tx, rx) = mpsc::channel();
        let mut b = e.batch();
        let t = tx.clone();
        b.read(
            0,
            AlignedBuf::new(4096),
            Box::new(move |r| t.send(r.is_ok()).unwrap()),
        );
        let other = {
            let (e, tx) = (e.clone(), tx.clone());
            std::thread::spawn(move || {
                e.read(
                    4096,
                    AlignedBuf::new(4096),
                    Box::new(move |r| tx.send(r.is_ok()).unwrap()),
                )
            })
        };
        other.join().unwrap();
        drop(b);
        for _ in 0..2 {
            assert!(rx
                .recv_timeout(Duration::from_secs(10))
                .expect("both reads complete once the batch ends"));
        }
    }
}

/// `n` random 4 KiB reads through the engine, 64 in flight, each checked
/// against the model.
fn reads(e: &Engine, model: &[u8], n: usize, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let blocks = model.len() as u64 / 4096;
    let send = |_, answer: Box<dyn FnOnce((u64, ReadResult)) + Send>| {
        let off = rng.gen_range(0..blocks) * 4096;
        e.read(
            off,
            AlignedBuf::new(4096),
            Box::new(move |r| answer((off, r))),
        );
    };
    support::in_flight(n, 64, send, |(off, r)| {
        let b = r.unwrap_or_else(|err| panic!("read at {off}: {err}"));
        let at = off as usize;
        assert!(b[..] == model[at..at + 4096], "wrong data at {off}");
    });
}

/// While a slot holds a hot replace's pair of devices, the shards serve
/// its reads (from the old device) and its writes (to both at once): only
/// writes across stripes (chunks) that the shards do not cut take the
/// blocking path, as without a pair. Writes go on while the copy runs, and at the end the new device
/// is the member with every block and every stripe's parity right, so
/// the writes the shards sent to rows already copied reached it.
#[test]
fn a_hot_replace_pair_is_served_on_the_shards() {
    use raid_core::array::RebuildEnd;
    for (level, n) in [
        (Level::Raid1, 2),
        (Level::Raid10, 4),
        (Level::Raid5, 5),
        (Level::Raid6, 6),
    ] {
        let members = drives(n);
        let a = array(level, members, "shard-pair");
        let mut model = start_model(&a);
        let e = Engine::start(a.clone(), 2).unwrap();
        writes(&e, &mut model, 300, 64, 21, |_| true);
        a.hot_replace(1, Arc::new(drive(11))).unwrap();
        let c = e.counts();
        let count = |x: &raid_core::stats::StripedCounter| x.load(Ordering::Relaxed);
        let before = [&c.writes_on_shards, &c.writes_blocking, &c.blocking].map(count);
        writes(&e, &mut model, 2000, 64, 22, |_| true);
        reads(&e, &model, 2000, 23);
        let [on, off, reads_off] = [&c.writes_on_shards, &c.writes_blocking, &c.blocking]
            .map(count)
            .into_iter()
            .zip(before)
            .map(|(now, was)| now - was)
            .collect::<Vec<_>>()[..]
        else {
            unreachable!()
        };
        // Without io_uring (no shards) everything is the blocking path's.
        if e.shard_count() > 0 {
            assert!(
                on > 4 * off,
                "{level:?}: {on} writes on the shards, {off} blocking"
            );
            assert_eq!(reads_off, 0, "{level:?}: reads of the pair went blocking");
        }
        // Paced, so that writes land on rows copied and rows not yet.
        let copy = paced_copy(&a, 16 << 20);
        let mut seed = 24;
        while !copy.is_finished() {
            writes(&e, &mut model, 200, 64, seed, |_| true);
            seed += 1;
        }
        assert!(seed > 25, "{level:?}: the copy ended before the writes");
        let r = copy.join().unwrap().unwrap();
        assert!(matches!(r, RebuildEnd::Finished));
        assert_eq!(a.slots()[1].member.as_deref(), Some("sim:w11"));
        drop(e);
        assert_eq!(a.state(), ArrayState::Optimal);
        matches(&a, &model);
        scrub_clean(&a);
    }
}

/// A hot replace's copy on its own thread, at `rate` bytes per second.
fn paced_copy(
    a: &Arc<Array>,
    rate: u64,
) -> std::thread::JoinHandle<Result<raid_core::array::RebuildEnd, raid_core::array::ArrayError>> {
    let a = a.clone();
    std::thread::spawn(move || {
        let opts = raid_core::array::RebuildOptions {
            batch_rows: 4,
            rate_limit: Some(rate),
            ..Default::default()
        };
        a.hot_replace_copy(&opts, &AtomicBool::new(false))
    })
}

/// The replacement failing the writes the shards send to rows the copy
/// has passed (which the copy never writes again, so only the shards can
/// tell): each write stands (the old device has it), and the copy then
/// refuses to switch, so the old device stays the member with every
/// block right. Had the shards dropped the error, the replacement would
/// take the slot without those writes.
#[test]
fn a_replacement_failing_under_shard_writes_is_dropped() {
    use raid_core::member::Faults;
    let members = drives(5);
    let a = array(Level::Raid5, members, "shard-pair-fail");
    let mut model = start_model(&a);
    let e = Engine::start(a.clone(), 2).unwrap();
    // Every bitmap region dirty, so no write below waits for its bit (that
    // would take the blocking path).
    writes(&e, &mut model, 2000, 64, 31, |_| true);
    let new = Arc::new(FaultyMember::new(Arc::new(drive(12))));
    a.hot_replace(2, new.clone()).unwrap();
    let copy = paced_copy(&a, 4 << 20);
    let geo = a.geometry();
    let copied = loop {
        let (_, _, row, _) = a.hot_replace_progress().expect("copying");
        if row >= geo.rows() / 4 {
            break row;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // A RAID5 stripe is a row of every member.
    new.set_faults(Faults {
        fail_ranges: vec![(MIN_DATA_OFFSET, MIN_DATA_OFFSET + copied * geo.chunk)],
        ..Default::default()
    });
    let c = e.counts();
    let blocking = c.writes_blocking.load(Ordering::Relaxed);
    let blocks = copied * geo.stripe_data_bytes() / 4096;
    let mut rng = SmallRng::seed_from_u64(32);
    let picks = rand::seq::index::sample(&mut rng, blocks as usize, 300).into_vec();
    let send = |i: usize, answer: Box<dyn FnOnce((u64, WriteResult)) + Send>| {
        let off = picks[i] as u64 * 4096;
        let mut b = AlignedBuf::new(4096);
        b.fill((i % 251) as u8 + 1);
        model[off as usize..off as usize + 4096].copy_from_slice(&b);
        e.write(off, b, Box::new(move |r| answer((off, r))));
    };
    support::in_flight(picks.len(), 32, send, |(off, r)| {
        r.unwrap_or_else(|err| panic!("write at {off}: {err}"));
    });
    if e.shard_count() > 0 {
        assert_eq!(c.writes_blocking.load(Ordering::Relaxed), blocking);
    }
    assert_eq!(c.write_errors.load(Ordering::Relaxed), 0);
    let err = copy.join().unwrap().expect_err("the replacement failed");
    assert!(err.to_string().contains("replacement"), "{err}");
    assert_eq!(a.slots()[2].member.as_deref(), Some("sim:w2"));
    assert_eq!(a.slots()[2].state, SlotState::Active);
    assert!(a.hot_replace_progress().is_none());
    drop(e);
    assert_eq!(a.state(), ArrayState::Optimal);
    matches(&a, &model);
    scrub_clean(&a);
}
