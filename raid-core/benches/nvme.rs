//! Does the engine hide device latency? The array in-process over 8
//! simulated NVMe drives (80 us read, 20 us write, 128 in service at once:
//! `member::NvmeModel::datacenter`), side by side with the same I/O sent
//! straight to the bare drives under the same model, in the same run, at
//! queue depths 1 to 256.
//!
//! `cargo bench -p raid-core --bench nvme [-- --quick]`
//! (BENCH_LEVEL=raid5 runs one level, BENCH_DEPTHS=1,128 those depths,
//! BENCH_ASYNC_ONLY=1 the second table only, BENCH_SHARDS=N its shards,
//! BENCH_DEGRADED_ONLY=1 in it the jobs with a drive failed only.)
//!
//! First table: queue depth is the number of threads submitting at once,
//! through the synchronous API. On a machine with few cores, hundreds of
//! threads cost scheduling as well; the bare drives pay it too, so the
//! ratio is the engine's.
//!
//! Second table: reads and writes through the shards
//! (`raid_core::shard::Engine`, one per core), queue depth being the I/Os
//! kept in flight by one thread, against the bare drives driven from a
//! thread per core, the depth shared among them (each I/O started, its
//! completion reaped by its thread once the drive's time for it comes, as
//! the shards reap theirs);
//! each row followed by the same I/O given by front ends on the shards'
//! own threads (`shard::Client`, one per shard), against the same bare
//! run; then 4 KiB sequential writes (what waits for a stripe merges), and for
//! RAID5 and RAID6 reads and writes with one drive failed.

mod common;

use common::{Blocks, Sample};
use raid_core::array::Array;
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{IoOp, MemberRef, NvmeModel, SimNvme};
use raid_core::metadata::LARGE_RING_DATA_OFFSET;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MEMBERS: usize = 8;
const MEMBER_DATA: u64 = 64 << 20;
const CHUNK: u64 = 64 * 1024;
const BS: usize = 4096;

trait Target: Sync {
    fn size(&self) -> u64;
    fn io(&self, write: bool, off: u64, buf: &mut [u8]);
}

impl Target for Array {
    fn size(&self) -> u64 {
        self.capacity()
    }
    fn io(&self, write: bool, off: u64, buf: &mut [u8]) {
        if write {
            self.write(off, buf).unwrap()
        } else {
            self.read(off, buf).unwrap()
        }
    }
}

/// The bare drives as one address space, drive after drive.
struct Bare(Vec<MemberRef>);
impl Target for Bare {
    fn size(&self) -> u64 {
        MEMBER_DATA * self.0.len() as u64
    }
    fn io(&self, write: bool, off: u64, buf: &mut [u8]) {
        let m = &self.0[(off / MEMBER_DATA) as usize];
        let at = DATA_OFFSET + off % MEMBER_DATA;
        if write {
            m.write_at(buf, at).unwrap()
        } else {
            m.read_at(buf, at).unwrap()
        }
    }
}

fn run(t: &dyn Target, write: bool, qd: usize, dur: Duration) -> Sample {
    let blocks = t.size() / BS as u64;
    let (lat, secs) = common::timed_loops(
        qd,
        dur,
        |k| {
            let mut rng = SmallRng::seed_from_u64(k as u64 + 7);
            let mut buf = AlignedBuf::new(BS);
            rng.fill(&mut buf[..]);
            (rng, buf)
        },
        |(rng, buf)| {
            let off = rng.gen_range(0..blocks) * BS as u64;
            t.io(write, off, buf);
        },
    );
    Sample::of(lat, secs)
}

