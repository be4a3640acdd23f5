//! The journal's decoder fuzzed, and its replay rules one by one.

use super::format::{decode_head, decode_record, sealed_records, UUID_AT};
use super::format::{encode_head_spread, BLOCK};
use super::format::{PARITY_REC_MAGIC, REC_MAGIC};
use super::*;
use crate::member::RamMember;

/// The bytes of a record: header block, then each entry's columns.
fn encode_record(r: &Record, uuid: &Uuid) -> AlignedBuf {
    let entries: Vec<(usize, usize, &[u8])> =
        r.entries.iter().map(|(i, s, d)| (*i, *s, &d[..])).collect();
    let mut u = Unsealed::new(r.kind, r.stripe, r.lo, r.hi, &entries, uuid);
    u.seal(r.seq);
    u.b
}

fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Seals a record block as `encode_record` would: magic (of either
/// kind), UUID and CRC over whatever the fields say, so the decoder's own
/// checks are what is tested, not the checksum.
fn seal(b: &mut [u8], magic: &[u8; 8], uuid: &Uuid, payload_len: usize) {
    b[..8].copy_from_slice(magic);
    b[UUID_AT..UUID_AT + 16].copy_from_slice(&uuid.0);
    let end = (BLOCK as usize + payload_len).min(b.len());
    let mut crc = crc32c::crc32c(&b[..4092]);
    crc = crc32c::crc32c_append(crc, &b[BLOCK as usize..end]);
    b[4092..4096].copy_from_slice(&crc.to_le_bytes());
}

/// Random record headers (extreme counts and column ranges among
/// them), sealed with a valid checksum, and random byte soup: decoding
/// never panics, and what it accepts lies inside the buffer with
/// columns that make sense. RAID_FUZZ_ITERS for a longer run by hand.
#[test]
fn random_records_never_panic_and_accepted_ones_are_in_bounds() {
    let uuid = Uuid([7; 16]);
    let mut next = xorshift(0x5EED_0F10_0BAD);
    let iters: u64 = std::env::var("RAID_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let mut buf = vec![0u8; 3 * BLOCK as usize];
    let mut accepted = 0;
    for i in 0..iters {
        for c in buf[..BLOCK as usize].chunks_mut(8) {
            c.copy_from_slice(&next().to_le_bytes());
        }
        let len = (next() % buf.len() as u64) as usize;
        if i % 4 != 0 {
            // Plausible fields, sometimes at their extremes.
            let pick = |n: u64, r: u64| match r % 5 {
                0 => 0,
                1 => u64::MAX,
                2 => n,
                _ => r % (n + 1),
            };
            let (a, b2, c) = (next(), next(), next());
            let (lo, hi) = (pick(8192, a), pick(8192, b2));
            let count = pick(MAX_ENTRIES as u64 + 1, c);
            buf[24..32].copy_from_slice(&lo.to_le_bytes());
            buf[32..40].copy_from_slice(&hi.to_le_bytes());
            buf[40..48].copy_from_slice(&count.to_le_bytes());
            // The checksum over the payload the fields claim, where
            // that is a sane size; anything else is sealed short.
            let payload = hi
                .checked_sub(lo)
                .and_then(|w| w.checked_mul(count))
                .unwrap_or(0)
                .min(2 * BLOCK) as usize;
            let magic = [REC_MAGIC, PARITY_REC_MAGIC][(i % 8 == 1) as usize];
            seal(&mut buf, magic, &uuid, payload);
        }
        if let Some((r, n)) = decode_record(&buf[..len], &uuid) {
            accepted += 1;
            assert!(n <= len, "a record longer than its buffer was accepted");
            assert!(r.hi > r.lo && !r.entries.is_empty() && r.entries.len() <= MAX_ENTRIES);
            let width = (r.hi - r.lo) as usize;
            assert!(r.entries.iter().all(|(_, _, d)| d.len() == width));
            assert_eq!(n, BLOCK as usize + r.entries.len() * width);
        }
        // Another array's UUID is never accepted.
        assert!(decode_record(&buf[..len], &Uuid([8; 16])).is_none());
    }
    assert!(
        accepted > 0,
        "the fuzzer never got a record past the checks"
    );
}

/// A record of one entry: 4 KiB of `byte` for chunk 0 of `stripe`, on the
/// slot the layout puts it.
fn block_record(a: &Array, seq: u64, stripe: u64, byte: u8) -> Record {
    Record {
        kind: Kind::Columns,
        seq,
        stripe,
        lo: 0,
        hi: 4096,
        entries: vec![(0, a.geo.stripe_map(stripe).members[0], vec![byte; 4096])],
    }
}

pub(super) fn array(tag: &str) -> (Array, Vec<MemberRef>) {
    array_at(tag, None)
}

/// `array`, its data (and so its journal's end) at `data_offset`.
fn array_at(tag: &str, data_offset: Option<u64>) -> (Array, Vec<MemberRef>) {
    let start = data_offset.unwrap_or(crate::metadata::MIN_DATA_OFFSET);
    let m: Vec<MemberRef> = (0..4)
        .map(|i| Arc::new(RamMember::new(format!("ram:{tag}{i}"), start + (1 << 20))) as MemberRef)
        .collect();
    let a = array_over(tag, m.clone(), data_offset);
    assert_eq!(a.data_offset, start);
    (a, m)
}

/// A RAID5 named `tag` over `members`, at chunk 64 KiB.
pub(super) fn array_over(tag: &str, members: Vec<MemberRef>, data_offset: Option<u64>) -> Array {
    let opts = CreateOptions {
        name: tag.into(),
        level: Level::Raid5,
        chunk: 64 * 1024,
        data_offset,
    };
    Array::create(members, vec![], opts).unwrap()
}

/// Records with this array's UUID and a valid checksum, in the chain,
/// whose fields do not fit the layout (a stripe past the end, columns
/// past the chunk, a slot the layout does not put that chunk on, a
/// chunk twice, a parity chunk in a record of the data that exists only
/// as parity) are not replayed, nor anything after them.
#[test]
fn records_that_do_not_fit_the_layout_are_not_replayed() {
    let (a, m) = array("jfit");
    let rows = a.geo.rows();
    let map = a.geo.stripe_map(0);
    let (c, p) = (Kind::Columns, Kind::Parity);
    let bad = [
        (c, rows, 0, 4096, vec![(0, map.members[0])]),
        (c, u64::MAX / 4096, 0, 4096, vec![(0, map.members[0])]),
        (c, 0, 0, a.geo.chunk + 4096, vec![(0, map.members[0])]),
        (c, 0, 0, 4096, vec![(0, map.members[1])]),
        (
            c,
            0,
            0,
            4096,
            vec![(0, map.members[0]), (0, map.members[0])],
        ),
        (c, 0, 0, 4096, vec![(9, 0)]),
        (p, 0, 0, 4096, vec![(3, map.members[3])]),
        (p, rows, 0, 4096, vec![(0, map.members[0])]),
    ];
    for (kind, stripe, lo, hi, entries) in bad {
        let width = (hi - lo) as usize;
        let rec = Record {
            kind,
            seq: 1,
            stripe,
            lo,
            hi,
            entries: entries
                .iter()
                .map(|&(i, s)| (i, s, vec![0xEE; width]))
                .collect(),
        };
        // Then a good record after it: the chain is broken, so not it either.
        let good = block_record(&a, 2, 0, 0xEE);
        let b1 = encode_record(&rec, &a.uuid);
        let b2 = encode_record(&good, &a.uuid);
        for member in &m {
            member
                .write_at(&encode_head(0, RECORDS, &a.uuid), JOURNAL_OFFSET)
                .unwrap();
            member.write_at(&b1, RECORDS).unwrap();
            member.write_at(&b2, RECORDS + b1.len() as u64).unwrap();
        }
        assert_eq!(
            a.journal_recover().unwrap(),
            0,
            "stripe {stripe} cols {lo}..{hi} {entries:?}"
        );
    }
    let mut got = vec![1u8; 4096];
    a.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 0), "a misfit record was written");
    // The same good record as the first of the chain is replayed.
    let good = block_record(
        &a,
        a.journal.as_ref().unwrap().state.lock().tail_seq + 1,
        0,
        0xEE,
    );
    let rec = encode_record(&good, &a.uuid);
    for member in &m {
        member.write_at(&rec, RECORDS).unwrap();
        // What follows it is the end of the ring.
        member
            .write_at(
                &AlignedBuf::new(2 * BLOCK as usize),
                RECORDS + rec.len() as u64,
            )
            .unwrap();
    }
    assert_eq!(a.journal_recover().unwrap(), 1);
    a.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 0xEE));
}

