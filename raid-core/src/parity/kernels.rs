//! Kernel selection: one table of function pointers per instruction-set
//! level, chosen once, plus the algorithms every vector level shares.
//!
//! Each algorithm is written once, generic over [`Vector`], and instantiated
//! inside a `#[target_feature]` function per level (in `x86.rs`), so the
//! compiler emits that level's instructions. The scalar level is the oracle in
//! `scalar.rs`.

use super::{scalar, ParityError};

/// An instruction-set level the CPU engine can run at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SimdLevel {
    Scalar,
    Ssse3,
    Avx2,
    /// AVX2 registers with GFNI's affine instruction for GF multiplies.
    Avx2Gfni,
    /// AVX-512 (F + BW), multiplies by nibble shuffles.
    Avx512,
    /// AVX-512 with GFNI's affine instruction for GF multiplies.
    Avx512Gfni,
}

impl SimdLevel {
    /// Every level, best first: the order `best()` tries them in.
    /// GFNI levels come first: one affine instruction replaces the three
    /// to five of a shuffle-based or shift-based multiply (see benches).
    pub const ALL: [SimdLevel; 6] = [
        SimdLevel::Avx512Gfni,
        SimdLevel::Avx512,
        SimdLevel::Avx2Gfni,
        SimdLevel::Avx2,
        SimdLevel::Ssse3,
        SimdLevel::Scalar,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Ssse3 => "ssse3",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx2Gfni => "avx2-gfni",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Avx512Gfni => "avx512-gfni",
        }
    }

    /// Parses a level name as printed by [`SimdLevel::name`].
    pub fn from_name(s: &str) -> Option<SimdLevel> {
        SimdLevel::ALL.into_iter().find(|l| l.name() == s)
    }

    /// Whether this CPU can run the level.
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Ssse3 => std::arch::is_x86_feature_detected!("ssse3"),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2Gfni => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("gfni")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Gfni => {
                SimdLevel::Avx512.is_supported() && std::arch::is_x86_feature_detected!("gfni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The levels this CPU supports, best first.
    pub fn available() -> Vec<SimdLevel> {
        SimdLevel::ALL
            .into_iter()
            .filter(|l| l.is_supported())
            .collect()
    }

    /// The best level this CPU supports.
    pub fn best() -> SimdLevel {
        SimdLevel::available()[0]
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

type XorGen = unsafe fn(&[&[u8]], &mut [u8]);
type PqGen = unsafe fn(&[&[u8]], &mut [u8], &mut [u8]);
type MulXor = unsafe fn(u8, &[u8], &mut [u8]);
type TwoData = unsafe fn(u8, u8, &[u8], &[u8], &mut [u8], &mut [u8]);
type PqDelta = unsafe fn(u8, &[u8], &mut [u8], &mut [u8]);

/// The primitives every parity operation is built from, for one level.
///
/// The function pointers are `unsafe` because the SIMD ones need CPU features
/// and read through raw pointers; the safe methods below uphold both: a
/// `Kernels` is only built for a supported level, and each method checks that
/// every slice is as long as the output before calling in.
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    level: SimdLevel,
    xor_gen: XorGen,
    pq_gen: PqGen,
    mul_xor: MulXor,
    two_data: TwoData,
    pq_delta: PqDelta,
}

impl Kernels {
    pub fn new(level: SimdLevel) -> Result<Kernels, ParityError> {
        if !level.is_supported() {
            return Err(ParityError::UnsupportedLevel {
                level,
                available: SimdLevel::available()
                    .iter()
                    .map(|l| l.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let scalar = Kernels {
            level,
            xor_gen: scalar::xor_gen,
            pq_gen: scalar::pq_gen,
            mul_xor: scalar::mul_xor,
            two_data: scalar::two_data,
            pq_delta: scalar::pq_delta,
        };
        #[cfg(target_arch = "x86_64")]
        {
            use super::x86;
            macro_rules! table {
                ($m:ident) => {
                    Kernels {
                        level,
                        xor_gen: x86::$m::xor_gen,
                        pq_gen: x86::$m::pq_gen,
                        mul_xor: x86::$m::mul_xor,
                        two_data: x86::$m::two_data,
                        pq_delta: x86::$m::pq_delta,
                    }
                };
            }
            return Ok(match level {
                SimdLevel::Scalar => scalar,
                SimdLevel::Ssse3 => table!(ssse3),
                SimdLevel::Avx2 => table!(avx2),
                SimdLevel::Avx2Gfni => table!(avx2_gfni),
                SimdLevel::Avx512 => table!(avx512),
                SimdLevel::Avx512Gfni => table!(avx512_gfni),
            });
        }
        #[allow(unreachable_code)]
        Ok(scalar)
    }

    pub fn level(&self) -> SimdLevel {
        self.level
    }

    /// dst = XOR of srcs (at least one).
    pub fn xor_gen(&self, srcs: &[&[u8]], dst: &mut [u8]) {
        assert!(!srcs.is_empty() && srcs.iter().all(|s| s.len() == dst.len()));
        assert!(dst.len().is_multiple_of(super::LEN_MULTIPLE));
        // SAFETY: the level is supported (checked in `new`) and every source is
        // exactly as long as dst, a multiple of every vector width.
        unsafe { (self.xor_gen)(srcs, dst) }
    }

    /// P and Q of srcs (at least one).
    pub fn pq_gen(&self, srcs: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        assert!(!srcs.is_empty() && srcs.iter().all(|s| s.len() == p.len()) && q.len() == p.len());
        assert!(p.len().is_multiple_of(super::LEN_MULTIPLE));
        // SAFETY: as in xor_gen.
        unsafe { (self.pq_gen)(srcs, p, q) }
    }

    /// dst = c * (src ^ dst).
    pub fn mul_xor(&self, c: u8, src: &[u8], dst: &mut [u8]) {
        assert!(src.len() == dst.len() && dst.len().is_multiple_of(super::LEN_MULTIPLE));
        // SAFETY: as in xor_gen.
        unsafe { (self.mul_xor)(c, src, dst) }
    }

    /// p ^= delta, q ^= c * delta: a data chunk's change applied to P and
    /// Q in one pass (see `scalar::pq_delta`).
    pub fn pq_delta(&self, c: u8, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
        let n = delta.len();
        assert!(p.len() == n && q.len() == n && n.is_multiple_of(super::LEN_MULTIPLE));
        // SAFETY: as in xor_gen.
        unsafe { (self.pq_delta)(c, delta, p, q) }
    }

    /// See `scalar::two_data`.
    pub fn two_data(&self, a: u8, b: u8, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8]) {
        let n = p.len();
        assert!(
            q.len() == n && dx.len() == n && dy.len() == n && n.is_multiple_of(super::LEN_MULTIPLE)
        );
        // SAFETY: as in xor_gen.
        unsafe { (self.two_data)(a, b, p, q, dx, dy) }
    }
}

/// One SIMD register's worth of bytes and the GF(2^8) operations on it.
///
/// Every method is `unsafe` and `#[inline(always)]`: it is only sound inside
/// a function compiled with the level's target features, into which it is
/// inlined.
pub(crate) trait Vector: Copy {
    const BYTES: usize;
    /// A constant prepared for repeated multiplication.
    type Mul: Copy;
    unsafe fn load(p: *const u8) -> Self;
    unsafe fn store(self, p: *mut u8);
    unsafe fn xor(self, o: Self) -> Self;
    /// Multiply every byte by g = 2.
    unsafe fn mul2(self) -> Self;
    unsafe fn mul_prep(c: u8) -> Self::Mul;
    unsafe fn mul(self, m: Self::Mul) -> Self;
}

/// Vectors processed per loop iteration: enough independent chains to hide
/// the multiply latency, few enough to stay in registers.
const UNROLL: usize = 4;

/// The algorithms, once, for any vector type. Each `unsafe fn` requires that
/// the caller runs with `V`'s target features, that `srcs` is non-empty, and
/// that every slice is exactly as long as the output, a multiple of
/// `V::BYTES`.
#[allow(clippy::needless_range_loop)]
pub(crate) mod generic {
    use super::{Vector, UNROLL};

    #[inline(always)]
    unsafe fn load4<V: Vector>(p: *const u8) -> [V; UNROLL] {
        let b = V::BYTES;
        // SAFETY: the caller guarantees UNROLL vectors are readable at p.
        unsafe {
            [
                V::load(p),
                V::load(p.add(b)),
                V::load(p.add(2 * b)),
                V::load(p.add(3 * b)),
            ]
        }
    }

    #[inline(always)]
    unsafe fn store4<V: Vector>(v: [V; UNROLL], p: *mut u8) {
        for k in 0..UNROLL {
            // SAFETY: the caller guarantees UNROLL vectors are writable at p.
            unsafe { v[k].store(p.add(k * V::BYTES)) }
        }
    }

    /// Calls `body(offset, lanes)` over the length in blocks of UNROLL
    /// vectors, then single vectors for the tail.
    #[inline(always)]
    unsafe fn blocks(len: usize, step: usize, mut body: impl FnMut(usize)) {
        let mut off = 0;
        while off + step <= len {
            body(off);
            off += step;
        }
        let _ = off;
    }

    #[inline(always)]
    pub unsafe fn xor_gen<V: Vector>(srcs: &[&[u8]], dst: &mut [u8]) {
        let (first, rest) = srcs.split_first().expect("at least one source");
        let d = dst.as_mut_ptr();
        let b = V::BYTES;
        let len = dst.len();
        let full = len - len % (UNROLL * b);
        // SAFETY (whole body): offsets stay below `len`, which every slice has.
        unsafe {
            blocks(full, UNROLL * b, |off| {
                let mut a = load4::<V>(first.as_ptr().add(off));
                for s in rest {
                    let x = load4::<V>(s.as_ptr().add(off));
                    for k in 0..UNROLL {
                        a[k] = a[k].xor(x[k]);
                    }
                }
                store4(a, d.add(off));
            });
            blocks(len - full, b, |o| {
                let off = full + o;
                let mut a = V::load(first.as_ptr().add(off));
                for s in rest {
                    a = a.xor(V::load(s.as_ptr().add(off)));
                }
                a.store(d.add(off));
            });
        }
    }

    #[inline(always)]
    pub unsafe fn pq_gen<V: Vector>(srcs: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        // Horner's rule from the highest index down, as scalar::pq_gen.
        let (last, rest) = srcs.split_last().expect("at least one source");
        let (pp, qp) = (p.as_mut_ptr(), q.as_mut_ptr());
        let b = V::BYTES;
        let len = p.len();
        let full = len - len % (UNROLL * b);
        // SAFETY (whole body): offsets stay below `len`, which every slice has.
        unsafe {
            blocks(full, UNROLL * b, |off| {
                let mut pv = load4::<V>(last.as_ptr().add(off));
                let mut qv = pv;
                for s in rest.iter().rev() {
                    let x = load4::<V>(s.as_ptr().add(off));
                    for k in 0..UNROLL {
                        pv[k] = pv[k].xor(x[k]);
                        qv[k] = qv[k].mul2().xor(x[k]);
                    }
                }
                store4(pv, pp.add(off));
                store4(qv, qp.add(off));
            });
            blocks(len - full, b, |o| {
                let off = full + o;
                let mut pv = V::load(last.as_ptr().add(off));
                let mut qv = pv;
                for s in rest.iter().rev() {
                    let x = V::load(s.as_ptr().add(off));
                    pv = pv.xor(x);
                    qv = qv.mul2().xor(x);
                }
                pv.store(pp.add(off));
                qv.store(qp.add(off));
            });
        }
    }

    #[inline(always)]
    pub unsafe fn mul_xor<V: Vector>(c: u8, src: &[u8], dst: &mut [u8]) {
        let d = dst.as_mut_ptr();
        let s = src.as_ptr();
        // SAFETY (whole body): offsets stay below the common length.
        unsafe {
            if c == 1 {
                // A plain XOR (RAID5's parity update, a P recovery): the
                // multiply's table lookups cost as much as the XOR again.
                blocks(dst.len(), V::BYTES, |off| {
                    V::load(s.add(off))
                        .xor(V::load(d.add(off)))
                        .store(d.add(off));
                });
                return;
            }
            let m = V::mul_prep(c);
            blocks(dst.len(), V::BYTES, |off| {
                V::load(s.add(off))
                    .xor(V::load(d.add(off)))
                    .mul(m)
                    .store(d.add(off));
            });
        }
    }

    #[inline(always)]
    pub unsafe fn pq_delta<V: Vector>(c: u8, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
        let d = delta.as_ptr();
        let pp = p.as_mut_ptr();
        let qp = q.as_mut_ptr();
        // SAFETY (whole body): offsets stay below the common length.
        unsafe {
            let m = V::mul_prep(c);
            blocks(delta.len(), V::BYTES, |off| {
                let x = V::load(d.add(off));
                V::load(pp.add(off)).xor(x).store(pp.add(off));
                V::load(qp.add(off)).xor(x.mul(m)).store(qp.add(off));
            });
        }
    }

    #[inline(always)]
    pub unsafe fn two_data<V: Vector>(
        a: u8,
        b: u8,
        p: &[u8],
        q: &[u8],
        dx: &mut [u8],
        dy: &mut [u8],
    ) {
        let (xp, yp) = (dx.as_mut_ptr(), dy.as_mut_ptr());
        let (pp, qp) = (p.as_ptr(), q.as_ptr());
        // SAFETY (whole body): offsets stay below the common length.
        unsafe {
            let (ma, mb) = (V::mul_prep(a), V::mul_prep(b));
            blocks(p.len(), V::BYTES, |off| {
                let pxy = V::load(pp.add(off)).xor(V::load(xp.add(off)));
                let qxy = V::load(qp.add(off)).xor(V::load(yp.add(off)));
                let x = pxy.mul(ma).xor(qxy.mul(mb));
                x.store(xp.add(off));
                pxy.xor(x).store(yp.add(off));
            });
        }
    }
}
