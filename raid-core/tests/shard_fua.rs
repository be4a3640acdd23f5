//! Writes asked for with FUA (`raid_core::shard::Engine::write_fua`, what
//! an NBD client's FUA write becomes): durable once answered, with no
//! flush of the array. On a healthy array the shards write them with FUA
//! on the members they meet; with a member missing they run on the
//! blocking path and the array is flushed after. Each test cuts the power
//! with nothing flushed since the writes and reads them back; a control
//! shows that the same writes without FUA do not survive that cut.

use raid_core::array::Array;
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::FaultyMember;
use raid_core::metadata::SlotState;
use raid_core::shard::Engine;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;
use support::array::Members;

mod support;

const CHUNK: u64 = 64 << 10;
const DATA: u64 = 4 << 20;
const WRITES: usize = 32;

/// A RAID5 of 4 members in memory whose power cuts drop every write not
/// made durable, half of them taking FUA writes themselves (the others
/// write, then flush: `Member::write_fua_at`), marked dirty and flushed
/// before the cuts are tracked; and its engine (None without io_uring).
fn setup(tag: &str) -> (Members, Arc<Array>, Option<Engine>) {
    let m = Members::ram(4, DATA, tag);
    let a = Arc::new(support::array::create(Level::Raid5, &m, CHUNK));
    // Every region written once (the first write since clean, and the
    // first into each region, set their bits on the blocking path, whose
    // flushes would make the writes before them durable too), before the
    // cut is tracked.
    a.write(0, &AlignedBuf::new(a.capacity() as usize)).unwrap();
    a.flush().unwrap();
    for (i, f) in m.faulty.iter().enumerate() {
        f.take_fua(i % 2 == 0);
        f.track_power_cut();
    }
    let e = Engine::start(a.clone(), 1).unwrap();
    if e.shard_count() == 0 {
        eprintln!("no shards here (no io_uring): nothing to test");
        return (m, a, None);
    }
    (m, a, Some(e))
}

/// `WRITES` 4 KiB writes at random blocks (none twice), one at a time,
/// each with FUA or not; the blocks and what each holds.
fn write_some(e: &Engine, fua: bool, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let blocks = DATA * 3 / 4096;
    let mut picked = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    while out.len() < WRITES {
        let b = rng.gen_range(1..blocks);
        if !picked.insert(b) {
            continue;
        }
        let mut buf = AlignedBuf::new(4096);
        rng.fill(&mut buf[..]);
        let data = buf.to_vec();
        let (tx, rx) = mpsc::channel();
        let done = Box::new(move |r| tx.send(r).unwrap());
        match fua {
            true => e.write_fua(b * 4096, buf, done),
            false => e.write(b * 4096, buf, done),
        }
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap()
            .expect("written");
        out.push((b * 4096, data));
    }
    out
}

/// Cuts every member's power at once, then brings it back.
fn cut(m: &Members) {
    FaultyMember::power_cut_together(&m.faulty).unwrap();
    for f in &m.faulty {
        f.power_on();
    }
}

/// How many of `written` read back as written.
fn kept(a: &Array, written: &[(u64, Vec<u8>)]) -> usize {
    let mut got = vec![0u8; 4096];
    written
        .iter()
        .filter(|(at, data)| {
            a.read(*at, &mut got).unwrap();
            got == *data
        })
        .count()
}

#[test]
fn fua_writes_on_the_shards_survive_a_power_cut_with_no_flush() {
    let (m, a, Some(e)) = setup("fua-shard") else {
        return;
    };
    let written = write_some(&e, true, 1);
    // Every one written on the shard, with FUA on the members it met.
    assert_eq!(
        e.counts().fua_on_shards.load(Ordering::Relaxed),
        WRITES as u64
    );
    assert_eq!(e.counts().writes_blocking.load(Ordering::Relaxed), 0);
    drop(e);
    cut(&m);
    assert_eq!(kept(&a, &written), WRITES, "a FUA write lost in the cut");
}

#[test]
fn writes_without_fua_are_lost_in_the_same_cut() {
    let (m, a, Some(e)) = setup("fua-control") else {
        return;
    };
    let written = write_some(&e, false, 1);
    assert_eq!(e.counts().fua_on_shards.load(Ordering::Relaxed), 0);
    assert_eq!(
        e.counts().writes_on_shards.load(Ordering::Relaxed),
        WRITES as u64
    );
    drop(e);
    cut(&m);
    // None was flushed: the cut takes every one back.
    assert_eq!(kept(&a, &written), 0, "the cut kept writes never flushed");
}

#[test]
fn fua_writes_with_a_member_missing_are_flushed_after() {
    let (m, a, Some(e)) = setup("fua-degraded") else {
        return;
    };
    a.fail_member(3, false).unwrap();
    assert_eq!(a.slots()[3].state, SlotState::Failed);
    let written = write_some(&e, true, 2);
    // None written with FUA: each through the journal (on members in
    // memory, the blocking path's), then the array flushed.
    let c = e.counts();
    assert_eq!(c.fua_on_shards.load(Ordering::Relaxed), 0);
    let ended =
        c.writes_on_shards.load(Ordering::Relaxed) + c.writes_blocking.load(Ordering::Relaxed);
    assert_eq!(ended, WRITES as u64);
    drop(e);
    cut(&m);
    // Blocks on the missing member read back from the others' data and
    // parity, all of it durable.
    assert_eq!(kept(&a, &written), WRITES, "a FUA write lost in the cut");
}
