//! Power cuts at random points (fixed seeds): every member loses the writes
//! it had not flushed, at whatever moment its own cache last drained. The
//! next start must recover on its own: every block written before the last
//! completed flush reads back intact, every other block holds one of the
//! values it had since, and redundancy agrees with the data everywhere.

mod support;

use raid_core::array::Array;
use raid_core::layout::Level;
use raid_core::member::Member;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::array::{create, written_whole, Members};
use support::power_cut::{rebuild_and_scrub, CutModel};

const BLOCK: usize = 4096;
const CHUNK: u64 = 4096;
const ROWS: u64 = 64;

fn cut_points() -> u64 {
    if std::env::var("RAID_SOAK").is_ok_and(|v| v == "1") {
        1000
    } else {
        100
    }
}

/// One run: random writes and flushes, a cut at a random point, recovery,
/// verification. With `degraded`, a member has failed before the writes
/// (the write hole's ground), and after recovery the array is rebuilt and
/// scrubbed.
fn run(level: Level, n: usize, seed: u64) {
    run_with(level, n, seed, false)
}

fn run_with(level: Level, n: usize, seed: u64, degraded: bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    let m = Members::ram(n, ROWS * CHUNK, &format!("cut{seed}-"));
    let a = create(level, &m, CHUNK);
    let initial: Vec<u8> = (0..a.capacity() as usize)
        .map(|i| ((i as u64 * 2654435761) >> 13) as u8)
        .collect();
    a.write(0, &initial).unwrap();
    a.flush().unwrap();
    if degraded {
        a.fail_slot(1, "test");
    }
    let blocks = (a.capacity() as usize) / BLOCK;
    let mut model = CutModel::new(initial.clone(), BLOCK);
    for f in &m.faulty {
        f.track_power_cut();
    }
    let ops = rng.gen_range(5..60);
    for _ in 0..ops {
        match rng.gen_range(0..100) {
            0..=69 => {
                let nb = rng.gen_range(1..=6).min(blocks);
                let b0 = rng.gen_range(0..=blocks - nb);
                let mut data = vec![0u8; nb * BLOCK];
                rng.fill(&mut data[..]);
                a.write((b0 * BLOCK) as u64, &data).unwrap();
                model.wrote(b0, &data);
            }
            70..=84 => {
                a.flush().unwrap();
                model.flushed();
            }
            _ => {
                // One drive drains its cache on its own.
                let i = rng.gen_range(0..n);
                m.faulty[i].flush().unwrap();
            }
        }
    }
    for f in &m.faulty {
        f.power_cut().unwrap();
    }
    drop(a);
    for f in &m.faulty {
        f.power_on();
    }
    let asm = Array::assemble(m.refs())
        .unwrap_or_else(|e| panic!("{level} seed {seed}: no recovery: {e}"));
    let a = asm.array;
    let mut got = vec![0u8; a.capacity() as usize];
    a.read(0, &mut got).unwrap();
    let what = format!("{level} seed {seed}");
    model.check(&got, &what);
    // With `degraded`, the member failed before the writes is rebuilt.
    let new = |_| -> raid_core::member::MemberRef {
        std::sync::Arc::new(raid_core::member::RamMember::new(
            format!("ram:cut{seed}-new"),
            raid_core::metadata::MIN_DATA_OFFSET + ROWS * CHUNK,
        ))
    };
    rebuild_and_scrub(&a, &got, new, &what);
}

#[test]
fn power_cuts_raid1() {
    (0..cut_points()).for_each(|s| run(Level::Raid1, 2, 1_000 + s));
}

#[test]
fn power_cuts_raid5() {
    (0..cut_points()).for_each(|s| run(Level::Raid5, 4, 2_000 + s));
}

#[test]
fn power_cuts_raid6() {
    (0..cut_points()).for_each(|s| run(Level::Raid6, 5, 3_000 + s));
}

#[test]
fn power_cuts_raid10() {
    (0..cut_points()).for_each(|s| run(Level::Raid10, 3, 4_000 + s));
}

#[test]
fn power_cuts_raid0() {
    (0..cut_points()).for_each(|s| run(Level::Raid0, 3, 5_000 + s));
}

/// The write hole: a crash while degraded must not turn untouched blocks
/// (including those of the failed member, which exist only as parity) into
/// wrong data.
#[test]
fn power_cuts_while_degraded_raid5() {
    (0..cut_points()).for_each(|s| run_with(Level::Raid5, 4, 6_000 + s, true));
}

#[test]
fn power_cuts_while_degraded_raid6() {
    (0..cut_points()).for_each(|s| run_with(Level::Raid6, 5, 7_000 + s, true));
}

