//! The long jobs' batches cut into runs worked side by side (a rebuild's
//! and a hot replace's `RebuildOptions::parallel`, a scrub's
//! `ScrubOptions::parallel`), for each redundant level: from a plain
//! thread (runs on threads of their own), and from a rayon thread (where
//! such runs once hung for ever, the parity engine's parallel work inside
//! them left to a pool whose one thread waited for them; there they run
//! one after another).
//!
//! A rebuilt or hot-replaced member comes out in sync under writes: the
//! data reads back as written, from the new member too, and parity and
//! copies agree. A scrub in runs finds what one run finds, in the same
//! order, repairs it, and finds nothing under writes on a clean array.

use raid_core::array::{Array, RebuildEnd, RebuildOptions, ScrubOptions, ScrubReport};
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{MemberRef, RamMember};
use raid_core::metadata::{SlotState, MIN_DATA_OFFSET};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

mod support;

const CHUNK: u64 = 16 << 10;
const DATA: u64 = 8 << 20;

#[test]
fn runs_under_writes_from_a_plain_and_a_rayon_thread() {
    one_rayon_thread();
    for (level, n) in LEVELS {
        rebuild_under_writes(level, n, false, None);
        rebuild_under_writes(level, n, true, None);
    }
}

/// A source member of a RAID6 vanishes while runs side by side read it:
/// runs meet its errors together, it is failed once, the rebuild goes on
/// from the others and ends with the data whole.
#[test]
fn a_source_member_lost_under_runs_side_by_side() {
    one_rayon_thread();
    rebuild_under_writes(Level::Raid6, 6, false, Some(3));
}

/// Rayon's pool with one thread, before any test of this binary uses it.
/// A rebuild on that thread, blocked joining runs on threads of their own,
/// would hold the one thread their parallel parity work waits for.
fn one_rayon_thread() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build_global()
            .expect("the first use of rayon in this test binary")
    });
}

/// Fails and replaces a member of a new array of `level`, rebuilds it in
/// runs side by side (from a rayon thread where `on_rayon`) while a writer
/// writes, member `vanishes` (if any) going as it starts, and checks the
/// outcome.
fn rebuild_under_writes(level: Level, n: usize, on_rayon: bool, vanishes: Option<usize>) {
    let tag = format!("runs{level:?}{on_rayon}");
    let (members, a, model) = zeroed(level, n, &tag);
    let lost = 1;
    a.fail_member(lost, false).unwrap();
    let new = ram_member(&tag);
    a.replace(lost, new.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let w = writer(a.clone(), model.clone(), stop.clone(), 7);
    let a2 = a.clone();
    let rebuilt = start_job(on_rayon, move || {
        a2.rebuild(lost, &runs_of_two(), &AtomicBool::new(false))
    });
    if let Some(v) = vanishes {
        members.faulty[v].fail_all();
    }
    let r = ended(rebuilt, std::time::Duration::from_secs(60))
        .unwrap_or_else(|| panic!("{level:?}, on rayon {on_rayon}: the rebuild hung"));
    assert_eq!(r.unwrap(), RebuildEnd::Finished, "{level:?}");
    stop.store(true, Ordering::Relaxed);
    w.join().unwrap();
    let failed = |s: usize| a.slots()[s].state == SlotState::Failed;
    assert!((0..n).all(|s| failed(s) == (Some(s) == vanishes)));
    let model = model.lock().unwrap();
    support::array::assert_matches(&a, &model);
    support::array::assert_consistent(&a, &members_now(&members.refs(), lost, &new));
}

/// Rebuild or hot replace options: runs of 2 rows, 4 side by side.
fn runs_of_two() -> RebuildOptions {
    RebuildOptions {
        batch_rows: 2,
        parallel: 4,
        ..Default::default()
    }
}

/// A new array of `level` over `n` members in RAM, zeroed, with its model.
fn zeroed(
    level: Level,
    n: usize,
    tag: &str,
) -> (support::array::Members, Arc<Array>, Arc<Mutex<Vec<u8>>>) {
    let members = support::array::Members::ram(n, DATA, tag);
    let a = support::array::create_shared(level, members.refs(), tag, CHUNK);
    let size = a.capacity() as usize;
    a.write(0, &AlignedBuf::new(size)).unwrap();
    (members, a, Arc::new(Mutex::new(vec![0u8; size])))
}

/// A new array of `level` over `n` members in RAM, filled with random
/// bytes from `seed`, and those bytes.
fn filled(
    level: Level,
    n: usize,
    tag: &str,
    seed: u64,
) -> (support::array::Members, Arc<Array>, Vec<u8>) {
    let members = support::array::Members::ram(n, DATA, tag);
    let a = support::array::create_shared(level, members.refs(), tag, CHUNK);
    // The tests count the rows a resync copies from the bits a flush
    // leaves: each bit cleared at the first flush after its writes.
    a.set_bitmap_linger(Some(std::time::Duration::ZERO));
    let mut img = vec![0u8; a.capacity() as usize];
    SmallRng::seed_from_u64(seed).fill(&mut img[..]);
    a.write(0, &img).unwrap();
    (members, a, img)
}

/// A blank member in RAM the size of the array's, named after `tag`.
fn ram_member(tag: &str) -> MemberRef {
    Arc::new(RamMember::new(
        format!("ram:{tag}-new"),
        MIN_DATA_OFFSET + DATA,
    ))
}

/// The array's members after `lost` was replaced by `new`.
fn members_now(old: &[MemberRef], lost: usize, new: &MemberRef) -> Vec<MemberRef> {
    let mut m = old.to_vec();
    m[lost] = new.clone();
    m
}

/// Every redundant level, with its member count.
const LEVELS: [(Level, usize); 4] = [
    (Level::Raid1, 2),
    (Level::Raid5, 5),
    (Level::Raid6, 6),
    (Level::Raid10, 4),
];

/// Starts `job` on a plain thread, or on a rayon thread where `on_rayon`;
/// its outcome comes through the receiver.
fn start_job<T: Send + 'static>(
    on_rayon: bool,
    job: impl FnOnce() -> T + Send + 'static,
) -> std::sync::mpsc::Receiver<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    let job = move || tx.send(job()).unwrap();
    if on_rayon {
        rayon::spawn(job);
    } else {
        std::thread::spawn(job);
    }
    rx
}

