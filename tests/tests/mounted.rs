//! The array mounted: ext4 on `raidctl mount --loop` through a member
//! failure and a SIGTERM, the FUSE file's holes, concurrent I/O through
//! the file and the loop device, and who may open or unmount it. The
//! tools come from scripts/install-test-deps.sh.

use raid_e2e::{fio_verified_writes, need, run_ok as run, World};
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn ext4_on_the_loop_device_survives_a_member_failure() {
    for t in ["losetup", "mkfs.ext4", "mount"] {
        need(t);
    }
    let w = World::new("ext4");
    let (m, _sock, _uri) = w.served_raid5("fsx");
    let out = w.ok(&["mount", "fsx", "--loop"]);
    let dev = out.lines().next().unwrap().trim().to_string();
    assert!(dev.starts_with("/dev/loop"), "{out}");
    let mnt = w.dir.join("fs");
    std::fs::create_dir_all(&mnt).unwrap();
    run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]));
    run(Command::new("mount").arg(&dev).arg(&mnt));
    // Files of assorted sizes, with their contents remembered.
    let mut files = Vec::new();
    let mut x: u64 = 12345;
    for i in 0..40 {
        let len = 1000 + (i * 7919 * 13) % (3 << 20);
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let p = mnt.join(format!("f{i}.bin"));
        std::fs::write(&p, &data).unwrap();
        files.push((p, data));
    }
    run(&mut Command::new("sync"));
    w.ok(&["fail", "fsx", s(&m[1])]);
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    for (p, data) in &files {
        let got = std::fs::read(p).unwrap();
        assert!(
            got == *data,
            "{} differs after the member failure",
            p.display()
        );
    }
    // Stopping with the filesystem mounted is refused, not a data loss.
    let o = w.run(&["stop", "fsx"]);
    assert_eq!(o.status.code(), Some(4));
    run(Command::new("umount").arg(&mnt));
    w.ok(&["unmount", "fsx"]);
    w.ok(&["stop", "fsx"]);
}

/// A RAID5 served as `name`, mounted with a loop device that carries a
/// fresh ext4, mounted on the world's `fs` folder: the world, the loop
/// device, the mount point.
fn ext4_on_a_served_array(tag: &str, name: &str) -> (World, String, PathBuf) {
    for t in ["losetup", "mkfs.ext4", "mount"] {
        need(t);
    }
    let w = World::new(tag);
    w.served_raid5(name);
    let out = w.ok(&["mount", name, "--loop"]);
    let dev = out.lines().next().unwrap().trim().to_string();
    let mnt = w.dir.join("fs");
    std::fs::create_dir_all(&mnt).unwrap();
    run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]));
    run(Command::new("mount").arg(&dev).arg(&mnt));
    (w, dev, mnt)
}

