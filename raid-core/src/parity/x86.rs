//! x86-64 vector types for the generic kernels, and one module of
//! `#[target_feature]` entry points per level.
//!
//! Multiplication by a constant uses either the nibble-shuffle method (two
//! 16-entry tables, `pshufb`) or, with GFNI, one `gf2p8affineqb` with the
//! constant's bit matrix (see `gf::affine_matrix`). Multiplication by 2 (the
//! inner step of Q) uses add-and-reduce: shift left, XOR 0x1d where the top
//! bit was set, or the affine instruction where that is one instruction.

use super::gf;
use super::kernels::Vector;
use std::arch::x86_64::*;

/// The bit matrix of multiplication by 2, fixed at compile time: `mul2` is
/// the innermost step of Q and must not rebuild it per vector.
const AFFINE_MUL2: i64 = gf::affine_matrix(2) as i64;

/// Loads a 16-byte shuffle table.
#[inline(always)]
fn table16(t: &[u8; 16]) -> __m128i {
    // SAFETY: t is 16 readable bytes; an unaligned SSE2 load is baseline x86-64.
    unsafe { _mm_loadu_si128(t.as_ptr() as *const __m128i) }
}

// ---------------------------------------------------------------- SSSE3 ---
#[derive(Clone, Copy)]
pub struct Sse(__m128i);

impl Vector for Sse {
    const BYTES: usize = 16;
    type Mul = (__m128i, __m128i);
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        unsafe { Sse(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        unsafe { _mm_storeu_si128(p as *mut __m128i, self.0) }
    }
    #[inline(always)]
    unsafe fn xor(self, o: Self) -> Self {
        unsafe { Sse(_mm_xor_si128(self.0, o.0)) }
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        unsafe {
            let hi = _mm_cmpgt_epi8(_mm_setzero_si128(), self.0);
            let dbl = _mm_add_epi8(self.0, self.0);
            Sse(_mm_xor_si128(
                dbl,
                _mm_and_si128(hi, _mm_set1_epi8(gf::POLY as i8)),
            ))
        }
    }
    #[inline(always)]
    unsafe fn mul_prep(c: u8) -> Self::Mul {
        let (lo, hi) = gf::nibble_tables(c);
        (table16(&lo), table16(&hi))
    }
    #[inline(always)]
    unsafe fn mul(self, m: Self::Mul) -> Self {
        unsafe {
            let mask = _mm_set1_epi8(0x0f);
            let lo = _mm_and_si128(self.0, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(self.0, 4), mask);
            Sse(_mm_xor_si128(
                _mm_shuffle_epi8(m.0, lo),
                _mm_shuffle_epi8(m.1, hi),
            ))
        }
    }
}

// ----------------------------------------------------------------- AVX2 ---
#[derive(Clone, Copy)]
pub struct Avx2(__m256i);

impl Avx2 {
    #[inline(always)]
    unsafe fn xor_raw(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_xor_si256(a, b) }
    }
}

