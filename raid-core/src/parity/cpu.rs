//! The CPU parity engine: SIMD kernels chosen at run time, large chunks
//! split by column over rayon's threads.

use super::kernels::{Kernels, SimdLevel};
use super::{recover, validate, validate_gen, ParityEngine, ParityError, ParityKind};
use rayon::prelude::*;
use std::ops::Range;

/// Chunks longer than this are cut into column ranges of this size and the
/// ranges spread over threads. 256 KiB x (data chunks) keeps each task's
/// working set within a core's L2 while amortising rayon's few-microsecond
/// task cost.
const COLUMN: usize = 256 * 1024;

/// RAID5/RAID6 parity on the CPU.
#[derive(Clone, Copy)]
pub struct CpuEngine {
    kernels: Kernels,
    parallel: bool,
}

impl Default for CpuEngine {
    fn default() -> Self {
        CpuEngine::new()
    }
}

impl CpuEngine {
    /// The best level this CPU supports, using every core for large chunks.
    pub fn new() -> CpuEngine {
        CpuEngine::with_level(SimdLevel::best()).expect("best() is supported")
    }

    /// A given level; refused when the CPU lacks it.
    pub fn with_level(level: SimdLevel) -> Result<CpuEngine, ParityError> {
        Ok(CpuEngine {
            kernels: Kernels::new(level)?,
            parallel: true,
        })
    }

    /// The same engine, never splitting a stripe over threads (what the
    /// single-core benchmark and callers with their own parallelism want).
    pub fn single_threaded(mut self) -> CpuEngine {
        self.parallel = false;
        self
    }

    pub fn level(&self) -> SimdLevel {
        self.kernels.level()
    }

    /// Whether a call on chunks of `len` bytes is cut over threads. Small
    /// calls run on the caller's thread: handing them to rayon's pool would
    /// cost a cross-thread wake-up, more than the parity itself.
    fn split(&self, len: usize) -> bool {
        self.parallel && len > COLUMN
    }

    /// The column ranges one call is cut into.
    fn columns(&self, len: usize) -> Vec<Range<usize>> {
        (0..len)
            .step_by(COLUMN)
            .map(|s| s..(s + COLUMN).min(len))
            .collect()
    }
}

/// Cuts every chunk into the same column ranges: result[r][c] is chunk c's
/// slice for range r.
fn split_mut<'a>(chunks: &'a mut [&mut [u8]], cols: &[Range<usize>]) -> Vec<Vec<&'a mut [u8]>> {
    let mut out: Vec<Vec<&mut [u8]>> = cols
        .iter()
        .map(|_| Vec::with_capacity(chunks.len()))
        .collect();
    for c in chunks.iter_mut() {
        let mut rest: &mut [u8] = c;
        for (r, col) in cols.iter().enumerate() {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(col.len());
            out[r].push(head);
            rest = tail;
        }
    }
    out
}

impl ParityEngine for CpuEngine {
    fn name(&self) -> String {
        format!("cpu/{}", self.kernels.level())
    }

    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) -> Result<(), ParityError> {
        validate_gen(ParityKind::P, data, &[p])?;
        if !self.split(p.len()) {
            self.kernels.xor_gen(data, p);
            return Ok(());
        }
        let cols = self.columns(p.len());
        let mut outs = [p];
        let mut ps = split_mut(&mut outs, &cols);
        ps.par_iter_mut().zip(cols.par_iter()).for_each(|(p, col)| {
            let srcs: Vec<&[u8]> = data.iter().map(|d| &d[col.clone()]).collect();
            self.kernels.xor_gen(&srcs, p[0]);
        });
        Ok(())
    }

    fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> Result<(), ParityError> {
        validate_gen(ParityKind::PQ, data, &[p, q])?;
        if !self.split(p.len()) {
            self.kernels.pq_gen(data, p, q);
            return Ok(());
        }
        let cols = self.columns(p.len());
        let mut outs = [p, q];
        let mut pqs = split_mut(&mut outs, &cols);
        pqs.par_iter_mut()
            .zip(cols.par_iter())
            .for_each(|(pq, col)| {
                let srcs: Vec<&[u8]> = data.iter().map(|d| &d[col.clone()]).collect();
                let [p, q] = &mut pq[..] else { unreachable!() };
                self.kernels.pq_gen(&srcs, p, q);
            });
        Ok(())
    }

    /// One pass per delta: P ^= delta (and Q ^= g^i * delta) with the
    /// level's kernel. Deltas are a read-modify-write's few chunks, small:
    /// never split over threads.
    fn update_parity(
        &self,
        kind: ParityKind,
        deltas: &[(usize, &[u8])],
        parity: &mut [&mut [u8]],
    ) -> Result<(), ParityError> {
        super::validate_update(kind, deltas, parity)?;
        match parity {
            [p] => {
                for (_, d) in deltas {
                    // dst = 1 * (src ^ dst): a plain XOR into P.
                    self.kernels.mul_xor(1, d, p);
                }
            }
            [p, q] => {
                for (i, d) in deltas {
                    self.kernels.pq_delta(super::gf::pow2(*i), d, p, q);
                }
            }
            _ => unreachable!("validated above"),
        }
        Ok(())
    }

    fn recover(
        &self,
        kind: ParityKind,
        chunks: &mut [&mut [u8]],
        missing: &[usize],
    ) -> Result<(), ParityError> {
        validate(kind, &super::ro(chunks), missing)?;
        if !self.split(chunks[0].len()) {
            recover::recover(&self.kernels, kind, chunks, missing);
            return Ok(());
        }
        let cols = self.columns(chunks[0].len());
        let mut parts = split_mut(chunks, &cols);
        parts
            .par_iter_mut()
            .for_each(|part| recover::recover(&self.kernels, kind, part, missing));
        Ok(())
    }
}