/// Waits up to 30 s for process `pid` to be gone.
fn wait_for_exit(pid: i32) {
    let t = std::time::Instant::now();
    while unsafe { libc::kill(pid, 0) } == 0 && t.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// SIGTERM (systemctl stop) while a filesystem is mounted on the array's
/// loop device: the daemon does not take the device from under it. It
/// stops what it can, goes on serving that array (and answering
/// commands) until the filesystem is unmounted, then stops it clean and
/// exits; the filesystem's writes, synced only at its unmount, are there.
#[test]
fn sigterm_waits_for_a_filesystem_on_the_loop_device() {
    let (w, _dev, mnt) = ext4_on_a_served_array("termfs", "tfs");
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    // Written, not synced: in the filesystem's cache when the signal comes.
    std::fs::write(mnt.join("g.bin"), &data).unwrap();
    let pid = w.daemon_pid();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    std::thread::sleep(std::time::Duration::from_secs(3));
    // Still served: the daemon answers, the array runs, the file reads.
    assert_eq!(
        unsafe { libc::kill(pid, 0) },
        0,
        "the daemon exited under a mounted filesystem"
    );
    let st = w.status_json("tfs");
    assert_eq!(st["running"], true, "{st}");
    // And says why it runs on (the state alone read as any array's).
    let stopping = st["stopping"].as_str().unwrap_or_default();
    assert!(
        stopping.contains("SIGTERM") && stopping.contains(mnt.to_str().unwrap()),
        "{st}"
    );
    run(&mut Command::new("sync"));
    assert!(std::fs::read(mnt.join("g.bin")).unwrap() == data);
    // Nothing new is started meanwhile.
    let (code, _, err) = w.code(&["start", "tfs"]);
    assert_ne!(code, 0);
    assert!(err.contains("stopping"), "{err}");
    // A second signal changes nothing.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(unsafe { libc::kill(pid, 0) }, 0);
    run(Command::new("umount").arg(&mnt));
    wait_for_exit(pid);
    assert_ne!(
        unsafe { libc::kill(pid, 0) },
        0,
        "the daemon did not exit once unmounted"
    );
    let st = w.status_json("tfs");
    assert_eq!(st["state"], "stopped", "{st}");
    assert_ne!(st["unclean"], true, "{st}");
    // Back: the file is whole.
    let sock = w.dir.join("tfs.sock");
    w.ok(&["start", "tfs", "--nbd", &format!("unix:{}", sock.display())]);
    let out = w.ok(&["mount", "tfs", "--loop"]);
    let dev = out.lines().next().unwrap().trim().to_string();
    run(Command::new("mount").arg(&dev).arg(&mnt));
    let got = std::fs::read(mnt.join("g.bin")).unwrap();
    run(Command::new("umount").arg(&mnt));
    w.ok(&["unmount", "tfs"]);
    w.ok(&["stop", "tfs"]);
    assert!(got == data, "the file written before the signal differs");
}

/// The same, with the loop device detached by someone else while the
/// filesystem was mounted (`losetup -d`: the kernel lets it go at the
/// unmount): the daemon does not wait for it for ever.
#[test]
fn sigterm_after_the_loop_device_was_detached_elsewhere_still_ends() {
    let (w, dev, mnt) = ext4_on_a_served_array("termdet", "tfd");
    let pid = w.daemon_pid();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    run(Command::new("losetup").args(["-d", &dev]));
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(
        unsafe { libc::kill(pid, 0) },
        0,
        "exited under the filesystem"
    );
    run(Command::new("umount").arg(&mnt));
    wait_for_exit(pid);
    assert_ne!(
        unsafe { libc::kill(pid, 0) },
        0,
        "the daemon waits for a loop device gone"
    );
    assert_eq!(w.status_json("tfd")["state"], "stopped");
}

/// Many requests at once through the FUSE file and its loop device: fio's
/// random writes at queue depth 32 on the loop device, then every block
/// verified; and 512-byte writes at queue depth 32 straight into the FUSE
/// file (the partial-block read-merge-write path), verified.
#[test]
fn concurrent_io_through_the_fuse_file_and_loop_device_verifies() {
    for t in ["losetup", "fio"] {
        need(t);
    }
    let w = World::new("fusecc");
    let (_m, _sock, _uri) = w.served_raid5("fcc");
    let out = w.ok(&["mount", "fcc", "--loop"]);
    let dev = out.lines().next().unwrap().trim().to_string();
    fio_verified_writes(
        "verify",
        48 * MIB,
        &[
            &format!("--filename={dev}"),
            "--ioengine=io_uring",
            "--direct=1",
            "--bs=4k",
            "--iodepth=32",
        ],
    );
    // 512-byte writes straight into the FUSE file, 32 at once: eight share
    // each 4 KiB block, so the partial-block read-merge-write runs for
    // neighbours at the same time; fio verifies every one.
    let file = w.state().join("mnt").join("fcc").join("fcc");
    assert!(file.exists(), "no FUSE file at {}", file.display());
    fio_verified_writes(
        "partial",
        4 * MIB,
        &[
            &format!("--filename={}", file.display()),
            "--ioengine=io_uring",
            "--direct=1",
            "--bs=512",
            "--offset=64M",
            "--iodepth=32",
        ],
    );
    w.ok(&["unmount", "fcc"]);
    w.ok(&["stop", "fcc"]);
}

/// The FUSE file answers SEEK_DATA and SEEK_HOLE from the array's holes,
/// so `cp --sparse` and the like skip what reads as zeros: a sparse
/// array's data where it was written, holes elsewhere, the end a hole.
#[test]
fn the_fuse_file_tells_its_holes_from_its_data() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let w = World::new("seek");
    if w.sparse_raid5("seek").is_none() {
        return;
    }
    w.ok(&["start", "seek"]);
    w.ok(&["mount", "seek"]);
    let path = w.state().join("mnt").join("seek").join("seek");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let stripe: i64 = 3 * 64 * 1024;
    f.write_all_at(&[7u8; 4096], 10 * stripe as u64 + 4096)
        .unwrap();
    let cap = f.metadata().unwrap().len() as i64;
    let seek = |at: i64, whence| {
        // SAFETY: lseek on a file we hold open.
        let r = unsafe { libc::lseek(f.as_raw_fd(), at, whence) };
        if r < 0 {
            Err(std::io::Error::last_os_error().raw_os_error())
        } else {
            Ok(r)
        }
    };
    assert_eq!(seek(0, libc::SEEK_DATA), Ok(10 * stripe));
    assert_eq!(seek(0, libc::SEEK_HOLE), Ok(0));
    // Data in the stripe's first chunk only: its other chunks' members
    // hold holes.
    let chunk = 64 * 1024;
    assert_eq!(
        seek(10 * stripe + 5, libc::SEEK_HOLE),
        Ok(10 * stripe + chunk)
    );
    assert_eq!(
        seek(10 * stripe + chunk, libc::SEEK_DATA),
        Err(Some(libc::ENXIO))
    );
    assert_eq!(seek(10 * stripe + 5, libc::SEEK_DATA), Ok(10 * stripe + 5));
    assert_eq!(seek(11 * stripe, libc::SEEK_DATA), Err(Some(libc::ENXIO)));
    assert_eq!(seek(11 * stripe, libc::SEEK_HOLE), Ok(11 * stripe));
    assert_eq!(seek(cap, libc::SEEK_DATA), Err(Some(libc::ENXIO)));
    drop(f);
    w.ok(&["unmount", "seek"]);
    w.ok(&["stop", "seek"]);
}

