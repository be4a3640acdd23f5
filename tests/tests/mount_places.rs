//! Where `raidctl mount` may mount: an empty folder that is not a mount
//! point (two arrays on one folder hid one another, and unmounting one
//! took the other's mount off); a mount left by a daemon that was killed
//! is cleared by the next mount, or named with the commands that clear
//! it while a filesystem is still mounted on its loop device.

use raid_e2e::{need, run_ok, World};
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn started(w: &World, name: &str) {
    let m = w.sparse_members(name, 3, 32 * MIB);
    w.ok(&["create", name, "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    w.ok(&["start", name]);
}

#[test]
fn a_mount_needs_an_empty_folder_that_is_not_a_mount_point() {
    let w = World::new("mnt-place");
    started(&w, "pa");
    started(&w, "pb");
    let dir = w.dir.join("shared");
    w.ok(&["mount", "pa", "--dir", s(&dir)]);
    // A second array on the same folder: refused, the first one untouched.
    let (code, _, err) = w.code(&["mount", "pb", "--dir", s(&dir)]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("mount point already"), "{err}");
    assert!(dir.join("pa").exists());
    // A folder that holds something (here: the members themselves).
    let (code, _, err) = w.code(&["mount", "pb", "--dir", s(&w.dir)]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not empty"), "{err}");
    assert!(w.dir.join("pb0.img").exists());
    w.ok(&["unmount", "pa"]);
    w.ok(&["mount", "pb", "--dir", s(&dir)]);
    assert!(dir.join("pb").exists());
    w.ok(&["unmount", "pb"]);
    w.ok(&["stop", "pa"]);
    w.ok(&["stop", "pb"]);
}

#[test]
fn a_mount_left_by_a_killed_daemon_is_cleared_or_named() {
    need("mkfs.ext4");
    let w = World::new("mnt-dead");
    started(&w, "pd");
    let dev = w
        .ok(&["mount", "pd", "--loop"])
        .lines()
        .next()
        .unwrap()
        .to_string();
    let dir = w.state().join("mnt").join("pd");
    w.kill_daemon();
    // The next start says the mount is dead.
    let out = w.ok(&["start", "pd"]);
    assert!(out.contains("left by a daemon"), "{out}");
    // Nothing mounted on its loop device: the next mount clears it.
    let out = w.ok(&["mount", "pd", "--loop"]);
    let note = out
        .lines()
        .find(|l| l.contains("left by a daemon that died"))
        .unwrap_or_default();
    assert!(
        note.contains("unmounted") && note.contains(&format!("{dev} detached")),
        "{out}"
    );
    let dev2 = out.lines().next().unwrap().to_string();
    run_ok(Command::new("mkfs.ext4").args(["-q", "-F", &dev2]));
    let mnt = w.dir.join("ext4");
    std::fs::create_dir_all(&mnt).unwrap();
    run_ok(Command::new("mount").arg(&dev2).arg(&mnt));
    w.kill_daemon();
    w.ok(&["start", "pd"]);
    // A filesystem still mounted on it: refused, with the commands.
    let (code, _, err) = w.code(&["mount", "pd", "--loop"]);
    assert_eq!(code, 1, "{err}");
    for step in [
        format!("umount {}", mnt.display()),
        format!("losetup -d {dev2}"),
        format!("umount -l {}", dir.display()),
    ] {
        assert!(err.contains(&step), "{step} missing from: {err}");
    }
    // Following them, the mount works again.
    run_ok(Command::new("umount").arg(&mnt));
    run_ok(Command::new("losetup").args(["-d", &dev2]));
    run_ok(Command::new("umount").arg("-l").arg(&dir));
    w.ok(&["mount", "pd", "--loop"]);
    w.ok(&["unmount", "pd"]);
    w.ok(&["stop", "pd"]);
}
