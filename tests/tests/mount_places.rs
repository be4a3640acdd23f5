//! Where `raidctl mount` may mount: an empty folder that is not a mount
//! point (two arrays on one folder hid one another, and unmounting one
//! took the other's mount off); a mount left by a daemon that was killed
//! is cleared by the next mount, or named with the commands that clear
//! it while a filesystem is still mounted on its loop device.

use raid_e2e::{need, run_ok, World};
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;

/// Tests that attach loop devices or look at who holds them take turns:
/// `losetup --find` opens devices another test is checking, which reads
/// as "in use by losetup" there.
fn loops_one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOOPS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOOPS.lock().unwrap_or_else(|e| e.into_inner())
}

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
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("mount point already"), "{err}");
    assert!(dir.join("pa").exists());
    // A folder that holds something (here: the members themselves).
    let (code, _, err) = w.code(&["mount", "pb", "--dir", s(&w.dir)]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("not empty"), "{err}");
    assert!(w.dir.join("pb0.img").exists());
    w.ok(&["unmount", "pa"]);
    // The folder mount made is gone with the mount (it was left behind).
    assert!(!dir.exists(), "{} left behind", dir.display());
    // And the parents it made for it.
    let deep = w.dir.join("made").join("for").join("it");
    w.ok(&["mount", "pa", "--dir", s(&deep)]);
    w.ok(&["unmount", "pa"]);
    assert!(!w.dir.join("made").exists(), "parents left behind");
    // One that was there stays.
    std::fs::create_dir_all(&dir).unwrap();
    w.ok(&["mount", "pb", "--dir", s(&dir)]);
    assert!(dir.join("pb").exists());
    w.ok(&["unmount", "pb"]);
    assert!(dir.is_dir());
    w.ok(&["stop", "pa"]);
    w.ok(&["stop", "pb"]);
}

/// Whether anything is mounted on `dir` (/proc/mounts, which never calls
/// into a dead FUSE mount).
fn mounted(dir: &Path) -> bool {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(s(&dir)))
}

#[test]
fn a_mount_left_by_a_killed_daemon_is_cleared_or_named() {
    let _one = loops_one_at_a_time();
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
    // The start names the filesystem whose I/O now fails.
    let out = w.ok(&["start", "pd"]);
    assert!(
        out.contains("left by a daemon")
            && out.contains(&format!("{dev2} mounted on {}", mnt.display())),
        "{out}"
    );
    // A filesystem still mounted on it: refused, with the commands.
    let (code, _, err) = w.code(&["mount", "pd", "--loop"]);
    assert_eq!(code, 4, "{err}");
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
    let dev3 = w
        .ok(&["mount", "pd", "--loop"])
        .lines()
        .next()
        .unwrap()
        .to_string();
    // A process holding the loop device open: unmount refuses and changes
    // nothing (a detach would only mark the device to go when it closes,
    // and the export would vanish then).
    let mut holder = Command::new("sh")
        .args(["-c", &format!("exec sleep 30 3<{dev3}")])
        .spawn()
        .unwrap();
    raid_e2e::eventually("the holder opens the loop device", || {
        std::fs::read_dir(format!("/proc/{}/fd", holder.id()))
            .map(|d| {
                d.flatten()
                    .any(|f| std::fs::read_link(f.path()).is_ok_and(|t| t == Path::new(&dev3)))
            })
            .unwrap_or(false)
    });
    let (code, _, err) = w.code(&["unmount", "pd"]);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains(&format!("{dev3} is in use (open by pid")),
        "{err}"
    );
    let flags = run_ok(Command::new("losetup").args(["-n", "-O", "AUTOCLEAR", &dev3]));
    assert_eq!(
        flags.trim(),
        "0",
        "the refused unmount marked {dev3} to detach"
    );
    w.ok(&["unmount", "pd"]);
    // A mount a killed daemon left, with nothing on its loop device:
    // unmount clears it (it said "not mounted"), and so does stop.
    w.ok(&["mount", "pd"]);
    w.kill_daemon();
    w.ok(&["start", "pd"]);
    let out = w.ok(&["unmount", "pd"]);
    assert!(
        out.contains("left by a daemon that died: unmounted"),
        "{out}"
    );
    assert!(!mounted(&dir), "{} still mounted", dir.display());
    w.ok(&["mount", "pd"]);
    w.kill_daemon();
    w.ok(&["start", "pd"]);
    let out = w.ok(&["stop", "pd"]);
    assert!(
        out.contains("left by a daemon that died: unmounted"),
        "{out}"
    );
    assert!(!mounted(&dir), "{} still mounted", dir.display());
    // The same with the array not started again: no daemon serves it, and
    // unmount and stop clear the mount and its loop device all the same
    // (they said the array was not running and left both).
    for cmd in ["unmount", "stop"] {
        w.ok(&["start", "pd"]);
        let dev = w
            .ok(&["mount", "pd", "--loop"])
            .lines()
            .next()
            .unwrap()
            .to_string();
        w.kill_daemon();
        let out = w.ok(&[cmd, "pd"]);
        assert!(
            out.contains("left by a daemon that died: unmounted")
                && out.contains(&format!("loop device {dev} detached"))
                && out.contains("is not running"),
            "{cmd}: {out}"
        );
        assert!(!mounted(&dir), "{cmd}: {} still mounted", dir.display());
        let (code, _, err) = w.code(&[cmd, "pd"]);
        assert_eq!(code, 4, "{cmd} again: {err}");
    }
    // A mount in a folder of the operator's choosing: the start names it
    // too (it looked in the default folder only).
    let own = w.dir.join("own-place");
    std::fs::create_dir_all(&own).unwrap();
    w.ok(&["start", "pd"]);
    w.ok(&["mount", "pd", "--dir", s(&own)]);
    w.kill_daemon();
    let out = w.ok(&["start", "pd"]);
    assert!(
        out.contains(&format!(
            "{} is a FUSE mount left by a daemon",
            own.display()
        )),
        "{out}"
    );
    w.ok(&["unmount", "pd"]);
    assert!(!mounted(&own), "{} still mounted", own.display());
    w.ok(&["stop", "pd"]);
}

