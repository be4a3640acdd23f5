//! Recovery of up to two missing chunks of a stripe, built from the four
//! kernel primitives. One function serves every SIMD level, so the case
//! analysis (which of D, P, Q are missing) is written once.
//!
//! With data chunks D0..Dn-1, P = sum Di and Q = sum g^i Di:
//! - one data chunk x, P present: Dx = P ^ sum of the other Di (as RAID5);
//! - data x and P: Qx = Q ^ Q(others) = g^x Dx, so Dx = g^-x * (Q ^ Q(others)),
//!   then P is regenerated;
//! - data x < y: with Pxy = P ^ P(others) = Dx ^ Dy and
//!   Qxy = Q ^ Q(others) = g^x Dx ^ g^y Dy,
//!   Dy = Pxy / (g^(y-x) ^ 1) ^ Qxy / (g^x ^ g^y) and Dx = Pxy ^ Dy
//!   (H. Peter Anvin, "The mathematics of RAID-6", as Linux md does it);
//! - parity only: regenerate it.

use super::gf;
use super::kernels::Kernels;
use super::ParityKind;

/// Rebuilds `missing` in place. The request must have passed `validate`.
pub(crate) fn recover(k: &Kernels, kind: ParityKind, chunks: &mut [&mut [u8]], missing: &[usize]) {
    let n = chunks.len() - kind.parity_chunks();
    let (pi, qi) = (n, n + 1);
    let len = chunks[0].len();
    let mut m = missing.to_vec();
    m.sort_unstable();
    match (kind, m.as_slice()) {
        (_, []) => {}
        // Any one chunk covered by P (a data chunk, or P itself): XOR of the
        // rest of the data and P.
        (ParityKind::P, &[x]) => xor_rest(k, chunks, x, pi),
        (ParityKind::PQ, &[x]) if x <= pi => xor_rest(k, chunks, x, pi),
        (ParityKind::PQ, &[_q]) => regen_q(k, chunks, n, len),
        (ParityKind::PQ, &[x, y]) if x == pi && y == qi => {
            let (data, parity) = chunks.split_at_mut(n);
            let [p, q] = parity else { unreachable!() };
            k.pq_gen(&super::ro(data), p, q);
        }
        (ParityKind::PQ, &[x, y]) if y == qi => {
            xor_rest(k, chunks, x, pi);
            regen_q(k, chunks, n, len);
        }
        (ParityKind::PQ, &[x, y]) if y == pi => data_and_p(k, chunks, n, x, len),
        (ParityKind::PQ, &[x, y]) => two_data(k, chunks, n, x, y, len),
        (ParityKind::P, _) | (ParityKind::PQ, _) => unreachable!("validate bounds missing"),
    }
}

/// chunks[x] = XOR of chunks[0..=last] other than x.
fn xor_rest(k: &Kernels, chunks: &mut [&mut [u8]], x: usize, last: usize) {
    let out = std::mem::take(&mut chunks[x]);
    let srcs: Vec<&[u8]> = (0..=last)
        .filter(|&i| i != x)
        .map(|i| &*chunks[i])
        .collect();
    k.xor_gen(&srcs, out);
    chunks[x] = out;
}

/// Q from the data, with a scratch buffer for the P the kernel also writes.
fn regen_q(k: &Kernels, chunks: &mut [&mut [u8]], n: usize, len: usize) {
    let mut scratch_p = vec![0u8; len];
    let (data, parity) = chunks.split_at_mut(n);
    k.pq_gen(&super::ro(data), &mut scratch_p, parity[1]);
}

/// Data chunk x and P missing: solve x from Q, then regenerate P.
fn data_and_p(k: &Kernels, chunks: &mut [&mut [u8]], n: usize, x: usize, len: usize) {
    let zero = vec![0u8; len];
    let dx = std::mem::take(&mut chunks[x]);
    let (data, parity) = chunks.split_at_mut(n);
    let [p, q] = parity else { unreachable!() };
    let srcs: Vec<&[u8]> = data
        .iter()
        .enumerate()
        .map(|(i, d)| if i == x { &zero[..] } else { &**d })
        .collect();
    // p <- P(others), dx <- Q(others)
    k.pq_gen(&srcs, p, dx);
    // dx <- g^-x * (Q ^ Q(others))
    k.mul_xor(gf::inv(gf::pow2(x)), q, dx);
    // p <- P(others) ^ Dx  (multiplying by 1 makes mul_xor a plain XOR)
    k.mul_xor(1, dx, p);
    chunks[x] = dx;
}

/// Data chunks x < y missing.
fn two_data(k: &Kernels, chunks: &mut [&mut [u8]], n: usize, x: usize, y: usize, len: usize) {
    let zero = vec![0u8; len];
    let dx = std::mem::take(&mut chunks[x]);
    let dy = std::mem::take(&mut chunks[y]);
    {
        let (data, parity) = chunks.split_at(n);
        let srcs: Vec<&[u8]> = data
            .iter()
            .enumerate()
            .map(|(i, d)| if i == x || i == y { &zero[..] } else { &**d })
            .collect();
        // dy <- P(others), dx <- Q(others): scratch space in the outputs.
        k.pq_gen(&srcs, dy, dx);
        let a = gf::inv(gf::pow2(y - x) ^ 1);
        let b = gf::inv(gf::pow2(x) ^ gf::pow2(y));
        // dy <- a*Pxy ^ b*Qxy = Dy, dx <- Pxy ^ Dy = Dx
        k.two_data(a, b, parity[0], parity[1], dy, dx);
    }
    chunks[x] = dx;
    chunks[y] = dy;
}
