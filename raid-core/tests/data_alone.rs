//! Writes to a stripe whose parity chunks are all missing (a RAID5 missing
//! the member that holds its parity, a RAID6 missing both): its data
//! chunks' writes alone, on the blocking path and on the shards, with
//! nothing read and no journal record, where a degraded write to any other
//! stripe is journaled. Every block then reads back against a model, and
//! again after the rebuild, which scrubs clean.

use raid_core::array::Array;
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{DeviceKey, FaultyMember, Member, MemberRef};
use raid_core::metadata::{SlotState, BITMAP_OFFSET, MIN_DATA_OFFSET};
use raid_core::shard::Engine;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod support;

const CHUNK: u64 = 64 << 10;
const DATA: u64 = 4 << 20;

/// Member reads and writes so far, and journal records.
fn counts(a: &Array) -> (u64, u64, u64) {
    let io = a.io_stats();
    let reads = io.members.iter().map(|m| m.io.read.ops).sum();
    let writes = io.members.iter().map(|m| m.io.write.ops).sum();
    (reads, writes, io.journal_records)
}

/// Writes `len` random bytes at `off` through the shards (`e`) or the
/// blocking path; the model follows. Returns what it cost: member reads,
/// member writes, journal records.
fn write(
    a: &Array,
    e: Option<&Engine>,
    model: &mut [u8],
    off: u64,
    len: u64,
    seed: u64,
) -> (u64, u64, u64) {
    let mut b = AlignedBuf::new(len as usize);
    SmallRng::seed_from_u64(seed).fill(&mut b[..]);
    model[off as usize..(off + len) as usize].copy_from_slice(&b);
    let before = counts(a);
    match e {
        Some(e) => {
            let (tx, rx) = std::sync::mpsc::channel();
            e.write(off, b, Box::new(move |r| tx.send(r.map(|_| ())).unwrap()));
            rx.recv_timeout(Duration::from_secs(10))
                .expect("answered")
                .unwrap();
        }
        None => a.write(off, &b).unwrap(),
    }
    let after = counts(a);
    (after.0 - before.0, after.1 - before.1, after.2 - before.2)
}

fn reads_back(a: &Array, model: &[u8], what: &str) -> Vec<u8> {
    let mut got = vec![0u8; a.capacity() as usize];
    a.read(0, &mut got).unwrap();
    assert!(got == model, "{what}: a block reads back wrong");
    got
}

#[test]
fn a_stripe_whose_parity_is_all_missing_takes_its_data_alone() {
    for (level, n, missing) in [(Level::Raid5, 4, vec![1]), (Level::Raid6, 5, vec![1, 2])] {
        let tag = format!("alone-{level}");
        // Simulated drives: timed I/O, which the shards run themselves.
        let drives: Vec<MemberRef> = (0..n)
            .map(|i| {
                Arc::new(support::array::sim_drive(format!("sim:{tag}{i}"), DATA)) as MemberRef
            })
            .collect();
        let a = support::array::create_shared(level, drives, &tag, CHUNK);
        let mut model = vec![0u8; a.capacity() as usize];
        // Every bitmap region's bit made durable (the blocking path's), so
        // that no write leaves the shards for it.
        let zeros = AlignedBuf::new(1 << 20);
        for i in 0..a.capacity() >> 20 {
            a.write(i << 20, &zeros).unwrap();
        }
        let e = Engine::start(a.clone(), 2).unwrap();
        let e = (e.shard_count() > 0).then_some(e);
        if e.is_none() {
            eprintln!("no shards here (no io_uring): the blocking path alone is tried");
        }
        for &slot in &missing {
            a.fail_slot(slot, "test");
        }
        let g = a.geometry();
        let (nd, sdb) = (g.data_chunks(), g.stripe_data_bytes());
        let rows = a.capacity() / sdb;
        let parity_gone = |s: u64| {
            g.stripe_map(s).members[nd..]
                .iter()
                .all(|m| missing.contains(m))
        };
        let alone: Vec<u64> = (0..rows).filter(|&s| parity_gone(s)).take(6).collect();
        let other: Vec<u64> = (0..rows).filter(|&s| !parity_gone(s)).take(4).collect();
        assert!(
            alone.len() == 6 && other.len() == 4,
            "{level}: too few rows of each kind"
        );
        let paths: Vec<(&str, Option<&Engine>)> = match &e {
            Some(e) => vec![("blocking path", None), ("shards", Some(e))],
            None => vec![("blocking path", None)],
        };
        for (k, (how, e)) in paths.into_iter().enumerate() {
            let what = format!("{level}, {how}");
            let seed = 100 * k as u64;
            let blocking = || e.map(|e| e.counts().writes_blocking.load(Ordering::Relaxed));
            let blocking_before = blocking();
            // One block inside a chunk, then one across two chunks: one
            // member write per chunk, nothing read, no record.
            let at = alone[3 * k] * sdb + CHUNK + 8192;
            assert_eq!(
                write(&a, e, &mut model, at, 4096, seed),
                (0, 1, 0),
                "{what}: a block"
            );
            let at = alone[3 * k + 1] * sdb + CHUNK - 4096;
            assert_eq!(
                write(&a, e, &mut model, at, 8192, seed + 1),
                (0, 2, 0),
                "{what}: across chunks"
            );
            // A whole stripe: its data chunks, nothing more.
            let at = alone[3 * k + 2] * sdb;
            let whole = write(&a, e, &mut model, at, sdb, seed + 2);
            assert_eq!(whole, (0, nd as u64, 0), "{what}: a whole stripe");
            assert_eq!(
                blocking(),
                blocking_before,
                "{what}: a write left for the blocking path"
            );
            // The control: a stripe with a data chunk missing is journaled
            // (on the shards, or the blocking path where the write would
            // recover one).
            for &s in &other[2 * k..2 * k + 2] {
                let (_, _, records) = write(&a, e, &mut model, s * sdb + 4096, 4096, seed + 3 + s);
                assert_eq!(
                    records, 1,
                    "{what}: stripe {s}, a data chunk missing, not journaled"
                );
            }
        }
        let got = reads_back(&a, &model, &format!("{level}, degraded"));
        drop(e);
        support::power_cut::rebuild_and_scrub(
            &a,
            &got,
            |slot| {
                Arc::new(support::array::sim_drive(
                    format!("sim:{tag}-new{slot}"),
                    DATA,
                )) as MemberRef
            },
            &format!("{level}"),
        );
        reads_back(&a, &model, &format!("{level}, rebuilt"));
    }
}

