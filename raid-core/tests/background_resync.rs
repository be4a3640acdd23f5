//! An unclean start that resyncs while the array is served
//! (`ResyncAt::Background`, the daemon's way): the array serves at once,
//! the resync makes every torn stripe and copy agree while writes go on,
//! a mirror's reads meanwhile return the copy the resync keeps, and a stop
//! before the resync's end leaves it owed to the next start.

mod support;

use raid_core::array::{Array, ArrayEvent, AssembleOptions, ResyncAt, ScrubOptions};
use raid_core::layout::Level;
use raid_core::member::{Faults, Member, MemberRef};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use support::array::{assert_consistent, assert_matches, written_whole, Members};
use support::wait_until;

const CHUNK: u64 = 16 * 1024;

fn in_background() -> AssembleOptions {
    AssembleOptions {
        resync: ResyncAt::Background,
        ..Default::default()
    }
}

/// An array of `level` written whole and flushed, then dropped without a
/// stop (a crash): every region of its bitmap marked. Returns the image
/// written, its geometry and data offset.
fn crashed(m: &Members, level: Level) -> (Vec<u8>, raid_core::layout::Geometry, u64) {
    let (a, image) = written_whole(level, m, CHUNK);
    let (g, base) = (a.geometry(), a.data_offset());
    drop(a);
    (image, g, base)
}

/// `members` started again the daemon's way: served, its resync owed.
fn started_owing(members: Vec<MemberRef>) -> Arc<Array> {
    Arc::new(
        Array::assemble_with(members, in_background())
            .unwrap()
            .array,
    )
}

/// Waits for the resync `a` runs to end, then checks that the array reads
/// `image` and that its members agree, and stops it.
fn resynced_to(a: &Arc<Array>, m: &Members, image: &[u8], what: &str) {
    wait_until(what, || !a.resync_owed());
    assert_matches(a, image);
    assert_consistent(a, &m.refs());
    a.close().unwrap();
}

/// Tears, behind the array's back, what a crash may leave torn: the parity
/// of some stripes (RAID5/6), the second copy of some chunks (mirrors).
fn tear(m: &Members, g: &raid_core::layout::Geometry, base: u64) {
    match g.level {
        Level::Raid5 | Level::Raid6 => {
            for s in [0, 5, 17, g.rows() - 1] {
                let p = g.stripe_map(s).members[g.data_chunks()];
                m.corrupt(p, base + s * g.chunk + 1000);
            }
        }
        _ => {
            for c in [0, 5, 17, g.capacity() / g.chunk - 1] {
                let second = g.chunk_copies(c)[1];
                m.corrupt(second.member, base + second.offset + 1000);
            }
        }
    }
}

#[test]
fn an_unclean_start_in_the_background_serves_at_once_and_resyncs_every_region() {
    for (level, n) in [
        (Level::Raid5, 4),
        (Level::Raid6, 5),
        (Level::Raid10, 4),
        (Level::Raid1, 3),
    ] {
        let what = format!("{level}");
        let m = Members::ram(n, 4 << 20, &format!("bg-resync{level}"));
        let (mut image, g, base) = crashed(&m, level);
        tear(&m, &g, base);
        let a = started_owing(m.refs());
        assert!(a.resync_owed(), "{what}: owed, not run, at the assembly");
        let said = a.event_log().iter().any(|(_, e)| {
            matches!(e, ArrayEvent::UncleanStop { regions, background: true, .. } if *regions > 0)
        });
        assert!(
            said,
            "{what}: the unclean stop says the resync runs while served"
        );
        let e = a
            .scrub(&ScrubOptions::default(), &AtomicBool::new(false))
            .expect_err("a scrub while the resync is owed");
        assert!(e.to_string().contains("resyncing"), "{what}: {e}");
        // Served before the resync runs: writes into torn stripes too (a
        // read-modify-write carries the parity's error along; the resync
        // recomputes it from the data).
        for (i, at) in [0u64, 5 * CHUNK + 4096, 17 * CHUNK * 2, a.capacity() - 8192]
            .into_iter()
            .enumerate()
        {
            let block = vec![0xc0 + i as u8; 4096];
            a.write(at, &block).unwrap();
            image[at as usize..at as usize + 4096].copy_from_slice(&block);
        }
        assert_matches(&a, &image);
        a.kick_resync();
        // And while it runs.
        for i in 0..64u64 {
            let at = (i * 7919 * 4096) % (a.capacity() - 4096);
            let block = vec![i as u8 ^ 0x3c; 4096];
            a.write(at, &block).unwrap();
            image[at as usize..at as usize + 4096].copy_from_slice(&block);
        }
        wait_until(&what, || !a.resync_owed());
        let ended = a
            .event_log()
            .iter()
            .any(|(_, e)| matches!(e, ArrayEvent::ResyncFinished { regions } if *regions > 0));
        assert!(ended, "{what}: its end is an event");
        assert_matches(&a, &image);
        assert_consistent(&a, &m.refs());
        a.close().unwrap();
        // Run to its end: the stop was clean, and the next start has
        // nothing to resync.
        let again = Array::assemble(m.refs()).unwrap();
        let unclean = again
            .array
            .event_log()
            .iter()
            .any(|(_, e)| matches!(e, ArrayEvent::UncleanStop { .. }));
        assert!(!unclean, "{what}: stopped cleanly once the resync ended");
        assert_matches(&again.array, &image);
    }
}

