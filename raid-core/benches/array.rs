//! Array engine benchmark: the array in-process over N RAM members, each
//! level, side by side with the same I/O sent straight to the bare members
//! in the same run. 4 KiB random read/write, 128 KiB sequential read/write,
//! full-stripe writes, degraded reads and rebuild rate (RAID5), a check-only
//! scrub (every level but RAID0). A second table:
//! 4 KiB random I/O through the blocking API against the shards, with the
//! CPU time each costs.
//!
//! `cargo bench -p raid-core --bench array [-- --quick] [-- --qd N]`
//! (BENCH_LEVEL=raid5 runs one level, BENCH_MEMBERS=N the members per
//! array, BENCH_WORK=randwrite the workloads of that name, BENCH_SHARDS_ONLY=1
//! the second table only, BENCH_SIDES=clients that table's clients only.)
//!
//! Queue depth is the number of threads submitting at once through the
//! blocking API, or, in the second table, the requests kept in flight
//! through the shards by one thread. RAM members make this a measure of the engine's own cost:
//! locking, planning, parity and copies, with no device latency to hide it.

mod common;

use raid_core::array::{Array, RebuildOptions, ScrubOptions};
use raid_core::buf::AlignedBuf;
use raid_core::layout::Level;
use raid_core::member::{MemberRef, RamMember};
use raid_core::metadata::MIN_DATA_OFFSET;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Members per array: 5, or BENCH_MEMBERS (at least 4). A RAID6 of 5 has 3
/// data chunks, where a 4 KiB write reconstructs (2 reads); from 7 members
/// on it reads old data and parity instead (read-modify-write).
fn members_n() -> usize {
    std::env::var("BENCH_MEMBERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5usize)
        .max(4)
}
const MEMBER_DATA: u64 = 256 << 20;
const CHUNK: u64 = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Work {
    RandRead4k,
    RandWrite4k,
    SeqRead128k,
    SeqWrite128k,
    FullStripeWrite,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::RandRead4k => "4k randread",
            Work::RandWrite4k => "4k randwrite",
            Work::SeqRead128k => "128k seqread",
            Work::SeqWrite128k => "128k seqwrite",
            Work::FullStripeWrite => "full-stripe write",
        }
    }
}

/// Something that takes block I/O: the array, or the bare members.
trait Target: Sync {
    fn size(&self) -> u64;
    fn read(&self, off: u64, buf: &mut [u8]);
    fn write(&self, off: u64, buf: &[u8]);
}

impl Target for Array {
    fn size(&self) -> u64 {
        self.capacity()
    }
    fn read(&self, off: u64, buf: &mut [u8]) {
        Array::read(self, off, buf).unwrap()
    }
    fn write(&self, off: u64, buf: &[u8]) {
        Array::write(self, off, buf).unwrap()
    }
}

/// The bare members as one address space, member after member: every
/// request goes to exactly one member, as RAID0 would at its best.
struct Bare(Vec<MemberRef>);
impl Bare {
    /// Member and byte offset; a request that would cross a member's end
    /// is pulled back inside it.
    fn place(&self, off: u64, len: usize) -> (usize, u64) {
        let m = (off / MEMBER_DATA) as usize;
        (
            m,
            MIN_DATA_OFFSET + (off % MEMBER_DATA).min(MEMBER_DATA - len as u64),
        )
    }
}
impl Target for Bare {
    fn size(&self) -> u64 {
        MEMBER_DATA * self.0.len() as u64
    }
    fn read(&self, off: u64, buf: &mut [u8]) {
        let (m, at) = self.place(off, buf.len());
        self.0[m].read_at(buf, at).unwrap()
    }
    fn write(&self, off: u64, buf: &[u8]) {
        let (m, at) = self.place(off, buf.len());
        self.0[m].write_at(buf, at).unwrap()
    }
}

/// What one run measured.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    iops: f64,
    mbs: f64,
    /// Process CPU time (user + system, every thread) per I/O, in
    /// microseconds: with RAM members this is the engine's whole cost, the
    /// figure that says how many I/Os per second one core can drive.
    cpu_us: f64,
}

impl Sample {
    /// `n` 4 KiB I/Os done in `secs`, the process's CPU time at the start
    /// `cpu0` (`cpu_seconds`).
    fn of_4k(n: u64, secs: f64, cpu0: f64) -> Sample {
        let n = n.max(1) as f64;
        Sample {
            iops: n / secs,
            mbs: n / secs * 4096.0 / 1e6,
            cpu_us: (cpu_seconds() - cpu0) / n * 1e6,
        }
    }
}

