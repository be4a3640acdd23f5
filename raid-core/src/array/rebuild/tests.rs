//! The rebuild pass: positions saved beside a member with nothing in
//! sync, a run across the lock table's end, and what a superseded
//! rebuild says.

use super::*;
use crate::member::RamMember;

/// A RAM member named for its test (`tag`) and `name`.
fn ram(tag: &str, name: &str, size: u64) -> Arc<RamMember> {
    Arc::new(RamMember::new(format!("ram:{tag}{name}"), size))
}

/// An array of `level` over `members`, named `tag`.
fn ram_array(tag: &str, level: Level, members: &[Arc<RamMember>], chunk: u64) -> Array {
    let refs = members.iter().map(|m| m.clone() as MemberRef).collect();
    let opts = CreateOptions {
        name: tag.into(),
        level,
        chunk,
        data_offset: None,
    };
    Array::create(refs, vec![], opts).unwrap()
}

/// Rebuilds every slot being rebuilt with `opts`: the rebuild
/// finishes, the array reads `data` and the scrub finds nothing.
fn assert_rebuilt(a: &Array, opts: &RebuildOptions, data: &[u8]) {
    let end = a.rebuild_all(opts, &AtomicBool::new(false));
    assert!(matches!(end, Ok(RebuildEnd::Finished)), "{end:?}");
    assert_eq!(a.state(), ArrayState::Optimal);
    let mut got = vec![0u8; data.len()];
    a.read(0, &mut got).unwrap();
    assert!(got == data, "the data changed");
    let r = a.scrub(&ScrubOptions::default(), &AtomicBool::new(false));
    assert!(r.unwrap().mismatches.is_empty());
}

/// A start can find a member saved in sync to the last row but not yet
/// active (a rebuild's end checkpoints it so, and a crash came before
/// the member was made active) beside another member with nothing in
/// sync (a RAID6's second replacement): one pass finishes the first at
/// once and rebuilds the second from row 0. The cursor was the first
/// one's position, the last row: the second joined there, and the pass
/// stopped on its "a rebuild batch must move on".
#[test]
fn a_member_saved_at_the_last_row_beside_one_with_nothing_in_sync() {
    let size = crate::metadata::MIN_DATA_OFFSET + (1 << 20);
    let m: Vec<Arc<RamMember>> = (0..5).map(|i| ram("rbend", &i.to_string(), size)).collect();
    let a = ram_array("rbend", Level::Raid6, &m, 64 * 1024);
    let data: Vec<u8> = (0..a.capacity()).map(|i| (i * 7 % 251) as u8).collect();
    a.write(0, &data).unwrap();
    a.flush().unwrap();
    // Slot 1's replacement holds its data already, and is recorded in
    // sync to the last row, as assembly reads such metadata.
    let copy = ram("rbend", "copy", size);
    let mut all = vec![0u8; size as usize];
    m[1].read_at(&mut all, 0).unwrap();
    copy.write_at(&all, 0).unwrap();
    a.fail_slot(1, "test");
    a.fail_slot(2, "test");
    a.replace(1, copy).unwrap();
    a.replace(2, ram("rbend", "new", size)).unwrap();
    let rows = a.geo.rows();
    let s = &a.slots[1];
    s.rebuild_row.store(rows, Ordering::Release);
    s.flushed_to(rows);
    s.durable_to(rows);
    assert_rebuilt(&a, &RebuildOptions::default(), &data);
}

/// A RAID5 rebuild locks each step's rows while the step before still
/// holds its own, where the lock table's order allows: a run across
/// the table's end (row 4096, with runs of 24 rows) has the step
/// before written alone first. The member comes out whole, and
/// nothing waits on itself.
#[test]
fn a_rebuild_run_across_the_lock_tables_end() {
    let chunk = 4096;
    let size = crate::metadata::MIN_DATA_OFFSET + 4200 * chunk;
    let m: Vec<Arc<RamMember>> = (0..4)
        .map(|i| ram("rbwrap", &i.to_string(), size))
        .collect();
    let a = ram_array("rbwrap", Level::Raid5, &m, chunk);
    assert!(a.geo.rows() > 4096 + 24);
    let data: Vec<u8> = (0..a.capacity()).map(|i| (i * 13 % 251) as u8).collect();
    a.write(0, &data).unwrap();
    a.fail_slot(2, "test");
    a.replace(2, ram("rbwrap", "new", size)).unwrap();
    let opts = RebuildOptions {
        batch_rows: 24,
        parallel: 2,
        step_bytes: chunk,
        ..RebuildOptions::default()
    };
    assert_rebuilt(&a, &opts, &data);
}

/// A rebuild that stops because its slot left it says what follows:
/// a failed slot needs a new member; a slot given another member has
/// that member's rebuild coming.
#[test]
fn a_rebuild_superseded_says_what_follows() {
    let size = crate::metadata::MIN_DATA_OFFSET + (1 << 20);
    let m: Vec<Arc<RamMember>> = (0..3).map(|i| ram("rbsup", &i.to_string(), size)).collect();
    let a = ram_array("rbsup", Level::Raid5, &m, 64 * 1024);
    a.fail_slot(1, "test");
    let failed = a.superseded(1).to_string();
    assert!(failed.contains("replace the member"), "{failed}");
    a.replace(1, ram("rbsup", "new", size)).unwrap();
    let replaced = a.superseded(1).to_string();
    assert!(
        replaced.contains("one for the new member follows"),
        "{replaced}"
    );
}