/// The array's mount taken off by hand, and a tmpfs mounted on the folder
/// after it: the kernel gives the tmpfs the freed device number, which was
/// all `unmount` and `stop` checked, so they unmounted the tmpfs (and its
/// files were gone). Now the mount is known by its source too: status
/// says it is gone, `unmount` and `stop` leave the tmpfs alone, and a new
/// `mount` forgets the old one rather than refusing as "already mounted".
#[test]
fn a_mount_taken_off_by_hand_leaves_what_is_mounted_there_since() {
    let w = World::new("mnt-byhand");
    started(&w, "ph");
    let dir = w.dir.join("m");
    for stop in [false, true] {
        w.ok(&["mount", "ph", "--dir", s(&dir)]);
        run_ok(Command::new("umount").arg(&dir));
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "by-hand"])
                .arg(&dir),
        );
        std::fs::write(dir.join("precious"), b"keep me").unwrap();
        let st = w.ok(&["status", "ph"]);
        assert!(st.contains("gone"), "{st}");
        let out = match stop {
            false => w.ok(&["unmount", "ph"]),
            true => w.ok(&["stop", "ph"]),
        };
        assert!(mounted(&dir), "{out}: the tmpfs was unmounted");
        assert_eq!(
            std::fs::read(dir.join("precious")).unwrap(),
            b"keep me",
            "{out}"
        );
        run_ok(Command::new("umount").arg(&dir));
        if !stop {
            assert!(out.contains("taken off outside raidctl"), "{out}");
            // Mounted again, then taken off by hand: the next mount
            // forgets it.
            w.ok(&["mount", "ph", "--dir", s(&dir)]);
            run_ok(Command::new("umount").arg(&dir));
            let out = w.ok(&["mount", "ph", "--dir", s(&dir)]);
            assert!(out.contains("forgotten"), "{out}");
            w.ok(&["unmount", "ph"]);
        }
    }
}

/// A loop device attached to the array's file by hand holds the mount,
/// which `fuser` shows only as "kernel mount": `unmount` names it.
#[test]
fn unmount_names_a_loop_device_attached_by_hand() {
    let _one = loops_one_at_a_time();
    need("losetup");
    let w = World::new("mnt-loop-hand");
    started(&w, "pl");
    let dir = w.dir.join("m");
    w.ok(&["mount", "pl", "--dir", s(&dir)]);
    let dev = run_ok(
        Command::new("losetup")
            .args(["--find", "--show"])
            .arg(dir.join("pl")),
    );
    let dev = dev.trim().to_string();
    let (code, _, err) = w.code(&["unmount", "pl"]);
    run_ok(Command::new("losetup").args(["-d", &dev]));
    assert_eq!(code, 4, "{err}");
    assert!(err.contains(&format!("losetup -d {dev}")), "{err}");
    w.ok(&["unmount", "pl"]);
    w.ok(&["stop", "pl"]);
}

/// The array's mount taken off lazily (`umount -l`) while a loop device
/// attached by hand still reads and writes through it: the connection
/// lives on. `unmount` (and the next `mount`) ended it, cutting that loop
/// device's user off; they now refuse, naming the loop device, and go on
/// once it is let go.
#[test]
fn a_mount_taken_off_lazily_but_still_used_is_not_cut() {
    let _one = loops_one_at_a_time();
    need("losetup");
    let w = World::new("mnt-lazy");
    started(&w, "pz");
    let dir = w.dir.join("m");
    w.ok(&["mount", "pz", "--dir", s(&dir)]);
    let dev = run_ok(
        Command::new("losetup")
            .args(["--find", "--show"])
            .arg(dir.join("pz")),
    );
    let dev = dev.trim().to_string();
    run_ok(Command::new("umount").arg("-l").arg(&dir));
    let (code, _, err) = w.code(&["unmount", "pz"]);
    let (code2, _, err2) = w.code(&["mount", "pz", "--dir", s(&dir)]);
    // Still served: the loop device reads.
    let read = Command::new("dd")
        .args([
            &format!("if={dev}"),
            "of=/dev/null",
            "bs=4096",
            "count=16",
            "iflag=direct",
        ])
        .output()
        .unwrap();
    run_ok(Command::new("losetup").args(["-d", &dev]));
    assert_eq!(code, 4, "{err}");
    assert!(err.contains(&dev) && err.contains("still in use"), "{err}");
    assert_eq!(code2, 4, "{err2}");
    assert!(
        read.status.success(),
        "the loop device was cut off: {read:?}"
    );
    // Let go of: the connection ends with it, and unmount forgets it.
    std::thread::sleep(std::time::Duration::from_millis(500));
    w.ok(&["unmount", "pz"]);
    w.ok(&["stop", "pz"]);
}
