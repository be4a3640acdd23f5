//! The engine where io_uring is not to be had (RAID_NO_URING=1 here; a
//! kernel or seccomp policy that refuses it takes the same way): no shard
//! starts, and every request (read, write, flush, zeroing) is answered
//! through its completion by the blocking threads. Its own test binary:
//! the choice of I/O path is made once per process.

mod support;

use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::Member;
use raid_core::shard::Engine;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

#[test]
fn every_request_is_answered_by_the_blocking_threads() {
    std::env::set_var("RAID_NO_URING", "1");
    assert_eq!(
        raid_core::member::io_path(),
        raid_core::member::IoPath::PreadPwrite
    );
    let dir = std::env::temp_dir().join(format!("raid-engine-nouring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let members = support::array::files(&dir, 5, 8 << 20);
    let a = support::array::create_shared(Level::Raid5, members, "nouring", 64 * 1024);
    let e = Engine::start(a.clone(), 2).unwrap();
    let blocks = 256u64;
    let block = |i: u64| -> AlignedBuf {
        let mut b = AlignedBuf::new(4096);
        b.iter_mut()
            .enumerate()
            .for_each(|(k, x)| *x = (i as usize * 7 + k) as u8);
        b
    };
    let (tx, rx) = mpsc::channel();
    for i in 0..blocks {
        let tx = tx.clone();
        e.write(
            i * 4096,
            block(i),
            Box::new(move |r| tx.send(r.map(|_| ())).unwrap()),
        );
    }
    for _ in 0..blocks {
        rx.recv().unwrap().unwrap();
    }
    // Zero the first 16 blocks, then flush: both answered.
    let (dtx, drx) = mpsc::channel();
    let t = dtx.clone();
    e.write_zeroes(0, 16 * 4096, Box::new(move |r| t.send(r).unwrap()));
    drx.recv().unwrap().unwrap();
    e.flush(Box::new(move |r| dtx.send(r).unwrap()));
    drx.recv().unwrap().unwrap();
    let (rtx, rrx) = mpsc::channel();
    for i in 0..blocks {
        let tx = rtx.clone();
        e.read(
            i * 4096,
            AlignedBuf::new(4096),
            Box::new(move |r| tx.send((i, r)).unwrap()),
        );
    }
    for _ in 0..blocks {
        let (i, r) = rrx.recv().unwrap();
        let got = r.unwrap();
        if i < 16 {
            assert!(got.iter().all(|&x| x == 0), "block {i} not zeroed");
        } else {
            assert!(got[..] == block(i)[..], "block {i} differs");
        }
    }
    let c = e.counts();
    assert_eq!(c.on_shards.load(Ordering::Relaxed), 0);
    assert_eq!(c.writes_on_shards.load(Ordering::Relaxed), 0);
    assert_eq!(c.blocking.load(Ordering::Relaxed), blocks);
    assert_eq!(c.writes_blocking.load(Ordering::Relaxed), blocks);
    drop(e);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Reads held by their members until this many are held at once.
const AT_ONCE: usize = 64;

/// A member in RAM whose data reads (past the metadata) wait, once the
/// gate is armed, until `AT_ONCE` reads are waiting together across all
/// the gate's members (or a few seconds have passed), and which records
/// the most that ever waited together: a device with latency, whose
/// requests in flight at once are what the engine's threads allow.
struct Gated {
    inner: raid_core::member::RamMember,
    gate: std::sync::Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    armed: std::sync::atomic::AtomicBool,
    waiting: std::sync::Mutex<(usize, usize)>,
    all_in: std::sync::Condvar,
}

impl Member for Gated {
    support::pass_through_to_inner!(writes);
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if self.gate.armed.load(Ordering::Acquire) && offset >= raid_core::metadata::MIN_DATA_OFFSET
        {
            let mut w = self.gate.waiting.lock().unwrap();
            w.0 += 1;
            w.1 = w.1.max(w.0);
            if w.1 >= AT_ONCE {
                self.gate.all_in.notify_all();
            }
            let t = std::time::Duration::from_secs(3);
            let (mut w, _) = self
                .gate
                .all_in
                .wait_timeout_while(w, t, |w| w.1 < AT_ONCE)
                .unwrap();
            w.0 -= 1;
        }
        self.inner.read_at(buf, offset)
    }
}

/// Without io_uring every request waits for its member on one of the
/// engine's blocking threads, so their number is the array's queue depth:
/// `AT_ONCE` reads given at once are all at their members together (with
/// the 8 threads there once were, 8 were, and the rest waited).
#[test]
fn requests_wait_for_their_members_side_by_side() {
    std::env::set_var("RAID_NO_URING", "1");
    let gate = std::sync::Arc::new(Gate::default());
    let members: Vec<raid_core::member::MemberRef> = (0..4)
        .map(|i| {
            std::sync::Arc::new(Gated {
                inner: raid_core::member::RamMember::new(
                    format!("ram:gated{i}"),
                    raid_core::metadata::MIN_DATA_OFFSET + (8 << 20),
                ),
                gate: gate.clone(),
            }) as raid_core::member::MemberRef
        })
        .collect();
    let a = support::array::create_shared(Level::Raid0, members, "gated", 64 * 1024);
    let e = Engine::start(a.clone(), 2).unwrap();
    gate.armed.store(true, Ordering::Release);
    let (tx, rx) = mpsc::channel();
    for i in 0..AT_ONCE as u64 {
        let tx = tx.clone();
        e.read(
            i * 64 * 1024,
            AlignedBuf::new(4096),
            Box::new(move |r| tx.send(r.map(|_| ())).unwrap()),
        );
    }
    for _ in 0..AT_ONCE {
        rx.recv().unwrap().unwrap();
    }
    let most = gate.waiting.lock().unwrap().1;
    assert_eq!(most, AT_ONCE, "reads at their members at once");
    assert_eq!(e.shard_count(), 0);
}
