//! The write-intent bitmap's bits linger: a region's bit is set once for a
//! run of writes and flushes into it (an `fsync` loop), not set and
//! cleared around each of them, and cleared once no write has touched the
//! region for the linger: by a flush then, by `settle_bitmap` where no
//! flush comes, or at an orderly stop.

mod support;

use raid_core::array::Array;
use raid_core::layout::Level;
use std::time::Duration;
use support::array::{assert_matches, create, Members};

const CHUNK: u64 = 16 * 1024;
const DATA: u64 = 8 << 20;

fn bitmap_writes(a: &Array) -> u64 {
    a.io_stats().bitmap_writes
}

/// Fifty 4 KiB writes into one region, each flushed, as a log does.
fn fsync_loop(a: &Array, image: &mut [u8]) {
    for i in 0..50u64 {
        let block = vec![i as u8 + 1; 4096];
        let at = i * 4096;
        a.write(at, &block).unwrap();
        a.flush().unwrap();
        image[at as usize..at as usize + 4096].copy_from_slice(&block);
    }
}

#[test]
fn an_fsync_loop_sets_its_bit_once_and_it_clears_once_the_region_is_idle() {
    for level in [Level::Raid1, Level::Raid5, Level::Raid6] {
        let m = Members::ram(4, DATA, &format!("linger{level}"));
        let a = create(level, &m, CHUNK);
        a.set_bitmap_linger(Some(Duration::from_secs(1)));
        let mut image = vec![0u8; a.capacity() as usize];
        let before = bitmap_writes(&a);
        fsync_loop(&a, &mut image);
        assert_eq!(
            bitmap_writes(&a) - before,
            1,
            "{level}: one write sets the bit"
        );
        assert_eq!(a.bitmap_dirty_regions(), 1, "{level}");
        // Written within the linger: neither a flush nor a settle clears it.
        a.flush().unwrap();
        a.settle_bitmap().unwrap();
        assert_eq!(
            a.bitmap_dirty_regions(),
            1,
            "{level}: cleared within its linger"
        );
        assert_eq!(bitmap_writes(&a) - before, 1, "{level}");
        std::thread::sleep(Duration::from_millis(1200));
        a.settle_bitmap().unwrap();
        assert_eq!(
            a.bitmap_dirty_regions(),
            0,
            "{level}: not cleared after its linger"
        );
        assert_eq!(
            bitmap_writes(&a) - before,
            2,
            "{level}: one write clears it"
        );
        // Nothing left to clear: no flush, no bitmap write.
        a.settle_bitmap().unwrap();
        assert_eq!(bitmap_writes(&a) - before, 2, "{level}");
        assert_matches(&a, &image);
    }
}

/// The rule before bits lingered, still there for whoever sets no linger:
/// each flush clears the bit its write set, two bitmap writes a write.
#[test]
fn with_no_linger_each_flush_clears_the_bit_its_write_set() {
    let m = Members::ram(4, DATA, "nolinger");
    let a = create(Level::Raid5, &m, CHUNK);
    a.set_bitmap_linger(Some(Duration::ZERO));
    let mut image = vec![0u8; a.capacity() as usize];
    let before = bitmap_writes(&a);
    fsync_loop(&a, &mut image);
    assert_eq!(bitmap_writes(&a) - before, 100);
    assert_eq!(a.bitmap_dirty_regions(), 0);
    assert_matches(&a, &image);
}

/// An orderly stop clears the bits still lingering; a crash keeps them for
/// the next start's resync.
#[test]
fn an_orderly_stop_clears_lingering_bits_and_a_crash_keeps_them() {
    for close in [true, false] {
        let m = Members::ram(4, DATA, &format!("stop{close}"));
        let a = create(Level::Raid5, &m, CHUNK);
        let mut image = vec![0u8; a.capacity() as usize];
        fsync_loop(&a, &mut image);
        let far = a.capacity() / 2;
        a.write(far, &[7u8; 4096]).unwrap();
        a.flush().unwrap();
        image[far as usize..far as usize + 4096].fill(7);
        assert_eq!(a.bitmap_dirty_regions(), 2, "lingering by default");
        if close {
            a.close().unwrap();
        }
        drop(a);
        let asm = Array::assemble(m.refs()).unwrap();
        let resynced = asm.array.event_log().iter().find_map(|(_, e)| match e {
            raid_core::array::ArrayEvent::UncleanStop { regions, .. } => Some(*regions),
            _ => None,
        });
        // After a crash the bits stay set past the resync, until their
        // linger is over: a crash in between resyncs them again.
        let (resync, bits) = match close {
            true => (None, 0),
            false => (Some(2), 2),
        };
        assert_eq!(resynced, resync, "close {close}");
        assert_eq!(asm.array.bitmap_dirty_regions(), bits, "close {close}");
        assert_matches(&asm.array, &image);
    }
}

