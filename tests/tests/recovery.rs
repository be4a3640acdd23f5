//! docs/recovery.md, run: each section of the runbook as a test that types
//! its commands as written and checks that the data came through.

use raid_e2e::{qemu_io, World};
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A started array with 0x5a written over its first 8 MiB through NBD.
fn running(w: &World, name: &str, level: &str, m: &[PathBuf], sparse: bool) -> PathBuf {
    let mut args = vec!["create", name, "--level", level, "--chunk", "16K"];
    if sparse {
        args.push("--sparse");
    }
    args.extend(m.iter().map(|p| s(p)));
    w.ok(&args);
    let sock = w.dir.join(format!("{name}.sock"));
    w.ok(&["start", name, "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(&sock, name, &["write -P 0x5a 0 8M", "flush"]);
    assert!(ok, "{text}");
    sock
}

fn reads(sock: &Path, name: &str, cmd: &str) {
    let (ok, text) = qemu_io(sock, name, &[cmd]);
    assert!(ok, "{cmd}: {text}");
}

fn scrub_clean(w: &World, name: &str) {
    // After an unclean start the resync runs first (a scrub waits for it).
    w.ok(&["wait", name]);
    let (code, out, err) = w.code(&["scrub", name]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(" 0 mismatches"), "{out}");
}

/// Each file's hash: compared before and after a command that must
/// change nothing on the members.
fn hashes(files: &[PathBuf]) -> Vec<u64> {
    files.iter().map(|p| raid_e2e::file_hash(p)).collect()
}

fn start_nbd(w: &World, name: &str, sock: &Path, extra: &[&str]) -> String {
    let spec = format!("unix:{}", sock.display());
    let mut args = vec!["start", name, "--nbd", &spec];
    args.extend(extra);
    w.ok(&args)
}

#[test]
fn runbook_i_failed_the_wrong_disk() {
    let w = World::new("rb-wrong");
    let m = w.sparse_members("w", 4, 32 * MIB);
    let sock = running(&w, "data", "5", &m, false);
    w.ok(&["fail", "data", s(&m[2])]);
    // Written while it is out: the only region a re-add copies back.
    reads(&sock, "data", "write -P 0x77 1M 64k");
    // 1. re-add; 2. wait.
    w.ok(&["re-add", "data", s(&m[2])]);
    let out = w.ok(&["wait", "data"]);
    assert!(out.contains("optimal"), "{out}");
    let ev = w.ok(&["events", "data"]);
    let line = ev
        .lines()
        .rev()
        .find(|l| l.contains("rebuild_finished"))
        .unwrap_or_else(|| panic!("{ev}"));
    let copied: u64 = line
        .split("finished: ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let rows = 31 * MIB / (16 * 1024);
    assert!(
        copied > 0 && copied < rows / 4,
        "copied {copied} of {rows}: {line}"
    );
    reads(&sock, "data", "read -P 0x5a 0 1M");
    reads(&sock, "data", "read -P 0x77 1M 64k");
    scrub_clean(&w, "data");
}

#[test]
fn runbook_one_drives_metadata_is_unreadable() {
    let w = World::new("rb-header");
    let m = w.sparse_members("h", 4, 32 * MIB);
    let sock = running(&w, "data", "6", &m, false);
    w.ok(&["stop", "data"]);
    // Both metadata copies of m[3] overwritten.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m[3])
        .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, &[0xEE; 8192], 0))
        .unwrap();
    let out = start_nbd(&w, "data", &sock, &[]);
    assert!(out.contains("no usable array metadata"), "{out}");
    assert_eq!(w.status_json("data")["state"], "degraded");
    let ex = w.ok(&["examine", s(&m[3])]);
    assert!(ex.contains("no array metadata"), "{ex}");
    reads(&sock, "data", "read -P 0x5a 0 8M");
    // The drive is healthy: it takes its own slot back, rebuilt in full.
    w.ok(&["replace", "data", s(&m[3]), s(&m[3])]);
    w.ok(&["wait", "data"]);
    reads(&sock, "data", "read -P 0x5a 0 8M");
    scrub_clean(&w, "data");
}

/// The same section, for a header damaged rather than overwritten: its
/// magic intact, both copies failing their checksums. The recorded device
/// takes its own slot back; a device no record names, with such metadata,
/// is refused with a way to erase it that works (wipefs does not know
/// raidctl's metadata).
#[test]
fn runbook_one_drives_metadata_is_damaged() {
    let w = World::new("rb-damaged");
    let m = w.sparse_members("d", 4, 32 * MIB);
    let sock = running(&w, "data", "6", &m, false);
    w.ok(&["stop", "data"]);
    let f = std::fs::OpenOptions::new().write(true).open(&m[3]).unwrap();
    for at in [100u64, 4096 + 100] {
        std::os::unix::fs::FileExt::write_all_at(&f, &[0xEE; 32], at).unwrap();
    }
    drop(f);
    // A copy of it, for a stranger below.
    let stranger = w.dir.join("stranger.img");
    std::fs::copy(&m[3], &stranger).unwrap();
    let out = start_nbd(&w, "data", &sock, &[]);
    assert!(
        out.contains("no usable array metadata") && out.contains("slot 3"),
        "{out}"
    );
    let (code, ex, _) = w.code(&["examine", s(&m[3])]);
    assert_eq!(code, 1, "{ex}");
    assert!(ex.contains("damaged"), "{ex}");
    // The healthy drive takes its own slot back, rebuilt in full.
    w.ok(&["replace", "data", s(&m[3]), s(&m[3])]);
    w.ok(&["wait", "data"]);
    reads(&sock, "data", "read -P 0x5a 0 8M");
    scrub_clean(&w, "data");
    // A stranger with damaged metadata: refused, with an erase that works.
    let (code, out, err) = w.code(&["add", "data", s(&stranger)]);
    assert_ne!(code, 0, "{out}");
    let dd = format!(
        "dd if=/dev/zero of={} bs=1M count=1 conv=notrunc",
        s(&stranger)
    );
    assert!(err.contains(&dd), "{err}");
    // As printed: a member file keeps its size.
    let args: Vec<&str> = dd.split(' ').collect();
    let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
    assert!(st.success());
    w.ok(&["add", "data", s(&stranger)]);
}

/// `start NAME --members` with one device of another array among NAME's
/// own: the stranger is named, whichever array's metadata is newer.
#[test]
fn a_start_names_the_device_of_another_array() {
    let w = World::new("rb-foreign");
    let ours = w.sparse_members("o", 3, 32 * MIB);
    let theirs = w.sparse_members("t", 3, 32 * MIB);
    running(&w, "ours", "5", &ours, false);
    let other_sock = running(&w, "theirs", "5", &theirs, false);
    // Their metadata goes past ours.
    for _ in 0..3 {
        w.ok(&["stop", "theirs"]);
        start_nbd(&w, "theirs", &other_sock, &[]);
    }
    w.ok(&["stop", "theirs"]);
    w.ok(&["stop", "ours"]);
    let before = hashes(&ours);
    let (code, out, err) = w.code(&[
        "start",
        "ours",
        "--members",
        s(&ours[0]),
        s(&ours[1]),
        s(&ours[2]),
        s(&theirs[1]),
    ]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains(&format!("{} carries array 'theirs'", s(&theirs[1]))),
        "{err}"
    );
    assert!(!err.contains(s(&ours[0])), "{err}");
    let after = hashes(&ours);
    assert_eq!(before, after);
    w.ok(&[
        "start",
        "ours",
        "--members",
        s(&ours[0]),
        s(&ours[1]),
        s(&ours[2]),
    ]);
}

#[test]
fn runbook_the_daemon_crashed() {
    let w = World::new("rb-crash");
    let m = w.sparse_members("c", 4, 32 * MIB);
    let sock = running(&w, "data", "5", &m, false);
    w.ok(&["fail", "data", s(&m[1])]);
    // Degraded writes in flight when the daemon dies.
    reads(&sock, "data", "write -P 0x33 2M 2M");
    w.kill_daemon();
    // Before the start: the status says it was not stopped cleanly.
    let st = w.status_json("data");
    assert_eq!(st["unclean"], true, "{st}");
    let (_, text, _) = w.code(&["status", "data"]);
    assert!(text.contains("not stopped cleanly"), "{text}");
    assert!(w.ok(&["list"]).contains("unclean"));
    start_nbd(&w, "data", &sock, &[]);
    // The event log says it went down uncleanly (only the daemon's log did).
    // Degraded: what was being written is checked once the rebuild ends,
    // not now (it said "0 regions were resynced").
    let events = w.ok(&["events", "data"]);
    assert!(
        events.contains("unclean_stop") && events.contains("until the rebuild ends"),
        "{events}"
    );
    reads(&sock, "data", "read -P 0x5a 0 2M");
    reads(&sock, "data", "read -P 0x33 2M 2M");
    let new = w.sparse("c-new.img", 32 * MIB);
    w.ok(&["replace", "data", s(&m[1]), s(&new)]);
    w.ok(&["wait", "data"]);
    scrub_clean(&w, "data");
    // A scrub the daemon dies in: the next start says it did not end (the
    // log ended at the scrub before, as if nothing had run).
    w.ok(&["rate", "data", "--scrub", "1M"]);
    w.ok(&["scrub", "data", "--background"]);
    w.kill_daemon();
    let out = start_nbd(&w, "data", &sock, &[]);
    assert!(out.contains("did not end"), "{out}");
    let events = w.ok(&["events", "data"]);
    assert!(events.contains("scrub_cut"), "{events}");
    // Said once: the start after a clean stop says nothing of it.
    w.ok(&["stop", "data"]);
    let out = start_nbd(&w, "data", &sock, &[]);
    assert!(!out.contains("did not end"), "{out}");
    w.ok(&["stop", "data"]);
}

/// A start after a crash of an optimal array is served at once: the
/// regions being written are resynced while it serves (the event says
/// so), `wait` waits for that resync, and a scrub after it is clean.
#[test]
fn a_start_after_a_crash_serves_while_it_resyncs() {
    let w = World::new("bg-resync");
    let m = w.sparse_members("r", 4, 32 * MIB);
    let sock = running(&w, "data", "5", &m, false);
    reads(&sock, "data", "write -P 0x44 1M 3M");
    w.kill_daemon();
    start_nbd(&w, "data", &sock, &[]);
    reads(&sock, "data", "read -P 0x44 1M 3M");
    let events = w.ok(&["events", "data"]);
    assert!(
        events.contains("unclean_stop") && events.contains("resynced while the array is served"),
        "{events}"
    );
    let out = w.ok(&["wait", "data"]);
    assert!(out.contains("optimal"), "{out}");
    scrub_clean(&w, "data");
    reads(&sock, "data", "read -P 0x5a 0 1M");
    reads(&sock, "data", "read -P 0x44 1M 3M");
    // The resync ran to its end: this stop is clean.
    let out = w.ok(&["stop", "data"]);
    assert!(out.contains("marked clean"), "{out}");
}

/// A RAID5 of members of 1 GiB or more keeps its degraded-write journal in
/// a 16 MiB ring (its data starts after it, as `examine` says), where small
/// members keep 1 MiB: degraded writes of more than the small ring holds, a
/// daemon killed after them and a start come through it.
#[test]
fn large_members_keep_a_large_journal_ring() {
    let w = World::new("big-ring");
    let m = w.sparse_members("b", 4, 1 << 30);
    let sock = running(&w, "big", "5", &m, true);
    let ex = w.ok(&["examine", s(&m[0])]);
    assert!(ex.contains("from 16.0 MiB on"), "{ex}");
    let small = w.sparse_members("s", 3, 64 * MIB);
    let mut args = vec!["create", "small", "--level", "5"];
    args.extend(small.iter().map(|p| s(p)));
    w.ok(&args);
    let ex = w.ok(&["examine", s(&small[0])]);
    assert!(ex.contains("from 1.0 MiB on"), "{ex}");
    w.ok(&["fail", "big", s(&m[1])]);
    reads(&sock, "big", "write -P 0x33 2M 4M");
    w.kill_daemon();
    start_nbd(&w, "big", &sock, &[]);
    reads(&sock, "big", "read -P 0x5a 0 2M");
    reads(&sock, "big", "read -P 0x33 2M 4M");
    reads(&sock, "big", "read -P 0x5a 6M 2M");
    w.ok(&["stop", "big"]);
}

#[test]
fn runbook_the_state_directory_is_lost() {
    let w = World::new("rb-state");
    let m = w.sparse_members("st", 3, 32 * MIB);
    let sock = running(&w, "data", "1", &m, false);
    w.ok(&["stop", "data"]);
    std::fs::remove_dir_all(w.state()).unwrap();
    // 1. examine finds which devices belong together.
    let out = w.ok(&["examine", s(&m[0]), s(&m[1]), s(&m[2]), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let uuids: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["array_uuid"].as_str().unwrap())
        .collect();
    assert!(uuids.iter().all(|u| *u == uuids[0]), "{out}");
    assert_eq!(v[0]["array"], "data");
    // 2. start with --members, in any order.
    let spec = format!("unix:{}", sock.display());
    w.ok(&[
        "start",
        "data",
        "--nbd",
        &spec,
        "--members",
        s(&m[2]),
        s(&m[0]),
        s(&m[1]),
    ]);
    assert_eq!(w.status_json("data")["state"], "optimal");
    reads(&sock, "data", "read -P 0x5a 0 8M");
    assert!(w.state().join("arrays/data.toml").exists());
}

#[test]
fn runbook_the_array_was_run_in_two_halves() {
    let w = World::new("rb-halves");
    let m = w.sparse_members("hv", 3, 32 * MIB);
    let sock = running(&w, "data", "1", &m, false);
    w.ok(&["fail", "data", s(&m[0])]);
    // Acknowledged by the half that stays: m[1] and m[2].
    reads(&sock, "data", "write -P 0xb2 1M 64k");
    w.ok(&["stop", "data"]);
    // The failed member started alone elsewhere (another host, another
    // state folder), written, and restarted: its event counter passes.
    let away = World::new("rb-halves-away");
    let away_sock = away.dir.join("away.sock");
    let spec = format!("unix:{}", away_sock.display());
    away.ok(&[
        "start",
        "data",
        "--nbd",
        &spec,
        "--members",
        s(&m[0]),
        "--force",
    ]);
    reads(&away_sock, "data", "write -P 0xc3 2M 64k");
    away.ok(&["stop", "data"]);
    for _ in 0..2 {
        away.ok(&["start", "data"]);
        away.ok(&["stop", "data"]);
    }
    let before = hashes(&m);
    // A plain start at home is refused, naming both halves; so is a forced one.
    for extra in [&[][..], &["--force"][..]] {
        let mut args = vec!["start", "data"];
        args.extend(extra);
        let (code, out, err) = w.code(&args);
        assert_ne!(code, 0, "{out}{err}");
        assert!(err.contains("split brain"), "{err}");
        assert!(err.contains(s(&m[0])) && err.contains(s(&m[1])), "{err}");
        assert!(err.contains("--members"), "{err}");
    }
    let after = hashes(&m);
    assert_eq!(before, after, "a refused start changed a member");
    // 1. examine shows the halves; 2. start from the half to keep.
    let ex = w.ok(&["examine", s(&m[0]), s(&m[1])]);
    assert!(ex.contains("events"), "{ex}");
    start_nbd(&w, "data", &sock, &["--members", s(&m[1]), s(&m[2])]);
    reads(&sock, "data", "read -P 0x5a 0 1M");
    reads(&sock, "data", "read -P 0xb2 1M 64k");
    // 3. The other half's device rejoins, copied whole.
    let out = w.ok(&["re-add", "data", s(&m[0])]);
    assert!(out.contains("whole") || out.contains("elsewhere"), "{out}");
    w.ok(&["wait", "data"]);
    reads(&sock, "data", "read -P 0xb2 1M 64k");
    scrub_clean(&w, "data");
}

/// A record older than the array (the state folder put back from a copy
/// taken before a spare took a slot): a start from it would mark the slot
/// failed for a device that is in sync and only not named. It is refused,
/// changing nothing; `--scan` finds the devices.
#[test]
fn a_start_from_a_record_older_than_the_array_is_refused() {
    let w = World::new("rb-oldrec");
    let m = w.sparse_members("r", 4, 32 * MIB);
    let sock = running(&w, "data", "5", &m[..3], false);
    let rec = w.state().join("arrays/data.toml");
    let old = std::fs::read(&rec).unwrap();
    w.ok(&["add", "data", s(&m[3])]);
    w.ok(&["fail", "data", s(&m[2])]);
    w.ok(&["wait", "data"]);
    reads(&sock, "data", "write -P 0x6e 1M 64k");
    w.ok(&["stop", "data"]);
    std::fs::write(&rec, &old).unwrap();
    let before = hashes(&m);
    let (code, out, err) = w.code(&["start", "data"]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("older than the array") && err.contains("--scan"),
        "{err}"
    );
    let after = hashes(&m);
    assert_eq!(before, after, "a refused start changed a member");
    let spec = format!("unix:{}", sock.display());
    w.ok(&["start", "data", "--nbd", &spec, "--scan", s(&w.dir)]);
    assert_eq!(w.status_json("data")["state"], "optimal");
    reads(&sock, "data", "read -P 0x5a 0 1M");
    reads(&sock, "data", "read -P 0x6e 1M 64k");
}

/// Not refused: the device the record lacks is being rebuilt (a replace
/// whose record was not saved before the host went down): the array
/// starts degraded, as a start with a drive missing does.
#[test]
fn a_record_without_a_replacement_being_rebuilt_still_starts() {
    let w = World::new("rb-midrep");
    let m = w.sparse_members("r", 4, 32 * MIB);
    running(&w, "data", "5", &m[..3], false);
    let rec = w.state().join("arrays/data.toml");
    let old = std::fs::read(&rec).unwrap();
    w.ok(&["rate", "data", "--rebuild", "1M"]);
    w.ok(&["fail", "data", s(&m[2])]);
    w.ok(&["replace", "data", s(&m[2]), s(&m[3])]);
    w.ok(&["stop", "data"]);
    std::fs::write(&rec, &old).unwrap();
    let out = w.ok(&["start", "data"]);
    assert!(out.contains("degraded"), "{out}");
    w.ok(&["stop", "data"]);
}

/// Nor where a recorded path holds another slot's member now (names that
/// moved while one drive died): the array starts degraded, finding each
/// device by its metadata.
#[test]
fn a_recorded_path_holding_another_slots_member_still_starts() {
    let w = World::new("rb-shift");
    let m = w.sparse_members("r", 3, 32 * MIB);
    running(&w, "data", "5", &m, false);
    w.ok(&["stop", "data"]);
    // Slot 1's drive is gone; slot 2's now answers at slot 1's name.
    std::fs::rename(&m[2], &m[1]).unwrap();
    let out = w.ok(&["start", "data"]);
    assert!(out.contains("degraded"), "{out}");
    w.ok(&["stop", "data"]);
}

#[test]
fn runbook_the_array_has_failed() {
    let w = World::new("rb-failed");
    let m = w.sparse_members("f", 4, 32 * MIB);
    let sock = running(&w, "data", "5", &m, false);
    // Mounted too: a failed array must still stop at the first try.
    w.ok(&["mount", "data"]);
    w.ok(&["fail", "data", s(&m[0])]);
    reads(&sock, "data", "write -P 0x44 4M 1M");
    w.ok(&["fail", "data", s(&m[3]), "--force"]);
    let (code, _, _) = w.code(&["status", "data"]);
    assert_eq!(code, 2);
    // 1. events and examine; 2. stop; 3. start --force; 4. replace, wait, scrub.
    let ev = w.ok(&["events", "data"]);
    assert!(ev.contains("array_failed"), "{ev}");
    let ex: serde_json::Value =
        serde_json::from_str(&w.ok(&["examine", s(&m[0]), s(&m[3]), "--format", "json"])).unwrap();
    assert!(ex[1]["events"].as_u64() > ex[0]["events"].as_u64(), "{ex}");
    w.ok(&["stop", "data"]);
    let out = start_nbd(&w, "data", &sock, &["--force"]);
    assert!(out.contains("forced back into slot 3"), "{out}");
    reads(&sock, "data", "read -P 0x5a 0 4M");
    reads(&sock, "data", "read -P 0x44 4M 1M");
    let new = w.sparse("f-new.img", 32 * MIB);
    w.ok(&["replace", "data", s(&m[0]), s(&new)]);
    w.ok(&["wait", "data"]);
    reads(&sock, "data", "read -P 0x44 4M 1M");
    scrub_clean(&w, "data");
}

/// A small ext4 mounted on a loop device; unmounted on drop.
struct SmallFs {
    dir: PathBuf,
}

impl SmallFs {
    fn new(w: &World, size_mib: u64) -> SmallFs {
        let img = w.dir.join("fs.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(size_mib * MIB)
            .unwrap();
        let ok = Command::new("mkfs.ext4")
            .args(["-q", "-F", s(&img)])
            .status()
            .unwrap()
            .success();
        assert!(ok, "mkfs.ext4");
        let dir = w.dir.join("fs");
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("mount")
            .args(["-o", "loop", s(&img), s(&dir)])
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount -o loop (needs root and loop devices)");
        SmallFs { dir }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        // Lazy: a daemon a failed test left running still holds files.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

#[test]
fn runbook_the_filesystem_under_member_files_filled_up() {
    let w = World::new("rb-full");
    let fs = SmallFs::new(&w, 128);
    let m: Vec<PathBuf> = (0..3)
        .map(|i| {
            let p = fs.dir.join(format!("full{i}.img"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(32 * MIB)
                .unwrap();
            p
        })
        .collect();
    // Something else on the same filesystem, to free later: what is left
    // fills up before the array does.
    let filler = fs.dir.join("filler");
    std::fs::write(&filler, vec![1u8; 64 * MIB as usize]).unwrap();
    let sock = running(&w, "data", "5", &m, true);
    // Write in steps until the filesystem is full; every step that
    // succeeded (and was flushed) must survive.
    let mut done = 1u64; // the first 8 MiB written by running()
    for step in 1..7u64 {
        let (ok, _) = qemu_io(
            &sock,
            "data",
            &[
                &format!("write -P {} {}M 8M", 0x10 + step, step * 8),
                "flush",
            ],
        );
        if !ok {
            break;
        }
        done = step + 1;
    }
    assert!(done < 7, "the filesystem never filled up");
    // Full: no member failed, writes stop, reads go on, and it says why.
    let st = w.status_json("data");
    assert_ne!(st["state"], "failed", "{st}");
    assert!(st["out_of_space"].is_string(), "{st}");
    for mm in st["members"].as_array().unwrap() {
        assert_eq!(mm["state"], "active", "{st}");
    }
    let ev = w.ok(&["events", "data"]);
    assert!(
        ev.contains("out_of_space") && !ev.contains("member_failed"),
        "{ev}"
    );
    // `list` and status's first line say so, not a bare "optimal".
    let list = w.ok(&["list"]);
    assert!(list.contains("writes stopped"), "{list}");
    let (_, text, _) = w.code(&["status", "data"]);
    let head = text.lines().next().unwrap_or_default();
    assert!(head.contains("writes stopped"), "{text}");
    reads(&sock, "data", "read -P 0x5a 0 8M");
    // 1. free space; 2. stop, start; 3. scrub.
    std::fs::remove_file(&filler).unwrap();
    let out = w.ok(&["stop", "data"]);
    // Not "marked clean": the next start resyncs what the failed write
    // may have torn, and stop says so as status does.
    assert!(
        out.contains("left marked dirty") && !out.contains("marked clean"),
        "{out}"
    );
    start_nbd(&w, "data", &sock, &[]);
    // The resync at this start is put down to the full filesystem too,
    // not only to a crash.
    let ev = w.ok(&["events", "data"]);
    let unclean = ev
        .lines()
        .rev()
        .find(|l| l.contains("unclean_stop"))
        .unwrap_or_else(|| panic!("{ev}"));
    assert!(unclean.contains("full filesystem"), "{unclean}");
    reads(&sock, "data", "read -P 0x5a 0 8M");
    for step in 1..done {
        reads(
            &sock,
            "data",
            &format!("read -P {} {}M 8M", 0x10 + step, step * 8),
        );
    }
    assert_eq!(w.status_json("data")["state"], "optimal");
    scrub_clean(&w, "data");
    // Writes go on again.
    reads(&sock, "data", "write -P 0x66 0 1M");
    // 4. allocate the member files while the array is stopped.
    let paths: Vec<String> = w.status_json("data")["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap().to_string())
        .collect();
    w.ok(&["stop", "data"]);
    for p in &paths {
        let size = std::fs::metadata(p).unwrap().len().to_string();
        let ok = Command::new("fallocate")
            .args(["-l", &size, p])
            .status()
            .unwrap()
            .success();
        assert!(ok, "fallocate {p}");
        let blocks = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap());
        assert!(blocks * 512 >= 32 * MIB, "{p} is still sparse");
    }
    start_nbd(&w, "data", &sock, &[]);
    reads(&sock, "data", "read -P 0x66 0 1M");
    w.ok(&["stop", "data"]);
}

/// Member files moved (or devices renamed): the recorded paths are stale;
/// `start --scan DIR` finds the members by the array's uuid and records
/// the new paths.
#[test]
fn members_that_moved_are_found_by_uuid() {
    let w = World::new("rb-scan");
    let m = w.sparse_members("sc", 3, 32 * MIB);
    let sock = running(&w, "data", "5", &m, false);
    w.ok(&["stop", "data"]);
    let moved = w.dir.join("moved");
    std::fs::create_dir_all(&moved).unwrap();
    // A stranger in the same folder is left alone.
    let other = w.sparse_members("ot", 2, 32 * MIB);
    w.ok(&[
        "create",
        "other",
        "--level",
        "1",
        s(&other[0]),
        s(&other[1]),
    ]);
    for p in m.iter().chain(&other[..1]) {
        std::fs::rename(p, moved.join(p.file_name().unwrap())).unwrap();
    }
    let (code, _, err) = w.code(&["start", "data"]);
    assert_ne!(code, 0, "{err}");
    let spec = format!("unix:{}", sock.display());
    w.ok(&["start", "data", "--nbd", &spec, "--scan", s(&moved)]);
    let st = w.status_json("data");
    assert_eq!(st["state"], "optimal", "{st}");
    for mm in st["members"].as_array().unwrap() {
        assert!(mm["path"].as_str().unwrap().contains("/moved/"), "{st}");
    }
    reads(&sock, "data", "read -P 0x5a 0 8M");
}

/// A member file truncated underneath the running array (by mistake, by a
/// script): the daemon fails it by itself within moments, before any I/O
/// touches it, and the data comes from the others; then the usual replace.
#[test]
fn a_member_file_truncated_underneath_is_failed_by_the_daemon() {
    let w = World::new("rb-trunc");
    let m = w.sparse_members("t", 4, 32 * MIB);
    let sock = running(&w, "data", "5", &m, false);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m[3])
        .unwrap()
        .set_len(4 * MIB)
        .unwrap();
    raid_e2e::eventually("the truncated member to be failed", || {
        w.status_json("data")["state"] == "degraded"
    });
    let ev = w.ok(&["events", "data"]);
    assert!(ev.contains("shrank"), "{ev}");
    reads(&sock, "data", "read -P 0x5a 0 8M");
    let new = w.sparse("t-new.img", 32 * MIB);
    w.ok(&["replace", "data", s(&m[3]), s(&new)]);
    w.ok(&["wait", "data"]);
    reads(&sock, "data", "read -P 0x5a 0 8M");
}

/// A member file deleted underneath the running array (rm of the wrong
/// file): the array serves on from the open file, the daemon warns once
/// (status alone said optimal until the next start found it missing), and
/// the hot replace it points to moves the slot to a new file with every
/// bit of redundancy kept; the array then starts again whole.
#[test]
fn a_member_file_deleted_underneath_is_warned_and_hot_replaced() {
    let w = World::new("rb-deleted");
    let m = w.sparse_members("d", 4, 32 * MIB);
    let sock = running(&w, "data", "5", &m, false);
    std::fs::remove_file(&m[2]).unwrap();
    let mut warned = String::new();
    raid_e2e::eventually("the warning of a deleted member", || {
        warned = w.ok(&["events", "data"]);
        warned.contains("was deleted (or replaced at its path)")
    });
    // Once: a second, several monitor rounds later, says nothing new.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let ev = w.ok(&["events", "data"]);
    assert_eq!(
        ev.matches("was deleted (or replaced at its path)").count(),
        1,
        "{warned}"
    );
    let st = w.status_json("data");
    assert_eq!(st["state"], "optimal");
    // Status says it too, on the slot (it showed nothing but the event).
    let warning = st["members"][2]["warning"].as_str().unwrap_or_default();
    assert!(warning.contains("deleted"), "{st}");
    assert!(st["members"][1]["warning"].is_null(), "{st}");
    assert!(w
        .ok(&["status", "data"])
        .contains("warning: its file was deleted"));
    reads(&sock, "data", "read -P 0x5a 0 8M");
    let new = w.sparse("d-new.img", 32 * MIB);
    w.ok(&["replace", "data", s(&m[2]), s(&new)]);
    w.ok(&["wait", "data"]);
    // Moved: the new device carries no warning.
    let st = w.status_json("data");
    assert!(st["members"][2]["warning"].is_null(), "{st}");
    w.ok(&["stop", "data"]);
    start_nbd(&w, "data", &sock, &[]);
    assert_eq!(w.status_json("data")["state"], "optimal");
    reads(&sock, "data", "read -P 0x5a 0 8M");
}

/// Member files deleted underneath the running array live on only while
/// it runs: `stop` said "no data is lost" and lost them. Two of a RAID5's
/// four: the stop is refused (nothing done; the array serves on) with the
/// way out, and `--force` stops anyway, saying what it lost. One: the stop
/// goes on and says the next start finds the array degraded.
#[test]
fn stop_says_what_deleted_member_files_cost_and_refuses_to_lose_the_array() {
    let w = World::new("rb-stop-deleted");
    let m = w.sparse_members("sd", 4, 32 * MIB);
    let sock = running(&w, "data", "5", &m, false);
    std::fs::remove_file(&m[1]).unwrap();
    std::fs::remove_file(&m[3]).unwrap();
    let (code, _, err) = w.code(&["stop", "data"]);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("would lose its data") && err.contains("raidctl replace data"),
        "{err}"
    );
    assert_eq!(w.status_json("data")["state"], "optimal");
    reads(&sock, "data", "read -P 0x5a 0 8M");
    // One moved to a new file; the other stays deleted: a degraded start.
    let new = w.sparse("sd-new.img", 32 * MIB);
    w.ok(&["replace", "data", s(&m[1]), s(&new)]);
    w.ok(&["wait", "data"]);
    let out = w.ok(&["stop", "data"]);
    assert!(
        out.contains("warning: the file of") && out.contains("degraded"),
        "{out}"
    );
    start_nbd(&w, "data", &sock, &[]);
    assert_eq!(w.status_json("data")["state"], "degraded");
    reads(&sock, "data", "read -P 0x5a 0 8M");
    // Forced, past the redundancy.
    w.ok(&["stop", "data"]);
    let w2 = World::new("rb-stop-forced");
    let m2 = w2.sparse_members("sf", 3, 32 * MIB);
    running(&w2, "f", "5", &m2, false);
    std::fs::remove_file(&m2[0]).unwrap();
    std::fs::remove_file(&m2[2]).unwrap();
    // One of them being moved, slowly: the refusal says to wait for it,
    // and the forced stop does not say its old member stays.
    w2.ok(&["rate", "f", "--rebuild", "1M"]);
    let new = w2.sparse("sf-new.img", 32 * MIB);
    w2.ok(&["replace", "f", s(&m2[0]), s(&new)]);
    let (code, _, err) = w2.code(&["stop", "f"]);
    assert_ne!(code, 0);
    assert!(err.contains("raidctl wait f"), "{err}");
    let out = w2.ok(&["stop", "f", "--force"]);
    assert!(out.contains("forced:"), "{out}");
    assert!(out.contains("old member's file is gone"), "{out}");
}