/// CPU time this process has used so far (user + system), in seconds.
fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointer it is given,
    // which points at a zeroed rusage owned by this frame.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Runs `work` from `qd` threads for `dur`.
fn run(t: &dyn Target, work: Work, bs: u64, qd: usize, dur: Duration) -> Sample {
    let ops = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let size = t.size() / bs * bs;
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    std::thread::scope(|sc| {
        for k in 0..qd {
            let (ops, stop) = (&ops, &stop);
            sc.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(k as u64 + 1);
                let mut buf = AlignedBuf::new(bs as usize);
                rng.fill(&mut buf[..]);
                // Sequential streams: each thread its own region.
                let region = size / qd as u64 / bs * bs;
                let mut seq = region * k as u64;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let off = match work {
                        Work::RandRead4k | Work::RandWrite4k => rng.gen_range(0..size / bs) * bs,
                        _ => {
                            let o = seq;
                            seq += bs;
                            if seq >= region * (k as u64 + 1) {
                                seq = region * k as u64;
                            }
                            o
                        }
                    };
                    match work {
                        Work::RandRead4k | Work::SeqRead128k => t.read(off, &mut buf),
                        _ => t.write(off, &buf),
                    }
                    n += 1;
                }
                ops.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
    });
    let secs = started.elapsed().as_secs_f64();
    let n = ops.load(Ordering::Relaxed).max(1) as f64;
    let iops = n / secs;
    Sample {
        iops,
        mbs: iops * bs as f64 / 1e6,
        cpu_us: (cpu_seconds() - cpu0) / n * 1e6,
    }
}

fn members(tag: &str) -> Vec<MemberRef> {
    (0..members_n())
        .map(|i| {
            Arc::new(RamMember::new(
                format!("ram:{tag}{i}"),
                MIN_DATA_OFFSET + MEMBER_DATA,
            )) as MemberRef
        })
        .collect()
}

/// An array of `level` over fresh RAM members named from `tag`, every
/// block written once (so reads touch real data).
fn filled_array(level: Level, tag: &str) -> Array {
    let a = common::array(members(tag), level, CHUNK);
    a.write(0, &vec![0x5a; a.capacity() as usize]).unwrap();
    a
}

/// BENCH_WORK=randwrite (say) runs the workloads whose name holds it only,
/// so that a profiler sees one workload.
fn chosen_work(w: Work) -> bool {
    chosen(w.name())
}

/// The same filter for the sections after the workloads ("degraded",
/// "rebuild", "scrub", "shards"): BENCH_WORK=rebuild profiles the rebuild
/// alone.
fn chosen(name: &str) -> bool {
    std::env::var("BENCH_WORK").map_or(true, |only| name.contains(only.as_str()))
}

fn block_size(work: Work, a: Option<&Array>) -> u64 {
    match work {
        Work::RandRead4k | Work::RandWrite4k => 4096,
        Work::SeqRead128k | Work::SeqWrite128k => 128 * 1024,
        Work::FullStripeWrite => a
            .map(|a| a.geometry().stripe_data_bytes())
            .unwrap_or(CHUNK * (members_n() as u64 - 1)),
    }
}

