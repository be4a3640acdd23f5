//! The array under member faults, bad input and awkward assemblies.

mod support;

use raid_core::array::{
    Array, ArrayError, ArrayEvent, ArrayState, CreateOptions, RebuildEnd, RebuildOptions,
    RefusalKind,
};
use raid_core::layout::Level;
use raid_core::member::{Faults, Member, MemberRef, RamMember};
use raid_core::metadata::{SlotState, MIN_DATA_OFFSET, SB_OFFSETS};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use support::array::{assert_consistent, assert_matches, create, Members};

const DATA: u64 = 64 * 16384;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn filled(level: Level, n: usize, tag: &str) -> (Members, Array, Vec<u8>) {
    let m = Members::ram(n, DATA, tag);
    let a = create(level, &m, 16384);
    let img = pattern(a.capacity() as usize, 7);
    a.write(0, &img).unwrap();
    (m, a, img)
}

#[test]
fn read_errors_are_served_from_redundancy_and_fail_the_member() {
    for &(level, n) in &[
        (Level::Raid1, 2),
        (Level::Raid5, 4),
        (Level::Raid6, 5),
        (Level::Raid10, 4),
    ] {
        let (m, a, img) = filled(level, n, &format!("re-{level}"));
        m.faulty[1].set_faults(Faults {
            fail_ranges: vec![(MIN_DATA_OFFSET, MIN_DATA_OFFSET + DATA)],
            ..Default::default()
        });
        assert_matches(&a, &img);
        assert_eq!(a.slots()[1].state, SlotState::Failed, "{level}");
        assert_eq!(a.state(), ArrayState::Degraded);
        assert!(a
            .event_log()
            .iter()
            .any(|(_, e)| matches!(e, ArrayEvent::MemberFailed { slot: 1, .. })));
        // The other members recorded the failure with a newer event counter.
        let sb = raid_core::metadata::read_superblock(m.faulty[0].as_ref()).unwrap();
        assert_eq!(sb.slots[1].state, SlotState::Failed);
        assert_eq!(sb.events, a.events());
    }
}

#[test]
fn write_errors_mid_request_keep_the_write() {
    for &(level, n) in &[
        (Level::Raid1, 3),
        (Level::Raid5, 5),
        (Level::Raid6, 6),
        (Level::Raid10, 4),
    ] {
        let (m, a, mut img) = filled(level, n, &format!("we-{level}"));
        // Member 2 dies after a few more I/Os, in the middle of this write.
        m.faulty[2].set_faults(Faults {
            fail_after: Some(3),
            ..Default::default()
        });
        let data = pattern(512 * 1024, 99);
        a.write(40960, &data).unwrap();
        img[40960..40960 + data.len()].copy_from_slice(&data);
        assert_eq!(a.slots()[2].state, SlotState::Failed, "{level}");
        assert_matches(&a, &img);
    }
}

#[test]
fn beyond_redundancy_is_an_error_never_wrong_data() {
    let (m, a, _) = filled(Level::Raid5, 4, "beyond");
    m.faulty[0].fail_all();
    m.faulty[3].fail_all();
    let mut buf = vec![0u8; 65536 * 3];
    let r = a.read(0, &mut buf);
    assert!(matches!(r, Err(ArrayError::Failed { .. })), "{r:?}");
    assert!(a.write(0, &buf).is_err());
    assert_eq!(a.state(), ArrayState::Failed);
    let msg = a.write(0, &buf).unwrap_err().to_string();
    assert!(msg.contains("has failed") && msg.contains("raid5"), "{msg}");

    // RAID0: any member lost is the array lost.
    let (m, a, _) = filled(Level::Raid0, 3, "beyond0");
    m.faulty[1].fail_all();
    assert!(a.read(0, &mut vec![0u8; 3 * 16384]).is_err());
}

