//! The degraded-write journal under concurrent writers: records made
//! durable in shared groups (their writes, then one flush of each member
//! written), two groups written at once, and a power cut at any moment of such writing recovered by the
//! next start.

mod support;

use raid_core::array::Array;
use raid_core::layout::Level;
use raid_core::member::{Faults, FaultyMember, Member, MemberRef, RamMember};
use raid_core::metadata::{SlotState, JOURNAL_OFFSET, MIN_DATA_OFFSET};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::array::{create, Members};
use support::power_cut::{paced_rebuild, rebuild_and_scrub, CutModel};

const BLOCK: usize = 4096;
const CHUNK: u64 = 4096;
const ROWS: u64 = 64;
const WRITERS: usize = 6;

/// An array of `level` over `n` members, written with a known image and
/// flushed, then degraded (slot 1 failed), its members slow (`latency`
/// before each read and write) and tracking what a power cut would drop.
fn degraded(level: Level, n: usize, tag: &str, latency: Duration) -> (Array, Members, Vec<u8>) {
    let m = Members::ram(n, ROWS * CHUNK, tag);
    let a = create(level, &m, CHUNK);
    let initial: Vec<u8> = (0..a.capacity() as usize)
        .map(|i| ((i as u64 * 2654435761) >> 11) as u8)
        .collect();
    a.write(0, &initial).unwrap();
    a.flush().unwrap();
    a.fail_slot(1, "test");
    for f in &m.faulty {
        slow_and_watched(f, latency);
    }
    (a, m, initial)
}

/// `f` slow (`latency` before each read and write) and tracking what a
/// power cut would drop.
fn slow_and_watched(f: &FaultyMember, latency: Duration) {
    f.set_faults(Faults {
        latency,
        ..Default::default()
    });
    f.track_power_cut();
}

/// In seeds 4-7 of every 8, every other member takes writes with FUA
/// (`Member::fua`): a group's records go with FUA there and are flushed
/// on the rest, and a cut must keep those written with FUA.
fn fua_in_half(m: &Members, seed: u64) {
    if (seed / 4) % 2 == 1 {
        for f in m.faulty.iter().step_by(2) {
            f.take_fua(true);
        }
    }
}

/// The level a power-cut test's seed runs: RAID5 and RAID6 in turn.
fn level_of(seed: u64) -> Level {
    match seed % 2 {
        0 => Level::Raid5,
        _ => Level::Raid6,
    }
}

/// A new member for the failed slot, to rebuild onto.
fn replacement(tag: &str) -> MemberRef {
    Arc::new(RamMember::new(
        format!("ram:{tag}new"),
        MIN_DATA_OFFSET + ROWS * CHUNK,
    ))
}

/// Each writer owns a run of blocks and writes 1 to 3 of them at a time
/// until `stop` or an error, telling `model` before each write starts.
fn write_until(
    a: &Array,
    writer: usize,
    seed: u64,
    model: &Mutex<CutModel>,
    stop: &AtomicBool,
    most: usize,
) {
    let per = model.lock().unwrap().blocks() / WRITERS;
    let mut rng = StdRng::seed_from_u64(seed * 97 + writer as u64);
    for _ in 0..most {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let nb = rng.gen_range(1..=3);
        let b0 = writer * per + rng.gen_range(0..=per - nb);
        let mut data = vec![0u8; nb * BLOCK];
        rng.fill(&mut data[..]);
        model.lock().unwrap().wrote(b0, &data);
        if a.write((b0 * BLOCK) as u64, &data).is_err() {
            return;
        }
    }
}

