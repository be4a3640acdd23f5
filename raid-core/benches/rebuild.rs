//! How fast does a rebuild fill a new drive? The array over simulated NVMe
//! drives whose bandwidth is limited as well as their latency
//! (`NvmeModel::with_bandwidth`), one drive failed and replaced, rebuilt
//! idle, then another hot-replaced (copied onto a new drive), against the
//! new drive's own sequential write rate under the same model, in the same
//! run.
//!
//! A rebuild reads every other drive and writes the new one, so on real
//! drives the new drive's write bandwidth is the bound; RAM members cannot
//! show that (there the copies are the bound, `benches/array.rs`), and
//! neither can drives with latency alone (their bandwidth is unlimited).
//! The bandwidths default to a datacenter drive's (6.8 GB/s read, 5.3
//! GB/s write) scaled down 8 times, so that this machine's cores, which
//! move every byte in memory, are not the bound: the ratio is what counts.
//!
//! `cargo bench -p raid-core --bench rebuild` (BENCH_LEVEL=raid5 one
//! level of raid5, raid6 and raid10; BENCH_READ_MBS and BENCH_WRITE_MBS the drives' bandwidth in MB/s;
//! BENCH_PARALLEL=1,2,4 the rebuild's runs side by side to measure;
//! BENCH_STEP_KIB the runs' step, `RebuildOptions::step_bytes`;
//! BENCH_BATCH_ROWS the rows of a run, `RebuildOptions::batch_rows`;
//! BENCH_UNDER_WRITES=1 keeps 16 random 4 KiB writes in flight through the
//! shards while the rebuild (and then the hot replace's copy) runs, with a
//! flush every 64, as a filesystem on the array would: it prints their
//! rate, their latencies and where they ran, beside the same writes for
//! half a second before the job starts; then the same writes during a
//! check-only scrub of the array, with the scrub's read rate; BENCH_RESYNC=1
//! times only the resync of every region after an unclean stop, RAID5,
//! RAID6 and RAID10, resynced before the array serves and then while it
//! serves, as the daemon starts it, then random 4 KiB reads before its
//! resync is started and after it ended, through the shards and through
//! `Array::read` (BENCH_READ_MS each, 1500 by default); with
//! BENCH_RESYNC_DIR=DIR, instead, the resync of an array on sparse member
//! files in DIR, a block written every 1 MiB.)

mod common;

use common::{env_u64, Sample};
use raid_core::array::{RebuildOptions, ScrubOptions};
use raid_core::layout::Level;
use raid_core::member::{submit, IoOp, MemberIo, MemberRef, NvmeModel, SimNvme};
use raid_core::metadata::LARGE_RING_DATA_OFFSET;
use raid_core::shard::Engine;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const MEMBERS: usize = 8;
const MEMBER_DATA: u64 = 256 << 20;
const CHUNK: u64 = 64 * 1024;
/// After the journal ring of large drives, as in `benches/nvme.rs`.
const DATA_OFFSET: u64 = LARGE_RING_DATA_OFFSET;

fn drive(name: String, model: NvmeModel) -> MemberRef {
    Arc::new(SimNvme::new(name, DATA_OFFSET + MEMBER_DATA, model))
}

/// The new drive's sequential write rate in MB/s: `MEMBER_DATA` in 1 MiB
/// writes, 8 in flight at a time (more than the rebuild keeps).
fn seq_write_mbs(d: &MemberRef) -> f64 {
    let buf = vec![0x5au8; 1 << 20];
    let t = Instant::now();
    let mut off = 0;
    while off < MEMBER_DATA {
        let mut ios: Vec<MemberIo> = (0..8)
            .map(|i| MemberIo {
                member: 0,
                offset: DATA_OFFSET + off + i * (1 << 20),
                op: IoOp::Write(&buf),
            })
            .take_while(|io| io.offset < DATA_OFFSET + MEMBER_DATA)
            .collect();
        off += ios.len() as u64 * (1 << 20);
        for r in submit(std::slice::from_ref(d), &mut ios) {
            r.unwrap();
        }
    }
    MEMBER_DATA as f64 / t.elapsed().as_secs_f64() / 1e6
}

