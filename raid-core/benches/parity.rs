//! Parity engine benchmark: GB/s of data through P, P+Q, 1-chunk and 2-chunk
//! recovery, 8 data chunks of 64 KiB (cache resident) and 16 MiB (DRAM
//! bound), single core and all cores, side by side in one run with ISA-L
//! (`xor_gen`/`pq_gen`, when libisal is installed) and the
//! `reed-solomon-erasure` crate (8+2), then the ratios.
//!
//! `cargo bench -p raid-core --bench parity` (add `-- --quick` for a short
//! run). Each figure is the median of several timed batches after a warm-up;
//! absolute numbers on a shared VM are noise, the ratios are the result.

#[path = "../tests/support/mod.rs"]
mod support;

use raid_core::parity::{CpuEngine, ParityEngine, ParityKind, SimdLevel};
use rayon::prelude::*;
use reed_solomon_erasure::galois_8::ReedSolomon;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::Aligned;

const DATA: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Op {
    P,
    PQ,
    Rec1,
    Rec2,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::P => "P",
            Op::PQ => "P+Q",
            Op::Rec1 => "recover 1 data",
            Op::Rec2 => "recover 2 data",
        }
    }
}

/// One stripe's buffers: 8 data chunks, P, Q.
struct Stripe {
    chunks: Vec<Aligned>,
}

impl Stripe {
    fn new(len: usize, seed: u64) -> Stripe {
        let mut chunks: Vec<Aligned> = (0..DATA + 2).map(|_| Aligned::new(len)).collect();
        let mut x = seed | 1;
        for c in chunks.iter_mut().take(DATA) {
            for b in c.as_mut().chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
            }
        }
        let e = CpuEngine::new();
        let (d, pq) = chunks.split_at_mut(DATA);
        let data: Vec<&[u8]> = d.iter().map(|c| c.as_slice()).collect();
        let [p, q] = pq else { unreachable!() };
        e.gen_pq(&data, p.as_mut(), q.as_mut()).unwrap();
        Stripe { chunks }
    }
}

/// An implementation under test: runs `op` over columns `[lo, hi)` of a stripe.
trait Impl: Sync {
    fn name(&self) -> String;
    fn supports(&self, op: Op) -> bool;
    fn run(&self, op: Op, s: &mut [&mut [u8]]);
}

struct Ours(CpuEngine);
impl Impl for Ours {
    fn name(&self) -> String {
        self.0.name()
    }
    fn supports(&self, _: Op) -> bool {
        true
    }
    fn run(&self, op: Op, s: &mut [&mut [u8]]) {
        let (d, pq) = s.split_at_mut(DATA);
        let data: Vec<&[u8]> = d.iter().map(|c| &**c).collect();
        let [p, q] = pq else { unreachable!() };
        match op {
            Op::P => self.0.gen_p(&data, p).unwrap(),
            Op::PQ => self.0.gen_pq(&data, p, q).unwrap(),
            Op::Rec1 => self.0.recover(ParityKind::PQ, s, &[3]).unwrap(),
            Op::Rec2 => self.0.recover(ParityKind::PQ, s, &[2, 5]).unwrap(),
        }
    }
}

#[cfg(have_isal)]
struct Isal;
#[cfg(have_isal)]
impl Impl for Isal {
    fn name(&self) -> String {
        "isa-l".into()
    }
    fn supports(&self, op: Op) -> bool {
        // ISA-L's raid API has no RAID6 recovery; 1-chunk recovery is xor_gen.
        op != Op::Rec2
    }
    fn run(&self, op: Op, s: &mut [&mut [u8]]) {
        let (d, pq) = s.split_at_mut(DATA);
        let [p, q] = pq else { unreachable!() };
        match op {
            Op::P => support::isal::isal_xor(&d.iter().map(|c| &**c).collect::<Vec<_>>(), p),
            Op::PQ => support::isal::isal_pq(&d.iter().map(|c| &**c).collect::<Vec<_>>(), p, q),
            Op::Rec1 => {
                // D3 = P ^ the other seven: the same 8-source XOR as our recovery.
                let (before, rest) = d.split_at_mut(3);
                let (d3, after) = rest.split_first_mut().unwrap();
                let mut srcs: Vec<&[u8]> = before.iter().map(|c| &**c).collect();
                srcs.extend(after.iter().map(|c| &**c));
                srcs.push(p);
                support::isal::isal_xor(&srcs, d3);
            }
            Op::Rec2 => unreachable!(),
        }
    }
}