#[test]
fn concurrent_degraded_writes_share_journal_flushes() {
    for level in [Level::Raid5, Level::Raid6] {
        let tag = format!("jgroups-{level}-");
        let (a, m, initial) = degraded(level, 5, &tag, Duration::from_micros(300));
        let model = Mutex::new(CutModel::new(initial, BLOCK));
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            for w in 0..WRITERS {
                let (a, model, stop) = (&a, &model, &stop);
                sc.spawn(move || write_until(a, w, 1, model, stop, 30));
            }
        });
        let io = a.io_stats();
        assert!(
            io.journal_records >= (WRITERS * 30) as u64 / 2,
            "{level}: most degraded writes are journaled ({} records)",
            io.journal_records
        );
        assert!(
            io.journal_commits < io.journal_records,
            "{level}: {} records in {} groups: concurrent writers never shared a flush",
            io.journal_records,
            io.journal_commits
        );
        // Every write completed: each block holds the last value written.
        let mut got = vec![0u8; a.capacity() as usize];
        a.read(0, &mut got).unwrap();
        let mut model = model.into_inner().unwrap();
        model.flushed();
        model.check(&got, &format!("{level}"));
        for f in &m.faulty {
            f.heal();
        }
        rebuild_and_scrub(&a, &got, |_| replacement(&tag), &format!("{level}"));
    }
}

/// A degraded array's journal records go with FUA to the members that
/// take it, which then get no flush for them, and are written then
/// flushed on the others; the writes read back, and survive a rebuild.
#[test]
fn journal_records_go_with_fua_where_a_member_takes_it() {
    for level in [Level::Raid5, Level::Raid6] {
        let tag = format!("jfua-{level}-");
        let (a, m, initial) = degraded(level, 5, &tag, Duration::from_micros(50));
        for f in m.faulty.iter().step_by(2) {
            f.take_fua(true);
        }
        let fua: Vec<bool> = a.slots().iter().map(|s| s.fua).collect();
        assert_eq!(
            fua,
            [true, false, true, false, true],
            "{level}: as status says"
        );
        let before: Vec<(u64, u64)> = m
            .faulty
            .iter()
            .map(|f| f.flushes_and_fua_writes())
            .collect();
        let records = a.io_stats().journal_records;
        // One writer, one block at a time: each record a group of its own,
        // placed on the members in sync in turn.
        let mut image = initial;
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..40 {
            let b = rng.gen_range(0..image.len() / BLOCK);
            let data: Vec<u8> = (0..BLOCK).map(|_| rng.gen()).collect();
            a.write((b * BLOCK) as u64, &data).unwrap();
            image[b * BLOCK..(b + 1) * BLOCK].copy_from_slice(&data);
        }
        assert!(
            a.io_stats().journal_records >= records + 20,
            "{level}: the degraded writes were journaled"
        );
        for (i, f) in m.faulty.iter().enumerate() {
            let (flushes, fua) = f.flushes_and_fua_writes();
            let (flushes, fua) = (flushes - before[i].0, fua - before[i].1);
            if i == 1 {
                continue; // failed
            }
            match i % 2 {
                0 => assert!(
                    fua > 0 && flushes == 0,
                    "{level}: member {i} takes FUA: {fua} FUA writes, {flushes} flushes"
                ),
                _ => assert!(
                    fua == 0 && flushes > 0,
                    "{level}: member {i} does not: {fua} FUA writes, {flushes} flushes"
                ),
            }
        }
        let mut got = vec![0u8; a.capacity() as usize];
        a.read(0, &mut got).unwrap();
        assert!(got == image, "{level}: the writes read back");
        for f in &m.faulty {
            f.heal();
        }
        rebuild_and_scrub(&a, &got, |_| replacement(&tag), &format!("{level}"));
    }
}

/// The drives draining their caches on their own until `stop`, each at
/// its own moments: what is durable at a cut is not all or nothing.
fn drain_caches(m: &Members, seed: u64, stop: &AtomicBool) {
    let mut rng = StdRng::seed_from_u64(seed + 1000);
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_micros(rng.gen_range(100..600)));
        let _ = m.faulty[rng.gen_range(0..m.faulty.len())].flush();
    }
}

/// After a power cut: the power back, the array started from `m` (which
/// replays the journal), every block checked against `model`, then a
/// rebuild and a scrub that must agree. `what` names the run.
fn recover(m: &Members, model: CutModel, tag: &str, what: &str) {
    for f in &m.faulty {
        f.heal();
        f.power_on();
    }
    let a = Array::assemble(m.refs())
        .unwrap_or_else(|e| panic!("{what}: no recovery: {e}"))
        .array;
    let mut got = vec![0u8; a.capacity() as usize];
    a.read(0, &mut got).unwrap();
    model.check(&got, what);
    rebuild_and_scrub(&a, &got, |_| replacement(tag), what);
}

