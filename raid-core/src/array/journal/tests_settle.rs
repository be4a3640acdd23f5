//! Which stripe writes go through the journal, and when their records
//! settle: a flush while a member is missing and with every member in
//! sync, a shard's write to a stripe with a record (or with a
//! parity-only record not yet durable in place), and a stripe whose
//! parity is all missing (written alone unless it has a record).

use super::format::{decode_head, BLOCK};
use super::tests::{array, array_over};
use super::*;

/// The first `n` stripes where slot `failed` holds a data chunk: a write
/// there while it is missing is journaled. (Where it holds the parity, the
/// write is its data alone: `Array::data_alone`.)
pub(super) fn journaled_rows(a: &Array, failed: usize, n: usize) -> Vec<u64> {
    let nd = a.geo.data_chunks();
    (0..)
        .filter(|&s| a.geo.stripe_map(s).members[..nd].contains(&failed))
        .take(n)
        .collect()
}

/// How a shard starts a 4 KiB write at `offset` (every member taking
/// the shards' I/O): on the shard, or sent to the blocking path.
fn shard_start(a: &Arc<Array>, offset: u64) -> crate::array::async_write::Start {
    crate::array::async_write::AsyncWrite::start(
        &crate::array::LocalArray::new(a),
        offset,
        AlignedBuf::new(4096),
        |_| true,
    )
}

/// The header on the first member still readable: its sequence.
fn header_seq(a: &Array, m: &[MemberRef]) -> u64 {
    let mut area = AlignedBuf::new(BLOCK as usize);
    let i = (0..m.len()).find(|&i| a.slots[i].state() != SlotState::Failed);
    m[i.unwrap()].read_at(&mut area, JOURNAL_OFFSET).unwrap();
    decode_head(&area, &a.uuid, a.data_offset).unwrap().0
}

/// While a slot is missing, a flush leaves the records to the ring's
/// checkpoints (it writes no header; the records stay in the chain, and a
/// replay of them, already in place, changes nothing); an orderly stop
/// settles them. With every slot in sync, a flush settles what is left.
#[test]
fn a_flush_settles_the_journal_only_with_every_slot_in_sync_or_at_a_stop() {
    let (a, m) = array("jflush");
    let j = a.journal.as_ref().unwrap();
    let live = || {
        let st = j.state.lock();
        st.next_seq - 1 - st.tail_seq
    };
    let sdb = a.geo.stripe_data_bytes();
    a.fail_slot(1, "test");
    let rows = journaled_rows(&a, 1, 3);
    for (k, &s) in rows.iter().enumerate() {
        a.write(s * sdb, &[0x30 + k as u8; 4096]).unwrap();
    }
    assert_eq!(live(), 3, "each degraded write journaled");
    a.flush().unwrap();
    assert_eq!(live(), 3, "a flush while degraded settles nothing");
    assert_eq!(header_seq(&a, &m), 0, "nor writes the header");
    assert!(a.journal_pending(rows[0]), "their stripes stay journaled");
    // What a crash now would replay: the records, in place already.
    assert_eq!(a.journal_recover().unwrap(), 3);
    for (k, &s) in rows.iter().enumerate() {
        let mut got = vec![0u8; 4096];
        a.read(s * sdb, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0x30 + k as u8), "stripe {s}");
    }
    a.write(rows[0] * sdb, &[0x40; 4096]).unwrap();
    a.flush().unwrap();
    assert_eq!(live(), 1);
    a.close().unwrap();
    assert_eq!(live(), 0, "a stop settles");
    assert_eq!(header_seq(&a, &m), 4, "and writes the header past them");

    // Every slot in sync, with records left (as a rebuild that wrote
    // through them leaves them): the next flush settles.
    let (a, m) = array("jflushwhole");
    let j = a.journal.as_ref().unwrap();
    for s in 0..2 {
        let seq = a.journal_stripe(s, 0, &[(0, &[7u8; 4096][..])]).unwrap();
        a.journal_write_done(seq);
    }
    assert!(a.journal_pending(1));
    a.flush().unwrap();
    let st = j.state.lock();
    assert_eq!((st.tail_seq, st.next_seq), (2, 3), "settled");
    drop(st);
    assert!(!a.journal_pending(1));
    assert_eq!(header_seq(&a, &m), 2);
}

