//! The GPU engine beyond the conformance suite: batches far larger than one
//! sub-batch (the slot ring turning over many times, stripes cut by column),
//! and the selecting engine: modes, and the CPU taking over from a GPU that
//! is really lost (its device destroyed) without a call failing.
//!
//! Needs a wgpu adapter; CI has lavapipe. RAID_GPU_TESTS=skip makes these
//! pass without one, on a machine known to have none.

#[path = "../../raid-core/tests/common/batches.rs"]
mod batches;

use raid_core::parity::{CpuEngine, ParityEngine, ParityKind};
use raid_gpu::{Fallback, GpuEngine, ParityMode, Selection, StripeShape};
use std::sync::{Arc, Mutex};

fn gpu_or_skip(e: Result<GpuEngine, raid_gpu::GpuError>) -> Option<GpuEngine> {
    match e {
        Ok(g) => Some(g),
        Err(e) if std::env::var("RAID_GPU_TESTS").is_ok_and(|v| v == "skip") => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e} (install mesa-vulkan-drivers, or set RAID_GPU_TESTS=skip)"),
    }
}

/// `count` stripes of `data` chunks of `len` bytes plus zeroed parity.
fn stripes(count: usize, data: usize, parity: usize, len: usize, seed: u64) -> Vec<Vec<Vec<u8>>> {
    let mut x = seed | 1;
    (0..count)
        .map(|_| {
            (0..data + parity)
                .map(|c| {
                    (0..len)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            if c < data {
                                x as u8
                            } else {
                                0
                            }
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

fn gen(e: &dyn ParityEngine, kind: ParityKind, s: &mut [Vec<Vec<u8>>]) {
    batches::gen_all(e, kind, s).unwrap();
}

/// 48 MiB of data through 1 MiB buffers: about a hundred sub-batches
/// around the three-slot ring, plus one stripe wider than a buffer, cut by
/// column; then a recovery batch of the same size with mixed missing sets.
#[test]
fn batches_far_larger_than_a_sub_batch_equal_the_cpu() {
    let Some(g) = gpu_or_skip(GpuEngine::with_buffer_limit(1 << 20)) else {
        return;
    };
    assert_eq!(g.buffer_limit(), 1 << 20);
    let cpu = CpuEngine::new();
    let mut on_gpu = stripes(96, 8, 2, 64 << 10, 7);
    on_gpu.extend(stripes(1, 30, 2, 256 << 10, 8));
    let mut on_cpu = on_gpu.clone();
    gen(&g, ParityKind::PQ, &mut on_gpu);
    gen(&cpu, ParityKind::PQ, &mut on_cpu);
    assert!(on_gpu == on_cpu, "GPU parity differs from the CPU's");
    // The ring really turned over, three deep, and only sources, plans and
    // parity crossed the bus: 8 data + 2 parity per stripe, 30 + 2 for the
    // wide one.
    let st = g.stats();
    assert_eq!(st.calls, 1);
    assert!(st.sub_batches >= 48, "{st:?}");
    assert_eq!(st.max_in_flight, 3, "{st:?}");
    let data: u64 = 96 * 8 * (64 << 10) + 30 * (256 << 10);
    let parity: u64 = 96 * 2 * (64 << 10) + 2 * (256 << 10);
    assert_eq!(st.bytes_down, parity, "{st:?}");
    assert!(
        st.bytes_up >= data && st.bytes_up < data + data / 50,
        "{st:?}"
    );
    assert!(on_gpu[0][8].iter().any(|&b| b != 0), "parity was written");

    let want = on_gpu.clone();
    let missing: Vec<Vec<usize>> = (0..on_gpu.len())
        .map(|i| {
            let w = on_gpu[i].len();
            match i % 4 {
                0 => vec![i % (w - 2)],
                1 => vec![i % (w - 2), w - 2],
                2 => vec![w - 1, (i + 3) % (w - 2)],
                _ => vec![(i + 1) % (w - 2), (i + 2) % (w - 2)],
            }
        })
        .collect();
    batches::wipe_and_recover_all(&g, ParityKind::PQ, &mut on_gpu, &missing, 0xEE).unwrap();
    assert!(on_gpu == want, "GPU recovery did not give the data back");
}

/// A `gpu`-mode selection and the fallbacks it reports.
fn gpu_selection_recording_fallbacks() -> (Selection, Arc<Mutex<Vec<Fallback>>>) {
    let sel = Selection::new(ParityMode::Gpu, shape());
    let events: Arc<Mutex<Vec<Fallback>>> = Arc::default();
    let ev = events.clone();
    sel.on_fallback(move |f| ev.lock().unwrap().push(f));
    (sel, events)
}

fn shape() -> StripeShape {
    StripeShape {
        kind: ParityKind::PQ,
        data_chunks: 4,
        chunk: 4096,
    }
}

/// The GPU's device is destroyed under the selecting engine: the next
/// calls come back right, from the CPU; the hook fires once; the report
/// says why; the GPU is not tried again.
#[test]
fn a_lost_gpu_falls_back_to_the_cpu_without_failing_a_call() {
    if gpu_or_skip(GpuEngine::new()).is_none() {
        return;
    }
    let (sel, events) = gpu_selection_recording_fallbacks();
    let gpu = sel.gpu().expect("gpu mode opens the GPU").clone();
    assert!(sel.name().starts_with("gpu/"), "{}", sel.name());

    let cpu = CpuEngine::new();
    let mut a = stripes(8, 4, 2, 4096, 3);
    let mut b = a.clone();
    gen(&sel, ParityKind::PQ, &mut a);
    gen(&cpu, ParityKind::PQ, &mut b);
    assert!(a == b);
    assert_eq!(sel.report().gpu_calls, 1);

    gpu.destroy_device();
    let mut a = stripes(8, 4, 2, 4096, 4);
    let mut b = a.clone();
    gen(&sel, ParityKind::PQ, &mut a);
    gen(&cpu, ParityKind::PQ, &mut b);
    assert!(
        a == b,
        "the call that met the lost GPU was not redone right"
    );
    // Single-stripe calls too, and again: no call fails.
    for _ in 0..3 {
        let d: Vec<Vec<u8>> = (0..4).map(|i| vec![i as u8 + 1; 4096]).collect();
        let refs: Vec<&[u8]> = d.iter().map(|c| &c[..]).collect();
        let (mut p, mut q) = (vec![0u8; 4096], vec![0u8; 4096]);
        sel.gen_pq(&refs, &mut p, &mut q).unwrap();
        assert_eq!(p[0], 4);
    }
    let evs = events.lock().unwrap().clone();
    assert_eq!(evs.len(), 1, "one fallback event: {evs:?}");
    assert!(
        evs[0].from.starts_with("gpu/") && evs[0].to.starts_with("cpu/"),
        "{evs:?}"
    );
    let r = sel.report();
    assert!(r.engine.starts_with("cpu/"), "{r:?}");
    assert!(
        r.note.as_deref().unwrap_or("").contains("GPU lost"),
        "{r:?}"
    );
    assert!(sel.gpu().is_none());
    assert_eq!(r.gpu_calls, 1, "the GPU was not tried again: {r:?}");
}

/// `cpu` opens no GPU; `auto` on a CPU adapter (lavapipe) keeps parity on
/// the CPU engine and says why; `gpu` names the adapter.
#[test]
fn modes_choose_as_documented() {
    let Some(g) = gpu_or_skip(GpuEngine::new()) else {
        return;
    };
    let cpu = Selection::new(ParityMode::Cpu, shape());
    assert!(cpu.gpu().is_none() && cpu.report().adapter.is_none());
    assert!(cpu.name().starts_with("cpu/"));
    // The array batches only for an engine that asks: the GPU does (16 MiB
    // per call: 32 stripes of 512 KiB), the CPU does not.
    assert_eq!(cpu.preferred_batch(512 << 10), 1);

    let gpu = Selection::new(ParityMode::Gpu, shape());
    let r = gpu.report();
    assert_eq!(r.adapter.as_deref(), Some(g.adapter().to_string().as_str()));
    assert_eq!(gpu.preferred_batch(512 << 10), 32);
    assert_eq!(gpu.preferred_batch(64 << 10), 64);

    if g.adapter().is_cpu {
        let auto = Selection::new(ParityMode::Auto, shape());
        let r = auto.report();
        assert!(r.engine.starts_with("cpu/"), "{r:?}");
        assert!(r.note.unwrap().contains("CPU one"));
        assert_eq!(r.threshold_bytes, None);
        assert_eq!(auto.preferred_batch(512 << 10), 1);
    }
}

/// `auto`, told to treat a CPU adapter as a GPU, measures both engines at
/// start and sends calls over the measured threshold to the GPU only.
#[test]
fn auto_measures_a_threshold_and_routes_by_it() {
    let Some(g) = gpu_or_skip(GpuEngine::new()) else {
        return;
    };
    let auto = Selection::with_policy(ParityMode::Auto, shape(), true);
    let r = auto.report();
    assert_eq!(r.adapter.as_deref(), Some(g.adapter().to_string().as_str()));
    let mut s = stripes(1, 4, 2, 4096, 9);
    gen(&auto, ParityKind::PQ, &mut s);
    let r2 = auto.report();
    match r.threshold_bytes {
        // lavapipe is never faster than the CPU engine: every call is CPU.
        None => assert_eq!((r2.gpu_calls, r2.cpu_calls), (0, 1)),
        Some(t) if t <= 4 * 4096 => assert_eq!(r2.gpu_calls, 1),
        Some(_) => assert_eq!(r2.cpu_calls, 1),
    }
}

/// A GPU lost while no call uses it is noticed by the health check (what
/// the daemon runs every tick): the fallback is reported before any I/O
/// meets the dead device.
#[test]
fn a_gpu_lost_while_idle_is_noticed_by_the_health_check() {
    if gpu_or_skip(GpuEngine::new()).is_none() {
        return;
    }
    let (sel, events) = gpu_selection_recording_fallbacks();
    sel.check_health();
    assert!(
        events.lock().unwrap().is_empty(),
        "a healthy GPU was reported lost"
    );
    sel.gpu().unwrap().destroy_device();
    sel.check_health();
    let evs = events.lock().unwrap().clone();
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert!(evs[0].reason.contains("lost"), "{evs:?}");
    assert!(sel.name().starts_with("cpu/"));
    assert_eq!(sel.report().gpu_calls, 0);
}

mod mixed_batches {
    use super::*;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    /// One engine with 1 MiB buffers, so random batches are cut into
    /// sub-batches, and wide stripes by column, at varying places.
    fn small_gpu() -> Option<&'static GpuEngine> {
        static G: OnceLock<Option<GpuEngine>> = OnceLock::new();
        G.get_or_init(|| gpu_or_skip(GpuEngine::with_buffer_limit(1 << 20)))
            .as_ref()
    }

    /// A batch: per stripe (data chunks, chunk length in 64-byte units, seed).
    fn batch() -> impl Strategy<Value = Vec<(usize, usize, u64)>> {
        proptest::collection::vec((2usize..40, 1usize..1200, any::<u64>()), 1..24)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Stripes of different widths and chunk lengths in one call, P and
        /// P+Q, generation then recovery with per-stripe missing sets: the
        /// GPU equals the CPU byte for byte.
        #[test]
        fn random_batches_equal_the_cpu(shapes in batch(), pq in any::<bool>(), pick in any::<u64>()) {
            let Some(g) = small_gpu() else { return Ok(()) };
            let kind = if pq { ParityKind::PQ } else { ParityKind::P };
            let np = kind.parity_chunks();
            let mut on_gpu: Vec<Vec<Vec<u8>>> = shapes
                .iter()
                .flat_map(|&(n, units, seed)| stripes(1, n, np, units * 64, seed))
                .collect();
            let mut on_cpu = on_gpu.clone();
            gen(g, kind, &mut on_gpu);
            gen(&CpuEngine::new(), kind, &mut on_cpu);
            prop_assert!(on_gpu == on_cpu, "generation differs");

            let want = on_gpu.clone();
            let mut x = pick | 1;
            let missing: Vec<Vec<usize>> = on_gpu
                .iter()
                .map(|s| {
                    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                    let w = s.len();
                    let a = (x % w as u64) as usize;
                    let b = ((x >> 20) % w as u64) as usize;
                    if np == 2 && a != b { vec![a, b] } else { vec![a] }
                })
                .collect();
            batches::wipe_and_recover_all(g, kind, &mut on_gpu, &missing, 0x77).unwrap();
            prop_assert!(on_gpu == want, "recovery differs");
        }
    }
}

/// A GPU that hands back wrong bits (failing memory, a miscompiled shader)
/// is caught by the sampled check against the CPU: the call still returns
/// the right parity, the GPU is dropped, and the event says why. Without
/// the check, the wrong parity would go to disk.
#[test]
fn wrong_gpu_results_are_caught_by_sampled_verification() {
    if gpu_or_skip(GpuEngine::new()).is_none() {
        return;
    }
    let cpu = CpuEngine::new();
    // Every call checked: generation, then recovery.
    for recovery in [false, true] {
        let (sel, events) = gpu_selection_recording_fallbacks();
        sel.set_verify_every(1);
        let mut a = stripes(4, 5, 2, 4096, 11);
        let mut b = a.clone();
        gen(&cpu, ParityKind::PQ, &mut b);
        if recovery {
            a = b.clone();
        }
        sel.gpu().unwrap().inject_bit_flips(true);
        if recovery {
            let missing = vec![vec![1, 3]; 4];
            batches::wipe_and_recover_all(&sel, ParityKind::PQ, &mut a, &missing, 0).unwrap();
        } else {
            gen(&sel, ParityKind::PQ, &mut a);
        }
        assert!(
            a == b,
            "a wrong GPU result reached the caller (recovery: {recovery})"
        );
        let evs = events.lock().unwrap().clone();
        assert_eq!(evs.len(), 1, "{evs:?}");
        assert!(
            evs[0].reason.contains("differs from the CPU engine"),
            "{evs:?}"
        );
        assert!(sel.gpu().is_none());
    }
    // With checking off the flipped bit gets through: the check is what
    // stands between a bad GPU and the disk.
    let (sel, events) = gpu_selection_recording_fallbacks();
    sel.set_verify_every(0);
    sel.gpu().unwrap().inject_bit_flips(true);
    let mut a = stripes(1, 5, 2, 4096, 12);
    let mut b = a.clone();
    gen(&sel, ParityKind::PQ, &mut a);
    gen(&cpu, ParityKind::PQ, &mut b);
    assert!(a != b && events.lock().unwrap().is_empty());
}