/// Keeps `qd` I/Os in flight from this one thread for `dur`: `start(off,
/// done)` starts one at `off` and `done` is called at its completion.
/// Offsets at random, or one after another (`seq`) from block 0.
fn run_async(
    start: &dyn Fn(u64, Box<dyn FnOnce() + Send>),
    blocks: u64,
    qd: usize,
    dur: Duration,
    seq: bool,
) -> Sample {
    let (tx, rx) = std::sync::mpsc::channel::<u32>();
    let mut at = Blocks::new(qd as u64 + 11, 0, blocks, seq);
    let issue = |at: &mut Blocks| {
        let tx = tx.clone();
        let t0 = Instant::now();
        let block = at.next();
        start(
            block * BS as u64,
            Box::new(move || {
                let _ = tx.send(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }),
        );
    };
    let began = Instant::now();
    for _ in 0..qd {
        issue(&mut at);
    }
    let mut lat = Vec::with_capacity(1 << 20);
    while began.elapsed() < dur {
        lat.push(rx.recv().expect("a completion"));
        issue(&mut at);
    }
    let secs = began.elapsed().as_secs_f64();
    for _ in 0..qd {
        rx.recv().expect("a completion");
    }
    let mut s = Sample::of(lat, secs);
    s.ios += qd as u64;
    s
}

/// The bare drives as an application drives NVMe from `threads` threads
/// (one per core, as the engine has a shard per core), `qd` I/Os in
/// flight among them: each I/O started on its drive (`Member::start_due`:
/// the bytes move at once), its completion reaped by its thread once the
/// drive's time for it has come, the thread sleeping in an io_uring wait
/// until its soonest is due, as a shard reaps its drives'. Offsets as
/// `run_async`'s (each thread its own stream).
fn bare_polled(
    bare: &Bare,
    write: bool,
    blocks: u64,
    (qd, threads): (usize, usize),
    dur: Duration,
    seq: bool,
) -> Sample {
    let threads = threads.clamp(1, qd.max(1));
    let began = Instant::now();
    let runs: Vec<(Vec<u32>, f64)> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (depth, first) = common::share(qd, blocks, threads, t);
                let seed = (qd * threads + t) as u64 + 11;
                sc.spawn(move || {
                    bare_thread(bare, write, blocks, depth, (began, dur), (seq, first, seed))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a bare thread"))
            .collect()
    });
    let secs = runs.iter().map(|r| r.1).fold(0.0, f64::max);
    let lat = runs.into_iter().flat_map(|r| r.0).collect();
    let mut s = Sample::of(lat, secs);
    s.ios += qd as u64;
    s
}

/// One thread of `bare_polled`: its latencies, and the seconds from
/// `began` to the first completion after `dur` (what followed drained).
fn bare_thread(
    bare: &Bare,
    write: bool,
    blocks: u64,
    depth: usize,
    (began, dur): (Instant, Duration),
    (seq, first, seed): (bool, u64, u64),
) -> (Vec<u32>, f64) {
    use std::cmp::Reverse;
    // Where the kernel cannot wait on a ring for a time, a plain sleep.
    let ring = io_uring::IoUring::new(8)
        .ok()
        .filter(|r| r.params().is_feature_ext_arg());
    let mut due = std::collections::BinaryHeap::new();
    let mut at = Blocks::new(seed, first, blocks, seq);
    let mut scratch = [0u8; BS];
    let mut issue = |due: &mut std::collections::BinaryHeap<_>| {
        let off = at.next() * BS as u64;
        let m = &bare.0[(off / MEMBER_DATA) as usize];
        let op = match write {
            true => IoOp::Write(&scratch),
            false => IoOp::Read(&mut scratch),
        };
        let t0 = Instant::now();
        let at = m.start_due(op, DATA_OFFSET + off % MEMBER_DATA);
        due.push(Reverse((at.expect("a simulated drive").unwrap(), t0)));
    };
    for _ in 0..depth {
        issue(&mut due);
    }
    let mut lat = Vec::with_capacity(1 << 20);
    let mut secs = None;
    while let Some(&Reverse((at, _))) = due.peek() {
        let now = Instant::now();
        if at > now {
            match &ring {
                Some(ring) => {
                    let ts = io_uring::types::Timespec::from(at - now);
                    let args = io_uring::types::SubmitArgs::new().timespec(&ts);
                    // Nothing is on the ring: this waits for the time alone.
                    let _ = ring.submitter().submit_with_args(1, &args);
                }
                None => std::thread::sleep(at - now),
            }
            continue;
        }
        let Reverse((_, t0)) = due.pop().expect("peeked");
        if secs.is_none() && began.elapsed() < dur {
            lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
            issue(&mut due);
        } else {
            secs.get_or_insert_with(|| began.elapsed().as_secs_f64());
        }
    }
    (lat, secs.unwrap_or_else(|| began.elapsed().as_secs_f64()))
}

/// What the array can do at best, against the bare drives: every read is
/// one drive read; a 4 KiB write costs 1 (RAID0), 4 (RAID5: read data and
/// P, write both) or 6 (RAID6) drive I/Os.
fn bound(level: Level, write: bool) -> f64 {
    match (write, level) {
        (false, _) | (true, Level::Raid0) => 1.0,
        (true, Level::Raid5) => 0.25,
        (true, _) => 1.0 / 6.0,
    }
}

/// One table row: the array's sample `r` against the bare drives' `b`.
fn print_row(level: Level, write: bool, qd: usize, r: &Sample, b: &Sample) {
    print_job(level, rand_job(write), bound(level, write), qd, r, b);
}

/// The name of the 4 KiB random job.
fn rand_job(write: bool) -> &'static str {
    if write {
        "4k randwrite"
    } else {
        "4k randread"
    }
}

