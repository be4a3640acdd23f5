//! The FUSE export over io_uring, where the kernel has it (Linux 6.14 on:
//! the fuse module's `enable_uring` parameter): switched on for this test
//! (and back to what it was after), the mounted array must take fio's
//! verified random writes at depth, partial-block writes into the FUSE
//! file, and a filesystem through a member failure, with the requests
//! counted through the ring. It does so twice: with members on a disk
//! (a thread per ring entry) and with members in memory (threads serving
//! several entries, answering in batches), checking the shape the log
//! says. With RAIDCTL_FUSE_URING=0 the same mount is
//! served by the threads reading /dev/fuse. A kernel without the parameter
//! (or a run without root) says "skipped" and checks nothing.
//!
//! One test in its own binary: the parameter is global, and the other
//! export tests (another binary, never run at the same time) keep the
//! kernel's default.

use raid_e2e::{fio_verified_writes, need, run_ok as run, World};
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;
const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Sets the parameter, and puts the old value back on drop.
struct Uring(String);

impl Uring {
    fn on() -> Option<Uring> {
        let old = std::fs::read_to_string(PARAM).ok()?;
        std::fs::write(PARAM, "Y").ok()?;
        Some(Uring(old.trim().to_string()))
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        let _ = std::fs::write(PARAM, &self.0);
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// fio random writes of `size` bytes at depth 32, each verified after.
fn fio_verified(target: &str, size: u64, bs: &str, extra: &[&str]) {
    let (file, bs) = (format!("--filename={target}"), format!("--bs={bs}"));
    let mut args = vec![
        file.as_str(),
        bs.as_str(),
        "--ioengine=io_uring",
        "--direct=1",
        "--iodepth=32",
    ];
    args.extend(extra);
    fio_verified_writes("v", size, &args);
}

/// A started RAID5 of four members, its daemon started with `env`.
fn started(w: &World, name: &str, env: &[(&str, &str)]) -> Vec<PathBuf> {
    let m = w.raid5_of_four(name, 128 * MIB);
    let o = w.run_env(&["start", name], env);
    assert!(o.status.success(), "{o:?}");
    m
}

fn daemon_log(w: &World) -> String {
    std::fs::read_to_string(w.state().join("daemon.log")).unwrap_or_default()
}

/// The number the log puts just before `words` (its first mention).
fn number_before(log: &str, words: &str) -> Option<u64> {
    let at = log.find(words)?;
    log[..at].rsplit(' ').next()?.parse().ok()
}

/// "N requests served through the ring", from the log at unmount.
fn served_through_ring(log: &str) -> Option<u64> {
    number_before(log, " requests served through the ring")
}

/// "E entries in all, served by T threads", from the log at mount.
fn ring_shape(log: &str) -> Option<(u64, u64)> {
    let entries = number_before(log, " entries in all, served by ")?;
    let threads = number_before(log, " threads; /dev/fuse threads answer")?;
    Some((entries, threads))
}

/// "up to B per io_uring_enter", from the log at unmount: the most
/// requests one wake-up brought a serving thread.
fn largest_batch(log: &str) -> Option<u64> {
    number_before(log, " per io_uring_enter")
}

/// How the ring is expected to be served: a thread per entry (members on
/// a disk), or threads answering several requests per wake-up (members in
/// memory).
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    ThreadPerEntry,
    Batched,
}

#[test]
fn the_mounted_array_over_fuse_io_uring() {
    for t in ["losetup", "fio", "mkfs.ext4", "mount"] {
        need(t);
    }
    let Some(_uring) = Uring::on() else {
        println!("skipped: no {PARAM} to switch on (kernel before 6.14, or not root)");
        return;
    };
    // Members on a disk (the build's own folder): a thread per entry.
    let disk = Path::new(env!("CARGO_TARGET_TMPDIR"));
    if raid_e2e::on_memory_fs(disk) {
        println!(
            "skipped the members on a disk: {} is in memory",
            disk.display()
        );
    } else {
        served_through_the_ring(World::under(disk, "fuse-uring"), Shape::ThreadPerEntry);
    }
    // Members in memory: threads answering in batches.
    let shm = Path::new("/dev/shm");
    if raid_e2e::free_bytes(shm) < 2 << 30 {
        println!("skipped the members in memory: under 2 GiB free in /dev/shm");
    } else {
        let w = World::in_memory("fuse-uring-mem").expect("/dev/shm");
        served_through_the_ring(w, Shape::Batched);
    }
    served_through_dev_fuse();
}

/// A RAID5 in `w` mounted over the ring: fio's verified writes at depth
/// through the loop device, partial blocks into the FUSE file, ext4
/// through a member failure, served in the `shape` expected.
fn served_through_the_ring(w: World, shape: Shape) {
    // The default shape, whatever the caller's environment says.
    let m = started(
        &w,
        "fu",
        &[("RAIDCTL_LOG", "info"), ("RAIDCTL_FUSE_URING", "")],
    );
    let out = w.ok(&["mount", "fu", "--loop"]);
    let dev = out.lines().next().unwrap().trim().to_string();
    let log = daemon_log(&w);
    assert!(
        log.contains("FUSE transport: io_uring"),
        "the ring is not used:\n{log}"
    );
    let (entries, threads) = ring_shape(&log).unwrap_or_else(|| panic!("no ring shape:\n{log}"));
    match shape {
        Shape::ThreadPerEntry => assert_eq!(entries, threads, "{log}"),
        Shape::Batched => assert!(entries > threads, "{log}"),
    }
    // `status` says how the mount is served, as the log does.
    let st = w.status_json("fu");
    let exports = st["exports"].to_string();
    let said = format!("{entries} entries, {threads} threads");
    assert!(
        exports.contains("io_uring, ") && exports.contains(&said),
        "{exports}"
    );
    // Block I/O at depth through the loop device, then partial blocks
    // straight into the FUSE file (read-merge-write of shared blocks).
    fio_verified(&dev, 32 * MIB, "4k", &[]);
    let file = w.state().join("mnt").join("fu").join("fu");
    fio_verified(s(&file), 2 * MIB, "512", &["--offset=64M"]);
    // A filesystem, through a member failure.
    let mnt = w.dir.join("fs");
    std::fs::create_dir_all(&mnt).unwrap();
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-E", "nodiscard", &dev]));
    run(Command::new("mount").arg(&dev).arg(&mnt));
    let data: Vec<u8> = (0..(5 << 20) as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    for i in 0..6 {
        std::fs::write(mnt.join(format!("f{i}")), &data[i * 100_000..]).unwrap();
    }
    run(&mut Command::new("sync"));
    w.ok(&["fail", "fu", s(&m[2])]);
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    for i in 0..6 {
        let got = std::fs::read(mnt.join(format!("f{i}"))).unwrap();
        assert!(got == data[i * 100_000..], "f{i} differs after the failure");
    }
    let outgrown = match shape {
        Shape::Batched => outgrow_memory(&w, &m[2], &mnt),
        Shape::ThreadPerEntry => None,
    };
    run(Command::new("umount").arg(&mnt));
    w.ok(&["unmount", "fu"]);
    let log = daemon_log(&w);
    let n = served_through_ring(&log).unwrap_or_else(|| panic!("no ring count:\n{log}"));
    // fio alone wrote 32 MiB in 4 KiB requests (and read them back).
    assert!(n > 16_000, "only {n} requests through the ring");
    // At QD 32, a thread serving several entries is brought several
    // requests at once.
    let batch = largest_batch(&log).unwrap_or_else(|| panic!("no batch size:\n{log}"));
    if shape == Shape::Batched {
        assert!(batch > 1, "{log}");
    }
    // No entry lost, no reply refused, no fallback on the way; where a
    // member left memory, that said (once).
    let said = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    let outgrown_said = said("a member is no longer in memory");
    assert_eq!(said("FUSE ring:"), outgrown_said, "{log}");
    assert_eq!(outgrown_said, usize::from(outgrown.is_some()), "{log}");
    w.ok(&["stop", "fu"]);
    if let Some(p) = outgrown {
        std::fs::remove_file(p).unwrap();
    }
}

/// Members in memory, the mount served in batches: the failed member is
/// replaced by a file on a disk (the build's own folder) and rebuilt, so
/// the array is no longer all in memory. Verified writes at depth into
/// the filesystem must still land, and the daemon must say that the
/// mount's shape no longer fits. Returns the new member's file (None:
/// skipped, the build's folder is in memory too).
fn outgrow_memory(w: &World, failed: &Path, mnt: &Path) -> Option<PathBuf> {
    let disk = Path::new(env!("CARGO_TARGET_TMPDIR"));
    if raid_e2e::on_memory_fs(disk) {
        println!("skipped leaving memory: {} is in memory", disk.display());
        return None;
    }
    let new = disk.join(format!("fuse-uring-new-{}.img", std::process::id()));
    let size = std::fs::metadata(failed).unwrap().len();
    std::fs::File::create(&new).unwrap().set_len(size).unwrap();
    w.ok(&["replace", "fu", s(failed), s(&new)]);
    w.ok(&["wait", "fu", "--timeout", "120"]);
    fio_verified(s(&mnt.join("after")), 8 * MIB, "4k", &[]);
    Some(new)
}

/// Asked not to use it: the threads reading /dev/fuse serve the mount.
fn served_through_dev_fuse() {
    let w = World::new("fuse-uring-off");
    started(
        &w,
        "fo",
        &[("RAIDCTL_LOG", "info"), ("RAIDCTL_FUSE_URING", "0")],
    );
    let dev = w
        .ok(&["mount", "fo", "--loop"])
        .lines()
        .next()
        .unwrap()
        .trim()
        .to_string();
    fio_verified(&dev, 8 * MIB, "4k", &[]);
    let exports = w.status_json("fo")["exports"].to_string();
    assert!(exports.contains("/dev/fuse, "), "{exports}");
    w.ok(&["unmount", "fo"]);
    let log = daemon_log(&w);
    assert!(!log.contains("FUSE transport: io_uring"), "{log}");
    assert!(served_through_ring(&log).is_none(), "{log}");
    assert!(log.contains("offered by the kernel, not used"), "{log}");
    w.ok(&["stop", "fo"]);
}
