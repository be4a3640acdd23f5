//! Large I/O through the shards: 128 KiB and 1 MiB random reads and
//! writes, many in flight from one thread (`shard::Engine`), over 8
//! simulated NVMe drives whose bandwidth is limited as well as their
//! latency (`NvmeModel::with_bandwidth`), at the default chunk of 64 KiB,
//! so that every request covers two chunks or more: what a filesystem's
//! writeback and a copy send. Against the bare drives' own rate for the
//! same bytes in the same run: 64 threads each writing (reading) blocks of
//! the request's size at random on one drive at a time.
//!
//! Bounds (of the bare drives' rate): RAID0 1.0x; RAID10 0.5x for writes
//! (two copies); RAID5/6 writes are partial stripes here (a stripe holds
//! 448 KiB of data on RAID5, 384 KiB on RAID6), each a read-modify-write
//! or reconstruct-write of its columns, so no bound is printed. Reads:
//! 1.0x on every level.
//!
//! `cargo bench -p raid-core --bench large_io [-- --quick]` (BENCH_LEVEL=raid0
//! one level; BENCH_DEPTHS=32,128 the depths; BENCH_SIZES_KIB=128,1024 the
//! request sizes; BENCH_READS=1 reads too; BENCH_DEGRADED=1 with one drive
//! of each redundant array failed first; BENCH_READ_MBS and
//! BENCH_WRITE_MBS the drives' bandwidth in MB/s, by default a datacenter
//! drive's 6.8 and 5.3 GB/s scaled down 8 times, as in `benches/rebuild.rs`,
//! so that this machine's cores, which move every byte in memory, are not
//! the bound.)

mod common;

use common::Sample;
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{Member, MemberRef, SimNvme};
use raid_core::metadata::LARGE_RING_DATA_OFFSET;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const MEMBERS: usize = 8;
const MEMBER_DATA: u64 = 256 << 20;
/// The default chunk (`layout::DEFAULT_CHUNK`).
const CHUNK: u64 = 64 << 10;
const DATA_OFFSET: u64 = LARGE_RING_DATA_OFFSET;
/// Threads driving the bare drives: enough to keep each of the 8 busy.
const BARE_THREADS: usize = 64;

fn env_list(name: &str, default: &[u64]) -> Vec<u64> {
    match std::env::var(name) {
        Ok(v) => v.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => default.to_vec(),
    }
}

/// 8 drives of the model, every byte written once (no first-touch cost
/// on either side of a comparison).
fn drives(tag: &str) -> Vec<Arc<SimNvme>> {
    common::sim_drives_of(
        common::bandwidth_model(),
        tag,
        MEMBERS,
        DATA_OFFSET + MEMBER_DATA,
    )
}

/// The bare drives' rate in MB/s for `bs`-byte I/Os at random, from
/// `BARE_THREADS` threads.
fn bare(drives: &[Arc<SimNvme>], write: bool, bs: usize, dur: Duration) -> f64 {
    let (lat, secs) = common::timed_loops(
        BARE_THREADS,
        dur,
        |k| (SmallRng::seed_from_u64(k as u64 + 3), vec![0x5au8; bs]),
        |(rng, buf)| {
            let d = &drives[rng.gen_range(0..MEMBERS)];
            let at = DATA_OFFSET + rng.gen_range(0..MEMBER_DATA / bs as u64) * bs as u64;
            match write {
                true => d.write_at(buf, at).expect("a bare write"),
                false => d.read_at(buf, at).expect("a bare read"),
            }
        },
    );
    lat.len() as f64 * bs as f64 / secs / 1e6
}

/// `qd` requests of `bs` bytes kept in flight at random through the
/// engine from this thread for `dur`.
fn through_engine(
    e: &raid_core::shard::Engine,
    blocks: u64,
    (write, bs): (bool, usize),
    qd: usize,
    dur: Duration,
) -> Sample {
    let (tx, rx) = mpsc::channel::<(u32, AlignedBuf)>();
    let mut rng = SmallRng::seed_from_u64(qd as u64 + bs as u64);
    let issue = |rng: &mut SmallRng, b: AlignedBuf| {
        let off = rng.gen_range(0..blocks) * bs as u64;
        let tx = tx.clone();
        let t0 = Instant::now();
        let done = Box::new(move |r: raid_core::shard::WriteResult| {
            let b = r.expect("an I/O of the bench");
            let _ = tx.send((t0.elapsed().as_micros().min(u32::MAX as u128) as u32, b));
        });
        match write {
            true => e.write(off, b, done),
            false => e.read(off, b, done),
        }
    };
    // The buffers made and filled before the clock starts (128 of 1 MiB
    // take a good part of a short run to fill).
    let bufs: Vec<AlignedBuf> = (0..qd)
        .map(|_| {
            let mut b = AlignedBuf::new(bs);
            rng.fill(&mut b[..]);
            b
        })
        .collect();
    let began = Instant::now();
    for b in bufs {
        issue(&mut rng, b);
    }
    let mut lat = Vec::with_capacity(1 << 16);
    while began.elapsed() < dur {
        let (us, b) = rx.recv().expect("a completion");
        lat.push(us);
        issue(&mut rng, b);
    }
    let secs = began.elapsed().as_secs_f64();
    for _ in 0..qd {
        rx.recv().expect("a completion");
    }
    Sample::of(lat, secs)
}

