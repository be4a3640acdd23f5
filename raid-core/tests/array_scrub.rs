//! Scrub: silent corruption written straight onto a member is found, put on
//! the right member, and repaired; a clean array reports nothing.

mod support;

use raid_core::array::{Array, ArrayEvent, ScrubOptions};
use raid_core::layout::{ChunkRole, Level};
use raid_core::metadata::MIN_DATA_OFFSET;
use std::sync::atomic::AtomicBool;
use support::array::{assert_consistent, assert_matches, create, Members};

const CHUNK: u64 = 16384;

fn filled(level: Level, n: usize, tag: &str) -> (Members, Array, Vec<u8>) {
    let m = Members::ram(n, 32 * CHUNK, tag);
    let a = create(level, &m, CHUNK);
    let img: Vec<u8> = (0..a.capacity() as usize)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    a.write(0, &img).unwrap();
    (m, a, img)
}

/// Flips bytes of the chunk at `row` on `member`, behind the array's back.
fn corrupt(m: &Members, member: usize, row: u64, at: u64) {
    m.corrupt(member, MIN_DATA_OFFSET + row * CHUNK + at);
}

fn scrub(a: &Array, repair: bool) -> raid_core::array::ScrubReport {
    a.scrub(
        &ScrubOptions {
            repair,
            ..Default::default()
        },
        &AtomicBool::new(false),
    )
    .unwrap()
}

#[test]
fn clean_arrays_scrub_clean() {
    for (level, n) in [
        (Level::Raid1, 2),
        (Level::Raid5, 4),
        (Level::Raid6, 5),
        (Level::Raid10, 4),
    ] {
        let (_m, a, _) = filled(level, n, &format!("clean-{level}"));
        let r = scrub(&a, false);
        assert!(r.mismatches.is_empty(), "{level}: {:?}", r.mismatches);
        assert!(r.rows > 0 && r.bytes_read > 0);
    }
}

#[test]
fn raid6_locates_the_corrupt_member_by_syndrome_and_repairs_it() {
    let (m, a, img) = filled(Level::Raid6, 6, "r6");
    let g = a.geometry();
    // One bad chunk in each of several stripes: data, P and Q.
    let mut planted = Vec::new();
    for (s, kind) in [(1u64, "data"), (4, "p"), (7, "q"), (9, "data")] {
        let map = g.stripe_map(s);
        let idx = match kind {
            "p" => g.data_chunks(),
            "q" => g.data_chunks() + 1,
            _ => (s as usize) % g.data_chunks(),
        };
        let member = map.members[idx];
        corrupt(&m, member, s, 100 + s * 10);
        planted.push((s, Some(member)));
    }
    let r = scrub(&a, false);
    let found: Vec<(u64, Option<usize>)> =
        r.mismatches.iter().map(|x| (x.stripe, x.slot)).collect();
    assert_eq!(found, planted, "{:#?}", r.mismatches);
    // Check-only changed nothing; repair fixes every one.
    assert_eq!(scrub(&a, false).mismatches.len(), planted.len());
    let r = scrub(&a, true);
    assert!(r.mismatches.iter().all(|x| x.repaired));
    assert!(scrub(&a, false).mismatches.is_empty());
    assert_matches(&a, &img);
    assert_consistent(&a, &m.refs());
    // Each run is one event, with what it found and repaired.
    let runs: Vec<ArrayEvent> = a
        .event_log()
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| e.kind() == "scrub_finished")
        .collect();
    let n = planted.len() as u64;
    assert_eq!(runs.len(), 4, "{runs:?}");
    assert!(
        matches!(runs[1], ArrayEvent::ScrubFinished { mismatches, repaired: 0, .. } if mismatches == n),
        "{runs:?}"
    );
    assert!(
        matches!(runs[2], ArrayEvent::ScrubFinished { mismatches, repaired, .. } if mismatches == n && repaired == n),
        "{runs:?}"
    );
    assert!(
        matches!(runs[3], ArrayEvent::ScrubFinished { mismatches: 0, .. }),
        "{runs:?}"
    );
}