#[test]
fn bad_requests_are_refused_and_change_nothing() {
    let (_m, a, img) = filled(Level::Raid6, 5, "bad");
    let cap = a.capacity();
    assert!(matches!(
        a.write(100, &[0u8; 4096]),
        Err(ArrayError::Unaligned { .. })
    ));
    assert!(matches!(
        a.write(4096, &[0u8; 100]),
        Err(ArrayError::Unaligned { .. })
    ));
    assert!(matches!(
        a.write(cap, &[0u8; 4096]),
        Err(ArrayError::OutOfRange { .. })
    ));
    assert!(matches!(
        a.write(cap - 4096, &[0u8; 8192]),
        Err(ArrayError::OutOfRange { .. })
    ));
    assert!(matches!(
        a.read(u64::MAX - 4095, &mut [0u8; 4096]),
        Err(ArrayError::OutOfRange { .. })
    ));
    assert!(matches!(
        a.write_zeroes(cap, 4096),
        Err(ArrayError::OutOfRange { .. })
    ));
    assert_matches(&a, &img);
}

#[test]
fn create_refuses_bad_shapes() {
    let m = Members::ram(3, DATA, "cr");
    let e = Array::create(
        m.refs(),
        vec![],
        CreateOptions {
            name: "x".into(),
            level: Level::Raid6,
            chunk: 65536,
            data_offset: None,
        },
    );
    assert!(
        e.as_ref()
            .err()
            .unwrap()
            .to_string()
            .contains("raid6 needs at least 4 members, 3 given"),
        "{:?}",
        e.err()
    );
    let mut dup = m.refs();
    dup.push(dup[0].clone());
    let e = Array::create(
        dup,
        vec![],
        CreateOptions {
            name: "x".into(),
            level: Level::Raid5,
            chunk: 65536,
            data_offset: None,
        },
    );
    assert!(e.err().unwrap().to_string().contains("listed twice"));
    let tiny: Vec<MemberRef> = (0..3)
        .map(|i| Arc::new(RamMember::new(format!("t{i}"), MIN_DATA_OFFSET + 4096)) as MemberRef)
        .collect();
    let e = Array::create(
        tiny,
        vec![],
        CreateOptions {
            name: "x".into(),
            level: Level::Raid5,
            chunk: 65536,
            data_offset: None,
        },
    );
    assert!(e.err().unwrap().to_string().contains("too small"));
    let e = Array::create(
        m.refs(),
        vec![],
        CreateOptions {
            name: "x".into(),
            level: Level::Raid5,
            chunk: 3000,
            data_offset: None,
        },
    );
    assert!(e.err().unwrap().to_string().contains("power of two"));
}

#[test]
fn members_of_different_sizes_use_the_smallest() {
    let sizes = [DATA, DATA * 2, DATA + 65536];
    let ms: Vec<MemberRef> = sizes
        .iter()
        .enumerate()
        .map(|(i, s)| Arc::new(RamMember::new(format!("sz{i}"), MIN_DATA_OFFSET + s)) as MemberRef)
        .collect();
    let a = Array::create(
        ms,
        vec![],
        CreateOptions {
            name: "x".into(),
            level: Level::Raid5,
            chunk: 65536,
            data_offset: None,
        },
    )
    .unwrap();
    assert_eq!(a.capacity(), 2 * DATA);
}

#[test]
fn assembly_trusts_the_newest_metadata_and_refuses_stale_members() {
    let (m, a, img) = filled(Level::Raid5, 4, "stale");
    a.fail_slot(2, "test");
    // Writes continue degraded: member 2 no longer has them.
    let newer = pattern(65536, 3);
    a.write(0, &newer).unwrap();
    a.close().unwrap();
    drop(a);
    // Member 2 "comes back" with its old metadata.
    let asm = Array::assemble(m.refs()).unwrap();
    assert_eq!(asm.refused.len(), 1);
    assert!(asm.refused[0].0.contains("stale2"), "{:?}", asm.refused);
    assert_eq!(
        asm.refused[0].1.kind,
        RefusalKind::Failed,
        "{:?}",
        asm.refused
    );
    assert!(
        asm.refused[0]
            .1
            .to_string()
            .contains("not used until rebuilt"),
        "{:?}",
        asm.refused
    );
    assert_eq!(asm.array.state(), ArrayState::Degraded);
    let mut want = img.clone();
    want[..65536].copy_from_slice(&newer);
    assert_matches(&asm.array, &want);
}