fn main() {
    common::small_pages();
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let qd: usize = args
        .iter()
        .position(|a| a == "--qd")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let dur = Duration::from_millis(if quick { 300 } else { 1500 });
    eprintln!(
        "array bench: {} RAM members of {} MiB, chunk {} KiB, QD {qd} (threads), {} cores",
        members_n(),
        MEMBER_DATA >> 20,
        CHUNK >> 10,
        rayon::current_num_threads()
    );

    let bare = Bare(members("bare"));
    // Pre-fill so reads touch real data.
    for m in &bare.0 {
        m.write_at(&vec![0x5a; MEMBER_DATA as usize], MIN_DATA_OFFSET)
            .unwrap();
    }
    let works = [
        Work::RandRead4k,
        Work::RandWrite4k,
        Work::SeqRead128k,
        Work::SeqWrite128k,
        Work::FullStripeWrite,
    ];
    let rounds = if quick { 1 } else { 3 };
    // Median over rounds that alternate the bare members and the array, so a
    // noisy neighbour on this shared machine hits both sides alike.
    let side_by_side = |a: &Array, w: Work| -> (Sample, Sample) {
        let bs = block_size(w, Some(a));
        let mut ar = Vec::new();
        let mut br = Vec::new();
        for _ in 0..rounds {
            br.push(run(&bare, w, bs, qd, dur));
            ar.push(run(a, w, bs, qd, dur));
        }
        (median(ar), median(br))
    };

    // BENCH_LEVEL=raid5 (say) runs one level only; BENCH_SHARDS_ONLY=1
    // the second table only.
    if std::env::var("BENCH_SHARDS_ONLY").is_ok() {
        return shards_table(qd, dur, rounds);
    }
    println!(
        "\n| level | workload | array IOPS | array MB/s | bare IOPS | bare MB/s | ratio | array CPU us/IO | bare CPU us/IO | target |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut raid5_randread = 0.0;
    for level in common::chosen(&Level::ALL) {
        let a = filled_array(level, &format!("{level}-"));
        let nd = a.geometry().data_chunks() as f64;
        for w in works {
            if w == Work::FullStripeWrite && !matches!(level, Level::Raid5 | Level::Raid6) {
                continue;
            }
            if !chosen_work(w) {
                continue;
            }
            let (r, b) = side_by_side(&a, w);
            eprintln!(
                "  {level:<14} {:<18} {:>10.0} IOPS {:>8.0} MB/s (bare {:>10.0} IOPS)",
                w.name(),
                r.iops,
                r.mbs,
                b.iops
            );
            let ratio = r.mbs / b.mbs;
            let target = match (level, w) {
                (Level::Raid0, Work::RandRead4k) => format!(">= 0.9x bare: {}", ok(ratio >= 0.9)),
                (Level::Raid5, Work::FullStripeWrite) => {
                    let want = 0.8 * nd / members_n() as f64;
                    format!(">= {want:.2}x bare (0.8 x (N-1)/N): {}", ok(ratio >= want))
                }
                (Level::Raid5, Work::RandWrite4k) => {
                    format!(">= 0.20x bare (0.8 x 1/4): {}", ok(ratio >= 0.2))
                }
                (Level::Raid6, Work::FullStripeWrite) => {
                    let want = 0.75 * nd / members_n() as f64;
                    format!(">= {want:.2}x bare (0.75 x (N-2)/N): {}", ok(ratio >= want))
                }
                (Level::Raid6, Work::RandWrite4k) => {
                    format!(">= 0.13x bare (0.8 x 1/6): {}", ok(ratio >= 0.8 / 6.0))
                }
                (Level::Raid1, Work::RandWrite4k | Work::SeqWrite128k) => {
                    format!("at most 1/{}: every member takes every write", members_n())
                }
                (Level::Raid10, Work::RandWrite4k | Work::SeqWrite128k) => {
                    "at most 0.5x: two copies".to_string()
                }
                _ => String::new(),
            };
            if level == Level::Raid5 && w == Work::RandRead4k {
                raid5_randread = r.iops;
            }
            println!(
                "| {level} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2}x | {:.1} | {:.1} | {target} |",
                w.name(),
                r.iops,
                r.mbs,
                b.iops,
                b.mbs,
                ratio,
                r.cpu_us,
                b.cpu_us
            );
        }
        if level == Level::Raid5 {
            // Degraded reads: one member failed, against the optimal array
            // measured in alternation with it on a twin array.
            a.fail_slot(2, "bench");
            if chosen("degraded") {
                let twin = filled_array(level, "raid5-twin-");
                let (mut dr, mut or) = (Vec::new(), Vec::new());
                for _ in 0..rounds {
                    or.push(run(&twin, Work::RandRead4k, 4096, qd, dur));
                    dr.push(run(&a, Work::RandRead4k, 4096, qd, dur));
                }
                let (d, o) = (median(dr), median(or));
                let ratio = d.iops / o.iops;
                let _ = raid5_randread;
                println!(
                    "| raid5 degraded | 4k randread | {:.0} | {:.0} | {:.0} (optimal) | {:.0} | {ratio:.2}x | {:.1} | {:.1} (optimal) | >= 0.5x optimal: {} |",
                    d.iops,
                    d.mbs,
                    o.iops,
                    o.mbs,
                    d.cpu_us,
                    o.cpu_us,
                    ok(ratio >= 0.5)
                );
                // Degraded writes pay for the journal (a record on every
                // present member, flushed, before the write in place).
                let (mut dw, mut ow) = (Vec::new(), Vec::new());
                for _ in 0..rounds {
                    ow.push(run(&twin, Work::RandWrite4k, 4096, qd, dur));
                    dw.push(run(&a, Work::RandWrite4k, 4096, qd, dur));
                }
                let (d, o) = (median(dw), median(ow));
                println!(
                    "| raid5 degraded | 4k randwrite (journaled) | {:.0} | {:.0} | {:.0} (optimal) | {:.0} | {:.2}x | {:.1} | {:.1} (optimal) | cost of the journal |",
                    d.iops,
                    d.mbs,
                    o.iops,
                    o.mbs,
                    d.iops / o.iops,
                    d.cpu_us,
                    o.cpu_us
                );
            }
            if chosen("rebuild") {
                // Rebuild onto a fresh member, idle, against one member's
                // sequential write rate: one batch at a time, then the default
                // (batches side by side on the cores), each onto a new member.
                let new: MemberRef = Arc::new(RamMember::new(
                    "ram:rebuild-new",
                    MIN_DATA_OFFSET + MEMBER_DATA,
                ));
                let one = Bare(vec![new.clone()]);
                let seq1 = run(&one, Work::SeqWrite128k, 1 << 20, 1, dur).mbs;
                let serial = RebuildOptions {
                    parallel: 1,
                    ..Default::default()
                };
                for (i, opts) in [serial, RebuildOptions::default()].iter().enumerate() {
                    if i > 0 {
                        a.fail_member(2, false).unwrap();
                    }
                    let new: MemberRef = Arc::new(RamMember::new(
                        format!("ram:rebuild-new{i}"),
                        MIN_DATA_OFFSET + MEMBER_DATA,
                    ));
                    // Touched first, as the baseline's member is by its
                    // earlier passes: a drive has no first-touch cost, and
                    // a RAM member's page faults would be most of the time.
                    new.write_at(&vec![0; MEMBER_DATA as usize], MIN_DATA_OFFSET)
                        .unwrap();
                    a.replace(2, new).unwrap();
                    let t = Instant::now();
                    a.rebuild(2, opts, &AtomicBool::new(false)).unwrap();
                    let rate = MEMBER_DATA as f64 / t.elapsed().as_secs_f64() / 1e6;
                    let ratio = rate / seq1;
                    println!(
                        "| raid5 rebuild | idle, 1 member, {} batch(es) at once | - | {rate:.0} | - | {seq1:.0} (1 member seq write) | {ratio:.2}x | - | - | >= 0.5x: {} |",
                        opts.parallel,
                        ok(ratio >= 0.5)
                    );
                }
            }
        }
        if chosen("scrub") && a.state() != raid_core::array::ArrayState::Optimal {
            // The rebuild above did not run (BENCH_WORK): a scrub needs
            // every member in sync.
            let new = RamMember::new("ram:scrub-new", MIN_DATA_OFFSET + MEMBER_DATA);
            a.replace(2, Arc::new(new)).unwrap();
            a.rebuild(2, &RebuildOptions::default(), &AtomicBool::new(false))
                .unwrap();
        }
        if chosen("scrub") && level != Level::Raid0 {
            // A check-only scrub, idle: member bytes read per second against
            // the bare members' 128 KiB sequential reads (every member at
            // once, like the scrub).
            // One run at a time, then the default (runs side by side).
            let seq = run(&bare, Work::SeqRead128k, 128 * 1024, qd, dur).mbs;
            let serial = ScrubOptions {
                parallel: 1,
                ..Default::default()
            };
            for opts in [serial, ScrubOptions::default()] {
                let t = Instant::now();
                let r = a.scrub(&opts, &AtomicBool::new(false)).unwrap();
                assert!(r.mismatches.is_empty());
                let rate = r.bytes_read as f64 / t.elapsed().as_secs_f64() / 1e6;
                println!(
                    "| {level} scrub | idle, check, {} run(s) at once | - | {rate:.0} | - | {seq:.0} (bare seq read) | {:.2}x | - | - | - |",
                    opts.parallel,
                    rate / seq
                );
            }
        }
    }
    if chosen("shards") {
        shards_table(qd, dur, rounds);
    }
}

/// Keeps `qd` 4 KiB random reads or writes in flight on the shards from
/// this one thread for `dur`; the buffers go round.
fn run_shards(
    e: &raid_core::shard::Engine,
    write: bool,
    blocks: u64,
    qd: usize,
    dur: Duration,
) -> Sample {
    let (tx, rx) = std::sync::mpsc::channel::<AlignedBuf>();
    let mut rng = SmallRng::seed_from_u64(qd as u64 + 3);
    let mut spare: Vec<AlignedBuf> = Vec::new();
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let mut n = 0u64;
    let mut in_flight = 0;
    loop {
        while in_flight < qd && started.elapsed() < dur {
            let off = rng.gen_range(0..blocks) * 4096;
            let tx = tx.clone();
            let done = Box::new(move |r: Result<AlignedBuf, raid_core::array::ArrayError>| {
                let _ = tx.send(r.expect("array I/O"));
            });
            let buf = spare.pop().unwrap_or_else(|| AlignedBuf::new(4096));
            match write {
                true => e.write(off, buf, done),
                false => e.read(off, buf, done),
            }
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        spare.push(rx.recv().expect("a completion"));
        in_flight -= 1;
        n += 1;
    }
    Sample::of_4k(n, started.elapsed().as_secs_f64(), cpu0)
}

/// `qd` 4 KiB random reads or writes kept in flight for `dur` by a client
/// on each shard (`shard::Client`): no thread crossed to give a request or
/// to take its completion.
fn run_clients(
    e: &raid_core::shard::Engine,
    write: bool,
    blocks: u64,
    qd: usize,
    dur: Duration,
) -> Sample {
    let cpu0 = cpu_seconds();
    let (lat, secs) = common::clients::on_shards(e, write, blocks, qd, dur, false);
    Sample::of_4k(lat.len() as u64, secs, cpu0)
}

/// The engine's own cost per 4 KiB I/O, RAM members under it: `qd`
/// threads through the blocking API against `qd` in flight from one
/// thread through the shards (one per core), and `qd` in flight from
/// clients on the shards themselves, alternating, median of `rounds`.
fn shards_table(qd: usize, dur: Duration, rounds: usize) {
    println!("\n| level | workload | threads IOPS | threads CPU us/IO | shards IOPS | shards CPU us/IO | shards / threads | clients on the shards IOPS | their CPU us/IO | clients / threads |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for level in common::chosen(&Level::ALL) {
        let a = Arc::new(filled_array(level, &format!("{level}-shards-")));
        let e = raid_core::shard::Engine::start(a.clone(), rayon::current_num_threads()).unwrap();
        let blocks = a.capacity() / 4096;
        for w in [Work::RandRead4k, Work::RandWrite4k] {
            if !chosen_work(w) {
                continue;
            }
            let write = w == Work::RandWrite4k;
            let (mut tr, mut sr, mut cr) = (Vec::new(), Vec::new(), Vec::new());
            // BENCH_SIDES=clients (say) runs those columns only (zeros
            // in the others): a shorter run, so more rounds fit.
            let sides = std::env::var("BENCH_SIDES").ok();
            let side = |name: &str, f: &dyn Fn() -> Sample| match &sides {
                Some(only) if !only.contains(name) => Sample::default(),
                _ => f(),
            };
            for _ in 0..rounds {
                tr.push(side("threads", &|| run(a.as_ref(), w, 4096, qd, dur)));
                sr.push(side("shards", &|| run_shards(&e, write, blocks, qd, dur)));
                cr.push(side("clients", &|| run_clients(&e, write, blocks, qd, dur)));
            }
            let (t, s, c) = (median(tr), median(sr), median(cr));
            println!(
                "| {level} | {} | {:.0} | {:.1} | {:.0} | {:.1} | {:.2}x | {:.0} | {:.1} | {:.2}x |",
                w.name(),
                t.iops,
                t.cpu_us,
                s.iops,
                s.cpu_us,
                s.iops / t.iops,
                c.iops,
                c.cpu_us,
                c.iops / t.iops
            );
        }
    }
}

fn median(mut v: Vec<Sample>) -> Sample {
    v.sort_by(|a, b| a.mbs.partial_cmp(&b.mbs).unwrap());
    v[v.len() / 2]
}

fn ok(b: bool) -> &'static str {
    if b {
        "met"
    } else {
        "NOT met"
    }
}
