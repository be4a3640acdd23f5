//! Synchronous writes: every 4 KiB write followed by a flush, as a
//! database's log, an `fsync` loop or a filesystem's journal commits do.
//! The array in-process over 8 simulated NVMe drives
//! (`member::NvmeModel::datacenter`: 80 us read, 20 us write, a flush one
//! write's time), against one bare drive doing the same, in the same run.
//!
//! `cargo bench -p raid-core --bench sync_write [-- --quick]`
//! (BENCH_LEVEL=raid5 runs one level; BENCH_LINGER_MS=0 clears each
//! write-intent bit at the first flush after its write, where by default
//! it lingers `raid_core::array::BITMAP_LINGER`; BENCH_DEGRADED=1 fails
//! one drive of each array first, so writes go through the degraded-write
//! journal, and each flush settles it.)
//!
//! Jobs, each through the blocking API:
//! - `log`: one thread appending 4 KiB records, each made durable before
//!   the next (a write-ahead log at queue depth 1);
//! - `4 logs`: four such threads, each appending in its own area;
//! - `random`: four threads, each writing 4 KiB at random and flushing.
//!
//! Besides the rate and the latency of a write and its flush, it prints
//! what each costs the drives: their commands (reads, writes, flushes, of
//! all eight) and the write-intent bitmap writes among them (each a write
//! and a flush of every drive).
//!
//! A second table runs the same jobs through the shards
//! (`shard::Engine`), each write made durable before the next either as
//! an NBD client's FUA write used to be answered (the write, then a flush
//! of the array, concurrent flushes joined into one) or with FUA
//! (`Engine::write_fua`: on the members the write meets, no flush).

mod common;

use common::Sample;
use raid_core::array::Array;
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{Member, MemberRef, SimNvme};
use raid_core::metadata::LARGE_RING_DATA_OFFSET;
use raid_core::shard::Engine;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const MEMBERS: usize = 8;
const MEMBER_DATA: u64 = 256 << 20;
const CHUNK: u64 = 64 * 1024;
const BS: usize = 4096;

#[derive(Clone, Copy)]
enum Job {
    Log,
    Logs4,
    Random,
}

impl Job {
    fn name(self) -> &'static str {
        match self {
            Job::Log => "log",
            Job::Logs4 => "4 logs",
            Job::Random => "random",
        }
    }
    fn threads(self) -> usize {
        match self {
            Job::Log => 1,
            Job::Logs4 | Job::Random => 4,
        }
    }
}

/// A write and a flush: the array's, or one bare drive's.
trait Target: Sync {
    fn size(&self) -> u64;
    fn sync_write(&self, off: u64, buf: &[u8]);
}

impl Target for Array {
    fn size(&self) -> u64 {
        self.capacity()
    }
    fn sync_write(&self, off: u64, buf: &[u8]) {
        self.write(off, buf).unwrap();
        self.flush().unwrap();
    }
}

struct Bare(Arc<SimNvme>);

impl Target for Bare {
    fn size(&self) -> u64 {
        MEMBER_DATA
    }
    fn sync_write(&self, off: u64, buf: &[u8]) {
        self.0.write_at(buf, off).unwrap();
        self.0.flush().unwrap();
    }
}

/// The array through its shards: each write then a flush of the array
/// (`fua` false), or each a write with FUA.
struct Shards<'a> {
    e: &'a Engine,
    size: u64,
    fua: bool,
}

impl Target for Shards<'_> {
    fn size(&self) -> u64 {
        self.size
    }
    fn sync_write(&self, off: u64, buf: &[u8]) {
        let mut data = AlignedBuf::for_overwrite(buf.len());
        data.copy_from_slice(buf);
        let (tx, rx) = mpsc::channel();
        let done = Box::new(move |r: raid_core::shard::WriteResult| tx.send(r.is_ok()).unwrap());
        match self.fua {
            true => self.e.write_fua(off, data, done),
            false => self.e.write(off, data, done),
        }
        assert!(rx.recv().unwrap(), "write failed");
        if !self.fua {
            let (tx, rx) = mpsc::channel();
            self.e.flush(Box::new(move |r| tx.send(r.is_ok()).unwrap()));
            assert!(rx.recv().unwrap(), "flush failed");
        }
    }
}

