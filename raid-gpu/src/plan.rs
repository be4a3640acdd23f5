//! What the GPU is asked to compute, worked out on the CPU.
//!
//! Every parity operation of RAID5/6 — P, Q, and the recovery of any one or
//! two chunks — is, byte column by byte column, a GF(2^8) linear combination
//! of the chunks that are present. So the GPU runs one kernel only: "output
//! = XOR of coefficient x source", and the case analysis (which of D, P, Q
//! are missing, what the coefficients are) lives here, in plain Rust that
//! the unit tests check against the CPU engine without any GPU.
//!
//! Q of all data chunks (sum of g^i * D_i) gets its own form, [`Row::Horner`]:
//! evaluated as ((D_{n-1} * 2 ^ D_{n-2}) * 2 ^ ...) it costs one multiply by
//! 2 per source instead of a general multiply.

use raid_core::parity::{gf, ParityKind};

/// One output chunk as a combination of source chunks (indices into the
/// stripe, `D0..Dn-1, P[, Q]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Row {
    /// XOR of `coef * chunk` over the terms; coefficient 1 is a plain XOR.
    Linear(Vec<(usize, u8)>),
    /// sum of g^i * chunk[i] for i in 0..n: Q of the data chunks.
    Horner(usize),
}

impl Row {
    /// The stripe chunks the row reads.
    pub(crate) fn sources(&self) -> Vec<usize> {
        match self {
            Row::Linear(t) => t.iter().map(|&(i, _)| i).collect(),
            Row::Horner(n) => (0..*n).collect(),
        }
    }
}

/// The rows that generate a stripe's parity from `n` data chunks: P, then Q.
pub(crate) fn gen_rows(kind: ParityKind, n: usize) -> Vec<Row> {
    let p = Row::Linear((0..n).map(|i| (i, 1)).collect());
    match kind {
        ParityKind::P => vec![p],
        ParityKind::PQ => vec![p, Row::Horner(n)],
    }
}

/// The rows that rebuild the `missing` chunks of a stripe with `n` data
/// chunks: `(chunk index, row)` per missing chunk. The request must have
/// passed `raid_core::parity::validate`.
///
/// With P = sum D_i and Q = sum g^i D_i (H. P. Anvin, "The mathematics of
/// RAID-6"), solved for the missing chunks and expanded so that each is a
/// combination of present chunks only.
pub(crate) fn recover_rows(kind: ParityKind, n: usize, missing: &[usize]) -> Vec<(usize, Row)> {
    let (pi, qi) = (n, n + 1);
    let g = gf::pow2;
    let mut m = missing.to_vec();
    m.sort_unstable();
    let xor_of = |skip: &[usize], last: usize| -> Row {
        Row::Linear(
            (0..=last)
                .filter(|i| !skip.contains(i))
                .map(|i| (i, 1))
                .collect(),
        )
    };
    fn data_except(n: usize, skip: &[usize]) -> impl Iterator<Item = usize> + '_ {
        (0..n).filter(move |i| !skip.contains(i))
    }
    let linear =
        |terms: Vec<(usize, u8)>| Row::Linear(terms.into_iter().filter(|t| t.1 != 0).collect());
    match (kind, m.as_slice()) {
        (_, []) => vec![],
        // One chunk covered by P: the XOR of the rest of data and P.
        (ParityKind::P, &[x]) => vec![(x, xor_of(&[x], pi))],
        (ParityKind::PQ, &[x]) if x <= pi => vec![(x, xor_of(&[x], pi))],
        (ParityKind::PQ, &[_q]) => vec![(qi, Row::Horner(n))],
        (ParityKind::PQ, &[x, y]) if x == pi && y == qi => gen_rows(kind, n)
            .into_iter()
            .enumerate()
            .map(|(k, r)| (pi + k, r))
            .collect(),
        // Data x and Q: Dx from P; Q = g^x P ^ sum_{i!=x} (g^i ^ g^x) D_i.
        (ParityKind::PQ, &[x, y]) if y == qi => {
            let mut q: Vec<(usize, u8)> = data_except(n, &[x]).map(|i| (i, g(i) ^ g(x))).collect();
            q.push((pi, g(x)));
            vec![(x, xor_of(&[x], pi)), (qi, linear(q))]
        }
        // Data x and P: Dx = g^-x (Q ^ sum_{i!=x} g^i D_i), P = sum_{i!=x} D_i ^ Dx.
        (ParityKind::PQ, &[x, y]) if y == pi => {
            let ix = gf::inv(g(x));
            let mut dx: Vec<(usize, u8)> = data_except(n, &[x])
                .map(|i| (i, gf::mul(ix, g(i))))
                .collect();
            dx.push((qi, ix));
            let mut p: Vec<(usize, u8)> = data_except(n, &[x])
                .map(|i| (i, 1 ^ gf::mul(ix, g(i))))
                .collect();
            p.push((qi, ix));
            vec![(x, linear(dx)), (pi, linear(p))]
        }
        // Data x < y: Dy = a Pxy ^ b Qxy, Dx = Pxy ^ Dy, with
        // a = 1 / (g^(y-x) ^ 1), b = 1 / (g^x ^ g^y).
        (ParityKind::PQ, &[x, y]) => {
            let a = gf::inv(g(y - x) ^ 1);
            let b = gf::inv(g(x) ^ g(y));
            let mut dy: Vec<(usize, u8)> = data_except(n, &[x, y])
                .map(|i| (i, a ^ gf::mul(b, g(i))))
                .collect();
            dy.push((pi, a));
            dy.push((qi, b));
            let mut dx: Vec<(usize, u8)> = data_except(n, &[x, y])
                .map(|i| (i, 1 ^ a ^ gf::mul(b, g(i))))
                .collect();
            dx.push((pi, 1 ^ a));
            dx.push((qi, b));
            vec![(x, linear(dx)), (y, linear(dy))]
        }
        (ParityKind::P, _) | (ParityKind::PQ, _) => unreachable!("validate bounds missing"),
    }
}

