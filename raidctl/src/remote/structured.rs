//! Structured replies on a network member's connection: negotiated so
//! that the member can ask the server where its holes are (block status,
//! `base:allocation`), which also lets the server answer reads in chunks
//! (data, holes, errors). A reply's chunks are gathered here by cookie
//! until the one flagged done; a read is answered only once its chunks
//! cover it exactly, each inside the request: anything else ends the
//! connection rather than hand the array a buffer with bytes the server
//! never sent.

use super::conn::Kind;
use crate::nbd::{self, read_u32, read_u64};
use std::io::{self, Read};

/// The errno of a reply that is no answer (a block status with nothing
/// for the context asked about): not known, the connection kept.
pub(super) const NOT_KNOWN: u32 = nbd::EINVAL;
/// Most bytes of a block status chunk taken (a descriptor is 8 bytes:
/// 128K extents).
const MAX_STATUS_CHUNK: u32 = 1 << 20;
/// Most bytes of an error chunk (its message is at most 4 KiB).
const MAX_ERROR_CHUNK: u32 = 8 << 10;
/// Most data and hole chunks one read's reply may come in (a server
/// sends a few; a hostile one could otherwise grow `covered` without
/// end).
const MAX_PIECES: usize = 1 << 16;

/// A reply being gathered.
pub(super) struct Partial {
    /// The request's kind, offset and length.
    kind: Kind,
    offset: u64,
    len: usize,
    /// A read's bytes, placed as their chunks come.
    data: Vec<u8>,
    /// The ranges of `data` the chunks covered so far (request-relative),
    /// and their bytes in all.
    covered: Vec<(usize, usize)>,
    filled: usize,
    /// The first error a chunk carried.
    err: Option<u32>,
    /// Block status: the descriptors, as sent (length, flags, each 32
    /// bits).
    status: Vec<u8>,
}

/// A finished reply: the data (a read's bytes, block status descriptors,
/// or nothing), or the server's errno.
pub(super) type Outcome = Result<Vec<u8>, u32>;

impl Partial {
    pub(super) fn new(kind: Kind, offset: u64, len: usize) -> Partial {
        Partial {
            kind,
            offset,
            len,
            data: match kind {
                Kind::Read => vec![0; len],
                _ => Vec::new(),
            },
            covered: Vec::new(),
            filled: 0,
            err: None,
            status: Vec::new(),
        }
    }

    /// Reads one chunk's payload (`len` bytes, its header already read)
    /// from `r` into the reply. Err: a protocol error, which ends the
    /// connection.
    pub(super) fn chunk(
        &mut self,
        r: &mut impl Read,
        typ: u16,
        len: u32,
        context: Option<u32>,
    ) -> Result<(), String> {
        let io = |e: io::Error| e.to_string();
        let kind = self.kind;
        match typ {
            nbd::REPLY_TYPE_NONE if len == 0 => Ok(()),
            nbd::REPLY_TYPE_OFFSET_DATA if matches!(kind, Kind::Read) && len > 8 => {
                let at = self.place(read_u64(r).map_err(io)?, len as u64 - 8)?;
                let n = len as usize - 8;
                r.read_exact(&mut self.data[at..at + n]).map_err(io)?;
                self.covered.push((at, at + n));
                Ok(())
            }
            nbd::REPLY_TYPE_OFFSET_HOLE if matches!(kind, Kind::Read) && len == 12 => {
                let offset = read_u64(r).map_err(io)?;
                let n = read_u32(r).map_err(io)? as u64;
                // `data` starts zeroed, and a range covered twice is
                // refused at the end: nothing to write.
                let at = self.place(offset, n)?;
                self.covered.push((at, at + n as usize));
                Ok(())
            }
            nbd::REPLY_TYPE_BLOCK_STATUS
                if matches!(kind, Kind::BlockStatus)
                    && len >= 12
                    && (len - 4).is_multiple_of(8)
                    && len <= MAX_STATUS_CHUNK =>
            {
                let id = read_u32(r).map_err(io)?;
                let mut d = vec![0u8; len as usize - 4];
                r.read_exact(&mut d).map_err(io)?;
                // Only the context asked for counts (a server sends no
                // other, since no other was negotiated).
                if Some(id) == context && self.status.is_empty() {
                    self.status = d;
                }
                Ok(())
            }
            t if t & nbd::REPLY_TYPE_ERR != 0 && (6..=MAX_ERROR_CHUNK).contains(&len) => {
                let errno = read_u32(r).map_err(io)?;
                let mut rest = vec![0u8; len as usize - 4];
                r.read_exact(&mut rest).map_err(io)?;
                let msg_len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
                let fits = match t {
                    nbd::REPLY_TYPE_ERROR => 2 + msg_len == rest.len(),
                    nbd::REPLY_TYPE_ERROR_OFFSET => 2 + msg_len + 8 == rest.len(),
                    // An error of a kind not known here: its errno stands,
                    // whatever follows its message.
                    _ => 2 + msg_len <= rest.len(),
                };
                if !fits {
                    return Err(format!(
                        "an error chunk of {len} bytes with a {msg_len}-byte message"
                    ));
                }
                if errno == 0 {
                    return Err("an error chunk with no error".into());
                }
                tracing::debug!(
                    "nbd member: the server's error {errno}: {}",
                    String::from_utf8_lossy(&rest[2..2 + msg_len])
                );
                self.err.get_or_insert(errno);
                Ok(())
            }
            t => Err(format!(
                "a reply chunk of type {t} and {len} bytes, not one this request takes"
            )),
        }
    }