fn print_job(level: Level, job: &str, bound: f64, qd: usize, r: &Sample, b: &Sample) {
    let ratio = r.iops / b.iops;
    println!(
        "| {level} | {job} | {qd} | {:.0} | {:.0} | {ratio:.2}x | {bound:.2}x | {:.2} | {:.0} / {:.0} | {:.0} / {:.0} |",
        r.iops,
        b.iops,
        ratio / bound,
        r.p50_us,
        r.p99_us,
        b.p50_us,
        b.p99_us
    );
}

/// The levels the tables measure.
const LEVELS: [Level; 3] = [Level::Raid0, Level::Raid5, Level::Raid6];

/// Where the arrays' data starts on the drives: after the 16 MiB journal
/// ring a RAID5/6 of real NVMe drives (1 GiB and more) gets, though these
/// hold only `MEMBER_DATA` (the small ring of small members would bound
/// the degraded writes, waiting for room, where a drive would not).
const DATA_OFFSET: u64 = LARGE_RING_DATA_OFFSET;

fn drives(tag: &str) -> Vec<MemberRef> {
    sim_drives(tag)
        .into_iter()
        .map(|d| d as MemberRef)
        .collect()
}

fn sim_drives(tag: &str) -> Vec<Arc<SimNvme>> {
    common::sim_drives(tag, MEMBERS, DATA_OFFSET + MEMBER_DATA)
}

