//! The validity dates of an X.509 certificate, read from its DER: the one
//! thing about a certificate the export checks itself at start. rustls
//! checks the peer's certificate at every handshake, never our own, so an
//! expired server certificate started without a word and every client then
//! failed its handshake. Only the path to `validity` is walked (RFC 5280
//! §4.1: Certificate, TBSCertificate, its optional version, serial number,
//! signature algorithm, issuer, then validity); anything else is not
//! looked at, and bytes that do not have that shape give None, never a
//! panic.

/// notBefore and notAfter, in seconds since the Unix epoch.
pub fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (cert, _) = tlv(der, 0x30)?;
    let (tbs, _) = tlv(cert, 0x30)?;
    // [0] EXPLICIT version, absent in version 1 certificates.
    let tbs = match tbs.first() {
        Some(0xa0) => tlv(tbs, 0xa0)?.1,
        _ => tbs,
    };
    let (_serial, rest) = tlv(tbs, 0x02)?;
    let (_signature, rest) = tlv(rest, 0x30)?;
    let (_issuer, rest) = tlv(rest, 0x30)?;
    let (dates, _) = tlv(rest, 0x30)?;
    let (not_before, rest) = time(dates)?;
    let (not_after, _) = time(rest)?;
    Some((not_before, not_after))
}

/// The element of tag `tag` at the start of `b` (DER: definite lengths):
/// its contents, and what follows it.
fn tlv(b: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, b) = b.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, b) = b.split_first()?;
    let (len, b) = if first < 0x80 {
        (first as usize, b)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let len = b[..n].iter().fold(0usize, |a, &x| (a << 8) | x as usize);
        (len, &b[n..])
    };
    (b.len() >= len).then(|| (&b[..len], &b[len..]))
}

/// A UTCTime (YYMMDDHHMMSSZ; years 50-99 are 19xx, RFC 5280 §4.1.2.5.1)
/// or GeneralizedTime (YYYYMMDDHHMMSSZ) at the start of `b`, in seconds
/// since the Unix epoch, and what follows it.
fn time(b: &[u8]) -> Option<(i64, &[u8])> {
    let tag = *b.first()?;
    let (v, rest) = tlv(b, tag)?;
    let year_digits = match tag {
        0x17 => 2,
        0x18 => 4,
        _ => return None,
    };
    if v.len() != year_digits + 11 || v[v.len() - 1] != b'Z' {
        return None;
    }
    let digits = &v[..v.len() - 1];
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let num = |at: usize, n: usize| -> i64 {
        digits[at..at + n]
            .iter()
            .fold(0, |a, &d| a * 10 + (d - b'0') as i64)
    };
    let year = match year_digits {
        2 => match num(0, 2) {
            y @ 50.. => 1900 + y,
            y => 2000 + y,
        },
        _ => num(0, 4),
    };
    let at = year_digits;
    let (month, day) = (num(at, 2), num(at + 2, 2));
    let (hour, minute, second) = (num(at + 4, 2), num(at + 6, 2), num(at + 8, 2));
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some((days * 86_400 + hour * 3600 + minute * 60 + second, rest))
}

/// Days from 1970-01-01 to the given date of the proleptic Gregorian
/// calendar (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// "2026-12-03 14:05 UTC" (the event log's calendar; a date before 1970
/// is said as 1970-01-01).
pub fn utc(t: i64) -> String {
    let r = crate::eventlog::rfc3339(t.max(0) as u64);
    format!("{} {} UTC", &r[..10], &r[11..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        if body.len() < 0x80 {
            v.push(body.len() as u8);
        } else {
            v.extend([0x82, (body.len() >> 8) as u8, body.len() as u8]);
        }
        v.extend(body);
        v
    }

    /// A certificate's shape, down to its validity (the rest left out).
    fn cert(version: bool, not_before: (u8, &str), not_after: (u8, &str)) -> Vec<u8> {
        let mut tbs = Vec::new();
        if version {
            tbs.extend(el(0xa0, &el(0x02, &[2])));
        }
        tbs.extend(el(0x02, &[0x01, 0x23]));
        tbs.extend(el(0x30, &el(0x06, &[0x2a, 0x86, 0x48])));
        tbs.extend(el(0x30, &[0u8; 200])); // a long issuer: long-form length
        let mut dates = el(not_before.0, not_before.1.as_bytes());
        dates.extend(el(not_after.0, not_after.1.as_bytes()));
        tbs.extend(el(0x30, &dates));
        tbs.extend(el(0x30, &[]));
        el(0x30, &el(0x30, &tbs))
    }

    #[test]
    fn reads_utc_and_generalized_times() {
        let c = cert(true, (0x17, "261203140500Z"), (0x18, "20510101000000Z"));
        let (nb, na) = validity(&c).unwrap();
        assert_eq!(utc(nb), "2026-12-03 14:05 UTC");
        assert_eq!(nb, 1_796_306_700);
        assert_eq!(utc(na), "2051-01-01 00:00 UTC");
        // Version 1 (no version field), and a 19xx UTCTime.
        let c = cert(false, (0x17, "991231235959Z"), (0x17, "491231235959Z"));
        let (nb, na) = validity(&c).unwrap();
        assert_eq!(utc(nb), "1999-12-31 23:59 UTC");
        assert_eq!(utc(na), "2049-12-31 23:59 UTC");
    }

    #[test]
    fn anything_else_is_none_never_a_panic() {
        assert_eq!(validity(&[]), None);
        assert_eq!(
            validity(&cert(
                true,
                (0x17, "261303140500Z"),
                (0x17, "261203140500Z")
            )),
            None,
            "month 13"
        );
        assert_eq!(
            validity(&cert(true, (0x17, "2612031405Z"), (0x17, "261203140500Z"))),
            None,
            "no seconds"
        );
        assert_eq!(
            validity(&cert(
                true,
                (0x17, "26+203140500Z"),
                (0x17, "261203140500Z")
            )),
            None
        );
        // Every cut and every single-byte change of a good one.
        let good = cert(true, (0x17, "261203140500Z"), (0x18, "20510101000000Z"));
        for n in 0..good.len() {
            let _ = validity(&good[..n]);
            for x in [0x00, 0x7f, 0x80, 0x84, 0xff] {
                let mut b = good.clone();
                b[n] = x;
                let _ = validity(&b);
            }
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let b: Vec<u8> = (0..64)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let _ = validity(&b);
        }
    }
}