#[test]
fn a_stop_during_a_background_resync_leaves_it_owed_to_the_next_start() {
    let m = Members::ram(4, 4 << 20, "bg-resync-stop");
    let (image, g, base) = crashed(&m, Level::Raid5);
    tear(&m, &g, base);
    // Slow drives: the resync is still running when the stop comes.
    for f in &m.faulty {
        f.set_faults(Faults {
            latency: Duration::from_millis(2),
            ..Default::default()
        });
    }
    let a = started_owing(m.refs());
    a.kick_resync();
    // (The regions are counted at the assembly: a region done says the
    // pass runs.)
    wait_until("the resync's first region", || {
        a.resync_progress().is_some_and(|p| p.regions_done > 0)
    });
    let p = a.resync_progress().expect("running");
    assert!(p.regions_done < p.regions_total, "{p:?}");
    a.close().unwrap();
    assert!(a.resync_owed(), "stopped before its end");
    for f in &m.faulty {
        f.heal();
    }
    // Not marked clean: the next start resyncs again, and the torn
    // stripes the first pass had not reached agree after it.
    let again = Array::assemble(m.refs()).unwrap();
    let resynced = again.array.event_log().iter().any(|(_, e)| {
        matches!(e, ArrayEvent::UncleanStop { regions, background: false, .. } if *regions > 0)
    });
    assert!(resynced, "the next start resynced");
    assert_matches(&again.array, &image);
    assert_consistent(&again.array, &m.refs());
}

/// Where `tear` tears, as offsets into the array: a block of each torn
/// stripe's first data chunk (of each torn mirror chunk).
fn torn_blocks(g: &raid_core::layout::Geometry) -> Vec<u64> {
    let rows = match g.level {
        Level::Raid5 | Level::Raid6 => g.rows(),
        _ => g.capacity() / g.chunk,
    };
    let width = g.capacity() / rows;
    [5, 17, rows - 1].iter().map(|r| r * width).collect()
}

/// A resync run a few steps at a time (as a stop and a rebuild's end
/// leave it) goes on where it stopped: every step resyncs rows no pass
/// has reached. Writes land in torn stripes and copies before it reaches
/// them, and on both sides of its position between its steps; every
/// block reads as written after a member fails at the end.
#[test]
fn a_resync_run_in_steps_goes_on_where_it_stopped() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid10, 4)] {
        let what = format!("{level}");
        let m = Members::ram(n, 4 << 20, &format!("bg-resync-steps{level}"));
        let (mut image, g, base) = crashed(&m, level);
        tear(&m, &g, base);
        let a = started_owing(m.refs());
        let mut write = |a: &Array, at: u64, v: u8| {
            let block = vec![v; 4096];
            a.write(at, &block).unwrap();
            image[at as usize..at as usize + 4096].copy_from_slice(&block);
        };
        for (i, at) in torn_blocks(&g).into_iter().enumerate() {
            write(&a, at + 8192, 0xd0 + i as u8);
        }
        // One row (a mirror's chunk) more than the steps a pass can take.
        let bound = g.rows() * n as u64 + 1;
        let mut calls = 0u64;
        let mut done = 0;
        while a.run_resync_steps(1).unwrap() {
            calls += 1;
            assert!(
                calls < bound,
                "{what}: {calls} steps and still owed: each call starts over"
            );
            let now = a.resync_progress().expect("runnable").regions_done;
            assert!(now >= done, "{what}: regions done went back");
            done = now;
            // Behind the position and ahead of it.
            let moving = (calls * 3 * CHUNK) % (a.capacity() - 4096);
            write(&a, moving, calls as u8);
            write(&a, a.capacity() - moving - 4096, calls as u8 ^ 0x80);
        }
        assert!(calls > 1, "{what}: a pass of one step tests nothing here");
        assert_matches(&a, &image);
        assert_consistent(&a, &m.refs());
        a.fail_slot(0, "test: a drive fails once the resync ended");
        assert_matches(&a, &image);
    }
}

