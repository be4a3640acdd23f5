//! Reads through the shards (`raid_core::shard::Engine`): many in flight
//! from one thread, on file members (the shard's io_uring), simulated
//! drives (each I/O reaped by its shard when the drive's time for it
//! comes) and RAM members (the blocking path), each checked against what was written; across chunks,
//! degraded, with a member erring, and with the member table changing
//! under them.

use raid_core::array::Array;
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{io_path, Faults, FaultyMember, IoPath, MemberRef, RamMember, SimNvme};
use raid_core::metadata::SlotState;
use raid_core::metadata::MIN_DATA_OFFSET;
use raid_core::shard::{Engine, ReadResult};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

mod support;

const CHUNK: u64 = 64 << 10;
const DATA: u64 = 8 << 20;

fn array(level: Level, members: Vec<MemberRef>, tag: &str) -> Arc<Array> {
    support::array::create_shared(level, members, tag, CHUNK)
}

fn files(dir: &std::path::Path, n: usize) -> Vec<MemberRef> {
    support::array::files(dir, n, DATA)
}

/// Fills the array with a pattern through the blocking engine; returns it.
fn fill(a: &Array, seed: u64) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut model = vec![0u8; a.capacity() as usize];
    rng.fill(&mut model[..]);
    for (i, c) in model.chunks(1 << 20).enumerate() {
        let mut b = AlignedBuf::new(c.len());
        b.copy_from_slice(c);
        a.write(i as u64 * (1 << 20), &b).unwrap();
    }
    model
}

/// `n` random reads (4 KiB to 64 KiB, some across chunks), `depth` in
/// flight from this one thread, each compared with the model.
fn reads_match(e: &Engine, model: &[u8], n: usize, depth: usize, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let blocks = model.len() as u64 / 4096;
    let send = |_, answer: Box<dyn FnOnce((u64, ReadResult)) + Send>| {
        let len = 4096 * rng.gen_range(1..=16u64);
        let off = rng.gen_range(0..blocks - 16) * 4096;
        let buf = AlignedBuf::new(len as usize);
        e.read(off, buf, Box::new(move |r| answer((off, r))));
    };
    support::in_flight(n, depth, send, |(off, r)| {
        let buf = r.unwrap_or_else(|err| panic!("read at {off}: {err}"));
        let want = &model[off as usize..off as usize + buf.len()];
        assert!(
            &buf[..] == want,
            "read at {off}, {} bytes: wrong data",
            buf.len()
        );
    });
}

