//! Degraded writes that know the new contents of every chunk that exists
//! only as parity (a whole stripe, or a reconstruct-write over the missing
//! chunk) on an array that can lose no more: their journal record carries
//! those chunks alone, and replay recomputes the parity from the data as
//! it lies. What each write records, what a power cut leaves, and what a
//! later write to such a stripe records.

use raid_core::array::Array;
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{FaultyMember, MemberRef};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod support;

const CHUNK: u64 = 64 << 10;
const ROWS: u64 = 16;
const BLOCK: u64 = 4096;

/// An array of `level` over `n` members in memory, written whole and
/// flushed, with the slots holding data chunks `lost` of stripe `row`
/// failed. Returns the members, the array and the image.
fn degraded(
    level: Level,
    n: usize,
    row: u64,
    lost: &[usize],
    tag: &str,
) -> (support::array::Members, Array, Vec<u8>) {
    let m = support::array::Members::ram(n, ROWS * CHUNK, tag);
    let (a, image) = support::array::written_whole(level, &m, CHUNK);
    let map = a.geometry().stripe_map(row);
    for &i in lost {
        a.fail_slot(map.members[i], "test");
    }
    (m, a, image)
}

/// Writes `len` random bytes at `off`, the model following; returns the
/// journal's (records, bytes, parity-only records) it cost.
fn write(a: &Array, model: &mut [u8], off: u64, len: u64, seed: u64) -> (u64, u64, u64) {
    let counts = |a: &Array| {
        let io = a.io_stats();
        (
            io.journal_records,
            io.journal_bytes,
            io.journal_parity_records,
        )
    };
    let mut b = AlignedBuf::new(len as usize);
    SmallRng::seed_from_u64(seed).fill(&mut b[..]);
    model[off as usize..(off + len) as usize].copy_from_slice(&b);
    let before = counts(a);
    a.write(off, &b).unwrap();
    let after = counts(a);
    (after.0 - before.0, after.1 - before.1, after.2 - before.2)
}

fn reads_back(a: &Array, model: &[u8], what: &str) {
    let mut got = vec![0u8; a.capacity() as usize];
    a.read(0, &mut got).unwrap();
    assert!(got == model, "{what}: a block reads back wrong");
}

