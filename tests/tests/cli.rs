//! The operator's flow through the real binary, and a table of wrong
//! invocations: each exits with its documented code and message and leaves
//! every member byte for byte as it was.

use raid_e2e::{qemu_io, World};
use std::path::PathBuf;

const MIB: u64 = 1 << 20;

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn create_start_fail_replace_rebuild_stop_and_start_again() {
    let w = World::new("flow");
    let m = w.sparse_members("m", 5, 64 * MIB);
    let out = w.ok(&[
        "create",
        "flow",
        "--level",
        "6",
        "--chunk",
        "16K",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
        s(&m[3]),
    ]);
    assert!(out.contains("created raid6 'flow'"), "{out}");
    let st = w.status_json("flow");
    assert_eq!(st["state"], "stopped");
    assert_eq!(st["health"], "optimal");
    let sock = w.dir.join("flow.sock");
    let out = w.ok(&[
        "start",
        "flow",
        "--nbd",
        &format!("unix:{}", sock.display()),
    ]);
    assert!(out.contains("started"), "{out}");
    let st = w.status_json("flow");
    assert_eq!(st["state"], "optimal");
    assert_eq!(st["running"], true);
    assert_eq!(st["level"], "raid6");
    assert_eq!(st["chunk_bytes"], 16384);
    assert_eq!(st["capacity_bytes"], 2 * 63 * MIB);
    assert_eq!(st["members"].as_array().unwrap().len(), 4);
    assert!(st["parity_engine"].as_str().unwrap().starts_with("cpu/"));
    let export = st["exports"][0].as_str().unwrap();
    assert!(export.contains("nbd unix:"), "{export}");
    // How the engine serves it: shards, or the blocking threads.
    assert!(
        export.contains(" shard") || export.contains("no io_uring: "),
        "{export}"
    );

    let (ok, text) = qemu_io(
        &sock,
        "flow",
        &[
            "write -P 0x3c 0 40M",
            "write -P 0xc3 40M 20M",
            "read -P 0x3c 0 40M",
        ],
    );
    assert!(ok, "{text}");

    w.ok(&["fail", "flow", s(&m[2])]);
    let st = w.status_json("flow");
    assert_eq!(st["state"], "degraded");
    assert_eq!(st["members"][2]["state"], "failed");
    let (ok, text) = qemu_io(
        &sock,
        "flow",
        &["read -P 0x3c 0 40M", "read -P 0xc3 40M 20M"],
    );
    assert!(ok, "degraded read: {text}");

    let out = w.ok(&["replace", "flow", s(&m[2]), s(&m[4])]);
    assert!(out.contains("rebuild started"), "{out}");
    w.ok(&["wait", "flow", "--timeout", "120"]);
    let st = w.status_json("flow");
    assert_eq!(st["state"], "optimal");
    assert_eq!(st["members"][2]["path"], s(&m[4]));
    assert!(st["rebuild"].is_null());

    w.ok(&["stop", "flow"]);
    let st = w.status_json("flow");
    assert_eq!(st["state"], "stopped");
    assert_eq!(st["health"], "optimal");
    assert_eq!(st["members"][2]["path"], s(&m[4]));

    // Start again: the state and the data are still there.
    w.ok(&[
        "start",
        "flow",
        "--nbd",
        &format!("unix:{}", sock.display()),
    ]);
    let st = w.status_json("flow");
    assert_eq!(st["state"], "optimal");
    let (ok, text) = qemu_io(
        &sock,
        "flow",
        &["read -P 0x3c 0 40M", "read -P 0xc3 40M 20M"],
    );
    assert!(ok, "after restart: {text}");
    let list = w.ok(&["list"]);
    assert!(list.contains("flow") && list.contains("optimal"), "{list}");
    w.ok(&["stop", "flow"]);
}