/// reed-solomon-erasure 8+2: the general-purpose crate a Rust project would
/// reach for. Its parity is a Vandermonde-derived code, not md's P+Q, so it
/// is a speed baseline only.
struct Rse(ReedSolomon);
impl Impl for Rse {
    fn name(&self) -> String {
        "reed-solomon-erasure".into()
    }
    fn supports(&self, op: Op) -> bool {
        op != Op::P
    }
    fn run(&self, op: Op, s: &mut [&mut [u8]]) {
        match op {
            Op::PQ => {
                let (d, pq) = s.split_at_mut(DATA);
                self.0
                    .encode_sep(&d.iter().map(|c| &**c).collect::<Vec<_>>(), pq)
                    .unwrap();
            }
            Op::Rec1 | Op::Rec2 => {
                let gone: &[usize] = if op == Op::Rec1 { &[3] } else { &[2, 5] };
                let mut shards: Vec<(&mut [u8], bool)> = s
                    .iter_mut()
                    .enumerate()
                    .map(|(i, c)| (&mut **c, !gone.contains(&i)))
                    .collect();
                self.0.reconstruct_data(&mut shards).unwrap();
            }
            Op::P => unreachable!(),
        }
    }
}

/// Column ranges for the all-cores runs: 256 KiB per task, every
/// implementation cut the same way.
fn columns(len: usize) -> Vec<(usize, usize)> {
    const COL: usize = 256 * 1024;
    if len <= COL {
        return vec![(0, len)];
    }
    (0..len)
        .step_by(COL)
        .map(|s| (s, (s + COL).min(len)))
        .collect()
}

/// Runs `reps` passes: single core over one stripe, or all cores, where
/// each thread works on its own stripe (64 KiB: one stripe per thread) or on
/// column ranges of one stripe (16 MiB). The repetitions run inside one
/// parallel section so thread wake-ups are not what is measured.
fn pass(imp: &dyn Impl, op: Op, stripes: &mut [Stripe], all_cores: bool, reps: u32) {
    let len = stripes[0].chunks[0].as_slice().len();
    if !all_cores {
        let mut v: Vec<&mut [u8]> = stripes[0].chunks.iter_mut().map(|c| c.as_mut()).collect();
        for _ in 0..reps {
            imp.run(op, &mut v);
        }
        return;
    }
    let cols = columns(len);
    if cols.len() == 1 {
        stripes.par_iter_mut().for_each(|s| {
            let mut v: Vec<&mut [u8]> = s.chunks.iter_mut().map(|c| c.as_mut()).collect();
            for _ in 0..reps {
                imp.run(op, &mut v);
            }
        });
        return;
    }
    // Cut each chunk of the one stripe into the column ranges.
    let mut parts: Vec<Vec<&mut [u8]>> = cols.iter().map(|_| Vec::new()).collect();
    for c in stripes[0].chunks.iter_mut() {
        let mut rest = c.as_mut();
        for (k, &(lo, hi)) in cols.iter().enumerate() {
            let (h, t) = std::mem::take(&mut rest).split_at_mut(hi - lo);
            parts[k].push(h);
            rest = t;
        }
    }
    for _ in 0..reps {
        parts.par_iter_mut().for_each(|p| imp.run(op, p));
    }
}

