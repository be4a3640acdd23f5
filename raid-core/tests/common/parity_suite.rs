//! The parity engine's conformance suite: property, exhaustive and
//! known-answer tests that every engine must pass, bit for bit.
//!
//! Included (by `#[path]`) by raid-core's `parity_props` (every CPU SIMD
//! level) and raid-gpu's `gpu_parity` (the GPU engine); each defines
//! `engines()`, the engines to hold to it, and includes `common/batches.rs`
//! as `batches`. P and Q must equal an independent
//! computation of the published maths, every recovery must give back the
//! original chunks, and refused requests must be the same errors.

use proptest::prelude::*;
use raid_core::parity::gf;
use raid_core::parity::{GenJob, ParityEngine, ParityError, ParityKind};
use std::sync::Arc;

fn engines() -> Vec<Arc<dyn ParityEngine>> {
    super::engines()
}

/// Q computed straight from its definition, sum of g^i * D_i with the
/// bit-by-bit multiply, sharing nothing with the engine but the field.
fn q_by_definition(data: &[Vec<u8>]) -> Vec<u8> {
    let mut q = vec![0u8; data[0].len()];
    for (i, d) in data.iter().enumerate() {
        let mut coef = 1u8;
        for _ in 0..i {
            coef = gf::mul_slow(coef, 2);
        }
        for (qb, &db) in q.iter_mut().zip(d) {
            *qb ^= gf::mul_slow(coef, db);
        }
    }
    q
}

fn p_by_definition(data: &[Vec<u8>]) -> Vec<u8> {
    let mut p = vec![0u8; data[0].len()];
    for d in data {
        for (pb, &db) in p.iter_mut().zip(d) {
            *pb ^= db;
        }
    }
    p
}

fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(|c| &c[..]).collect()
}

/// Generates parity with `e`, then for the missing set wipes those chunks,
/// recovers, and returns the stripe.
fn stripe_with_parity(e: &dyn ParityEngine, kind: ParityKind, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let len = data[0].len();
    let mut stripe: Vec<Vec<u8>> = data.to_vec();
    let mut p = vec![0u8; len];
    match kind {
        ParityKind::P => {
            e.gen_p(&refs(data), &mut p).unwrap();
            stripe.push(p);
        }
        ParityKind::PQ => {
            let mut q = vec![0u8; len];
            e.gen_pq(&refs(data), &mut p, &mut q).unwrap();
            stripe.push(p);
            stripe.push(q);
        }
    }
    stripe
}

fn data_strategy(min_w: usize, max_w: usize) -> impl Strategy<Value = Vec<Vec<u8>>> {
    (min_w..=max_w, 1usize..=40).prop_flat_map(|(w, units)| {
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), units * 64), w)
    })
}