    /// Where a chunk of `n` bytes at `offset` lies in the request's data:
    /// wholly inside the request, or a protocol error; so is a chunk past
    /// what an exact cover of the request can hold (more bytes, or more
    /// pieces than `MAX_PIECES`), which a gap or an overlap would need.
    fn place(&mut self, offset: u64, n: u64) -> Result<usize, String> {
        self.filled = self.filled.saturating_add(n as usize);
        if self.filled > self.len || self.covered.len() >= MAX_PIECES {
            return Err(format!(
                "a read of {} bytes answered with more than it asked for ({} bytes so far, in {} chunks)",
                self.len,
                self.filled,
                self.covered.len() + 1
            ));
        }
        offset
            .checked_sub(self.offset)
            .filter(|at| at.checked_add(n).is_some_and(|end| end <= self.len as u64) && n > 0)
            .map(|at| at as usize)
            .ok_or_else(|| {
                format!(
                    "a chunk of {n} bytes at {offset}, outside the request ({} bytes at {})",
                    self.len, self.offset
                )
            })
    }

    /// The reply, its last chunk in. Err: a protocol error (a read whose
    /// chunks overlap or leave a gap, a block status with no descriptor).
    pub(super) fn finish(mut self) -> Result<Outcome, String> {
        if let Some(errno) = self.err {
            return Ok(Err(errno));
        }
        match self.kind {
            Kind::Read => {
                self.covered.sort_unstable();
                let mut at = 0;
                for &(s, e) in &self.covered {
                    if s != at {
                        return Err(format!(
                            "a read's chunks {} at byte {at} of {}",
                            if s < at { "overlap" } else { "leave a gap" },
                            self.len
                        ));
                    }
                    at = e;
                }
                if at != self.len {
                    return Err(format!("a read of {} bytes answered with {at}", self.len));
                }
                Ok(Ok(self.data))
            }
            // Not an answer (nothing for the context asked about): not
            // known, the connection kept.
            Kind::BlockStatus if self.status.is_empty() => Ok(Err(NOT_KNOWN)),
            Kind::BlockStatus => Ok(Ok(self.status)),
            _ => Ok(Ok(Vec::new())),
        }
    }
}