/// Evaluates a row on the CPU, byte by byte: the reference the GPU's output
/// is held to in the unit tests (and nothing else).
#[cfg(test)]
pub(crate) fn eval(row: &Row, chunks: &[Vec<u8>]) -> Vec<u8> {
    let len = chunks[0].len();
    let mut out = vec![0u8; len];
    let terms: Vec<(usize, u8)> = match row {
        Row::Linear(t) => t.clone(),
        Row::Horner(n) => (0..*n).map(|i| (i, gf::pow2(i))).collect(),
    };
    for (i, c) in terms {
        for (o, &b) in out.iter_mut().zip(&chunks[i]) {
            *o ^= gf::mul(c, b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use raid_core::parity::{CpuEngine, ParityEngine};

    fn stripe(kind: ParityKind, n: usize, len: usize) -> Vec<Vec<u8>> {
        let mut s: Vec<Vec<u8>> = (0..n)
            .map(|i| (0..len).map(|j| (i * 131 + j * 17 + 3) as u8).collect())
            .collect();
        let refs: Vec<&[u8]> = s.iter().map(|c| &c[..]).collect();
        let (mut p, mut q) = (vec![0; len], vec![0; len]);
        let e = CpuEngine::new();
        match kind {
            ParityKind::P => e.gen_p(&refs, &mut p).unwrap(),
            ParityKind::PQ => e.gen_pq(&refs, &mut p, &mut q).unwrap(),
        }
        s.push(p);
        if kind == ParityKind::PQ {
            s.push(q);
        }
        s
    }

    #[test]
    fn generation_rows_equal_the_cpu_engine() {
        for kind in [ParityKind::P, ParityKind::PQ] {
            for n in 2..12 {
                let s = stripe(kind, n, 64);
                for (k, r) in gen_rows(kind, n).iter().enumerate() {
                    assert_eq!(eval(r, &s), s[n + k], "{kind} n={n} parity {k}");
                }
            }
        }
    }

    /// Every missing set of one or two chunks, every width 2..=12 (RAID5)
    /// and 4..=14 members (RAID6): each row reads only present chunks and
    /// gives back the original.
    #[test]
    fn recovery_rows_rebuild_every_missing_set() {
        for (kind, widths) in [(ParityKind::P, 1..12), (ParityKind::PQ, 2..13)] {
            for n in widths {
                let s = stripe(kind, n, 64);
                let chunks = s.len();
                let mut sets: Vec<Vec<usize>> = (0..chunks).map(|x| vec![x]).collect();
                if kind == ParityKind::PQ {
                    for x in 0..chunks {
                        for y in x + 1..chunks {
                            sets.push(vec![y, x]);
                        }
                    }
                }
                for m in sets {
                    let rows = recover_rows(kind, n, &m);
                    assert_eq!(rows.len(), m.len());
                    for (idx, row) in rows {
                        assert!(m.contains(&idx));
                        assert!(
                            row.sources().iter().all(|s| !m.contains(s)),
                            "{m:?} reads a missing chunk"
                        );
                        assert_eq!(
                            eval(&row, &s),
                            s[idx],
                            "{kind} n={n} missing {m:?} chunk {idx}"
                        );
                    }
                }
            }
        }
    }
}