#[test]
fn assembly_starts_degraded_with_a_member_missing_and_refuses_too_few() {
    let (m, a, img) = filled(Level::Raid6, 5, "miss");
    a.close().unwrap();
    drop(a);
    let mut refs = m.refs();
    refs.remove(4);
    let asm = Array::assemble(refs.clone()).unwrap();
    assert_eq!(asm.array.state(), ArrayState::Degraded);
    assert!(asm.array.event_log().iter().any(|(_, e)| *e
        == ArrayEvent::MemberMissing {
            slot: 4,
            left_out: None
        }));
    assert_matches(&asm.array, &img);
    asm.array.close().unwrap();
    drop(asm);
    refs.truncate(2);
    let e = Array::assemble(refs).err().unwrap().to_string();
    assert!(e.contains("cannot start"), "{e}");
}

#[test]
fn assembly_refuses_a_foreign_member_by_name() {
    let (m1, a1, _) = filled(Level::Raid5, 3, "fa");
    let (m2, a2, _) = filled(Level::Raid5, 3, "fb");
    a1.close().unwrap();
    a2.close().unwrap();
    let mut refs = m1.refs();
    refs[1] = m2.refs()[1].clone();
    let e = Array::assemble(refs).err().unwrap().to_string();
    assert!(
        e.contains("ram:fb1") && e.contains("belongs to array"),
        "{e}"
    );
    // A member without any metadata is left out, and named.
    let blank: MemberRef = Arc::new(RamMember::new("blank0", MIN_DATA_OFFSET + DATA));
    let mut refs = m1.refs();
    refs.push(blank);
    let asm = Array::assemble(refs).unwrap();
    assert_eq!(asm.array.state(), ArrayState::Optimal);
    assert!(
        asm.refused
            .iter()
            .any(|(m, why)| m == "blank0" && why.kind == RefusalKind::NoMetadata),
        "{:?}",
        asm.refused
    );
}

#[test]
fn a_torn_metadata_copy_leaves_the_other_one() {
    let (m, a, img) = filled(Level::Raid1, 2, "torn");
    a.close().unwrap();
    drop(a);
    // Tear copy 0 of member 0: half new bytes, half garbage.
    m.faulty[0]
        .write_at(&[0xEE; 2048], SB_OFFSETS[0] + 1024)
        .unwrap();
    let asm = Array::assemble(m.refs()).unwrap();
    assert_eq!(asm.array.state(), ArrayState::Optimal);
    assert_matches(&asm.array, &img);
    asm.array.close().unwrap();
    drop(asm);
    // Both copies gone: the member is named as unusable, and the array
    // starts degraded without it, every byte still there.
    m.faulty[0].write_at(&[0xEE; 4096], SB_OFFSETS[0]).unwrap();
    m.faulty[0].write_at(&[0xEE; 4096], SB_OFFSETS[1]).unwrap();
    let asm = Array::assemble(m.refs()).unwrap();
    assert_eq!(asm.array.state(), ArrayState::Degraded);
    assert!(
        asm.refused.iter().any(|(who, why)| who == "ram:torn0"
            && why.kind == RefusalKind::NoMetadata
            && why.reason.contains("copy at byte 0: no array metadata")),
        "{:?}",
        asm.refused
    );
    assert_matches(&asm.array, &img);
    drop(asm);
    // With every member's metadata gone there is nothing to start.
    m.faulty[1].write_at(&[0xEE; 4096], SB_OFFSETS[0]).unwrap();
    m.faulty[1].write_at(&[0xEE; 4096], SB_OFFSETS[1]).unwrap();
    let e = Array::assemble(m.refs()).err().unwrap().to_string();
    assert!(e.contains("ram:torn0") && e.contains("ram:torn1"), "{e}");
    assert!(e.contains("copy at byte 4096"), "{e}");
}