/// Block status descriptors (as `Partial::finish` gives them) for the
/// `len` bytes asked about from `offset` on: where the first run of data
/// starts at or after it, and where that run ends as far as they say, or
/// where they stop saying when they hold no data; nothing past `offset +
/// len` is believed (a server may not answer beyond the request).
/// `STATE_ZERO` is what counts as a hole: a range said to read as zeros
/// (`STATE_HOLE` alone says it is not stored, not what it reads as).
/// None: a descriptor of no length.
pub(super) fn first_data(offset: u64, len: u64, descriptors: &[u8]) -> Option<Extents> {
    let limit = offset.checked_add(len)?;
    let mut at = offset;
    let mut start = None;
    for d in descriptors.chunks_exact(8) {
        let len = u32::from_be_bytes(d[0..4].try_into().unwrap()) as u64;
        let flags = u32::from_be_bytes(d[4..8].try_into().unwrap());
        if len == 0 {
            return None;
        }
        let zero = flags & nbd::STATE_ZERO != 0;
        match (start, zero) {
            (None, false) => start = Some(at),
            (Some(s), true) => return Some(Extents::Data(s..at)),
            _ => {}
        }
        at = at.checked_add(len)?.min(limit);
        if at == limit {
            break;
        }
    }
    Some(match start {
        Some(s) => Extents::Data(s..at),
        None => Extents::ZerosTo(at),
    })
}