/// The seeds CI runs; RAID_SOAK=1 runs more.
fn seeds() -> u64 {
    if std::env::var("RAID_SOAK").is_ok_and(|v| v == "1") {
        200
    } else {
        12
    }
}

/// Writers journal degraded stripe writes in groups; the power goes at a
/// random moment (every member at one instant, each losing what it had
/// not flushed). Half the seeds keep the journal in a small ring, so that
/// the cut may land during a checkpoint; a third spread each group's
/// records over the members, one to a write. The next start replays what the journal holds: every
/// block reads back as its value at the last flush or one written since
/// (a stripe torn with no record to repair it reads back, on the failed
/// member's chunks, data nobody wrote), and rebuild and scrub agree.
#[test]
fn a_power_cut_during_grouped_journal_writes_is_recovered() {
    let mut checkpoints = 0;
    for seed in 0..seeds() {
        let level = level_of(seed);
        let tag = format!("jcut{seed}-");
        let (a, m, initial) = degraded(level, 5, &tag, Duration::from_micros(200));
        fua_in_half(&m, seed);
        if seed % 4 >= 2 {
            // A small ring: it wraps every few records, and the cut may
            // land while a checkpoint frees its front and groups go on.
            a.limit_journal_ring(64 << 10);
        }
        if seed % 3 == 1 {
            // Each record a write of its own, on members of its own: a
            // group's records lie on several members, and the cut may
            // keep some of them and drop others.
            a.limit_journal_runs(BLOCK as u64);
        }
        let model = Mutex::new(CutModel::new(initial, BLOCK));
        let stop = AtomicBool::new(false);
        let cut_after = Duration::from_micros(StdRng::seed_from_u64(seed).gen_range(500..40_000));
        std::thread::scope(|sc| {
            for w in 0..WRITERS {
                let (a, model, stop) = (&a, &model, &stop);
                sc.spawn(move || write_until(a, w, seed, model, stop, usize::MAX));
            }
            let (m, stop) = (&m, &stop);
            sc.spawn(move || drain_caches(m, seed, stop));
            std::thread::sleep(cut_after);
            FaultyMember::power_cut_together(&m.faulty).unwrap();
            stop.store(true, Ordering::Release);
        });
        checkpoints += a.io_stats().journal_checkpoints;
        drop(a);
        let what = format!("{level} seed {seed} (cut after {cut_after:?})");
        recover(&m, model.into_inner().unwrap(), &tag, &what);
    }
    assert!(
        checkpoints > 0,
        "no cut came after a checkpoint of the small ring"
    );
}

