//! Scrub as the operator sees it: started in the background, its progress
//! shown by status and, waited for on a terminal, as a bar; cancelled.

use raid_e2e::World;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Creates and starts `name`, a RAID5 (chunk 16 KiB) of four sparse 32
/// MiB members, its scrubs paced at `rate` (bytes per second over ~120
/// MiB of members).
fn paced_scrubs(w: &World, name: &str, rate: &str) {
    let m: Vec<PathBuf> = (0..4)
        .map(|i| w.sparse(&format!("{name}{i}.img"), 32 * MIB))
        .collect();
    let mut args = vec!["create", name, "--level", "5", "--chunk", "16K"];
    args.extend(m.iter().map(|p| s(p)));
    w.ok(&args);
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