#[test]
fn rebuild_resumes_from_its_saved_position_after_a_stop() {
    let (m, a, img) = filled(Level::Raid6, 5, "resume");
    a.fail_slot(3, "test");
    let new: MemberRef = Arc::new(RamMember::new("ram:resume-new", MIN_DATA_OFFSET + DATA));
    a.replace(3, new.clone()).unwrap();
    let a = Arc::new(a);
    let stop = Arc::new(AtomicBool::new(false));
    let opts = RebuildOptions {
        rate_limit: Some(2 << 20),
        batch_rows: 2,
        checkpoint_bytes: 65536,
        ..Default::default()
    };
    let h = {
        let (a, stop, opts) = (a.clone(), stop.clone(), opts.clone());
        std::thread::spawn(move || a.rebuild(3, &opts, &stop))
    };
    std::thread::sleep(std::time::Duration::from_millis(150));
    stop.store(true, Ordering::Release);
    assert_eq!(h.join().unwrap().unwrap(), RebuildEnd::Interrupted);
    let (done, total) = a.rebuild_progress(3).unwrap();
    assert!(done > 0 && done < total, "{done}/{total}");
    a.close().unwrap();
    drop(a);
    let mut refs = m.refs();
    refs[3] = new.clone();
    let asm = Array::assemble(refs.clone()).unwrap();
    let a = asm.array;
    assert_eq!(a.state(), ArrayState::Rebuilding);
    let (resumed, _) = a.rebuild_progress(3).unwrap();
    assert!(
        resumed > 0 && resumed <= done,
        "saved {resumed}, reached {done}"
    );
    assert_matches(&a, &img);
    assert_eq!(
        a.rebuild(3, &RebuildOptions::default(), &AtomicBool::new(false))
            .unwrap(),
        RebuildEnd::Finished
    );
    // Its event says where it resumed, not that it started.
    let started = a.event_log().into_iter().find_map(|(_, e)| match e {
        e @ ArrayEvent::RebuildStarted { .. } => Some(e),
        _ => None,
    });
    let started = started.expect("a rebuild_started event");
    assert!(
        matches!(started, ArrayEvent::RebuildStarted { from_row, .. } if from_row == resumed),
        "{started:?}"
    );
    assert!(
        started.describe().contains("resumed at row"),
        "{}",
        started.describe()
    );
    assert_eq!(a.state(), ArrayState::Optimal);
    assert_matches(&a, &img);
    assert_consistent(&a, &refs);
}

#[test]
fn spare_takes_over_and_rebuilds() {
    let m = Members::ram(4, DATA, "spare");
    let spare: MemberRef = Arc::new(RamMember::new("ram:spare-s", MIN_DATA_OFFSET + DATA));
    let a = Array::create(
        m.refs(),
        vec![spare.clone()],
        CreateOptions {
            name: "s".into(),
            level: Level::Raid5,
            chunk: 16384,
            data_offset: None,
        },
    )
    .unwrap();
    let img = pattern(a.capacity() as usize, 1);
    a.write(0, &img).unwrap();
    m.faulty[0].fail_all();
    assert_matches(&a, &img);
    assert_eq!(a.activate_spare(0).unwrap().as_deref(), Some("ram:spare-s"));
    a.rebuild(0, &RebuildOptions::default(), &AtomicBool::new(false))
        .unwrap();
    assert_eq!(a.state(), ArrayState::Optimal);
    assert!(a.spares().is_empty());
    let mut refs = m.refs();
    refs[0] = spare;
    assert_consistent(&a, &refs);
    assert_matches(&a, &img);
}

#[test]
fn flushed_writes_survive_a_power_cut() {
    let (m, a, mut img) = filled(Level::Raid5, 3, "power");
    a.flush().unwrap();
    for f in &m.faulty {
        f.track_power_cut();
    }
    let flushed = pattern(65536, 5);
    a.write(65536, &flushed).unwrap();
    img[65536..131072].copy_from_slice(&flushed);
    a.flush().unwrap();
    // Written but never flushed: may be lost, must not harm the rest.
    a.write(4 * 65536, &pattern(65536, 6)).unwrap();
    for f in &m.faulty {
        f.power_cut().unwrap();
    }
    drop(a);
    for f in &m.faulty {
        f.power_on();
    }
    let asm = Array::assemble(m.refs()).unwrap();
    let mut got = vec![0u8; 65536];
    asm.array.read(65536, &mut got).unwrap();
    assert_eq!(got, flushed);
    let mut got = vec![0u8; 65536];
    asm.array.read(0, &mut got).unwrap();
    assert_eq!(got, img[..65536]);
}