/// A RAID6 missing one parity chunk of a stripe keeps the other: a torn
/// write would leave it disagreeing with the data, so the write is
/// journaled as any degraded write is (only where no parity is left is
/// the data written alone).
#[test]
fn a_raid6_stripe_with_one_parity_chunk_left_is_journaled() {
    let tag = "alone-one-left";
    let drives: Vec<MemberRef> = (0..5)
        .map(|i| Arc::new(support::array::sim_drive(format!("sim:{tag}{i}"), DATA)) as MemberRef)
        .collect();
    let a = support::array::create_shared(Level::Raid6, drives, tag, CHUNK);
    let mut model = vec![0u8; a.capacity() as usize];
    a.write(0, &AlignedBuf::new(4096)).unwrap();
    a.fail_slot(1, "test");
    let g = a.geometry();
    let (nd, sdb) = (g.data_chunks(), g.stripe_data_bytes());
    let rows: Vec<u64> = (0..a.capacity() / sdb)
        .filter(|&s| g.stripe_map(s).members[nd..].contains(&1))
        .take(4)
        .collect();
    assert_eq!(rows.len(), 4);
    for (k, &s) in rows.iter().enumerate() {
        let (_, _, records) = write(&a, None, &mut model, s * sdb + 4096, 4096, k as u64);
        assert_eq!(
            records, 1,
            "stripe {s}, one parity chunk left: not journaled"
        );
    }
    reads_back(&a, &model, "raid6, one parity chunk missing");
}

/// A member that, once armed, cuts the power of every member in `all`
/// (each losing the writes it had not flushed) as a write of its
/// superblock reaches it: the cut lands in the middle of a save of the
/// array's metadata, after the members saved before this one.
struct CutAtItsSuperblock {
    inner: Arc<FaultyMember>,
    all: Vec<Arc<FaultyMember>>,
    armed: AtomicBool,
}

