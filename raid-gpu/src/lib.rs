//! raid-gpu: the parity engine on wgpu compute shaders, and the engine the
//! array runs, which picks the GPU or the CPU per call.
//!
//! - [`GpuEngine`]: RAID5 P and RAID6 P+Q generation and the recovery of any
//!   one or two chunks, batched over many stripes per dispatch, bit-identical
//!   to `raid_core`'s CPU engine (one WGSL kernel computes every operation as
//!   a GF(2^8) linear combination; [`plan`] works out the coefficients).
//! - [`Selection`]: `cpu`, `gpu` or `auto`, with the CPU taking over, without
//!   failing a call, when the GPU is missing or lost.
//! - [`calibrate`]: both engines timed side by side, transfers included;
//!   `auto`'s threshold and the benchmark come from it.
//!
//! Dependencies point raidctl -> raid-gpu -> raid-core: this crate knows the
//! parity trait, never the array.

pub mod adapter;
pub mod calibrate;
mod engine;
mod pack;
mod plan;
mod select;
pub mod verify;

pub use adapter::AdapterSummary;
pub use engine::{GpuEngine, GpuStats, WAIT_LIMIT};
pub use raid_core::parity::{CpuEngine, ParityEngine};
pub use select::{EngineReport, Fallback, ParityMode, Selection, StripeShape};

/// Why the GPU engine could not be opened or could not finish.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum GpuError {
    #[error("no usable GPU adapter: {0}")]
    NoAdapter(String),
    #[error("the GPU device could not be opened: {0}")]
    Device(String),
    #[error("the GPU failed: {0}")]
    Lost(String),
}
