//! Arithmetic in GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d),
//! generator g = 2: the field Linux md, ISA-L and ZFS use for RAID6's Q.
//!
//! Everything here is computed at compile time by `const fn`s so the tables
//! cannot drift from the definition.

/// The reduction polynomial without its x^8 term.
pub const POLY: u8 = 0x1d;

/// Multiplies two field elements bit by bit (Russian peasant). Slow, obvious,
/// and the definition every table below is derived from.
pub const fn mul_slow(mut a: u8, mut b: u8) -> u8 {
    let mut r = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            r ^= a;
        }
        let carry = a & 0x80;
        a <<= 1;
        if carry != 0 {
            a ^= POLY;
        }
        b >>= 1;
    }
    r
}

const fn build_exp() -> [u8; 512] {
    let mut t = [0u8; 512];
    let mut x = 1u8;
    let mut i = 0;
    while i < 512 {
        t[i] = x;
        x = mul_slow(x, 2);
        i += 1;
    }
    t
}

const fn build_log() -> [u8; 256] {
    let exp = build_exp();
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        t[exp[i] as usize] = i as u8;
        i += 1;
    }
    t
}

/// EXP[i] = g^i, doubled in length so `EXP[log a + log b]` needs no modulo.
pub static EXP: [u8; 512] = build_exp();
/// LOG[a] = i such that g^i = a (LOG[0] is unused).
pub static LOG: [u8; 256] = build_log();

/// a * b.
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// g^i, the Q coefficient of data chunk i.
#[inline]
pub fn pow2(i: usize) -> u8 {
    EXP[i % 255]
}

/// The multiplicative inverse of a non-zero element.
#[inline]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "0 has no inverse in GF(2^8)");
    EXP[(255 - LOG[a as usize] as usize) % 255]
}

/// The two 16-entry tables for multiplying by `c` with a byte shuffle:
/// c * x = lo[x & 15] ^ hi[x >> 4].
pub fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let mut lo = [0u8; 16];
    let mut hi = [0u8; 16];
    for i in 0..16u8 {
        lo[i as usize] = mul(c, i);
        hi[i as usize] = mul(c, i << 4);
    }
    (lo, hi)
}

/// The 8x8 bit matrix that makes GFNI's `gf2p8affineqb` multiply by `c` in
/// *our* field (its own `gf2p8mulb` uses AES's 0x11b and cannot be used).
///
/// The instruction computes output bit i as the parity of (x AND byte[7-i] of
/// the matrix). Multiplying by c is linear: output bit i is the XOR, over the
/// set bits j of x, of bit i of c * 2^j. So row i has bit j set when bit i of
/// c * 2^j is set, and it lives in byte 7 - i.
pub const fn affine_matrix(c: u8) -> u64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < 8 {
        let mut row = 0u8;
        let mut j = 0;
        while j < 8 {
            if (mul_slow(c, 1 << j) >> i) & 1 != 0 {
                row |= 1 << j;
            }
            j += 1;
        }
        m |= (row as u64) << (8 * (7 - i));
        i += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_agree_with_the_definition() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_slow(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn g_generates_the_whole_group() {
        let mut seen = [false; 256];
        for i in 0..255 {
            assert!(!seen[pow2(i) as usize], "g^{i} repeats");
            seen[pow2(i) as usize] = true;
        }
        assert!(!seen[0]);
    }

    #[test]
    fn inverses() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1);
        }
    }

    #[test]
    fn known_products_of_the_md_field() {
        // 0x80 * 2 wraps through the polynomial: 0x100 ^ 0x11d = 0x1d.
        assert_eq!(mul(0x80, 2), 0x1d);
        // g^8 = 0x1d, g^255 = 1 for this primitive polynomial.
        assert_eq!(pow2(8), 0x1d);
        assert_eq!(pow2(255), 1);
    }
}