fn missing_strategy(chunks: usize, max_missing: usize) -> impl Strategy<Value = Vec<usize>> {
    proptest::sample::subsequence((0..chunks).collect::<Vec<_>>(), 0..=max_missing).prop_shuffle()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// RAID5, 2..32 members: every level equals the definition, and any one
    /// missing chunk comes back.
    #[test]
    fn raid5_generate_and_recover((data, missing) in data_strategy(1, 31)
            .prop_flat_map(|d| { let n = d.len() + 1; (Just(d), missing_strategy(n, 1)) })) {
        let want_p = p_by_definition(&data);
        for e in engines() {
            let stripe = stripe_with_parity(&*e, ParityKind::P, &data);
            prop_assert_eq!(&stripe[data.len()], &want_p, "P from {}", e.name());
            let mut broken = stripe.clone();
            for &m in &missing { broken[m].fill(0xA5); }
            let mut chunks: Vec<&mut [u8]> = broken.iter_mut().map(|c| &mut c[..]).collect();
            e.recover(ParityKind::P, &mut chunks, &missing).unwrap();
            prop_assert_eq!(&broken, &stripe, "recovery of {:?} by {}", missing, e.name());
        }
    }

    /// RAID6, 4..32 members: P and Q equal the definition at every level, and
    /// any one or two missing chunks (data+data, data+P, data+Q, P+Q) come back.
    #[test]
    fn raid6_generate_and_recover((data, missing) in data_strategy(2, 30)
            .prop_flat_map(|d| { let n = d.len() + 2; (Just(d), missing_strategy(n, 2)) })) {
        let want_p = p_by_definition(&data);
        let want_q = q_by_definition(&data);
        for e in engines() {
            let stripe = stripe_with_parity(&*e, ParityKind::PQ, &data);
            prop_assert_eq!(&stripe[data.len()], &want_p, "P from {}", e.name());
            prop_assert_eq!(&stripe[data.len() + 1], &want_q, "Q from {}", e.name());
            let mut broken = stripe.clone();
            for &m in &missing { broken[m].fill(0x5A); }
            let mut chunks: Vec<&mut [u8]> = broken.iter_mut().map(|c| &mut c[..]).collect();
            e.recover(ParityKind::PQ, &mut chunks, &missing).unwrap();
            prop_assert_eq!(&broken, &stripe, "recovery of {:?} by {}", missing, e.name());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// A read-modify-write's parity update: changing some data chunks and
    /// applying their deltas to the old P (and Q) gives exactly the parity
    /// of the new data, by definition, on every engine. Indices may repeat
    /// (two changes of one chunk in one call).
    #[test]
    fn update_parity_equals_parity_of_the_new_data(
        (data, changes) in data_strategy(2, 30).prop_flat_map(|d| {
            let (w, len) = (d.len(), d[0].len());
            let change = (0..w, proptest::collection::vec(any::<u8>(), len));
            (Just(d), proptest::collection::vec(change, 1..=4))
        })
    ) {
        let mut new = data.clone();
        let mut deltas: Vec<(usize, Vec<u8>)> = Vec::new();
        for (i, bytes) in &changes {
            let d: Vec<u8> = new[*i].iter().zip(bytes).map(|(a, b)| a ^ b).collect();
            new[*i] = bytes.clone();
            deltas.push((*i, d));
        }
        let views: Vec<(usize, &[u8])> = deltas.iter().map(|(i, d)| (*i, &d[..])).collect();
        let (want_p, want_q) = (p_by_definition(&new), q_by_definition(&new));
        for e in engines() {
            for kind in [ParityKind::P, ParityKind::PQ] {
                let old = stripe_with_parity(&*e, kind, &data);
                let mut parity: Vec<Vec<u8>> = old[data.len()..].to_vec();
                let mut refs: Vec<&mut [u8]> = parity.iter_mut().map(|c| &mut c[..]).collect();
                e.update_parity(kind, &views, &mut refs).unwrap();
                prop_assert_eq!(&parity[0], &want_p, "P after update, {} {:?}", e.name(), kind);
                if kind == ParityKind::PQ {
                    prop_assert_eq!(&parity[1], &want_q, "Q after update, {}", e.name());
                }
            }
        }
    }
}

/// Bad update requests are the same errors on every engine, and change
/// nothing.
#[test]
fn bad_updates_are_errors_that_change_nothing() {
    for e in engines() {
        let d = [7u8; 128];
        let short = [7u8; 64];
        let (mut p, mut q) = (vec![1u8; 128], vec![2u8; 128]);
        let mut both: Vec<&mut [u8]> = vec![&mut p, &mut q];
        assert!(matches!(
            e.update_parity(ParityKind::PQ, &[(255, &d[..])], &mut both),
            Err(ParityError::DataIndexOutOfRange {
                index: 255,
                max: 255,
                ..
            })
        ));
        assert!(matches!(
            e.update_parity(ParityKind::PQ, &[(0, &short[..])], &mut both),
            Err(ParityError::UnequalLengths { .. })
        ));
        assert!(matches!(
            e.update_parity(ParityKind::P, &[(0, &d[..])], &mut both),
            Err(ParityError::ParityCount {
                want: 1,
                got: 2,
                ..
            })
        ));
        assert!(e.update_parity(ParityKind::PQ, &[], &mut both).is_err());
        assert_eq!((p, q), (vec![1u8; 128], vec![2u8; 128]), "{}", e.name());
    }
}

/// Every pair of missing chunks of a wide RAID6 stripe, exhaustively, at
/// every level (the random test above samples; this one covers all pairs).
#[test]
fn raid6_every_pair_of_a_12_wide_stripe() {
    let data: Vec<Vec<u8>> = (0..10)
        .map(|i| (0..128).map(|j| (i * 73 + j * 29 + 7) as u8).collect())
        .collect();
    for e in engines() {
        let stripe = stripe_with_parity(&*e, ParityKind::PQ, &data);
        for x in 0..12 {
            for y in x + 1..12 {
                let mut broken = stripe.clone();
                broken[x].fill(0);
                broken[y].fill(0xff);
                let mut chunks: Vec<&mut [u8]> = broken.iter_mut().map(|c| &mut c[..]).collect();
                e.recover(ParityKind::PQ, &mut chunks, &[y, x]).unwrap();
                assert_eq!(broken, stripe, "{} missing {x},{y}", e.name());
            }
        }
    }
}

/// Chunks longer than the CPU engine's column split (and than small GPU
/// pieces), with a ragged last column.
#[test]
fn large_chunks_split_over_threads() {
    for e in engines() {
        large_chunks_split_over_threads_on(&*e);
    }
}

fn large_chunks_split_over_threads_on(e: &dyn ParityEngine) {
    let len = 256 * 1024 * 2 + 64 * 3;
    let data: Vec<Vec<u8>> = (0..6)
        .map(|i| (0..len).map(|j| ((i + 1) * j % 251) as u8).collect())
        .collect();
    let stripe = stripe_with_parity(e, ParityKind::PQ, &data);
    assert_eq!(stripe[6], p_by_definition(&data));
    assert_eq!(stripe[7], q_by_definition(&data));
    let mut broken = stripe.clone();
    broken[1].fill(0);
    broken[4].fill(0);
    let mut chunks: Vec<&mut [u8]> = broken.iter_mut().map(|c| &mut c[..]).collect();
    e.recover(ParityKind::PQ, &mut chunks, &[1, 4]).unwrap();
    assert_eq!(broken, stripe, "{}", e.name());
}

/// The batch forms equal the single-stripe forms.
#[test]
fn batches_equal_single_calls() {
    for e in engines() {
        batches_equal_single_calls_on(&*e);
    }
}

fn batches_equal_single_calls_on(e: &dyn ParityEngine) {
    let stripes: Vec<Vec<Vec<u8>>> = (0..9)
        .map(|s| {
            (0..(4 + s % 3))
                .map(|i| vec![(s * 16 + i) as u8 ^ 0x3c; 4096])
                .collect()
        })
        .collect();
    let mut bufs: Vec<Vec<Vec<u8>>> = stripes
        .iter()
        .map(|d| {
            let mut v = d.clone();
            v.push(vec![0; 4096]);
            v.push(vec![0; 4096]);
            v
        })
        .collect();
    super::batches::gen_all(e, ParityKind::PQ, &mut bufs).unwrap();
    for (d, b) in stripes.iter().zip(&bufs) {
        assert_eq!(*b, stripe_with_parity(e, ParityKind::PQ, d), "{}", e.name());
    }
    let want = bufs.clone();
    let missing: Vec<Vec<usize>> = (0..bufs.len())
        .map(|s| vec![s % 4, (s % 4 + 1 + s % 2) % 6])
        .collect();
    super::batches::wipe_and_recover_all(e, ParityKind::PQ, &mut bufs, &missing, 0).unwrap();
    assert_eq!(bufs, want, "{}", e.name());
}

/// A fixed stripe whose P and Q were produced by ISA-L 2.30's pq_gen (the
/// same function Linux md's maths is checked against) and written down here.
/// The vectors hold whatever engine runs these tests to the published output.
#[test]
fn known_answer_vectors_from_isal() {
    let data: Vec<Vec<u8>> = (0..8u32)
        .map(|i| (0..64u32).map(|j| (i * 37 + j * 11 + 5) as u8).collect())
        .collect();
    let hex = |v: &[u8]| v.iter().map(|b| format!("{b:02x}")).collect::<String>();
    for e in engines() {
        let s = stripe_with_parity(&*e, ParityKind::PQ, &data);
        assert_eq!(hex(&s[8]), KAT_P, "P from {}", e.name());
        assert_eq!(hex(&s[9]), KAT_Q, "Q from {}", e.name());
    }
}

const KAT_P: &str = "d89028c0a870b8f00870b800b87008f0b870a8c02890d8d08850d880585088d05890e8c06830f8b008b0f80078b008b07830e8406890d85088d0d88058d08850";
const KAT_Q: &str = "da2a9c183d9f5242b1b73687f0ded4802eb5a9ffcd7fa1bd78dc69663ffa1613fb7f1a807772174987290eab39c5c6f0649fecd3bb7d849c2ddaf162529a273f";

#[test]
fn bad_arguments_are_errors_not_panics() {
    for e in engines() {
        bad_arguments_are_errors_not_panics_on(&*e);
    }
}

fn bad_arguments_are_errors_not_panics_on(e: &dyn ParityEngine) {
    let a = vec![0u8; 128];
    let b = vec![0u8; 192];
    let mut p = vec![0u8; 128];
    let mut q = vec![0u8; 128];
    assert_eq!(
        e.gen_p(&[&a, &b], &mut p),
        Err(ParityError::UnequalLengths {
            index: 1,
            len: 192,
            expected: 128
        })
    );
    let odd = vec![0u8; 100];
    let mut p100 = vec![0u8; 100];
    assert_eq!(
        e.gen_p(&[&odd], &mut p100),
        Err(ParityError::BadLength { len: 100 })
    );
    assert_eq!(
        e.gen_p(&[&[][..]], &mut []),
        Err(ParityError::BadLength { len: 0 })
    );
    assert!(matches!(
        e.gen_p(&[], &mut p),
        Err(ParityError::TooFewDataChunks { got: 0, .. })
    ));
    assert!(matches!(
        e.gen_pq(&[&a], &mut p, &mut q),
        Err(ParityError::TooFewDataChunks { got: 1, min: 2, .. })
    ));
    let many: Vec<&[u8]> = (0..256).map(|_| &a[..]).collect();
    assert!(matches!(
        e.gen_pq(&many, &mut p, &mut q),
        Err(ParityError::TooManyDataChunks {
            got: 256,
            max: 255,
            ..
        })
    ));
    let mut s: Vec<Vec<u8>> = vec![vec![0u8; 128]; 5];
    let mut c: Vec<&mut [u8]> = s.iter_mut().map(|x| &mut x[..]).collect();
    assert!(matches!(
        e.recover(ParityKind::P, &mut c, &[0, 1]),
        Err(ParityError::TooManyMissing {
            missing: 2,
            tolerated: 1,
            ..
        })
    ));
    assert!(matches!(
        e.recover(ParityKind::PQ, &mut c, &[0, 1, 2]),
        Err(ParityError::TooManyMissing {
            missing: 3,
            tolerated: 2,
            ..
        })
    ));
    assert_eq!(
        e.recover(ParityKind::PQ, &mut c, &[5]),
        Err(ParityError::MissingOutOfRange {
            index: 5,
            chunks: 5
        })
    );
    assert_eq!(
        e.recover(ParityKind::PQ, &mut c, &[2, 2]),
        Err(ParityError::DuplicateMissing { index: 2 })
    );
    let (mut p1, mut q1) = (vec![0u8; 128], vec![0u8; 128]);
    let mut jobs = [GenJob {
        data: vec![&a[..], &a[..]],
        parity: vec![&mut p1[..]],
    }];
    assert!(matches!(
        e.gen_batch(ParityKind::PQ, &mut jobs),
        Err(ParityError::ParityCount {
            want: 2,
            got: 1,
            ..
        })
    ));
    let odd_q = [0u8; 64];
    let mut jobs = [
        GenJob {
            data: vec![&a[..], &a[..]],
            parity: vec![&mut p[..], &mut q1[..]],
        },
        GenJob {
            data: vec![&a[..], &odd_q[..]],
            parity: vec![&mut p1[..], &mut q[..]],
        },
    ];
    assert!(matches!(
        e.gen_batch(ParityKind::PQ, &mut jobs),
        Err(ParityError::UnequalLengths { .. })
    ));
    // Nothing was written by any refused call, batches included.
    assert!(p.iter().all(|&x| x == 0) && q.iter().all(|&x| x == 0));
    // Every error says what to do or what was wrong, in words.
    let msg = e.gen_p(&[&odd], &mut p100).unwrap_err().to_string();
    assert!(msg.contains("multiple of 64"), "{msg}");
}
