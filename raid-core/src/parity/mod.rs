//! The parity engine: RAID5's P and RAID6's md-compatible P+Q, generation and
//! recovery, single stripe and batched.
//!
//! A stripe is handed over as its chunks in a fixed order: the data chunks
//! `D0..Dn-1`, then `P`, then (RAID6) `Q`. `P = D0 ^ D1 ^ ... ^ Dn-1` and
//! `Q = g^0*D0 ^ g^1*D1 ^ ... ^ g^(n-1)*Dn-1` over GF(2^8) with polynomial
//! 0x11d, exactly as Linux md and ISA-L compute them, so a member written by
//! either can be read by the other.
//!
//! [`ParityEngine`] is the contract the CPU engine ([`CpuEngine`]) and the GPU
//! engine (crate `raid-gpu`) both fulfil, bit for bit. The rules on what a
//! valid request is live in [`validate`] alone, so every engine refuses the
//! same inputs with the same error.

mod cpu;
pub mod gf;
mod kernels;
mod recover;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use cpu::CpuEngine;
pub use kernels::SimdLevel;

use rayon::prelude::*;

/// Chunk lengths must be a non-zero multiple of this: the widest vector the
/// kernels use (AVX-512) and a cache line. Array chunks are 4 KiB multiples,
/// so this never binds in practice.
pub const LEN_MULTIPLE: usize = 64;

/// Q's coefficients g^i repeat after 255 chunks, so Q cannot tell more apart.
pub const MAX_DATA_CHUNKS_PQ: usize = 255;

/// What parity a stripe carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParityKind {
    /// RAID5: P only; tolerates one missing chunk.
    P,
    /// RAID6: P and Q; tolerates any two missing chunks.
    PQ,
}

impl ParityKind {
    /// Parity chunks per stripe.
    pub fn parity_chunks(self) -> usize {
        match self {
            ParityKind::P => 1,
            ParityKind::PQ => 2,
        }
    }

    /// Fewest data chunks a stripe may have: RAID5 of 2 members is 1 data
    /// chunk + P; RAID6 of 4 members is 2 data chunks + P + Q.
    pub fn min_data_chunks(self) -> usize {
        match self {
            ParityKind::P => 1,
            ParityKind::PQ => 2,
        }
    }

    /// Most data chunks a stripe may have.
    pub fn max_data_chunks(self) -> usize {
        match self {
            ParityKind::P => usize::MAX,
            ParityKind::PQ => MAX_DATA_CHUNKS_PQ,
        }
    }
}

impl std::fmt::Display for ParityKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ParityKind::P => "P (RAID5)",
            ParityKind::PQ => "P+Q (RAID6)",
        })
    }
}

/// Why a parity request was refused. Nothing is written when one is returned.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ParityError {
    #[error("chunk {index} is {len} bytes but chunk 0 is {expected}: every chunk of a stripe must be the same length")]
    UnequalLengths {
        index: usize,
        len: usize,
        expected: usize,
    },
    #[error("chunk length {len} is not a non-zero multiple of {LEN_MULTIPLE} bytes: pad chunks to a multiple of {LEN_MULTIPLE}")]
    BadLength { len: usize },
    #[error("{kind} needs at least {min} data chunks, got {got}")]
    TooFewDataChunks {
        kind: ParityKind,
        got: usize,
        min: usize,
    },
    #[error(
        "{kind} takes at most {max} data chunks, got {got}: split the array into narrower stripes"
    )]
    TooManyDataChunks {
        kind: ParityKind,
        got: usize,
        max: usize,
    },
    #[error("{kind} tolerates {tolerated} missing chunks, {missing} were given: the stripe cannot be recovered")]
    TooManyMissing {
        kind: ParityKind,
        missing: usize,
        tolerated: usize,
    },
    #[error("{kind} writes {want} parity chunks, {got} were given")]
    ParityCount {
        kind: ParityKind,
        want: usize,
        got: usize,
    },
    #[error(
        "data chunk index {index} is out of range: {kind} stripes have at most {max} data chunks"
    )]
    DataIndexOutOfRange {
        kind: ParityKind,
        index: usize,
        max: usize,
    },
    #[error("missing chunk index {index} is out of range: the stripe has {chunks} chunks")]
    MissingOutOfRange { index: usize, chunks: usize },
    #[error("missing chunk index {index} is listed twice")]
    DuplicateMissing { index: usize },
    #[error("SIMD level {level} is not supported by this CPU (available: {available})")]
    UnsupportedLevel { level: SimdLevel, available: String },
    /// The engine's hardware failed (a GPU lost or hung). The outputs of the
    /// call are undefined; inputs are untouched, so the call can be repeated
    /// on another engine, which is what `raid-gpu`'s selecting engine does.
    #[error("the {engine} parity engine failed: {reason}; repeat the call on the CPU engine")]
    EngineFailed { engine: String, reason: String },
}