/// A record only a rejoining member holds (written to it alone before
/// a crash, never put in place, its sequence number reused since) is
/// not replayed: recovery reads the journals of members in sync only,
/// and admitting a member empties its ring.
#[test]
fn a_rejoining_members_old_records_are_not_replayed() {
    let (a, m) = array("jrejoin");
    let map = a.geo.stripe_map(0);
    let tail = a.journal.as_ref().unwrap().state.lock().tail_seq;
    let stale = block_record(&a, tail + 1, 0, 0xEE);
    let x = map.members[1];
    m[x].write_at(&encode_record(&stale, &a.uuid), RECORDS)
        .unwrap();
    a.fail_slot(x, "test");
    a.re_add(m[x].clone()).unwrap();
    assert_eq!(
        a.journal_recover().unwrap(),
        0,
        "a rebuilding member's ring was replayed"
    );
    let mut got = vec![1u8; 4096];
    a.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0));
    // Once admitted, its ring holds nothing to chain on.
    m[x].write_at(&encode_record(&stale, &a.uuid), RECORDS)
        .unwrap();
    a.journal_admit(&m[x]).unwrap();
    let mut area = AlignedBuf::new(2 * BLOCK as usize);
    m[x].read_at(&mut area, JOURNAL_OFFSET).unwrap();
    assert!(decode_record(&area[BLOCK as usize..], &a.uuid).is_none());
}

