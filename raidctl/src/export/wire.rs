//! NBD replies on the wire: a simple reply's 16-byte header, a
//! successful read's data after it; or, where the client negotiated
//! structured replies, a read's one chunk (its data at its offset, a
//! hole over all of it, or its error) and a block status's one chunk.
//! Written in as few system calls as the socket takes, and, where a send
//! stopped part-way, the rest from where it stopped (`Carry`,
//! `transmission.rs`).

use super::Conn;
use crate::nbd;
use raid_core::buf::AlignedBuf;
use std::io::{self, IoSlice};

/// A reply's buffer.
pub(super) enum Payload {
    None,
    /// A read's data, sent after the header.
    Data(AlignedBuf),
    /// A write's buffer, kept for the next requests.
    Spare(AlignedBuf),
}

/// How a reply goes on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Form {
    /// A simple reply (every reply, where structured replies were not
    /// negotiated; a reply to anything but a read or a block status,
    /// where they were: the spec allows either).
    Simple,
    /// A read's structured reply: one chunk, its data at `offset` or its
    /// error.
    Read { offset: u64 },
    /// A read's structured reply where all of it reads as zeros: one
    /// chunk that says so (`len` bytes of hole at `offset`), and no data.
    Hole { offset: u64, len: u32 },
    /// A block status's structured reply: one chunk, this payload (the
    /// context id and its extents) or the error.
    Status(Vec<u8>),
}

/// One reply; `bytes` is what its request counted in flight.
pub(super) struct Reply {
    pub(super) cookie: u64,
    pub(super) err: u32,
    pub(super) payload: Payload,
    pub(super) bytes: usize,
    pub(super) form: Form,
}

/// Replies the reader began to send: their first `sent` bytes (headers
/// and data, in the order `send` writes them) are out, the writer sends
/// the rest before anything else.
pub(super) struct Carry {
    pub(super) replies: Vec<Reply>,
    pub(super) sent: usize,
}

/// The longest header a reply has: a structured chunk's (20 bytes) and a
/// hole's offset and length after it.
const HEAD_MAX: usize = 32;

impl Reply {
    /// Its bytes on the wire.
    pub(super) fn wire_len(&self) -> usize {
        self.head_len() + self.body().map_or(0, <[u8]>::len)
    }

    /// The length of its head (`head`), without building it.
    fn head_len(&self) -> usize {
        match (&self.form, self.err) {
            (Form::Simple, _) => 16,
            (Form::Read { .. } | Form::Hole { .. } | Form::Status(_), err) if err != 0 => 26,
            (Form::Read { .. }, _) => 28,
            (Form::Hole { .. }, _) => 32,
            (Form::Status(_), _) => 20,
        }
    }

    /// The data sent after its header.
    pub(super) fn data(&self) -> Option<&[u8]> {
        match (self.err, &self.payload) {
            (0, Payload::Data(d)) => Some(d),
            _ => None,
        }
    }

    /// The bytes before its data (or its block status): the header, and
    /// an offset or error of a structured chunk. Returns their length.
    fn head(&self, h: &mut [u8; HEAD_MAX]) -> usize {
        let chunk = |h: &mut [u8; HEAD_MAX], kind: u16, len: usize| {
            h[0..4].copy_from_slice(&nbd::STRUCTURED_REPLY_MAGIC.to_be_bytes());
            h[4..6].copy_from_slice(&nbd::REPLY_FLAG_DONE.to_be_bytes());
            h[6..8].copy_from_slice(&kind.to_be_bytes());
            h[8..16].copy_from_slice(&self.cookie.to_be_bytes());
            h[16..20].copy_from_slice(&(len as u32).to_be_bytes());
        };
        let n = match (&self.form, self.err) {
            (Form::Simple, err) => {
                h[0..4].copy_from_slice(&nbd::SIMPLE_REPLY_MAGIC.to_be_bytes());
                h[4..8].copy_from_slice(&err.to_be_bytes());
                h[8..16].copy_from_slice(&self.cookie.to_be_bytes());
                16
            }
            (Form::Read { .. } | Form::Hole { .. } | Form::Status(_), err) if err != 0 => {
                // An error chunk: the error, and a message of no bytes.
                chunk(h, nbd::REPLY_TYPE_ERROR, 6);
                h[20..24].copy_from_slice(&err.to_be_bytes());
                h[24..26].copy_from_slice(&0u16.to_be_bytes());
                26
            }
            (Form::Read { offset }, _) => {
                let n = self.data().map_or(0, <[u8]>::len);
                chunk(h, nbd::REPLY_TYPE_OFFSET_DATA, 8 + n);
                h[20..28].copy_from_slice(&offset.to_be_bytes());
                28
            }
            (&Form::Hole { offset, len }, _) => {
                chunk(h, nbd::REPLY_TYPE_OFFSET_HOLE, 12);
                h[20..28].copy_from_slice(&offset.to_be_bytes());
                h[28..32].copy_from_slice(&len.to_be_bytes());
                32
            }
            (Form::Status(p), _) => {
                chunk(h, nbd::REPLY_TYPE_BLOCK_STATUS, p.len());
                20
            }
        };
        debug_assert_eq!(n, self.head_len(), "head_len agrees with head");
        n
    }