/// With records of some stripes unsettled and every slot in sync (as a
/// rebuild leaves the rows it passed while degraded writes went on), a
/// shard's write to another stripe runs on the shard; one to a stripe with
/// a record goes to the blocking path, which journals it.
#[test]
fn a_shard_write_leaves_for_the_blocking_path_only_where_its_stripe_has_a_record() {
    use crate::array::async_write::Start;
    let (a, _m) = array("jshard");
    let a = Arc::new(a);
    a.fail_slot(1, "test");
    a.write(0, &[9u8; 4096]).unwrap();
    a.slots[1].set_state(SlotState::Active);
    assert!(a.journal_pending(0));
    let sdb = a.geo.stripe_data_bytes();
    let start = |offset| shard_start(&a, offset);
    assert!(
        matches!(start(5 * sdb), Start::Go(_)),
        "stripe 5: no record"
    );
    assert!(matches!(start(0), Start::Blocking(_)), "stripe 0: a record");
    // While the journal's lock is held (a record written alone), the
    // shard does not wait for it.
    let st = a.journal.as_ref().unwrap().state.lock();
    assert!(matches!(start(5 * sdb), Start::Blocking(_)));
    drop(st);
}

/// A stripe whose parity is all missing is written as its data alone
/// (`Array::data_alone`), but not while it has an unsettled record: a
/// replay after a crash would write that record's older columns over the
/// new ones. Such a write goes to the blocking path, not a shard, and is
/// journaled after the record, so a replay leaves the newer data.
#[test]
fn a_stripe_with_a_record_is_journaled_though_its_parity_is_all_missing() {
    use crate::array::async_write::{AsyncWrite, Start};
    let (a, _m) = array("jalone");
    let a = Arc::new(a);
    let j = a.journal.as_ref().unwrap();
    let live = || {
        let st = j.state.lock();
        st.next_seq - 1 - st.tail_seq
    };
    // The first write marks the array dirty (a shard leaves that to the
    // blocking path).
    a.write(0, &[1u8; 4096]).unwrap();
    let (s, sdb) = (2u64, a.geo.stripe_data_bytes());
    let map = a.geo.stripe_map(s);
    // An older record of the stripe's first chunk, in place, unsettled.
    let seq = a.journal_stripe(s, 0, &[(0, &[7u8; 4096][..])]).unwrap();
    a.journal_write_done(seq);
    a.fail_slot(map.members[a.geo.data_chunks()], "test");
    assert!(a.journal_pending(s));
    let on_shard = AsyncWrite::start(
        &crate::array::LocalArray::new(&a),
        s * sdb,
        AlignedBuf::new(4096),
        |_| true,
    );
    assert!(
        matches!(on_shard, Start::Blocking(_)),
        "a shard wrote a stripe with a record alone"
    );
    let before = live();
    a.write(s * sdb, &[0x55; 4096]).unwrap();
    assert_eq!(live(), before + 1, "the write was not journaled");
    // What a crash now would replay: both records, in order.
    a.journal_recover().unwrap();
    let mut got = vec![0u8; 4096];
    a.read(s * sdb, &mut got).unwrap();
    assert!(
        got.iter().all(|&b| b == 0x55),
        "the older record's columns replayed over the newer write"
    );
}

/// A stripe whose parity-only record (`Kind::Parity`) may not be durable
/// in place yet: a shard's degraded write there goes to the blocking
/// path, which recovers the missing chunk and takes a parity-only record
/// too (a record of every column would wait for a flush of every member,
/// `journal_parity_barrier`); one to another degraded stripe stays on
/// the shard. After the next flush (their in-place writes durable), the
/// stripe's writes stay on the shard again.
#[test]
fn a_shard_write_leaves_for_the_blocking_path_where_a_parity_only_record_is_unflushed() {
    use crate::array::async_write::Start;
    let (a, _m) = array("jpshard");
    let a = Arc::new(a);
    let nd = a.geo.data_chunks();
    let sdb = a.geo.stripe_data_bytes();
    a.fail_slot(1, "test");
    let rows = journaled_rows(&a, 1, 2);
    // A block of a chunk present in stripe `s`.
    let present = |s: u64| {
        let map = a.geo.stripe_map(s);
        let i = (0..nd).find(|&i| map.members[i] != 1).unwrap();
        s * sdb + i as u64 * a.geo.chunk
    };
    let start = |offset| shard_start(&a, offset);
    a.write(rows[0] * sdb, &vec![5u8; sdb as usize]).unwrap();
    assert_eq!(a.activity.journal_parity_records.get(), 1);
    assert!(
        matches!(start(present(rows[1])), Start::Go(_)),
        "another stripe"
    );
    assert!(
        matches!(start(present(rows[0])), Start::Blocking(_)),
        "the stripe of the parity-only record"
    );
    // There, the blocking path takes a parity-only record too.
    a.write(present(rows[0]), &[6u8; 4096]).unwrap();
    assert_eq!(a.activity.journal_parity_records.get(), 2);
    assert_eq!(a.activity.journal_parity_barriers.get(), 0);
    assert!(matches!(start(present(rows[0])), Start::Blocking(_)));
    // A client's flush, which settles nothing while a member is
    // missing, makes both durable in place: the shard's again.
    a.flush().unwrap();
    assert!(a.journal_pending(rows[0]));
    assert!(
        matches!(start(present(rows[0])), Start::Go(_)),
        "flushed since"
    );
}