/// A parity array whose member fails midway through its resync owes the
/// rest until the rebuild's end, which goes on from where the pass
/// stopped: the stripes before it, torn by the crash and resynced, and
/// written since (degraded too), stay right through the rebuild, the
/// resync's end and another member's failure.
#[test]
fn a_resync_a_failure_stopped_goes_on_after_the_rebuild() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let what = format!("{level}");
        let m = Members::ram(n, 4 << 20, &format!("bg-resync-hole{level}"));
        let (mut image, g, base) = crashed(&m, level);
        // Torn where the first steps pass: a failure before the resync
        // reaches a torn stripe is the write hole it leaves open.
        for s in [0, 5, 17] {
            let p = g.stripe_map(s).members[g.data_chunks()];
            m.corrupt(p, base + s * g.chunk + 1000);
        }
        let a = started_owing(m.refs());
        assert!(a.run_resync_steps(2).unwrap(), "{what}: still owed");
        a.fail_slot(1, "test: a drive fails midway through the resync");
        assert!(
            a.resync_progress().is_none() && a.run_resync_steps(usize::MAX).unwrap(),
            "{what}: owed, and not run while degraded"
        );
        let stripe_bytes = g.data_chunks() as u64 * g.chunk;
        for (i, s) in [3u64, 17, 40, g.rows() - 2].into_iter().enumerate() {
            let at = s * stripe_bytes + 4096;
            let block = vec![0x90 + i as u8; 4096];
            a.write(at, &block).unwrap();
            image[at as usize..at as usize + 4096].copy_from_slice(&block);
        }
        let new: MemberRef = Arc::new(raid_core::member::RamMember::new(
            format!("ram:bg-resync-hole{level}-new"),
            raid_core::metadata::MIN_DATA_OFFSET + (4 << 20),
        ));
        a.replace(1, new.clone()).unwrap();
        a.rebuild_all(&Default::default(), &AtomicBool::new(false))
            .unwrap();
        assert!(!a.resync_owed(), "{what}: the rebuild's end ran the rest");
        let mut refs = m.refs();
        refs[1] = new;
        assert_matches(&a, &image);
        assert_consistent(&a, &refs);
        a.fail_slot(2, "test: another drive fails");
        assert_matches(&a, &image);
    }
}

/// Where a crash left a mirror's copies different, reads while the resync
/// is owed return the first copy, the one the resync keeps, through both
/// read paths (a read within one chunk, and one across chunks); they would
/// otherwise return the other copy, which the resync then overwrites.
#[test]
fn a_mirror_read_while_a_resync_is_owed_returns_the_copy_it_keeps() {
    for level in [Level::Raid1, Level::Raid10] {
        let m = Members::ram(4, 4 << 20, &format!("bg-resync-read{level}"));
        let (image, g, base) = crashed(&m, level);
        // Every second copy of chunks 0..8 holds other bytes.
        for c in 0..8 {
            let p = g.chunk_copies(c)[1];
            m.faulty[p.member]
                .write_at(&vec![0xee; CHUNK as usize], base + p.offset)
                .unwrap();
        }
        let a = started_owing(m.refs());
        let want = &image[..8 * CHUNK as usize];
        for round in 0..8 {
            for c in 0..8u64 {
                let mut b = vec![0u8; 4096];
                a.read(c * CHUNK + 4096, &mut b).unwrap();
                let at = (c * CHUNK + 4096) as usize;
                assert!(
                    b[..] == want[at..at + 4096],
                    "{level}: chunk {c}, round {round}"
                );
            }
            let mut all = vec![0u8; want.len()];
            a.read(0, &mut all).unwrap();
            assert!(all == want, "{level}: chunks 0-7 at once, round {round}");
        }
        a.kick_resync();
        resynced_to(&a, &m, &image, "the resync");
    }
}

