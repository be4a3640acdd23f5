//! NBD simple replies on the wire: each a 16-byte header, a successful
//! read's data after it; written in as few system calls as the socket
//! takes, and, where a send stopped part-way, the rest from where it
//! stopped (`Carry`, `transmission.rs`).

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

/// A simple reply; `bytes` is what its request counted in flight.
pub(super) struct Reply {
    pub(super) cookie: u64,
    pub(super) err: u32,
    pub(super) payload: Payload,
    pub(super) bytes: usize,
}

/// Replies the reader began to send: their first `sent` bytes (headers
/// and data, in the order `send` writes them) are out, the writer sends
/// the rest before anything else.
pub(super) struct Carry {
    pub(super) replies: Vec<Reply>,
    pub(super) sent: usize,
}

impl Reply {
    /// Its bytes on the wire: a simple reply's header, and a successful
    /// read's data.
    pub(super) fn wire_len(&self) -> usize {
        16 + self.data().map_or(0, <[u8]>::len)
    }

    /// The data sent after its header.
    pub(super) fn data(&self) -> Option<&[u8]> {
        match (self.err, &self.payload) {
            (0, Payload::Data(d)) => Some(d),
            _ => None,
        }
    }
}

/// Calls `f` with the replies' wire form as slices (each header, then a
/// successful read's data), the first `skip` bytes left out.
pub(super) fn with_slices<T>(
    replies: &[Reply],
    skip: usize,
    f: impl FnOnce(&mut [IoSlice<'_>]) -> T,
) -> T {
    let heads: Vec<[u8; 16]> = replies
        .iter()
        .map(|r| {
            let mut h = [0u8; 16];
            h[0..4].copy_from_slice(&nbd::SIMPLE_REPLY_MAGIC.to_be_bytes());
            h[4..8].copy_from_slice(&r.err.to_be_bytes());
            h[8..16].copy_from_slice(&r.cookie.to_be_bytes());
            h
        })
        .collect();
    let mut slices = Vec::with_capacity(2 * replies.len());
    for (r, h) in replies.iter().zip(&heads) {
        slices.push(IoSlice::new(h));
        if let Some(d) = r.data() {
            slices.push(IoSlice::new(d));
        }
    }
    let mut rest = &mut slices[..];
    IoSlice::advance_slices(&mut rest, skip);
    f(rest)
}

/// Writes simple replies, the first `skip` bytes of their wire form left
/// out (sent already), in as few system calls as the socket takes.
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
}