/// With no linger by time (`None`), no flush and no settle clears a bit;
/// the orderly stop does.
#[test]
fn bits_set_to_linger_until_the_stop_clear_only_there() {
    let m = Members::ram(4, DATA, "never");
    let a = create(Level::Raid5, &m, CHUNK);
    a.set_bitmap_linger(None);
    let mut image = vec![0u8; a.capacity() as usize];
    fsync_loop(&a, &mut image);
    std::thread::sleep(Duration::from_millis(50));
    a.flush().unwrap();
    assert!(!a.bitmap_settle_due());
    a.settle_bitmap().unwrap();
    assert_eq!(a.bitmap_dirty_regions(), 1);
    a.close().unwrap();
    drop(a);
    let asm = Array::assemble(m.refs()).unwrap();
    assert_eq!(asm.array.bitmap_dirty_regions(), 0);
    assert_matches(&asm.array, &image);
}

/// A member that takes the bitmap's write but fails its flush is failed
/// (the bit may not be on it), and the write goes on without it: the other
/// members hold the bit, and the data reads back.
#[test]
fn a_member_whose_flush_fails_after_the_bitmap_write_is_failed() {
    use raid_core::member::Faults;
    use raid_core::metadata::SlotState;
    let m = Members::ram(4, DATA, "bmflush");
    let a = create(Level::Raid5, &m, CHUNK);
    let mut image = vec![0u8; a.capacity() as usize];
    fsync_loop(&a, &mut image);
    // The next I/O of member 2 (the bitmap's write) lands; its flush fails.
    m.faulty[2].set_faults(Faults {
        fail_after: Some(1),
        ..Default::default()
    });
    let far = a.capacity() / 2;
    a.write(far, &[9u8; 4096]).unwrap();
    image[far as usize..far as usize + 4096].fill(9);
    let slot = &a.slots()[2];
    assert_eq!(slot.state, SlotState::Failed);
    let why = a
        .event_log()
        .iter()
        .find_map(|(_, e)| match e {
            raid_core::array::ArrayEvent::MemberFailed {
                slot: 2, reason, ..
            } => Some(reason.clone()),
            _ => None,
        })
        .expect("a member_failed event");
    assert!(why.contains("bitmap write failed"), "{why}");
    assert_eq!(a.bitmap_dirty_regions(), 2);
    assert_matches(&a, &image);
}

/// A write within the linger starts the region's idle time again: writes
/// 0.7 s apart, with a linger of 1 s, keep the bit set across flushes 1.4
/// s after the first.
#[test]
fn a_write_within_the_linger_keeps_the_bit() {
    let m = Members::ram(4, DATA, "rewritten");
    let a = create(Level::Raid5, &m, CHUNK);
    a.set_bitmap_linger(Some(Duration::from_secs(1)));
    for _ in 0..2 {
        a.write(0, &[3u8; 4096]).unwrap();
        a.flush().unwrap();
        std::thread::sleep(Duration::from_millis(700));
    }
    a.flush().unwrap();
    a.settle_bitmap().unwrap();
    assert_eq!(
        a.bitmap_dirty_regions(),
        1,
        "cleared 0.7 s after its last write"
    );
}

/// A start writes the bits it assembled (the union of the members'
/// blocks) to every member, clean start or not: a bit that reached one
/// member only (a crash during its write, a stale device's) is then not
/// lost with that member.
#[test]
fn a_start_writes_the_bits_it_assembled_to_every_member() {
    use raid_core::member::Member;
    use raid_core::metadata::BITMAP_OFFSET;
    let bit0 = |f: &dyn Member| {
        let mut b = raid_core::buf::AlignedBuf::new(4096);
        f.read_at(&mut b, BITMAP_OFFSET).unwrap();
        b[0] & 1 != 0
    };
    for clean in [true, false] {
        let m = Members::ram(4, DATA, &format!("union{clean}"));
        let a = create(Level::Raid5, &m, CHUNK);
        let mut image = vec![0u8; a.capacity() as usize];
        fsync_loop(&a, &mut image);
        if clean {
            a.close().unwrap();
        }
        drop(a);
        // Region 0's bit on member 1 only.
        for (i, f) in m.faulty.iter().enumerate() {
            let mut b = raid_core::buf::AlignedBuf::new(4096);
            f.read_at(&mut b, BITMAP_OFFSET).unwrap();
            match i {
                1 => b[0] |= 1,
                _ => b[0] &= !1,
            }
            f.write_at(&b, BITMAP_OFFSET).unwrap();
        }
        let asm = Array::assemble(m.refs()).unwrap();
        for (i, f) in m.faulty.iter().enumerate() {
            assert!(bit0(f.as_ref()), "clean {clean}: member {i} lacks the bit");
        }
        assert_matches(&asm.array, &image);
    }
}
