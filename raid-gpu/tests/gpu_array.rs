//! An array whose parity runs on the GPU engine (lavapipe in CI), held to
//! a byte model through the calls the array really makes: single-stripe
//! read-modify-writes, batched full-stripe writes, a member failing, degraded
//! reads and writes (journalled), replacement and rebuild, and a scrub that
//! must find the parity the GPU wrote consistent.

use raid_core::array::{Array, CreateOptions, RebuildEnd, RebuildOptions, ScrubOptions};
use raid_core::layout::Level;
use raid_core::member::{MemberRef, RamMember};
use raid_core::metadata::MIN_DATA_OFFSET;
use raid_gpu::{GpuEngine, ParityMode, Selection, StripeShape};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[test]
fn an_array_on_the_gpu_engine_matches_its_model_through_a_failure_and_rebuild() {
    if let Err(e) = GpuEngine::new() {
        if std::env::var("RAID_GPU_TESTS").is_ok_and(|v| v == "skip") {
            eprintln!("skipped: {e}");
            return;
        }
        panic!("{e} (install mesa-vulkan-drivers, or set RAID_GPU_TESTS=skip)");
    }
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 6)] {
        let chunk = 16384u64;
        let data = 4 << 20;
        let members: Vec<MemberRef> = (0..n)
            .map(|i| {
                Arc::new(RamMember::new(
                    format!("ram:ga-{level}-{i}"),
                    MIN_DATA_OFFSET + data,
                )) as MemberRef
            })
            .collect();
        let mut a = Array::create(
            members.clone(),
            vec![],
            CreateOptions {
                name: "ga".into(),
                level,
                chunk,
                data_offset: None,
            },
        )
        .unwrap();
        let g = a.geometry();
        let sel = Arc::new(Selection::new(
            ParityMode::Gpu,
            StripeShape {
                kind: level.parity_kind().unwrap(),
                data_chunks: g.data_chunks(),
                chunk: chunk as usize,
            },
        ));
        sel.set_verify_every(0); // the model, not the sampler, is the judge here
        a.set_engine(sel.clone());
        let cap = a.capacity() as usize;
        let stripe = g.stripe_data_bytes() as usize;
        let mut model = vec![0u8; cap];
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut rnd = |m: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m as u64) as usize
        };
        let write = |a: &Array, model: &mut [u8], off: usize, len: usize, seed: u8| {
            let buf: Vec<u8> = (0..len)
                .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
                .collect();
            a.write(off as u64, &buf).unwrap();
            model[off..off + len].copy_from_slice(&buf);
        };
        // Whole-array fill (batched full stripes), then small and large writes.
        write(&a, &mut model, 0, cap, 3);
        for k in 0..40u8 {
            let len = 4096 * (1 + rnd(if k % 4 == 0 { 3 * stripe / 4096 } else { 4 }));
            let off = 4096 * rnd((cap - len) / 4096 + 1);
            write(&a, &mut model, off, len, k | 1);
        }
        let mut got = vec![0u8; cap];
        a.read(0, &mut got).unwrap();
        assert!(got == model, "{level}: optimal read differs");

        // A member fails: degraded reads and writes.
        a.fail_slot(2, "test");
        for k in 0..20u8 {
            let len = 4096 * (1 + rnd(2 * stripe / 4096));
            let off = 4096 * rnd((cap - len) / 4096 + 1);
            write(&a, &mut model, off, len, k.wrapping_mul(7) | 1);
        }
        a.read(0, &mut got).unwrap();
        assert!(got == model, "{level}: degraded read differs");

        // Replace and rebuild on the GPU; scrub finds the GPU's parity right.
        let new: MemberRef = Arc::new(RamMember::new(
            format!("ram:ga-{level}-new"),
            MIN_DATA_OFFSET + data,
        ));
        a.replace(2, new).unwrap();
        let end = a
            .rebuild(2, &RebuildOptions::default(), &AtomicBool::new(false))
            .unwrap();
        assert_eq!(end, RebuildEnd::Finished);
        a.read(0, &mut got).unwrap();
        assert!(got == model, "{level}: read after rebuild differs");
        let r = a
            .scrub(&ScrubOptions::default(), &AtomicBool::new(false))
            .unwrap();
        assert!(r.mismatches.is_empty(), "{level}: {:?}", r.mismatches);
        let rep = sel.report();
        assert!(rep.gpu_calls > 0 && rep.cpu_calls == 0, "{level}: {rep:?}");
        assert!(rep.note.is_none(), "{level}: {rep:?}");
    }
}
