//! One rebuild pass for every member being rebuilt (RAID6): a replacement
//! that arrives while another member is being rebuilt joins the pass at
//! its cursor, the first member is not held back, and the rows the second
//! missed before it joined are rebuilt after the pass wraps to row 0. A
//! stop in between saves the second at row 0 (its rows in sync are not a
//! prefix yet), and the next pass redoes them.

mod support;

use raid_core::array::{Array, ArrayEvent, ArrayState, RebuildEnd, RebuildOptions};
use raid_core::layout::Level;
use raid_core::member::{MemberRef, RamMember};
use raid_core::metadata::{SlotState, MIN_DATA_OFFSET};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use support::array::{assert_consistent, assert_matches, create, Members};
use support::wait_until;

const CHUNK: u64 = 16384;
/// 64 rows per member.
const DATA: u64 = 64 * CHUNK;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 10) as u8)
        .collect()
}

fn ram(name: &str) -> MemberRef {
    Arc::new(RamMember::new(name, MIN_DATA_OFFSET + DATA))
}

/// A RAID6 of 6 with data, slots 1 and 3 failed, slot 1 replaced.
fn two_down(tag: &str) -> (Members, Array, Vec<u8>) {
    let m = Members::ram(6, DATA, tag);
    let a = create(Level::Raid6, &m, CHUNK);
    let img = pattern(a.capacity() as usize, 7);
    a.write(0, &img).unwrap();
    a.fail_member(1, false).unwrap();
    a.fail_member(3, false).unwrap();
    a.replace(1, ram(&format!("{tag}-n1"))).unwrap();
    (m, a, img)
}

/// Slow, small batches: the test can act between them.
fn slow() -> RebuildOptions {
    RebuildOptions {
        rate_limit: Some(DATA),
        batch_rows: 2,
        parallel: 1,
        ..RebuildOptions::default()
    }
}

fn rows_in_sync(a: &Array, slot: usize) -> u64 {
    a.rebuild_progress(slot).map_or(0, |p| p.0)
}

fn members_now(a: &Array) -> Vec<MemberRef> {
    (0..a.geometry().members)
        .map(|s| a.member_of(s).expect("a member in every slot"))
        .collect()
}

/// Random writes while the pass runs, into the model too.
fn write_some(a: &Array, img: &mut [u8], seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    for k in 0..24 {
        let len = 4096 * rng.gen_range(1..=8usize);
        let off = 4096 * rng.gen_range(0..(img.len() - len) / 4096);
        let data = pattern(len, k as u8);
        a.write(off as u64, &data).unwrap();
        img[off..off + len].copy_from_slice(&data);
    }
}

/// Runs a pass of `a` (slow), replaces slot 3 with a new device named
/// `n3` once a quarter of slot 1 is rebuilt, then does `meanwhile` while
/// the pass runs; returns how the pass ended.
fn pass_with_second_replacement(
    a: &Array,
    stop: &AtomicBool,
    n3: &str,
    meanwhile: impl FnOnce(),
) -> raid_core::array::Result<RebuildEnd> {
    let rows = a.geometry().rows();
    std::thread::scope(|sc| {
        let pass = sc.spawn(|| a.rebuild_all(&slow(), stop));
        wait_until("a quarter of slot 1", || rows_in_sync(a, 1) * 4 >= rows);
        a.replace(3, ram(n3)).unwrap();
        meanwhile();
        pass.join().unwrap()
    })
}

/// Every byte as the model says, parity consistent, and the rebuilt
/// members hold the data: with two others lost, every byte is read from
/// them.
fn rebuilt_members_hold_the_data(a: &Array, img: &[u8]) {
    assert_matches(a, img);
    assert_consistent(a, &members_now(a));
    a.fail_member(0, false).unwrap();
    a.fail_member(2, false).unwrap();
    assert_matches(a, img);
}

#[test]
fn a_second_replacement_joins_the_pass_under_way() {
    let (_m, a, mut img) = two_down("join");
    let rows = a.geometry().rows();
    let stop = AtomicBool::new(false);
    let end = pass_with_second_replacement(&a, &stop, "join-n3", || {
        wait_until("slot 3 joined", || rows_in_sync(&a, 3) > 0);
        // Joined mid-pass: in sync from where it joined, not from row 0,
        // so its metadata says row 0 until the pass wraps.
        let at = rows_in_sync(&a, 1);
        assert!(rows_in_sync(&a, 3) < at, "slot 3 joined after slot 1 began");
        assert_eq!(a.slots()[3].rebuild_row, 0);
        write_some(&a, &mut img, 1);
    });
    assert_eq!(end.unwrap(), RebuildEnd::Finished);
    assert_eq!(a.state(), ArrayState::Optimal);
    // One pass: slot 1 done first (not held back by slot 3), and each
    // member's every row written once.
    let ends: Vec<(usize, u64)> = a
        .event_log()
        .into_iter()
        .filter_map(|(_, e)| match e {
            ArrayEvent::RebuildFinished {
                slot, rows_copied, ..
            } => Some((slot, rows_copied)),
            _ => None,
        })
        .collect();
    assert_eq!(ends, [(1, rows), (3, rows)]);
    rebuilt_members_hold_the_data(&a, &img);
}