/// What each degraded write records: one record of the missing chunk
/// alone for a whole stripe, for a write over the missing chunk and
/// beside it, and for any write to a stripe whose parity-only record may
/// not be durable in place yet (the missing chunk recovered, rather than
/// a record of every column that would wait for a flush); every column
/// for one whose every column is no larger (the missing chunk's blocks
/// alone: the parity's), for a stripe with such a record unsettled, and
/// for a RAID6 with a chunk of margin left. Everything reads back, the
/// member rebuilt, and a scrub finds the parity right.
#[test]
fn a_write_that_knows_the_missing_chunk_records_it_alone() {
    let row = 3;
    let (m, a, mut model) = degraded(Level::Raid5, 4, row, &[1], "prec5-");
    let sdb = a.geometry().stripe_data_bytes();
    let at = row * sdb;
    // The whole stripe: one chunk recorded, not three columns.
    let cost = write(&a, &mut model, at, sdb, 1);
    assert_eq!(cost, (1, BLOCK + CHUNK, 1), "a whole stripe");
    // A block of chunk 0, not the missing one, while that record may not
    // be in place on disk: the missing chunk's block, recovered, alone.
    let cost = write(&a, &mut model, at, BLOCK, 2);
    assert_eq!(cost, (1, 2 * BLOCK, 1), "a block beside the missing chunk");
    // Two other stripes whose chunk 1 is on the failed member. In one,
    // the missing chunk whole and two blocks of chunk 2 (a
    // reconstruct-write of the chunk's columns): the missing chunk alone,
    // not chunk 2's columns and the parity's.
    let g = a.geometry();
    let failed = g.stripe_map(row).members[1];
    let others: Vec<u64> = (0..g.rows())
        .filter(|&s| s != row && g.stripe_map(s).members[1] == failed)
        .take(2)
        .collect();
    let cost = write(
        &a,
        &mut model,
        others[0] * sdb + CHUNK,
        CHUNK + 2 * BLOCK,
        4,
    );
    assert_eq!(
        cost,
        (1, BLOCK + CHUNK, 1),
        "the missing chunk and beside it"
    );
    // In the other, two blocks of the missing chunk alone: one column
    // either way (the parity's), so the record of every column.
    let cost = write(&a, &mut model, others[1] * sdb + CHUNK, 2 * BLOCK, 12);
    assert_eq!(cost, (1, 3 * BLOCK, 0), "two blocks of the missing chunk");
    // That stripe whole, with that record unsettled: every column (a
    // parity-only record replayed after it would not write back the data
    // it overwrites).
    let cost = write(&a, &mut model, others[1] * sdb, sdb, 3);
    assert_eq!(
        cost,
        (1, BLOCK + 3 * CHUNK, 0),
        "after a record of every column"
    );
    assert_eq!(a.io_stats().journal_parity_barriers, 0);
    reads_back(&a, &model, "raid5");
    let new = support::array::Members::ram(1, ROWS * CHUNK, "prec5-new");
    support::power_cut::rebuild_and_scrub(&a, &model, |_| new.faulty[0].clone(), "raid5");

    // RAID6 missing one data member: a chunk of margin left, so every
    // column; missing two, the two chunks alone.
    let (_m6, a, mut model) = degraded(Level::Raid6, 5, row, &[0], "prec6a-");
    let sdb = a.geometry().stripe_data_bytes();
    let cost = write(&a, &mut model, row * sdb, sdb, 5);
    assert_eq!(cost, (1, BLOCK + 4 * CHUNK, 0), "raid6 missing one");
    reads_back(&a, &model, "raid6 missing one");
    let (_m6, a, mut model) = degraded(Level::Raid6, 5, row, &[0, 2], "prec6b-");
    let cost = write(&a, &mut model, row * sdb, sdb, 6);
    assert_eq!(cost, (1, BLOCK + 2 * CHUNK, 1), "raid6 missing two");
    reads_back(&a, &model, "raid6 missing two");
    let new = support::array::Members::ram(2, ROWS * CHUNK, "prec6b-new");
    let slots = [
        a.geometry().stripe_map(row).members[0],
        a.geometry().stripe_map(row).members[2],
    ];
    support::power_cut::rebuild_and_scrub(
        &a,
        &model,
        |s| new.faulty[slots.iter().position(|&x| x == s).unwrap()].clone(),
        "raid6 missing two",
    );
    drop(m);
}

/// Starts the array again over `m`'s members but the failed `out`, after
/// a power cut that hit them all.
fn after_a_cut(m: &support::array::Members, out: &[usize]) -> Array {
    FaultyMember::power_cut_together(&m.faulty).unwrap();
    for f in &m.faulty {
        f.power_on();
    }
    let live: Vec<MemberRef> = (0..m.faulty.len())
        .filter(|i| !out.contains(i))
        .map(|i| m.faulty[i].clone() as MemberRef)
        .collect();
    Array::assemble(live).unwrap().array
}

