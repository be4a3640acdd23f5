//! The end of an array's life: `raidctl delete` forgets a stopped array
//! (the members keep its metadata: it can be brought back), and with
//! `--wipe --force` erases its metadata from the devices that carry it,
//! which are then free; never under a running array, never from a device
//! that carries another array's metadata.

use raid_e2e::{qemu_io, write_at, World};
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn delete_forgets_and_wipe_force_frees_the_devices() {
    let w = World::new("delete");
    let m = w.sparse_members("dl", 3, 32 * MIB);
    let spare = w.sparse("dl-spare.img", 32 * MIB);
    w.ok(&[
        "create",
        "dl",
        "--level",
        "5",
        "--spare",
        s(&spare),
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
    ]);
    let sock = w.dir.join("dl.sock");
    let nbd = format!("unix:{}", sock.display());
    w.ok(&["start", "dl", "--nbd", &nbd]);
    let (ok, text) = qemu_io(&sock, "dl", &["write -P 0x3c 0 4M"]);
    assert!(ok, "{text}");

    // Never under a running array.
    let (code, _, err) = w.code(&["delete", "dl"]);
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("is running") && err.contains("raidctl stop dl"),
        "{err}"
    );
    w.ok(&["stop", "dl"]);

    // --wipe loses the array: refused without --force, nothing changed.
    let (code, _, err) = w.code(&["delete", "dl", "--wipe"]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("--force"), "{err}");
    assert!(w.ok(&["list"]).contains("dl"));
    assert!(w.carries(&m[0], "dl"));
    // --force alone means nothing: a usage error.
    let (code, _, err) = w.code(&["delete", "dl", "--force"]);
    assert_eq!(code, 2, "{err}");

    // Forgotten: gone from the list, and brought back from its members.
    let out = w.ok(&["delete", "dl"]);
    assert!(
        out.contains("forgotten") && out.contains("--members"),
        "{out}"
    );
    assert!(!w.ok(&["list"]).contains("dl"));
    // Nothing left of it in the state folder: no file per name ever used.
    assert!(!w.state().join("locks/dl.lock").exists());
    let (code, _, _) = w.code(&["status", "dl"]);
    assert_ne!(code, 0);
    w.ok(&[
        "start",
        "dl",
        "--nbd",
        &nbd,
        "--members",
        s(&m[2]),
        s(&m[0]),
        s(&m[1]),
        s(&spare),
    ]);
    assert_eq!(w.status_json("dl")["spares"][0], s(&spare));
    let (ok, text) = qemu_io(&sock, "dl", &["read -P 0x3c 0 4M"]);
    assert!(ok, "the array brought back serves other data:\n{text}");
    w.ok(&["stop", "dl"]);

    // A device recorded for it that now carries another array's metadata
    // (here: a copy of another array's member) is left as it is.
    let o = w.sparse_members("other", 3, 32 * MIB);
    w.ok(&[
        "create",
        "other",
        "--level",
        "5",
        s(&o[0]),
        s(&o[1]),
        s(&o[2]),
    ]);
    std::fs::copy(&o[0], &m[2]).unwrap();
    let out = w.ok(&["delete", "dl", "--wipe", "--force"]);
    assert!(out.contains("deleted"), "{out}");
    for p in [&m[0], &m[1], &spare] {
        assert!(out.contains(&format!("{}: metadata erased", s(p))), "{out}");
        assert!(!w.carries(p, "dl"), "{} still carries the array", s(p));
    }
    assert!(
        out.contains(&format!("{}: carries another array's metadata", s(&m[2]))),
        "{out}"
    );
    assert!(w.carries(&m[2], "other"));
    assert!(w.carries(&o[0], "other"));
    // The list of arrays knows only the other one.
    let list = w.ok(&["list"]);
    assert!(list.contains("other") && !list.contains("dl"), "{list}");

    // The wiped devices are free: a new array takes them without --force.
    w.ok(&["create", "again", "--level", "1", s(&m[0]), s(&m[1])]);
    w.ok(&["start", "again"]);
    w.ok(&["stop", "again"]);
}