fn main() {
    common::small_pages();
    let quick = std::env::args().any(|a| a == "--quick");
    let dur = Duration::from_millis(if quick { 500 } else { 1500 });
    let depths = env_list("BENCH_DEPTHS", &[32, 128]);
    let sizes = env_list("BENCH_SIZES_KIB", &[128, 1024]);
    let reads = std::env::var("BENCH_READS").is_ok();
    let m = common::bandwidth_model();
    eprintln!(
        "large I/O bench: {MEMBERS} simulated drives ({}), chunk {} KiB, {} cores",
        common::model_in_words(&m),
        CHUNK >> 10,
        rayon::current_num_threads()
    );
    let bare_drives = drives("bare");
    println!("\n| level | job | QD | array MB/s | bare MB/s | ratio | bound | array p50 / p99 us | on the blocking path |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for level in common::chosen(&[Level::Raid0, Level::Raid5, Level::Raid6, Level::Raid10]) {
        let sims = drives(&format!("{level}-"));
        let a = Arc::new(common::array_at(
            sims.iter().map(|d| d.clone() as MemberRef).collect(),
            level,
            CHUNK,
            DATA_OFFSET,
        ));
        // The first write marks the array dirty: the blocking path's.
        a.write(0, &AlignedBuf::new(4096)).unwrap();
        let degraded = std::env::var("BENCH_DEGRADED").is_ok() && level != Level::Raid0;
        if degraded {
            a.fail_member(0, false).unwrap();
        }
        let e = raid_core::shard::Engine::start(a.clone(), rayon::current_num_threads()).unwrap();
        for write in [true, false] {
            if !write && !reads {
                continue;
            }
            for &kib in &sizes {
                let bs = (kib << 10) as usize;
                let blocks = a.capacity() / bs as u64;
                let bound = match (write, level) {
                    _ if degraded => "-".to_string(),
                    (false, _) | (true, Level::Raid0) => "1.0x".to_string(),
                    (true, Level::Raid10) => "0.5x".to_string(),
                    _ => "-".to_string(),
                };
                for &qd in &depths {
                    let b = bare(&bare_drives, write, bs, dur);
                    let c = e.counts();
                    let (on, off) = match write {
                        true => (&c.writes_on_shards, &c.writes_blocking),
                        false => (&c.on_shards, &c.blocking),
                    };
                    let (on0, off0) = (on.load(Ordering::Relaxed), off.load(Ordering::Relaxed));
                    let r = through_engine(&e, blocks, (write, bs), qd as usize, dur);
                    let (on1, off1) = (on.load(Ordering::Relaxed), off.load(Ordering::Relaxed));
                    let blocking =
                        (off1 - off0) as f64 / ((on1 - on0) + (off1 - off0)).max(1) as f64;
                    let mbs = r.iops * bs as f64 / 1e6;
                    let job = format!(
                        "{kib}k rand{}{}",
                        if write { "write" } else { "read" },
                        if degraded { ", 1 drive failed" } else { "" }
                    );
                    println!(
                        "| {level} | {job} | {qd} | {mbs:.0} | {b:.0} | {:.2}x | {bound} | {:.0} / {:.0} | {:.0}% |",
                        mbs / b,
                        r.p50_us,
                        r.p99_us,
                        blocking * 100.0
                    );
                }
            }
        }
        // Degraded RAID5/6 writes go through the journal: how it went.
        let io = a.io_stats();
        if io.journal_records > 0 {
            eprintln!(
                "{level}: {} journal records made durable in {} groups ({} of the missing chunks alone, {} flushes before a record of every column after one); writes on the shards waited for room in the journal {} times",
                io.journal_records,
                io.journal_commits,
                io.journal_parity_records,
                io.journal_parity_barriers,
                e.counts().journal_waits.load(Ordering::Relaxed)
            );
        }
    }
}