/// A degraded array's writer flushes every few writes, and the power goes
/// at a random moment: the flushes leave the journal's records to the
/// ring's checkpoints (a small ring here, so that it wraps and is
/// reclaimed across many flushes), and the next start replays what the
/// ring holds, records long in place among them. Every block reads back as
/// its value at the last completed flush or one written since, and
/// rebuild and scrub agree.
#[test]
fn a_power_cut_after_flushes_of_a_degraded_array_is_recovered() {
    let (mut checkpoints, mut flushes) = (0, 0);
    for seed in 0..seeds() {
        let level = level_of(seed);
        let tag = format!("jflushcut{seed}-");
        let (a, m, initial) = degraded(level, 5, &tag, Duration::from_micros(100));
        fua_in_half(&m, seed);
        a.limit_journal_ring(48 << 10);
        let model = Mutex::new(CutModel::new(initial, BLOCK));
        let stop = AtomicBool::new(false);
        let mut rng = StdRng::seed_from_u64(seed);
        let cut_after = Duration::from_micros(rng.gen_range(2_000..60_000));
        std::thread::scope(|sc| {
            let (a, model, stop) = (&a, &model, &stop);
            let writer = sc.spawn(move || {
                let blocks = model.lock().unwrap().blocks();
                let mut flushed = 0;
                while !stop.load(Ordering::Acquire) {
                    let nb = rng.gen_range(1..=3);
                    let b0 = rng.gen_range(0..=blocks - nb);
                    let mut data = vec![0u8; nb * BLOCK];
                    rng.fill(&mut data[..]);
                    model.lock().unwrap().wrote(b0, &data);
                    if a.write((b0 * BLOCK) as u64, &data).is_err() {
                        break;
                    }
                    if rng.gen_range(0..3) == 0 {
                        if a.flush().is_err() {
                            break;
                        }
                        // No write in flight: this is the only writer.
                        model.lock().unwrap().flushed();
                        flushed += 1;
                    }
                }
                flushed
            });
            let m = &m;
            sc.spawn(move || drain_caches(m, seed, stop));
            std::thread::sleep(cut_after);
            FaultyMember::power_cut_together(&m.faulty).unwrap();
            stop.store(true, Ordering::Release);
            flushes += writer.join().unwrap();
        });
        checkpoints += a.io_stats().journal_checkpoints;
        drop(a);
        let what = format!("{level} seed {seed} (cut after {cut_after:?})");
        recover(&m, model.into_inner().unwrap(), &tag, &what);
    }
    assert!(flushes > 0, "no flush completed before a cut");
    assert!(checkpoints > 0, "the small ring was never reclaimed");
}

/// A member is rebuilt while writers write, and the power goes at a
/// random moment. Rows the rebuild has written past the position last
/// saved in the metadata count as missing after the cut, and are rebuilt
/// from the other members: a write there torn by the cut must have gone
/// through the journal, or the new member's chunk of that stripe comes
/// back as data nobody wrote. Every block reads back as a value written
/// to it, and rebuild and scrub agree.
#[test]
fn a_power_cut_during_a_rebuild_under_writes_is_recovered() {
    // Four times the others' seeds (each is short): with those rows
    // written in place, no record, two runs failed, at seeds 16 and 19
    // (the threads make a seed's life vary from run to run).
    let mut mid_rebuild = 0;
    for seed in 0..4 * seeds() {
        let level = level_of(seed);
        let tag = format!("jrebuildcut{seed}-");
        let latency = Duration::from_micros(100);
        let (a, mut m, initial) = degraded(level, 5, &tag, latency);
        let ram = RamMember::new(format!("ram:{tag}r"), MIN_DATA_OFFSET + ROWS * CHUNK);
        let new = Arc::new(FaultyMember::new(Arc::new(ram)));
        slow_and_watched(&new, latency);
        a.replace(1, new.clone()).unwrap();
        m.faulty[1] = new;
        // Its position saved every 8 rows: the cut lands with a few rows
        // past the saved one.
        let opts = paced_rebuild(2 << 20, 8 * CHUNK);
        let model = Mutex::new(CutModel::new(initial, BLOCK));
        let stop = AtomicBool::new(false);
        let cut_after = Duration::from_micros(StdRng::seed_from_u64(seed).gen_range(2_000..80_000));
        std::thread::scope(|sc| {
            for w in 0..WRITERS {
                let (a, model, stop) = (&a, &model, &stop);
                sc.spawn(move || write_until(a, w, seed, model, stop, usize::MAX));
            }
            let (a, m, stop, opts) = (&a, &m, &stop, &opts);
            sc.spawn(move || drain_caches(m, seed, stop));
            sc.spawn(move || a.rebuild_all(opts, stop));
            std::thread::sleep(cut_after);
            let slot = &a.slots()[1];
            mid_rebuild += (slot.state == SlotState::Rebuilding && slot.rebuild_row > 0) as u32;
            FaultyMember::power_cut_together(&m.faulty).unwrap();
            stop.store(true, Ordering::Release);
        });
        drop(a);
        let what = format!("{level} seed {seed} (cut after {cut_after:?})");
        recover(&m, model.into_inner().unwrap(), &tag, &what);
    }
    assert!(
        mid_rebuild >= seeds() as u32,
        "the cut came mid-rebuild in {mid_rebuild} runs only"
    );
}