/// A crash can leave a record durable past a gap (a group's records
/// reach the members in any order): not replayed then, it must never
/// chain on later, when records written after the restart fill the
/// places before it with the sequence numbers before its own.
#[test]
fn a_record_left_past_a_gap_never_chains_on_after_a_restart() {
    let (a, m) = array("jgap");
    let map = a.geo.stripe_map(0);
    let tail = a.journal.as_ref().unwrap().state.lock().tail_seq;
    // The group tail+1..=tail+3, of which only the last is durable,
    // on one member, at the place it took after the other two.
    let left = encode_record(&block_record(&a, tail + 3, 0, 0xEE), &a.uuid);
    let size = left.len() as u64;
    m[map.members[1]]
        .write_at(&left, RECORDS + 2 * size)
        .unwrap();
    assert_eq!(a.journal_recover().unwrap(), 0);
    // After the restart, two records of the same size, then a crash
    // before any settle.
    for (stripe, byte) in [(1, 0x11u8), (2, 0x22)] {
        let seq = a
            .journal_stripe(stripe, 0, &[(0, &[byte; 4096][..])])
            .unwrap();
        a.journal_write_done(seq);
    }
    assert_eq!(
        a.journal_recover().unwrap(),
        2,
        "the record left past the gap chained on to the new ones"
    );
    let mut got = vec![1u8; 4096];
    a.read(0, &mut got).unwrap();
    assert!(
        got.iter().all(|&b| b == 0),
        "a record nobody acknowledged was put in place"
    );
}