/// The last scrub's count of mirror chunks whose copies differ with no
/// majority.
fn undecided(a: &Array) -> u64 {
    a.event_log()
        .into_iter()
        .rev()
        .find_map(|(_, e)| match e {
            ArrayEvent::ScrubFinished { undecided, .. } => Some(undecided),
            _ => None,
        })
        .expect("a scrub_finished event")
}

#[test]
fn raid5_rewrites_parity_and_mirrors_take_the_first_copy() {
    let (m, a, _) = filled(Level::Raid5, 4, "r5");
    let g = a.geometry();
    let pm = g.stripe_map(3).members[g.data_chunks()];
    corrupt(&m, pm, 3, 0);
    let r = scrub(&a, true);
    assert_eq!(r.mismatches.len(), 1);
    // Nothing says which chunk is wrong: no member is named (P's own is
    // no likelier the bad one than any other).
    let _ = pm;
    assert_eq!((r.mismatches[0].stripe, r.mismatches[0].slot), (3, None));
    assert!(!r.mismatches[0].located && !r.mismatches[0].unresolved);
    assert_eq!(undecided(&a), 0, "parity is rewritten from the data");
    assert!(scrub(&a, false).mismatches.is_empty());
    assert_consistent(&a, &m.refs());

    let (m, a, img) = filled(Level::Raid10, 4, "r10");
    let g = a.geometry();
    let c = 5;
    let second = g.chunk_copies(c)[1];
    assert_eq!(
        g.chunk_at(second.member, second.offset / CHUNK),
        ChunkRole::Data(c)
    );
    corrupt(&m, second.member, second.offset / CHUNK, 4000);
    // Said undecided, so that the alert does not offer the repair as the
    // fix (it keeps the first copy, which may be the bad one).
    assert_eq!(scrub(&a, false).mismatches.len(), 1);
    assert_eq!(undecided(&a), 1);
    let r = scrub(&a, true);
    assert_eq!(r.mismatches.len(), 1);
    // Two copies: nothing says which is wrong, so no member is named.
    assert_eq!(r.mismatches[0].slot, None);
    assert!(!r.mismatches[0].located);
    assert!(scrub(&a, false).mismatches.is_empty());
    assert_matches(&a, &img);
}

/// A mirror of three copies whose first copy went bad: the two that agree
/// are the truth, the bad one is named, and a repair writes theirs over it
/// (the first copy used to be written over both good ones).
#[test]
fn a_three_way_mirror_repairs_the_copy_the_others_outvote() {
    let (m, a, img) = filled(Level::Raid1, 3, "r1three");
    let first = a.geometry().chunk_copies(2)[0];
    corrupt(&m, first.member, first.offset / CHUNK, 100);
    let r = scrub(&a, true);
    assert_eq!(r.mismatches.len(), 1, "{:?}", r.mismatches);
    assert_eq!(r.mismatches[0].slot, Some(first.member));
    assert!(r.mismatches[0].located);
    assert_eq!(undecided(&a), 0);
    assert!(scrub(&a, false).mismatches.is_empty());
    assert_matches(&a, &img);
}

#[test]
fn scrub_refuses_a_degraded_array() {
    let (_m, a, _) = filled(Level::Raid5, 3, "deg");
    a.fail_slot(1, "test");
    let e = a
        .scrub(&ScrubOptions::default(), &AtomicBool::new(false))
        .unwrap_err()
        .to_string();
    assert!(e.contains("scrub needs every member in sync"), "{e}");
}