/// What `first_data` found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Extents {
    /// A run of data (which may go on past what was said).
    Data(std::ops::Range<u64>),
    /// Zeros up to here, and nothing said past it.
    ZerosTo(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_chunk(offset: u64, bytes: &[u8]) -> (u16, Vec<u8>) {
        let mut p = offset.to_be_bytes().to_vec();
        p.extend_from_slice(bytes);
        (nbd::REPLY_TYPE_OFFSET_DATA, p)
    }

    fn hole_chunk(offset: u64, n: u32) -> (u16, Vec<u8>) {
        let mut p = offset.to_be_bytes().to_vec();
        p.extend_from_slice(&n.to_be_bytes());
        (nbd::REPLY_TYPE_OFFSET_HOLE, p)
    }

    fn gather(
        kind: Kind,
        offset: u64,
        len: usize,
        chunks: &[(u16, Vec<u8>)],
    ) -> Result<Outcome, String> {
        let mut p = Partial::new(kind, offset, len);
        for (t, payload) in chunks {
            p.chunk(&mut &payload[..], *t, payload.len() as u32, Some(7))?;
        }
        p.finish()
    }

    /// Data and hole chunks in any order make the read's bytes, holes as
    /// zeros.
    #[test]
    fn a_read_is_its_chunks_laid_in_place() {
        let got = gather(
            Kind::Read,
            4096,
            12,
            &[
                hole_chunk(4100, 4),
                data_chunk(4104, &[5, 6, 7, 8]),
                data_chunk(4096, &[1, 2, 3, 4]),
            ],
        );
        assert_eq!(got, Ok(Ok(vec![1, 2, 3, 4, 0, 0, 0, 0, 5, 6, 7, 8])));
    }

    /// A read the chunks do not cover exactly, or a chunk outside it, is
    /// a protocol error: never a buffer with bytes no one sent.
    #[test]
    fn a_read_with_a_gap_an_overlap_or_a_stray_chunk_ends_the_connection() {
        assert!(
            gather(Kind::Read, 0, 8, &[data_chunk(0, &[1; 4])]).is_err(),
            "gap at the end"
        );
        assert!(
            gather(Kind::Read, 0, 8, &[data_chunk(4, &[1; 4])]).is_err(),
            "gap at the start"
        );
        assert!(
            gather(
                Kind::Read,
                0,
                8,
                &[data_chunk(0, &[1; 6]), hole_chunk(4, 4)]
            )
            .is_err(),
            "overlap"
        );
        assert!(
            gather(
                Kind::Read,
                0,
                8,
                &[data_chunk(0, &[1; 4]), data_chunk(0, &[1; 4])]
            )
            .is_err(),
            "one range twice, the rest missing"
        );
        // A server that repeats a chunk is cut off as soon as the chunks
        // hold more than the request, not at its end.
        let mut p = Partial::new(Kind::Read, 0, 8);
        let (t, payload) = hole_chunk(0, 4);
        for _ in 0..2 {
            p.chunk(&mut &payload[..], t, 12, None).unwrap();
        }
        assert!(
            p.chunk(&mut &payload[..], t, 12, None).is_err(),
            "a third time"
        );
        let mut p = Partial::new(Kind::Read, 4096, 8);
        let (t, payload) = data_chunk(4092, &[1; 8]);
        assert!(
            p.chunk(&mut &payload[..], t, 16, None).is_err(),
            "before the request"
        );
        let mut p = Partial::new(Kind::Read, 4096, 8);
        let (t, payload) = hole_chunk(4100, 8);
        assert!(
            p.chunk(&mut &payload[..], t, 12, None).is_err(),
            "past its end"
        );
        let mut p = Partial::new(Kind::Write { fua: false }, 0, 8);
        let (t, payload) = data_chunk(0, &[1; 8]);
        assert!(
            p.chunk(&mut &payload[..], t, 16, None).is_err(),
            "data for a write"
        );
    }

    /// An error chunk is the reply's outcome, whatever else came.
    #[test]
    fn an_error_chunk_is_the_servers_errno() {
        let mut e = 5u32.to_be_bytes().to_vec();
        e.extend_from_slice(&3u16.to_be_bytes());
        e.extend_from_slice(b"bad");
        let got = gather(
            Kind::Read,
            0,
            8,
            &[data_chunk(0, &[1; 4]), (nbd::REPLY_TYPE_ERROR, e.clone())],
        );
        assert_eq!(got, Ok(Err(5)));
        // An error's message longer than its chunk: a protocol error.
        let mut short = e.clone();
        short[5] = 9;
        assert!(gather(Kind::Read, 0, 8, &[(nbd::REPLY_TYPE_ERROR, short)]).is_err());
        let mut off = e;
        off.extend_from_slice(&0u64.to_be_bytes());
        assert_eq!(
            gather(Kind::Zero, 0, 8, &[(nbd::REPLY_TYPE_ERROR_OFFSET, off)]),
            Ok(Err(5))
        );
    }

    fn status(extents: &[(u32, u32)]) -> Vec<u8> {
        extents
            .iter()
            .flat_map(|(l, f)| l.to_be_bytes().into_iter().chain(f.to_be_bytes()))
            .collect()
    }

    #[test]
    fn block_status_of_the_context_asked_for_is_kept() {
        let mut c = 9u32.to_be_bytes().to_vec();
        c.extend_from_slice(&status(&[(4096, 3)]));
        let mut ours = 7u32.to_be_bytes().to_vec();
        ours.extend_from_slice(&status(&[(8192, 0)]));
        let bs = nbd::REPLY_TYPE_BLOCK_STATUS;
        let got = gather(Kind::BlockStatus, 0, 8192, &[(bs, c.clone()), (bs, ours)]);
        assert_eq!(got, Ok(Ok(status(&[(8192, 0)]))));
        assert_eq!(
            gather(Kind::BlockStatus, 0, 8192, &[(bs, c)]),
            Ok(Err(nbd::EINVAL)),
            "no extents of ours: not known, the connection kept"
        );
    }

    /// Zeros (`STATE_ZERO`) are holes; a hole not said to read as zeros
    /// is data.
    #[test]
    fn the_first_run_of_data_is_found_from_the_extents() {
        let z = nbd::STATE_HOLE | nbd::STATE_ZERO;
        assert_eq!(
            first_data(
                100,
                1000,
                &status(&[(10, z), (20, 0), (5, nbd::STATE_HOLE), (30, z)])
            ),
            Some(Extents::Data(110..135))
        );
        assert_eq!(
            first_data(0, 100, &status(&[(10, 0), (20, 0)])),
            Some(Extents::Data(0..30))
        );
        assert_eq!(
            first_data(0, 100, &status(&[(10, z), (20, z)])),
            Some(Extents::ZerosTo(30))
        );
        assert_eq!(first_data(0, 100, &status(&[(10, z), (0, 0)])), None);
        // Nothing past the request is believed: zeros said beyond it stop
        // at its end, and what follows them is not read.
        assert_eq!(
            first_data(0, 20, &status(&[(30, z), (5, 0)])),
            Some(Extents::ZerosTo(20))
        );
        assert_eq!(
            first_data(0, 20, &status(&[(5, 0), (30, 0)])),
            Some(Extents::Data(0..20))
        );
    }
}
