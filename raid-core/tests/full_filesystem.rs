//! Sparse member files on a filesystem that fills up. A RAID5/6 write whose
//! data write met the full filesystem while its parity writes
//! (overwrites, needing no new block) landed would leave the stripe's
//! parity saying a chunk holds what it does not, and a member failing
//! before the next start's resync would rebuild the stripe's other chunk
//! wrong. The array reserves a write's space on every member it writes
//! before any of them (`Member::reserve`), so the full filesystem refuses
//! the write whole: nothing written, the stripe as it was.
//!
//! Each test mounts a small tmpfs of its own (root is needed: without it
//! they say so and pass untried).

use raid_core::array::{Array, CreateOptions};
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{FileMember, MemberRef};
use raid_core::metadata::SlotState;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const CHUNK: u64 = 64 << 10;

/// A tmpfs of `mib` MiB, unmounted when dropped.
struct SmallTmpfs {
    dir: PathBuf,
}

impl SmallTmpfs {
    fn mount(tag: &str, mib: u64) -> Option<SmallTmpfs> {
        let dir = std::env::temp_dir().join(format!("raid-full-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let size = format!("size={}k", mib * 1024);
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("cannot mount a tmpfs here (root needed): not tried");
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(SmallTmpfs { dir })
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A RAID5 of three, or a RAID6 of four, sparse 8 MiB member files on
/// `fs`: two data chunks a stripe either way.
fn sparse_array(fs: &SmallTmpfs, level: Level) -> Arc<Array> {
    let n = 2 + level.parity_chunks();
    let members: Vec<MemberRef> = (0..n)
        .map(|i| {
            let p = fs.dir.join(format!("m{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(8 * MIB).unwrap();
            Arc::new(FileMember::open(&p).unwrap()) as MemberRef
        })
        .collect();
    let opts = CreateOptions {
        name: "full".into(),
        level,
        chunk: CHUNK,
        data_offset: None,
    };
    Arc::new(Array::create(members, vec![], opts).unwrap())
}

/// Fills the rest of the filesystem at `dir`, a page at a time, until it
/// refuses.
fn fill(dir: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let page = [0x77u8; 4096];
    loop {
        match f.write_all(&page) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return,
            Err(e) => panic!("filling: {e}"),
        }
    }
}

/// The setup both tests share: in stripe `S`, the second data chunk
/// written whole (its member's blocks, and the parity's, allocated), the
/// first never written (a hole on its member), then the filesystem
/// filled. Returns the slots of the two data chunks, the second's array
/// offset and its bytes.
fn stripe_with_a_hole_on_a_full_filesystem(
    a: &Array,
    fs: &SmallTmpfs,
) -> ([usize; 2], u64, Vec<u8>) {
    const S: u64 = 3;
    let geo = a.geometry();
    let second = S * 2 * CHUNK + CHUNK;
    let bytes: Vec<u8> = (0..CHUNK as usize)
        .map(|i| (i * 13 + i / 4096) as u8)
        .collect();
    a.write(second, &bytes).unwrap();
    a.flush().unwrap();
    fill(&fs.dir);
    let map = geo.stripe_map(S);
    ([map.members[0], map.members[1]], second, bytes)
}

/// After the refused write: the first data chunk's member is the one
/// named out of space (its block was the one to find no room), no member
/// failed; the second's fails now, and its chunk, recovered from the
/// first data chunk and the parity, is what was written.
fn recovered_right(
    a: &Array,
    fs: &SmallTmpfs,
    [first, second_slot]: [usize; 2],
    second: u64,
    bytes: &[u8],
) {
    let named = fs.dir.join(format!("m{first}.img"));
    assert_eq!(a.out_of_space(), Some(named.display().to_string()));
    assert!(a.slots().iter().all(|s| s.state == SlotState::Active));
    a.fail_member(second_slot, false).unwrap();
    let mut back = vec![0u8; bytes.len()];
    a.read(second, &mut back).unwrap();
    let wrong = back.iter().zip(bytes).filter(|(x, y)| x != y).count();
    assert_eq!(
        wrong, 0,
        "{wrong} bytes of the chunk rebuilt wrong: the stripe was torn"
    );
}

/// For RAID5 and RAID6, each on a tmpfs of its own: the stripe of
/// `stripe_with_a_hole_on_a_full_filesystem`, then `refused` (a 4 KiB
/// write at the offset given, into the first data chunk's hole: a new
/// block on its member, and overwrites of the parity's, which must be
/// refused), then `recovered_right`.
fn on_each_level(tag: &str, refused: impl Fn(&Arc<Array>, Level, u64)) {
    for level in [Level::Raid5, Level::Raid6] {
        let Some(fs) = SmallTmpfs::mount(tag, 20) else {
            return;
        };
        let a = sparse_array(&fs, level);
        let (slots, second, bytes) = stripe_with_a_hole_on_a_full_filesystem(&a, &fs);
        refused(&a, level, second - CHUNK + 8192);
        recovered_right(&a, &fs, slots, second, &bytes);
    }
}

#[test]
fn a_write_that_meets_a_full_filesystem_tears_no_stripe() {
    on_each_level("blocking", |a, level, at| {
        let e = a.write(at, &[0xa5u8; 4096]).unwrap_err();
        assert!(e.to_string().contains("out of space"), "{level}: {e}");
    });
}

/// The same write given to the shards (its members on tmpfs: the caller's
/// thread runs it, as a shard would, `shard::inline`): rows not reserved
/// send it to the blocking path, which reserves them before writing.
#[test]
fn a_write_given_to_the_shards_meets_a_full_filesystem_whole() {
    on_each_level("shards", |a, level, at| {
        let e = raid_core::shard::Engine::start(a.clone(), 1).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut data = AlignedBuf::new(4096);
        data.fill(0xa5);
        e.write(at, data, Box::new(move |r| tx.send(r.map(|_| ())).unwrap()));
        assert!(
            rx.recv().unwrap().is_err(),
            "{level}: the write was refused"
        );
    });
}