/// Faults in two chunks of one stripe, at different places in their
/// columns, are each located and repaired: the syndromes are judged a
/// sector at a time. Judged over the whole chunk they pointed at no one
/// chunk, and a repair rewrote P and Q over the two bad chunks, making
/// them permanent (and the next scrub clean).
#[test]
fn raid6_faults_in_two_chunks_at_different_places_are_each_repaired() {
    let (m, a, img) = filled(Level::Raid6, 6, "r6two");
    let g = a.geometry();
    let s = 2u64;
    let map = g.stripe_map(s);
    let (d0, d1, q) = (
        map.members[0],
        map.members[2],
        map.members[g.data_chunks() + 1],
    );
    corrupt(&m, d0, s, 10);
    corrupt(&m, d1, s, 4096 + 20);
    corrupt(&m, q, s, 9000);
    let r = scrub(&a, false);
    let found: Vec<(Option<usize>, bool)> =
        r.mismatches.iter().map(|x| (x.slot, x.located)).collect();
    assert_eq!(
        found,
        vec![(Some(d0), true), (Some(d1), true), (Some(q), true)],
        "{:#?}",
        r.mismatches
    );
    assert!(
        r.mismatches[0].what.contains("bytes 0-511 of the chunk"),
        "{:?}",
        r.mismatches[0]
    );
    let r = scrub(&a, true);
    assert!(r.mismatches.iter().all(|x| x.repaired && !x.unresolved));
    assert!(scrub(&a, false).mismatches.is_empty());
    assert_matches(&a, &img);
    assert_consistent(&a, &m.refs());
    let said = a
        .event_log()
        .into_iter()
        .map(|(_, e)| e.describe())
        .find(|d| d.starts_with("scrub finished") && d.contains("3 repaired"))
        .expect("the repair's event");
    assert!(
        said.contains(&format!("stripe {s} slot {d0}")) && said.contains("data chunk 0 is corrupt"),
        "{said}"
    );
}

/// Two chunks wrong in one sector cannot be located: nothing is named,
/// the finding says so, and a repair only makes the parity agree.
#[test]
fn raid6_two_chunks_wrong_in_one_sector_are_unresolved() {
    let (m, a, _) = filled(Level::Raid6, 6, "r6same");
    let g = a.geometry();
    let map = g.stripe_map(3);
    corrupt(&m, map.members[0], 3, 700);
    corrupt(&m, map.members[1], 3, 701);
    let r = scrub(&a, true);
    assert_eq!(r.mismatches.len(), 1, "{:#?}", r.mismatches);
    let x = &r.mismatches[0];
    assert_eq!(
        (x.slot, x.located, x.unresolved),
        (None, false, true),
        "{x:?}"
    );
    assert!(
        x.what.contains("bytes 512-1023") && x.what.contains("may itself be wrong"),
        "{x:?}"
    );
    assert!(scrub(&a, false).mismatches.is_empty());
    assert_consistent(&a, &m.refs());
}

/// A repair whose write fails ends the scrub with that error, and its
/// finding stays in the run's event, marked not repaired (it was dropped:
/// the event counted nothing for the stripe it was repairing).
#[test]
fn a_repair_whose_write_fails_keeps_its_finding() {
    let (m, a, _) = filled(Level::Raid6, 5, "r6wfail");
    let g = a.geometry();
    let member = g.stripe_map(0).members[0];
    corrupt(&m, member, 0, 100);
    // Its read in, then every I/O fails: the repair's write.
    m.faulty[member].set_faults(raid_core::member::Faults {
        fail_after: Some(1),
        ..Default::default()
    });
    let r = a.scrub(
        &ScrubOptions {
            repair: true,
            batch_rows: 1,
            parallel: 1,
            ..Default::default()
        },
        &AtomicBool::new(false),
    );
    assert!(r.is_err(), "{r:?}");
    let ev = a
        .event_log()
        .into_iter()
        .map(|(_, e)| e)
        .rfind(|e| e.kind() == "scrub_finished")
        .unwrap();
    assert!(
        matches!(
            &ev,
            ArrayEvent::ScrubFinished { mismatches: 1, repaired: 0, findings, .. }
                if findings[0].contains("data chunk 0 is corrupt")
        ),
        "{ev:?}"
    );
}
