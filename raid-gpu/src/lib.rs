//! raid-gpu: the parity engine on wgpu compute shaders.
//!
//! Not built yet (see the GPU issue). Until then this crate re-exports the
//! CPU engine so that `raidctl` already depends on it in the direction the
//! architecture fixes: raidctl -> raid-gpu -> raid-core.

pub use raid_core::parity::{CpuEngine, ParityEngine};