/// Journal records an earlier array left on its members (degraded writes,
/// then a crash) are never replayed into a new array created over the same
/// members, however cleanly the new one was used.
#[test]
fn an_earlier_arrays_journal_is_never_replayed() {
    let m = Members::ram(4, ROWS * CHUNK, "stalejournal-");
    let a = create(Level::Raid5, &m, CHUNK);
    let cap = a.capacity() as usize;
    a.write(0, &vec![0x11; cap]).unwrap();
    a.flush().unwrap();
    a.fail_slot(3, "test");
    // Journaled (a member is missing); then a crash: no settle, no close.
    a.write(0, &vec![0xEE; 8 * BLOCK]).unwrap();
    drop(a);
    // The operator creates a new array over the same members.
    let b = create(Level::Raid5, &m, CHUNK);
    b.write(0, &vec![0x22; cap]).unwrap();
    b.flush().unwrap();
    b.close().unwrap();
    drop(b);
    let b = Array::assemble(m.refs()).unwrap().array;
    let mut got = vec![0u8; cap];
    b.read(0, &mut got).unwrap();
    let wrong = got
        .chunks(BLOCK)
        .filter(|c| c.iter().any(|&x| x != 0x22))
        .count();
    assert_eq!(
        wrong, 0,
        "{wrong} blocks of the new array were overwritten by the old array's journal"
    );
}

/// A member that can hold its next data-area write until released: to stop
/// a writer in the middle of a stripe write.
struct Gate {
    inner: raid_core::member::MemberRef,
    armed: std::sync::atomic::AtomicBool,
    entered: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    release: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Member for Gate {
    support::pass_through_to_inner!();
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if offset >= raid_core::metadata::MIN_DATA_OFFSET
            && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            if let Some(tx) = self.entered.lock().unwrap().take() {
                tx.send(()).unwrap();
            }
            if let Some(rx) = self.release.lock().unwrap().take() {
                rx.recv().unwrap();
            }
        }
        self.inner.write_at(buf, offset)
    }
}

/// A member failed (by the operator) while a stripe write planned with it
/// is in flight, then a crash before the next flush: that write carried no
/// journal record, so the failure must not become durable before it has
/// finished and is flushed, or the degraded start reconstructs the failed
/// member's chunk from a torn stripe.
#[test]
fn a_failure_waits_for_the_writes_planned_before_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    let m = Members::ram(3, ROWS * CHUNK, "failrace-");
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let gate = Arc::new(Gate {
        inner: m.faulty[0].clone(),
        armed: AtomicBool::new(false),
        entered: std::sync::Mutex::new(Some(entered_tx)),
        release: std::sync::Mutex::new(Some(release_rx)),
    });
    let refs: Vec<raid_core::member::MemberRef> =
        vec![gate.clone(), m.faulty[1].clone(), m.faulty[2].clone()];
    let a = Arc::new(
        Array::create(
            refs.clone(),
            vec![],
            raid_core::array::CreateOptions {
                name: "t".into(),
                level: Level::Raid5,
                chunk: CHUNK,
                data_offset: None,
            },
        )
        .unwrap(),
    );
    let cap = a.capacity() as usize;
    let before: Vec<u8> = (0..cap).map(|i| (i * 7 % 251) as u8).collect();
    a.write(0, &before).unwrap();
    a.flush().unwrap();
    for f in &m.faulty {
        f.track_power_cut();
    }
    // Stripe 0: data chunks on members 0 and 1, P on member 2 (left-symmetric).
    let map = a.geometry().stripe_map(0);
    assert_eq!(map.members[..], [0, 1, 2], "the test assumes this layout");
    gate.armed.store(true, Ordering::SeqCst);
    let writer = {
        let a = a.clone();
        std::thread::spawn(move || a.write(0, &[0xEE; BLOCK]).unwrap())
    };
    entered_rx.recv().unwrap();
    // The writer is in the middle of stripe 0; the operator fails member 1.
    let failer = {
        let a = a.clone();
        std::thread::spawn(move || a.fail_member(1, false).unwrap())
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let failed_early = failer.is_finished();
    release_tx.send(()).unwrap();
    writer.join().unwrap();
    failer.join().unwrap();
    assert!(
        !failed_early,
        "the failure was made durable while a write planned before it was in flight"
    );
    // Member 2's cache drains (P is durable); then the power goes, and
    // member 0 loses whatever it still had unflushed.
    m.faulty[2].flush().unwrap();
    for f in &m.faulty {
        f.power_cut().unwrap();
    }
    drop(a);
    for f in &m.faulty {
        f.power_on();
    }
    let b = Array::assemble(refs).unwrap().array;
    let mut got = vec![0u8; cap];
    b.read(0, &mut got).unwrap();
    let mut want = before.clone();
    want[..BLOCK].copy_from_slice(&[0xEE; BLOCK]);
    // Member 1's chunk of stripe 0 is reconstructed from member 0 and P.
    let chunk = CHUNK as usize;
    assert!(
        got[chunk..2 * chunk] == want[chunk..2 * chunk],
        "the failed member's chunk reads back wrong after the crash"
    );
    assert!(got[..BLOCK] == want[..BLOCK] || got[..BLOCK] == before[..BLOCK]);
}