impl Member for CutAtItsSuperblock {
    fn identity(&self) -> &str {
        self.inner.identity()
    }
    fn device_key(&self) -> DeviceKey {
        self.inner.device_key()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if offset < BITMAP_OFFSET && self.armed.swap(false, Ordering::SeqCst) {
            FaultyMember::power_cut_together(&self.all)?;
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.write_zeroes(offset, len)
    }
}

/// A rebuild reads a stripe's data to compute its parity, and the
/// metadata then says the parity is in sync: the data it read must be
/// durable first. A write to a stripe whose parity is all missing takes
/// no journal record, so it may still sit in its drive's cache when the
/// rebuild reads it. Here a RAID6 missing both parity members of a stripe
/// has one of them replaced, and before its rebuild reaches the stripe,
/// the stripe takes such a write; the power goes while the
/// rebuild's end is saved, after some members saved it and before the
/// written member did (it loses its unflushed write, unless the rebuild
/// flushed it). Started again, still missing the other parity member, the
/// array loses another data member: that member's block, never written,
/// must read back as it was (recovered from the rebuilt parity and the
/// data on disk). Without the flush before the save it reads back as data
/// nobody wrote.
#[test]
fn a_rebuild_saves_no_parity_computed_from_data_a_cut_can_take_back() {
    const ROWS: u64 = 16;
    let tag = "alone-cut";
    let m = support::array::Members::ram(5, ROWS * CHUNK, &format!("{tag}-"));
    // The last stripe, which the rebuild reaches last.
    let row = ROWS - 1;
    let probe = raid_core::layout::Geometry::new(Level::Raid6, 5, CHUNK, ROWS * CHUNK).unwrap();
    let map = probe.stripe_map(row);
    let (p, q) = (map.members[3], map.members[4]);
    // The written chunk on the data member saved last (metadata is saved
    // in slot order), the lost one on another.
    let (at, d) = (0..3)
        .map(|i| (i, map.members[i]))
        .max_by_key(|&(_, s)| s)
        .unwrap();
    let (lost_at, lost) = (0..3)
        .map(|i| (i, map.members[i]))
        .find(|&(i, _)| i != at)
        .unwrap();
    let new_p = Arc::new(FaultyMember::new(Arc::new(
        raid_core::member::RamMember::new(format!("ram:{tag}-new"), MIN_DATA_OFFSET + ROWS * CHUNK),
    )));
    let mut all = m.faulty.clone();
    all.push(new_p.clone());
    let cutter = Arc::new(CutAtItsSuperblock {
        inner: m.faulty[d].clone(),
        all: all.clone(),
        armed: AtomicBool::new(false),
    });
    let mut refs = m.refs();
    refs[d] = cutter.clone();
    let a = support::array::create_shared(Level::Raid6, refs, tag, CHUNK);
    assert_eq!(a.geometry().stripe_map(row).members, map.members);
    let initial: Vec<u8> = (0..a.capacity()).map(|i| (i * 7 % 251) as u8).collect();
    a.write(0, &initial).unwrap();
    a.flush().unwrap();
    a.fail_slot(q, "test");
    a.fail_slot(p, "test");
    a.replace(p, new_p.clone()).unwrap();
    for f in &all {
        f.track_power_cut();
    }
    let sdb = a.geometry().stripe_data_bytes();
    // The stripe's parity is all missing (one member failed, the other
    // replaced and not yet rebuilt): its data alone, with no record, in
    // the drive's cache. Nothing flushes that drive before the rebuild's
    // end is saved (no position saved before the end).
    let records = a.io_stats().journal_records;
    a.write(row * sdb + at as u64 * CHUNK, &[0xEE; 4096])
        .unwrap();
    assert_eq!(
        a.io_stats().journal_records,
        records,
        "the write was journaled"
    );
    cutter.armed.store(true, Ordering::SeqCst);
    let opts = raid_core::array::RebuildOptions {
        checkpoint_every: Duration::from_secs(3600),
        ..Default::default()
    };
    let _ = a.rebuild(p, &opts, &AtomicBool::new(false));
    assert!(
        !cutter.armed.load(Ordering::SeqCst),
        "the rebuild saved nothing: no cut"
    );
    drop(a);
    for f in &all {
        f.power_on();
    }
    let live: Vec<MemberRef> = (0..5)
        .filter(|&i| i != p && i != q)
        .map(|i| m.faulty[i].clone() as MemberRef)
        .chain([new_p.clone() as MemberRef])
        .collect();
    let a = Array::assemble(live).unwrap().array;
    let s = &a.slots()[p];
    assert!(
        s.state == SlotState::Active || s.rebuild_row > row,
        "the cut came before the rebuild's end was saved anywhere: the test proves nothing ({s:?})"
    );
    a.fail_slot(lost, "test");
    let off = row * sdb + lost_at as u64 * CHUNK;
    let mut got = vec![0u8; 4096];
    a.read(off, &mut got).unwrap();
    assert!(
        got[..] == initial[off as usize..off as usize + 4096],
        "a block nobody wrote reads back wrong: parity computed from a write the cut took back"
    );
}
