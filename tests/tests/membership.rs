//! The operator cannot talk the array into losing data: each way a hostile
//! operator or a new user lost data through membership and lifecycle
//! commands, as a test through the real binary. Each fails on a build
//! without the guards (`RAIDCTL_BIN=/path/to/old/raidctl cargo test
//! --test membership` shows it).

use raid_e2e::{eventually, file_hash, qemu_io, World};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn member_states(w: &World, name: &str) -> Vec<String> {
    w.status_json(name)["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap().to_string())
        .collect()
}

/// The `next` command of the newest `event` of array `name`, as printed.
fn next_of(w: &World, name: &str, event: &str) -> Option<String> {
    let events: serde_json::Value =
        serde_json::from_str(&w.ok(&["events", name, "--format", "json"])).unwrap();
    events
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .filter(|e| e["event"] == event)
        .find_map(|e| e["next"].as_str())
        .map(String::from)
}

fn scrub_clean(w: &World, name: &str) {
    let r: serde_json::Value =
        serde_json::from_str(&w.ok(&["scrub", name, "--format", "json"])).unwrap();
    assert_eq!(r["mismatches"].as_array().unwrap().len(), 0, "{r}");
}

#[test]
fn replace_with_an_active_member_of_the_same_array_is_refused() {
    let w = World::new("repl-active");
    let (m, sock) = w.running_with_pattern("ra", "5", 4);
    w.ok(&["fail", "ra", s(&m[1])]);
    let before = file_hash(&m[2]);
    w.refused(&["replace", "ra", s(&m[1]), s(&m[2])], "slot 2");
    assert_eq!(file_hash(&m[2]), before, "the active member was written");
    assert_eq!(
        member_states(&w, "ra"),
        ["active", "failed", "active", "active"]
    );
    raid_e2e::pattern_reads_back(&sock, "ra");
    // The array still stops and starts: no two members claim one slot.
    w.ok(&["stop", "ra"]);
    w.ok(&["start", "ra", "--nbd", &format!("unix:{}", sock.display())]);
    raid_e2e::pattern_reads_back(&sock, "ra");
}

#[test]
fn a_hard_link_of_an_active_member_is_refused_by_add_replace_and_create() {
    let w = World::new("hardlink");
    let (m, sock) = w.running_with_pattern("hl", "5", 4);
    let link = w.dir.join("link-to-m0.img");
    std::fs::hard_link(&m[0], &link).unwrap();
    w.refused(&["add", "hl", s(&link)], "slot 0");
    // The rule is named, as every refusal's is (scripts look for it).
    w.refused(&["add", "hl", s(&link)], "[refused: already-a-member]");
    w.ok(&["fail", "hl", s(&m[3])]);
    w.refused(&["replace", "hl", s(&m[3]), s(&link)], "slot 0");
    assert_eq!(
        member_states(&w, "hl"),
        ["active", "active", "active", "failed"]
    );
    raid_e2e::pattern_reads_back(&sock, "hl");
    // create with a file and its hard link: one device listed twice.
    let x = w.sparse("x.img", 16 * MIB);
    let x2 = w.dir.join("x-link.img");
    std::fs::hard_link(&x, &x2).unwrap();
    let y = w.sparse("y.img", 16 * MIB);
    w.refused(
        &["create", "pair", "--level", "5", s(&x), s(&y), s(&x2)],
        "same device",
    );
    assert!(!w.state().join("arrays/pair.toml").exists());
}

#[test]
fn create_force_never_touches_a_running_array() {
    let w = World::new("create-force");
    let (m, sock) = w.running_with_pattern("live", "5", 3);
    let fresh: Vec<PathBuf> = (0..3)
        .map(|i| w.sparse(&format!("f{i}.img"), 16 * MIB))
        .collect();
    let before = file_hash(&m[1]);
    w.refused(
        &[
            "create",
            "other",
            "--force",
            "--level",
            "5",
            s(&fresh[0]),
            s(&m[1]),
            s(&fresh[1]),
        ],
        "is in use",
    );
    assert_eq!(
        file_hash(&m[1]),
        before,
        "a running array's member was written"
    );
    // The name of a running array is not taken over either.
    w.refused(
        &[
            "create",
            "live",
            "--force",
            "--level",
            "5",
            s(&fresh[0]),
            s(&fresh[1]),
            s(&fresh[2]),
        ],
        "is running",
    );
    assert_eq!(w.status_json("live")["state"], "optimal");
    raid_e2e::pattern_reads_back(&sock, "live");
    scrub_clean(&w, "live");
}

#[test]
fn fail_past_redundancy_is_refused_and_a_forced_failure_can_be_undone() {
    let w = World::new("fail-past");
    let (m, sock) = w.running_with_pattern("fp", "5", 3);
    w.ok(&["fail", "fp", s(&m[0])]);
    // Written while degraded: m0 never sees it.
    let (ok, text) = qemu_io(&sock, "fp", &["write -P 0x5a 8M 4M", "flush"]);
    assert!(ok, "{text}");
    let err = w.refused(&["fail", "fp", s(&m[1])], "--force");
    assert!(err.contains("would-lose-data"), "{err}");
    assert_eq!(member_states(&w, "fp"), ["failed", "active", "active"]);
    let out = w.ok(&["fail", "fp", s(&m[1]), "--force"]);
    assert!(out.contains("forced"), "{out}");
    let (code, _, _) = w.code(&["status", "fp"]);
    assert_eq!(code, 2, "status of a failed array exits 2");
    // A failed array stops, and says how to come back.
    let out = w.ok(&["stop", "fp"]);
    assert!(out.contains("--force"), "{out}");
    // A plain start refuses, and names the way out.
    let (code, _, err) = w.code(&["start", "fp"]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("--force"), "{err}");
    // Both members are at hand: the refusal says why each is not used.
    assert!(
        err.contains(&format!("given but not usable: {}: stale", s(&m[0])))
            && err.contains(&format!("{}: stale", s(&m[1]))),
        "{err}"
    );
    // Forced assembly takes back m1 (failed last, holds every write), not m0.
    let out = w.ok(&[
        "start",
        "fp",
        "--force",
        "--nbd",
        &format!("unix:{}", sock.display()),
    ]);
    assert!(out.contains("forced back into slot 1"), "{out}");
    let states = member_states(&w, "fp");
    assert_eq!(states[1..], ["active", "active"], "{states:?}");
    assert_ne!(states[0], "active", "{states:?}");
    // The slot left out names the device recorded for it, not nothing.
    let st = w.status_json("fp");
    assert_eq!(st["members"][0]["path"], s(&m[0]), "{st}");
    let (_, out, _) = w.code(&["status", "fp"]);
    assert!(
        out.contains(&format!("failed      {} (not in use)", s(&m[0]))),
        "{out}"
    );
    let (ok, text) = qemu_io(&sock, "fp", &["read -P 0x5a 0 12M"]);
    assert!(ok, "{text}");
    let new = w.sparse("new0.img", 16 * MIB);
    w.ok(&["replace", "fp", s(&m[0]), s(&new)]);
    w.ok(&["wait", "fp"]);
    assert_eq!(w.status_json("fp")["state"], "optimal");
    scrub_clean(&w, "fp");
}

/// A RAID10 down one member of each mirror pair still serves every byte:
/// stopped, its status says degraded (exit 1), as it did running, not
/// failed (exit 2, which pages as an array lost and points to the failed
/// array's runbook).
#[test]
fn a_stopped_raid10_down_one_of_each_pair_is_degraded_not_failed() {
    let w = World::new("r10-stopped");
    let (m, sock) = w.running_with_pattern("rt", "10", 4);
    w.ok(&["fail", "rt", s(&m[0])]);
    w.refused(&["fail", "rt", s(&m[1])], "would-lose-data");
    w.ok(&["fail", "rt", s(&m[2])]);
    let (code, out, _) = w.code(&["status", "rt"]);
    assert_eq!(code, 1, "running: {out}");
    w.ok(&["stop", "rt"]);
    let (code, out, _) = w.code(&["status", "rt"]);
    assert_eq!(code, 1, "stopped: {out}");
    assert_eq!(w.status_json("rt")["health"], "degraded");
    w.ok(&["start", "rt", "--nbd", &format!("unix:{}", sock.display())]);
    raid_e2e::pattern_reads_back(&sock, "rt");
    w.ok(&["stop", "rt"]);
}

/// Two slots to rebuild: one copy runs at a time. The replace that queues
/// the second says so, and status shows the rebuild that runs (its
/// progress) with the other waiting, not the waiting one at 0%.
#[test]
fn a_second_rebuild_waits_and_status_shows_the_one_running() {
    // Mirrors rebuild one slot per pass (RAID5/6 join the pass: below).
    let w = World::new("two-rebuilds");
    let (m, sock) = w.running_with_pattern("tr", "10", 6);
    w.ok(&["rate", "tr", "--rebuild", "1M"]);
    w.ok(&["fail", "tr", s(&m[3])]);
    let first = w.sparse("tr-new3.img", 16 * MIB);
    let out = w.ok(&["replace", "tr", s(&m[3]), s(&first)]);
    assert!(out.contains("rebuild started"), "{out}");
    eventually("the first rebuild to run", || {
        w.status_json("tr")["rebuild"]["done_bytes"].as_u64() > Some(0)
    });
    // The other mirror pair's member.
    w.ok(&["fail", "tr", s(&m[0])]);
    let second = w.sparse("tr-new0.img", 16 * MIB);
    let out = w.ok(&["replace", "tr", s(&m[0]), s(&second)]);
    assert!(out.contains("once slot 3's rebuild ends"), "{out}");
    let st = w.status_json("tr");
    assert_eq!(st["rebuild"]["slot"], 3, "{st}");
    assert_eq!(st["rebuild"]["waiting_slots"][0], 0, "{st}");
    let (_, text, _) = w.code(&["status", "tr"]);
    assert!(
        text.contains("slot 0 waits, rebuilt after slot 3"),
        "{text}"
    );
    // A third, of the last pair: it waits for both before it.
    w.ok(&["fail", "tr", s(&m[5])]);
    let third = w.sparse("tr-new5.img", 16 * MIB);
    w.ok(&["replace", "tr", s(&m[5]), s(&third)]);
    let (_, text, _) = w.code(&["status", "tr"]);
    assert!(
        text.contains("slot 5 waits, rebuilt after slots 3 and 0"),
        "{text}"
    );
    w.ok(&["rate", "tr", "--rebuild", "0"]);
    w.ok(&["wait", "tr"]);
    assert_eq!(w.status_json("tr")["state"], "optimal");
    raid_e2e::pattern_reads_back(&sock, "tr");
}

/// A RAID6's second replacement, while the first is being rebuilt, joins
/// the pass under way: one pass of reads rebuilds both, the first is done
/// when it would have been alone, and status shows each.
#[test]
fn a_raid6_second_rebuild_joins_the_pass_under_way() {
    let w = World::new("join-pass");
    let (m, sock) = w.running_with_pattern("jp", "6", 5);
    w.ok(&["rate", "jp", "--rebuild", "1M"]);
    w.ok(&["fail", "jp", s(&m[3])]);
    let first = w.sparse("jp-new3.img", 16 * MIB);
    let out = w.ok(&["replace", "jp", s(&m[3]), s(&first)]);
    assert!(out.contains("rebuild started"), "{out}");
    eventually("the first rebuild to run", || {
        w.status_json("jp")["rebuild"]["done_bytes"].as_u64() > Some(0)
    });
    w.ok(&["fail", "jp", s(&m[0])]);
    let second = w.sparse("jp-new0.img", 16 * MIB);
    let out = w.ok(&["replace", "jp", s(&m[0]), s(&second)]);
    assert!(out.contains("in the pass that rebuilds slot 3"), "{out}");
    // Shown in the pass at once (it joins at the pass's next batch), never
    // as waiting.
    let st = w.status_json("jp");
    assert_eq!(st["rebuild"]["slot"], 3, "{st}");
    assert_eq!(st["rebuild"]["same_pass"][0]["slot"], 0, "{st}");
    assert!(st["rebuild"].get("waiting_slots").is_none(), "{st}");
    let (_, text, _) = w.code(&["status", "jp"]);
    assert!(text.contains("in the same pass as slot 3"), "{text}");
    // A stop says where each resumes: the slot that joined starts again.
    eventually("slot 0 to be rebuilt past its join", || {
        w.status_json("jp")["rebuild"]["same_pass"][0]["done_bytes"].as_u64() > Some(0)
    });
    let out = w.ok(&["stop", "jp"]);
    assert!(
        out.contains("slot 0 starts again from 0%") && out.contains("slot 3 resumes from"),
        "{out}"
    );
    w.ok(&["start", "jp", "--nbd", &format!("unix:{}", sock.display())]);
    w.ok(&["rate", "jp", "--rebuild", "0"]);
    w.ok(&["wait", "jp"]);
    assert_eq!(w.status_json("jp")["state"], "optimal");
    // Slot 3 first: it was not held back by the slot that joined.
    let ev = w.ok(&["events", "jp"]);
    let done = |slot: &str| {
        ev.lines()
            .position(|l| l.contains("rebuild_finished") && l.contains(slot))
            .unwrap_or_else(|| panic!("no rebuild_finished for {slot}:\n{ev}"))
    };
    assert!(done("slot 3") < done("slot 0"), "{ev}");
    raid_e2e::pattern_reads_back(&sock, "jp");
    scrub_clean(&w, "jp");
}

/// An array imported with its members named (its record deleted), one of
/// them failed before: the failed device is recorded for its slot, as an
/// ordinary start keeps it, so replace names it, status shows it, and
/// delete --wipe erases it (it was left with the array's metadata, and no
/// word said).
/// A member failed before a restart is there, left out: `status` (text,
/// JSON) says failed, not missing (which would send the operator looking
/// for a device that is in place), and how to take it back; re-add does.
#[test]
fn a_member_failed_before_a_restart_is_shown_failed_not_missing() {
    let w = World::new("failed-restart");
    let (m, sock) = w.running_with_pattern("fr", "5", 4);
    w.ok(&["fail", "fr", s(&m[1])]);
    w.ok(&["stop", "fr"]);
    w.ok(&["start", "fr", "--nbd", &format!("unix:{}", sock.display())]);
    let st = w.status_json("fr");
    assert_eq!(st["members"][1]["state"], "failed", "{st}");
    assert_eq!(st["members"][1]["path"], s(&m[1]), "{st}");
    let warning = st["members"][1]["warning"].as_str().unwrap_or_default();
    assert!(
        warning.contains(&format!("raidctl re-add fr {}", s(&m[1]))),
        "{st}"
    );
    let (code, text, _) = w.code(&["status", "fr"]);
    assert_eq!(code, 1, "degraded: {text}");
    assert!(
        text.contains(&format!("failed      {} (not in use)", s(&m[1])))
            && !text.contains("missing"),
        "{text}"
    );
    w.ok(&["re-add", "fr", s(&m[1])]);
    w.ok(&["wait", "fr"]);
    assert_eq!(member_states(&w, "fr"), ["active"; 4]);
    raid_e2e::pattern_reads_back(&sock, "fr");
}

/// A member missing at the start that turns up later (a slow drive at
/// boot): status does not call it a member that failed before, and the
/// missing event's next step, followed, brings it back.
#[test]
fn a_member_that_turns_up_after_the_start_is_not_called_failed_before() {
    let w = World::new("late-member");
    let (m, sock) = w.running_with_pattern("lm", "5", 4);
    w.ok(&["stop", "lm"]);
    let away = w.dir.join("away.img");
    std::fs::rename(&m[2], &away).unwrap();
    w.ok(&["start", "lm", "--nbd", &format!("unix:{}", sock.display())]);
    std::fs::rename(&away, &m[2]).unwrap();
    let st = w.status_json("lm");
    let warning = st["members"][2]["warning"].as_str().unwrap_or_default();
    assert!(
        warning.contains("missing at the start") && !warning.contains("by mistake"),
        "{st}"
    );
    let next = next_of(&w, "lm", "member_missing").expect("a next step");
    let readd = format!("raidctl re-add lm {}", s(&m[2]));
    assert!(next.contains(&readd), "{next}");
    w.ok(&["re-add", "lm", s(&m[2])]);
    w.ok(&["wait", "lm"]);
    assert_eq!(member_states(&w, "lm"), ["active"; 4]);
    raid_e2e::pattern_reads_back(&sock, "lm");
}

/// `fail` says which spare took the slot, having given it: two failures
/// one after the other on a RAID6 with two spares name each its own spare
/// (the second used to name the first's, which the monitor had not yet
/// moved), and status shows the same.
#[test]
fn fail_names_the_spare_that_took_the_slot() {
    let w = World::new("fail-spare");
    let (m, sock) = w.running_with_pattern("fs", "6", 5);
    let spares: Vec<PathBuf> = (1..=2)
        .map(|i| w.sparse(&format!("fs-spare{i}.img"), 16 * MIB))
        .collect();
    for sp in &spares {
        w.ok(&["add", "fs", s(sp)]);
    }
    for (slot, sp) in spares.iter().enumerate() {
        let out = w.ok(&["fail", "fs", s(&m[slot])]);
        let took = format!("spare {} took slot {slot}", s(sp));
        assert!(out.contains(&took), "{out}");
    }
    let st = w.status_json("fs");
    for (slot, sp) in spares.iter().enumerate() {
        assert_eq!(st["members"][slot]["path"], s(sp), "{st}");
    }
    w.ok(&["wait", "fs"]);
    raid_e2e::pattern_reads_back(&sock, "fs");
}

/// Two commands adding one device at the same instant: one wins, and the
/// other is told which array holds it (it read "a running array (or
/// another program) holds it", the winner having the device open before
/// it was the array's spare).
#[test]
fn two_adds_of_one_device_at_once_name_the_array_that_took_it() {
    let w = World::new("add-race");
    let _ = w.running_with_pattern("ar", "5", 3);
    for round in 0..5 {
        let dev = w.sparse(&format!("ar-x{round}.img"), 16 * MIB);
        let outs: Vec<(i32, String, String)> = std::thread::scope(|sc| {
            let adds: Vec<_> = (0..2)
                .map(|_| sc.spawn(|| w.code(&["add", "ar", s(&dev)])))
                .collect();
            adds.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(outs.iter().filter(|o| o.0 == 0).count(), 1, "{outs:?}");
        let lost = outs.iter().find(|o| o.0 != 0).unwrap();
        assert!(
            lost.2.contains("array 'ar'") && !lost.2.contains("another program"),
            "round {round}: {lost:?}"
        );
    }
}

/// A start with a slot down and a spare at hand gives the spare the slot
/// before it returns, and says so (the monitor used to, a moment later:
/// status in between offered a re-add the spare was about to make moot).
#[test]
fn a_start_gives_a_spare_to_a_slot_that_is_down() {
    let w = World::new("start-spare");
    let (m, sock) = w.running_with_pattern("ss", "5", 3);
    let spare = w.sparse("ss-spare.img", 16 * MIB);
    w.ok(&["add", "ss", s(&spare)]);
    w.ok(&["stop", "ss"]);
    let away = w.dir.join("away.img");
    std::fs::rename(&m[1], &away).unwrap();
    let out = w.ok(&["start", "ss", "--nbd", &format!("unix:{}", sock.display())]);
    assert!(
        out.contains(&format!("spare {} took slot 1", s(&spare))),
        "{out}"
    );
    assert_eq!(w.status_json("ss")["members"][1]["path"], s(&spare));
    w.ok(&["wait", "ss"]);
    raid_e2e::pattern_reads_back(&sock, "ss");
}

/// A RAID6 missing two members says it has no redundancy left; missing
/// one, it does not (both read "degraded" alone); nor did a RAID1 with
/// one copy left.
#[test]
fn a_raid6_missing_two_says_no_redundancy_is_left() {
    let w = World::new("no-margin");
    let (m, _sock) = w.running_with_pattern("nm", "6", 5);
    w.ok(&["fail", "nm", s(&m[0])]);
    let one = w.code(&["status", "nm"]).1;
    assert!(
        one.contains("degraded") && !one.contains("no redundancy left"),
        "{one}"
    );
    w.ok(&["fail", "nm", s(&m[1])]);
    let two = w.code(&["status", "nm"]).1;
    assert!(two.contains("degraded, no redundancy left"), "{two}");
    let list = w.code(&["list"]).1;
    assert!(list.contains("no redundancy left"), "{list}");
    // A RAID1 of two with one copy left, the same.
    let (m1, _) = w.running_with_pattern("nm1", "1", 2);
    w.ok(&["fail", "nm1", s(&m1[0])]);
    let one_left = w.code(&["status", "nm1"]).1;
    assert!(
        one_left.contains("degraded, no redundancy left"),
        "{one_left}"
    );
}

/// A failed member taken out with `remove` is said to be that, not to
/// have been left out at a start that never happened.
#[test]
fn a_removed_member_is_not_called_left_out_at_the_start() {
    let w = World::new("removed-member");
    let (m, _sock) = w.running_with_pattern("rm", "5", 4);
    w.ok(&["fail", "rm", s(&m[2])]);
    w.ok(&["remove", "rm", s(&m[2])]);
    let st = w.status_json("rm");
    let warning = st["members"][2]["warning"].as_str().unwrap_or_default();
    assert!(
        warning.contains("removed") && !warning.contains("at the start"),
        "{st}"
    );
    w.ok(&["re-add", "rm", s(&m[2])]);
    w.ok(&["wait", "rm"]);
    assert_eq!(member_states(&w, "rm"), ["active"; 4]);
}

/// Each event in the log carries the array's state as the event was
/// recorded, not as the daemon found it on its next turn (a short rebuild
/// is over by then, and its start read "optimal").
#[test]
fn the_event_log_has_the_state_each_event_left() {
    let w = World::new("event-states");
    let (m, _sock) = w.running_with_pattern("es", "5", 3);
    // Failed and taken back with nothing written meanwhile: its resync
    // has nothing to copy, and ends at once.
    w.ok(&["fail", "es", s(&m[1])]);
    w.ok(&["re-add", "es", s(&m[1])]);
    w.ok(&["wait", "es"]);
    let ev: serde_json::Value =
        serde_json::from_str(&w.ok(&["events", "es", "--format", "json"])).unwrap();
    let state_of = |kind: &str| {
        ev.as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|e| e["event"] == kind)
            .unwrap_or_else(|| panic!("no {kind}: {ev}"))["array_state"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(state_of("member_failed"), "degraded", "{ev}");
    assert_eq!(state_of("member_re_added"), "rebuilding", "{ev}");
    assert_eq!(state_of("rebuild_started"), "rebuilding", "{ev}");
    assert_eq!(state_of("rebuild_finished"), "optimal", "{ev}");
}

#[test]
fn an_import_records_the_failed_member_it_was_given() {
    let w = World::new("import-failed");
    let (m, _sock) = w.running_with_pattern("im", "5", 3);
    w.ok(&["fail", "im", s(&m[1])]);
    w.ok(&["stop", "im"]);
    w.ok(&["delete", "im"]);
    let out = w.ok(&["start", "im", "--members", s(&m[0]), s(&m[1]), s(&m[2])]);
    assert!(out.contains("not used"), "{out}");
    let st = w.status_json("im");
    assert_eq!(st["members"][1]["path"], s(&m[1]), "{st}");
    w.ok(&["stop", "im"]);
    let out = w.ok(&["delete", "im", "--wipe", "--force"]);
    for p in &m {
        let ex = w.ok(&["examine", s(p)]);
        assert!(
            !ex.contains("array:   im"),
            "{p:?} still carries the array:\n{ex}\n{out}"
        );
    }
}

#[test]
fn replace_on_a_failed_array_is_refused_without_a_retry_storm() {
    let w = World::new("storm");
    let (m, _sock) = w.running_with_pattern("st", "5", 3);
    w.ok(&["fail", "st", s(&m[0])]);
    w.ok(&["fail", "st", s(&m[1]), "--force"]);
    let new = w.sparse("new.img", 16 * MIB);
    w.refused(&["replace", "st", s(&m[0]), s(&new)], "array-failed");
    std::thread::sleep(Duration::from_secs(1));
    let ev = w.ok(&["events", "st"]);
    assert_eq!(ev.matches("rebuild_failed").count(), 0, "{ev}");
    assert_eq!(file_hash(&new), file_hash(&w.sparse("zero.img", 16 * MIB)));
}

/// After `fail` and a restart the failed member is left out at start; the
/// command the event prints as `next` must still work as printed.
#[test]
fn every_events_next_command_works_as_printed() {
    let w = World::new("next");
    let (m, sock) = w.running_with_pattern("nx", "6", 4);
    w.ok(&["fail", "nx", s(&m[2])]);
    w.ok(&["stop", "nx"]);
    w.ok(&["start", "nx", "--nbd", &format!("unix:{}", sock.display())]);
    let next = next_of(&w, "nx", "member_failed").expect("member_failed says what to do next");
    let new = w.sparse("new2.img", 16 * MIB);
    let cmd = next.replace("NEW_DEVICE", s(&new));
    let args: Vec<&str> = cmd.split_whitespace().collect();
    assert_eq!(args[0], "raidctl", "{cmd}");
    let out = w.ok(&args[1..]);
    assert!(out.contains("rebuild started"), "{out}");
    w.ok(&["wait", "nx"]);
    raid_e2e::pattern_reads_back(&sock, "nx");
    scrub_clean(&w, "nx");
    // The failed array's next step, as printed, brings it back.
    w.ok(&["fail", "nx", s(&m[0])]);
    w.ok(&["fail", "nx", s(&m[1])]);
    w.ok(&["fail", "nx", s(&m[3]), "--force"]);
    let next = next_of(&w, "nx", "array_failed").expect("array_failed says what to do next");
    assert!(next.contains("raidctl start nx --force"), "{next}");
    for part in next.split(';') {
        let part = part.split('(').next().unwrap().trim();
        let words: Vec<&str> = part.split_whitespace().collect();
        match words.first() {
            Some(&"raidctl") => {
                w.ok(&words[1..]);
            }
            // "bring the lost members back, then ...": nothing was unplugged.
            _ => {
                if let Some(cmd) = part.split("then ").nth(1) {
                    let mut args: Vec<String> =
                        cmd.split_whitespace().skip(1).map(String::from).collect();
                    args.extend(["--nbd".into(), format!("unix:{}", sock.display())]);
                    let args: Vec<&str> = args.iter().map(|a| a.as_str()).collect();
                    w.ok(&args);
                }
            }
        }
    }
    assert_eq!(w.status_json("nx")["state"], "degraded");
    raid_e2e::pattern_reads_back(&sock, "nx");
}

#[test]
fn wait_returns_when_no_rebuild_is_pending_and_says_how_it_ended() {
    let w = World::new("wait");
    let (m, sock) = w.running_with_pattern("wt", "5", 3);
    w.ok(&["fail", "wt", s(&m[1])]);
    // Degraded with nothing to rebuild onto: wait ends at once, non-zero,
    // and says so as an outcome (what to do next), not as an error.
    let (code, out, err) = w.code(&["wait", "wt", "--timeout", "30"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        out.contains("wt: degraded, no rebuild pending") && out.contains("raidctl replace wt"),
        "{out}"
    );
    assert!(!err.contains("error"), "{err}");
    let new = w.sparse("new.img", 16 * MIB);
    w.ok(&["replace", "wt", s(&m[1]), s(&new)]);
    // Returns 0 only once the rebuild is done.
    let out = w.ok(&["wait", "wt"]);
    assert!(out.contains("optimal"), "{out}");
    assert_eq!(w.status_json("wt")["state"], "optimal");
    raid_e2e::pattern_reads_back(&sock, "wt");
}

#[test]
fn nbd_unix_path_never_deletes_a_regular_file() {
    let w = World::new("nbdpath");
    let m: Vec<PathBuf> = (0..3)
        .map(|i| w.sparse(&format!("n{i}.img"), 16 * MIB))
        .collect();
    w.ok(&["create", "np", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    let precious = w.dir.join("precious.txt");
    std::fs::write(&precious, "do not delete").unwrap();
    w.refused(
        &[
            "start",
            "np",
            "--nbd",
            &format!("unix:{}", precious.display()),
        ],
        "not a socket",
    );
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "do not delete");
}

#[test]
fn replace_of_an_active_member_is_a_hot_replace_that_never_degrades() {
    let w = World::new("hot");
    let (m, sock) = w.running_with_pattern("hot", "5", 4);
    let new = w.sparse("hot-new.img", 16 * MIB);
    // Paced (about 2 s), so that its progress can be seen.
    w.ok(&["rate", "hot", "--rebuild", "8M"]);
    let out = w.ok(&["replace", "hot", s(&m[1]), s(&new)]);
    assert!(out.contains("hot replace"), "{out}");
    // `wait` alongside: its lines say how far, how fast, how long.
    let waiter = std::process::Command::new(raid_e2e::raidctl_path())
        .args(["wait", "hot"])
        .env("RAIDCTL_STATE_DIR", w.state())
        .env("RAIDCTL_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Never degraded while it copies; its rate and time left are shown.
    let t = Instant::now();
    let mut rated = None;
    loop {
        let st = w.status_json("hot");
        assert_eq!(st["state"], "optimal", "{st}");
        let h = &st["hot_replace"];
        if h.is_null() {
            break;
        }
        if h["rate_bytes_per_sec"].as_f64().unwrap_or(0.0) > 0.0 && rated.is_none() {
            assert!(h["eta_seconds"].as_f64().is_some(), "{h}");
            rated = Some(w.ok(&["status", "hot"]));
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{st}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = rated.expect("a hot replace whose rate was never shown");
    assert!(
        text.contains("hot replace: slot 1") && text.contains("/s, "),
        "{text}"
    );
    w.ok(&["rate", "hot", "--rebuild", "0"]);
    let waited = waiter.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&waited.stdout);
    assert!(waited.status.success(), "{said}");
    assert!(
        said.lines()
            .any(|l| l.starts_with("hot: replacing slot 1 ") && l.contains("/s, ")),
        "{said}"
    );
    w.ok(&["wait", "hot"]);
    let st = w.status_json("hot");
    assert_eq!(st["members"][1]["path"], s(&new), "{st}");
    raid_e2e::pattern_reads_back(&sock, "hot");
    scrub_clean(&w, "hot");
    let ev = w.ok(&["events", "hot"]);
    assert!(ev.contains("hot_replace_finished"), "{ev}");
    // The record names the new device: a restart needs nothing of the old.
    w.ok(&["stop", "hot"]);
    std::fs::remove_file(&m[1]).unwrap();
    w.ok(&["start", "hot", "--nbd", &format!("unix:{}", sock.display())]);
    assert_eq!(w.status_json("hot")["state"], "optimal");
    raid_e2e::pattern_reads_back(&sock, "hot");
}

/// The `next` of member_missing and of a scrub that left mismatches, run as
/// printed.
#[test]
fn the_next_of_a_missing_member_and_of_a_scrub_work_as_printed() {
    let w = World::new("next2");
    let (m, sock) = w.running_with_pattern("nm", "5", 4);
    w.ok(&["stop", "nm"]);
    std::fs::remove_file(&m[3]).unwrap();
    w.ok(&["start", "nm", "--nbd", &format!("unix:{}", sock.display())]);
    let next = next_of(&w, "nm", "member_missing").expect("member_missing says what to do next");
    // "reconnect M, or raidctl replace nm M NEW_DEVICE": the member is gone
    // for good, so the second half.
    let cmd = next
        .split(", or ")
        .nth(1)
        .unwrap_or_else(|| panic!("{next}"));
    let new = w.sparse("nm-new.img", 16 * MIB);
    let cmd = cmd.replace("NEW_DEVICE", s(&new));
    let args: Vec<&str> = cmd.split_whitespace().collect();
    assert_eq!(args[0], "raidctl", "{next}");
    w.ok(&args[1..]);
    w.ok(&["wait", "nm"]);
    raid_e2e::pattern_reads_back(&sock, "nm");
    // Rot in a parity chunk (stripe 0's P is on slot 3, now the new
    // member; RAID5 cannot tell rotten data from rotten parity, so only rot
    // in P is repaired to the original data): the check-only scrub's next
    // repairs it.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&new)
        .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, b"rot", MIB + 4096))
        .unwrap();
    let (code, out, _) = w.code(&["scrub", "nm"]);
    assert_eq!(code, 1);
    // RAID5 cannot tell which chunk is wrong: the report says what a
    // repair does then, and the other way out.
    assert!(
        out.contains("cannot be located") && out.contains("fail and replace it"),
        "{out}"
    );
    let next = next_of(&w, "nm", "scrub_finished")
        .expect("a scrub that left mismatches says what to do next");
    let args: Vec<&str> = next.split_whitespace().collect();
    w.ok(&args[1..]);
    scrub_clean(&w, "nm");
    raid_e2e::pattern_reads_back(&sock, "nm");
}

/// A member whose metadata no longer reads (both copies overwritten) is
/// left out at start; its device is there, so the event's next step is not
/// "reconnect" it (which it said) but to look at it and replace it, and
/// the printed command works.
#[test]
fn the_next_of_a_member_whose_metadata_does_not_read_is_not_reconnect() {
    let w = World::new("next3");
    let (m, sock) = w.running_with_pattern("nz", "5", 4);
    w.ok(&["stop", "nz"]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m[2])
        .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 8192], 0))
        .unwrap();
    w.ok(&["start", "nz", "--nbd", &format!("unix:{}", sock.display())]);
    let next = next_of(&w, "nz", "member_missing").expect("member_missing says what to do next");
    assert!(
        !next.starts_with("reconnect") && next.contains("is there but was not taken"),
        "{next}"
    );
    let cmd = &next[next
        .find("raidctl replace")
        .unwrap_or_else(|| panic!("{next}"))..];
    let new = w.sparse("nz-new.img", 16 * MIB);
    let cmd = cmd.replace("NEW_DEVICE", s(&new));
    let args: Vec<&str> = cmd.split_whitespace().collect();
    w.ok(&args[1..]);
    w.ok(&["wait", "nz"]);
    raid_e2e::pattern_reads_back(&sock, "nz");
    scrub_clean(&w, "nz");
    w.ok(&["stop", "nz"]);
}

/// A start that names its members must name all of them: one left out by
/// mistake would run an optimal array degraded, and that member would
/// need a resync when it came back. Refused (exit 4, metadata untouched)
/// unless forced; recorded members that cannot be opened still let a
/// plain `start` run degraded.
#[test]
fn a_start_naming_too_few_members_is_refused_unless_forced() {
    let w = World::new("too-few");
    let m = w.sparse_members("m", 3, 64 << 20);
    let sp = w.sparse("sp.img", 64 << 20);
    w.ok(&[
        "create",
        "tf",
        "--level",
        "5",
        s(&m[0]),
        s(&m[1]),
        s(&m[2]),
        "--spare",
        s(&sp),
    ]);
    w.ok(&["start", "tf"]);
    w.ok(&["stop", "tf"]);
    let events = |p: &Path| -> u64 {
        let v: serde_json::Value =
            serde_json::from_str(&w.ok(&["examine", s(p), "--format", "json"])).unwrap();
        v[0]["events"].as_u64().unwrap()
    };
    let before: Vec<u64> = m.iter().map(|p| events(p)).collect();
    let (code, out, err) = w.code(&["start", "tf", "--members", s(&m[0]), s(&m[1])]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(err.contains("slot 2") && err.contains("--force"), "{err}");
    let after: Vec<u64> = m.iter().map(|p| events(p)).collect();
    assert_eq!(before, after, "a refused start wrote metadata");
    // Every member given: optimal, nothing to resync; the spare left out
    // is said to be no longer recorded.
    let out = w.ok(&["start", "tf", "--members", s(&m[2]), s(&m[0]), s(&m[1])]);
    assert_eq!(w.status_json("tf")["state"], "optimal");
    assert!(
        out.contains("spare") && out.contains("not among the devices given"),
        "{out}"
    );
    w.ok(&["stop", "tf"]);
    // Forced: it runs without the one left out, and says so.
    w.ok(&["start", "tf", "--force", "--members", s(&m[0]), s(&m[1])]);
    assert_eq!(w.status_json("tf")["state"], "degraded");
    w.ok(&["stop", "tf"]);
}

/// While a hot replace copies, its target is named as such to a command
/// that would take it (not as a spare to remove); when the source fails,
/// `fail` says the copy becomes a rebuild, and the new device takes the
/// slot and is rebuilt without another command: the spare at hand is not
/// used, and the record names the new device at the next start.
#[test]
fn a_hot_replace_whose_source_fails_becomes_a_rebuild() {
    let w = World::new("hot-src");
    let (m, sock) = w.running_with_pattern("hs", "5", 4);
    let new = w.sparse("hs-new.img", 16 * MIB);
    let spare = w.sparse("hs-spare.img", 16 * MIB);
    w.ok(&["add", "hs", s(&spare)]);
    w.ok(&["rate", "hs", "--rebuild", "4M"]);
    w.ok(&["replace", "hs", s(&m[1]), s(&new)]);
    let (code, _, err) = w.code(&["add", "hs", s(&new)]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("copying a member onto"), "{err}");
    let out = w.ok(&["fail", "hs", s(&m[1])]);
    assert!(
        out.contains("hot replace of slot 1") && out.contains("becomes a rebuild"),
        "{out}"
    );
    w.ok(&["rate", "hs", "--rebuild", "0"]);
    w.ok(&["wait", "hs"]);
    let st = w.status_json("hs");
    assert_eq!(st["state"], "optimal", "{st}");
    let members = st["members"].as_array().unwrap();
    assert_eq!(members[1]["path"], s(&new), "{st}");
    assert!(
        st["spares"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == s(&spare)),
        "the spare was used: {st}"
    );
    let events = w.ok(&["events", "hs"]);
    assert!(events.contains("hot_replace_rebuilding"), "{events}");
    // The old member's failure does not ask for a replace (which would
    // drop the device its slot now has).
    let next = next_of(&w, "hs", "member_failed").unwrap_or_default();
    assert!(next.starts_with("raidctl wait hs"), "{next}");
    raid_e2e::pattern_reads_back(&sock, "hs");
    // Started again from the record: the new device is slot 1's member.
    w.ok(&["stop", "hs"]);
    w.ok(&["start", "hs", "--nbd", &format!("unix:{}", sock.display())]);
    let st = w.status_json("hs");
    assert_eq!(st["state"], "optimal", "{st}");
    assert_eq!(st["members"][1]["path"], s(&new), "{st}");
    raid_e2e::pattern_reads_back(&sock, "hs");
}

/// A scan (or the daemon's config) that does not find a member is a drive
/// gone, not a typing slip: the array starts degraded, as before, and
/// says which member is missing.
#[test]
fn a_scan_that_misses_a_member_starts_degraded() {
    let w = World::new("scan-miss");
    let m = w.sparse_members("m", 3, 64 << 20);
    w.ok(&["create", "sm", "--level", "5", s(&m[0]), s(&m[1]), s(&m[2])]);
    w.ok(&["start", "sm"]);
    w.ok(&["stop", "sm"]);
    let only = w.dir.join("found");
    std::fs::create_dir_all(&only).unwrap();
    for p in &m[..2] {
        std::os::unix::fs::symlink(p, only.join(p.file_name().unwrap())).unwrap();
    }
    w.ok(&["start", "sm", "--scan", s(&only)]);
    assert_eq!(w.status_json("sm")["state"], "degraded");
    w.ok(&["stop", "sm"]);
}

/// A hot replace is called off by failing its new device (as with mdadm):
/// the copy ends, the old device stays the member with the data, and the
/// new one is free again. `remove` of the new device points there, and
/// `remove` of a device the array does not hold names it by its path.
#[test]
fn failing_the_new_device_calls_a_hot_replace_off() {
    let w = World::new("hot-off");
    let (m, sock) = w.running_with_pattern("ho", "5", 4);
    let new = w.sparse("ho-new.img", 16 * MIB);
    let stranger = w.sparse("ho-stranger.img", 16 * MIB);
    w.ok(&["rate", "ho", "--rebuild", "1M"]);
    w.ok(&["replace", "ho", s(&m[1]), s(&new)]);
    let (code, _, err) = w.code(&["remove", "ho", s(&new)]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("raidctl fail ho"), "{err}");
    let (code, _, err) = w.code(&["remove", "ho", s(&stranger)]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains(s(&stranger)), "{err}");
    let out = w.ok(&["fail", "ho", s(&new)]);
    assert!(out.contains("dropped"), "{out}");
    raid_e2e::eventually("the copy ends", || {
        w.status_json("ho")["hot_replace"].is_null()
    });
    let st = w.status_json("ho");
    assert_eq!(st["state"], "optimal", "{st}");
    assert_eq!(st["members"][1]["path"], s(&m[1]), "{st}");
    let events = w.ok(&["events", "ho"]);
    // The event says why, as a member's failure does.
    assert!(
        events.contains("hot_replace_failed") && events.contains("failed by the operator"),
        "{events}"
    );
    let (ok, text) = qemu_io(&sock, "ho", &["read -P 0x5a 0 8M"]);
    assert!(ok, "{text}");
    // The new device is free again: another hot replace may take it.
    w.ok(&["rate", "ho", "--rebuild", "0"]);
    w.ok(&["replace", "ho", s(&m[1]), s(&new)]);
    w.ok(&["wait", "ho"]);
    assert_eq!(w.status_json("ho")["members"][1]["path"], s(&new));
    w.ok(&["stop", "ho"]);
}

/// A failed member named as its own slot's new device: `replace` points to
/// `re-add` (it said the device was in another place), and after `remove`
/// the same replace rebuilds it whole.
#[test]
fn replacing_a_failed_member_by_itself_points_to_re_add() {
    let w = World::new("self-replace");
    let (m, sock) = w.running_with_pattern("sr", "5", 3);
    w.ok(&["fail", "sr", s(&m[1])]);
    w.refused(
        &["replace", "sr", s(&m[1]), s(&m[1])],
        &format!("raidctl re-add sr {}", s(&m[1])),
    );
    w.ok(&["remove", "sr", s(&m[1])]);
    w.ok(&["replace", "sr", s(&m[1]), s(&m[1])]);
    w.ok(&["wait", "sr"]);
    assert_eq!(w.status_json("sr")["state"], "optimal");
    raid_e2e::pattern_reads_back(&sock, "sr");
    scrub_clean(&w, "sr");
}

/// A member removed from one array and put in another (as `remove` says it
/// may be, once erased): `add` takes it though the first array's record
/// still names it for the slot (it was refused as "recorded as a member of
/// array ..."), and the first array's next start leaves that slot empty and
/// says why (it refused to start at all, the device being "in use").
#[test]
fn a_removed_member_can_join_another_array() {
    let w = World::new("moved");
    let (m, _sock) = w.running_with_pattern("mv1", "5", 3);
    let (_o, _osock) = w.running_with_pattern("mv2", "5", 3);
    w.ok(&["fail", "mv1", s(&m[2])]);
    w.ok(&["remove", "mv1", s(&m[2])]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&m[2])
        .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, &vec![0u8; MIB as usize], 0))
        .unwrap();
    w.ok(&["add", "mv2", s(&m[2])]);
    w.ok(&["stop", "mv1"]);
    let out = w.ok(&["start", "mv1"]);
    assert!(
        out.contains("is recorded for 'mv1' but is not used"),
        "{out}"
    );
    assert_eq!(w.status_json("mv1")["state"], "degraded");
    assert_eq!(w.status_json("mv2")["spares"][0], s(&m[2]));
    w.ok(&["stop", "mv1"]);
    w.ok(&["stop", "mv2"]);
}

/// An older copy of a member put back while the array was stopped (an
/// image restored): `status` of the stopped array says so, the next start
/// leaves it out (it was taken as in sync, and the array served its stale
/// rows), and a re-add copies it whole; the data read is the newest.
#[test]
fn an_older_copy_of_a_member_is_left_out_at_start() {
    let w = World::new("older-copy");
    let (m, sock) = w.running_with_pattern("oc", "5", 4);
    w.ok(&["stop", "oc"]);
    let image = std::fs::read(&m[2]).unwrap();
    w.ok(&["start", "oc", "--nbd", &format!("unix:{}", sock.display())]);
    let (ok, text) = qemu_io(&sock, "oc", &["write -P 0x77 0 8M"]);
    assert!(ok, "{text}");
    w.ok(&["stop", "oc"]);
    std::fs::write(&m[2], &image).unwrap();
    let st = w.status_json("oc");
    assert_eq!(st["members"][2]["state"], "missing", "{st}");
    let warning = st["members"][2]["warning"].as_str().unwrap_or_default();
    assert!(warning.contains("older copy"), "{st}");
    let out = w.ok(&["start", "oc", "--nbd", &format!("unix:{}", sock.display())]);
    assert!(
        out.contains("degraded") && out.contains("older copy"),
        "{out}"
    );
    // Running, status says the same: an older copy, not a failure to
    // take back "if it failed by mistake".
    let st = w.status_json("oc");
    let warning = st["members"][2]["warning"].as_str().unwrap_or_default();
    assert!(
        warning.contains("older copy") && !warning.contains("failed before"),
        "{st}"
    );
    let (ok, text) = qemu_io(&sock, "oc", &["read -P 0x77 0 8M"]);
    assert!(ok, "stale rows served: {text}");
    let out = w.ok(&["re-add", "oc", s(&m[2])]);
    assert!(out.contains("whole"), "{out}");
    w.ok(&["wait", "oc"]);
    let (ok, text) = qemu_io(&sock, "oc", &["read -P 0x77 0 8M"]);
    assert!(ok, "{text}");
    w.ok(&["stop", "oc"]);
}
