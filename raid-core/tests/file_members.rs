//! What a file member knows of where its bytes live: a file on tmpfs is a
//! copy in memory (its I/O runs in place, reads in the caller's thread);
//! a block device is not, though its node lives on devtmpfs, which answers
//! fstatfs with tmpfs's magic number. Taken for memory, a drive's reads
//! would block the thread that asked for them (a front end's reader).

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