/// A level, its members, the data chunks of the stripe missing, the
/// journal's ring if limited, and the records a whole stripe takes.
type Case = (Level, usize, &'static [usize], Option<u64>, u64);

/// A whole-stripe write torn by a power cut: one parity drive flushed
/// it, the data drives did not. The missing chunks, recovered from that
/// parity and the old data, would read back as neither their old bytes
/// nor their new; replay of the write's record makes the parity agree
/// with the data as it lies, and the missing chunks read back new. On a
/// RAID5 missing a member, a RAID6 missing two (P and Q recomputed), and
/// a RAID5 whose ring is small enough that the record is cut in three.
#[test]
fn a_torn_whole_stripe_write_reads_back_its_missing_chunks_whole() {
    let row = 2;
    let cases: [Case; 3] = [
        (Level::Raid5, 4, &[1], None, 1),
        (Level::Raid6, 5, &[0, 2], None, 1),
        (Level::Raid5, 4, &[1], Some(32 << 10), 3),
    ];
    for (k, (level, n, lost, ring, records)) in cases.into_iter().enumerate() {
        let what = format!("{level:?} missing {lost:?}, ring {ring:?}");
        let (m, a, image) = degraded(level, n, row, lost, &format!("ptorn{k}-"));
        if let Some(bytes) = ring {
            a.limit_journal_ring(bytes);
        }
        let map = a.geometry().stripe_map(row);
        let nd = a.geometry().data_chunks();
        let sdb = a.geometry().stripe_data_bytes();
        for f in &m.faulty {
            f.track_power_cut();
        }
        let mut model = image.clone();
        let cost = write(&a, &mut model, row * sdb, sdb, 7);
        assert_eq!(cost.2, records, "{what}: parity-only records");
        use raid_core::member::Member;
        m.faulty[map.members[n - 1]].flush().unwrap();
        drop(a);
        let out: Vec<usize> = lost.iter().map(|&i| map.members[i]).collect();
        let a = after_a_cut(&m, &out);
        let mut got = vec![0u8; a.capacity() as usize];
        a.read(0, &mut got).unwrap();
        for &i in lost {
            let at = (row * sdb + i as u64 * CHUNK) as usize;
            let chunk = at..at + CHUNK as usize;
            assert!(
                got[chunk.clone()] == model[chunk],
                "{what}: missing chunk {i} reads back other than written"
            );
        }
        for b in (0..got.len()).step_by(BLOCK as usize) {
            let r = b..b + BLOCK as usize;
            assert!(
                got[r.clone()] == image[r.clone()] || got[r.clone()] == model[r.clone()],
                "{what}: block at {b} reads back as neither old nor new"
            );
        }
        assert!(nd > lost.len());
        let new = support::array::Members::ram(lost.len(), ROWS * CHUNK, &format!("ptorn{k}-new"));
        support::power_cut::rebuild_and_scrub(
            &a,
            &got,
            |s| new.faulty[out.iter().position(|&x| x == s).unwrap()].clone(),
            &what,
        );
    }
}

/// A write to a stripe whose parity-only record's in-place writes may
/// still be in the drives' caches: a record of every column would hold a
/// parity computed from them, which a cut could take back while keeping
/// that record; replay would then write a parity made for data no longer
/// there, and the missing chunk would read back as bytes nobody wrote.
/// Such a write recovers the missing chunk and takes a parity-only record
/// too (or, where it cannot, flushes every member first). Each stripe of
/// a rotation in its own array, so that which drives a record's own flush
/// reaches varies.
#[test]
fn a_write_after_a_parity_only_record_leaves_the_missing_chunk_whole() {
    for row in 0..4 {
        let tag = format!("pbar{row}-");
        let (m, a, image) = degraded(Level::Raid5, 4, row, &[1], &tag);
        let map = a.geometry().stripe_map(row);
        let sdb = a.geometry().stripe_data_bytes();
        for f in &m.faulty {
            f.track_power_cut();
        }
        let mut model = image.clone();
        assert_eq!(write(&a, &mut model, row * sdb, sdb, 8).2, 1);
        write(&a, &mut model, row * sdb, BLOCK, 9);
        drop(a);
        let a = after_a_cut(&m, &[map.members[1]]);
        let mut got = vec![0u8; CHUNK as usize];
        a.read(row * sdb + CHUNK, &mut got).unwrap();
        let missing = (row * sdb + CHUNK) as usize..(row * sdb + 2 * CHUNK) as usize;
        assert!(
            got[..] == model[missing.clone()] || got[..] == image[missing],
            "row {row}: the missing chunk reads back as neither old nor new"
        );
    }
}

/// A stripe with a record of every column unsettled takes no parity-only
/// record: replay writes that record's columns as they are, over whatever
/// a later write put there, and a parity-only record after it would not
/// write that data back. Here the later write is flushed before the cut,
/// so it must read back whole.
#[test]
fn a_flushed_whole_stripe_write_survives_the_replay_of_an_older_record() {
    let row = 5;
    let (m, a, _) = degraded(Level::Raid5, 4, row, &[1], "pafter-");
    let map = a.geometry().stripe_map(row);
    let sdb = a.geometry().stripe_data_bytes();
    let mut model = vec![0u8; a.capacity() as usize];
    a.read(0, &mut model).unwrap();
    assert_eq!(write(&a, &mut model, row * sdb, BLOCK, 10).2, 0);
    write(&a, &mut model, row * sdb, sdb, 11);
    a.flush().unwrap();
    for f in &m.faulty {
        f.track_power_cut();
    }
    drop(a);
    let a = after_a_cut(&m, &[map.members[1]]);
    reads_back(&a, &model, "after the replay");
}
