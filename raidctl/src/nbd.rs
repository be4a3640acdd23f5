//! The NBD protocol, fixed newstyle (https://github.com/NetworkBlockDevice/nbd,
//! doc/proto.md): constants, and the decoding of what clients send, kept
//! free of I/O so it can be tested and fuzzed on its own.

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1;
pub const FLAG_C_NO_ZEROES: u32 = 2;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
/// The bit every option reply that is an error carries.
pub const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR + 1;
pub const REP_ERR_POLICY: u32 = REP_ERR + 2;
pub const REP_ERR_INVALID: u32 = REP_ERR + 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR + 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR + 6;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const TFLAG_HAS_FLAGS: u16 = 1;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1;
/// WRITE_ZEROES: allocate, do not punch a hole (this server never does).
pub const CMD_FLAG_NO_HOLE: u16 = 2;
/// Block status: one extent only, no longer than the request.
pub const CMD_FLAG_REQ_ONE: u16 = 8;

/// Structured replies (`OPT_STRUCTURED_REPLY`): a chunk's header magic,
/// the flag of a reply's last chunk, and the chunk types sent.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
pub const REPLY_FLAG_DONE: u16 = 1;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// The bit every chunk type that is an error carries.
pub const REPLY_TYPE_ERR: u16 = 1 << 15;
pub const REPLY_TYPE_ERROR: u16 = REPLY_TYPE_ERR + 1;
/// An error that names the offset it happened at.
pub const REPLY_TYPE_ERROR_OFFSET: u16 = REPLY_TYPE_ERR + 2;
/// The one meta context served, and its flags: a hole (not stored), and
/// reads as zeros.
pub const CONTEXT_ALLOCATION: &str = "base:allocation";
pub const STATE_HOLE: u32 = 1;
pub const STATE_ZERO: u32 = 2;

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Largest request payload accepted (the NBD spec's recommended maximum).
pub const MAX_REQUEST: u32 = 32 << 20;
/// Longest option payload read during the handshake.
pub const MAX_OPTION: u32 = 64 * 1024;

/// One transmission-phase request header (28 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    BadMagic(u32),
}

impl Request {
    pub const LEN: usize = 28;

    pub fn decode(b: &[u8; 28]) -> Result<Request, DecodeError> {
        let magic = u32::from_be_bytes(b[0..4].try_into().unwrap());
        if magic != REQUEST_MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        Ok(Request {
            flags: u16::from_be_bytes(b[4..6].try_into().unwrap()),
            kind: u16::from_be_bytes(b[6..8].try_into().unwrap()),
            cookie: u64::from_be_bytes(b[8..16].try_into().unwrap()),
            offset: u64::from_be_bytes(b[16..24].try_into().unwrap()),
            length: u32::from_be_bytes(b[24..28].try_into().unwrap()),
        })
    }
}

/// What the server does with a decoded request before touching the array.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    Ok,
    /// Reply with this error; for a write, its payload must still be read
    /// (it is no larger than MAX_REQUEST).
    Error(u32),
    /// A protocol violation the connection cannot recover from: close it.
    Disconnect(&'static str),
}

/// Validates a request against the export: known command and flags,
/// length limits, 4 KiB alignment, range. One place for every rule, shared
/// by the server and the fuzz target. `read_only`: as the export was
/// offered to this client (an array that fails later answers its writes
/// EIO, a device error, not EPERM).
pub fn check(r: &Request, size: u64, block: u64, read_only: bool) -> Check {
    match r.kind {
        CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES => {}
        CMD_FLUSH => {
            return if r.offset == 0 && r.length == 0 {
                Check::Ok
            } else {
                Check::Error(EINVAL)
            }
        }
        CMD_DISC => return Check::Ok,
        CMD_BLOCK_STATUS => {
            // Asked for where the export's bytes are, not to move any:
            // a read-only export answers it too.
            if r.flags & !CMD_FLAG_REQ_ONE != 0
                || r.length == 0
                || !r.offset.is_multiple_of(block)
                || !(r.length as u64).is_multiple_of(block)
                || r.offset
                    .checked_add(r.length as u64)
                    .is_none_or(|e| e > size)
            {
                return Check::Error(EINVAL);
            }
            return Check::Ok;
        }
        _ => return Check::Error(EINVAL),
    }
    if r.kind == CMD_WRITE && r.length > MAX_REQUEST {
        return Check::Disconnect("write payload larger than the 32 MiB maximum");
    }
    if r.kind == CMD_READ && r.length > MAX_REQUEST {
        return Check::Error(EINVAL);
    }
    // The flags this server knows; another (DF, FAST_ZERO: not offered)
    // asks for something it does not do.
    if r.flags & !(CMD_FLAG_FUA | CMD_FLAG_NO_HOLE) != 0 {
        return Check::Error(EINVAL);
    }
    if read_only && r.kind != CMD_READ {
        return Check::Error(EPERM);
    }
    if r.length == 0 || !r.offset.is_multiple_of(block) || !(r.length as u64).is_multiple_of(block)
    {
        return Check::Error(EINVAL);
    }
    match r.offset.checked_add(r.length as u64) {
        Some(end) if end <= size => Check::Ok,
        // Past the end: the spec's EINVAL for a read or a trim, ENOSPC
        // for what would write there.
        _ if r.kind == CMD_READ || r.kind == CMD_TRIM => Check::Error(EINVAL),
        _ => Check::Error(ENOSPC),
    }
}