/// A started job's outcome, or None if it has not ended within `limit`.
fn ended<T>(job: std::sync::mpsc::Receiver<T>, limit: std::time::Duration) -> Option<T> {
    job.recv_timeout(limit).ok()
}

/// Runs `job` as `start_job` does; panics if it has not ended within a
/// minute.
fn run_job<T: Send + 'static>(
    on_rayon: bool,
    what: &str,
    job: impl FnOnce() -> T + Send + 'static,
) -> T {
    ended(start_job(on_rayon, job), std::time::Duration::from_secs(60))
        .unwrap_or_else(|| panic!("{what}, on rayon {on_rayon}: it hung"))
}

/// A writer of random 4 KiB blocks (from `seed`) into `a`, `model` kept
/// with it, until `stop`.
fn writer(
    a: Arc<Array>,
    model: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let size = a.capacity() as usize;
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut b = AlignedBuf::new(4096);
        while !stop.load(Ordering::Relaxed) {
            let off = rng.gen_range(0..size / 4096) * 4096;
            rng.fill(&mut b[..]);
            // The model under its lock with the write: writes of one
            // block land in the model's order.
            let mut m = model.lock().unwrap();
            a.write(off as u64, &b).unwrap();
            m[off..off + 4096].copy_from_slice(&b);
        }
    })
}