#[test]
fn a_joined_member_stopped_before_the_wrap_starts_again_from_row_0() {
    let (m, a, mut img) = two_down("joinstop");
    let rows = a.geometry().rows();
    let stop = AtomicBool::new(false);
    let end = pass_with_second_replacement(&a, &stop, "joinstop-n3", || {
        wait_until("slot 3 joined", || rows_in_sync(&a, 3) >= 4);
        write_some(&a, &mut img, 2);
        stop.store(true, Ordering::Release);
    });
    assert_eq!(end.unwrap(), RebuildEnd::Interrupted);
    let saved: Vec<u64> = a.slots().iter().map(|s| s.rebuild_row).collect();
    assert!(saved[1] > 0 && saved[1] < rows, "{saved:?}");
    assert_eq!(saved[3], 0, "slot 3's rows in sync are not a prefix yet");
    assert_matches(&a, &img);
    // A restart: the metadata's rows, then one pass for both.
    let mut devices = m.refs();
    devices[1] = a.member_of(1).unwrap();
    devices[3] = a.member_of(3).unwrap();
    a.close().unwrap();
    drop(a);
    let a = Array::assemble(devices).unwrap().array;
    assert_eq!(a.slots()[3].state, SlotState::Rebuilding);
    assert_eq!(rows_in_sync(&a, 3), 0);
    assert_eq!(rows_in_sync(&a, 1), saved[1]);
    let opts = RebuildOptions::default();
    assert_eq!(
        a.rebuild_all(&opts, &AtomicBool::new(false)).unwrap(),
        RebuildEnd::Finished
    );
    assert_eq!(a.state(), ArrayState::Optimal);
    rebuilt_members_hold_the_data(&a, &img);
}

/// Without a join (the API's `rebuild` of one slot), a second pending
/// slot is left for its own pass, as before.
#[test]
fn rebuild_of_one_slot_leaves_the_other_pending() {
    let (_m, a, img) = two_down("single");
    a.replace(3, ram("single-n3")).unwrap();
    let stop = AtomicBool::new(false);
    assert_eq!(
        a.rebuild(1, &RebuildOptions::default(), &stop).unwrap(),
        RebuildEnd::Finished
    );
    assert_eq!(a.slots()[3].state, SlotState::Rebuilding);
    assert_eq!(rows_in_sync(&a, 3), 0);
    assert_eq!(
        a.rebuild_all(&RebuildOptions::default(), &stop).unwrap(),
        RebuildEnd::Finished
    );
    assert_eq!(a.state(), ArrayState::Optimal);
    assert_matches(&a, &img);
}

/// A member that fails while the pass rebuilds it leaves the pass; the
/// other goes on to the end (its rebuild is not blocked by the failure),
/// and one replaced meanwhile rejoins with its new device.
#[test]
fn a_member_failing_mid_pass_leaves_it_and_the_other_goes_on() {
    let (_m, a, mut img) = two_down("leave");
    let stop = AtomicBool::new(false);
    let end = pass_with_second_replacement(&a, &stop, "leave-n3", || {
        wait_until("slot 3 joined", || rows_in_sync(&a, 3) > 0);
        a.fail_member(3, false).unwrap();
        write_some(&a, &mut img, 3);
    });
    assert_eq!(end.unwrap(), RebuildEnd::Finished);
    assert_eq!(a.slots()[1].state, SlotState::Active);
    assert_eq!(a.slots()[3].state, SlotState::Failed);
    assert_eq!(a.state(), ArrayState::Degraded);
    assert!(a
        .event_log()
        .iter()
        .any(|(_, e)| matches!(e, ArrayEvent::RebuildFailed { slot: 3, .. })));
    assert_matches(&a, &img);
    // Replaced while a pass runs: the new device joins and is rebuilt.
    a.fail_member(1, false).unwrap();
    a.replace(1, ram("leave-m1")).unwrap();
    let end = pass_with_second_replacement(&a, &stop, "leave-m3", || {
        write_some(&a, &mut img, 4);
    });
    assert_eq!(end.unwrap(), RebuildEnd::Finished);
    assert_eq!(a.state(), ArrayState::Optimal);
    rebuilt_members_hold_the_data(&a, &img);
}