/// Records an earlier version wrote (no array UUID) and had not put in
/// place stop the start with what to do, rather than being dropped.
#[test]
fn records_owed_by_an_earlier_version_stop_the_start() {
    let (a, m) = array("jlegacy");
    let none = Uuid([0; 16]);
    let rec = block_record(&a, 8, 0, 0xEE);
    for member in &m {
        member
            .write_at(&encode_head_spread(7, RECORDS, &none), JOURNAL_OFFSET)
            .unwrap();
        member
            .write_at(&encode_record(&rec, &none), RECORDS)
            .unwrap();
    }
    let e = a.journal_recover().unwrap_err().to_string();
    assert!(
        e.contains("earlier version") && e.contains("stop it cleanly"),
        "{e}"
    );
    // Settled (nothing past the tail): no objection.
    for member in &m {
        member
            .write_at(&encode_head_spread(8, RECORDS, &none), JOURNAL_OFFSET)
            .unwrap();
    }
    assert_eq!(a.journal_recover().unwrap(), 0);
}

/// The ring is reused in place: a checkpoint frees the space of records
/// already in place while later ones stay, and a record that does not fit
/// before the area's end goes to its start. After a crash, replay follows
/// the chain from the header's place across that wrap, and puts back
/// exactly the records not known to be in place. The same with the ring
/// of an array whose data starts further in.
#[test]
fn the_ring_is_reclaimed_in_place_and_replayed_across_its_wrap() {
    ring_reclaimed_and_replayed_across_its_wrap(None);
    ring_reclaimed_and_replayed_across_its_wrap(Some(3 << 20));
}

fn ring_reclaimed_and_replayed_across_its_wrap(data_offset: Option<u64>) {
    let (a, m) = array_at(&format!("jring{data_offset:?}"), data_offset);
    let j = a.journal.as_ref().unwrap();
    let end = a.data_offset;
    let rows = a.geo.rows();
    let size = BLOCK + 4096;
    let head = || j.state.lock().head;
    // Records whose in-place writes are done (the test writes none: none
    // of them may ever be replayed), past the first time the ring filled,
    // until one more fits before the area's end and no second one does.
    let mut i = 0;
    while a.io_stats().journal_checkpoints == 0 || head() + 2 * size <= end {
        let seq = a
            .journal_stripe(i % rows, 0, &[(0, &[0x5Au8; 4096][..])])
            .unwrap();
        a.journal_write_done(seq);
        i += 1;
    }
    assert!(head() + size <= end);
    // Three records whose in-place writes never happen (a crash during
    // them): the first at the area's end, the other two at its start, once
    // a checkpoint freed it.
    let kept: Vec<(u64, u8)> = (1..=3).map(|k| (rows - k, 0xA0 + k as u8)).collect();
    for &(stripe, byte) in &kept {
        a.journal_stripe(stripe, 0, &[(0, &[byte; 4096][..])])
            .unwrap();
    }
    assert_eq!(head(), RECORDS + 2 * size, "the last two went to the start");
    let mut area = AlignedBuf::new(BLOCK as usize);
    m[0].read_at(&mut area, JOURNAL_OFFSET).unwrap();
    let (_, tail_at) = decode_head(&area, &a.uuid, end).unwrap();
    assert_eq!(
        tail_at,
        end - size,
        "the header points past the records freed"
    );
    assert_eq!(a.journal_recover().unwrap(), 3);
    for s in 0..rows {
        let want = kept.iter().find(|k| k.0 == s).map_or(0, |k| k.1);
        let mut got = vec![1u8; 4096];
        a.read(s * a.geo.stripe_data_bytes(), &mut got).unwrap();
        assert!(got.iter().all(|&b| b == want), "stripe {s}");
    }
}

