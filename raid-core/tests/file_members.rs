//! What a file member knows of where its bytes live: a file on tmpfs is a
//! copy in memory (its I/O runs in place, reads in the caller's thread);
//! a block device is not, though its node lives on devtmpfs, which answers
//! fstatfs with tmpfs's magic number. Taken for memory, a drive's reads
//! would block the thread that asked for them (a front end's reader).

use raid_core::array::RefusalKind;
use raid_core::member::{FileMember, Member};
use std::process::Command;

#[test]
fn a_block_device_is_not_in_memory_though_its_node_is_on_devtmpfs() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm here: not tried");
        return;
    }
    let img = shm.join(format!("raid-file-member-{}.img", std::process::id()));
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    assert!(FileMember::open(&img).unwrap().in_memory(), "a tmpfs file");
    // A loop device over that same file: needs root and losetup.
    let out = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&img)
        .output();
    let dev = match out {
        Ok(o) if o.status.success() => String::from_utf8(o.stdout).unwrap().trim().to_owned(),
        other => {
            eprintln!("no loop device here (root and losetup needed): skipped: {other:?}");
            std::fs::remove_file(&img).unwrap();
            return;
        }
    };
    let m = FileMember::open(std::path::Path::new(&dev));
    let _ = Command::new("losetup").args(["-d", &dev]).status();
    std::fs::remove_file(&img).unwrap();
    assert!(!m.unwrap().in_memory(), "{dev} taken for memory");
}

