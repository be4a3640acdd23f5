//! The operator's flow through the real binary, and a table of wrong
//! invocations: each exits with its documented code and message and leaves
//! every member byte for byte as it was.

use raid_e2e::{qemu_io, write_at, World};
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
            // A slot number where a member's path goes: refused (a fail
            // must not guess), naming the path that slot's member has.
            args: a(&["fail", "live", "1"]),
            code: 3,
            says: "members are named by path: slot 1 is",
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

/// `raidctl bench --drives simulated`: the members and the lone member
/// are simulated NVMe drives in memory, so no member file is made; every
/// target is measured and the report says what the drives were. Another
/// kind of drive is a usage error.
#[test]
fn bench_on_simulated_drives() {
    let w = World::new("bench-sim");
    let json = w.dir.join("b.json");
    let dir = w.dir.join("members");
    w.ok(&[
        "bench",
        "--dir",
        s(&dir),
        "--drives",
        "simulated",
        "--member-size",
        "16M",
        "--seconds",
        "0.05",
        "--sweep-seconds",
        "0.01",
        "--json",
        s(&json),
    ]);
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["drives"], "simulated NVMe");
    let rows = r["results"].as_array().unwrap();
    assert_eq!(rows.len(), 4 * 2 * 4);
    assert!(
        rows.iter().all(|x| x["iops"].as_f64().unwrap() > 0.0),
        "{rows:?}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
    let (code, out, err) = w.code(&["bench", "--dir", s(&dir), "--drives", "ssd"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("simulated"), "{err}");
}