/// A rate set with `raidctl rate` holds across a stop and start (it was
/// reset to the daemon's default, so a rebuild then ran unthrottled).
#[test]
fn rates_hold_across_a_restart() {
    let w = World::new("rates");
    let m = w.sparse_members("rt", 3, 32 * MIB);
    w.ok(&["create", "rt", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    w.ok(&["start", "rt"]);
    w.ok(&["rate", "rt", "--rebuild", "3M"]);
    w.ok(&["rate", "rt", "--scrub", "5M"]);
    // A rate the record cannot hold is bad input, not a daemon's panic
    // answered as "not running"; the rates stay as they were.
    let (code, _, err) = w.code(&["rate", "rt", "--rebuild", "10000000T"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("beyond any device"), "{err}");
    w.ok(&["stop", "rt"]);
    w.ok(&["start", "rt"]);
    let out = w.ok(&["rate", "rt"]);
    assert!(
        out.contains("rebuild, replace and resync 3.0 MiB/s") && out.contains("scrub 5.0 MiB/s"),
        "{out}"
    );
    w.ok(&["stop", "rt"]);
}

/// Two stops at the same instant: one stops the array, the other is told
/// it is not running, as it would be a moment later (both used to say
/// they had stopped it).
#[test]
fn of_two_stops_at_once_one_stops_the_array() {
    let w = World::new("two-stops");
    let m = w.sparse_members("ts", 3, 32 * MIB);
    w.ok(&["create", "ts", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    for round in 0..3 {
        w.ok(&["start", "ts"]);
        let outs: Vec<(i32, String, String)> = std::thread::scope(|sc| {
            let stops: Vec<_> = (0..2)
                .map(|_| sc.spawn(|| w.code(&["stop", "ts"])))
                .collect();
            stops.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            outs.iter().filter(|o| o.0 == 0).count(),
            1,
            "round {round}: {outs:?}"
        );
        let other = outs.iter().find(|o| o.0 != 0).unwrap();
        assert!(other.2.contains("not running"), "round {round}: {other:?}");
    }
}

/// Whether the block device under the file `p` takes writes with FUA,
/// as its queue (or, for a partition, its disk's) says in sysfs.
fn device_takes_fua(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(p).unwrap().dev();
    let node = PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        libc::major(dev),
        libc::minor(dev)
    ));
    ["queue/fua", "../queue/fua"]
        .iter()
        .find_map(|q| std::fs::read_to_string(node.join(q)).ok())
        .is_some_and(|v| v.trim() == "1")
}

/// A hot replace cut short says so: by `stop` (which stops its copy), and
/// at the start after a daemon killed while it copied (nothing of it is on
/// disk, the old member stays; the event log used to end at "started").
#[test]
fn a_hot_replace_cut_short_says_so() {
    let w = World::new("hot-cut");
    let m = w.sparse_members("hc", 3, 32 * MIB);
    let new = w.sparse("hc-new.img", 32 * MIB);
    w.ok(&["create", "hc", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    w.ok(&["start", "hc"]);
    w.ok(&["rate", "hc", "--rebuild", "1M"]);
    w.ok(&["replace", "hc", s(&m[1]), s(&new)]);
    let out = w.ok(&["stop", "hc"]);
    assert!(
        out.contains("hot replace of slot 1") && out.contains("stopped"),
        "{out}"
    );
    w.ok(&["start", "hc"]);
    w.ok(&["replace", "hc", s(&m[1]), s(&new)]);
    w.kill_daemon();
    let out = w.ok(&["start", "hc"]);
    assert!(out.contains("did not end"), "{out}");
    let st = w.status_json("hc");
    assert_eq!(st["state"], "optimal", "{st}");
    assert_eq!(st["members"][1]["path"], s(&m[1]), "{st}");
    // Each member says whether its device takes writes with FUA, as the
    // device's queue in sysfs does.
    for (k, p) in m.iter().enumerate() {
        assert_eq!(st["members"][k]["fua"], device_takes_fua(p), "{st}");
    }
    let events = w.ok(&["events", "hc"]);
    let last = events
        .lines()
        .rev()
        .find(|l| l.contains("hot replace"))
        .unwrap_or_default();
    assert!(
        last.contains("dropped") && last.contains("daemon ended"),
        "{events}"
    );
    // The records name the new device in a field of its own.
    let json = w.ok(&["events", "hc", "--format", "json"]);
    let records: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    let started: Vec<_> = records
        .iter()
        .filter(|r| r["event"] == "hot_replace_started")
        .collect();
    assert!(!started.is_empty(), "{json}");
    assert!(started.iter().all(|r| r["new_member"] == s(&new)), "{json}");
    // Said once: a second start finds the log ended.
    w.ok(&["stop", "hc"]);
    let out = w.ok(&["start", "hc"]);
    assert!(!out.contains("did not end"), "{out}");
    w.ok(&["stop", "hc"]);
}

/// `delete --wipe --force` holds every device before it erases any: one
/// in use (here: taken since by another array that runs) refuses the whole
/// command, and nothing is erased.
#[test]
fn delete_wipe_of_a_device_in_use_erases_nothing() {
    let w = World::new("delete-busy");
    let m = w.sparse_members("db", 4, 32 * MIB);
    w.ok(&["create", "db", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    let x = w.sparse_members("dx", 2, 32 * MIB);
    w.ok(&[
        "create",
        "dx",
        "--level",
        "5",
        "--force",
        s(&m[2]),
        s(&x[0]),
        s(&x[1]),
    ]);
    w.ok(&["start", "dx"]);
    let (code, _, err) = w.code(&["delete", "db", "--wipe", "--force"]);
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("in use") && err.contains("nothing was wiped"),
        "{err}"
    );
    assert!(w.carries(&m[0], "db") && w.carries(&m[1], "db"));
    assert!(w.ok(&["list"]).contains("db"));
    w.ok(&["stop", "dx"]);
}

/// A scrub cancelled while the schedule runs it stays cancelled until the
/// schedule's next period (it used to start again within a second), and a
/// background scrub that cannot run (a rebuild first) is refused to its
/// caller (it used to answer "started" and only log the failure).
#[test]
fn a_cancelled_scheduled_scrub_stays_cancelled() {
    let w = World::new("scrub-cancel");
    let m = w.sparse_members("sc", 4, 32 * MIB);
    w.ok(&["create", "sc", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    // Data on every row: rows of holes are not read, and would not last.
    w.fill("sc");
    // The scrub's rate recorded before the schedule is known: set after
    // the start, it raced the monitor's first round, and a scrub at full
    // speed could end before the test looked (seen on a loaded machine).
    w.ok(&["start", "sc"]);
    w.ok(&["rate", "sc", "--scrub", "1M"]);
    w.ok(&["stop", "sc"]);
    // The stopped array's daemon may linger with the config it read:
    // gone, the next start reads the schedule.
    w.end_daemon();
    std::fs::write(
        w.state().join("raidctl.toml"),
        "[scrub]\nevery_hours = 168\n",
    )
    .unwrap();
    w.ok(&["start", "sc"]);
    // Due at once (never scrubbed): the monitor starts it.
    raid_e2e::eventually("the scheduled scrub", || {
        !w.status_json("sc")["scrub"].is_null()
    });
    let out = w.ok(&["scrub", "sc", "--cancel"]);
    assert!(
        out.contains("cancelled") && out.contains("next scrub is due in 168 hours"),
        "{out}"
    );
    // Several monitor rounds later, still none.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let st = w.status_json("sc");
    assert!(st["scrub"].is_null(), "the schedule started it again: {st}");

    w.ok(&["rate", "sc", "--rebuild", "1M"]);
    w.ok(&["fail", "sc", s(&m[1])]);
    w.ok(&["replace", "sc", s(&m[1]), s(&m[3])]);
    let (code, _, err) = w.code(&["scrub", "sc", "--background"]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("scrub needs every member in sync"), "{err}");
    w.ok(&["stop", "sc"]);
}

/// A member that fails while a spare is at hand: the failure's event (and
/// its mail) names the failed member's uuid, not that of the spare that
/// takes its slot before the event is read (a uuid or serial sends the
/// operator to a drive).
#[test]
fn a_failure_event_names_the_failed_member_not_the_spare() {
    let w = World::new("ev-uuid");
    let m = w.sparse_members("eu", 3, 16 * MIB);
    let spare = w.sparse("eu-spare.img", 16 * MIB);
    w.ok(&[
        "create",
        "eu",
        "--level",
        "5",
        "--spare",
        s(&spare),
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
    ]);
    w.ok(&["start", "eu"]);
    let uuid = w.status_json("eu")["members"][1]["uuid"].clone();
    // Cut short under the array: the monitor's size check fails it, and
    // the spare takes the slot in the same round.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m[1])
        .unwrap()
        .set_len(0)
        .unwrap();
    let events = || -> serde_json::Value {
        serde_json::from_str(&w.ok(&["events", "eu", "--format", "json"])).unwrap()
    };
    let failed = || {
        events()
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["event"] == "member_failed")
            .cloned()
    };
    raid_e2e::eventually("the member's failure is logged", || failed().is_some());
    w.ok(&["wait", "eu"]);
    assert_eq!(w.status_json("eu")["members"][1]["path"], s(&spare));
    let ev = failed().unwrap();
    assert_eq!(ev["member"], s(&m[1]), "{ev}");
    assert_eq!(ev["member_uuid"], uuid, "{ev}");
    w.ok(&["stop", "eu"]);
}

/// `start` just as the daemon before it exits (idle, its socket gone, the
/// state folder's lock still held while it finishes): the daemon it spawns
/// waits for the lock (it ended at once, and start said "the daemon did
/// not come up"). The exiting daemon is played here by this test holding
/// the lock for a second.
#[test]
fn start_beside_a_daemon_that_is_exiting_comes_up() {
    use std::os::fd::AsRawFd;
    let w = World::new("exiting");
    let m = w.sparse_members("ex", 3, 16 * MIB);
    w.ok(&["create", "ex", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(w.state().join("daemon.lock"))
        .unwrap();
    // SAFETY: flock on an fd this test owns.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(1));
        drop(lock);
    });
    let out = std::process::Command::new(raid_e2e::raidctl_path())
        .env("RAIDCTL_STATE_DIR", w.state())
        .args(["start", "ex"])
        .output()
        .unwrap();
    releaser.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(w.status_json("ex")["state"], "optimal");
    w.ok(&["stop", "ex"]);
}

/// Two `start`s of one array at once: one starts it, the other says it is
/// started already (it said the array's devices were held "by a running
/// array or another program: stop whatever holds it", which is the array
/// just started).
#[test]
fn two_starts_at_once_start_it_once_and_say_so() {
    let w = World::new("two-starts");
    let m = w.sparse_members("ts", 3, 16 * MIB);
    w.ok(&["create", "ts", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    // A daemon first, so that both go to the same one.
    w.ok(&["start", "ts"]);
    w.ok(&["stop", "ts"]);
    for _ in 0..5 {
        let (a, b) = std::thread::scope(|sc| {
            let a = sc.spawn(|| w.code(&["start", "ts"]));
            let b = sc.spawn(|| w.code(&["start", "ts"]));
            (a.join().unwrap(), b.join().unwrap())
        });
        let (won, lost) = match (a.0, b.0) {
            (0, _) => (a, b),
            _ => (b, a),
        };
        assert_eq!(won.0, 0, "{won:?} {lost:?}");
        assert_eq!(lost.0, 4, "{lost:?}");
        assert!(lost.2.contains("already"), "{lost:?}");
        w.ok(&["stop", "ts"]);
    }
}

/// `delete` racing `start`: never both. A delete that won left the array
/// unstarted; one that lost removed nothing (it removed the record and
/// event log of the array the start brought up).
#[test]
fn delete_racing_start_never_both_succeed() {
    let w = World::new("del-start");
    let m = w.sparse_members("ds", 3, 16 * MIB);
    let create = || {
        w.ok(&[
            "create",
            "ds",
            "--level",
            "5",
            "--force",
            s(&m[0]),
            s(&m[1]),
            s(&m[2]),
        ])
    };
    create();
    w.ok(&["start", "ds"]);
    w.ok(&["stop", "ds"]);
    for i in 0..8 {
        let (st, del) = std::thread::scope(|sc| {
            let st = sc.spawn(|| w.code(&["start", "ds"]));
            let del = sc.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(i * 40));
                w.code(&["delete", "ds"])
            });
            (st.join().unwrap(), del.join().unwrap())
        });
        assert!(st.0 != 0 || del.0 != 0, "both succeeded: {st:?} {del:?}");
        if st.0 == 0 {
            // Running, with its record and its log.
            assert!(w.state().join("arrays/ds.toml").exists(), "{del:?}");
            assert!(del.2.contains("running"), "{del:?}");
            w.ok(&["stop", "ds"]);
        } else {
            create();
        }
    }
}

/// A degraded array is said degraded again at each start (a reboot no one
/// watched): a critical `started_degraded` event, which alerts mail, naming
/// the failed slot's device and what to run. It used to log nothing but the
/// parity engine, so an operator who relies on mail heard of it once.
#[test]
fn a_start_of_a_degraded_array_says_so_again() {
    let w = World::new("start-degraded");
    let m = w.sparse_members("sd", 3, 16 * MIB);
    w.ok(&["create", "sd", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    w.ok(&["start", "sd"]);
    w.ok(&["fail", "sd", s(&m[1])]);
    let said = |w: &World| -> Vec<serde_json::Value> {
        let events: serde_json::Value =
            serde_json::from_str(&w.ok(&["events", "sd", "--format", "json"])).unwrap();
        events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["event"] == "started_degraded")
            .cloned()
            .collect()
    };
    assert!(said(&w).is_empty(), "not at the failure itself");
    for round in 1..=2 {
        w.ok(&["stop", "sd"]);
        w.ok(&["start", "sd"]);
        let again = said(&w);
        assert_eq!(again.len(), round, "{again:?}");
        let e = again.last().unwrap();
        assert_eq!(e["severity"], "critical", "{e}");
        assert_eq!(e["slot"], 1, "{e}");
        assert_eq!(e["member"], s(&m[1]), "{e}");
        let next = e["next"].as_str().unwrap();
        assert!(next.starts_with("raidctl replace sd"), "{e}");
    }
    // Whole again: nothing more is said.
    let new = w.sparse("sd-new.img", 16 * MIB);
    w.ok(&["replace", "sd", s(&m[1]), s(&new)]);
    w.ok(&["wait", "sd"]);
    w.ok(&["stop", "sd"]);
    w.ok(&["start", "sd"]);
    assert_eq!(said(&w).len(), 2);
    w.ok(&["stop", "sd"]);
}

/// A loop device over a member file of a running array is that member by
/// another name, which neither the file's flock nor the loop device's
/// O_EXCL saw: `create --force` over it zeroed the running array's member
/// (its status still said optimal), and another daemon started the array
/// a second time through loop devices (two writers on one array). Both
/// are refused as in use now, and nothing changes on the member.
#[test]
fn a_loop_device_over_a_member_in_use_is_in_use() {
    raid_e2e::need("losetup");
    let w = World::new("loop-over-member");
    let m = w.sparse_members("lm", 3, 32 * (1 << 20));
    w.ok(&["create", "lm", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    w.ok(&["start", "lm"]);
    let attach = |p: &Path| {
        let o = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(p)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let loops: Vec<String> = m.iter().map(|p| attach(p)).collect();
    let detach = || {
        for l in &loops {
            let _ = std::process::Command::new("losetup")
                .args(["-d", l])
                .status();
        }
    };
    let before = raid_e2e::file_hash(&m[0]);
    let other = w.sparse("other.img", 32 * (1 << 20));
    let w2 = World::new("loop-over-member-2");
    let (code, _, err) = w2.code(&[
        "create",
        "z",
        "--level",
        "1",
        &loops[0],
        s(&other),
        "--force",
    ]);
    let (code2, _, err2) = w2.code(&["start", "lm", "--members", &loops[0], &loops[1], &loops[2]]);
    if code2 == 0 {
        w2.run(&["stop", "lm"]);
    }
    detach();
    assert_ne!(code, 0, "create over a running member's loop device");
    assert!(err.contains("in use"), "{err}");
    assert_eq!(raid_e2e::file_hash(&m[0]), before, "the member changed");
    assert_ne!(code2, 0, "a second start of a running array");
    assert!(err2.contains("in use"), "{err2}");
    assert_eq!(w.status_json("lm")["state"], "optimal");
    w.ok(&["stop", "lm"]);
}

/// A record that cannot be parsed left its array out of `list` and
/// `status`, exit 0, as if it did not exist. Now both name the file and
/// the fix, and exit 1; the fix (a start naming the members) works.
#[test]
fn a_corrupt_record_is_named_by_list_and_status() {
    let w = World::new("bad-record");
    let m = w.sparse_members("br", 3, 32 * (1 << 20));
    w.ok(&["create", "br", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    let rec = w.state().join("arrays/br.toml");
    std::fs::write(&rec, "garbage ][").unwrap();
    for cmd in ["list", "status"] {
        let (code, _, err) = w.code(&[cmd]);
        assert_eq!(code, 1, "{cmd}: {err}");
        assert!(
            err.contains("br.toml is corrupt") && err.contains("raidctl start br --members"),
            "{cmd}: {err}"
        );
    }
    w.ok(&["start", "br", "--members", s(&m[0]), s(&m[1]), s(&m[2])]);
    let (code, out, _) = w.code(&["list"]);
    assert_eq!(code, 0);
    assert!(out.contains("br"), "{out}");
    w.ok(&["stop", "br"]);
}

/// A RAID5 `name` created in one world, its record copied into a second
/// world's state directory (as two daemons that could each run it).
fn recorded_in_two_state_dirs(tag: &str, name: &str) -> (World, World) {
    let w = World::new(tag);
    let m = w.sparse_members(name, 3, 32 * (1 << 20));
    w.ok(&["create", name, "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    let w2 = World::new(&format!("{tag}-2"));
    std::fs::create_dir_all(w2.state().join("arrays")).unwrap();
    let record = format!("arrays/{name}.toml");
    std::fs::copy(w.state().join(&record), w2.state().join(&record)).unwrap();
    (w, w2)
}

/// An array run by another daemon (another state directory) read as
/// "stopped (optimal)" here, exit 0: status now says its members are held
/// elsewhere, and by which process.
#[test]
fn status_of_an_array_another_daemon_runs_says_so() {
    let (w, w2) = recorded_in_two_state_dirs("held-elsewhere", "he");
    let (_, out, _) = w2.code(&["status", "he"]);
    assert!(!out.contains("in use elsewhere"), "{out}");
    w.ok(&["start", "he"]);
    let (_, out, _) = w2.code(&["status", "he"]);
    assert!(
        out.contains("in use elsewhere") && out.contains(&format!("process {}", w.daemon_pid())),
        "{out}"
    );
    w.ok(&["stop", "he"]);
}

/// The same from a PID namespace that cannot see the daemon (a status in
/// a container, the daemon on the host): /proc/locks there hides its
/// lock, and status still says the members are held elsewhere.
#[test]
fn status_from_another_pid_namespace_says_the_array_runs_elsewhere() {
    let (w, w2) = recorded_in_two_state_dirs("held-unseen", "hu");
    let ns = ["unshare", "--pid", "--fork", "--mount-proc"];
    let probe = w2.run_in(&ns, &["status", "hu"], &[]);
    if !probe.status.success() && String::from_utf8_lossy(&probe.stderr).contains("unshare") {
        eprintln!(
            "SKIPPED: no new PID namespace here ({})",
            String::from_utf8_lossy(&probe.stderr).trim()
        );
        return;
    }
    let out = String::from_utf8_lossy(&probe.stdout).into_owned();
    assert!(!out.contains("in use elsewhere"), "{out}");
    w.ok(&["start", "hu"]);
    let o = w2.run_in(&ns, &["status", "hu"], &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("in use elsewhere") && out.contains("cannot see"),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Asking took a lock for an instant: the array still stops and
    // starts.
    w.ok(&["stop", "hu"]);
    w.ok(&["start", "hu"]);
    w.ok(&["stop", "hu"]);
}

/// A start that names its devices, a spare among them whose metadata is
/// gone: the spare is said to have been given and left out by assembly,
/// with assembly's reason (not "not among the devices given", nor a
/// member's advice to replace it to rebuild a slot), and `add` takes it
/// back.
#[test]
fn a_spare_given_to_a_start_but_left_out_is_told_of_as_such() {
    let w = World::new("spare-given");
    let m = w.sparse_members("m", 3, 64 * MIB);
    let sp = w.sparse("sp.img", 64 * MIB);
    w.create("sg", "5", &m, &["--spare", s(&sp)]);
    w.ok(&["start", "sg"]);
    w.ok(&["stop", "sg"]);
    // Its metadata (both copies, in the first 8 KiB) zeroed.
    let zero_head = || write_at(&sp, 0, &[0u8; 8192]);
    zero_head();
    let out = w.ok(&[
        "start",
        "sg",
        "--members",
        s(&m[2]),
        s(&m[0]),
        s(&m[1]),
        s(&sp),
    ]);
    assert!(
        out.contains("was given to this start, but assembly did not take it back")
            && out.contains("no usable array metadata"),
        "{out}"
    );
    assert!(!out.contains("not among the devices given"), "{out}");
    assert!(!out.contains("rebuild its slot"), "{out}");
    assert_eq!(w.status_json("sg")["state"], "optimal");
    w.ok(&["add", "sg", s(&sp)]);
    w.ok(&["stop", "sg"]);
    w.ok(&["start", "sg"]);
    let st = w.status_json("sg");
    assert!(st.to_string().contains("sp.img"), "{st}");
    w.ok(&["stop", "sg"]);
    // A start from the record (naming no devices) still says why it left
    // the spare out.
    zero_head();
    let out = w.ok(&["start", "sg"]);
    assert!(
        out.contains("sp.img not used") && out.contains("no usable array metadata"),
        "{out}"
    );
    w.ok(&["stop", "sg"]);
}

#[test]
fn two_concurrent_starts_assemble_the_members_once() {
    let w = World::new("twostart");
    let m: Vec<PathBuf> = (0..3)
        .map(|i| w.sparse(&format!("t{i}.img"), 16 * MIB))
        .collect();
    w.ok(&["create", "ts", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    // The same members under another name too, imported at the same time.
    w.ok(&["start", "ts"]);
    w.ok(&["stop", "ts"]);
    let runs: Vec<_> = (0..2)
        .map(|i| {
            let state = w.state();
            let members: Vec<String> = m.iter().map(|p| s(p).to_string()).collect();
            std::thread::spawn(move || {
                let mut c = std::process::Command::new(raid_e2e::raidctl_path());
                c.env("RAIDCTL_STATE_DIR", state).env("RAIDCTL_LOG", "warn");
                if i == 0 {
                    c.args(["start", "ts"]);
                } else {
                    c.args(["start", "ts"]);
                    c.arg("--members").args(&members);
                }
                c.output().unwrap()
            })
        })
        .collect();
    let outs: Vec<_> = runs.into_iter().map(|t| t.join().unwrap()).collect();
    let ok = outs.iter().filter(|o| o.status.success()).count();
    assert_eq!(ok, 1, "{outs:?}");
    assert_eq!(w.status_json("ts")["state"], "optimal");
    // Another daemon (another state directory, another host's view of a
    // shared disk) cannot assemble the members this one serves.
    let other = World::new("twostart-other");
    let mut args = vec!["start", "ts", "--members"];
    args.extend(m.iter().map(|p| s(p)));
    let (code, out, err) = other.code(&args);
    assert_eq!(
        code, 4,
        "a second daemon assembled members in use:\n{out}{err}"
    );
    assert!(err.contains("in use"), "{err}");
    assert_eq!(w.status_json("ts")["state"], "optimal");
    w.ok(&["stop", "ts"]);
}