/// Median GB/s of data for each implementation of one case. The samples of
/// the implementations are interleaved round by round, so a noisy neighbour
/// on this shared machine slows every column alike rather than one of them.
fn measure(
    imps: &[&dyn Impl],
    op: Op,
    stripes: &mut [Stripe],
    all_cores: bool,
    quick: bool,
) -> Vec<f64> {
    let len = stripes[0].chunks[0].as_slice().len();
    let per_pass = (DATA * len * if all_cores { stripes.len() } else { 1 }) as f64;
    // Calibrate each implementation's batch to ~20 ms (5 ms quick).
    let target = Duration::from_millis(if quick { 5 } else { 20 });
    let iters: Vec<u32> = imps
        .iter()
        .map(|imp| {
            let mut iters = 1u32;
            loop {
                let t = Instant::now();
                pass(*imp, op, stripes, all_cores, iters);
                if t.elapsed() >= target || iters >= 1 << 20 {
                    return iters;
                }
                iters *= 2;
            }
        })
        .collect();
    let samples = if quick { 5 } else { 21 };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); imps.len()];
    for _ in 0..samples {
        for (k, imp) in imps.iter().enumerate() {
            let t = Instant::now();
            pass(*imp, op, stripes, all_cores, iters[k]);
            rates[k].push(per_pass * iters[k] as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
    }
    rates
        .into_iter()
        .map(|mut r| {
            r.sort_by(|a, b| a.partial_cmp(b).unwrap());
            r[r.len() / 2]
        })
        .collect()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let threads = rayon::current_num_threads();
    eprintln!(
        "parity bench: {DATA} data chunks, levels available: {:?}, {threads} threads{}",
        SimdLevel::available(),
        if quick { ", quick" } else { "" }
    );
    let mut impls: Vec<Box<dyn Impl>> = SimdLevel::available()
        .into_iter()
        .map(|l| {
            Box::new(Ours(CpuEngine::with_level(l).unwrap().single_threaded())) as Box<dyn Impl>
        })
        .collect();
    #[cfg(have_isal)]
    impls.push(Box::new(Isal));
    #[cfg(not(have_isal))]
    eprintln!("libisal not installed (apt-get install libisal-dev): ISA-L columns skipped");
    impls.push(Box::new(Rse(ReedSolomon::new(DATA, 2).unwrap())));

    let ours_best = CpuEngine::new().single_threaded().name();
    // results[(size, cores, op)][impl] = GB/s
    let mut results: BTreeMap<(usize, bool, Op), BTreeMap<String, f64>> = BTreeMap::new();
    for &len in &[64 * 1024, 16 * 1024 * 1024] {
        // One stripe per thread for the cache-resident size, so each core's
        // stripe stays in its own L2 as in the single-core run.
        let batch = if len <= 1 << 20 { threads } else { 1 };
        let mut stripes: Vec<Stripe> = (0..batch)
            .map(|i| Stripe::new(len, 0x9e37 + i as u64))
            .collect();
        for all_cores in [false, true] {
            for op in [Op::P, Op::PQ, Op::Rec1, Op::Rec2] {
                // Only the best of our levels runs on all cores.
                let chosen: Vec<&dyn Impl> = impls
                    .iter()
                    .map(|b| b.as_ref())
                    .filter(|imp| {
                        let name = imp.name();
                        imp.supports(op)
                            && !(all_cores && name.starts_with("cpu/") && name != ours_best)
                    })
                    .collect();
                let rates = measure(&chosen, op, &mut stripes, all_cores, quick);
                for (imp, r) in chosen.iter().zip(rates) {
                    let name = imp.name();
                    eprintln!(
                        "  {:>6} KiB {:>4} {:<15} {:<22} {:>7.2} GB/s",
                        len / 1024,
                        if all_cores { "all" } else { "1" },
                        op.name(),
                        name,
                        r
                    );
                    results
                        .entry((len, all_cores, op))
                        .or_default()
                        .insert(name, r);
                }
            }
        }
    }

    println!("\n| chunk | cores | operation | {ours_best} GB/s | ISA-L GB/s | RSE 8+2 GB/s | ours / ISA-L | ours / RSE |");
    println!("|---|---|---|---|---|---|---|---|");
    let get = |m: &BTreeMap<String, f64>, k: &str| m.get(k).copied();
    let fmt = |v: Option<f64>| v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}x", a / b),
        _ => "-".into(),
    };
    for ((len, all, op), m) in &results {
        let ours = get(m, &ours_best);
        // Rec2's ISA-L reference is pq_gen at the same size (the target is
        // stated against it).
        let isal = if *op == Op::Rec2 {
            results
                .get(&(*len, *all, Op::PQ))
                .and_then(|m| get(m, "isa-l"))
        } else {
            get(m, "isa-l")
        };
        let rse = get(m, "reed-solomon-erasure");
        println!(
            "| {} | {} | {} | {} | {}{} | {} | {} | {} |",
            if *len >= 1 << 20 {
                format!("{} MiB", len >> 20)
            } else {
                format!("{} KiB", len >> 10)
            },
            if *all {
                threads.to_string()
            } else {
                "1".into()
            },
            op.name(),
            fmt(ours),
            fmt(isal),
            if *op == Op::Rec2 && isal.is_some() {
                " (pq_gen)"
            } else {
                ""
            },
            fmt(rse),
            ratio(ours, isal),
            ratio(ours, rse)
        );
    }
    println!("\nPer SIMD level, single core, 64 KiB chunks (GB/s):");
    for op in [Op::P, Op::PQ, Op::Rec1, Op::Rec2] {
        if let Some(m) = results.get(&(64 * 1024, false, op)) {
            let row: Vec<String> = m
                .iter()
                .filter(|(k, _)| k.starts_with("cpu/"))
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect();
            println!("  {:<15} {}", op.name(), row.join(", "));
        }
    }
}