/// One stripe's parity to generate: its data chunks (`D0..Dn-1`, read
/// only) and its parity chunks (`P`, or `P, Q`), written.
pub struct GenJob<'a> {
    pub data: Vec<&'a [u8]>,
    pub parity: Vec<&'a mut [u8]>,
}

/// One stripe to recover: all its chunks (`D0..Dn-1, P[, Q]`) and the indices
/// of the ones to rebuild. The missing chunks' contents on entry are ignored.
pub struct RecoverJob<'a> {
    pub chunks: Vec<&'a mut [u8]>,
    pub missing: Vec<usize>,
}

/// The parity maths of the array, on whatever hardware runs it.
///
/// Implementations must give bit-identical results and refuse exactly what
/// [`validate`] refuses. Batch forms exist because a GPU only pays off over
/// many stripes per dispatch, and because rebuild and scrub have many stripes
/// at hand; the defaults spread the stripes over rayon's threads.
pub trait ParityEngine: Send + Sync {
    /// A short human name, e.g. "cpu/avx512-gfni".
    fn name(&self) -> String;

    /// P = XOR of the data chunks.
    fn gen_p(&self, data: &[&[u8]], p: &mut [u8]) -> Result<(), ParityError>;

    /// P and Q of the data chunks.
    fn gen_pq(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> Result<(), ParityError>;

    /// Rebuilds `missing` chunks of one stripe in place from the others.
    fn recover(
        &self,
        kind: ParityKind,
        chunks: &mut [&mut [u8]],
        missing: &[usize],
    ) -> Result<(), ParityError>;

    /// How many stripes (of `stripe_data_bytes` of data each) this engine
    /// wants per call where the array could batch: runs of full-stripe
    /// writes and large degraded reads. The CPU engine works best one stripe
    /// at a time, while the stripe is in cache: 64-stripe batches made
    /// full-stripe writes about 40% slower here (docs/benchmarks.md). A GPU
    /// engine needs many stripes per call to pay at all.
    fn preferred_batch(&self, stripe_data_bytes: u64) -> usize {
        let _ = stripe_data_bytes;
        1
    }

    /// Writes the parity chunks of many stripes. Stripes may differ in
    /// width and chunk length. Nothing is written unless every job is valid.
    fn gen_batch(&self, kind: ParityKind, jobs: &mut [GenJob<'_>]) -> Result<(), ParityError> {
        validate_gen_batch(kind, jobs)?;
        jobs.par_iter_mut()
            .try_for_each(|j| match (kind, &mut j.parity[..]) {
                (ParityKind::P, [p]) => self.gen_p(&j.data, p),
                (ParityKind::PQ, [p, q]) => self.gen_pq(&j.data, p, q),
                _ => unreachable!("validated above"),
            })
    }

    /// Applies changes of some data chunks to one stripe's parity in place,
    /// what a read-modify-write needs: each `(i, delta)` is data chunk i's
    /// old ^ new bytes; P ^= delta and, for P+Q, Q ^= g^i * delta.
    /// `parity` is `[P]` or `[P, Q]`. The cost follows the chunks that
    /// changed, not the stripe's width. The default generates parity of the
    /// deltas (zeros elsewhere: parity is linear) and adds it, so every
    /// engine has it; the CPU engine does it in one pass per delta.
    fn update_parity(
        &self,
        kind: ParityKind,
        deltas: &[(usize, &[u8])],
        parity: &mut [&mut [u8]],
    ) -> Result<(), ParityError> {
        update_parity_by_generation(self, kind, deltas, parity)
    }

    /// Recovers many stripes, each with its own missing set.
    fn recover_batch(
        &self,
        kind: ParityKind,
        jobs: &mut [RecoverJob<'_>],
    ) -> Result<(), ParityError> {
        validate_recover_batch(kind, jobs)?;
        jobs.par_iter_mut()
            .try_for_each(|j| self.recover(kind, &mut j.chunks, &j.missing))
    }
}

/// [`ParityEngine::update_parity`] through the engine's generation calls:
/// parity of the deltas at their indices (zero chunks elsewhere) XORed into
/// the stripe's parity.
pub fn update_parity_by_generation<E: ParityEngine + ?Sized>(
    engine: &E,
    kind: ParityKind,
    deltas: &[(usize, &[u8])],
    parity: &mut [&mut [u8]],
) -> Result<(), ParityError> {
    validate_update(kind, deltas, parity)?;
    let len = deltas[0].1.len();
    let zero = vec![0u8; len];
    let width = deltas
        .iter()
        .map(|(i, _)| i + 1)
        .max()
        .unwrap_or(1)
        .max(kind.min_data_chunks());
    // A chunk changed twice in one call counts both changes: sum them.
    let mut summed: Vec<Option<Vec<u8>>> = (0..width).map(|_| None).collect();
    for (i, d) in deltas {
        let acc = summed[*i].get_or_insert_with(|| vec![0u8; len]);
        acc.iter_mut().zip(d.iter()).for_each(|(a, b)| *a ^= b);
    }
    let srcs: Vec<&[u8]> = summed
        .iter()
        .map(|c| c.as_deref().unwrap_or(&zero))
        .collect();
    let mut gen: Vec<Vec<u8>> = (0..kind.parity_chunks()).map(|_| vec![0u8; len]).collect();
    match &mut gen[..] {
        [p] => engine.gen_p(&srcs, p)?,
        [p, q] => engine.gen_pq(&srcs, p, q)?,
        _ => unreachable!("one or two parity chunks"),
    }
    for (out, g) in parity.iter_mut().zip(&gen) {
        out.iter_mut().zip(g).for_each(|(a, b)| *a ^= b);
    }
    Ok(())
}

/// What a valid `update_parity` request is: one or two parity chunks as the
/// kind says, at least one delta, every index a data chunk the kind allows,
/// every length equal and a multiple of [`LEN_MULTIPLE`].
pub fn validate_update(
    kind: ParityKind,
    deltas: &[(usize, &[u8])],
    parity: &[&mut [u8]],
) -> Result<(), ParityError> {
    if parity.len() != kind.parity_chunks() {
        return Err(ParityError::ParityCount {
            kind,
            want: kind.parity_chunks(),
            got: parity.len(),
        });
    }
    if deltas.is_empty() {
        return Err(ParityError::BadLength { len: 0 });
    }
    if let Some(&(index, _)) = deltas.iter().find(|(i, _)| *i >= kind.max_data_chunks()) {
        return Err(ParityError::DataIndexOutOfRange {
            kind,
            index,
            max: kind.max_data_chunks(),
        });
    }
    check_lengths(
        deltas
            .iter()
            .map(|(_, d)| d.len())
            .chain(parity.iter().map(|p| p.len())),
    )
}

/// Reborrows a stripe's chunks as shared slices.
pub fn ro<'a>(chunks: &'a [&mut [u8]]) -> Vec<&'a [u8]> {
    chunks.iter().map(|c| &**c).collect()
}

/// The one place that says what a valid stripe is. `chunks` is the whole
/// stripe (`D0..Dn-1, P[, Q]`); `missing` the indices to recover (empty for
/// generation).
pub fn validate(kind: ParityKind, chunks: &[&[u8]], missing: &[usize]) -> Result<(), ParityError> {
    let n_data = chunks.len().saturating_sub(kind.parity_chunks());
    if chunks.len() < kind.parity_chunks() + kind.min_data_chunks() {
        return Err(ParityError::TooFewDataChunks {
            kind,
            got: n_data,
            min: kind.min_data_chunks(),
        });
    }
    if n_data > kind.max_data_chunks() {
        return Err(ParityError::TooManyDataChunks {
            kind,
            got: n_data,
            max: kind.max_data_chunks(),
        });
    }
    check_lengths(chunks.iter().map(|c| c.len()))?;
    if missing.len() > kind.parity_chunks() {
        return Err(ParityError::TooManyMissing {
            kind,
            missing: missing.len(),
            tolerated: kind.parity_chunks(),
        });
    }
    for (k, &m) in missing.iter().enumerate() {
        if m >= chunks.len() {
            return Err(ParityError::MissingOutOfRange {
                index: m,
                chunks: chunks.len(),
            });
        }
        if missing[..k].contains(&m) {
            return Err(ParityError::DuplicateMissing { index: m });
        }
    }
    Ok(())
}

/// Every job of a `gen_batch` call, before any is computed: a refused batch
/// writes nothing.
pub fn validate_gen_batch(kind: ParityKind, jobs: &[GenJob<'_>]) -> Result<(), ParityError> {
    jobs.iter().try_for_each(|j| validate_gen_job(kind, j))
}

/// Every job of a `recover_batch` call, before any is recovered.
pub fn validate_recover_batch(
    kind: ParityKind,
    jobs: &[RecoverJob<'_>],
) -> Result<(), ParityError> {
    jobs.iter()
        .try_for_each(|j| validate(kind, &ro(&j.chunks), &j.missing))
}

/// [`validate_gen`] for a batch job, which also carries the parity count.
fn validate_gen_job(kind: ParityKind, j: &GenJob<'_>) -> Result<(), ParityError> {
    if j.parity.len() != kind.parity_chunks() {
        return Err(ParityError::ParityCount {
            kind,
            want: kind.parity_chunks(),
            got: j.parity.len(),
        });
    }
    validate_gen(kind, &j.data, &ro(&j.parity))
}

/// Every length equal to the first, and a non-zero multiple of [`LEN_MULTIPLE`].
fn check_lengths(mut lens: impl Iterator<Item = usize>) -> Result<(), ParityError> {
    let expected = lens.next().unwrap_or(0);
    if expected == 0 || !expected.is_multiple_of(LEN_MULTIPLE) {
        return Err(ParityError::BadLength { len: expected });
    }
    for (i, len) in lens.enumerate() {
        if len != expected {
            return Err(ParityError::UnequalLengths {
                index: i + 1,
                len,
                expected,
            });
        }
    }
    Ok(())
}

/// Validates a generation request given as separate data and parity slices.
pub fn validate_gen(kind: ParityKind, data: &[&[u8]], parity: &[&[u8]]) -> Result<(), ParityError> {
    if data.len() < kind.min_data_chunks() {
        return Err(ParityError::TooFewDataChunks {
            kind,
            got: data.len(),
            min: kind.min_data_chunks(),
        });
    }
    if data.len() > kind.max_data_chunks() {
        return Err(ParityError::TooManyDataChunks {
            kind,
            got: data.len(),
            max: kind.max_data_chunks(),
        });
    }
    check_lengths(data.iter().chain(parity).map(|c| c.len()))
}
