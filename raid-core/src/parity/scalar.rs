//! The plain implementation: one byte at a time, written to be read.
//!
//! It is the oracle every SIMD kernel is tested against, and the fallback on
//! CPUs without any vector unit we have a kernel for.

use super::gf;

/// dst = XOR of srcs.
pub fn xor_gen(srcs: &[&[u8]], dst: &mut [u8]) {
    for (i, d) in dst.iter_mut().enumerate() {
        *d = srcs.iter().fold(0, |acc, s| acc ^ s[i]);
    }
}

/// P = XOR of srcs; Q = sum of g^i * srcs[i], by Horner's rule from the
/// highest index down: Q = ((D[n-1] * g + D[n-2]) * g + ...) * g + D[0].
pub fn pq_gen(srcs: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    for i in 0..p.len() {
        let mut pp = 0u8;
        let mut qq = 0u8;
        for s in srcs.iter().rev() {
            pp ^= s[i];
            qq = gf::mul(qq, 2) ^ s[i];
        }
        p[i] = pp;
        q[i] = qq;
    }
}

/// dst = c * (src ^ dst).
pub fn mul_xor(c: u8, src: &[u8], dst: &mut [u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = gf::mul(c, *s ^ *d);
    }
}

/// A data chunk's change applied to P and Q: p ^= delta, q ^= c * delta,
/// where delta = old ^ new of data chunk i and c = g^i.
pub fn pq_delta(c: u8, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
    for ((d, pp), qq) in delta.iter().zip(p.iter_mut()).zip(q.iter_mut()) {
        *pp ^= *d;
        *qq ^= gf::mul(c, *d);
    }
}

/// The last step of two-data recovery (see `recover`): on entry dx and dy hold
/// the P and Q of the surviving data; on exit the two missing data chunks.
pub fn two_data(a: u8, b: u8, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8]) {
    for i in 0..p.len() {
        let pxy = p[i] ^ dx[i];
        let qxy = q[i] ^ dy[i];
        let x = gf::mul(a, pxy) ^ gf::mul(b, qxy);
        dx[i] = x;
        dy[i] = pxy ^ x;
    }
}
