//! The parity conformance suite (tests/common/parity_suite.rs) on every SIMD
//! level this CPU has, each forced in turn, plus the column-splitting
//! multi-threaded engine; and a live cross-check against ISA-L when libisal
//! is installed.

mod support;

#[path = "common/batches.rs"]
mod batches;

#[path = "common/parity_suite.rs"]
mod suite;

use raid_core::parity::{CpuEngine, ParityEngine, SimdLevel};
use std::sync::Arc;

/// Every level single-threaded, then the best level splitting large chunks
/// over threads.
fn engines() -> Vec<Arc<dyn ParityEngine>> {
    let mut v: Vec<Arc<dyn ParityEngine>> = SimdLevel::available()
        .into_iter()
        .map(|l| {
            Arc::new(CpuEngine::with_level(l).unwrap().single_threaded()) as Arc<dyn ParityEngine>
        })
        .collect();
    v.push(Arc::new(CpuEngine::new()));
    v
}

/// Live cross-check against ISA-L when it is installed (CI installs it).
#[cfg(have_isal)]
#[test]
fn equals_isal_pq_gen_on_random_stripes() {
    use rand::{Rng, SeedableRng};
    use support::{isal, Aligned};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x15a1);
    for _ in 0..50 {
        let w = rng.gen_range(2..=30);
        let len = 64 * rng.gen_range(1..=64);
        let mut data: Vec<Aligned> = (0..w).map(|_| Aligned::new(len)).collect();
        for d in &mut data {
            rng.fill(d.as_mut());
        }
        let views: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let (mut ip, mut iq, mut ix) = (Aligned::new(len), Aligned::new(len), Aligned::new(len));
        isal::isal_pq(&views, ip.as_mut(), iq.as_mut());
        isal::isal_xor(&views, ix.as_mut());
        for e in engines() {
            let (mut p, mut q, mut x) = (vec![0u8; len], vec![0u8; len], vec![0u8; len]);
            e.gen_pq(&views, &mut p, &mut q).unwrap();
            e.gen_p(&views, &mut x).unwrap();
            assert_eq!(p, ip.as_slice(), "P vs ISA-L, {}", e.name());
            assert_eq!(q, iq.as_slice(), "Q vs ISA-L, {}", e.name());
            assert_eq!(x, ix.as_slice(), "xor vs ISA-L, {}", e.name());
        }
    }
}

#[cfg(not(have_isal))]
#[test]
fn equals_isal_pq_gen_on_random_stripes() {
    eprintln!("libisal not installed: skipping the live ISA-L cross-check (the known-answer vectors still ran)");
}