/// Journal writes that panic while `armed` (a bug, or a thread that could
/// not be started, in the middle of a group's writes), on every member of
/// an array: a record goes to some members only (`journal_copies`).
#[derive(Default)]
struct Gate {
    armed: AtomicBool,
    /// Journal writes let through once armed, before the first panic: the
    /// record then reached some of its members.
    spare: AtomicUsize,
    /// What `flush_waits` says: whether the journal writes its records in
    /// groups (true) or alone under its lock (false).
    waits: bool,
    /// Panics once, then disarms itself.
    once: bool,
}

/// A member behind a `Gate`.
struct PanicsInJournal {
    inner: MemberRef,
    gate: Arc<Gate>,
}

impl Member for PanicsInJournal {
    support::pass_through_to_inner!();
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let g = &self.gate;
        let journal = (JOURNAL_OFFSET..MIN_DATA_OFFSET).contains(&offset);
        let let_through = || {
            g.spare
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        };
        if journal && g.armed.load(Ordering::Acquire) && !let_through() {
            std::thread::sleep(Duration::from_millis(5));
            if g.once {
                g.armed.store(false, Ordering::Release);
            }
            panic!("injected: a journal write panicked");
        }
        self.inner.write_at(buf, offset)
    }
    fn flush_waits(&self) -> bool {
        self.gate.waits
    }
}

/// The members of `m`, each behind `gate`.
fn gated(m: &Members, gate: &Arc<Gate>) -> Vec<MemberRef> {
    m.refs()
        .into_iter()
        .map(|inner| {
            Arc::new(PanicsInJournal {
                inner,
                gate: gate.clone(),
            }) as MemberRef
        })
        .collect()
}

/// A degraded RAID5 of 4 RAM members (slot 1 failed) behind one `Gate`
/// (disarmed; `once` as given), every block written once so that every
/// bitmap region is dirty already: later writes write only journal
/// records outside the data.
fn gated_array(tag: &str, once: bool) -> (Arc<Array>, Arc<Gate>) {
    let m = Members::ram(4, ROWS * CHUNK, &format!("{tag}-"));
    let gate = Arc::new(Gate {
        waits: true,
        once,
        ..Default::default()
    });
    let a = support::array::create_shared(Level::Raid5, gated(&m, &gate), tag, CHUNK);
    a.fail_slot(1, "test");
    a.write(0, &vec![0u8; a.capacity() as usize]).unwrap();
    (a, gate)
}

/// A group's leader that panics leaves no one waiting on its group: the
/// writers it carried fail, and a flush (which settles the journal, so
/// waits for every record in flight) and later writes go on.
#[test]
fn a_panic_while_writing_a_group_wedges_nothing() {
    let (a, gate) = gated_array("jpanic", false);
    gate.armed.store(true, Ordering::Release);
    // Each writer's outcome: acknowledged, failed, or panicked.
    let (tx, rx) = std::sync::mpsc::channel();
    for (k, s) in support::array::journaled_rows(&a, 1, 4)
        .into_iter()
        .enumerate()
    {
        let (a, tx) = (a.clone(), tx.clone());
        std::thread::spawn(move || {
            let w = || a.write(s * 3 * CHUNK, &[k as u8 + 1; BLOCK]).is_ok();
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(w)));
        });
    }
    let outcomes: Vec<std::thread::Result<bool>> = (0..4)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(20))
                .expect("a writer waits for ever on a group nobody finishes")
        })
        .collect();
    let panicked = outcomes.iter().filter(|o| o.is_err()).count();
    assert!(
        panicked >= 1,
        "no journal write panicked: the test proves nothing"
    );
    assert!(
        outcomes.iter().all(|o| !matches!(o, Ok(true))),
        "a write was acknowledged without its journal record"
    );
    gate.armed.store(false, Ordering::Release);
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let a = a.clone();
        std::thread::spawn(move || tx.send(a.flush().is_ok()).unwrap());
    }
    let flushed = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the flush waits for ever on a group nobody finishes");
    assert!(flushed, "the flush failed");
    a.write(0, &[0x5A; BLOCK]).unwrap();
    let mut got = vec![0u8; BLOCK];
    a.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0x5A));
}