/// The sequences of the records each member's ring holds.
pub(super) fn rings(m: &[MemberRef], uuid: &Uuid, end: u64) -> Vec<Vec<u64>> {
    m.iter()
        .map(|m| {
            let mut area = AlignedBuf::new((end - JOURNAL_OFFSET) as usize);
            m.read_at(&mut area, JOURNAL_OFFSET).unwrap();
            sealed_records(&area[BLOCK as usize..], uuid)
                .map(|(seq, ..)| seq)
                .collect()
        })
        .collect()
}

/// A record goes to as many members in sync as the array can still lose,
/// plus one, taking turns, and to no member being brought in sync: the
/// members in sync of a RAID5 missing one take one record each in turn; a
/// member re-added (rebuilding) takes none; with every member in sync (a
/// stripe still unsettled), two copies.
#[test]
fn a_record_goes_to_as_many_members_in_sync_as_the_array_can_lose_plus_one() {
    let (a, m) = array("jcopies");
    let end = a.data_offset;
    let journal = |stripes: std::ops::Range<u64>| {
        for s in stripes {
            let seq = a.journal_stripe(s, 0, &[(0, &[0x11u8; 4096][..])]).unwrap();
            a.journal_write_done(seq);
        }
    };
    a.fail_slot(3, "test");
    journal(0..3);
    let held = rings(&m, &a.uuid, end);
    assert!(held[3].is_empty(), "the failed member was written");
    for (slot, seqs) in held.iter().enumerate().take(3) {
        assert_eq!(seqs.len(), 1, "slot {slot} holds {seqs:?}");
    }
    a.flush().unwrap();
    a.re_add(m[3].clone()).unwrap();
    // How many records past `last` each member holds.
    let since = |last: u64| -> Vec<usize> {
        rings(&m, &a.uuid, end)
            .iter()
            .map(|seqs| seqs.iter().filter(|&&q| q > last).count())
            .collect()
    };
    let last = a.journal.as_ref().unwrap().state.lock().next_seq - 1;
    journal(3..6);
    let new = since(last);
    assert_eq!(
        new[3], 0,
        "the member being brought in sync took records: {new:?}"
    );
    assert_eq!(new[..3], [1, 1, 1], "the members in sync took no turns");
    // In sync again (its rows all written since it left), with records
    // of stripes still unsettled: two copies of each.
    a.rebuild_all(
        &Default::default(),
        &std::sync::atomic::AtomicBool::new(false),
    )
    .unwrap();
    let last = a.journal.as_ref().unwrap().state.lock().next_seq - 1;
    journal(6..9);
    assert_eq!(since(last).iter().sum::<usize>(), 6);
}

/// Replay follows the chain from member to member: each record where the
/// one before ended, on whichever member in sync holds it; a record out
/// of its place breaks the chain there.
#[test]
fn replay_follows_the_chain_across_members() {
    let (a, m) = array("jspread");
    let tail = a.journal.as_ref().unwrap().state.lock().tail_seq;
    let recs: Vec<AlignedBuf> = (0..3u64)
        .map(|k| encode_record(&block_record(&a, tail + 1 + k, k, 0xC0 + k as u8), &a.uuid))
        .collect();
    // Each record on one member only, one after another in the ring.
    let place = |recs: &[AlignedBuf], last_off: u64| {
        let mut at = RECORDS;
        for (k, r) in recs.iter().enumerate() {
            let off = if k == recs.len() - 1 { last_off } else { 0 };
            m[k].write_at(r, at + off).unwrap();
            at += r.len() as u64;
        }
    };
    let read = |s: u64| {
        let mut got = vec![0u8; 4096];
        a.read(s * a.geo.stripe_data_bytes(), &mut got).unwrap();
        got[0]
    };
    place(&recs, 0);
    assert_eq!(a.journal_recover().unwrap(), 3);
    assert_eq!((read(0), read(1), read(2)), (0xC0, 0xC1, 0xC2));
    // The same three, written again past the new header's sequence, the
    // last one block out of its place.
    let tail = a.journal.as_ref().unwrap().state.lock().tail_seq;
    let recs_again: Vec<AlignedBuf> = (0..3u64)
        .map(|k| encode_record(&block_record(&a, tail + 1 + k, k, 0xD0 + k as u8), &a.uuid))
        .collect();
    place(&recs_again, BLOCK);
    assert_eq!(a.journal_recover().unwrap(), 2);
    assert_eq!((read(0), read(1), read(2)), (0xD0, 0xD1, 0xC2));
}

