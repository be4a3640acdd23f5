//! Batch calls on stripes held as owned chunks (`D0..Dn-1`, then P[, Q]):
//! shared by the parity conformance suite and raid-gpu's engine tests.
#![allow(dead_code)]

use raid_core::parity::{GenJob, ParityEngine, ParityError, ParityKind, RecoverJob};

/// One `gen_batch` call writing every stripe's parity chunks.
pub fn gen_all(
    e: &dyn ParityEngine,
    kind: ParityKind,
    stripes: &mut [Vec<Vec<u8>>],
) -> Result<(), ParityError> {
    let mut jobs: Vec<GenJob> = stripes
        .iter_mut()
        .map(|s| {
            let n = s.len() - kind.parity_chunks();
            let (data, parity) = s.split_at_mut(n);
            GenJob {
                data: data.iter().map(|c| &c[..]).collect(),
                parity: parity.iter_mut().map(|c| &mut c[..]).collect(),
            }
        })
        .collect();
    e.gen_batch(kind, &mut jobs)
}

/// Overwrites each stripe's `missing` chunks with `junk`, then rebuilds
/// them with one `recover_batch` call.
pub fn wipe_and_recover_all(
    e: &dyn ParityEngine,
    kind: ParityKind,
    stripes: &mut [Vec<Vec<u8>>],
    missing: &[Vec<usize>],
    junk: u8,
) -> Result<(), ParityError> {
    for (s, m) in stripes.iter_mut().zip(missing) {
        for &c in m {
            s[c].fill(junk);
        }
    }
    let mut jobs: Vec<RecoverJob> = stripes
        .iter_mut()
        .zip(missing)
        .map(|(s, m)| RecoverJob {
            chunks: s.iter_mut().map(|c| &mut c[..]).collect(),
            missing: m.clone(),
        })
        .collect();
    e.recover_batch(kind, &mut jobs)
}
