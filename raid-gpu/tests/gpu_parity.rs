//! The parity conformance suite of raid-core (tests/common/parity_suite.rs),
//! run against the GPU engine: the same properties, pairs, known answers and
//! refusals as every CPU SIMD level. In CI the adapter is Mesa's lavapipe
//! (Vulkan on the CPU), which runs the same WGSL a GPU does.
//!
//! Without any adapter the suite fails rather than passes vacuously, unless
//! RAID_GPU_TESTS=skip says that this machine is known to have none.

#[path = "../../raid-core/tests/common/batches.rs"]
mod batches;

#[path = "../../raid-core/tests/common/parity_suite.rs"]
mod suite;

use raid_core::parity::ParityEngine;
use raid_gpu::GpuEngine;
use std::sync::{Arc, OnceLock};

/// One engine for the whole binary: opening a device per proptest case
/// would cost more than the cases.
fn engines() -> Vec<Arc<dyn ParityEngine>> {
    static GPU: OnceLock<Option<Arc<GpuEngine>>> = OnceLock::new();
    let gpu = GPU.get_or_init(|| match GpuEngine::new() {
        Ok(g) => {
            eprintln!("GPU parity suite on {}", g.adapter());
            Some(Arc::new(g))
        }
        Err(e) if std::env::var("RAID_GPU_TESTS").is_ok_and(|v| v == "skip") => {
            eprintln!("RAID_GPU_TESTS=skip and {e}: the GPU suite runs no engine");
            None
        }
        Err(e) => {
            panic!("{e} (install mesa-vulkan-drivers for lavapipe, or set RAID_GPU_TESTS=skip)")
        }
    });
    gpu.iter()
        .map(|g| g.clone() as Arc<dyn ParityEngine>)
        .collect()
}
