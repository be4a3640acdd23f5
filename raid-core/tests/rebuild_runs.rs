//! A rebuild's batch cut into runs rebuilt side by side
//! (`RebuildOptions::parallel`), while writers write, for each redundant
//! level: from a plain thread (runs on threads of their own), and from a
//! rayon thread (where such runs once hung for ever, the parity engine's
//! parallel work inside them left to a pool whose one thread waited for
//! them; there they run one after another). The member comes out in
//! sync: the data reads back as written, from the new member too, and
//! parity and copies agree.

use raid_core::array::{RebuildEnd, RebuildOptions};
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{MemberRef, RamMember};
use raid_core::metadata::{SlotState, DATA_OFFSET};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

mod support;

const CHUNK: u64 = 16 << 10;
const DATA: u64 = 8 << 20;

#[test]
fn runs_under_writes_from_a_plain_and_a_rayon_thread() {
    one_rayon_thread();
    for (level, n) in [
        (Level::Raid1, 2),
        (Level::Raid5, 5),
        (Level::Raid6, 6),
        (Level::Raid10, 4),
    ] {
        rebuild_under_writes(level, n, false, None);
        rebuild_under_writes(level, n, true, None);
    }
}

/// A source member of a RAID6 vanishes while runs side by side read it:
/// runs meet its errors together, it is failed once, the rebuild goes on
/// from the others and ends with the data whole.
#[test]
fn a_source_member_lost_under_runs_side_by_side() {
    one_rayon_thread();
    rebuild_under_writes(Level::Raid6, 6, false, Some(3));
}

/// Rayon's pool with one thread, before any test of this binary uses it.
/// A rebuild on that thread, blocked joining runs on threads of their own,
/// would hold the one thread their parallel parity work waits for.
fn one_rayon_thread() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build_global()
            .expect("the first use of rayon in this test binary")
    });
}

/// Fails and replaces a member of a new array of `level`, rebuilds it in
/// runs side by side (from a rayon thread where `on_rayon`) while a writer
/// writes, member `vanishes` (if any) going as it starts, and checks the
/// outcome.
fn rebuild_under_writes(level: Level, n: usize, on_rayon: bool, vanishes: Option<usize>) {
    {
        let tag = format!("runs{level:?}{on_rayon}");
        let members = support::array::Members::ram(n, DATA, &tag);
        let a = support::array::create_shared(level, members.refs(), "runs", CHUNK);
        let size = a.capacity() as usize;
        let model = Arc::new(Mutex::new(vec![0u8; size]));
        a.write(0, &AlignedBuf::new(size)).unwrap();
        let lost = 1;
        a.fail_member(lost, false).unwrap();
        let new: MemberRef = Arc::new(RamMember::new(format!("ram:{tag}-new"), DATA_OFFSET + DATA));
        a.replace(lost, new.clone()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (a, model, stop) = (a.clone(), model.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(7);
                let mut b = AlignedBuf::new(4096);
                while !stop.load(Ordering::Relaxed) {
                    let off = rng.gen_range(0..size / 4096) * 4096;
                    rng.fill(&mut b[..]);
                    // The model under its lock with the write: writes of
                    // one block land in the model's order.
                    let mut m = model.lock().unwrap();
                    a.write(off as u64, &b).unwrap();
                    m[off..off + 4096].copy_from_slice(&b);
                }
            })
        };
        let opts = RebuildOptions {
            batch_rows: 2,
            parallel: 4,
            ..Default::default()
        };
        let a2 = a.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let rebuild = move || {
            tx.send(a2.rebuild(lost, &opts, &AtomicBool::new(false)))
                .unwrap();
        };
        if on_rayon {
            rayon::spawn(rebuild);
        } else {
            std::thread::spawn(rebuild);
        }
        if let Some(v) = vanishes {
            members.faulty[v].fail_all();
        }
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{level:?}, on rayon {on_rayon}: the rebuild hung"));
        assert_eq!(r.unwrap(), RebuildEnd::Finished, "{level:?}");
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        let failed = |s: usize| a.slots()[s].state == SlotState::Failed;
        assert!((0..n).all(|s| failed(s) == (Some(s) == vanishes)));
        let model = model.lock().unwrap();
        support::array::assert_matches(&a, &model);
        support::array::assert_consistent(&a, &members_now(&members.refs(), lost, &new));
    }
}

/// The array's members after `lost` was replaced by `new`.
fn members_now(old: &[MemberRef], lost: usize, new: &MemberRef) -> Vec<MemberRef> {
    let mut m = old.to_vec();
    m[lost] = new.clone();
    m
}