#[test]
fn operator_fail_and_replace_errors_say_what_to_do() {
    let (_m, a, _) = filled(Level::Raid5, 3, "op");
    let e = a
        .replace(0, Arc::new(RamMember::new("x", MIN_DATA_OFFSET + DATA)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("fail it first"), "{e}");
    assert!(e.contains("wrong-slot-state"), "{e}");
    let op1 = a.slot_of("ram:op1").unwrap();
    a.fail_member(op1, false).unwrap();
    let e = a.fail_member(op1, false).unwrap_err().to_string();
    assert!(e.contains("already failed"), "{e}");
    assert!(a
        .slot_of("nope")
        .unwrap_err()
        .to_string()
        .contains("not a member"));
    let e = a
        .replace(1, Arc::new(RamMember::new("small", 4096)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs"), "{e}");
}

#[test]
fn a_slow_member_slows_but_does_not_corrupt() {
    let (m, a, mut img) = filled(Level::Raid5, 4, "slow");
    m.faulty[2].set_faults(Faults {
        latency: std::time::Duration::from_millis(2),
        ..Default::default()
    });
    let data = pattern(256 * 1024, 42);
    a.write(8192, &data).unwrap();
    img[8192..8192 + data.len()].copy_from_slice(&data);
    assert_matches(&a, &img);
    assert_eq!(a.state(), ArrayState::Optimal, "slowness is not failure");
}

#[test]
fn two_members_failing_during_a_raid6_rebuild() {
    let (m, a, img) = filled(Level::Raid6, 6, "r6rb");
    a.fail_slot(0, "test");
    let new: MemberRef = Arc::new(RamMember::new("ram:r6rb-new", MIN_DATA_OFFSET + DATA));
    a.replace(0, new.clone()).unwrap();
    // A second member dies during the rebuild: still within RAID6's two.
    m.faulty[3].set_faults(Faults {
        fail_after: Some(40),
        ..Default::default()
    });
    let end = a
        .rebuild(
            0,
            &RebuildOptions {
                batch_rows: 2,
                ..Default::default()
            },
            &AtomicBool::new(false),
        )
        .unwrap();
    assert_eq!(end, RebuildEnd::Finished);
    assert_eq!(a.slots()[3].state, SlotState::Failed);
    assert_eq!(a.slots()[0].state, SlotState::Active);
    assert_matches(&a, &img);
    // A third failure is beyond RAID6 now: errors, never wrong data.
    m.faulty[4].fail_all();
    m.faulty[5].fail_all();
    let mut buf = vec![0u8; 6 * 16384];
    assert!(a.read(0, &mut buf).is_err());
}

/// A small write to a degraded stripe whose own chunk and parity are
/// present reads just those (read-modify-write: the missing chunk is in
/// the parity already, as md does it), not every chunk left in the
/// stripe; the missing member's chunk still reads back right, and after a
/// rebuild parity agrees everywhere.
#[test]
fn a_small_degraded_write_reads_only_its_chunk_and_parity() {
    for (level, n) in [(Level::Raid5, 8), (Level::Raid6, 8)] {
        let (m, a, mut img) = filled(level, n, &format!("dgrmw-{level}-"));
        a.fail_slot(1, "test");
        let geo = a.geometry();
        let nd = n - level.parity_chunks();
        let chunk = geo.chunk;
        let s = (0..geo.rows())
            .find(|&s| geo.stripe_map(s).members[..nd].contains(&1))
            .unwrap();
        let map = geo.stripe_map(s);
        let lost = map.members.iter().position(|&x| x == 1).unwrap();
        let i = (0..nd).find(|&i| i != lost).unwrap();
        let at = (s * nd as u64 + i as u64) * chunk + 4096;
        let reads = |a: &Array| -> u64 { a.io_stats().members.iter().map(|x| x.io.read.ops).sum() };
        let before = reads(&a);
        let data = pattern(4096, 99);
        a.write(at, &data).unwrap();
        img[at as usize..at as usize + 4096].copy_from_slice(&data);
        assert_eq!(
            reads(&a) - before,
            1 + level.parity_chunks() as u64,
            "{level}: a 4 KiB degraded write read more than its chunk and the parity"
        );
        assert_matches(&a, &img);
        let new: MemberRef = Arc::new(RamMember::new(
            format!("ram:dgrmw-{level}-new"),
            MIN_DATA_OFFSET + DATA,
        ));
        a.replace(1, new).unwrap();
        a.rebuild(1, &Default::default(), &AtomicBool::new(false))
            .unwrap();
        assert_matches(&a, &img);
        drop(m);
    }
}

/// A create over an earlier array's members that fails while it zeroes
/// (a member erring, or the operator's Ctrl-C) leaves no array to start:
/// the earlier array's metadata goes first. It stayed, over data the
/// zeroing had begun to clear, and assembled as that array, optimal,
/// serving zeros for its data.
#[test]
fn a_create_cut_short_while_zeroing_leaves_no_earlier_array_to_start() {
    let (m, a, _img) = filled(Level::Raid5, 4, "recreate");
    a.close().unwrap();
    drop(a);
    // Member 2 errs once the zeroing reaches the middle of its data area.
    m.faulty[2].set_faults(Faults {
        fail_ranges: vec![(MIN_DATA_OFFSET + DATA / 2, MIN_DATA_OFFSET + DATA)],
        ..Default::default()
    });
    let e = Array::create(
        m.refs(),
        vec![],
        CreateOptions {
            name: "again".into(),
            level: Level::Raid5,
            chunk: 16384,
            data_offset: None,
        },
    );
    assert!(e.is_err(), "the create went through a failing member");
    m.faulty[2].set_faults(Faults::default());
    match Array::assemble(m.refs()) {
        Ok(_) => panic!("the earlier array assembled over its zeroed data"),
        Err(e) => assert!(
            e.to_string()
                .contains("no member given has usable array metadata"),
            "{e}"
        ),
    }
}

/// A rebuild run of several steps (each step's writes go out with the
/// next step's reads): the new member failing its writes at any point,
/// those in flight beside reads among them, fails it and ends the rebuild
/// with the error, and the array still reads back what was written; a
/// source failing at any point of a RAID6 rebuild leaves it to finish on
/// the others, every byte right.
#[test]
fn a_rebuild_in_steps_survives_failures_between_its_steps() {
    use raid_core::member::FaultyMember;
    // One run over every row: 64 rows of 16 KiB, two steps of 32.
    let opts = RebuildOptions {
        batch_rows: 64,
        parallel: 1,
        step_bytes: 32 * 16384,
        ..Default::default()
    };
    for after in [0, 10, 31, 32, 33, 40, 63] {
        let (_m, a, img) = filled(Level::Raid5, 4, &format!("step-w{after}"));
        a.fail_slot(1, "test");
        let ram: MemberRef = Arc::new(RamMember::new(
            format!("ram:step-w{after}-new"),
            MIN_DATA_OFFSET + DATA,
        ));
        let new = Arc::new(FaultyMember::new(ram));
        a.replace(1, new.clone()).unwrap();
        new.set_faults(Faults {
            fail_after: Some(after),
            ..Default::default()
        });
        // Ok (the pass ended, its member gone) or the member's error.
        let r = a.rebuild(1, &opts, &AtomicBool::new(false));
        assert!(
            matches!(r, Ok(RebuildEnd::Finished) | Err(ArrayError::Member { .. })),
            "failing after {after}: {r:?}"
        );
        assert!(
            a.event_log()
                .iter()
                .any(|(_, e)| matches!(e, ArrayEvent::RebuildFailed { .. })),
            "failing after {after}"
        );
        assert_eq!(a.slots()[1].state, SlotState::Failed, "after {after}");
        assert_matches(&a, &img);
    }
    // Slot 3 is read once a row: 36 to 60 fail it in the second step,
    // whose reads go out with the first step's writes; 100 and on, after
    // the rebuild (every rebuilt byte checked).
    for after in [0, 20, 36, 40, 48, 60, 100, 250] {
        let (m, a, img) = filled(Level::Raid6, 5, &format!("step-r{after}"));
        a.fail_slot(0, "test");
        let new: MemberRef = Arc::new(RamMember::new(
            format!("ram:step-r{after}-new"),
            MIN_DATA_OFFSET + DATA,
        ));
        a.replace(0, new.clone()).unwrap();
        m.faulty[3].set_faults(Faults {
            fail_after: Some(after),
            ..Default::default()
        });
        let end = a.rebuild(0, &opts, &AtomicBool::new(false)).unwrap();
        assert_eq!(end, RebuildEnd::Finished, "after {after}");
        assert_eq!(a.slots()[0].state, SlotState::Active, "after {after}");
        assert_matches(&a, &img);
        // What was rebuilt is right: with two others failed, every
        // stripe needs it.
        a.fail_slot(1, "test");
        assert_matches(&a, &img);
    }
}
