//! Scrub as the operator sees it: started in the background, its progress
//! shown by status and, waited for on a terminal, as a bar; cancelled;
//! finding silent corruption and repairing it (by hand and on a schedule),
//! and not offering a repair it cannot make (two copies that disagree).

use raid_e2e::{qemu_io, write_at, World};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Creates, fills and starts `name`, a RAID5 (chunk 16 KiB) of four
/// sparse 32 MiB members, its scrubs paced at `rate` (bytes per second
/// over ~120 MiB of members).
fn paced_scrubs(w: &World, name: &str, rate: &str) {
    let m: Vec<PathBuf> = (0..4)
        .map(|i| w.sparse(&format!("{name}{i}.img"), 32 * MIB))
        .collect();
    w.create(name, "5", &m, &["--chunk", "16K"]);
    // Rows that every member holds holes on are not read.
    w.fill(name);
    let o = w.run_env(&["start", name], &[("RAIDCTL_SCRUB_RATE", rate)]);
    assert!(o.status.success(), "{o:?}");
}

#[test]
fn scrub_runs_in_the_background_shows_its_progress_and_cancels() {
    let w = World::new("bgscrub");
    // Slow enough to be seen running: about 15 s.
    paced_scrubs(&w, "bg", "8M");
    let out = w.ok(&["scrub", "bg", "--background"]);
    assert!(out.contains("started"), "{out}");
    w.refused(&["scrub", "bg"], "already running");
    let t = Instant::now();
    let sc = loop {
        let st = w.status_json("bg");
        let sc = st["scrub"].clone();
        if sc["rows_done"].as_u64().unwrap_or(0) > 0 {
            break sc;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{st}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(sc["repair"], false, "{sc}");
    assert!(sc["percent"].as_f64().unwrap() < 100.0, "{sc}");
    assert!(sc["eta_seconds"].as_f64().is_some(), "{sc}");
    let text = w.ok(&["status", "bg"]);
    assert!(text.contains("scrub (check only)"), "{text}");
    let out = w.ok(&["scrub", "bg", "--cancel"]);
    assert!(out.contains("cancelled"), "{out}");
    assert!(w.status_json("bg")["scrub"].is_null());
    let ev = w.ok(&["events", "bg"]);
    assert!(ev.contains("scrub interrupted"), "{ev}");
    w.refused(&["scrub", "bg", "--cancel"], "no scrub");
    // The rate changes while a scrub runs: lifted, it runs to the end.
    w.ok(&["scrub", "bg", "--background"]);
    let out = w.ok(&["rate", "bg", "--scrub", "0"]);
    assert!(out.contains("scrub no limit"), "{out}");
    let t = Instant::now();
    while !w.status_json("bg")["scrub"].is_null() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the scrub never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ev = w.ok(&["events", "bg"]);
    assert!(ev.contains("scrub finished"), "{ev}");
    w.ok(&["stop", "bg"]);
}

/// A scrub waited for on a terminal shows its progress on one line of
/// stderr, redrawn while it runs and cleared at the end; without a
/// terminal (a script, cron) it prints only its report.
#[test]
fn a_scrub_waited_for_on_a_terminal_shows_its_progress() {
    let w = World::new("ttyscrub");
    // About 8 s: the line is drawn each second.
    paced_scrubs(&w, "tty", "16M");
    let Some(o) = w.on_a_terminal(&["scrub", "tty"]) else {
        eprintln!("skipped: no `script` (util-linux) to give the command a terminal");
        w.ok(&["stop", "tty"]);
        return;
    };
    let tty = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{tty}");
    let drawn = tty
        .rfind("% at ")
        .unwrap_or_else(|| panic!("no progress: {tty}"));
    assert!(tty.contains("tty: scrub "), "{tty}");
    let cleared = tty.rfind("\r\x1b[K").expect("a cleared line");
    assert!(
        cleared > drawn,
        "the line is not cleared at the end: {tty:?}"
    );
    assert!(tty[cleared..].contains("scrub of 'tty'"), "{tty}");
    w.ok(&["rate", "tty", "--scrub", "0"]);
    let o = w.run(&["scrub", "tty"]);
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("% at "), "progress without a terminal: {err}");
    w.ok(&["stop", "tty"]);
}

/// Two mirror copies that differ: nothing says which is right, so the
/// event (what an alert mails) does not offer `--repair` as the next step:
/// it keeps the first copy, here the bad one.
#[test]
fn a_two_copy_mismatch_does_not_offer_the_repair_as_the_fix() {
    let w = World::new("scrub-two");
    let m = w.sparse_members("m", 2, 16 * MIB);
    w.ok(&["create", "st", "--level", "1", s(&m[0]), s(&m[1])]);
    let sock = w.dir.join("st.sock");
    w.ok(&["start", "st", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(&sock, "st", &["write -P 0x3c 0 4M"]);
    assert!(ok, "{text}");
    // Rot on the first copy, 1 MiB + 5000 bytes into its data area.
    write_at(&m[0], MIB + MIB + 5000, b"bit rot");
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
    let w = World::new("scrub");
    let m = w.sparse_members("m", 5, 16 * MIB);
    w.create("sc", "6", &m, &["--chunk", "16K"]);
    let sock = w.dir.join("sc.sock");
    w.ok(&["start", "sc", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(&sock, "sc", &["write -P 0x77 0 8M"]);
    assert!(ok, "{text}");
    let clean: serde_json::Value =
        serde_json::from_str(&w.ok(&["scrub", "sc", "--format", "json"])).unwrap();
    assert_eq!(clean["mismatches"].as_array().unwrap().len(), 0, "{clean}");
    // Rot on member 3, 1 MiB + 5000 bytes into its data area.
    write_at(&m[3], MIB + MIB + 5000, b"bit rot");
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
        write_at(&m[k], MIB + MIB + 5000, rot);
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
fn scheduled_scrub_repairs_by_itself() {
    let w = World::new("sched");
    let m = w.sparse_members("m", 4, 16 * MIB);
    w.create("sd", "6", &m, &["--chunk", "16K"]);
    std::fs::write(
        w.state().join("raidctl.toml"),
        "[scrub]\nevery_hours = 0.0001\nrepair = true\n",
    )
    .unwrap();
    let sock = w.dir.join("sd.sock");
    w.ok(&["start", "sd", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(&sock, "sd", &["write -P 0x24 0 2M"]);
    assert!(ok, "{text}");
    write_at(&m[2], MIB + 300, b"rot");
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