/// Writers whose records queued behind a group that is given up (its
/// leader panicked) are given up with it, though their own group could be
/// written: replay stops at the first record missing, so one of theirs
/// written in place and torn by a crash could never be repaired.
#[test]
fn records_queued_behind_a_given_up_group_are_given_up_too() {
    let (a, gate) = gated_array("jbehind", true);
    gate.armed.store(true, Ordering::Release);
    let rows = support::array::journaled_rows(&a, 1, 4);
    let write = |k: u64| {
        let (a, s) = (a.clone(), rows[k as usize]);
        std::thread::spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                a.write(s * 3 * CHUNK, &[k as u8 + 1; BLOCK]).is_ok()
            }))
        })
    };
    // The first leads a group whose write panics after 5 ms; the others
    // queue behind it meanwhile.
    let first = write(0);
    std::thread::sleep(Duration::from_millis(1));
    let behind: Vec<_> = (1..4).map(write).collect();
    assert!(
        first.join().unwrap().is_err(),
        "the first group's write did not panic"
    );
    for w in behind {
        assert!(
            !matches!(w.join().unwrap(), Ok(true)),
            "a write queued behind a given-up group was acknowledged"
        );
    }
    // The journal settles, and writes go on.
    a.flush().unwrap();
    a.write(0, &[0x5A; BLOCK]).unwrap();
}

/// A write whose journal record reached some members before its commit
/// panicked is not written in place; a later write of the same stripe,
/// journaled after it, must not let a replay apply the stale record too
/// (its columns, against parity computed without them, would make the
/// missing member's chunk reconstruct wrong). Both ways a record is made
/// durable: alone, and in a group.
#[test]
fn a_record_whose_commit_panicked_is_never_replayed() {
    for waits in [false, true] {
        let tag = format!("jpanicrec{waits}-");
        // A RAID6 missing a member keeps each record on two members: the
        // first holds it already when the second's write panics.
        let m = Members::ram(5, ROWS * CHUNK, &tag);
        let gate = Arc::new(Gate {
            waits,
            ..Default::default()
        });
        let a = support::array::create_shared(Level::Raid6, gated(&m, &gate), &tag, CHUNK);
        let cap = a.capacity() as usize;
        let initial: Vec<u8> = (0..cap).map(|i| (i * 31 % 251) as u8).collect();
        a.write(0, &initial).unwrap();
        a.flush().unwrap();
        // A stripe where slot 1 (failed next) holds data, not parity.
        let geo = a.geometry();
        let nd = 3;
        let s = (0..ROWS)
            .find(|&s| geo.stripe_map(s).members[..nd].contains(&1))
            .unwrap();
        let map = geo.stripe_map(s);
        let at = |i: usize| s * nd as u64 * CHUNK + i as u64 * CHUNK;
        let lost = map.members.iter().position(|&x| x == 1).unwrap();
        let others: Vec<usize> = (0..nd).filter(|&i| i != lost).collect();
        a.fail_slot(1, "test");
        gate.spare.store(1, Ordering::Release);
        gate.armed.store(true, Ordering::Release);
        let w = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            a.write(at(others[0]), &[0xAA; BLOCK])
        }));
        assert!(
            !matches!(w, Ok(Ok(()))),
            "{tag}: acknowledged without its record"
        );
        assert_eq!(
            gate.spare.load(Ordering::Acquire),
            0,
            "{tag}: the record reached no member before the panic: the test proves nothing"
        );
        gate.armed.store(false, Ordering::Release);
        a.write(at(others[1]), &[0xBB; BLOCK]).unwrap();
        // A crash (no flush, no stop): the next start replays the journal.
        drop(a);
        let a = Array::assemble(m.refs()).unwrap().array;
        let mut got = vec![0u8; BLOCK];
        a.read(at(lost), &mut got).unwrap();
        let lost_at = at(lost) as usize;
        assert!(
            got[..] == initial[lost_at..lost_at + BLOCK],
            "{tag}: the missing member's chunk reconstructs wrong after the replay"
        );
        a.read(at(others[1]), &mut got).unwrap();
        assert!(
            got.iter().all(|&b| b == 0xBB),
            "{tag}: an acknowledged write lost"
        );
    }
}

