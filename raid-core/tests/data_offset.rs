//! Where an array's data starts on its members: chosen at create by the
//! members' size and level, recorded, and followed by every member, spare
//! and replacement after.

use raid_core::array::{Array, ArrayError, CreateOptions};
use raid_core::layout::Level;
use raid_core::member::{FileMember, MemberRef, RamMember};
use raid_core::metadata::{
    read_superblock, LARGE_RING_DATA_OFFSET, LARGE_RING_MEMBERS, MIN_DATA_OFFSET, SB_OFFSETS,
};
use std::sync::Arc;

const DATA: u64 = 4 << 20;
const CHUNK: u64 = 64 * 1024;

fn opts(level: Level, data_offset: Option<u64>) -> CreateOptions {
    CreateOptions {
        name: "off".into(),
        level,
        chunk: CHUNK,
        data_offset,
    }
}

fn ram(tag: &str, n: usize, size: u64) -> Vec<MemberRef> {
    (0..n)
        .map(|i| Arc::new(RamMember::new(format!("ram:{tag}{i}"), size)) as MemberRef)
        .collect()
}

/// Sparse files of `size` bytes in a fresh folder (nothing is written).
fn sparse(tag: &str, n: usize, size: u64) -> (std::path::PathBuf, Vec<MemberRef>) {
    let dir = std::env::temp_dir().join(format!("raid-offset-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = (0..n)
        .map(|i| {
            let p = dir.join(format!("{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(size).unwrap();
            Arc::new(FileMember::open(&p).unwrap()) as MemberRef
        })
        .collect();
    (dir, m)
}

#[test]
fn large_raid5_and_raid6_members_get_the_large_ring_and_the_rest_do_not() {
    let (dir, m) = sparse("large", 4, LARGE_RING_MEMBERS);
    for (level, want) in [
        (Level::Raid5, LARGE_RING_DATA_OFFSET),
        (Level::Raid6, LARGE_RING_DATA_OFFSET),
        (Level::Raid10, MIN_DATA_OFFSET),
        (Level::Raid0, MIN_DATA_OFFSET),
    ] {
        let plan = Array::check_create(&m, &[], &opts(level, None)).unwrap();
        assert_eq!(plan.data_offset, want, "{level}");
        assert!(plan.geo.member_size <= LARGE_RING_MEMBERS - want, "{level}");
    }
    std::fs::remove_dir_all(dir).unwrap();
    let small = ram("small", 4, LARGE_RING_MEMBERS / 2);
    let plan = Array::check_create(&small, &[], &opts(Level::Raid5, None)).unwrap();
    assert_eq!(plan.data_offset, MIN_DATA_OFFSET);
}

#[test]
fn a_data_offset_this_version_cannot_place_is_refused_at_create() {
    let m = ram("bad", 3, 64 << 20);
    for bad in [0, 4096, MIN_DATA_OFFSET + 4096, 128 << 20] {
        let Err(e) = Array::check_create(&m, &[], &opts(Level::Raid5, Some(bad))) else {
            panic!("data offset {bad} accepted");
        };
        assert!(matches!(e, ArrayError::Invalid(_)), "{bad}: {e:?}");
        assert!(e.to_string().contains("data offset"), "{e}");
    }
}

/// Spares and replacements are sized by the array's offset: a device that
/// would do at 1 MiB is too small for an array whose data starts at 2.
#[test]
fn spares_and_replacements_must_hold_the_data_past_the_arrays_offset() {
    let at = 2 * MIN_DATA_OFFSET;
    let m = ram("sz", 3, at + DATA);
    let a = Array::create(m, vec![], opts(Level::Raid5, Some(at))).unwrap();
    assert_eq!(a.data_offset(), at);
    let need = at + a.geometry().member_size;
    let short = || Arc::new(RamMember::new("ram:short", need - MIN_DATA_OFFSET)) as MemberRef;
    let e = a.add_spare(short()).unwrap_err();
    assert!(e.to_string().contains("small"), "{e}");
    a.fail_member(0, false).unwrap();
    let e = a.replace(0, short()).unwrap_err();
    assert!(e.to_string().contains("small"), "{e}");
    a.replace(0, Arc::new(RamMember::new("ram:fits", need)))
        .unwrap();
}

/// A member whose metadata places the data elsewhere than the array's
/// newest metadata is never read: assembly refuses it by name.
#[test]
fn a_member_whose_metadata_places_the_data_elsewhere_is_refused() {
    let at = 2 * MIN_DATA_OFFSET;
    let m = ram("dis", 3, at + DATA);
    let a = Array::create(m.clone(), vec![], opts(Level::Raid5, Some(at))).unwrap();
    a.write(0, &vec![7u8; 65536]).unwrap();
    a.close().unwrap();
    drop(a);
    let mut sb = read_superblock(m[1].as_ref()).unwrap();
    sb.data_offset = MIN_DATA_OFFSET;
    for off in SB_OFFSETS {
        m[1].write_at(&sb.encode(), off).unwrap();
    }
    let Err(e) = Array::assemble(m.clone()) else {
        panic!("assembled with a member that disagrees on the data offset");
    };
    assert!(e.to_string().contains("puts the data at byte"), "{e}");
}