/// A hot replace's copy in runs side by side (4 runs of 2 rows) while a
/// writer writes: the new device comes out the member, in sync.
#[test]
fn hot_replace_in_runs_under_writes_from_a_plain_and_a_rayon_thread() {
    one_rayon_thread();
    for (level, n) in LEVELS {
        for on_rayon in [false, true] {
            let tag = format!("hotruns{level:?}{on_rayon}");
            let (members, a, model) = zeroed(level, n, &tag);
            let slot = 1;
            let new = ram_member(&tag);
            a.hot_replace(slot, new.clone()).unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let w = writer(a.clone(), model.clone(), stop.clone(), 11);
            let a2 = a.clone();
            let r = run_job(on_rayon, "hot replace", move || {
                a2.hot_replace_copy(&runs_of_two(), &AtomicBool::new(false))
            });
            assert_eq!(r.unwrap(), RebuildEnd::Finished, "{level:?}");
            stop.store(true, Ordering::Relaxed);
            w.join().unwrap();
            assert!(a.slots().iter().all(|s| s.state == SlotState::Active));
            assert_eq!(a.slots()[slot].member.as_deref(), Some(new.identity()));
            let model = model.lock().unwrap();
            support::array::assert_matches(&a, &model);
            support::array::assert_consistent(&a, &members_now(&members.refs(), slot, &new));
        }
    }
}

/// The scrub report's findings, comparable between two scrubs.
fn findings(r: &ScrubReport) -> Vec<(u64, Option<usize>, String)> {
    r.mismatches
        .iter()
        .map(|m| (m.stripe, m.slot, m.what.clone()))
        .collect()
}

/// Corruption in rows that fall in different runs and batches: a scrub in
/// runs side by side (4 runs of 2 rows) reports what a scrub in one run
/// reports, in the same order, from a plain and from a rayon thread;
/// repaired in runs, the array scrubs clean and reads back whole.
#[test]
fn a_scrub_in_runs_finds_and_repairs_what_one_run_does() {
    one_rayon_thread();
    for (level, n) in LEVELS {
        for on_rayon in [false, true] {
            let tag = format!("scrubruns{level:?}{on_rayon}");
            let (members, a, img) = filled(level, n, &tag, 5);
            // Rows in different runs and batches, each on a member in turn.
            for (k, row) in [0u64, 3, 5, 6, 9, 17, 40, 41].into_iter().enumerate() {
                members.corrupt(k % n, MIN_DATA_OFFSET + row * CHUNK + 100);
            }
            let scrub = |a: &Arc<Array>, parallel: usize, repair: bool| {
                let (a, what) = (a.clone(), format!("{level:?} scrub"));
                let opts = ScrubOptions {
                    repair,
                    batch_rows: 2,
                    parallel,
                    ..Default::default()
                };
                run_job(on_rayon, &what, move || {
                    a.scrub(&opts, &AtomicBool::new(false)).unwrap()
                })
            };
            let one = scrub(&a, 1, false);
            let side_by_side = scrub(&a, 4, false);
            assert!(!one.mismatches.is_empty(), "{level:?}: nothing found");
            assert_eq!(findings(&side_by_side), findings(&one), "{level:?}");
            assert_eq!(side_by_side.bytes_read, one.bytes_read, "{level:?}");
            assert_eq!(side_by_side.rows, one.rows, "{level:?}");
            let repaired = scrub(&a, 4, true);
            assert_eq!(repaired.mismatches.len(), one.mismatches.len(), "{level:?}");
            assert!(repaired.mismatches.iter().all(|m| m.repaired));
            assert!(scrub(&a, 4, false).mismatches.is_empty(), "{level:?}");
            // RAID6 locates the bad chunk, data or parity: the data reads
            // back as written (RAID5 and mirrors cannot tell which copy
            // was wrong, and keep the data's or the first copy).
            if level == Level::Raid6 {
                support::array::assert_matches(&a, &img);
            }
        }
    }
}

/// A check-only scrub in runs side by side while a writer writes: each
/// batch holds its stripes' locks, so no stripe is judged half-written.
#[test]
fn a_scrub_in_runs_under_writes_finds_nothing() {
    one_rayon_thread();
    for (level, n) in LEVELS {
        let (_members, a, model) = zeroed(level, n, &format!("scrubwrites{level:?}"));
        let stop = Arc::new(AtomicBool::new(false));
        let w = writer(a.clone(), model.clone(), stop.clone(), 11);
        let opts = ScrubOptions {
            batch_rows: 2,
            parallel: 4,
            ..Default::default()
        };
        for _ in 0..3 {
            let r = a.scrub(&opts, &AtomicBool::new(false)).unwrap();
            assert!(r.mismatches.is_empty(), "{level:?}: {:?}", r.mismatches);
        }
        stop.store(true, Ordering::Relaxed);
        w.join().unwrap();
        support::array::assert_matches(&a, &model.lock().unwrap());
    }
}