/// A record placed after a rebuild's settle and before its new member's
/// ring is made (a writer between the two) is settled by the making of
/// that ring: its copy on the new member is lost to the zeros, and the
/// member in sync that holds its other copy may go; a record after it
/// must still be found then.
#[test]
fn a_record_placed_before_a_new_members_ring_is_made_is_settled_first() {
    let (a, m) = array("jadmit");
    a.fail_slot(3, "test");
    a.re_add(m[3].clone()).unwrap();
    let block = [0x31u8; 4096];
    let early = a.journal_stripe(1, 0, &[(0, &block[..])]).unwrap();
    a.journal_write_done(early);
    let end = a.data_offset;
    let holder = (0..3)
        .find(|&i| rings(&m, &a.uuid, end)[i].contains(&early))
        .unwrap();
    a.journal_admit(&m[3]).unwrap();
    // In sync (as its rebuild would leave it), then a record whose
    // in-place write never happens, and the member that held the early
    // record's copy in sync lost.
    a.slots[3].set_state(SlotState::Active);
    a.journal_stripe(2, 0, &[(0, &block[..])]).unwrap();
    a.fail_slot(holder, "test");
    assert_eq!(
        a.journal_recover().unwrap(),
        1,
        "the record after one whose copies were lost was not replayed"
    );
}

/// A member in sync whose journal cannot be read at the start: where a
/// record can be owed (an unclean stop while degraded) it is failed, as
/// it may hold a record's only copy; where none can be (every member in
/// sync), it stays, the record is taken from another member holding it,
/// and no sequence its ring may hold is used again.
#[test]
fn a_member_whose_journal_cannot_be_read_at_the_start_is_failed_where_a_record_is_owed() {
    use crate::member::{Faults, FaultyMember};
    let array = |tag: &str| {
        let f: Vec<Arc<FaultyMember>> = (0..4)
            .map(|i| {
                let ram = Arc::new(RamMember::new(format!("ram:{tag}{i}"), 2 << 20));
                Arc::new(FaultyMember::new(ram))
            })
            .collect();
        let m: Vec<MemberRef> = f.iter().map(|x| x.clone() as MemberRef).collect();
        let opts = CreateOptions {
            name: tag.into(),
            level: Level::Raid5,
            chunk: 64 * 1024,
            data_offset: None,
        };
        (Array::create(m.clone(), vec![], opts).unwrap(), f, m)
    };
    let unreadable = |a: &Array, f: &[Arc<FaultyMember>], slot: usize| {
        f[slot].set_faults(Faults {
            fail_read_ranges: vec![(JOURNAL_OFFSET, a.data_offset)],
            ..Default::default()
        });
    };
    let block = [0x77u8; 4096];
    // Written while degraded (dirty: as after a crash): the record's one
    // copy is on a member that cannot be read back.
    let (a, f, m) = array("jreadowed");
    a.write(0, &block).unwrap();
    a.fail_slot(3, "test");
    let seq = a.journal_stripe(0, 0, &[(0, &block[..])]).unwrap();
    let held = rings(&m, &a.uuid, a.data_offset);
    let holders: Vec<usize> = (0..4).filter(|&i| held[i].contains(&seq)).collect();
    assert_eq!(holders.len(), 1, "{held:?}");
    unreadable(&a, &f, holders[0]);
    let _ = a.journal_recover();
    assert_eq!(a.slots[holders[0]].state(), SlotState::Failed);
    // With every member in sync, two copies: the other one is replayed.
    let (a, f, m) = array("jreadclean");
    let seq = a.journal_stripe(0, 0, &[(0, &block[..])]).unwrap();
    let held = rings(&m, &a.uuid, a.data_offset);
    let holders: Vec<usize> = (0..4).filter(|&i| held[i].contains(&seq)).collect();
    assert_eq!(holders.len(), 2, "{held:?}");
    unreadable(&a, &f, holders[0]);
    assert_eq!(a.journal_recover().unwrap(), 1);
    assert_eq!(a.slots[holders[0]].state(), SlotState::Active);
    let ring = (a.data_offset - RECORDS) / BLOCK;
    assert!(a.journal.as_ref().unwrap().state.lock().next_seq >= seq + ring);
}