impl Vector for Avx2 {
    const BYTES: usize = 32;
    type Mul = (__m256i, __m256i);
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        unsafe { Avx2(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        unsafe { _mm256_storeu_si256(p as *mut __m256i, self.0) }
    }
    #[inline(always)]
    unsafe fn xor(self, o: Self) -> Self {
        unsafe { Avx2(Avx2::xor_raw(self.0, o.0)) }
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        unsafe {
            let hi = _mm256_cmpgt_epi8(_mm256_setzero_si256(), self.0);
            let dbl = _mm256_add_epi8(self.0, self.0);
            Avx2(_mm256_xor_si256(
                dbl,
                _mm256_and_si256(hi, _mm256_set1_epi8(gf::POLY as i8)),
            ))
        }
    }
    #[inline(always)]
    unsafe fn mul_prep(c: u8) -> Self::Mul {
        let (lo, hi) = gf::nibble_tables(c);
        unsafe {
            (
                _mm256_broadcastsi128_si256(table16(&lo)),
                _mm256_broadcastsi128_si256(table16(&hi)),
            )
        }
    }
    #[inline(always)]
    unsafe fn mul(self, m: Self::Mul) -> Self {
        unsafe {
            let mask = _mm256_set1_epi8(0x0f);
            let lo = _mm256_and_si256(self.0, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(self.0, 4), mask);
            Avx2(_mm256_xor_si256(
                _mm256_shuffle_epi8(m.0, lo),
                _mm256_shuffle_epi8(m.1, hi),
            ))
        }
    }
}

/// AVX2 registers, GFNI multiplies.
#[derive(Clone, Copy)]
pub struct Avx2Gfni(__m256i);

impl Vector for Avx2Gfni {
    const BYTES: usize = 32;
    type Mul = __m256i;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        unsafe { Avx2Gfni(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        unsafe { _mm256_storeu_si256(p as *mut __m256i, self.0) }
    }
    #[inline(always)]
    unsafe fn xor(self, o: Self) -> Self {
        unsafe { Avx2Gfni(_mm256_xor_si256(self.0, o.0)) }
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        unsafe { self.mul(_mm256_set1_epi64x(AFFINE_MUL2)) }
    }
    #[inline(always)]
    unsafe fn mul_prep(c: u8) -> Self::Mul {
        unsafe { _mm256_set1_epi64x(gf::affine_matrix(c) as i64) }
    }
    #[inline(always)]
    unsafe fn mul(self, m: Self::Mul) -> Self {
        unsafe { Avx2Gfni(_mm256_gf2p8affine_epi64_epi8::<0>(self.0, m)) }
    }
}

// -------------------------------------------------------------- AVX-512 ---
#[derive(Clone, Copy)]
pub struct Avx512(__m512i);

impl Vector for Avx512 {
    const BYTES: usize = 64;
    type Mul = (__m512i, __m512i);
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        unsafe { Avx512(_mm512_loadu_si512(p as *const __m512i)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        unsafe { _mm512_storeu_si512(p as *mut __m512i, self.0) }
    }
    #[inline(always)]
    unsafe fn xor(self, o: Self) -> Self {
        unsafe { Avx512(_mm512_xor_si512(self.0, o.0)) }
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        unsafe {
            let hi = _mm512_movepi8_mask(self.0);
            let dbl = _mm512_add_epi8(self.0, self.0);
            Avx512(_mm512_xor_si512(
                dbl,
                _mm512_maskz_mov_epi8(hi, _mm512_set1_epi8(gf::POLY as i8)),
            ))
        }
    }
    #[inline(always)]
    unsafe fn mul_prep(c: u8) -> Self::Mul {
        let (lo, hi) = gf::nibble_tables(c);
        unsafe {
            (
                _mm512_broadcast_i32x4(table16(&lo)),
                _mm512_broadcast_i32x4(table16(&hi)),
            )
        }
    }
    #[inline(always)]
    unsafe fn mul(self, m: Self::Mul) -> Self {
        unsafe {
            let mask = _mm512_set1_epi8(0x0f);
            let lo = _mm512_and_si512(self.0, mask);
            let hi = _mm512_and_si512(_mm512_srli_epi16(self.0, 4), mask);
            Avx512(_mm512_xor_si512(
                _mm512_shuffle_epi8(m.0, lo),
                _mm512_shuffle_epi8(m.1, hi),
            ))
        }
    }
}

/// AVX-512 registers, GFNI multiplies.
#[derive(Clone, Copy)]
pub struct Avx512Gfni(__m512i);

impl Vector for Avx512Gfni {
    const BYTES: usize = 64;
    type Mul = __m512i;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        unsafe { Avx512Gfni(_mm512_loadu_si512(p as *const __m512i)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        unsafe { _mm512_storeu_si512(p as *mut __m512i, self.0) }
    }
    #[inline(always)]
    unsafe fn xor(self, o: Self) -> Self {
        unsafe { Avx512Gfni(_mm512_xor_si512(self.0, o.0)) }
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        unsafe { self.mul(_mm512_set1_epi64(AFFINE_MUL2)) }
    }
    #[inline(always)]
    unsafe fn mul_prep(c: u8) -> Self::Mul {
        unsafe { _mm512_set1_epi64(gf::affine_matrix(c) as i64) }
    }
    #[inline(always)]
    unsafe fn mul(self, m: Self::Mul) -> Self {
        unsafe { Avx512Gfni(_mm512_gf2p8affine_epi64_epi8::<0>(self.0, m)) }
    }
}

/// One module of entry points per level: the generic algorithms compiled
/// with that level's features. Callers (`Kernels`) guarantee the features.
macro_rules! level {
    ($m:ident, $V:ty, $features:literal) => {
        pub mod $m {
            use super::super::kernels::generic;
            #[allow(unused_imports)]
            use super::*;

            #[target_feature(enable = $features)]
            pub unsafe fn xor_gen(srcs: &[&[u8]], dst: &mut [u8]) {
                unsafe { generic::xor_gen::<$V>(srcs, dst) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn pq_gen(srcs: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
                unsafe { generic::pq_gen::<$V>(srcs, p, q) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn mul_xor(c: u8, src: &[u8], dst: &mut [u8]) {
                unsafe { generic::mul_xor::<$V>(c, src, dst) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn pq_delta(c: u8, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
                unsafe { generic::pq_delta::<$V>(c, delta, p, q) }
            }
            #[target_feature(enable = $features)]
            pub unsafe fn two_data(a: u8, b: u8, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8]) {
                unsafe { generic::two_data::<$V>(a, b, p, q, dx, dy) }
            }
        }
    };
}

level!(ssse3, Sse, "ssse3");
level!(avx2, Avx2, "avx2");
level!(avx2_gfni, Avx2Gfni, "avx2,gfni");
level!(avx512, Avx512, "avx512f,avx512bw");
level!(avx512_gfni, Avx512Gfni, "avx512f,avx512bw,gfni");