/// A member file truncated underneath a running array: the size check
/// (the daemon's, every quarter second) fails that member before a write
/// past its new end grows it again with a hole, whose zeros reads would
/// then serve as data with no error at all; reads come from the others.
#[test]
fn a_member_file_that_shrank_is_failed_by_the_size_check() {
    use raid_core::metadata::SlotState;
    let (dir, paths, a) = files_raid5("shrank");
    let cap = a.capacity() as usize;
    let img: Vec<u8> = (0..cap).map(|i| (i * 7 + i / 4096) as u8).collect();
    a.write(0, &img).unwrap();
    a.flush().unwrap();
    a.check_member_files();
    assert!(a.slots().iter().all(|s| s.state == SlotState::Active));
    cut(&paths[1], 4 << 20);
    a.check_member_files();
    assert_eq!(a.slots()[1].state, SlotState::Failed);
    // A write past the cut now skips the failed member: it stays short.
    let tail = cap - (256 << 10);
    a.write(tail as u64, &img[tail..]).unwrap();
    assert_eq!(std::fs::metadata(&paths[1]).unwrap().len(), 4 << 20);
    let mut back = vec![0u8; cap];
    a.read(0, &mut back).unwrap();
    assert!(back == img, "the array served the hole's zeros");
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A member file cut short while the array was stopped is left out at the
/// next start, as one with unreadable metadata is (its slot missing, the
/// array degraded where its level allows), not a reason to refuse the
/// whole start.
#[test]
fn a_member_file_cut_short_while_stopped_is_left_out_at_start() {
    use raid_core::array::{Array, ArrayState};
    use raid_core::member::MemberRef;
    let (dir, paths, a) = files_raid5("cut");
    let open = || open_all(&paths);
    let img: Vec<u8> = (0..a.capacity() as usize)
        .map(|i| (i / 512) as u8)
        .collect();
    a.write(0, &img).unwrap();
    a.close().unwrap();
    drop(a);
    // A full copy taken before the cut (a backup, a dd gone wrong).
    let copy = dir.join("m2-copy.img");
    std::fs::copy(&paths[2], &copy).unwrap();
    cut(&paths[2], 4 << 20);
    // Given beside the cut member, the copy is not taken in its place.
    let mut with_copy = open();
    with_copy.push(std::sync::Arc::new(FileMember::open(&copy).unwrap()) as MemberRef);
    let e = Array::assemble(with_copy)
        .err()
        .expect("a copy taken for a cut member");
    assert!(e.to_string().contains("two devices claim slot 2"), "{e}");
    let asm = Array::assemble(open()).unwrap();
    assert_eq!(asm.array.state(), ArrayState::Degraded);
    assert!(
        asm.refused
            .iter()
            .any(|(who, why)| who.ends_with("m2.img") && why.kind == RefusalKind::CutShort),
        "{:?}",
        asm.refused
    );
    let mut back = vec![0u8; img.len()];
    asm.array.read(0, &mut back).unwrap();
    assert!(back == img);
    drop(asm);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A RAID5 of three 16 MiB member files in a fresh folder named for
/// `tag`; the folder, the files (to cut), and how to open them again.
fn files_raid5(
    tag: &str,
) -> (
    std::path::PathBuf,
    Vec<std::path::PathBuf>,
    raid_core::array::Array,
) {
    files_array(tag, raid_core::layout::Level::Raid5, 3, 16 << 20, 64 << 10)
}

/// An array of `members` sparse files of `size` bytes, as `files_raid5`.
fn files_array(
    tag: &str,
    level: raid_core::layout::Level,
    members: usize,
    size: u64,
    chunk: u64,
) -> (
    std::path::PathBuf,
    Vec<std::path::PathBuf>,
    raid_core::array::Array,
) {
    let dir = std::env::temp_dir().join(format!("raid-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let paths: Vec<_> = (0..members)
        .map(|i| dir.join(format!("m{i}.img")))
        .collect();
    for p in &paths {
        std::fs::File::create(p).unwrap().set_len(size).unwrap();
    }
    let a = raid_core::array::Array::create(
        open_all(&paths),
        vec![],
        raid_core::array::CreateOptions {
            name: tag.into(),
            level,
            chunk,
            data_offset: None,
        },
    )
    .unwrap();
    (dir, paths, a)
}

fn open_all(paths: &[std::path::PathBuf]) -> Vec<raid_core::member::MemberRef> {
    paths
        .iter()
        .map(|p| std::sync::Arc::new(FileMember::open(p).unwrap()) as raid_core::member::MemberRef)
        .collect()
}

fn cut(p: &std::path::Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// A member file deleted while the array uses it is named (the daemon
/// warns once); one renamed is not (the record follows it at the next
/// stop), nor are the others.
#[test]
fn a_deleted_member_file_is_named_and_a_renamed_one_is_not() {
    let (dir, paths, a) = files_raid5("deleted");
    assert!(a.check_member_files().is_empty());
    std::fs::rename(&paths[0], dir.join("moved.img")).unwrap();
    assert!(a.check_member_files().is_empty());
    std::fs::remove_file(&paths[1]).unwrap();
    let gone: Vec<usize> = a.check_member_files().iter().map(|(i, _)| *i).collect();
    assert_eq!(gone, vec![1]);
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The parts of a sparse array never written read as zeros and are said
/// to (a copy then skips them: the NBD export's block status), chunk by
/// chunk: a chunk with any byte stored on its member is data, all of it,
/// and its stripe's other chunks are not (their members hold holes
/// there, whatever the parity holds). With a member failed, its chunks
/// are recovered from the others, and are zeros only where all of those
/// are holes: the failed member's chunk beside written data is data. The
/// same for a query that starts and ends inside chunks.
#[test]
fn the_parts_of_the_array_that_read_as_zeros_are_named() {
    let (dir, _paths, a) = files_raid5("zeros");
    if !raid_core::member::holes_trusted_at(&dir) {
        eprintln!(
            "{}: not a filesystem whose holes are trusted: skipped",
            dir.display()
        );
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    // A RAID5 of three: two 64 KiB data chunks a stripe.
    let stripe = 128u64 << 10;
    a.write(3 * stripe + 8192, &[0xA5u8; 4096]).unwrap();
    a.write(10 * stripe, &vec![0x5Au8; 2 * stripe as usize])
        .unwrap();
    // Stripe 3's data chunks are on members 0 and 1 (parity on 2), and
    // the first write is in its first chunk: data up to `first_end`.
    let chunk = stripe / 2;
    let check = |a: &raid_core::array::Array, first_end: u64| {
        let cap = a.capacity();
        let extents = a.zero_extents(0, cap);
        let mut data = Vec::new();
        let mut at = 0;
        for &(len, zero) in &extents {
            if zero {
                let mut back = vec![1u8; len as usize];
                a.read(at, &mut back).unwrap();
                assert!(back.iter().all(|&b| b == 0), "{at}+{len} said zero");
            } else {
                data.push((at, at + len));
            }
            at += len;
        }
        assert_eq!(at, cap);
        assert_eq!(
            data,
            vec![(3 * stripe, first_end), (10 * stripe, 12 * stripe)]
        );
        assert_eq!(
            a.zero_extents(3 * stripe + 100, 10),
            vec![(10, false)],
            "cut to what was asked"
        );
        assert_eq!(
            a.zero_extents(first_end - 10, 20),
            vec![(10, false), (10, true)]
        );
        assert_eq!(a.zero_extents(cap - 10, 100), vec![(10, true)]);
        // One at a time (SEEK_DATA, SEEK_HOLE): whole, the walk stopped
        // where the next begins.
        assert_eq!(a.zero_extents_upto(0, cap, 1), vec![(3 * stripe, true)]);
        assert_eq!(
            a.zero_extents_upto(3 * stripe, cap, 2),
            vec![
                (first_end - 3 * stripe, false),
                (10 * stripe - first_end, true)
            ]
        );
        assert!(a.zero_extents(cap, 100).is_empty());
    };
    // The second chunk's own member holds a hole: it reads as zeros.
    check(&a, 3 * stripe + chunk);
    a.fail_member(1, false).unwrap();
    // Recovered from the first chunk's data and the parity: data.
    check(&a, 4 * stripe);
    // Failed past its redundancy, the array serves no read: no part of
    // it is said to be zeros.
    a.fail_member(2, true).unwrap();
    assert_eq!(a.zero_extents(0, a.capacity()), vec![(a.capacity(), false)]);
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Chunk by chunk, with writes at random places and sizes, a RAID5 and a
/// RAID6: every part said to be zeros reads as zeros (a copy that skips
/// it loses nothing), and every chunk that was written to is said to be
/// data; optimal, then with members failed one at a time up to what the
/// level survives, with writes after each failure (a failed member's
/// chunks then live in the others alone; its file keeps holes there).
#[test]
fn holes_said_chunk_by_chunk_read_as_zeros_after_random_writes() {
    use raid_core::layout::Level;
    use rand::{Rng, SeedableRng};
    for (level, members) in [(Level::Raid5, 4usize), (Level::Raid6, 5)] {
        for seed in 0..4u64 {
            let tag = format!("holes-{}-{seed}", level.number());
            let chunk = 16u64 << 10;
            let (dir, _paths, a) = files_array(&tag, level, members, 4 << 20, chunk);
            if holes_untrusted(&dir) {
                return;
            }
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut written = vec![false; (a.capacity() / chunk) as usize];
            write_at_random(&a, chunk, &mut written, &mut rng);
            holes_read_as_zeros(&a, chunk, &written, &format!("{tag} optimal"));
            for k in 0..level.tolerated_failures(members) {
                let m = rng.gen_range(0..members);
                if a.slots()[m].state != raid_core::metadata::SlotState::Failed {
                    a.fail_member(m, false).unwrap();
                }
                write_at_random(&a, chunk, &mut written, &mut rng);
                let when = format!("{tag} with {} failed", k + 1);
                holes_read_as_zeros(&a, chunk, &written, &when);
            }
            // A new device in a failed slot, all holes, is read from
            // only once rebuilt: before, its chunks are recovered from
            // the others.
            let slot = (0..members)
                .find(|&m| a.slots()[m].state == raid_core::metadata::SlotState::Failed)
                .unwrap();
            let new = dir.join("new.img");
            std::fs::File::create(&new)
                .unwrap()
                .set_len(4 << 20)
                .unwrap();
            let new = std::sync::Arc::new(FileMember::open(&new).unwrap());
            a.replace(slot, new).unwrap();
            holes_read_as_zeros(&a, chunk, &written, &format!("{tag} replaced"));
            let stop = std::sync::atomic::AtomicBool::new(false);
            a.rebuild(slot, &Default::default(), &stop).unwrap();
            holes_read_as_zeros(&a, chunk, &written, &format!("{tag} rebuilt"));
            drop(a);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// Up to 23 writes of 4 KiB blocks (the array's unit of I/O), each up to
/// three chunks long, at random; marks the chunks they touch.
fn write_at_random(
    a: &raid_core::array::Array,
    chunk: u64,
    written: &mut [bool],
    rng: &mut rand::rngs::StdRng,
) {
    use rand::Rng;
    for _ in 0..rng.gen_range(1..24) {
        let len = 4096 * rng.gen_range(1..3 * chunk / 4096);
        let at = 4096 * rng.gen_range(0..(a.capacity() - len) / 4096);
        a.write(at, &vec![0xC3u8; len as usize]).unwrap();
        for c in at / chunk..=(at + len - 1) / chunk {
            written[c as usize] = true;
        }
    }
}

/// Every extent `zero_extents` says is zeros reads as zeros and holds no
/// written chunk, and a read of it is answered from the holes
/// (`read_of_holes`) where one of an extent of data is not; the extents
/// cover the array.
fn holes_read_as_zeros(a: &raid_core::array::Array, chunk: u64, written: &[bool], when: &str) {
    let mut at = 0;
    for (len, zero) in a.zero_extents(0, a.capacity()) {
        if zero {
            let mut back = vec![1u8; len as usize];
            a.read(at, &mut back).unwrap();
            assert!(back.iter().all(|&b| b == 0), "{when}: {at}+{len} said zero");
            assert!(
                (at / chunk..(at + len).div_ceil(chunk)).all(|c| !written[c as usize]),
                "{when}: a written chunk in {at}+{len} said zero"
            );
        }
        assert_eq!(a.read_of_holes(at, len), zero, "{when}: {at}+{len}");
        at += len;
    }
    assert_eq!(at, a.capacity(), "{when}");
}

/// A rebuild zeros the rows whose every source holds holes instead of
/// reading them, onto a used device (0xA5 in every chunk, or in three of
/// every four): the array then reads as it did before the failure, a
/// scrub finds every row consistent (old bytes left on the new device
/// would not be), and a new device that was not fully allocated holds a
/// hole on every row that no source holds data on (a rebuild that wrote
/// the zeros it recovered would leave data there). Then a hot replace
/// onto another used device does the same with the old device's holes.
/// A scrub skips the rows every member holds holes on, and sees one that
/// no longer does. RAID1, 5, 6 (two members rebuilt in one pass) and 10.
#[test]
fn a_rebuild_zeros_the_rows_every_source_holds_holes_on() {
    use raid_core::layout::Level;
    use rand::{Rng, SeedableRng};
    for (level, members) in REDUNDANT {
        for seed in 0..2u64 {
            let tag = format!("rebuild-holes-{}-{seed}", level.number());
            let (size, chunk) = (4u64 << 20, 16u64 << 10);
            let (dir, paths, a) = files_array(&tag, level, members, size, chunk);
            if holes_untrusted(&dir) {
                return;
            }
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut written = vec![false; (a.capacity() / chunk) as usize];
            write_at_random(&a, chunk, &mut written, &mut rng);
            let mut image = vec![0u8; a.capacity() as usize];
            a.read(0, &mut image).unwrap();
            // As many members failed as the level survives, the pair of a
            // RAID10 (slots 0 and 1 hold the same chunks) not both.
            let failed: Vec<usize> = match level {
                Level::Raid6 => vec![1, 3],
                Level::Raid10 => vec![rng.gen_range(0..2), 2 + rng.gen_range(0..2)],
                _ => vec![rng.gen_range(0..members)],
            };
            for &slot in &failed {
                a.fail_member(slot, false).unwrap();
            }
            for (k, &slot) in failed.iter().enumerate() {
                let p = dir.join(format!("used{k}.img"));
                a.replace(slot, used_device(&p, size, chunk, seed == 0))
                    .unwrap();
            }
            let stop = std::sync::atomic::AtomicBool::new(false);
            // Every run of holes skipped, a row long or more.
            let opts = raid_core::array::RebuildOptions {
                hole_bytes: chunk,
                ..Default::default()
            };
            let scrub = raid_core::array::ScrubOptions {
                hole_bytes: chunk,
                ..Default::default()
            };
            // Mirrors are rebuilt one slot per pass.
            for _ in 0..failed.len() {
                a.rebuild_all(&opts, &stop).unwrap();
            }
            assert!(a.rebuilding_slots().is_empty(), "{tag}");
            as_before(&a, &image, &scrub, &format!("{tag}: the rebuild"));
            // A hot replace of a member that was not failed, onto another
            // used device: its rows of holes are zeroed, the rest copied.
            let hot = (0..members).find(|s| !failed.contains(s)).unwrap();
            let hot_new = dir.join("used-hot.img");
            let old_holes: Vec<bool> = (0..(size - a.data_offset()) / chunk)
                .map(|row| hole_at(&paths[hot], a.data_offset() + row * chunk, chunk))
                .collect();
            a.hot_replace(hot, used_device(&hot_new, size, chunk, seed == 0))
                .unwrap();
            a.hot_replace_copy(&opts, &stop).unwrap();
            let report = as_before(&a, &image, &scrub, &format!("{tag}: the hot replace"));
            if seed == 0 {
                drop(a);
                std::fs::remove_dir_all(&dir).unwrap();
                continue;
            }
            for (row, _) in old_holes.iter().enumerate().filter(|(_, &h)| h) {
                let at = a.data_offset() + row as u64 * chunk;
                assert!(
                    hole_at(&hot_new, at, chunk),
                    "{tag}: row {row} of the hot replacement"
                );
            }
            assert!(
                old_holes.contains(&true) && old_holes.contains(&false),
                "{tag}"
            );
            // Each row no source holds data on is a hole on the new
            // devices too; some rows hold data, and some do not.
            let rows = (size - a.data_offset()) / chunk;
            let sources: Vec<&std::path::PathBuf> = (0..members)
                .filter(|s| !failed.contains(s))
                .map(|s| &paths[s])
                .collect();
            let (mut empty, mut full) = (0, 0);
            for row in 0..rows {
                let at = a.data_offset() + row * chunk;
                if sources.iter().all(|p| hole_at(p, at, chunk)) {
                    empty += 1;
                    for k in 0..failed.len() {
                        let p = dir.join(format!("used{k}.img"));
                        assert!(
                            hole_at(&p, at, chunk),
                            "{tag}: row {row} of {}",
                            p.display()
                        );
                    }
                } else {
                    full += 1;
                }
            }
            assert!(
                empty > 0 && full > 0,
                "{tag}: {empty} rows of holes, {full} of data"
            );
            // Their blocks are kept, as rows written would hold them (a
            // quarter of each used device was never allocated).
            for k in 0..failed.len() {
                use std::os::unix::fs::MetadataExt;
                let m = std::fs::metadata(dir.join(format!("used{k}.img"))).unwrap();
                let want = size - a.data_offset();
                assert!(
                    m.blocks() * 512 >= want,
                    "{tag}: {} of {want} allocated",
                    m.blocks() * 512
                );
            }
            // The scrub read the rows that hold data alone, and still finds
            // a chunk that went bad on a row of holes (its row is data now).
            let every_byte = rows * members as u64 * chunk;
            assert!(
                report.bytes_read < every_byte,
                "{tag}: {} bytes read",
                report.bytes_read
            );
            let now: Vec<std::path::PathBuf> = (0..members)
                .map(|s| match failed.iter().position(|&f| f == s) {
                    Some(k) => dir.join(format!("used{k}.img")),
                    None if s == hot => hot_new.clone(),
                    None => paths[s].clone(),
                })
                .collect();
            let row = (0..rows)
                .find(|r| {
                    now.iter()
                        .all(|p| hole_at(p, a.data_offset() + r * chunk, chunk))
                })
                .unwrap();
            std::os::unix::fs::FileExt::write_all_at(
                &std::fs::OpenOptions::new()
                    .write(true)
                    .open(&now[0])
                    .unwrap(),
                &[0x5Au8; 4096],
                a.data_offset() + row * chunk,
            )
            .unwrap();
            let report = a.scrub(&scrub, &stop).unwrap();
            assert!(
                !report.mismatches.is_empty(),
                "{tag}: row {row} went bad unseen"
            );
            drop(a);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

/// Whether the filesystem of `dir` is one whose holes the array does not
/// trust: then the test has nothing to check there, says so, and removes
/// `dir`.
fn holes_untrusted(dir: &std::path::Path) -> bool {
    if raid_core::member::holes_trusted_at(dir) {
        return false;
    }
    eprintln!("{}: holes not trusted here: skipped", dir.display());
    std::fs::remove_dir_all(dir).unwrap();
    true
}

/// Every redundant level, with its member count.
const REDUNDANT: [(raid_core::layout::Level, usize); 4] = [
    (raid_core::layout::Level::Raid1, 2),
    (raid_core::layout::Level::Raid5, 4),
    (raid_core::layout::Level::Raid6, 5),
    (raid_core::layout::Level::Raid10, 4),
];

/// After `what`, the array reads `image` and scrubs clean: the scrub's
/// report.
fn as_before(
    a: &raid_core::array::Array,
    image: &[u8],
    scrub: &raid_core::array::ScrubOptions,
    what: &str,
) -> raid_core::array::ScrubReport {
    let mut back = vec![0u8; a.capacity() as usize];
    a.read(0, &mut back).unwrap();
    assert!(back == image, "{what}: the array reads otherwise");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let report = a.scrub(scrub, &stop).unwrap();
    assert!(
        report.mismatches.is_empty(),
        "{what}: {:?}",
        report.mismatches
    );
    report
}

/// A used device at `p`: 0xA5 in every chunk (`full`, then every block
/// of it is allocated) or in three of every four.
fn used_device(
    p: &std::path::Path,
    size: u64,
    chunk: u64,
    full: bool,
) -> raid_core::member::MemberRef {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(p).unwrap();
    f.set_len(size).unwrap();
    for (i, at) in (0..size).step_by(chunk as usize).enumerate() {
        if full || i % 4 != 3 {
            f.write_all_at(&vec![0xA5u8; chunk as usize], at).unwrap();
        }
    }
    drop(f);
    std::sync::Arc::new(FileMember::open(p).unwrap())
}

/// Whether the file holds a hole over `len` bytes at `at` (SEEK_DATA).
fn hole_at(p: &std::path::Path, at: u64, len: u64) -> bool {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(p).unwrap();
    // SAFETY: a plain lseek on a file this function opened.
    let r = unsafe { libc::lseek(f.as_raw_fd(), at as i64, libc::SEEK_DATA) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "{}: {e}", p.display());
        return true;
    }
    r as u64 >= at + len
}

/// A rebuild and then a hot replace, each in runs of two rows side by
/// side and paced to last about half a second, while a writer writes
/// random 4 KiB blocks all along: on sparse member files, rows turn from
/// holes to data under the jobs, which zero the rows that are holes at the
/// moment their batch holds the rows' locks. Each block reads back as last
/// written and the array scrubs clean, for every redundant level, onto
/// used devices (0xA5 in three chunks of four). (The writer takes the
/// blocking path; the simulation's lives on a shard run these jobs beside
/// the shards' writes, on sparse simulated disks.)
#[test]
fn jobs_that_skip_holes_under_a_writer_lose_nothing() {
    use raid_core::array::RebuildOptions;
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    for (level, members) in REDUNDANT {
        let tag = format!("holes-writer-{}", level.number());
        let (size, chunk) = (8u64 << 20, 16u64 << 10);
        let (dir, _paths, a) = files_array(&tag, level, members, size, chunk);
        if holes_untrusted(&dir) {
            return;
        }
        let a = Arc::new(a);
        let model = Arc::new(Mutex::new(vec![0u8; a.capacity() as usize]));
        // A member's 8 MiB at 16 MiB a second, holes counted as written.
        let opts = RebuildOptions {
            batch_rows: 2,
            parallel: 4,
            hole_bytes: chunk,
            rate_limit: Some(16 << 20),
            ..Default::default()
        };
        let stop = AtomicBool::new(false);
        for (k, job) in ["rebuild", "hot replace"].into_iter().enumerate() {
            let new = used_device(&dir.join(format!("{job}.img")), size, chunk, false);
            match job {
                "rebuild" => {
                    a.fail_member(1, false).unwrap();
                    a.replace(1, new).unwrap();
                }
                _ => a.hot_replace(0, new).unwrap(),
            }
            let done = Arc::new(AtomicBool::new(false));
            let written = Arc::new(AtomicU64::new(0));
            let writer = {
                let (a, model) = (a.clone(), model.clone());
                let (done, written) = (done.clone(), written.clone());
                std::thread::spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(k as u64);
                    let blocks = a.capacity() / 4096;
                    while !done.load(Ordering::Acquire) {
                        let at = rng.gen_range(0..blocks) * 4096;
                        let b = vec![rng.gen_range(1..=255u8); 4096];
                        // The model under its lock with the write: writes
                        // of one block land in the model's order.
                        let mut m = model.lock().unwrap();
                        a.write(at, &b).unwrap();
                        m[at as usize..at as usize + 4096].copy_from_slice(&b);
                        written.fetch_add(1, Ordering::AcqRel);
                    }
                })
            };
            // The writer under way before the job starts.
            while written.load(Ordering::Acquire) == 0 {
                std::thread::yield_now();
            }
            let before = written.load(Ordering::Acquire);
            match job {
                "rebuild" => a.rebuild(1, &opts, &stop).unwrap(),
                _ => a.hot_replace_copy(&opts, &stop).unwrap(),
            };
            let during = written.load(Ordering::Acquire) - before;
            done.store(true, Ordering::Release);
            writer.join().unwrap();
            assert!(during >= 20, "{tag}: {during} writes during the {job}");
            assert!(a.rebuilding_slots().is_empty(), "{tag}: {job}");
            let mut back = vec![0u8; a.capacity() as usize];
            a.read(0, &mut back).unwrap();
            let model = model.lock().unwrap();
            let wrong = (0..back.len() / 4096)
                .find(|&b| back[b * 4096..(b + 1) * 4096] != model[b * 4096..(b + 1) * 4096]);
            assert_eq!(
                wrong, None,
                "{tag}: a block reads otherwise after the {job}"
            );
            let report = a.scrub(&Default::default(), &stop).unwrap();
            assert!(
                report.mismatches.is_empty(),
                "{tag}: {job}: {:?}",
                report.mismatches
            );
        }
        drop(a);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A member file locked for an instant by someone asking whether it is
/// held (`raidctl status` from a PID namespace that cannot see the holder
/// takes a shared lock and lets it go) is still opened; one held for good
/// is refused as in use.
#[test]
fn a_lock_taken_for_an_instant_does_not_refuse_the_member() {
    use std::os::fd::AsRawFd;
    let dir = std::env::temp_dir().join(format!("raid-flock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("m.img");
    std::fs::File::create(&p).unwrap().set_len(8 << 20).unwrap();
    let lock = |f: &std::fs::File, how| {
        // SAFETY: flock on a descriptor the caller keeps open.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), how) }, 0);
    };
    let asker = std::fs::File::open(&p).unwrap();
    lock(&asker, libc::LOCK_SH);
    let let_go = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(5));
        drop(asker);
    });
    let m = FileMember::open(&p).expect("opened once the instant passed");
    let_go.join().unwrap();
    drop(m);
    let holder = std::fs::File::open(&p).unwrap();
    lock(&holder, libc::LOCK_SH);
    let busy = FileMember::open(&p).err().expect("held for good");
    assert_eq!(busy.kind(), std::io::ErrorKind::ResourceBusy, "{busy}");
    drop(holder);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// After a crash the resync reads the rows of the marked regions that hold
/// data and skips the runs where every member holds a hole (zeros agree,
/// parity and copies alike): on sparse member files with a block written
/// here and there, it reads a small part of what its regions hold, and
/// still makes a stripe (a mirror chunk) the crash tore agree again.
#[test]
fn a_resync_after_a_crash_skips_the_rows_every_member_holds_holes_on() {
    use raid_core::layout::Level;
    for (level, members) in REDUNDANT {
        let tag = format!("resync-holes-{}", level.number());
        let (size, chunk) = (32u64 << 20, 64u64 << 10);
        let (dir, paths, a) = files_array(&tag, level, members, size, chunk);
        if holes_untrusted(&dir) {
            return;
        }
        // A 4 KiB block every 1.5 MiB of the array: every region marked
        // (16 rows of 64 KiB), each mostly holes.
        let step = 1536u64 << 10;
        let mut image = vec![0u8; a.capacity() as usize];
        for (k, off) in (0..a.capacity()).step_by(step as usize).enumerate() {
            let b = vec![(k % 251 + 1) as u8; 4096];
            a.write(off, &b).unwrap();
            image[off as usize..off as usize + 4096].copy_from_slice(&b);
        }
        a.flush().unwrap();
        let (g, base) = (a.geometry(), a.data_offset());
        drop(a);
        // The crash tore what the block at `step` wrote: its parity (a
        // mirror's second copy) never took it.
        let (torn, at) = match level {
            Level::Raid5 | Level::Raid6 => {
                let s = step / g.stripe_data_bytes();
                (g.stripe_map(s).members[g.data_chunks()], base + s * chunk)
            }
            _ => {
                let p = g.chunk_copies(step / chunk)[1];
                (p.member, base + p.offset)
            }
        };
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&paths[torn])
                .unwrap();
            f.write_all_at(&[0x5c; 512], at + 512).unwrap();
        }
        let region_rows = {
            let m = open_all(&paths);
            raid_core::metadata::read_superblock(m[0].as_ref())
                .unwrap()
                .bitmap_region_rows
        };
        let opts = raid_core::array::AssembleOptions {
            resync: raid_core::array::ResyncAt::Background,
            ..Default::default()
        };
        let a = raid_core::array::Array::assemble_with(open_all(&paths), opts)
            .unwrap()
            .array;
        let regions = a.resync_progress().unwrap().regions_total;
        let read = |a: &raid_core::array::Array| -> u64 {
            a.io_stats().members.iter().map(|m| m.io.read.bytes).sum()
        };
        let before = read(&a);
        a.run_resync().unwrap();
        let resync_read = read(&a) - before;
        assert!(!a.resync_owed(), "{tag}");
        // What the marked regions hold on every member.
        let marked = regions * region_rows * chunk * members as u64;
        assert!(
            resync_read > 0 && resync_read * 4 < marked,
            "{tag}: the resync read {resync_read} bytes of the {marked} its {regions} regions hold"
        );
        let scrub = raid_core::array::ScrubOptions::default();
        as_before(&a, &image, &scrub, &format!("{tag}: the resync"));
        drop(a);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