#[test]
fn members_moved_to_another_host_start_with_members() {
    let w = World::new("move");
    let m = w.sparse_members("m", 3, 32 * MIB);
    w.ok(&["create", "mv", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    // "Another host": a fresh state directory that has never heard of it.
    std::fs::remove_dir_all(w.state()).unwrap();
    let out = w.ok(&["start", "mv", "--members", s(&m[2]), s(&m[0]), s(&m[1])]);
    assert!(out.contains("started"), "{out}");
    let st = w.status_json("mv");
    assert_eq!(st["state"], "optimal");
    assert_eq!(
        st["members"][0]["path"],
        s(&m[0]),
        "slots follow the metadata, not the argument order"
    );
    w.ok(&["stop", "mv"]);
}

/// One wrong invocation: arguments, expected exit code, words the message
/// must contain.
struct Wrong {
    args: Vec<String>,
    code: i32,
    says: &'static str,
}

#[test]
fn wrong_invocations_exit_with_their_code_and_change_nothing() {
    let w = World::new("wrong");
    let m = w.sparse_members("m", 6, 32 * MIB);
    let tiny = w.sparse("tiny.img", MIB / 2);
    // A member with an ext4 superblock magic, one with a GPT header.
    let ext4 = w.sparse("ext4.img", 32 * MIB);
    write_at(&ext4, 1080, &[0x53, 0xEF]);
    let gpt = w.sparse("gpt.img", 32 * MIB);
    write_at(&gpt, 512, b"EFI PART");
    // A running array, "live", on m0..m2, and a stopped one, "other", on m3..m5.
    w.ok(&[
        "create",
        "live",
        "--level",
        "5",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
    ]);
    w.ok(&[
        "create",
        "other",
        "--level",
        "5",
        s(&m[3]),
        s(&m[4]),
        s(&m[5]),
    ]);
    w.ok(&["start", "live"]);
    let fresh: Vec<PathBuf> = (0..4)
        .map(|i| w.sparse(&format!("f{i}.img"), 32 * MIB))
        .collect();
    let f = |i: usize| s(&fresh[i]).to_string();
    let a = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let missing = w.dir.join("nope.img");
    let cases = vec![
        Wrong {
            args: a(&["create", "x", "--level", "7", &f(0), &f(1), &f(2)]),
            code: 2,
            says: "RAID level 7 is not supported",
        },
        Wrong {
            args: a(&["create", "x", "--level", "6", &f(0), &f(1), &f(2)]),
            code: 2,
            says: "raid6 needs at least 4 members, 3 given",
        },
        Wrong {
            args: a(&["create", "x", "--level", "5", &f(0), &f(1), s(&missing)]),
            code: 3,
            says: "no such file or device",
        },
        Wrong {
            args: a(&["create", "x", "--level", "5", &f(0), &f(1), &f(0)]),
            code: 4,
            says: "listed twice",
        },
        Wrong {
            args: a(&[
                "create",
                "x",
                "--level",
                "5",
                "--chunk",
                "3000",
                &f(0),
                &f(1),
                &f(2),
            ]),
            code: 2,
            says: "not a power of two",
        },
        Wrong {
            args: a(&[
                "create",
                "x",
                "--level",
                "5",
                "--chunk",
                "lots",
                &f(0),
                &f(1),
                &f(2),
            ]),
            code: 2,
            says: "is not a size",
        },
        Wrong {
            args: a(&["create", "x", "--level", "5", &f(0), &f(1), s(&ext4)]),
            code: 4,
            says: "holds a ext2/3/4 filesystem: use --force",
        },
        Wrong {
            args: a(&["create", "x", "--level", "5", &f(0), &f(1), s(&gpt)]),
            code: 4,
            says: "partition table",
        },
        Wrong {
            args: a(&["create", "x", "--level", "5", &f(0), &f(1), s(&m[4])]),
            code: 4,
            says: "is part of array 'other'",
        },
        Wrong {
            args: a(&["create", "bad/name", "--level", "5", &f(0), &f(1), &f(2)]),
            code: 2,
            says: "array name 'bad/name' is invalid",
        },
        Wrong {
            args: a(&["create", "other", "--level", "5", &f(0), &f(1), &f(2)]),
            code: 4,
            says: "already recorded",
        },
        Wrong {
            args: a(&[
                "create",
                "x",
                "--level",
                "5",
                "--parity",
                "tpu",
                &f(0),
                &f(1),
                &f(2),
            ]),
            code: 2,
            says: "invalid value 'tpu'",
        },
        Wrong {
            args: a(&["create", "x", "--level", "5", &f(0), &f(1), s(&tiny)]),
            code: 2,
            says: "too small",
        },
        Wrong {
            args: a(&[
                "create",
                "x",
                "--level",
                "5",
                &f(0),
                &f(1),
                &f(2),
                "--spare",
                s(&tiny),
            ]),
            code: 2,
            says: "smaller than the",
        },
        Wrong {
            args: a(&["create", "x", "--level", "raid5", &f(0), &f(1), s(&w.dir)]),
            code: 2,
            says: "is a folder",
        },
        Wrong {
            args: a(&["create", "x", "--level", "raid7", &f(0), &f(1), &f(2)]),
            code: 2,
            says: "RAID level 7 is not supported",
        },
        Wrong {
            args: a(&["create", "x", "--level", "5"]),
            code: 2,
            says: "required",
        },
        // Refused before assembly writes the members' metadata.
        Wrong {
            args: a(&[
                "start",
                "renamed",
                "--members",
                s(&m[3]),
                s(&m[4]),
                s(&m[5]),
            ]),
            code: 4,
            says: "carry array 'other', not 'renamed'",
        },
        Wrong {
            args: a(&[
                "start",
                "other",
                "--nbd",
                &format!("unix:{}", w.dir.display()),
            ]),
            code: 4,
            says: "exists and is not a socket",
        },
        Wrong {
            args: a(&[
                "start",
                "other",
                "--members",
                s(&m[3]),
                s(&m[4]),
                s(&m[5]),
                s(&m[5]),
            ]),
            code: 4,
            says: "list each device once",
        },
        Wrong {
            args: a(&["start", "ghost"]),
            code: 3,
            says: "no array named 'ghost'",
        },
        Wrong {
            args: a(&["stop", "other"]),
            code: 4,
            says: "array 'other' is not running",
        },
        Wrong {
            args: a(&["fail", "other", s(&m[3])]),
            code: 4,
            says: "is not running",
        },
        // With the daemon running, a name it does not know is unknown,
        // not "not running".
        Wrong {
            args: a(&["fail", "ghost", s(&m[3])]),
            code: 3,
            says: "no array named 'ghost'",
        },
        Wrong {
            args: a(&["status", "ghost"]),
            code: 3,
            says: "no array named 'ghost'",
        },
        Wrong {
            args: a(&["start", "live"]),
            code: 4,
            says: "then start it with --nbd",
        },
        Wrong {
            args: a(&["fail", "live", &f(3)]),
            code: 4,
            says: "is not a member of array 'live'",
        },
        Wrong {
            args: a(&["fail", "live", s(&missing)]),
            code: 3,
            says: "does not exist, and no member of array 'live' is named so",
        },
        Wrong {
            // An active member as the new device: it is already in the
            // array (replace of an active OLD is a hot replace, but never
            // onto a member).
            args: a(&["replace", "live", s(&m[0]), s(&m[1])]),
            code: 4,
            says: "is the member of slot 1",
        },
        Wrong {
            args: a(&["add", "live", s(&m[3])]),
            code: 4,
            says: "carries the metadata of array 'other'",
        },
        Wrong {
            args: a(&["start", "other", "--nbd", "carrier-pigeon:1"]),
            code: 2,
            says: "is not understood",
        },
        Wrong {
            // m1 is a member of the running 'live': held, so refused before
            // its metadata is even read.
            args: a(&["start", "other", "--members", s(&m[3]), s(&m[4]), s(&m[1])]),
            code: 4,
            says: "is in use",
        },
    ];
    assert!(cases.len() >= 15);
    let watched: Vec<PathBuf> = m
        .iter()
        .chain(&fresh)
        .chain([&ext4, &gpt, &tiny])
        .cloned()
        .collect();
    // Content and allocated blocks: a refused create must not allocate
    // the member files either (it used to, before its size checks).
    // A write anywhere moves the file's mtime and ctime (as an allocation
    // moves its blocks), so those and the metadata area's bytes say
    // whether anything changed, without hashing every member whole for
    // every case.
    let look = |p: &PathBuf| {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let md = std::fs::metadata(p).unwrap();
        let mut head = vec![0u8; 2 * MIB as usize];
        let n = std::fs::File::open(p)
            .unwrap()
            .read_at(&mut head, 0)
            .unwrap();
        head.truncate(n);
        let times = (md.mtime(), md.mtime_nsec(), md.ctime(), md.ctime_nsec());
        (head, md.len(), md.blocks(), times)
    };
    for c in &cases {
        let before: Vec<_> = watched.iter().map(look).collect();
        let args: Vec<&str> = c.args.iter().map(|x| x.as_str()).collect();
        let o = w.run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(c.code),
            "raidctl {args:?}: wrong exit code; stderr:\n{err}"
        );
        assert!(
            err.contains(c.says),
            "raidctl {args:?}: message lacks {:?}:\n{err}",
            c.says
        );
        let after: Vec<_> = watched.iter().map(look).collect();
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            // The running array's members may take metadata updates of its own.
            if i < 3 {
                continue;
            }
            assert_eq!(b, a, "raidctl {args:?} modified {}", watched[i].display());
        }
    }
    // The running array was not disturbed by any of it.
    assert_eq!(w.status_json("live")["state"], "optimal");
    w.ok(&["stop", "live"]);
}