/// A header written over another and torn by a power cut (each 512-byte
/// sector on the medium old or new) reads as the old header or the new,
/// never as none: with none on every member in sync, the start would
/// replay the ring from its oldest record. Over a header an earlier
/// version wrote (the block's CRC alone), only the one write that
/// replaces it can tear to none.
#[test]
fn a_torn_header_reads_as_the_old_or_the_new() {
    let uuid = Uuid([7; 16]);
    let end = RECORDS + (1 << 20);
    let sectors = BLOCK as usize / 512;
    let new = encode_head(9, RECORDS + 8192, &uuid);
    for (old, earlier) in [
        (encode_head(5, RECORDS, &uuid), false),
        (encode_head_spread(5, RECORDS, &uuid), true),
    ] {
        for mask in 0u32..1 << sectors {
            let mut torn = old.clone();
            for k in (0..sectors).filter(|k| mask & (1 << k) != 0) {
                torn[k * 512..(k + 1) * 512].copy_from_slice(&new[k * 512..(k + 1) * 512]);
            }
            let sector0_new = mask & 1 != 0;
            match decode_head(&torn, &uuid, end) {
                Some(h) if sector0_new => assert_eq!(h, (9, RECORDS + 8192), "{mask:#x}"),
                Some(h) => assert_eq!(h, (5, RECORDS), "{mask:#x}"),
                None => assert!(earlier && !sector0_new && mask & 0x80 != 0, "{mask:#x}"),
            }
        }
    }
    // A version that reads the block's CRC alone reads these headers
    // whole: going back to it finds the header, not a ring to replay.
    let block_only = |b: &[u8]| {
        &b[..8] == b"NVRAIDJH"
            && crc32c::crc32c(&b[..4092]).to_le_bytes() == b[4092..4096]
            && b[UUID_AT..UUID_AT + 16] == uuid.0
    };
    assert!(block_only(&new));
    // Both layouts read; another array's header does not.
    assert_eq!(
        decode_head(&encode_head_spread(3, RECORDS, &uuid), &uuid, end),
        Some((3, RECORDS))
    );
    assert_eq!(
        decode_head(&encode_head(3, RECORDS, &uuid), &Uuid([8; 16]), end),
        None
    );
}