/// An unmount while the FUSE file is still in use is refused and changes
/// nothing (it used to be logged by the FUSE crate and reported as done,
/// and `stop` then closed the array under a mount that kept serving it).
#[test]
fn unmount_of_a_busy_mount_is_refused_and_changes_nothing() {
    let w = World::new("busy");
    let (_m, _sock, _uri) = w.served_raid5("busy");
    w.ok(&["mount", "busy"]);
    let file = w.state().join("mnt").join("busy").join("busy");
    let held = std::fs::File::open(&file).unwrap();
    let (code, out, err) = w.code(&["unmount", "busy"]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(err.contains("still in use"), "{err}");
    let (code, _, err) = w.code(&["stop", "busy"]);
    assert_eq!(code, 4, "stop must refuse while mounted: {err}");
    // Still mounted and serving.
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 4096];
    held.read_exact_at(&mut b, 0).unwrap();
    drop(held);
    w.ok(&["unmount", "busy"]);
    assert!(!file.exists());
    w.ok(&["stop", "busy"]);
}

/// The FUSE file is the raw array, mode 0600: another user can neither
/// read nor write it (the mount enforces the file's mode), while root can.
#[test]
fn only_root_opens_the_fuse_file() {
    need("setpriv");
    let w = World::new("fuseperm");
    let (_m, _sock, _uri) = w.served_raid5("fperm");
    w.ok(&["mount", "fperm"]);
    let file = w.state().join("mnt").join("fperm").join("fperm");
    let as_nobody = |cmd: &str| {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
            ])
            .arg(cmd)
            .output()
            .unwrap()
    };
    // The directory chain is root's temporary folder: let others through
    // it, so that only the file's own mode decides.
    let mut d = file.parent().unwrap().to_path_buf();
    while d.starts_with(&w.dir) {
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).ok();
        d.pop();
    }
    for cmd in [
        format!("head -c 4096 {} > /dev/null", file.display()),
        format!(
            "printf x | dd of={} conv=notrunc status=none",
            file.display()
        ),
    ] {
        let o = as_nobody(&cmd);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("Permission denied"),
            "another user got through: {cmd}: {err}"
        );
    }
    assert!(std::fs::File::open(&file).is_ok(), "root cannot open it");
    w.ok(&["unmount", "fperm"]);
    w.ok(&["stop", "fperm"]);
}