/// An option request's payload for LIST_META_CONTEXT and
/// SET_META_CONTEXT (what `parse_meta_context_request` reads): the
/// export name and the queries, each after its 32-bit length, the
/// queries after their count.
/// A big-endian u32 from `r` (the protocol's byte order).
pub fn read_u32(r: &mut (impl std::io::Read + ?Sized)) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

/// A big-endian u64 from `r`.
pub fn read_u64(r: &mut (impl std::io::Read + ?Sized)) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

pub fn meta_context_request(export: &str, queries: &[&str]) -> Vec<u8> {
    fn string(d: &mut Vec<u8>, s: &str) {
        d.extend_from_slice(&(s.len() as u32).to_be_bytes());
        d.extend_from_slice(s.as_bytes());
    }
    let mut d = Vec::new();
    string(&mut d, export);
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        string(&mut d, q);
    }
    d
}

/// An option request's payload for LIST_META_CONTEXT and
/// SET_META_CONTEXT: the export name and the queries, every length
/// checked against what was sent.
pub fn parse_meta_context_request(data: &[u8]) -> Option<(String, Vec<String>)> {
    let (name, mut at) = string_at(data, 0)?;
    let count = u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?) as usize;
    at += 4;
    let mut queries = Vec::new();
    for _ in 0..count {
        let (q, next) = string_at(data, at)?;
        queries.push(q);
        at = next;
    }
    (at == data.len()).then_some((name, queries))
}

/// The string at `at` of an option's payload, after its 32-bit length,
/// and where the next field begins; None where the length runs past the
/// payload or the bytes are not UTF-8.
fn string_at(data: &[u8], at: usize) -> Option<(String, usize)> {
    let n = u32::from_be_bytes(data.get(at..at.checked_add(4)?)?.try_into().ok()?) as usize;
    let start = at + 4;
    let end = start.checked_add(n)?;
    let s = std::str::from_utf8(data.get(start..end)?).ok()?;
    Some((s.to_string(), end))
}