/// A write into a stripe the crash tore, before the resync reaches it, is
/// a reconstruct-write: a read-modify-write would carry the parity's error
/// into the new parity, and a member failing next would then be rebuilt
/// wrong from it, the write's own data included (the acknowledged write
/// reading back wrong).
#[test]
fn a_write_into_a_torn_stripe_before_the_resync_reaches_it_reads_back_after_a_failure() {
    for level in [Level::Raid5, Level::Raid6] {
        // Five data chunks: a 4 KiB write reads less by read-modify-write.
        let n = if level == Level::Raid5 { 6 } else { 7 };
        let m = Members::ram(n, 4 << 20, &format!("bg-resync-rmw{level}"));
        let (mut image, g, base) = crashed(&m, level);
        // Stripe 3's parity torn where the write below lands.
        let (s, nd) = (3u64, g.data_chunks() as u64);
        let map = g.stripe_map(s);
        m.corrupt(map.members[nd as usize], base + s * CHUNK + 1000);
        let a = started_owing(m.refs());
        // 4 KiB into its second data chunk: a read-modify-write by cost.
        let at = (s * nd + 1) * CHUNK;
        let block = vec![0x77u8; 4096];
        a.write(at, &block).unwrap();
        image[at as usize..at as usize + 4096].copy_from_slice(&block);
        // That chunk's member fails before any resync: its data is now
        // rebuilt from the parity.
        a.fail_slot(map.members[1], "test: the written chunk's drive fails");
        let mut got = vec![0u8; 4096];
        a.read(at, &mut got).unwrap();
        assert!(
            got == block,
            "{level}: the acknowledged write reads back wrong once degraded"
        );
        assert_matches(&a, &image);
    }
}

/// The resync while served keeps the rebuild's rate limit (`raidctl rate
/// --rebuild`), read at every step as a rebuild reads it: at 64 KiB/s per
/// member its first step of 256 KiB alone takes four seconds; lifted, it
/// runs to its end.
#[test]
fn a_background_resync_keeps_the_rebuild_rate_limit() {
    let m = Members::ram(4, 4 << 20, "bg-resync-rate");
    let (image, g, base) = crashed(&m, Level::Raid5);
    tear(&m, &g, base);
    let a = started_owing(m.refs());
    a.set_rates(Some(64 << 10), None);
    a.kick_resync();
    std::thread::sleep(Duration::from_millis(300));
    let p = a.resync_progress().expect("still running at 64 KiB/s");
    assert!(p.regions_done < p.regions_total, "{p:?}");
    a.set_rates(Some(0), None);
    resynced_to(&a, &m, &image, "the resync, its limit lifted");
}

/// A mirror chunk a crash left with copies that differ reads the same
/// after the member of the copy it was read from fails, before the resync
/// has come: the read made the copies agree first. (A read that only
/// returned the first copy would leave the others as they were, and the
/// block would then read as the other copy: the write in flight at the
/// crash, seen and then gone.)
#[test]
fn a_torn_mirror_chunk_read_before_the_resync_reads_the_same_after_a_failure() {
    for level in [Level::Raid1, Level::Raid10] {
        let m = Members::ram(4, 4 << 20, &format!("bg-resync-revert{level}"));
        let (_, g, base) = crashed(&m, level);
        // Chunk 2's first copy took a write in flight at the crash, its
        // other copies did not.
        let c = 2u64;
        let first = g.chunk_copies(c)[0];
        m.faulty[first.member]
            .write_at(&vec![0xab; CHUNK as usize], base + first.offset)
            .unwrap();
        let a = started_owing(m.refs());
        let mut seen = vec![0u8; 4096];
        a.read(c * CHUNK, &mut seen).unwrap();
        assert!(
            seen.iter().all(|&b| b == 0xab),
            "{level}: the first copy is read"
        );
        a.fail_slot(first.member, "test: the drive of the copy read fails");
        let mut again = vec![0u8; 4096];
        a.read(c * CHUNK, &mut again).unwrap();
        assert!(
            again == seen,
            "{level}: the block reads as another copy after the failure"
        );
    }
}

/// A RAID10 that lost a whole pair while its resync was owed has failed,
/// and its resync can no longer run; a chunk of a pair still whole reads
/// as it always did (not refused as the resync before the read would be).
#[test]
fn a_failed_raid10_owing_its_resync_still_reads_what_its_pairs_hold() {
    let m = Members::ram(4, 4 << 20, "bg-resync-failed");
    let (image, _, _) = crashed(&m, Level::Raid10);
    let a = started_owing(m.refs());
    a.fail_slot(0, "test: a pair's first drive fails");
    a.fail_slot(1, "test: and its second");
    assert_eq!(a.state(), raid_core::array::ArrayState::Failed);
    // Chunk 1 lies on slots 2 and 3.
    let mut got = vec![0u8; CHUNK as usize];
    a.read(CHUNK, &mut got).unwrap();
    assert!(got[..] == image[CHUNK as usize..2 * CHUNK as usize]);
}