/// The old device errs on the rows of one run of a batch while the other
/// runs copy theirs: the copy ends, the old device's slot fails (it lost a
/// read) and the replacement takes it to be rebuilt; the data is whole
/// from the others, and after the rebuild.
#[test]
fn a_hot_replace_whose_old_device_errs_in_one_run() {
    one_rayon_thread();
    let (members, a, img) = filled(Level::Raid5, 5, "hoterr", 9);
    let slot = 2;
    let new = ram_member("hoterr");
    a.hot_replace(slot, new.clone()).unwrap();
    // Rows 12 and 13: the third of four runs of 2 rows in the second batch.
    let bad = MIN_DATA_OFFSET + 13 * CHUNK;
    members.faulty[slot].set_faults(raid_core::member::Faults {
        fail_ranges: vec![(bad, bad + 512)],
        ..Default::default()
    });
    let r = a.hot_replace_copy(&runs_of_two(), &AtomicBool::new(false));
    assert!(r.is_err(), "the copy went on past a read error: {r:?}");
    assert_eq!(a.slots()[slot].state, SlotState::Rebuilding);
    assert_eq!(a.slots()[slot].member.as_deref(), Some(new.identity()));
    assert!(a.hot_replace_progress().is_none());
    assert!(a
        .event_log()
        .iter()
        .any(|(_, e)| e.kind() == "hot_replace_rebuilding"));
    support::array::assert_matches(&a, &img);
    a.rebuild(slot, &runs_of_two(), &AtomicBool::new(false))
        .unwrap();
    assert_eq!(a.state(), raid_core::array::ArrayState::Optimal);
    support::array::assert_matches(&a, &img);
}

/// A re-added member's resync under a rate limit: only the rows written
/// while it was out are copied, and only they are paced. At 256 KiB/s the
/// whole member would take 32 s; its one written region (16 rows of 16
/// KiB) takes one.
#[test]
fn a_paced_resync_skips_clean_rows_unpaced() {
    one_rayon_thread();
    let (members, a, mut img) = filled(Level::Raid5, 5, "resync", 3);
    let size = img.len();
    a.flush().unwrap();
    a.fail_member(1, false).unwrap();
    let at = size / 2;
    img[at..at + 4096].fill(0xa5);
    a.write(at as u64, &img[at..at + 4096]).unwrap();
    a.flush().unwrap();
    assert_eq!(a.re_add(members.refs()[1].clone()).unwrap(), 1);
    let opts = RebuildOptions {
        rate_limit: Some(256 << 10),
        batch_rows: 16,
        parallel: 1,
        ..Default::default()
    };
    let a2 = a.clone();
    let resync = start_job(false, move || a2.rebuild(1, &opts, &AtomicBool::new(false)));
    let r = ended(resync, std::time::Duration::from_secs(20))
        .expect("the resync paced the rows it skipped");
    assert_eq!(r.unwrap(), RebuildEnd::Finished);
    assert!(a.slots().iter().all(|s| s.state == SlotState::Active));
    support::array::assert_matches(&a, &img);
    support::array::assert_consistent(&a, &members.refs());
}