/// An option request's payload for INFO and GO: the export name and the
/// information types asked for.
pub fn parse_info_request(data: &[u8]) -> Option<(String, Vec<u16>)> {
    let (name, next) = string_at(data, 0)?;
    let rest = data.get(next..)?;
    let count = u16::from_be_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
    let list = rest.get(2..2 + count * 2)?;
    if rest.len() != 2 + count * 2 {
        return None;
    }
    Some((
        name,
        list.chunks(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(kind: u16, offset: u64, length: u32) -> Request {
        Request {
            flags: 0,
            kind,
            cookie: 1,
            offset,
            length,
        }
    }

    #[test]
    fn decode_round_trip_and_bad_magic() {
        let mut b = [0u8; 28];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        b[8..16].copy_from_slice(&7u64.to_be_bytes());
        b[16..24].copy_from_slice(&4096u64.to_be_bytes());
        b[24..28].copy_from_slice(&8192u32.to_be_bytes());
        assert_eq!(
            Request::decode(&b),
            Ok(Request {
                flags: 0,
                kind: CMD_WRITE,
                cookie: 7,
                offset: 4096,
                length: 8192
            })
        );
        b[0] = 0;
        assert!(Request::decode(&b).is_err());
    }

    #[test]
    fn checks() {
        let size = 1 << 20;
        assert_eq!(check(&req(CMD_READ, 0, 4096), size, 4096, false), Check::Ok);
        assert_eq!(
            check(&req(CMD_READ, 100, 4096), size, 4096, false),
            Check::Error(EINVAL)
        );
        assert_eq!(
            check(&req(CMD_READ, size, 4096), size, 4096, false),
            Check::Error(EINVAL)
        );
        assert_eq!(
            check(&req(CMD_WRITE, size - 4096, 8192), size, 4096, false),
            Check::Error(ENOSPC)
        );
        assert_eq!(
            check(&req(CMD_WRITE, u64::MAX - 4095, 4096), size, 4096, false),
            Check::Error(ENOSPC)
        );
        assert!(matches!(
            check(&req(CMD_WRITE, 0, MAX_REQUEST + 4096), size, 4096, false),
            Check::Disconnect(_)
        ));
        assert_eq!(
            check(&req(CMD_READ, 0, MAX_REQUEST + 4096), size, 4096, false),
            Check::Error(EINVAL)
        );
        assert_eq!(
            check(&req(99, 0, 0), size, 4096, false),
            Check::Error(EINVAL)
        );
        assert_eq!(
            check(&req(CMD_WRITE, 0, 4096), size, 4096, true),
            Check::Error(EPERM)
        );
        assert_eq!(check(&req(CMD_FLUSH, 0, 0), size, 4096, false), Check::Ok);
        assert_eq!(
            check(&req(CMD_TRIM, size - 4096, 8192), size, 4096, false),
            Check::Error(EINVAL)
        );
        let flagged = |flags| Request {
            flags,
            ..req(CMD_WRITE_ZEROES, 0, 4096)
        };
        assert_eq!(
            check(&flagged(CMD_FLAG_FUA | CMD_FLAG_NO_HOLE), size, 4096, false),
            Check::Ok
        );
        // DF, FAST_ZERO and unknown bits: not offered.
        for f in [4, 16, 0x80] {
            assert_eq!(check(&flagged(f), size, 4096, false), Check::Error(EINVAL));
        }
        assert_eq!(
            check(&req(CMD_READ, 0, 0), size, 4096, false),
            Check::Error(EINVAL)
        );
        // Block status: read-only exports answer it; REQ_ONE only.
        let status = |flags, offset, length| Request {
            flags,
            ..req(CMD_BLOCK_STATUS, offset, length)
        };
        assert_eq!(check(&status(0, 0, 8192), size, 4096, true), Check::Ok);
        assert_eq!(
            check(&status(CMD_FLAG_REQ_ONE, 0, 8192), size, 4096, false),
            Check::Ok
        );
        for bad in [
            status(CMD_FLAG_FUA, 0, 4096),
            status(0, 0, 0),
            status(0, 100, 4096),
            status(0, size - 4096, 8192),
            status(0, u64::MAX - 4095, 4096),
        ] {
            assert_eq!(
                check(&bad, size, 4096, false),
                Check::Error(EINVAL),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn meta_context_request_parsing() {
        let mut d = Vec::new();
        d.extend_from_slice(&4u32.to_be_bytes());
        d.extend_from_slice(b"data");
        d.extend_from_slice(&2u32.to_be_bytes());
        for q in ["base:allocation", "qemu:dirty-bitmap:x"] {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        assert_eq!(
            parse_meta_context_request(&d),
            Some((
                "data".into(),
                vec!["base:allocation".into(), "qemu:dirty-bitmap:x".into()]
            ))
        );
        // Cut short anywhere, or with bytes left over: refused.
        for n in 0..d.len() {
            assert_eq!(parse_meta_context_request(&d[..n]), None, "{n}");
        }
        let mut long = d.clone();
        long.push(0);
        assert_eq!(parse_meta_context_request(&long), None);
        let mut bad = d.clone();
        bad[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_meta_context_request(&bad), None);
    }

    #[test]
    fn info_request_parsing() {
        let mut d = Vec::new();
        d.extend_from_slice(&4u32.to_be_bytes());
        d.extend_from_slice(b"data");
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(
            parse_info_request(&d),
            Some(("data".into(), vec![INFO_BLOCK_SIZE]))
        );
        assert_eq!(parse_info_request(&d[..5]), None);
        let mut bad = d.clone();
        bad[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_info_request(&bad), None);
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;

    /// Random headers and option payloads: decoding and checking never
    /// panic, and anything `check` accepts lies inside the export, aligned.
    #[test]
    fn random_requests_never_panic_and_accepted_ones_are_in_range() {
        let mut x: u64 = 0xDEAD_BEEF_CAFE_F00D;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let size = 1u64 << 30;
        // RAID_FUZZ_ITERS=100000000 for a long run by hand.
        let iters: u64 = std::env::var("RAID_FUZZ_ITERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200_000);
        for i in 0..iters {
            let mut b = [0u8; 28];
            for c in b.chunks_mut(8) {
                let v = next().to_le_bytes();
                c.copy_from_slice(&v[..c.len()]);
            }
            if i % 2 == 0 {
                b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
                b[6] = 0;
                b[7] = (next() % 9) as u8;
            }
            if let Ok(r) = Request::decode(&b) {
                if check(&r, size, 4096, false) == Check::Ok
                    && matches!(r.kind, CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES)
                {
                    assert!(r.offset % 4096 == 0 && r.length % 4096 == 0 && r.length > 0);
                    assert!(r.offset + r.length as u64 <= size && r.length <= MAX_REQUEST);
                }
                if check(&r, size, 4096, false) == Check::Ok && r.kind == CMD_BLOCK_STATUS {
                    assert!(r.offset % 4096 == 0 && r.length % 4096 == 0 && r.length > 0);
                    assert!(r.offset + r.length as u64 <= size);
                }
                // A client that did not ask for the block size: any byte,
                // still inside the export.
                if check(&r, size, 1, false) == Check::Ok
                    && matches!(r.kind, CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES)
                {
                    assert!(r.length > 0 && r.length <= MAX_REQUEST);
                    assert!(r
                        .offset
                        .checked_add(r.length as u64)
                        .is_some_and(|e| e <= size));
                }
            }
            let n = (next() % 40) as usize;
            let data: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            let _ = parse_info_request(&data);
            let _ = parse_meta_context_request(&data);
        }
    }
}