/// A crash can leave a mirror's copies different (a write that reached one
/// member and not the other). The next start makes every copy of each
/// chunk in a marked region equal to the first readable one, a step of
/// chunks at a time: copies differing at the first, a middle and the last
/// chunk of a step, and in the next step, are all made equal, with a
/// member missing too.
#[test]
fn a_start_after_a_crash_makes_every_mirror_copy_equal_across_its_steps() {
    // 16 KiB chunks: a resync step of 256 KiB per member is 16 chunks of
    // a RAID1 row, 32 of a RAID10 of 4 (a row holds two chunks).
    let chunk = 16 * 1024;
    for (level, n, missing) in [
        (Level::Raid10, 4, None),
        (Level::Raid10, 3, None),
        (Level::Raid10, 4, Some(1)),
        (Level::Raid1, 3, None),
        (Level::Raid1, 3, Some(0)),
    ] {
        let what = format!("{level} of {n}, missing {missing:?}");
        let m = Members::ram(n, 4 << 20, &format!("mirror-resync{level}{n}{missing:?}"));
        let (a, image) = written_whole(level, &m, chunk);
        let (g, base) = (a.geometry(), a.data_offset());
        assert!(
            a.bitmap_dirty_regions() > 0,
            "{what}: the writes' regions linger marked"
        );
        drop(a); // a crash: no orderly stop
                 // Copies made to differ, behind the array's back, as a torn
                 // mirror write leaves them: never the first copy still present.
        let torn = [0u64, 1, 7, 15, 16, 31, 32, 33, 100];
        let present = |p: &raid_core::layout::Place| Some(p.member) != missing;
        for &c in &torn {
            for (k, p) in g
                .chunk_copies(c)
                .iter()
                .filter(|p| present(p))
                .enumerate()
                .skip(1)
            {
                m.corrupt(
                    p.member,
                    base + p.offset + (k as u64 * 4099 + c * 13) % chunk,
                );
            }
        }
        let mut refs = m.refs();
        if let Some(gone) = missing {
            refs.remove(gone);
        }
        let asm = Array::assemble(refs).unwrap();
        let resynced = asm.array.event_log().iter().any(|(_, e)| {
            matches!(e, raid_core::array::ArrayEvent::UncleanStop { regions, .. } if *regions > 0)
        });
        assert!(resynced, "{what}: the start resynced");
        let read = |member: usize, offset: u64| {
            let mut b = vec![0u8; chunk as usize];
            m.faulty[member].read_at(&mut b, base + offset).unwrap();
            b
        };
        for c in 0..g.capacity() / chunk {
            let copies: Vec<Vec<u8>> = g
                .chunk_copies(c)
                .iter()
                .filter(|p| present(p))
                .map(|p| read(p.member, p.offset))
                .collect();
            let want = &image[(c * chunk) as usize..((c + 1) * chunk) as usize];
            for (k, copy) in copies.iter().enumerate() {
                assert!(
                    copy == want,
                    "{what}: chunk {c}, copy {k} differs from what was written"
                );
            }
        }
        support::array::assert_matches(&asm.array, &image);
        asm.array.close().unwrap();
    }
}

/// On a RAID10 of three members a member is written for one chunk and
/// holds the first copy of another (chunk 0: slots 0 then 1; chunk 2:
/// slots 1 then 2). Where the resync's write to slot 1 fails, slot 1 is
/// failed and nothing read from it is written anywhere: chunk 2 is left to
/// its copy on slot 2, which holds what was written, even though slot 1's
/// copy of it differed and was read in the same step.
#[test]
fn a_member_whose_resync_write_fails_is_never_the_copy_written_over_another() {
    let chunk = 16 * 1024;
    let m = Members::ram(3, 4 << 20, "mirror-resync-odd");
    let (a, image) = written_whole(Level::Raid10, &m, chunk);
    let (g, base) = (a.geometry(), a.data_offset());
    drop(a); // a crash
    let at = |c: u64| -> Vec<(usize, u64)> {
        g.chunk_copies(c)
            .iter()
            .map(|p| (p.member, p.offset))
            .collect()
    };
    assert_eq!(
        at(0),
        [(0, 0), (1, 0)],
        "the layout this test is written for"
    );
    assert_eq!(
        at(2),
        [(1, chunk), (2, chunk)],
        "the layout this test is written for"
    );
    m.corrupt(1, base + 100); // chunk 0's second copy: the resync writes it
    m.corrupt(1, base + chunk + 100); // chunk 2's first copy
    m.faulty[1].set_faults(raid_core::member::Faults {
        fail_write_ranges: vec![(base, base + chunk)],
        ..Default::default()
    });
    let asm = Array::assemble(m.refs()).unwrap();
    let slots = asm.array.slots();
    assert_eq!(
        slots[1].state,
        raid_core::metadata::SlotState::Failed,
        "the member whose write failed is failed"
    );
    let mut copy = vec![0u8; chunk as usize];
    m.faulty[2].read_at(&mut copy, base + chunk).unwrap();
    assert!(
        copy[..] == image[2 * chunk as usize..3 * chunk as usize],
        "chunk 2's one copy left holds what was written"
    );
    support::array::assert_matches(&asm.array, &image);
}