/// Holds the first journal write made once armed until released, then
/// lets it through or panics (a group's leader that never finishes its
/// writes), and counts the journal writes that reach the members.
#[derive(Default)]
struct Hold {
    armed: AtomicBool,
    /// None: not reached yet; Some(false): held; Some(true): released.
    held: Mutex<Option<bool>>,
    changed: std::sync::Condvar,
    panics: bool,
    journal_writes: AtomicUsize,
}

/// A member behind a `Hold`.
struct HeldInJournal {
    inner: MemberRef,
    hold: Arc<Hold>,
}

impl Member for HeldInJournal {
    support::pass_through_to_inner!();
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let h = &self.hold;
        // Records only: the header block (a checkpoint's) is never held.
        if (JOURNAL_OFFSET + BLOCK as u64..MIN_DATA_OFFSET).contains(&offset) {
            h.journal_writes.fetch_add(1, Ordering::AcqRel);
            if h.armed.swap(false, Ordering::AcqRel) {
                let mut held = h.held.lock().unwrap();
                *held = Some(false);
                h.changed.notify_all();
                while *held != Some(true) {
                    held = h.changed.wait(held).unwrap();
                }
                drop(held);
                if h.panics {
                    panic!("injected: a journal write panicked");
                }
            }
        }
        self.inner.write_at(buf, offset)
    }
    fn flush_waits(&self) -> bool {
        true
    }
}

/// Two groups of records are written at once, and the second ends after
/// the first, durable only if the first is: a degraded RAID5 whose first
/// group's journal write is held. Where the second writer's record fills
/// a run (each record a run of its own here), its group is written
/// meanwhile (its journal write reaches a member), but that writer is not
/// answered while the first group is held (its in-place write would begin
/// while the record before it in the ring might still be missing after a
/// crash); once the first group is let through both are acknowledged,
/// and where the first group's write panics instead, the second writer's
/// write fails too, though its own record was written. Where it does not
/// fill a run (runs of 256 KiB), it waits to join a group after the first
/// rather than pay a group's flushes for itself alone.
#[test]
fn a_group_written_beside_the_one_before_it_ends_after_it() {
    for (panics, beside) in [(false, true), (true, true), (false, false)] {
        let tag = format!("jpipe{panics}{beside}-");
        let m = Members::ram(4, ROWS * CHUNK, &tag);
        let hold = Arc::new(Hold {
            panics,
            ..Default::default()
        });
        let members: Vec<MemberRef> = m
            .refs()
            .into_iter()
            .map(|inner| {
                Arc::new(HeldInJournal {
                    inner,
                    hold: hold.clone(),
                }) as MemberRef
            })
            .collect();
        let a = support::array::create_shared(Level::Raid5, members, &tag, CHUNK);
        a.fail_slot(1, "test");
        // Every bitmap region dirty already: later writes write only
        // journal records outside the data.
        a.write(0, &vec![0u8; a.capacity() as usize]).unwrap();
        if beside {
            a.limit_journal_runs(BLOCK as u64);
        }
        hold.armed.store(true, Ordering::Release);
        // Each writer's outcome (acknowledged, failed, or panicked) comes
        // back through a channel, so that one waiting for ever fails the
        // test instead of hanging it.
        let rows = support::array::journaled_rows(&a, 1, 2);
        let write = |k: u64| {
            let (a, (tx, rx)) = (a.clone(), std::sync::mpsc::channel());
            let s = rows[k as usize];
            std::thread::spawn(move || {
                let w = || a.write(s * 3 * CHUNK, &[k as u8 + 1; BLOCK]).is_ok();
                let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(w)));
            });
            rx
        };
        let outcome = |rx: std::sync::mpsc::Receiver<std::thread::Result<bool>>| {
            rx.recv_timeout(Duration::from_secs(20))
                .expect("a writer waits for ever on a group")
        };
        let first = write(0);
        {
            let mut held = hold.held.lock().unwrap();
            while held.is_none() {
                held = hold.changed.wait(held).unwrap();
            }
        }
        let before = hold.journal_writes.load(Ordering::Acquire);
        let second = write(1);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        // The second record has its place (taken under the same hold of
        // the journal's lock as its writer's choice to lead or wait), so
        // the window below follows that choice.
        while a.journal_records_in_flight() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the second record never took its place"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        while beside && hold.journal_writes.load(Ordering::Acquire) == before {
            assert!(
                std::time::Instant::now() < deadline,
                "the second group was not written while the first was held"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            second.recv_timeout(Duration::from_millis(50)).is_err(),
            "the second writer was answered while the group before its own was held"
        );
        if !beside {
            assert_eq!(
                hold.journal_writes.load(Ordering::Acquire),
                before,
                "a group of less than a run was written beside the one before it"
            );
        }
        *hold.held.lock().unwrap() = Some(true);
        hold.changed.notify_all();
        let (first, second) = (outcome(first), outcome(second));
        if panics {
            assert!(first.is_err(), "the first group's write did not panic");
            assert!(
                matches!(second, Ok(false)),
                "a write whose group ended after a given-up group was not failed: {second:?}"
            );
            a.flush().unwrap();
        } else {
            assert!(matches!(first, Ok(true)) && matches!(second, Ok(true)));
            for k in 0..2u64 {
                let mut got = vec![0u8; BLOCK];
                a.read(k * 3 * CHUNK, &mut got).unwrap();
                assert!(got.iter().all(|&b| b == k as u8 + 1), "write {k}");
            }
        }
    }
}