/// A group's runs go to members of their own, each the next turn: three
/// records of a group cut one to a run land on three members, one each
/// (where as one run they land together on one), and replay follows
/// their chain from member to member.
#[test]
fn a_groups_runs_spread_over_the_members_and_replay_follows_them() {
    let (a, m) = array("jspread");
    let end = a.data_offset;
    a.fail_slot(3, "test");
    // Stripes whose first chunk is on a member present, so that replay
    // puts it in place.
    let stripes: Vec<u64> = (0..)
        .filter(|&s| a.geo.stripe_map(s).members[0] != 3)
        .take(3)
        .collect();
    let group = |first_seq: u64, byte: u8| -> Vec<(u64, AlignedBuf)> {
        let mut at = RECORDS;
        (0..3)
            .map(|k| {
                let r = block_record(&a, first_seq + k, stripes[k as usize], byte + k as u8);
                let b = encode_record(&r, &a.uuid);
                let place = at;
                at += b.len() as u64;
                (place, b)
            })
            .collect()
    };
    // One run: every record on the one member whose turn it is.
    assert!(a.write_group(&group(1, 0x10)));
    let held = rings(&m, &a.uuid, end);
    let holders: Vec<usize> = (0..4).filter(|&i| !held[i].is_empty()).collect();
    assert_eq!(
        holders.len(),
        1,
        "one run went to several members: {held:?}"
    );
    assert_eq!(held[holders[0]], [1, 2, 3]);
    for member in &m[..3] {
        member
            .write_at(
                &AlignedBuf::new((end - JOURNAL_OFFSET) as usize),
                JOURNAL_OFFSET,
            )
            .unwrap();
    }
    // A run per record: one member each, in turn, the failed one none.
    a.limit_journal_runs(BLOCK);
    let tail = a.journal.as_ref().unwrap().state.lock().tail_seq;
    for member in &m[..3] {
        member
            .write_at(&encode_head(tail, RECORDS, &a.uuid), JOURNAL_OFFSET)
            .unwrap();
    }
    assert!(a.write_group(&group(tail + 1, 0x20)));
    let held = rings(&m, &a.uuid, end);
    assert!(held[3].is_empty(), "the failed member was written");
    let mut each: Vec<usize> = held[..3].iter().map(Vec::len).collect();
    each.sort_unstable();
    assert_eq!(each, [1, 1, 1], "the runs did not spread: {held:?}");
    // None was put in place: replay puts all three, read from three
    // members, and the data reads back.
    assert_eq!(a.journal_recover().unwrap(), 3);
    for (k, s) in stripes.into_iter().enumerate() {
        let mut got = vec![0u8; 4096];
        a.read(s * a.geo.stripe_data_bytes(), &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 0x20 + k as u8), "stripe {s}");
    }
}

/// A record of the data that exists only as parity (`Kind::Parity`) is
/// put in place from the data as the members hold it: whatever a torn
/// write left there (here one chunk new, one old, the parity neither),
/// replay leaves the stripe agreeing with itself and the missing chunk
/// reading back as the record says.
#[test]
fn a_parity_record_is_replayed_from_the_data_as_it_lies() {
    let (a, m) = array("jparity");
    let map = a.geo.stripe_map(0);
    let chunk = a.geo.chunk;
    a.write(0, &vec![0x11; a.geo.stripe_data_bytes() as usize])
        .unwrap();
    a.fail_slot(map.members[1], "test");
    let at = a.data_offset;
    m[map.members[0]].write_at(&[0x22; 4096], at).unwrap();
    m[map.members[3]].write_at(&[0x77; 4096], at).unwrap();
    let tail = a.journal.as_ref().unwrap().state.lock().tail_seq;
    let rec = Record {
        kind: Kind::Parity,
        seq: tail + 1,
        stripe: 0,
        lo: 0,
        hi: 4096,
        entries: vec![(1, map.members[1], vec![0x33; 4096])],
    };
    let b = encode_record(&rec, &a.uuid);
    for (i, member) in m.iter().enumerate() {
        if i != map.members[1] {
            member.write_at(&b, RECORDS).unwrap();
        }
    }
    assert_eq!(a.journal_recover().unwrap(), 1);
    let read = |off: u64| {
        let mut got = vec![0u8; 4096];
        a.read(off, &mut got).unwrap();
        got
    };
    assert!(read(0).iter().all(|&x| x == 0x22), "chunk 0 as it lay");
    assert!(read(chunk).iter().all(|&x| x == 0x33), "the record's chunk");
    assert!(
        read(2 * chunk).iter().all(|&x| x == 0x11),
        "chunk 2 as it lay"
    );
    let mut parity = vec![0u8; 4096];
    m[map.members[3]].read_at(&mut parity, at).unwrap();
    assert!(
        parity.iter().all(|&x| x == 0x22 ^ 0x33 ^ 0x11),
        "parity recomputed"
    );
}
