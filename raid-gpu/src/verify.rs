//! Checking GPU results against the CPU engine, on a sample of calls.
//!
//! A GPU without ECC memory, a driver's shader compiler bug or a failing
//! card could hand back parity that is silently wrong: the data would be
//! written right but the redundancy protecting it would not be, and nobody
//! would know until a scrub, or a failed drive whose rebuild returns wrong
//! data. So the selecting engine recomputes a sample of GPU calls (the
//! first, then one in `RAID_GPU_VERIFY_EVERY`, default 64) on the CPU; a
//! difference is treated like a lost GPU. The cost is about 1/64 of the
//! CPU work the GPU saves.

use raid_core::parity::{CpuEngine, ParityEngine, ParityError, ParityKind};

/// Verify the first GPU call and then one in this many, unless
/// `RAID_GPU_VERIFY_EVERY` says otherwise (0: never).
pub const DEFAULT_VERIFY_EVERY: u64 = 64;

pub(crate) fn verify_every_from_env() -> u64 {
    std::env::var("RAID_GPU_VERIFY_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_VERIFY_EVERY)
}

/// Ok when `parity` is what the CPU engine computes from `data`; else the
/// error that makes the selecting engine drop the GPU and redo the call.
pub(crate) fn parity_matches(
    cpu: &CpuEngine,
    kind: ParityKind,
    data: &[&[u8]],
    parity: &[&[u8]],
) -> Result<(), ParityError> {
    let len = parity[0].len();
    let mut want: Vec<Vec<u8>> = (0..kind.parity_chunks()).map(|_| vec![0u8; len]).collect();
    match &mut want[..] {
        [p] => cpu.gen_p(data, p)?,
        [p, q] => cpu.gen_pq(data, p, q)?,
        _ => unreachable!("P or P+Q"),
    }
    for (k, (got, want)) in parity.iter().zip(&want).enumerate() {
        if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
            return Err(ParityError::EngineFailed {
                engine: "gpu".into(),
                reason: format!(
                    "a sampled GPU result differs from the CPU engine's ({} byte {at}): \
                     the GPU's results can no longer be trusted",
                    if k == 0 { "P" } else { "Q" }
                ),
            });
        }
    }
    Ok(())
}

/// Ok when the recovered `missing` chunks are what the CPU engine
/// recovers from the same present chunks. (Not a consistency check of the
/// whole stripe: a stripe whose unused parity was already stale would blame
/// a GPU that did nothing wrong.)
pub(crate) fn recovery_matches(
    cpu: &CpuEngine,
    kind: ParityKind,
    chunks: &[&mut [u8]],
    missing: &[usize],
) -> Result<(), ParityError> {
    let mut copy: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();
    let mut views: Vec<&mut [u8]> = copy.iter_mut().map(|c| &mut c[..]).collect();
    cpu.recover(kind, &mut views, missing)?;
    for &m in missing {
        if let Some(at) = chunks[m].iter().zip(&copy[m]).position(|(a, b)| a != b) {
            return Err(ParityError::EngineFailed {
                engine: "gpu".into(),
                reason: format!(
                    "a sampled GPU recovery differs from the CPU engine's (chunk {m} byte {at}): \
                     the GPU's results can no longer be trusted"
                ),
            });
        }
    }
    Ok(())
}