/// A RAID6 missing a member keeps each record on two members, each run of
/// a group on two of its own (here every record a run), while one of the
/// members fails mid-run (every I/O refused after a count the seed sets:
/// a journal write, an in-place write or a flush, inside a group or
/// between): it is failed, the array (missing two) is within its
/// redundancy, so every write is acknowledged and reads back (it fails
/// where a group with a member that erred is given up). Then a power cut
/// (in-place writes since each member's last flush lost, the drives
/// draining their caches on their own meanwhile): the next start replays
/// from the members left, every block reads back as its value at the last
/// flush or one written since, and rebuild and scrub agree.
#[test]
fn a_member_failing_mid_group_loses_no_acknowledged_write() {
    for seed in 0..4u64 {
        let tag = format!("jmidfail{seed}-");
        let (a, m, initial) = degraded(Level::Raid6, 5, &tag, Duration::from_micros(200));
        a.limit_journal_runs(BLOCK as u64);
        let fails = 2 + seed as usize % 3;
        m.faulty[fails].set_faults(Faults {
            latency: Duration::from_micros(200),
            fail_after: Some(120 + 10 * seed),
            ..Default::default()
        });
        let model = Mutex::new(CutModel::new(initial, BLOCK));
        let (stop, drained) = (AtomicBool::new(false), AtomicBool::new(false));
        std::thread::scope(|sc| {
            let (m, drained) = (&m, &drained);
            sc.spawn(move || drain_caches(m, seed, drained));
            let writers: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let (a, model, stop) = (&a, &model, &stop);
                    sc.spawn(move || write_until(a, w, seed, model, stop, 20))
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            drained.store(true, Ordering::Release);
        });
        let what = format!("seed {seed}, slot {fails} failing");
        let slots = a.slots();
        assert_eq!(slots[fails].state, SlotState::Failed, "{what}: not failed");
        let io = a.io_stats();
        assert!(
            io.journal_records >= (WRITERS * 20) as u64 / 2,
            "{what}: {} records: the writes were not journaled",
            io.journal_records
        );
        // Every write acknowledged (a writer stops at its first error):
        // each block holds the last value written.
        let mut got = vec![0u8; a.capacity() as usize];
        a.read(0, &mut got).unwrap();
        let mut acked = model.lock().unwrap().clone();
        acked.flushed();
        acked.check(&got, &format!("{what}, before the cut"));
        FaultyMember::power_cut_together(&m.faulty).unwrap();
        drop(a);
        recover(&m, model.into_inner().unwrap(), &tag, &what);
    }
}