fn run(t: &dyn Target, job: Job, dur: Duration) -> Sample {
    let blocks = t.size() / BS as u64;
    let area = blocks / job.threads() as u64;
    let (lat, secs) = common::timed_loops(
        job.threads(),
        dur,
        |k| {
            let k = k as u64;
            let mut rng = SmallRng::seed_from_u64(k + 11);
            let mut buf = AlignedBuf::new(BS);
            rng.fill(&mut buf[..]);
            (k, rng, buf, k * area)
        },
        |(k, rng, buf, next)| {
            let block = match job {
                Job::Random => rng.gen_range(0..blocks),
                Job::Log | Job::Logs4 => {
                    *next += 1;
                    if *next == (*k + 1) * area {
                        *next = *k * area;
                    }
                    *next
                }
            };
            t.sync_write(block * BS as u64, buf);
        },
    );
    Sample::of(lat, secs)
}

fn sim_drives(tag: &str, n: usize) -> Vec<Arc<SimNvme>> {
    common::sim_drives(tag, n, LARGE_RING_DATA_OFFSET + MEMBER_DATA)
}

fn main() {
    common::small_pages();
    let quick = std::env::args().any(|a| a == "--quick");
    let dur = Duration::from_millis(if quick { 500 } else { 2000 });
    eprintln!(
        "sync write bench: {MEMBERS} simulated NVMe drives of {} MiB, chunk {} KiB, 4 KiB writes each followed by a flush",
        MEMBER_DATA >> 20,
        CHUNK >> 10
    );
    let bare = Bare(sim_drives("bare", 1).remove(0));
    println!(
        "\n| level | job | threads | array writes/s | p50 / p99 us | one drive writes/s | p50 / p99 us | drive commands per write | bitmap writes per write |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut through_shards = Vec::new();
    for level in common::chosen(&[Level::Raid1, Level::Raid5, Level::Raid6]) {
        let drives = sim_drives(&level.to_string(), MEMBERS);
        let members: Vec<MemberRef> = drives.iter().map(|d| d.clone() as MemberRef).collect();
        let a = Arc::new(common::array_at(
            members,
            level,
            CHUNK,
            LARGE_RING_DATA_OFFSET,
        ));
        if let Some(ms) = std::env::var("BENCH_LINGER_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            a.set_bitmap_linger(Some(Duration::from_millis(ms)));
        }
        if std::env::var("BENCH_DEGRADED").is_ok_and(|v| v == "1") {
            a.fail_member(1, false).unwrap();
        }
        let commands = || drives.iter().map(|d| d.commands()).sum::<u64>();
        for job in [Job::Log, Job::Logs4, Job::Random] {
            let b = run(&bare, job, dur);
            let (c0, bm0) = (commands(), a.io_stats().bitmap_writes);
            let r = run(&*a, job, dur);
            let (c1, bm1) = (commands(), a.io_stats().bitmap_writes);
            println!(
                "| {level} | {} | {} | {:.0} | {:.0} / {:.0} | {:.0} | {:.0} / {:.0} | {:.1} | {:.2} |",
                job.name(),
                job.threads(),
                r.iops,
                r.p50_us,
                r.p99_us,
                b.iops,
                b.p50_us,
                b.p99_us,
                (c1 - c0) as f64 / r.ios as f64,
                (bm1 - bm0) as f64 / r.ios as f64,
            );
        }
        let e = Engine::start(a.clone(), 2).expect("the engine");
        for job in [Job::Log, Job::Logs4, Job::Random] {
            let mut row = format!("| {level} | {} | {} |", job.name(), job.threads());
            for fua in [false, true] {
                let t = Shards {
                    e: &e,
                    size: a.capacity(),
                    fua,
                };
                let c0 = commands();
                let r = run(&t, job, dur);
                let per = (commands() - c0) as f64 / r.ios as f64;
                let cols = format!(
                    " {:.0} | {:.0} / {:.0} | {per:.1} |",
                    r.iops, r.p50_us, r.p99_us
                );
                row.push_str(&cols);
            }
            through_shards.push(row);
        }
        drop(e);
        match Arc::try_unwrap(a) {
            Ok(a) => a.close().unwrap(),
            Err(_) => unreachable!("the engine let it go"),
        }
    }
    println!(
        "\nThrough the shards: each write then a flush of the array, against each a write with FUA\n"
    );
    println!("| level | job | threads | write + flush writes/s | p50 / p99 us | commands per write | FUA writes/s | p50 / p99 us | commands per write |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for row in through_shards {
        println!("{row}");
    }
}
