//! The array hands the parity engine batches where it has many stripes at
//! once (full-stripe writes, scrub, rebuild, large degraded reads): that is
//! where a GPU engine pays. An engine that counts what it is given proves the batches arrive,
//! and the members prove the parity written from them is right.

mod support;

use raid_core::array::{RebuildEnd, RebuildOptions, ScrubOptions};
use raid_core::layout::Level;
use raid_core::member::{MemberRef, RamMember};
use raid_core::metadata::MIN_DATA_OFFSET;
use raid_core::parity::{CpuEngine, GenJob, ParityEngine, ParityError, ParityKind, RecoverJob};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use support::array::{assert_consistent, assert_matches, create, Members};

/// The CPU engine, recording the size of every batch call, and asking for
/// batches of `batch` stripes as a GPU engine does (or not, as the CPU's).
#[derive(Default)]
struct Counting {
    cpu: CpuEngine,
    batch: usize,
    gen_batches: Mutex<Vec<usize>>,
    recover_batches: Mutex<Vec<usize>>,
    single: AtomicUsize,
}

impl ParityEngine for Counting {
    fn name(&self) -> String {
        "counting".into()
    }
    fn preferred_batch(&self, _stripe_data_bytes: u64) -> usize {
        self.batch
    }
    fn gen_p(&self, d: &[&[u8]], p: &mut [u8]) -> Result<(), ParityError> {
        self.single.fetch_add(1, Ordering::Relaxed);
        self.cpu.gen_p(d, p)
    }
    fn gen_pq(&self, d: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> Result<(), ParityError> {
        self.single.fetch_add(1, Ordering::Relaxed);
        self.cpu.gen_pq(d, p, q)
    }
    fn recover(&self, k: ParityKind, c: &mut [&mut [u8]], m: &[usize]) -> Result<(), ParityError> {
        self.single.fetch_add(1, Ordering::Relaxed);
        self.cpu.recover(k, c, m)
    }
    fn gen_batch(&self, k: ParityKind, jobs: &mut [GenJob<'_>]) -> Result<(), ParityError> {
        self.gen_batches.lock().unwrap().push(jobs.len());
        self.cpu.gen_batch(k, jobs)
    }
    fn recover_batch(&self, k: ParityKind, jobs: &mut [RecoverJob<'_>]) -> Result<(), ParityError> {
        self.recover_batches.lock().unwrap().push(jobs.len());
        self.cpu.recover_batch(k, jobs)
    }
}

#[test]
fn full_stripe_writes_scrub_degraded_reads_and_rebuild_reach_the_engine_as_batches() {
    for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let chunk = 16384u64;
        let m = Members::ram(n, 64 * 1024 * 1024 / 16, &format!("batch-{level}"));
        let mut a = create(level, &m, chunk);
        let e = Arc::new(Counting {
            batch: 64,
            ..Counting::default()
        });
        a.set_engine(e.clone());
        let stripe = a.geometry().stripe_data_bytes() as usize;
        // 40 whole stripes plus a ragged head and tail.
        let img: Vec<u8> = (0..a.capacity() as usize)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        let (off, len) = (stripe / 2, 40 * stripe + 4096 * 3);
        a.write(0, &img[..off]).unwrap();
        a.write(off as u64, &img[off..off + len]).unwrap();
        let rest = off + len;
        a.write(rest as u64, &img[rest..]).unwrap();
        let gens = e.gen_batches.lock().unwrap().clone();
        assert!(
            gens.iter().any(|&b| b >= 2),
            "{level}: no full-stripe batch: {gens:?}"
        );
        assert_matches(&a, &img);
        assert_consistent(&a, &m.refs());

        e.gen_batches.lock().unwrap().clear();
        let r = a
            .scrub(
                &ScrubOptions {
                    batch_rows: 16,
                    ..ScrubOptions::default()
                },
                &AtomicBool::new(false),
            )
            .unwrap();
        assert!(r.mismatches.is_empty());
        let gens = e.gen_batches.lock().unwrap().clone();
        assert!(gens.contains(&16), "{level}: scrub did not batch: {gens:?}");

        a.fail_slot(1, "test");
        // Degraded: a large read recovers its stripes in batches.
        assert_matches(&a, &img);
        let recs = e.recover_batches.lock().unwrap().clone();
        assert!(
            recs.iter().any(|&b| b >= 2),
            "{level}: degraded read did not batch: {recs:?}"
        );
        e.recover_batches.lock().unwrap().clear();
        let data = 64 * 1024 * 1024 / 16;
        let new: MemberRef = Arc::new(RamMember::new(
            format!("ram:batch-new-{level}"),
            MIN_DATA_OFFSET + data,
        ));
        a.replace(1, new.clone()).unwrap();
        let end = a
            .rebuild(1, &RebuildOptions::default(), &AtomicBool::new(false))
            .unwrap();
        assert_eq!(end, RebuildEnd::Finished);
        let recs = e.recover_batches.lock().unwrap().clone();
        assert!(
            recs.iter().any(|&b| b >= 2),
            "{level}: rebuild did not batch: {recs:?}"
        );
        assert_matches(&a, &img);
        let mut refs = m.refs();
        refs[1] = new;
        assert_consistent(&a, &refs);
    }
}

/// The CPU engine asks for no batches (one stripe at a time keeps the
/// stripe in cache): full-stripe writes and degraded reads then go stripe
/// by stripe; scrub still reads and checks its rows together.
#[test]
fn an_engine_that_wants_no_batches_gets_single_stripes() {
    let m = Members::ram(6, 64 * 1024 * 1024 / 16, "batch-cpu");
    let mut a = create(Level::Raid6, &m, 16384);
    let e = Arc::new(Counting {
        batch: 1,
        ..Counting::default()
    });
    a.set_engine(e.clone());
    let stripe = a.geometry().stripe_data_bytes() as usize;
    let img: Vec<u8> = (0..8 * stripe).map(|i| (i * 13) as u8).collect();
    a.write(0, &img).unwrap();
    assert!(e.gen_batches.lock().unwrap().is_empty());
    assert_eq!(e.single.load(Ordering::Relaxed), 8, "one call per stripe");
    a.fail_slot(0, "test");
    let mut got = vec![0u8; img.len()];
    a.read(0, &mut got).unwrap();
    assert!(got == img);
    assert!(e.recover_batches.lock().unwrap().is_empty());
    let g = a.geometry();
    let degraded = (0..8u64)
        .filter(|&s| g.stripe_map(s).members[..g.data_chunks()].contains(&0))
        .count();
    assert!(degraded > 1);
    assert_eq!(
        e.single.load(Ordering::Relaxed),
        8 + degraded,
        "one recovery per degraded stripe"
    );
}