/// The job's options: `parallel` runs side by side, the step and the
/// rows of a run from BENCH_STEP_KIB and BENCH_BATCH_ROWS where given.
fn options(parallel: usize) -> RebuildOptions {
    let d = RebuildOptions::default();
    RebuildOptions {
        parallel,
        step_bytes: env_u64("BENCH_STEP_KIB", d.step_bytes >> 10) << 10,
        batch_rows: env_u64("BENCH_BATCH_ROWS", d.batch_rows),
        ..d
    }
}

/// Random 4 KiB writes through `e`, 16 in flight, the array flushed after
/// every 64, until `stop`: their rate and latencies.
fn client_writes(e: &Engine, capacity: u64, stop: &AtomicBool) -> Sample {
    let (tx, rx) = mpsc::channel();
    let mut lat = Vec::new();
    let mut rng = 0x9e3779b97f4a7c15u64;
    let blocks = capacity / 4096;
    let t = Instant::now();
    while !stop.load(Ordering::Acquire) {
        for _ in 0..64 / 16 {
            for _ in 0..16 {
                let tx = tx.clone();
                let buf = raid_core::buf::AlignedBuf::new(4096);
                let t0 = Instant::now();
                e.write(
                    (next_random(&mut rng) % blocks) * 4096,
                    buf,
                    Box::new(move |r| tx.send((r.is_ok(), t0.elapsed())).unwrap()),
                );
            }
            for _ in 0..16 {
                let (ok, took) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
                assert!(ok, "a write failed");
                lat.push(took.as_micros().min(u32::MAX as u128) as u32);
            }
        }
        let (ftx, frx) = mpsc::channel();
        e.flush(Box::new(move |r| ftx.send(r.is_ok()).unwrap()));
        assert!(
            frx.recv_timeout(Duration::from_secs(30)).unwrap(),
            "a flush failed"
        );
    }
    Sample::of(lat, t.elapsed().as_secs_f64())
}

/// A client-writes line's rate and latencies.
fn said(s: &Sample) -> String {
    format!(
        "{:.0} writes/s, p50 {:.0} us, p99 {:.0} us, max {:.0} us",
        s.iops, s.p50_us, s.p99_us, s.max_us
    )
}

/// Writes the shards served, and those they handed to the blocking path.
fn where_ran(e: &Engine) -> (u64, u64) {
    let c = e.counts();
    (
        c.writes_on_shards.load(Ordering::Relaxed),
        c.writes_blocking.load(Ordering::Relaxed),
    )
}

/// Writes every byte of `a` once, 64 MiB at a time.
fn write_whole(a: &raid_core::array::Array) {
    let piece = vec![0xa5u8; 64 << 20];
    let mut off = 0;
    while off < a.capacity() {
        let n = (a.capacity() - off).min(piece.len() as u64) as usize;
        a.write(off, &piece[..n]).unwrap();
        off += n as u64;
    }
}

/// The resync an unclean stop leaves: an array of `level` on fresh drives
/// written whole (every region of its write-intent bitmap marked), dropped
/// without a stop, and assembled again, which resyncs every region before
/// it returns. Prints the time and the member bytes read per second.
fn resync_after_an_unclean_stop(level: Level, model: NvmeModel) {
    let members: Vec<MemberRef> = (0..MEMBERS)
        .map(|i| drive(format!("sim:{level}-resync{i}"), model))
        .collect();
    crash_written_whole(&members, level);
    let t = Instant::now();
    let asm = raid_core::array::Array::assemble(members.clone()).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let read = (MEMBERS as u64 * MEMBER_DATA) as f64 / secs / 1e6;
    eprintln!("  {level} resync of every region after an unclean stop: {secs:.2} s, {read:.0} MB/s of members read");
    asm.array.close().unwrap();
    // The daemon's way: served at once, the resync in the background.
    crash_written_whole(&members, level);
    let t = Instant::now();
    let a = Arc::new(assembled_owing(members));
    let mut block = vec![0u8; 4096];
    a.read(a.capacity() / 2, &mut block).unwrap();
    let served = t.elapsed().as_secs_f64();
    resync_to_its_end(&a);
    let resynced = t.elapsed().as_secs_f64();
    eprintln!("  {level} served in the background's way: a 4 KiB read answered {:.1} ms after the start began, the resync over {resynced:.2} s after it", served * 1e3);
    a.close().unwrap();
    reads_while_owed(level, model);
}