    /// What follows its head: a successful read's data, or a block
    /// status's extents.
    fn body(&self) -> Option<&[u8]> {
        match (&self.form, self.err) {
            (Form::Status(p), 0) => Some(p),
            _ => self.data(),
        }
    }
}

/// Calls `f` with the replies' wire form as slices (each head, then its
/// body), the first `skip` bytes left out.
pub(super) fn with_slices<T>(
    replies: &[Reply],
    skip: usize,
    f: impl FnOnce(&mut [IoSlice<'_>]) -> T,
) -> T {
    let heads: Vec<([u8; HEAD_MAX], usize)> = replies
        .iter()
        .map(|r| {
            let mut h = [0u8; HEAD_MAX];
            let n = r.head(&mut h);
            (h, n)
        })
        .collect();
    let mut slices = Vec::with_capacity(2 * replies.len());
    for (r, (h, n)) in replies.iter().zip(&heads) {
        slices.push(IoSlice::new(&h[..*n]));
        if let Some(d) = r.body() {
            slices.push(IoSlice::new(d));
        }
    }
    let mut rest = &mut slices[..];
    IoSlice::advance_slices(&mut rest, skip);
    f(rest)
}

/// Writes replies, the first `skip` bytes of their wire form left out
/// (sent already), in as few system calls as the socket takes.
pub(super) fn send(c: &mut dyn Conn, replies: &[Reply], skip: usize) -> io::Result<()> {
    with_slices(replies, skip, |mut rest| -> io::Result<()> {
        while !rest.is_empty() {
            let n = c.write_vectored(rest)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
        Ok(())
    })?;
    c.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a send that stopped part-way leaves is the rest of the wire
    /// form exactly, wherever it stopped: inside a header, inside data,
    /// between replies.
    #[test]
    fn the_rest_after_a_partial_send_is_the_wire_form_from_there() {
        let data = |n: usize, seed: u8| {
            let mut b = AlignedBuf::new(n);
            b.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = seed ^ i as u8);
            b
        };
        let reply = |cookie, err, payload| Reply {
            cookie,
            err,
            payload,
            bytes: 0,
            form: Form::Simple,
        };
        let replies = vec![
            reply(1, 0, Payload::Data(data(4096, 1))),
            reply(2, 0, Payload::None),
            // An error's data is not sent.
            reply(3, nbd::EIO, Payload::Data(data(4096, 3))),
            reply(4, 0, Payload::Spare(data(4096, 4))),
            reply(5, 0, Payload::Data(data(8192, 5))),
        ];
        let whole: Vec<u8> =
            with_slices(&replies, 0, |s| s.iter().flat_map(|x| x.to_vec()).collect());
        let total: usize = replies.iter().map(Reply::wire_len).sum();
        assert_eq!(whole.len(), total);
        assert_eq!(total, 5 * 16 + 4096 + 8192);
        assert_eq!(&whole[8..16], &1u64.to_be_bytes());
        for skip in 0..=total {
            let rest: Vec<u8> = with_slices(&replies, skip, |s| {
                s.iter().flat_map(|x| x.to_vec()).collect()
            });
            assert!(rest == whole[skip..], "after {skip} bytes");
        }
    }

    /// Structured replies on the wire, as the spec lays them out: a read's
    /// one chunk (its offset, then its data), a read's error chunk (no
    /// data after it, however much was read), a block status's chunk, and
    /// a partial send's rest exact across them.
    #[test]
    fn structured_chunks_are_laid_out_as_the_spec_says() {
        let reply = |cookie, err, payload, form| Reply {
            cookie,
            err,
            payload,
            bytes: 0,
            form,
        };
        let mut d = AlignedBuf::new(4096);
        d.fill(7);
        let status = vec![0, 0, 0, 1, 0, 0, 0x10, 0, 0, 0, 0, 3];
        let replies = vec![
            reply(9, 0, Payload::Data(d), Form::Read { offset: 1 << 20 }),
            reply(
                10,
                nbd::EIO,
                Payload::Data(AlignedBuf::new(4096)),
                Form::Read { offset: 0 },
            ),
            reply(11, 0, Payload::None, Form::Status(status.clone())),
            reply(12, nbd::EINVAL, Payload::None, Form::Status(Vec::new())),
            reply(13, 0, Payload::None, Form::Simple),
        ];
        let whole: Vec<u8> =
            with_slices(&replies, 0, |s| s.iter().flat_map(|x| x.to_vec()).collect());
        let total: usize = replies.iter().map(Reply::wire_len).sum();
        assert_eq!(whole.len(), total);
        assert_eq!(total, (28 + 4096) + 26 + (20 + 12) + 26 + 16);
        let be16 = |at: usize| u16::from_be_bytes(whole[at..at + 2].try_into().unwrap());
        let be32 = |at: usize| u32::from_be_bytes(whole[at..at + 4].try_into().unwrap());
        let be64 = |at: usize| u64::from_be_bytes(whole[at..at + 8].try_into().unwrap());
        // The read: magic, DONE, OFFSET_DATA, cookie, length, offset, data.
        assert_eq!(be32(0), nbd::STRUCTURED_REPLY_MAGIC);
        assert_eq!(be16(4), nbd::REPLY_FLAG_DONE);
        assert_eq!(be16(6), nbd::REPLY_TYPE_OFFSET_DATA);
        assert_eq!(be64(8), 9);
        assert_eq!(be32(16), 8 + 4096);
        assert_eq!(be64(20), 1 << 20);
        assert!(whole[28..28 + 4096].iter().all(|&b| b == 7));
        // Its error: ERROR, length 6, the errno, an empty message.
        let e = 28 + 4096;
        assert_eq!(be16(e + 6), nbd::REPLY_TYPE_ERROR);
        assert_eq!(be64(e + 8), 10);
        assert_eq!(be32(e + 16), 6);
        assert_eq!(be32(e + 20), nbd::EIO);
        assert_eq!(be16(e + 24), 0);
        // The block status: BLOCK_STATUS, its payload as given.
        let b = e + 26;
        assert_eq!(be16(b + 6), nbd::REPLY_TYPE_BLOCK_STATUS);
        assert_eq!(be32(b + 16), status.len() as u32);
        assert_eq!(&whole[b + 20..b + 32], &status[..]);
        assert_eq!(be16(b + 32 + 6), nbd::REPLY_TYPE_ERROR);
        assert_eq!(be32(b + 32 + 20), nbd::EINVAL);
        assert_eq!(be32(b + 58), nbd::SIMPLE_REPLY_MAGIC);
        for skip in 0..=total {
            let rest: Vec<u8> = with_slices(&replies, skip, |s| {
                s.iter().flat_map(|x| x.to_vec()).collect()
            });
            assert!(rest == whole[skip..], "after {skip} bytes");
        }
    }

    /// A read of holes alone: one OFFSET_HOLE chunk, its offset and its
    /// length, and no data (the buffer it holds is not sent).
    #[test]
    fn a_hole_chunk_is_its_offset_and_length() {
        let r = Reply {
            cookie: 7,
            err: 0,
            payload: Payload::Spare(AlignedBuf::new(4096)),
            bytes: 0,
            form: Form::Hole {
                offset: 1 << 30,
                len: 256 << 10,
            },
        };
        let whole: Vec<u8> = with_slices(std::slice::from_ref(&r), 0, |s| {
            s.iter().flat_map(|x| x.to_vec()).collect()
        });
        assert_eq!((whole.len(), r.wire_len()), (32, 32));
        assert_eq!(&whole[0..4], &nbd::STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&whole[4..6], &nbd::REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&whole[6..8], &nbd::REPLY_TYPE_OFFSET_HOLE.to_be_bytes());
        assert_eq!(&whole[8..16], &7u64.to_be_bytes());
        assert_eq!(&whole[16..20], &12u32.to_be_bytes());
        assert_eq!(&whole[20..28], &(1u64 << 30).to_be_bytes());
        assert_eq!(&whole[28..32], &(256u32 << 10).to_be_bytes());
    }
}