fn write_at(p: &std::path::Path, off: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .unwrap()
        .write_all_at(data, off)
        .unwrap();
}

/// Two mirror copies that differ: nothing says which is right, so the
/// event (what an alert mails) does not offer `--repair` as the next step:
/// it keeps the first copy, here the bad one.
#[test]
fn a_two_copy_mismatch_does_not_offer_the_repair_as_the_fix() {
    use std::os::unix::fs::FileExt;
    let w = World::new("scrub-two");
    let m = w.sparse_members("m", 2, 16 * MIB);
    w.ok(&["create", "st", "--level", "1", s(&m[0]), s(&m[1])]);
    let sock = w.dir.join("st.sock");
    w.ok(&["start", "st", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(&sock, "st", &["write -P 0x3c 0 4M"]);
    assert!(ok, "{text}");
    // Rot on the first copy, 1 MiB + 5000 bytes into its data area.
    let f = std::fs::OpenOptions::new().write(true).open(&m[0]).unwrap();
    f.write_all_at(b"bit rot", MIB + MIB + 5000).unwrap();
    let (code, out, _) = w.code(&["scrub", "st"]);
    assert_eq!(code, 1, "{out}");
    let events: serde_json::Value =
        serde_json::from_str(&w.ok(&["events", "st", "--format", "json"])).unwrap();
    let e = events
        .as_array()
        .unwrap()
        .iter()
        .rfind(|e| e["event"] == "scrub_finished")
        .cloned()
        .unwrap();
    let next = e["next"].as_str().unwrap();
    assert!(next.starts_with("find which copy is right"), "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("nothing says which is right"),
        "{e}"
    );
    w.ok(&["stop", "st"]);
}

#[test]
fn scrub_finds_and_repairs_silent_corruption() {
    use std::os::unix::fs::FileExt;
    let w = World::new("scrub");
    let m = w.sparse_members("m", 5, 16 * MIB);
    w.ok(&[
        "create",
        "sc",
        "--level",
        "6",
        "--chunk",
        "16K",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
        s(&m[3]),
        s(&m[4]),
    ]);
    let sock = w.dir.join("sc.sock");
    w.ok(&["start", "sc", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(&sock, "sc", &["write -P 0x77 0 8M"]);
    assert!(ok, "{text}");
    let clean: serde_json::Value =
        serde_json::from_str(&w.ok(&["scrub", "sc", "--format", "json"])).unwrap();
    assert_eq!(clean["mismatches"].as_array().unwrap().len(), 0, "{clean}");
    // Rot on member 3, 1 MiB + 5000 bytes into its data area.
    let f = std::fs::OpenOptions::new().write(true).open(&m[3]).unwrap();
    f.write_all_at(b"bit rot", MIB + MIB + 5000).unwrap();
    // Check-only: reports, changes nothing, says nothing was rewritten,
    // and exits non-zero so cron notices.
    let (code, out, _) = w.code(&["scrub", "sc", "--format", "json"]);
    assert_eq!(code, 1, "{out}");
    let found: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mm = found["mismatches"].as_array().unwrap();
    assert!(
        !mm[0]["what"].as_str().unwrap().contains("rewritten"),
        "{found}"
    );
    let (code, text, _) = w.code(&["scrub", "sc"]);
    assert_eq!(code, 1, "{text}");
    assert!(
        !text.contains("rewritten") && text.contains("check only"),
        "{text}"
    );
    // It counts stripes here (mirrored chunks on RAID1/10).
    assert!(text.contains(" stripes, "), "{text}");
    assert_eq!(mm.len(), 1, "{found}");
    assert_eq!(mm[0]["member"], s(&m[3]));
    // RAID6 names the bad chunk: the repair rewrites that one.
    assert_eq!(mm[0]["located"], true, "{found}");
    assert!(text.contains("rewrites the chunks found wrong"), "{text}");
    let out = w.ok(&["scrub", "sc", "--repair"]);
    assert!(out.contains("1 mismatches (repaired)"), "{out}");
    let after: serde_json::Value =
        serde_json::from_str(&w.ok(&["scrub", "sc", "--format", "json"])).unwrap();
    assert_eq!(after["mismatches"].as_array().unwrap().len(), 0, "{after}");
    let (ok, text) = qemu_io(&sock, "sc", &["read -P 0x77 0 8M"]);
    assert!(ok, "{text}");
    // One summary event per run, not one per stripe.
    let events = w.ok(&["events", "sc"]);
    assert!(events.contains("scrub_finished"), "{events}");
    assert!(events.contains("1 mismatch(es), 1 repaired"), "{events}");
    assert!(events.contains("raidctl scrub sc --repair"), "{events}");
    // The event says where, and what was decided: the alert of a scrub
    // run in the background is all its operator may see.
    assert!(
        events.contains(&format!("slot 3 ({})", s(&m[3]))) && events.contains("located"),
        "{events}"
    );
    // Rot in two data chunks of one sector (stripe 64: members 2 to 4
    // hold its data): beyond what RAID6 can locate. The repair makes the
    // parity agree, names no member, and exits 1.
    for (k, rot) in [(2, b"bit rot"), (3, b"r0t b1t")] {
        let f = std::fs::OpenOptions::new().write(true).open(&m[k]).unwrap();
        f.write_all_at(rot, MIB + MIB + 5000).unwrap();
    }
    let (code, out, _) = w.code(&["scrub", "sc", "--repair", "--format", "json"]);
    assert_eq!(code, 1, "{out}");
    let found: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mm = found["mismatches"].as_array().unwrap();
    assert_eq!(mm.len(), 1, "{found}");
    assert_eq!(mm[0]["unresolved"], true, "{found}");
    assert!(
        mm[0]["slot"].is_null() && mm[0]["member"].is_null(),
        "{found}"
    );
    w.ok(&["stop", "sc"]);
}

#[test]
fn sigterm_stops_every_array_clean() {
    use std::os::unix::fs::FileExt;
    let w = World::new("term");
    let m = w.sparse_members("m", 3, 16 * MIB);
    w.ok(&["create", "tm", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    let sock = w.dir.join("tm.sock");
    w.ok(&["start", "tm", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(&sock, "tm", &["write -P 0x42 0 4M"]);
    assert!(ok, "{text}");
    let flags = |p: &PathBuf| {
        let mut b = [0u8; 4];
        std::fs::File::open(p)
            .unwrap()
            .read_exact_at(&mut b, 12)
            .unwrap();
        u32::from_le_bytes(b)
    };
    assert_eq!(
        flags(&m[0]) & 1,
        0,
        "a running array with writes is marked dirty"
    );
    // Control socket and NBD socket are the owner's alone.
    use std::os::unix::fs::PermissionsExt;
    for p in [w.state().join("raidctl.sock"), sock.clone()] {
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} is mode {mode:o}", p.display());
    }
    let pattern = format!("--state-dir {} daemon", w.state().display());
    let pid = String::from_utf8(
        std::process::Command::new("pgrep")
            .args(["-f", "--", &pattern])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let pid = pid
        .split_whitespace()
        .next()
        .expect("the daemon runs")
        .to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let t = std::time::Instant::now();
    while w.state().join("raidctl.sock").exists()
        && t.elapsed() < std::time::Duration::from_secs(20)
    {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        !w.state().join("raidctl.sock").exists(),
        "the daemon did not exit on SIGTERM"
    );
    for p in &m {
        assert_eq!(flags(p) & 1, 1, "{} not marked clean", p.display());
    }
    let st = w.status_json("tm");
    assert_eq!(st["state"], "stopped");
    assert_eq!(st["health"], "optimal");
    w.ok(&["start", "tm", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(&sock, "tm", &["read -P 0x42 0 4M"]);
    assert!(ok, "{text}");
    w.ok(&["stop", "tm"]);
}

/// A stopped array whose member file is gone, or overwritten, names the
/// device its record has for that slot and what is wrong there (it showed
/// "-"), in text and JSON.
#[test]
fn a_stopped_array_names_the_recorded_device_it_did_not_find() {
    let w = World::new("gone");
    let m = w.sparse_members("m", 4, 16 * MIB);
    w.ok(&[
        "create",
        "gn",
        "--level",
        "6",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
        s(&m[3]),
    ]);
    std::fs::remove_file(&m[1]).unwrap();
    std::fs::write(&m[2], vec![0u8; 16 * MIB as usize]).unwrap();
    let st = w.status_json("gn");
    assert_eq!(st["health"], "degraded", "{st}");
    assert_eq!(st["members"][1]["state"], "missing");
    assert_eq!(st["members"][1]["path"], s(&m[1]));
    let warning = |i: usize| {
        st["members"][i]["warning"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert!(warning(1).contains("is gone"), "{st}");
    assert_eq!(st["members"][2]["path"], s(&m[2]));
    assert!(
        warning(2).contains("does not hold this slot's member"),
        "{st}"
    );
    assert!(st["members"][0]["warning"].is_null(), "{st}");
    // Exit 1: degraded.
    let (code, out, _) = w.code(&["status", "gn"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("{} (recorded)", s(&m[1]))), "{out}");
    assert!(out.contains("is gone"), "{out}");
}

#[test]
fn scheduled_scrub_repairs_by_itself() {
    use std::os::unix::fs::FileExt;
    let w = World::new("sched");
    let m = w.sparse_members("m", 4, 16 * MIB);
    w.ok(&[
        "create",
        "sd",
        "--level",
        "6",
        "--chunk",
        "16K",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
        s(&m[3]),
    ]);
    std::fs::write(
        w.state().join("raidctl.toml"),
        "[scrub]\nevery_hours = 0.0001\nrepair = true\n",
    )
    .unwrap();
    let sock = w.dir.join("sd.sock");
    w.ok(&["start", "sd", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(&sock, "sd", &["write -P 0x24 0 2M"]);
    assert!(ok, "{text}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m[2])
        .unwrap()
        .write_all_at(b"rot", MIB + 300)
        .unwrap();
    let t = std::time::Instant::now();
    loop {
        let ev = w.ok(&["events", "sd"]);
        if ev.contains("1 mismatch(es), 1 repaired") {
            break;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "no scheduled scrub found the rot:\n{ev}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Repaired by the schedule: a check finds nothing now. The schedule
    // keeps scrubbing every 0.36 s, so the check may be refused while one
    // of its runs goes on (exit 4, "already running"); that is retried.
    // One that started may be displaced by the next scheduled run as soon
    // as it ends: it must still report its own result.
    let t = std::time::Instant::now();
    loop {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "no check of a repaired array came back clean"
        );
        let (code, out, err) = w.code(&["scrub", "sd", "--format", "json"]);
        if code == 4 && err.contains("already running") {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        }
        assert_eq!(code, 0, "scrub failed:\n{out}{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        if v["mismatches"].as_array().unwrap().is_empty() {
            break;
        }
        eprintln!("still mismatched: {v}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (ok, text) = qemu_io(&sock, "sd", &["read -P 0x24 0 2M"]);
    assert!(ok, "{text}");
    w.ok(&["stop", "sd"]);
}

/// The pread/pwrite fallback (what runs where io_uring is refused) serves
/// the same flow correctly.
#[test]
fn the_pread_pwrite_fallback_serves_the_array() {
    let w = World::new("nouring");
    let m = w.sparse_members("m", 4, 32 * MIB);
    w.ok(&[
        "create",
        "nu",
        "--level",
        "6",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
        s(&m[3]),
    ]);
    let sock = w.dir.join("nu.sock");
    let env = [("RAID_NO_URING", "1"), ("RAIDCTL_LOG", "info")];
    let o = w.run_env(
        &["start", "nu", "--nbd", &format!("unix:{}", sock.display())],
        &env,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (ok, text) = qemu_io(&sock, "nu", &["write -P 0x61 0 20M", "read -P 0x61 0 20M"]);
    assert!(ok, "{text}");
    w.ok(&["fail", "nu", s(&m[1])]);
    let (ok, text) = qemu_io(&sock, "nu", &["read -P 0x61 0 20M"]);
    assert!(ok, "{text}");
    w.ok(&["stop", "nu"]);
    let log = std::fs::read_to_string(w.state().join("daemon.log")).unwrap();
    assert!(
        log.contains("member I/O: pread/pwrite (RAID_NO_URING=1)"),
        "{log}"
    );
}

/// `raidctl bench` plumbing on a tiny run: every profile, data kind and
/// target is measured and reported in the documented JSON, the ratios and
/// capacity arithmetic hold, the plot is written. Speed is not checked.
#[test]
fn bench_plumbing_on_a_tiny_run() {
    let w = World::new("bench");
    let (json, svg) = (w.dir.join("b.json"), w.dir.join("b.svg"));
    let dir = w.dir.join("members");
    w.ok(&[
        "bench",
        "--dir",
        s(&dir),
        "--member-size",
        "32M",
        "--seconds",
        "0.1",
        "--sweep-seconds",
        "0.02",
        "--json",
        s(&json),
        "--plot",
        s(&svg),
    ]);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = r["results"].as_array().unwrap();
    assert_eq!(
        rows.len(),
        4 * 2 * 4,
        "4 profiles x 2 data kinds x 4 targets"
    );
    for row in rows {
        assert!(row["iops"].as_f64().unwrap() > 0.0, "{row}");
        let l = &row["latency"];
        let (p50, p99, p999) = (
            l["p50_us"].as_f64().unwrap(),
            l["p99_us"].as_f64().unwrap(),
            l["p999_us"].as_f64().unwrap(),
        );
        assert!(p50 <= p99 && p99 <= p999, "{row}");
    }
    for t in ["array", "array-shards", "array-nbd", "member"] {
        assert!(rows.iter().any(|x| x["target"] == t), "{t}");
    }
    let ratios = r["compression_ratio"].as_array().unwrap();
    assert!(
        (ratios[0][1].as_f64().unwrap() - 1.0).abs() < 0.02,
        "{ratios:?}"
    );
    assert!(ratios[1][1].as_f64().unwrap() > 3.0, "{ratios:?}");
    let cap = r["capacity"].as_array().unwrap();
    assert_eq!(cap[0]["usable_fraction"], 0.75);
    assert_eq!(cap[1]["usable_fraction"], 0.5);
    assert_eq!(cap[2]["survives_failures"], 0);
    assert_eq!(r["sweep"].as_array().unwrap().len(), 4 * 8);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<polyline"));
    // It leaves none of its files in the folder it was given.
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
    // Arguments it cannot run with: a usage error before anything is made
    // (they panicked, or were refused, after the member files were made,
    // which stayed).
    // A --dir holding a file of the bench's names: refused, and the file
    // is left as it was (it was overwritten, or removed at the end).
    for name in ["m0.img", "bench.sock"] {
        let mine = dir.join(name);
        std::fs::write(&mine, b"not the bench's").unwrap();
        let (code, out, err) = w.code(&["bench", "--dir", s(&dir), "--member-size", "16M"]);
        assert_eq!(code, 4, "{name}: {out}{err}");
        assert!(err.contains(&format!("{} exists", mine.display())), "{err}");
        assert_eq!(std::fs::read(&mine).unwrap(), b"not the bench's");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "{name}: {left:?}");
        std::fs::remove_file(&mine).unwrap();
    }
    for bad in [
        &["--seconds=-1"][..],
        &["--seconds", "nan"],
        &["--seconds", "99999999999999999999"],
        &["--sweep-seconds", "0"],
        &["--members", "1"],
        &["--level", "6", "--members", "3"],
        &["--member-size", "1"],
    ] {
        let mut args = vec!["bench", "--dir", s(&dir)];
        args.extend_from_slice(bad);
        let (code, out, err) = w.code(&args);
        assert_eq!(code, 2, "{bad:?}: {out}{err}");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert!(left.is_empty(), "{bad:?} left {left:?}");
    }
}

/// Members of different sizes are each used up to the smallest's size:
/// `create` says how much of the larger ones holds nothing (as mdadm
/// does), and says nothing where they match.
#[test]
fn create_says_when_members_differ_in_size() {
    let w = World::new("uneven");
    let a = w.sparse("a.img", 64 << 20);
    let b = w.sparse("b.img", 64 << 20);
    let c = w.sparse("c.img", 32 << 20);
    let out = w.ok(&[
        "create",
        "un",
        "--level",
        "5",
        "--sparse",
        s(&a),
        s(&b),
        s(&c),
    ]);
    assert!(
        out.contains("differ in size") && out.contains("32.0 MiB"),
        "{out}"
    );
    let (d, e) = (w.sparse("d.img", 64 << 20), w.sparse("e.img", 64 << 20));
    let out = w.ok(&["create", "ev", "--level", "1", "--sparse", s(&d), s(&e)]);
    assert!(
        out.contains("created") && !out.contains("differ in size"),
        "{out}"
    );
}

/// `create --force` over a member of another (stopped) array says what it
/// overwrote: that array has lost the device.
#[test]
fn create_force_says_what_it_overwrote() {
    let w = World::new("overwrote");
    let m = w.sparse_members("m", 3, 32 << 20);
    w.ok(&[
        "create",
        "old",
        "--level",
        "5",
        "--sparse",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
    ]);
    let fresh = w.sparse("f.img", 32 << 20);
    let (code, _, err) = w.code(&[
        "create",
        "new",
        "--level",
        "1",
        "--sparse",
        s(&m[0]),
        s(&fresh),
    ]);
    assert_eq!(code, 4, "{err}");
    let out = w.ok(&[
        "create",
        "new",
        "--level",
        "1",
        "--sparse",
        "--force",
        s(&m[0]),
        s(&fresh),
    ]);
    let notes: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("--force overwrote"))
        .collect();
    assert_eq!(notes.len(), 1, "{out}");
    assert!(
        notes[0].contains(s(&m[0])) && notes[0].contains("'old'"),
        "{out}"
    );
}

/// A world in memory with four 1 GiB sparse members for a create that
/// zeroes them (tmpfs takes no hole punch in an allocated file: zeros are
/// written, 4 GiB, seconds here); None, said, where there is no /dev/shm.
fn zeroing_world(tag: &str) -> Option<(World, Vec<PathBuf>)> {
    let Some(w) = World::in_memory(tag) else {
        eprintln!("skipped: no /dev/shm");
        return None;
    };
    let m = w.sparse_members("z", 4, 1024 * MIB);
    Some((w, m))
}

/// A create that zeroes its members (not --sparse) shows the zeroing's
/// progress on a terminal: on a device that cannot zero by itself that is
/// every byte written, minutes on large drives, and create said nothing
/// until the end. Without a terminal, no progress line. Members on tmpfs,
/// which takes no hole punch in an allocated file: zeros are written.
#[test]
fn create_shows_the_zeroing_on_a_terminal() {
    let Some((w, m)) = zeroing_world("zprog") else {
        return;
    };
    let p: Vec<&str> = m.iter().map(|p| s(p)).collect();
    let mut args = vec!["create", "zt", "--level", "5"];
    args.extend(&p);
    let Some(o) = w.on_a_terminal(&args) else {
        eprintln!("skipped: no `script` (util-linux) to give the command a terminal");
        return;
    };
    let tty = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{tty}");
    let drawn = tty
        .rfind("zeroing the members' data areas: ")
        .unwrap_or_else(|| panic!("no progress: {tty:?}"));
    let cleared = tty.rfind("\r\x1b[K").expect("a cleared line");
    assert!(cleared > drawn, "the line is not cleared: {tty:?}");
    assert!(tty.contains("created raid5 'zt'"), "{tty}");
    // No terminal: the report only.
    let (code, _, err) = w.code(&[
        "create", "zt", "--force", "--level", "5", p[0], p[1], p[2], p[3],
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("zeroing the members"), "{err}");
    // Zeroed: a fresh array reads zeros and its parity agrees.
    w.ok(&["start", "zt"]);
    w.ok(&["scrub", "zt"]);
    w.ok(&["stop", "zt"]);
}

/// Ctrl-C while create zeroes says what it left: nothing created, and the
/// devices' earlier contents gone (their metadata is erased first). It
/// ended with nothing said.
#[test]
fn create_interrupted_while_zeroing_says_what_it_left() {
    let Some((w, m)) = zeroing_world("zstop") else {
        return;
    };
    let mut args = vec!["create", "zi", "--level", "5"];
    args.extend(m.iter().map(|p| s(p)));
    // An array there first, sparse: its metadata going says the create
    // over it (allocating, then erasing, then zeroing) is writing them.
    let mut first = args.clone();
    first.push("--sparse");
    w.ok(&first);
    args.push("--force");
    let child = std::process::Command::new(raid_e2e::raidctl_path())
        .args(&args)
        .env("RAIDCTL_STATE_DIR", w.state())
        .env("RAIDCTL_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let erased = || {
        let mut magic = [0u8; 8];
        std::fs::File::open(&m[0])
            .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut magic, 0))
            .is_ok_and(|()| &magic != b"NVRAIDSB")
    };
    let t = std::time::Instant::now();
    while !erased() && t.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    if o.status.success() {
        eprintln!("skipped: the create ended before it could be interrupted");
        return;
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(
        err.contains("create interrupted: nothing was created"),
        "{err}"
    );
    // The earlier array is gone, and no new one stands in its place.
    let (code, _, err) = w.code(&["start", "zi"]);
    assert_ne!(code, 0, "{err}");
}
