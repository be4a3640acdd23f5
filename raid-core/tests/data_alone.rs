//! Writes to a stripe whose parity chunks are all missing (a RAID5 missing
//! the member that holds its parity, a RAID6 missing both): its data
//! chunks' writes alone, on the blocking path and on the shards, with
//! nothing read and no journal record, where a degraded write to any other
//! stripe is journaled. Every block then reads back against a model, and
//! again after the rebuild, which scrubs clean.

use raid_core::array::Array;
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::MemberRef;
use raid_core::shard::Engine;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
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
