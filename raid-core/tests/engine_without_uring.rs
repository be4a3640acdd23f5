//! The engine where io_uring is not to be had (RAID_NO_URING=1 here; a
//! kernel or seccomp policy that refuses it takes the same way): no shard
//! starts, and every request (read, write, flush, zeroing) is answered
//! through its completion by the blocking threads. Its own test binary:
//! the choice of I/O path is made once per process.

mod support;

use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
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