/// An array of `level` made on `members`, written whole (every region of
/// its write-intent bitmap marked) and dropped without a stop: a crash.
fn crash_written_whole(members: &[MemberRef], level: Level) {
    let a = common::array_at(members.to_vec(), level, CHUNK, DATA_OFFSET);
    write_whole(&a);
}

/// The next of a xorshift sequence from `rng` (not 0): offsets that
/// differ from run to run of a job no more than its seed says.
fn next_random(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

/// `members`, stopped uncleanly, assembled the daemon's way: served at
/// once, the resync owed.
fn assembled_owing(members: Vec<MemberRef>) -> raid_core::array::Array {
    let opts = raid_core::array::AssembleOptions {
        resync: raid_core::array::ResyncAt::Background,
        ..Default::default()
    };
    raid_core::array::Array::assemble_with(members, opts)
        .unwrap()
        .array
}

/// Starts the resync `a` owes on its own thread, and waits for its end.
fn resync_to_its_end(a: &Arc<raid_core::array::Array>) {
    a.kick_resync();
    while a.resync_owed() {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Client reads while a resync is owed and has not passed them, against
/// the same reads once it is over: an array of `level` written whole and
/// dropped without a stop, assembled the daemon's way, random 4 KiB reads
/// through the shards (32 in flight) before its resync is started, then
/// after it ran to its end. Prints both rates and where the reads ran.
fn reads_while_owed(level: Level, model: NvmeModel) {
    let members: Vec<MemberRef> = (0..MEMBERS)
        .map(|i| drive(format!("sim:{level}-owed{i}"), model))
        .collect();
    crash_written_whole(&members, level);
    let a = Arc::new(assembled_owing(members));
    let e = Engine::start(a.clone(), rayon::current_num_threads()).unwrap();
    let dur = Duration::from_millis(env_u64("BENCH_READ_MS", 1500));
    let blocking = || e.counts().blocking.load(Ordering::Relaxed);
    let owed = client_reads(&e, a.capacity(), 32, dur);
    let owed_blocking = blocking();
    // The blocking API's reads, from 32 threads (what the FUSE export
    // does): the path the shards hand every read they cannot serve.
    let owed_threads = thread_reads(&a, 32, dur);
    resync_to_its_end(&a);
    let after = client_reads(&e, a.capacity(), 32, dur);
    let after_threads = thread_reads(&a, 32, dur);
    eprintln!(
        "  {level} 4 KiB random reads, 32 in flight through the shards: {:.0}/s (p99 {:.0} us) while the resync is owed, {:.0}/s (p99 {:.0} us) after it, {:.2}x; {owed_blocking} of the first on the blocking path, {} of the second",
        owed.iops,
        owed.p99_us,
        after.iops,
        after.p99_us,
        owed.iops / after.iops,
        blocking() - owed_blocking
    );
    eprintln!(
        "  {level} the same from 32 threads through Array::read: {:.0}/s (p99 {:.0} us) while owed, {:.0}/s (p99 {:.0} us) after, {:.2}x",
        owed_threads.iops,
        owed_threads.p99_us,
        after_threads.iops,
        after_threads.p99_us,
        owed_threads.iops / after_threads.iops
    );
    drop(e);
    a.close().unwrap();
}

/// Random 4 KiB reads through the blocking `Array::read`, from `threads`
/// threads for `dur`.
fn thread_reads(a: &raid_core::array::Array, threads: usize, dur: Duration) -> Sample {
    let blocks = a.capacity() / 4096;
    let (lat, secs) = common::timed_loops(
        threads,
        dur,
        |k| {
            let buf = raid_core::buf::AlignedBuf::new(4096);
            (
                0x9e3779b97f4a7c15u64 ^ (k as u64 + 1).wrapping_mul(0x2545f4914f6cdd1d),
                buf,
            )
        },
        |(rng, buf)| {
            a.read((next_random(rng) % blocks) * 4096, buf).unwrap();
        },
    );
    Sample::of(lat, secs)
}

/// The resync after an unclean stop of an array of `level` on four sparse
/// member files of 1 GiB in `dir` (opened as the daemon opens them), a 4
/// KiB block written every 1 MiB of the array (every region of its bitmap
/// marked, each mostly holes, as under a new filesystem): prints the
/// resync's time and the member bytes it read.
fn resync_of_sparse_files(level: Level, dir: &std::path::Path) {
    let dir = dir.join(format!("resync-{level}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let paths: Vec<_> = (0..4).map(|i| dir.join(format!("m{i}.img"))).collect();
    for p in &paths {
        std::fs::File::create(p).unwrap().set_len(1 << 30).unwrap();
    }
    let open = || -> Vec<MemberRef> {
        paths
            .iter()
            .map(|p| Arc::new(raid_core::member::FileMember::open(p).unwrap()) as MemberRef)
            .collect()
    };
    let a = common::array(open(), level, CHUNK);
    let block = raid_core::buf::AlignedBuf::new(4096);
    for off in (0..a.capacity()).step_by(1 << 20) {
        a.write(off, &block).unwrap();
    }
    a.flush().unwrap();
    drop(a);
    let a = assembled_owing(open());
    let read = |a: &raid_core::array::Array| -> u64 {
        a.io_stats().members.iter().map(|m| m.io.read.bytes).sum()
    };
    let regions = a.resync_progress().map_or(0, |p| p.regions_total);
    let (before, t) = (read(&a), Instant::now());
    a.run_resync().unwrap();
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "  {level} resync of {regions} regions on sparse files: {secs:.2} s, {} MiB of members read",
        (read(&a) - before) >> 20
    );
    a.close().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Random 4 KiB reads through `e`, `qd` in flight, for `dur`: their rate
/// and latencies.
fn client_reads(e: &Engine, capacity: u64, qd: usize, dur: Duration) -> Sample {
    let (tx, rx) = mpsc::channel();
    let mut lat = Vec::new();
    let mut rng = 0x2545f4914f6cdd1du64;
    let blocks = capacity / 4096;
    let issue = |rng: &mut u64| {
        let tx = tx.clone();
        let t0 = Instant::now();
        e.read(
            (next_random(rng) % blocks) * 4096,
            raid_core::buf::AlignedBuf::new(4096),
            Box::new(move |r| tx.send((r.is_ok(), t0.elapsed())).unwrap()),
        );
    };
    let t = Instant::now();
    for _ in 0..qd {
        issue(&mut rng);
    }
    while t.elapsed() < dur {
        let (ok, took) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(ok, "a read failed");
        lat.push(took.as_micros().min(u32::MAX as u128) as u32);
        issue(&mut rng);
    }
    let secs = t.elapsed().as_secs_f64();
    for _ in 0..qd {
        rx.recv_timeout(Duration::from_secs(30)).unwrap();
    }
    Sample::of(lat, secs)
}

fn main() {
    common::small_pages();
    let under_writes = std::env::var("BENCH_UNDER_WRITES").is_ok_and(|v| v == "1");
    let model = common::bandwidth_model();
    if std::env::var("BENCH_RESYNC").is_ok_and(|v| v == "1") {
        let sparse = std::env::var("BENCH_RESYNC_DIR").ok();
        for level in common::chosen(&[Level::Raid5, Level::Raid6, Level::Raid10]) {
            match &sparse {
                Some(dir) => resync_of_sparse_files(level, std::path::Path::new(dir)),
                None => resync_after_an_unclean_stop(level, model),
            }
        }
        return;
    }
    let parallel: Vec<usize> = std::env::var("BENCH_PARALLEL")
        .ok()
        .map(|v| v.split(',').filter_map(|p| p.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, RebuildOptions::default().parallel, 4]);
    eprintln!(
        "rebuild bench: {MEMBERS} simulated drives of {} MiB ({}), chunk {} KiB, {} cores",
        MEMBER_DATA >> 20,
        common::model_in_words(&model),
        CHUNK >> 10,
        rayon::current_num_threads()
    );
    println!(
        "\n| level, job | runs at once | MB/s | new drive's seq write MB/s | ratio | target |"
    );
    println!("|---|---|---|---|---|---|");
    for level in common::chosen(&[Level::Raid5, Level::Raid6, Level::Raid10]) {
        let members = (0..MEMBERS)
            .map(|i| drive(format!("sim:{level}-{i}"), model))
            .collect();
        let a = Arc::new(common::array_at(members, level, CHUNK, DATA_OFFSET));
        // Every byte written once, so the rebuild reads real data.
        write_whole(&a);
        // A rebuild (slot 2 failed, then replaced), then a hot replace's
        // copy (slot 3: one drive read, the new one written).
        for hot in [false, true] {
            for (i, &p) in parallel.iter().enumerate() {
                let new = drive(format!("sim:{level}-new{hot}{i}"), model);
                // Touched first: a drive has no first-touch cost, RAM has.
                new.write_at(&vec![0; MEMBER_DATA as usize], DATA_OFFSET)
                    .unwrap();
                let seq = seq_write_mbs(&new);
                match hot {
                    false => {
                        a.fail_member(2, false).unwrap();
                        a.replace(2, new).unwrap();
                    }
                    true => a.hot_replace(3, new).unwrap(),
                }
                let (opts, stop) = (options(p), AtomicBool::new(false));
                let job = if hot { "hot replace" } else { "rebuild" };
                let writes = under_writes.then(|| Engine::start(a.clone(), 2).unwrap());
                if let Some(e) = &writes {
                    // The same writes with no job running (for a rebuild,
                    // the slot still to rebuild: every write journaled),
                    // for their latency beside the job's.
                    let stop = AtomicBool::new(false);
                    let s = std::thread::scope(|sc| {
                        let w = sc.spawn(|| client_writes(e, a.capacity(), &stop));
                        std::thread::sleep(Duration::from_millis(500));
                        stop.store(true, Ordering::Release);
                        w.join().unwrap()
                    });
                    eprintln!("  {level}, no {job} running, the same writes: {}", said(&s));
                }
                // Where the writes ran, counted from here on.
                let before = writes.as_ref().map_or((0, 0), where_ran);
                let rebuilt = AtomicBool::new(false);
                let t = Instant::now();
                let clients = std::thread::scope(|sc| {
                    let w = writes
                        .as_ref()
                        .map(|e| sc.spawn(|| client_writes(e, a.capacity(), &rebuilt)));
                    match hot {
                        false => a.rebuild(2, &opts, &stop).unwrap(),
                        true => a.hot_replace_copy(&opts, &stop).unwrap(),
                    };
                    rebuilt.store(true, Ordering::Release);
                    w.map(|w| w.join().unwrap())
                });
                let rate = MEMBER_DATA as f64 / t.elapsed().as_secs_f64() / 1e6;
                if let (Some(e), Some(s)) = (&writes, clients) {
                    let (on, off) = where_ran(e);
                    let (on, off) = (on - before.0, off - before.1);
                    eprintln!(
                        "  {level} {job}, {p} at once, under writes: {}, {on} on the shards, {off} on the blocking path ({:.0}%)",
                        said(&s),
                        100.0 * off as f64 / (on + off).max(1) as f64
                    );
                }
                let ratio = rate / seq;
                let target = match hot {
                    false => format!(">= 0.5x: {}", if ratio >= 0.5 { "met" } else { "NOT met" }),
                    true => "-".to_string(),
                };
                println!("| {level} {job} | {p} | {rate:.0} | {seq:.0} | {ratio:.2}x | {target} |");
            }
        }
        // Then a check-only scrub of the array, optimal again, under the
        // same writes where asked.
        if under_writes {
            let e = Engine::start(a.clone(), 2).unwrap();
            let before = where_ran(&e);
            let (done, t) = (AtomicBool::new(false), Instant::now());
            let (report, clients) = std::thread::scope(|sc| {
                let w = sc.spawn(|| client_writes(&e, a.capacity(), &done));
                let opts = ScrubOptions::default();
                let r = a.scrub(&opts, &AtomicBool::new(false)).unwrap();
                done.store(true, Ordering::Release);
                (r, w.join().unwrap())
            });
            let rate = report.bytes_read as f64 / t.elapsed().as_secs_f64() / 1e6;
            let (on, off) = where_ran(&e);
            eprintln!(
                "  {level} scrub, under writes: {}, {} on the shards, {} on the blocking path; scrub read {rate:.0} MB/s",
                said(&clients),
                on - before.0,
                off - before.1
            );
        }
    }
}
