//! What the array benches share: how the array under test is made, and
//! which levels a run measures.

#[allow(dead_code)] // Not every bench uses it.
pub mod clients;

/// The heap raidctl runs the engine with (`raidctl/src/main.rs`), so that
/// a bench's CPU per I/O is the daemon's.
#[global_allocator]
static HEAP: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Small pages, as raidctl keeps (`raidctl/src/main.rs`): mimalloc would
/// ask for huge ones, and RAM members and simulated drives on huge pages
/// answer faster than the daemon's members would, the bare ones most.
pub fn small_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes an integer flag and touches no
    // memory of ours.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

use raid_core::array::{Array, CreateOptions};
use raid_core::layout::Level;
use raid_core::member::MemberRef;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The array a bench measures: `level` over `members`, chunk `chunk`.
#[allow(dead_code)] // Not every bench uses it.
pub fn array(members: Vec<MemberRef>, level: Level, chunk: u64) -> Array {
    create(members, level, chunk, None)
}

/// `array`, its data starting at `data_offset` on the members.
#[allow(dead_code)] // Not every bench uses it.
pub fn array_at(members: Vec<MemberRef>, level: Level, chunk: u64, data_offset: u64) -> Array {
    create(members, level, chunk, Some(data_offset))
}

fn create(members: Vec<MemberRef>, level: Level, chunk: u64, data_offset: Option<u64>) -> Array {
    Array::create(
        members,
        vec![],
        CreateOptions {
            name: "bench".into(),
            level,
            chunk,
            data_offset,
        },
    )
    .unwrap()
}

/// `n` simulated datacenter NVMe drives (`NvmeModel::datacenter`) of
/// `size` bytes each, named `sim:{tag}{i}`, every page of their memory
/// already written: otherwise the first run to write a page pays the
/// kernel's fault for it (a page zeroed and mapped), which is the heap's
/// and the kernel's cost, not the drive's, and lands on whichever side of
/// a comparison writes there first.
#[allow(dead_code)] // Not every bench uses it.
pub fn sim_drives(
    tag: &str,
    n: usize,
    size: u64,
) -> Vec<std::sync::Arc<raid_core::member::SimNvme>> {
    sim_drives_of(raid_core::member::NvmeModel::datacenter(), tag, n, size)
}

/// `sim_drives` of another model.
#[allow(dead_code)] // Not every bench uses it.
pub fn sim_drives_of(
    model: raid_core::member::NvmeModel,
    tag: &str,
    n: usize,
    size: u64,
) -> Vec<std::sync::Arc<raid_core::member::SimNvme>> {
    (0..n)
        .map(|i| {
            let d = raid_core::member::SimNvme::new(format!("sim:{tag}{i}"), size, model);
            raid_core::member::Member::write_zeroes(&d, 0, size).expect("zeroing a drive in RAM");
            std::sync::Arc::new(d)
        })
        .collect()
}

/// `threads` threads for `dur`, each with its own state (`init` of its
/// index) doing `op` again and again; returns each `op`'s latency (us)
/// and the seconds it all took.
#[allow(dead_code)] // Not every bench uses it.
pub fn timed_loops<S>(
    threads: usize,
    dur: std::time::Duration,
    init: impl Fn(usize) -> S + Sync,
    op: impl Fn(&mut S) + Sync,
) -> (Vec<u32>, f64) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let lat = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let (stop, init, op) = (&stop, &init, &op);
                sc.spawn(move || {
                    let mut state = init(k);
                    let mut lat = Vec::with_capacity(1 << 16);
                    while !stop.load(Ordering::Relaxed) {
                        let t0 = Instant::now();
                        op(&mut state);
                        lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    }
                    lat
                })
            })
            .collect();
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    (lat, started.elapsed().as_secs_f64())
}

/// What a timed run did: I/Os completed, their rate, and the median, the
/// 99th percentile and the longest of their latencies.
#[allow(dead_code)] // Not every bench uses it.
pub struct Sample {
    pub ios: u64,
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

#[allow(dead_code)] // Not every bench uses it.
impl Sample {
    /// From the latencies (us) of what completed in `secs` (zeros where
    /// nothing did).
    pub fn of(mut lat: Vec<u32>, secs: f64) -> Sample {
        lat.sort_unstable();
        let pct = |p: f64| match lat.len() {
            0 => 0.0,
            n => lat[((n - 1) as f64 * p) as usize] as f64,
        };
        Sample {
            ios: lat.len() as u64,
            iops: lat.len() as f64 / secs,
            p50_us: pct(0.5),
            p99_us: pct(0.99),
            max_us: pct(1.0),
        }
    }
}

/// `levels`, less those left out by BENCH_LEVEL (raid5, say: that one only).
pub fn chosen(levels: &[Level]) -> impl Iterator<Item = Level> + '_ {
    let only = std::env::var("BENCH_LEVEL").ok();
    levels
        .iter()
        .copied()
        .filter(move |l| only.as_ref().is_none_or(|o| *o == l.to_string()))
}

#[allow(dead_code)] // Not every bench uses it.
/// The blocks a stream of I/O goes to: at random, or one after another
/// (`seq`) from `first`.
pub struct Blocks {
    rng: SmallRng,
    next: u64,
    blocks: u64,
    seq: bool,
}

impl Blocks {
    pub fn new(seed: u64, first: u64, blocks: u64, seq: bool) -> Blocks {
        let rng = SmallRng::seed_from_u64(seed);
        Blocks {
            rng,
            next: first,
            blocks,
            seq,
        }
    }

    pub fn next(&mut self) -> u64 {
        if !self.seq {
            return self.rng.gen_range(0..self.blocks);
        }
        let b = self.next;
        self.next = (b + 1) % self.blocks;
        b
    }
}

/// Stream `i` of `n` sharing `qd` I/Os in flight over `blocks`: its depth
/// (the remainder to the first ones) and the block its sequential I/O
/// starts at (the streams spread evenly over the blocks).
#[allow(dead_code)] // Not every bench uses it.
pub fn share(qd: usize, blocks: u64, n: usize, i: usize) -> (usize, u64) {
    (
        qd / n + usize::from(i < qd % n),
        blocks / n as u64 * i as u64,
    )
}

/// The environment variable `name` as a number, or `default`.
#[allow(dead_code)] // Not every bench uses it.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A datacenter drive (`NvmeModel::datacenter`) with its bandwidth: 6.8
/// GB/s read and 5.3 GB/s write scaled down 8 times, so that this
/// machine's cores, which move every byte in memory, are not the bound
/// (BENCH_READ_MBS and BENCH_WRITE_MBS set it in MB/s).
#[allow(dead_code)] // Not every bench uses it.
pub fn bandwidth_model() -> raid_core::member::NvmeModel {
    let read = env_u64("BENCH_READ_MBS", 850);
    let write = env_u64("BENCH_WRITE_MBS", 660);
    raid_core::member::NvmeModel::datacenter().with_bandwidth(read * 1_000_000, write * 1_000_000)
}

/// A drive model in words, for a bench's first line.
#[allow(dead_code)] // Not every bench uses it.
pub fn model_in_words(m: &raid_core::member::NvmeModel) -> String {
    format!(
        "{} us read, {} us write, {} MB/s read, {} MB/s write",
        m.read.as_micros(),
        m.write.as_micros(),
        m.read_bw / 1_000_000,
        m.write_bw / 1_000_000
    )
}