/// Reads through the engine while a mirror's resync is owed: RAM members
/// (the shards serve them) and files on tmpfs (copied in the caller's
/// thread). Every copy of a chunk the crash may have torn is read and
/// compared: copies that agree are the answer, served there; copies that
/// differ go to the blocking path, which writes the kept copy over the
/// others first. Either way the block reads the same after the kept copy's
/// member fails.
#[test]
fn engine_reads_while_a_mirror_resync_is_owed_compare_the_copies() {
    // Three copies; two; two over an odd number of members.
    for (level, n) in [(Level::Raid1, 3), (Level::Raid10, 4), (Level::Raid10, 5)] {
        let tag = format!("bg-engine-{level}-{n}");
        let m = Members::ram(n, 4 << 20, &tag);
        engine_reads_compare(level, m.refs(), &format!("{level} of {n} RAM members"));
        if let Some(dir) = support::array::memory_dir(&tag) {
            std::fs::create_dir_all(&dir).unwrap();
            let files = support::array::files(&dir, n, 4 << 20);
            engine_reads_compare(level, files, &format!("{level} of {n} tmpfs files"));
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// A copy whose read errs while the copies are compared fails its member,
/// as any read error does, and the read is served from the others, on the
/// shards and through `Array::read` alike.
#[test]
fn a_copy_that_errs_while_the_copies_are_compared_is_failed() {
    for through_engine in [true, false] {
        let m = Members::ram(4, 4 << 20, &format!("bg-compare-err{through_engine}"));
        let (image, g, base) = crashed(&m, Level::Raid10);
        let a = started_owing(m.refs());
        let c = 5u64;
        let second = g.chunk_copies(c)[1];
        let at = base + second.offset;
        m.faulty[second.member].set_faults(Faults {
            fail_read_ranges: vec![(at, at + CHUNK)],
            ..Default::default()
        });
        let off = c * CHUNK;
        let got = match through_engine {
            true => {
                let e = raid_core::shard::Engine::start(a.clone(), 2).unwrap();
                let (tx, rx) = std::sync::mpsc::channel();
                e.read(
                    off,
                    raid_core::buf::AlignedBuf::new(4096),
                    Box::new(move |r| tx.send(r).unwrap()),
                );
                rx.recv_timeout(Duration::from_secs(30))
                    .unwrap()
                    .unwrap()
                    .to_vec()
            }
            false => {
                let mut b = vec![0u8; 4096];
                a.read(off, &mut b).unwrap();
                b
            }
        };
        assert!(
            got[..] == image[off as usize..off as usize + 4096],
            "through the engine: {through_engine}: the read is served from the other copy"
        );
        let state = a.slots()[second.member].state;
        assert_eq!(
            state,
            raid_core::metadata::SlotState::Failed,
            "through the engine: {through_engine}: the member whose read erred is failed"
        );
    }
}

fn engine_reads_compare(level: Level, members: Vec<MemberRef>, what: &str) {
    use raid_core::buf::AlignedBuf;
    let a = support::array::create_shared(level, members.clone(), "t", CHUNK);
    let image = support::array::fill_whole(&a);
    let (g, base) = (a.geometry(), a.data_offset());
    drop(a);
    // Chunks 0-3: the second copy never took the crash's writes.
    let torn = 0..4u64;
    for c in torn.clone() {
        let p = g.chunk_copies(c)[1];
        members[p.member]
            .write_at(&vec![0xee; CHUNK as usize], base + p.offset)
            .unwrap();
    }
    let a = started_owing(members.clone());
    let e = raid_core::shard::Engine::start(a.clone(), 2).unwrap();
    let read = |c: u64| {
        let (tx, rx) = std::sync::mpsc::channel();
        let at = c * CHUNK + 4096;
        e.read(
            at,
            AlignedBuf::new(4096),
            Box::new(move |r| tx.send(r).unwrap()),
        );
        let got = rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
        assert!(
            got[..] == image[at as usize..at as usize + 4096],
            "{what}: chunk {c} reads as the copy the resync keeps"
        );
    };
    for c in 0..8 {
        read(c);
    }
    let blocking = e
        .counts()
        .blocking
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        blocking, 4,
        "{what}: only the reads whose copies differ go to the blocking path"
    );
    for c in torn {
        for p in g.chunk_copies(c) {
            let mut got = vec![0u8; CHUNK as usize];
            members[p.member]
                .read_at(&mut got, base + p.offset)
                .unwrap();
            let at = (c * CHUNK) as usize;
            assert!(
                got[..] == image[at..at + CHUNK as usize],
                "{what}: chunk {c}'s copy on slot {} agrees once read",
                p.member
            );
        }
    }
    a.fail_slot(
        g.chunk_copies(0)[0].member,
        "test: the kept copy's drive fails",
    );
    for c in 0..8 {
        read(c);
    }
    drop(e);
    a.close().unwrap();
}