#[test]
fn file_members_on_the_shard_ring() {
    let dir = std::env::temp_dir().join(format!("raid-shard-{}", std::process::id()));
    for (level, n) in [
        (Level::Raid0, 4),
        (Level::Raid5, 5),
        (Level::Raid6, 6),
        (Level::Raid10, 4),
    ] {
        let sub = dir.join(format!("{level:?}"));
        std::fs::create_dir_all(&sub).unwrap();
        let members = files(&sub, n);
        let a = array(level, members.clone(), "shard-files");
        let mut model = fill(&a, 1);
        let e = Engine::start(a.clone(), 2).unwrap();
        reads_match(&e, &model, 3000, 128, 2);
        // Every read, inside one chunk or across several, is served by the
        // shards: a member read per chunk, no thread waiting (or, where
        // the temporary directory is tmpfs, copied in the caller's thread).
        let on = e.counts().on_shards.load(Ordering::Relaxed)
            + e.counts().inline.load(Ordering::Relaxed);
        if io_path() == IoPath::IoUring {
            assert_eq!(on, 3000, "{level:?}: reads on the shards");
        }
        // Degraded: a read of a lost member's chunks inside one RAID5/6
        // stripe is recovered on the shard from the stripe's other
        // members; a mirror reads the other copy; a read across stripes
        // takes the blocking path.
        if level != Level::Raid0 {
            a.fail_member(1, false).unwrap();
            // New data after the failure: a read served from the failed
            // member would return the old.
            overwrite(&a, &mut model, 9);
            reads_match(&e, &model, 1000, 64, 3);
        }
        let degraded = || e.counts().degraded_on_shards.load(Ordering::Relaxed);
        let one_lost = degraded();
        if level == Level::Raid6 {
            // Two chunks of a stripe lost: both recovered, from P and Q.
            a.fail_member(4, false).unwrap();
            overwrite(&a, &mut model, 10);
            reads_match(&e, &model, 1000, 64, 4);
        }
        if matches!(level, Level::Raid5 | Level::Raid6) && io_path() == IoPath::IoUring {
            assert!(
                one_lost > 100,
                "{level:?}: degraded reads on the shards: {one_lost}"
            );
        }
        if level == Level::Raid6 && io_path() == IoPath::IoUring {
            let two_lost = degraded() - one_lost;
            assert!(
                two_lost > 100,
                "reads with two members lost on the shards: {two_lost}"
            );
        }
        drop(e);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A degraded RAID5 stripe's lost chunk is recovered from the others while
/// writers change them: the read holds the stripe's lock from its first
/// member read to its last, or it could combine a chunk already rewritten
/// with parity not yet rewritten (data nobody wrote). Writers rewrite the
/// other data chunks of a few stripes; the reads, on the shards, read the
/// lost chunks, which keep what was first written. (RAM moves a read's
/// bytes as it starts, so this shows that the lock is taken, not that it
/// is held until the last read completes, which ring members need: the
/// read holds it as a value until it ends.)
#[test]
fn a_degraded_read_never_sees_a_stripe_half_written() {
    let members: Vec<MemberRef> = (0..4)
        .map(|i| {
            // Each member's blocking I/O slower than the last: a writer's
            // data and parity land that far apart. Timed I/O (the shards'
            // reads) is RAM's, at once.
            let m = RamMember::new(format!("ram:half{i}"), MIN_DATA_OFFSET + DATA);
            let f = FaultyMember::new(Arc::new(m));
            f.set_faults(Faults {
                latency: Duration::from_micros(100 * i),
                ..Default::default()
            });
            Arc::new(f) as MemberRef
        })
        .collect();
    let a = array(Level::Raid5, members, "shard-half");
    let model = fill(&a, 21);
    let lost = 1;
    a.fail_member(lost, false).unwrap();
    let e = Engine::start(a.clone(), 2).unwrap();
    // Stripes where the lost member held data: (first byte of the lost
    // chunk, first bytes of the others).
    let geo = a.geometry();
    let stripes: Arc<Vec<(u64, Vec<u64>)>> = Arc::new(
        (0..8u64)
            .filter_map(|s| {
                let map = geo.stripe_map(s);
                let data = &map.members[..geo.data_chunks()];
                let at = |i: usize| s * geo.stripe_data_bytes() + i as u64 * CHUNK;
                let l = data.iter().position(|&m| m == lost)?;
                let others = (0..data.len()).filter(|&i| i != l).map(at).collect();
                Some((at(l), others))
            })
            .collect(),
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let (a, stop, stripes) = (a.clone(), stop.clone(), stripes.clone());
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(30 + t);
                let mut b = AlignedBuf::new(4096);
                while !stop.load(Ordering::Relaxed) {
                    let (_, others) = &stripes[rng.gen_range(0..stripes.len())];
                    let off = others[rng.gen_range(0..others.len())]
                        + rng.gen_range(0..CHUNK / 4096) * 4096;
                    rng.fill(&mut b[..]);
                    a.write(off, &b).unwrap();
                }
            })
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(22);
    let send = |_, answer: Box<dyn FnOnce((u64, ReadResult)) + Send>| {
        let (at, _) = stripes[rng.gen_range(0..stripes.len())];
        let off = at + rng.gen_range(0..CHUNK / 4096) * 4096;
        e.read(
            off,
            AlignedBuf::new(4096),
            Box::new(move |r| answer((off, r))),
        );
    };
    support::in_flight(20_000, 64, send, |(off, r)| {
        let buf = r.unwrap_or_else(|err| panic!("read at {off}: {err}"));
        assert!(
            buf[..] == model[off as usize..off as usize + 4096],
            "read at {off}: data nobody wrote"
        );
    });
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    if io_path() == IoPath::IoUring {
        let degraded = e.counts().degraded_on_shards.load(Ordering::Relaxed);
        assert!(degraded > 1000, "degraded reads on the shards: {degraded}");
    }
}

/// Rewrites a quarter of the array (random 64 KiB pieces) through the
/// blocking engine, and the model with it.
fn overwrite(a: &Array, model: &mut [u8], seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let pieces = model.len() as u64 / CHUNK;
    for _ in 0..pieces / 4 {
        let off = rng.gen_range(0..pieces) * CHUNK;
        let mut b = AlignedBuf::new(CHUNK as usize);
        rng.fill(&mut b[..]);
        a.write(off, &b).unwrap();
        model[off as usize..(off + CHUNK) as usize].copy_from_slice(&b);
    }
}

/// Sends `n` random 4 KiB reads (of `blocks`) at once; their answers come
/// on the channel returned, each with its offset.
fn send_reads(e: &Engine, blocks: u64, n: usize, seed: u64) -> mpsc::Receiver<(u64, ReadResult)> {
    let (tx, rx) = mpsc::channel();
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..n {
        let off = rng.gen_range(0..blocks) * 4096;
        let tx = tx.clone();
        e.read(
            off,
            AlignedBuf::new(4096),
            Box::new(move |r| tx.send((off, r)).unwrap()),
        );
    }
    rx
}

fn drive(name: String) -> SimNvme {
    support::array::sim_drive(name, DATA)
}

/// More reads at once than one shard's ring holds (256), all sent before
/// any is awaited: the ones waiting for room must start as room comes,
/// not when the next request happens to arrive.
#[test]
fn more_reads_than_the_ring_holds_all_complete() {
    // Not on tmpfs: reads from members in memory never reach a shard
    // (`reads_from_members_in_memory_run_in_the_callers_thread`).
    let dir = std::env::temp_dir().join(format!("raid-shard-full-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let members = files(&dir, 4);
    if members.iter().any(|m| m.in_memory()) {
        eprintln!("the temporary directory is in memory: a full ring not tried");
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let a = array(Level::Raid5, members, "shard-full");
    let model = fill(&a, 10);
    let e = Engine::start(a, 1).unwrap();
    reads_match(&e, &model, 2400, 800, 11);
    // 600 sent at once, then only waited for: nothing else arrives to
    // wake the shard.
    let rx = send_reads(&e, model.len() as u64 / 4096, 600, 15);
    for _ in 0..600 {
        let (off, r) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("every read completes");
        assert!(r.unwrap()[..] == model[off as usize..off as usize + 4096]);
    }
    // Dropped with reads in flight: each still gets its answer.
    let rx = send_reads(&e, model.len() as u64 / 4096, 600, 12);
    drop(e);
    let mut n = 0;
    for (off, r) in rx {
        let b = r.unwrap();
        assert!(b[..] == model[off as usize..off as usize + 4096]);
        n += 1;
    }
    assert_eq!(n, 600);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn simulated_drives_complete_on_their_shards() {
    let members: Vec<MemberRef> = (0..5)
        .map(|i| Arc::new(drive(format!("sim:s{i}"))) as MemberRef)
        .collect();
    let a = array(Level::Raid5, members, "shard-sim");
    let mut model = fill(&a, 4);
    let e = Engine::start(a.clone(), 2).unwrap();
    reads_match(&e, &model, 5000, 256, 5);
    assert_eq!(e.counts().on_shards.load(Ordering::Relaxed), 5000);
    // A member fails while reads are in flight; every read still
    // returns its data, and after new writes, the new data (none from the
    // failed member).
    let a2 = a.clone();
    let churn = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(5));
        a2.fail_member(2, false).unwrap();
    });
    reads_match(&e, &model, 3000, 256, 6);
    churn.join().unwrap();
    overwrite(&a, &mut model, 13);
    reads_match(&e, &model, 2000, 256, 14);
}

/// A member that can take I/O neither on a ring nor as timed I/O (here
/// RAM behind a plain wrapper; a network member is one): every read takes
/// the blocking path, and returns its data.
struct Plain(RamMember);

impl raid_core::member::Member for Plain {
    fn identity(&self) -> &str {
        self.0.identity()
    }
    fn device_key(&self) -> raid_core::member::DeviceKey {
        self.0.device_key()
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.write_zeroes(offset, len)
    }
}

#[test]
fn members_that_can_do_neither_take_the_blocking_path() {
    let members: Vec<MemberRef> = (0..4)
        .map(|i| {
            Arc::new(Plain(RamMember::new(
                format!("ram:sh{i}"),
                MIN_DATA_OFFSET + DATA,
            ))) as MemberRef
        })
        .collect();
    let a = array(Level::Raid5, members, "shard-plain");
    let model = fill(&a, 7);
    let e = Engine::start(a, 1).unwrap();
    reads_match(&e, &model, 2000, 64, 8);
    assert_eq!(e.counts().on_shards.load(Ordering::Relaxed), 0);
    assert_eq!(e.counts().blocking.load(Ordering::Relaxed), 2000);
}

/// RAM members complete as they start: the shards serve them.
#[test]
fn ram_members_are_served_by_the_shards() {
    let members: Vec<MemberRef> = (0..4)
        .map(|i| {
            Arc::new(RamMember::new(format!("ram:sr{i}"), MIN_DATA_OFFSET + DATA)) as MemberRef
        })
        .collect();
    let a = array(Level::Raid5, members, "shard-ram");
    let model = fill(&a, 19);
    let e = Engine::start(a, 1).unwrap();
    reads_match(&e, &model, 2000, 64, 20);
    assert_eq!(e.counts().on_shards.load(Ordering::Relaxed), 2000);
}

/// A member whose reads err under reads in flight on the shards: every
/// read still returns its data (the blocking path reconstructs it), and
/// the member is failed.
#[test]
fn a_member_read_error_fails_it_and_the_read_is_reconstructed() {
    let faulty: Vec<Arc<FaultyMember>> = (0..5)
        .map(|i| Arc::new(FaultyMember::new(Arc::new(drive(format!("sim:r{i}"))))))
        .collect();
    read_errors_fail_the_member(&faulty, "shard-rerr", 128, 16);
}

/// A RAID5 of `faulty`, filled, whose member 3 then errs on every I/O
/// under 2000 reads, `depth` in flight (seeds from `seed`): every read
/// returns its data, the member is failed, and the blocking path served
/// some reads (the reconstruction).
fn read_errors_fail_the_member(faulty: &[Arc<FaultyMember>], tag: &str, depth: usize, seed: u64) {
    let members: Vec<MemberRef> = faulty.iter().map(|f| f.clone() as MemberRef).collect();
    let a = array(Level::Raid5, members, tag);
    let model = fill(&a, seed);
    let e = Engine::start(a.clone(), 2).unwrap();
    faulty[3].fail_all();
    reads_match(&e, &model, 2000, depth, seed + 1);
    assert_eq!(a.slots()[3].state, SlotState::Failed);
    assert!(e.counts().blocking.load(Ordering::Relaxed) > 0);
}

/// A read of more chunks than a shard keeps I/Os in flight for one
/// request (here 512 chunks of 4 KiB) goes to the blocking path whole;
/// reads of fewer stay on the shards. Both return the data.
#[test]
fn a_read_of_very_many_chunks_takes_the_blocking_path() {
    let members: Vec<MemberRef> = (0..4)
        .map(|i| Arc::new(drive(format!("sim:big{i}"))) as MemberRef)
        .collect();
    let a = support::array::create_shared(Level::Raid5, members, "shard-big", 4096);
    let model = fill(&a, 18);
    let e = Engine::start(a, 1).unwrap();
    for (len, on, off) in [(2 << 20, 0, 1), (64 << 10, 1, 1)] {
        let (tx, rx) = mpsc::channel();
        e.read(
            4096,
            AlignedBuf::new(len),
            Box::new(move |r| tx.send(r).unwrap()),
        );
        let b = rx.recv_timeout(Duration::from_secs(20)).unwrap().unwrap();
        assert!(b[..] == model[4096..4096 + len]);
        assert_eq!(e.counts().on_shards.load(Ordering::Relaxed), on);
        assert_eq!(e.counts().blocking.load(Ordering::Relaxed), off);
    }
}

/// Members that are files in memory: a read whose chunks all have a
/// readable copy is copied in the caller's thread and answered before
/// `Engine::read` returns; one that needs a lost chunk goes to the shards
/// (or the blocking path); a member whose copy errs is failed and the read
/// reconstructed, as on the shards.
#[test]
fn reads_from_members_in_memory_run_in_the_callers_thread() {
    let Some(dir) = support::array::memory_dir("raid-shard-inline") else {
        eprintln!("no /dev/shm here: reads in the caller's thread not tried");
        return;
    };
    let members = |sub: &str| {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        let f: Vec<Arc<FaultyMember>> = files(&d, 5)
            .into_iter()
            .map(|m| Arc::new(FaultyMember::new(m)))
            .collect();
        let refs: Vec<MemberRef> = f.iter().map(|m| m.clone() as MemberRef).collect();
        (f, refs)
    };
    let (_, refs) = members("a");
    let a = array(Level::Raid5, refs, "shard-inline");
    let mut model = fill(&a, 40);
    let e = Engine::start(a.clone(), 2).unwrap();
    let counts = e.counts();
    let count = |c: &raid_core::stats::StripedCounter| c.load(Ordering::Relaxed);

    let answered = Arc::new(std::sync::Mutex::new(None));
    let to = answered.clone();
    e.read(
        CHUNK - 4096,
        AlignedBuf::new(8192),
        Box::new(move |r| *to.lock().unwrap() = Some(r)),
    );
    let b = answered.lock().unwrap().take().expect("answered in read");
    assert!(b.unwrap()[..] == model[CHUNK as usize - 4096..CHUNK as usize + 4096]);

    reads_match(&e, &model, 2000, 64, 41);
    assert_eq!(count(&counts.inline), 2001);
    assert_eq!(count(&counts.on_shards) + count(&counts.blocking), 0);

    // A member lost: reads of its chunks are recovered elsewhere, with the
    // data written since, not the lost member's.
    a.fail_member(1, false).unwrap();
    overwrite(&a, &mut model, 42);
    reads_match(&e, &model, 2000, 64, 43);
    assert!(count(&counts.degraded_on_shards) + count(&counts.blocking) > 0);
    assert!(count(&counts.inline) > 2001 + 1000);

    // A member whose reads err, on a RAID5 with all its members: failed
    // (never read again), every read still its data.
    drop(e);
    let (faulty, _) = members("b");
    read_errors_fail_the_member(&faulty, "shard-inline-err", 64, 44);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Reads copied in the caller's thread while writes land (through the
/// shards and the blocking path), a member is failed, replaced and
/// rebuilt, and another hot-replaced: a read that no write of its block
/// overlaps returns that block whole, at the version last acknowledged;
/// one that a write of its block overlaps may mix the two versions (as a
/// drive may, and as a file in memory does: its reads copy from the page
/// while a write copies into it), but nothing older than the version
/// acknowledged before it was asked for, nothing newer than the last
/// write started, and never another block's data or the lost member's
/// stale chunk.
#[test]
fn reads_in_the_callers_thread_under_writes_and_membership_changes() {
    use raid_core::array::{RebuildEnd, RebuildOptions};
    use std::sync::atomic::{AtomicBool, AtomicU64};
    let Some(dir) = support::array::memory_dir("raid-shard-inline-churn") else {
        eprintln!("no /dev/shm here: reads in the caller's thread not tried");
        return;
    };
    std::fs::create_dir_all(&dir).unwrap();
    let a = array(Level::Raid5, files(&dir, 5), "shard-inline-churn");
    let e = Arc::new(Engine::start(a.clone(), 2).unwrap());
    let blocks = (a.capacity() / 4096) as usize;
    // Block b at version v: every 8-byte word is (b << 32 | v).
    let fill = |b: usize, v: u64| {
        let mut buf = AlignedBuf::new(4096);
        let w = ((b as u64) << 32 | v).to_le_bytes();
        buf.chunks_mut(8).for_each(|c| c.copy_from_slice(&w));
        buf
    };
    // The versions the block's words hold, lowest and highest.
    let versions_of = |b: usize, buf: &[u8]| -> (u64, u64) {
        let (mut lo, mut hi) = (u64::MAX, 0);
        for c in buf.chunks(8) {
            let w = u64::from_le_bytes(c.try_into().unwrap());
            assert_eq!(w >> 32, b as u64, "block {b} holds another block's data");
            lo = lo.min(w & 0xffff_ffff);
            hi = hi.max(w & 0xffff_ffff);
        }
        (lo, hi)
    };
    for b in 0..blocks {
        a.write(b as u64 * 4096, &fill(b, 0)).unwrap();
    }
    // The last version of each block acknowledged, and started.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..blocks).map(|_| AtomicU64::new(0)).collect());
    let started: Arc<Vec<AtomicU64>> = Arc::new((0..blocks).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    // Two writers, each owning every other block: one through the shards,
    // one through the blocking path.
    let writers: Vec<_> = (0..2usize)
        .map(|t| {
            let (a, e, acked, stop) = (a.clone(), e.clone(), acked.clone(), stop.clone());
            let started = started.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(60 + t as u64);
                while !stop.load(Ordering::Relaxed) {
                    let b = rng.gen_range(0..blocks / 2) * 2 + t;
                    let v = acked[b].load(Ordering::Relaxed) + 1;
                    let data = fill(b, v);
                    started[b].store(v, Ordering::SeqCst);
                    if t == 0 {
                        let (tx, rx) = mpsc::channel();
                        e.write(
                            b as u64 * 4096,
                            data,
                            Box::new(move |r| tx.send(r).unwrap()),
                        );
                        rx.recv().unwrap().unwrap();
                    } else {
                        a.write(b as u64 * 4096, &data).unwrap();
                    }
                    acked[b].store(v, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let churn = {
        let (a, dir) = (a.clone(), dir.clone());
        std::thread::spawn(move || {
            let opts = RebuildOptions {
                batch_rows: 4,
                ..Default::default()
            };
            let go = AtomicBool::new(false);
            let fresh = |name: &str| {
                let d = dir.join(name);
                std::fs::create_dir_all(&d).unwrap();
                files(&d, 1).pop().unwrap()
            };
            std::thread::sleep(Duration::from_millis(30));
            a.fail_member(1, false).unwrap();
            std::thread::sleep(Duration::from_millis(30));
            a.replace(1, fresh("new1")).unwrap();
            let r = a.rebuild(1, &opts, &go).unwrap();
            assert!(matches!(r, RebuildEnd::Finished));
            a.hot_replace(3, fresh("new3")).unwrap();
            let r = a.hot_replace_copy(&opts, &go).unwrap();
            assert!(matches!(r, RebuildEnd::Finished));
        })
    };
    let mut rng = SmallRng::seed_from_u64(62);
    let mut n = 0u64;
    while !churn.is_finished() || n < 20_000 {
        let b = rng.gen_range(0..blocks);
        let floor = acked[b].load(Ordering::SeqCst);
        let first = started[b].load(Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        e.read(
            b as u64 * 4096,
            AlignedBuf::new(4096),
            Box::new(move |r| tx.send(r).unwrap()),
        );
        let got = rx.recv().unwrap().unwrap();
        let last = started[b].load(Ordering::SeqCst);
        let (lo, hi) = versions_of(b, &got);
        assert!(
            lo >= floor,
            "block {b}: version {lo} read after {floor} was acknowledged"
        );
        assert!(
            hi <= last,
            "block {b}: version {hi} read before it was written"
        );
        if first == floor && last == floor {
            assert_eq!(
                lo, hi,
                "block {b} torn, though no write of it overlapped the read"
            );
        }
        n += 1;
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    writers.into_iter().for_each(|w| w.join().unwrap());
    assert!(e.counts().inline.load(Ordering::Relaxed) > 0);
    assert!(a.slots().iter().all(|s| s.state == SlotState::Active));
    for b in 0..blocks {
        let mut buf = AlignedBuf::new(4096);
        a.read(b as u64 * 4096, &mut buf).unwrap();
        let v = acked[b].load(Ordering::Relaxed);
        assert_eq!(versions_of(b, &buf), (v, v), "block {b} at the end");
    }
    drop(e);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The fallback pool grows where a member the shards cannot serve keeps
/// its threads busy: such a member (a network member) can join after the
/// engine started, by a hot replace or a rebuild onto it, and was then
/// served by the few threads sized for short work. Here two members in
/// memory (the shards copy them), then a latency armed on one: it is now
/// neither in memory nor on a ring, so its reads go to the pool, 64 in
/// flight, each waiting 2 ms. Every read must still match what was
/// written, and the pool must have grown.
#[test]
fn the_fallback_pool_grows_when_a_member_turns_blocking() {
    let Some(dir) = support::array::memory_dir("raid-shard-pool") else {
        println!("skipped: no /dev/shm, where members start in memory");
        return;
    };
    std::fs::create_dir_all(&dir).unwrap();
    let faulty: Vec<Arc<FaultyMember>> = files(&dir, 2)
        .into_iter()
        .map(|m| Arc::new(FaultyMember::new(m)))
        .collect();
    let members = faulty.iter().map(|f| f.clone() as MemberRef).collect();
    let a = array(Level::Raid0, members, "raid-shard-pool");
    let e = Engine::start(a.clone(), 1).unwrap();
    if !a.all_in_memory() || e.shard_count() == 0 {
        // Members not in memory are slow from the start; without shards
        // the pool starts at the most it may have.
        println!("skipped: /dev/shm is not tmpfs, or no io_uring (no shard)");
        drop(e);
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let model = fill(&a, 41);
    let at_start = e.fallback_threads();
    faulty[1].set_faults(Faults {
        latency: Duration::from_millis(2),
        ..Default::default()
    });
    reads_match(&e, &model, 512, 64, 42);
    assert!(
        e.counts().blocking.load(Ordering::Relaxed) > 100,
        "the slow member's reads did not go to the pool"
    );
    let grown = e.fallback_threads();
    assert!(
        grown > at_start,
        "the pool stayed at {at_start} threads with 64 reads waiting"
    );
    drop(e);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A RAID10 of 4 or 8 drives, all in sync: random reads (4 to 64 KiB
/// through the shards, 4 KiB through `Array::read`) reach every drive, none taking
/// more than twice another's share. (Each chunk's first copy read used to
/// take turns by chunk, which on 4 and 8 members sent every read to half
/// of them.)
#[test]
fn raid10_reads_reach_every_member() {
    for n in [4, 8] {
        let drives: Vec<Arc<SimNvme>> = (0..n)
            .map(|i| Arc::new(drive(format!("sim:r10-{n}-{i}"))))
            .collect();
        let a = array(
            Level::Raid10,
            drives.iter().map(|d| d.clone() as MemberRef).collect(),
            "r10-spread",
        );
        let model = fill(&a, 21);
        let reads = |d: &SimNvme| {
            use raid_core::member::Member;
            d.io_stats().expect("a drive's counts").read.snapshot().ops
        };
        let before: Vec<u64> = drives.iter().map(|d| reads(d)).collect();
        let e = Engine::start(a.clone(), 2).unwrap();
        reads_match(&e, &model, 2000, 32, 22);
        drop(e);
        let mut rng = SmallRng::seed_from_u64(23);
        let mut b = AlignedBuf::new(4096);
        for _ in 0..2000 {
            let off = rng.gen_range(0..model.len() as u64 / 4096) * 4096;
            a.read(off, &mut b).unwrap();
            assert!(b[..] == model[off as usize..off as usize + 4096]);
        }
        let got: Vec<u64> = drives
            .iter()
            .zip(&before)
            .map(|(d, b)| reads(d) - b)
            .collect();
        let (lo, hi) = (got.iter().min().unwrap(), got.iter().max().unwrap());
        assert!(
            *lo > 0 && hi / lo < 2,
            "RAID10 of {n}: member reads {got:?}"
        );
    }
}
