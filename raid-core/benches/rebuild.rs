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
//! `cargo bench -p raid-core --bench rebuild` (BENCH_LEVEL=raid5 one level;
//! BENCH_READ_MBS and BENCH_WRITE_MBS the drives' bandwidth in MB/s;
//! BENCH_PARALLEL=1,2,4 the rebuild's runs side by side to measure;
//! BENCH_STEP_KIB the runs' step, `RebuildOptions::step_bytes`;
//! BENCH_BATCH_ROWS the rows of a run, `RebuildOptions::batch_rows`.)

mod common;

use raid_core::array::RebuildOptions;
use raid_core::layout::Level;
use raid_core::member::{submit, IoOp, MemberIo, MemberRef, NvmeModel, SimNvme};
use raid_core::metadata::LARGE_RING_DATA_OFFSET;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

const MEMBERS: usize = 8;
const MEMBER_DATA: u64 = 256 << 20;
const CHUNK: u64 = 64 * 1024;
/// After the journal ring of large drives, as in `benches/nvme.rs`.
const DATA_OFFSET: u64 = LARGE_RING_DATA_OFFSET;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

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

fn main() {
    let read = env_u64("BENCH_READ_MBS", 850);
    let write = env_u64("BENCH_WRITE_MBS", 660);
    let model = NvmeModel::datacenter().with_bandwidth(read * 1_000_000, write * 1_000_000);
    let parallel: Vec<usize> = std::env::var("BENCH_PARALLEL")
        .ok()
        .map(|v| v.split(',').filter_map(|p| p.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, RebuildOptions::default().parallel, 4]);
    eprintln!(
        "rebuild bench: {MEMBERS} simulated drives of {} MiB ({} us read, {} us write, {read} MB/s read, {write} MB/s write), chunk {} KiB, {} cores",
        MEMBER_DATA >> 20,
        model.read.as_micros(),
        model.write.as_micros(),
        CHUNK >> 10,
        rayon::current_num_threads()
    );
    println!(
        "\n| level, job | runs at once | MB/s | new drive's seq write MB/s | ratio | target |"
    );
    println!("|---|---|---|---|---|---|");
    for level in common::chosen(&[Level::Raid5, Level::Raid6]) {
        let members = (0..MEMBERS)
            .map(|i| drive(format!("sim:{level}-{i}"), model))
            .collect();
        let a = common::array_at(members, level, CHUNK, DATA_OFFSET);
        // Every byte written once, so the rebuild reads real data.
        let piece = vec![0xa5u8; 64 << 20];
        let mut off = 0;
        while off < a.capacity() {
            let n = (a.capacity() - off).min(piece.len() as u64) as usize;
            a.write(off, &piece[..n]).unwrap();
            off += n as u64;
        }
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
                let t = Instant::now();
                match hot {
                    false => a.rebuild(2, &opts, &stop).unwrap(),
                    true => a.hot_replace_copy(&opts, &stop).unwrap(),
                };
                let rate = MEMBER_DATA as f64 / t.elapsed().as_secs_f64() / 1e6;
                let ratio = rate / seq;
                let (job, target) = match hot {
                    false => (
                        "rebuild",
                        format!(">= 0.5x: {}", if ratio >= 0.5 { "met" } else { "NOT met" }),
                    ),
                    true => ("hot replace", "-".to_string()),
                };
                println!("| {level} {job} | {p} | {rate:.0} | {seq:.0} | {ratio:.2}x | {target} |");
            }
        }
    }
}