/// A stop (what a closing array sends its jobs) ends a paced rebuild,
/// scrub or hot replace in the middle of its pause: at 1 KiB/s a first
/// batch of 16 rows of 16 KiB asks for a pause of over four minutes, and
/// none of them may wait it out.
#[test]
fn a_stop_ends_a_paced_job_in_its_pause() {
    one_rayon_thread();
    let limit = std::time::Duration::from_secs(60);
    let slow = RebuildOptions {
        rate_limit: Some(1 << 10),
        batch_rows: 16,
        parallel: 1,
        ..Default::default()
    };
    let stop_later = |stop: Arc<AtomicBool>| {
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            stop.store(true, Ordering::Release);
        })
    };

    let (members, a, img) = filled(Level::Raid5, 5, "pausestop", 4);
    a.fail_member(1, false).unwrap();
    a.replace(1, ram_member("pausestop-new")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = stop_later(stop.clone());
    let (a2, opts, st) = (a.clone(), slow.clone(), stop.clone());
    let r = ended(start_job(false, move || a2.rebuild(1, &opts, &st)), limit)
        .expect("the rebuild slept through its stop");
    t.join().unwrap();
    assert_eq!(r.unwrap(), RebuildEnd::Interrupted);

    let (members2, b, img2) = filled(Level::Raid5, 5, "pausestop2", 5);
    let stop = Arc::new(AtomicBool::new(false));
    let t = stop_later(stop.clone());
    let (b2, st) = (b.clone(), stop.clone());
    let scrub = ScrubOptions {
        rate_limit: Some(1 << 10),
        batch_rows: 16,
        parallel: 1,
        ..Default::default()
    };
    let r = ended(start_job(false, move || b2.scrub(&scrub, &st)), limit)
        .expect("the scrub slept through its stop");
    t.join().unwrap();
    assert!(r.is_ok(), "{r:?}");

    b.hot_replace(2, ram_member("pausestop2-new")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = stop_later(stop.clone());
    let (b2, st) = (b.clone(), stop.clone());
    let r = ended(
        start_job(false, move || b2.hot_replace_copy(&slow, &st)),
        limit,
    )
    .expect("the hot replace slept through its stop");
    t.join().unwrap();
    assert_eq!(r.unwrap(), RebuildEnd::Interrupted);
    assert_eq!(
        b.slots()[2].member,
        Some(members2.refs()[2].identity().to_string())
    );
    support::array::assert_matches(&a, &img);
    support::array::assert_matches(&b, &img2);
    drop(members);
}

/// The old device fails while a slow hot replace pauses between batches:
/// the pause ends there, and the replacement takes the slot at once
/// instead of after the pause (at 1 KiB/s, over four minutes), during
/// which the slot would sit failed with nothing rebuilding it.
#[test]
fn a_source_failing_in_a_paced_pause_is_taken_over_at_once() {
    one_rayon_thread();
    let (_members, a, img) = filled(Level::Raid5, 5, "pausefail", 6);
    let new = ram_member("pausefail-new");
    a.hot_replace(3, new.clone()).unwrap();
    let slow = RebuildOptions {
        rate_limit: Some(1 << 10),
        batch_rows: 16,
        parallel: 1,
        ..Default::default()
    };
    let a2 = a.clone();
    let copy = start_job(false, move || {
        a2.hot_replace_copy(&slow, &AtomicBool::new(false))
    });
    // Into the first batch's pause (its rows copied), then the fail.
    let t = std::time::Instant::now();
    while a.hot_replace_progress().is_some_and(|p| p.2 == 0) {
        assert!(t.elapsed() < std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    a.fail_member(3, false).unwrap();
    let r = ended(copy, std::time::Duration::from_secs(60))
        .expect("the copy slept through its source's failure");
    assert!(r.is_err(), "{r:?}");
    assert_eq!(a.slots()[3].state, SlotState::Rebuilding);
    assert_eq!(a.slots()[3].member.as_deref(), Some(new.identity()));
    a.rebuild(3, &runs_of_two(), &AtomicBool::new(false))
        .unwrap();
    support::array::assert_matches(&a, &img);
}

/// The old device fails in the middle of its hot replace: the replacement
/// takes the slot keeping the rows it was copied, and its rebuild resyncs
/// those only in regions the bitmap marks (a write made while they were
/// paired reached both; one made after the failure is marked), rebuilding
/// the rows not yet copied whole. It used to start again from row 0.
#[test]
fn a_hot_replace_whose_source_fails_keeps_the_rows_it_copied() {
    one_rayon_thread();
    let (members, a, mut img) = filled(Level::Raid5, 5, "keepcopy", 8);
    // Whole, flushed: the bitmap marks nothing.
    a.flush().unwrap();
    let new = ram_member("keepcopy");
    a.hot_replace(3, new.clone()).unwrap();
    let slow = RebuildOptions {
        rate_limit: Some(1 << 10),
        batch_rows: 64,
        parallel: 1,
        ..Default::default()
    };
    let a2 = a.clone();
    let copy = start_job(false, move || {
        a2.hot_replace_copy(&slow, &AtomicBool::new(false))
    });
    let t = std::time::Instant::now();
    while a.hot_replace_progress().is_some_and(|p| p.2 == 0) {
        assert!(t.elapsed() < std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Rows 0-63 are copied (regions 0-3 of 16 rows). Row 40, written while
    // paired, then flushed: its region's bit is cleared again.
    let row_bytes = 4 * CHUNK as usize;
    let mut put = |row: usize, seed: u8| {
        let data = vec![seed; 4096];
        let off = row * row_bytes + 8192;
        a.write(off as u64, &data).unwrap();
        img[off..off + data.len()].copy_from_slice(&data);
    };
    put(40, 0xa1);
    a.flush().unwrap();
    a.fail_member(3, false).unwrap();
    let r = ended(copy, std::time::Duration::from_secs(60)).expect("the copy ended");
    assert!(r.is_err(), "{r:?}");
    assert_eq!(a.slots()[3].state, SlotState::Rebuilding);
    assert_eq!(a.slots()[3].member.as_deref(), Some(new.identity()));
    // Written while slot 3 is out of sync, into a row it was copied.
    put(5, 0xb2);
    a.rebuild(3, &runs_of_two(), &AtomicBool::new(false))
        .unwrap();
    support::array::assert_matches(&a, &img);
    support::array::assert_consistent(&a, &members_now(&members.refs(), 3, &new));
    let rows = a.geometry().rows();
    let copied = a
        .event_log()
        .iter()
        .find_map(|(_, e)| match e {
            raid_core::array::ArrayEvent::RebuildFinished {
                slot: 3,
                rows_copied,
                ..
            } => Some(*rows_copied),
            _ => None,
        })
        .expect("a rebuild_finished event");
    // Regions 1-3 (rows 16-63) were clean and skipped; region 0 (row 5's)
    // resynced, and rows 64 on rebuilt.
    assert_eq!(copied, rows - 48, "{copied} of {rows} rows rebuilt");
}

/// The old device's file is cut short during its hot replace, then a write
/// past the cut grows it again with a hole: the copier reads the hole as
/// zeros, without an error, until it reads past the new end and the slot
/// fails. The replacement must not keep those rows as copied: it is rebuilt
/// whole (found by a review of the change that keeps a copy's rows).
#[test]
fn a_hot_replace_whose_source_file_was_cut_keeps_nothing_it_copied() {
    one_rayon_thread();
    let dir = std::env::temp_dir().join(format!("cut-source-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let members = support::array::files(&dir, 4, DATA);
    let a = support::array::create_shared(Level::Raid5, members.clone(), "cut", CHUNK);
    let mut img = vec![0u8; a.capacity() as usize];
    SmallRng::seed_from_u64(9).fill(&mut img[..]);
    a.write(0, &img).unwrap();
    a.flush().unwrap();
    let new = ram_member("cut");
    a.hot_replace(1, new.clone()).unwrap();
    // Cut at row 100; a write at row 300 grows the file to there again.
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("m1.img"))
        .unwrap()
        .set_len(MIN_DATA_OFFSET + 100 * CHUNK)
        .unwrap();
    let row_bytes = 3 * CHUNK as usize;
    let off = 300 * row_bytes;
    let data = vec![0x5e; row_bytes];
    a.write(off as u64, &data).unwrap();
    img[off..off + data.len()].copy_from_slice(&data);
    let opts = RebuildOptions {
        batch_rows: 64,
        parallel: 1,
        ..Default::default()
    };
    assert!(a.hot_replace_copy(&opts, &AtomicBool::new(false)).is_err());
    assert_eq!(a.slots()[1].state, SlotState::Rebuilding);
    a.rebuild(1, &runs_of_two(), &AtomicBool::new(false))
        .unwrap();
    support::array::assert_matches(&a, &img);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A hot replace's copy in steps (runs of 64 rows of 16 KiB: two steps of
/// 32, the second step's reads in one
/// submission with the first step's writes): the old device erring in a
/// second step ends the copy with the new device rebuilding in its place;
/// the new device erring there drops it, and the old one stays the member.
/// Either way the data reads back whole.
#[test]
fn a_hot_replace_in_steps_meets_errors_beside_the_step_before() {
    use raid_core::member::{Faults, FaultyMember};
    one_rayon_thread();
    let steps = RebuildOptions {
        batch_rows: 64,
        parallel: 1,
        step_bytes: 32 * CHUNK,
        ..Default::default()
    };
    let slot = 2;
    // Row 104: the second step of the second batch.
    let (members, a, img) = filled(Level::Raid5, 5, "hotstep-old", 11);
    // Whole, flushed: the bitmap marks nothing, so the rebuild after the
    // copy keeps exactly the rows the copy finished.
    a.flush().unwrap();
    let new = ram_member("hotstep-old");
    a.hot_replace(slot, new.clone()).unwrap();
    let bad = MIN_DATA_OFFSET + 104 * CHUNK;
    members.faulty[slot].set_faults(Faults {
        fail_ranges: vec![(bad, bad + 512)],
        ..Default::default()
    });
    let r = a.hot_replace_copy(&steps, &AtomicBool::new(false));
    assert!(r.is_err(), "the copy went on past a read error: {r:?}");
    assert_eq!(a.slots()[slot].state, SlotState::Rebuilding);
    assert_eq!(a.slots()[slot].member.as_deref(), Some(new.identity()));
    support::array::assert_matches(&a, &img);
    a.rebuild(slot, &steps, &AtomicBool::new(false)).unwrap();
    assert_eq!(a.state(), raid_core::array::ArrayState::Optimal);
    support::array::assert_matches(&a, &img);
    support::array::assert_consistent(&a, &members_now(&members.refs(), slot, &new));
    // The first batch (rows 0-63) was kept; the one that failed, though
    // its first step reached the new device, was rebuilt with the rest.
    let copied = a.event_log().iter().find_map(|(_, e)| match e {
        raid_core::array::ArrayEvent::RebuildFinished { rows_copied, .. } => Some(*rows_copied),
        _ => None,
    });
    assert_eq!(copied, Some(a.geometry().rows() - 64));

    // Row 74: written beside the reads of the second batch's second step.
    let (_members, a, img) = filled(Level::Raid5, 5, "hotstep-new", 12);
    let old = a.slots()[slot].member.clone();
    let new = Arc::new(FaultyMember::new(ram_member("hotstep-new")));
    a.hot_replace(slot, new.clone()).unwrap();
    let bad = MIN_DATA_OFFSET + 74 * CHUNK;
    new.set_faults(Faults {
        fail_ranges: vec![(bad, bad + 512)],
        ..Default::default()
    });
    let r = a.hot_replace_copy(&steps, &AtomicBool::new(false));
    assert!(
        r.is_err(),
        "a replacement that erred was switched in: {r:?}"
    );
    assert_eq!(a.state(), raid_core::array::ArrayState::Optimal);
    assert_eq!(a.slots()[slot].state, SlotState::Active);
    assert_eq!(a.slots()[slot].member, old);
    support::array::assert_matches(&a, &img);

    // Both in one submission (row 104 read, row 74 written): the new
    // device's error is not lost behind the old one's, so the slot is
    // failed rather than rebuilt onto a device that just failed a write.
    let (members, a, img) = filled(Level::Raid5, 5, "hotstep-both", 13);
    let new = Arc::new(FaultyMember::new(ram_member("hotstep-both")));
    a.hot_replace(slot, new.clone()).unwrap();
    let (read_bad, write_bad) = (MIN_DATA_OFFSET + 104 * CHUNK, MIN_DATA_OFFSET + 74 * CHUNK);
    members.faulty[slot].set_faults(Faults {
        fail_ranges: vec![(read_bad, read_bad + 512)],
        ..Default::default()
    });
    new.set_faults(Faults {
        fail_ranges: vec![(write_bad, write_bad + 512)],
        ..Default::default()
    });
    let r = a.hot_replace_copy(&steps, &AtomicBool::new(false));
    assert!(r.is_err(), "{r:?}");
    assert_eq!(a.slots()[slot].state, SlotState::Failed);
    support::array::assert_matches(&a, &img);
}