fn main() {
    common::small_pages();
    let quick = std::env::args().any(|a| a == "--quick");
    let dur = Duration::from_millis(if quick { 400 } else { 1500 });
    let depths: Vec<usize> = match std::env::var("BENCH_DEPTHS") {
        Ok(v) => v.split(',').filter_map(|d| d.trim().parse().ok()).collect(),
        Err(_) if quick => vec![1, 32, 128],
        Err(_) => vec![1, 4, 16, 64, 128, 256],
    };
    let model = NvmeModel::datacenter();
    eprintln!(
        "nvme bench: {MEMBERS} simulated drives ({} us read, {} us write, {} in service), 4 KiB random I/O, {} cores",
        model.read.as_micros(),
        model.write.as_micros(),
        model.queue,
        rayon::current_num_threads()
    );
    let bare = Bare(drives("bare"));
    let degraded_only = std::env::var("BENCH_DEGRADED_ONLY").is_ok();
    let only_async = degraded_only || std::env::var("BENCH_ASYNC_ONLY").is_ok();
    println!("\n| level | job | QD | array IOPS | bare IOPS | ratio | bound | of bound | array p50 / p99 us | bare p50 / p99 us |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for level in common::chosen(&LEVELS) {
        let a = common::array_at(drives(&format!("{level}-")), level, CHUNK, DATA_OFFSET);
        for write in [false, true] {
            if only_async {
                break;
            }
            for &qd in &depths {
                let b = run(&bare, write, qd, dur);
                let r = run(&a, write, qd, dur);
                print_row(level, write, qd, &r, &b);
            }
        }
    }
    // Reads and writes through the shards, many in flight from one thread.
    let cores = rayon::current_num_threads();
    println!("\n| level | job | QD | array (shards) IOPS | bare IOPS | ratio | bound | of bound | array p50 / p99 us | bare p50 / p99 us |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let bare_blocks = bare.size() / BS as u64;
    for level in common::chosen(&LEVELS) {
        let sims = sim_drives(&format!("{level}-async-"));
        let commands = || sims.iter().map(|d| d.commands()).sum::<u64>();
        let a = Arc::new(common::array_at(
            sims.iter().map(|d| d.clone() as MemberRef).collect(),
            level,
            CHUNK,
            DATA_OFFSET,
        ));
        // The first write marks the array dirty: the blocking path's.
        a.write(0, &AlignedBuf::new(BS)).unwrap();
        let blocks = a.capacity() / BS as u64;
        let shards = std::env::var("BENCH_SHARDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(cores);
        let e = raid_core::shard::Engine::start(a.clone(), shards).unwrap();
        let array_start = |write: bool, off: u64, done: Box<dyn FnOnce() + Send>| {
            if write {
                let mut b = AlignedBuf::new(BS);
                b[..8].copy_from_slice(&off.to_le_bytes());
                e.write(
                    off,
                    b,
                    Box::new(move |r| {
                        r.expect("a write");
                        done();
                    }),
                )
            } else {
                e.read(
                    off,
                    AlignedBuf::new(BS),
                    Box::new(move |r| {
                        r.expect("a read");
                        done();
                    }),
                )
            }
        };
        // A job at every depth: the bare drives, then the array, the same
        // I/O kept in flight the same way.
        // Returns the array's I/Os done.
        let at_depths = |write: bool, seq: bool, job: &str, bound: f64| {
            let mut ios = 0;
            for &qd in &depths {
                let b = bare_polled(&bare, write, bare_blocks, (qd, cores), dur, seq);
                let r = run_async(
                    &|off, done| array_start(write, off, done),
                    blocks,
                    qd,
                    dur,
                    seq,
                );
                print_job(level, job, bound, qd, &r, &b);
                ios += r.ios;
                // The same I/O given by front ends on the shards' own
                // threads (`shard::Client`), against the same bare run.
                if e.shard_count() > 0 {
                    let (lat, secs) = common::clients::on_shards(&e, write, blocks, qd, dur, seq);
                    let r = Sample::of(lat, secs);
                    let job = format!("{job}, front end on the shards");
                    print_job(level, &job, bound, qd, &r, &b);
                    ios += r.ios;
                }
            }
            ios
        };
        if !degraded_only {
            for write in [false, true] {
                at_depths(write, false, rand_job(write), bound(level, write));
            }
            // Small sequential writes: what waits for a stripe merges into
            // the write ahead of it, a full stripe at best ((N - parity) /
            // N of the bare drives' rate).
            let full = (MEMBERS - level.parity_chunks()) as f64 / MEMBERS as f64;
            at_depths(true, true, "4k seqwrite", full);
        }
        // Degraded: one drive failed. A read of its chunks reads the
        // stripe's other 7 instead, so a read costs 2 x 7/8 member reads on
        // average: the bound is 8/14 of the bare drives.
        if level != Level::Raid0 {
            a.fail_member(0, false).unwrap();
            let read_bound = MEMBERS as f64 / (2.0 * (MEMBERS - 1) as f64);
            at_depths(false, false, "4k randread, 1 drive failed", read_bound);
            // A degraded write is journaled: its new chunks written to
            // the journal of one drive in sync (RAID5; two for RAID6) and
            // flushed there before they are written in place. The bound printed is the optimal
            // write's; what matters is the ratio between two builds.
            let before = commands();
            let writes = at_depths(
                true,
                false,
                "4k randwrite, 1 drive failed",
                bound(level, true),
            );
            // Where the drives' command rate is the bound (real drives at
            // depth), this decides the rate: reads, the journal's writes
            // and flushes, the writes in place.
            eprintln!(
                "{level}: {:.2} drive commands per degraded 4 KiB write",
                (commands() - before) as f64 / writes as f64
            );
        }
        let io = a.io_stats();
        if io.journal_records > 0 {
            eprintln!(
                "{level}: {} journal records made durable in {} groups ({} of the missing chunks alone, {} flushes before a record of every column after one)",
                io.journal_records,
                io.journal_commits,
                io.journal_parity_records,
                io.journal_parity_barriers
            );
        }
        let c = e.counts();
        eprintln!(
            "{level}: shards served {} reads and {} writes themselves, the blocking path {} and {}; writes waited for room in the journal {} times",
            c.on_shards.load(Ordering::Relaxed),
            c.writes_on_shards.load(Ordering::Relaxed),
            c.blocking.load(Ordering::Relaxed),
            c.writes_blocking.load(Ordering::Relaxed),
            c.journal_waits.load(Ordering::Relaxed)
        );
    }
}