/// Where a write to a stripe with a parity-only record not yet durable
/// in place cannot take a parity-only record itself (here the array is
/// whole again, as a rebuild that wrote through its records leaves it,
/// so nothing exists only as parity), its record of every column waits
/// for a flush of every member: its parity is computed from that
/// record's in-place writes (`journal_parity_barrier`), which a cut could
/// otherwise take back while keeping this record. Then the power goes,
/// and the array starts with that member failed, as its metadata says:
/// the chunk it held, recovered, must read back as the first write left
/// it. Each stripe of a rotation on arrays of their own, so that which
/// drives a record's own flush reaches varies; two writes each, one
/// flush.
#[test]
fn a_record_of_every_column_after_a_parity_only_one_flushes_first() {
    use crate::member::{FaultyMember, RamMember};
    let mut rows_seen = 0;
    for row in 0..8u64 {
        let f: Vec<Arc<FaultyMember>> = (0..4)
            .map(|i| {
                let ram: MemberRef = Arc::new(RamMember::new(
                    format!("ram:jpbar{row}-{i}"),
                    crate::metadata::MIN_DATA_OFFSET + (1 << 20),
                ));
                Arc::new(FaultyMember::new(ram))
            })
            .collect();
        let refs = f.iter().map(|m| m.clone() as MemberRef).collect();
        let a = array_over(&format!("jpbar{row}"), refs, None);
        let (sdb, chunk) = (a.geo.stripe_data_bytes(), a.geo.chunk);
        let map = a.geo.stripe_map(row);
        let Some(i) = (0..a.geo.data_chunks()).find(|&i| map.members[i] == 1) else {
            continue;
        };
        rows_seen += 1;
        a.write(0, &vec![1u8; a.capacity() as usize]).unwrap();
        a.flush().unwrap();
        a.fail_slot(1, "test");
        for m in &f {
            m.track_power_cut();
        }
        a.write(row * sdb, &vec![5u8; sdb as usize]).unwrap();
        assert_eq!(a.activity.journal_parity_records.get(), 1);
        a.slots[1].set_state(SlotState::Active);
        // Its chunk as the rebuild would have left it.
        f[1].write_at(&vec![5u8; chunk as usize], a.data_offset + row * chunk)
            .unwrap();
        let other = (0..a.geo.data_chunks()).find(|&k| k != i).unwrap() as u64;
        for k in 0..2u8 {
            a.write(row * sdb + other * chunk, &[6 + k; 4096]).unwrap();
        }
        assert_eq!(a.activity.journal_parity_records.get(), 1);
        assert_eq!(a.activity.journal_parity_barriers.get(), 1, "row {row}");
        drop(a);
        FaultyMember::power_cut_together(&f).unwrap();
        for m in &f {
            m.power_on();
        }
        let live: Vec<MemberRef> = [0, 2, 3]
            .iter()
            .map(|&k| f[k].clone() as MemberRef)
            .collect();
        let a = Array::assemble(live).unwrap().array;
        let mut got = vec![0u8; chunk as usize];
        a.read(row * sdb + i as u64 * chunk, &mut got).unwrap();
        assert!(
            got.iter().all(|&b| b == 5),
            "row {row}: the missing chunk reads back as bytes nobody wrote"
        );
    }
    assert!(rows_seen >= 4);
}
