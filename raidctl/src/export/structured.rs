//! What structured replies bring to a connection (NBD_OPT_STRUCTURED_REPLY
//! and the `base:allocation` meta context): how each reply goes on the
//! wire; block status, the array's holes and data as
//! `Array::zero_extents` names them; and a read of holes alone answered
//! with a hole chunk, no data read or sent.

use super::wire::Form;
use crate::nbd::{self, Request};
use raid_core::array::Array;

/// The id of the one meta context served (`base:allocation`), as a
/// client that selects it is told.
pub(super) const ALLOCATION_CONTEXT: u32 = 1;

/// What the client negotiated beyond simple replies.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Negotiated {
    /// Structured replies: a read is answered with a chunk of them.
    pub(super) structured: bool,
    /// The `base:allocation` context selected: block status is answered.
    pub(super) block_status: bool,
}

impl Negotiated {
    /// How the reply to `req` goes: a read and a block status (an error
    /// too; `block_status` fills in its extents) as a structured chunk
    /// where those were negotiated, anything else simply.
    pub(super) fn form(self, req: &Request) -> Form {
        match req.kind {
            nbd::CMD_READ if self.structured => Form::Read { offset: req.offset },
            nbd::CMD_BLOCK_STATUS if self.structured => Form::Status(Vec::new()),
            _ => Form::Simple,
        }
    }
}

/// The smallest read checked for holes. Asking the members where their
/// data starts takes a system call per chunk the read covers, up to the
/// first that holds data (about a microsecond each), which a read of a
/// few pages would pay on every request; a copy tool that reads every
/// byte reads in pieces of 256 KiB or more (nbdcopy, qemu-img), where
/// the check costs a few percent of the copy it may save.
const HOLE_READ_MIN: u32 = 64 << 10;

impl Negotiated {
    /// The reply to read `req` where all of it reads as zeros
    /// (`Array::read_of_holes`, which counts it as a client read): one
    /// hole chunk, so the array reads nothing and the client is sent no
    /// zeros (as qemu-nbd answers a read of holes). `None` where it holds
    /// data, is too small to be worth the asking, or structured replies
    /// were not negotiated. (A read's reply is one chunk either way: the
    /// DF flag, which asks for that, is not offered.) The holes are as of
    /// now: a write still in flight to the same range may land after, as
    /// with any read that overlaps a write in flight.
    pub(super) fn hole_read(self, array: &Array, req: &Request) -> Option<Form> {
        if !self.structured || req.kind != nbd::CMD_READ || req.length < HOLE_READ_MIN {
            return None;
        }
        array
            .read_of_holes(req.offset, req.length as u64)
            .then_some(Form::Hole {
                offset: req.offset,
                len: req.length,
            })
    }
}

/// Most bytes of the array one block status answers for: a client asks
/// again from where the answer ended (the spec lets a server answer for
/// less than was asked), and the reader, which answers it, is kept from
/// its other requests at most a few milliseconds where the members are
/// files (a network member's server is asked too: a round trip per run
/// of data or hole, each bounded by `client::STATUS_WAIT`).
const STATUS_SPAN: u64 = 256 << 20;

/// A block status's answer: its error, or its one chunk, the extents of
/// the array from the request's offset, for at most `STATUS_SPAN` bytes
/// (one with `REQ_ONE`), each a hole that reads as zeros or data
/// (`Array::zero_extents`).
pub(super) fn block_status(array: &Array, req: &Request, n: Negotiated) -> (u32, Form) {
    if !n.structured || !n.block_status {
        // Refused in the form negotiated (simply, without structured
        // replies).
        return (nbd::EINVAL, n.form(req));
    }
    let len = (req.length as u64).min(STATUS_SPAN);
    let most = if req.flags & nbd::CMD_FLAG_REQ_ONE != 0 {
        1
    } else {
        usize::MAX
    };
    let extents = array.zero_extents_upto(req.offset, len, most);
    let mut p = ALLOCATION_CONTEXT.to_be_bytes().to_vec();
    for (len, zero) in extents {
        // At most STATUS_SPAN each: a u32.
        p.extend_from_slice(&(len as u32).to_be_bytes());
        let state = if zero {
            nbd::STATE_HOLE | nbd::STATE_ZERO
        } else {
            0
        };
        p.extend_from_slice(&state.to_be_bytes());
    }
    (0, Form::Status(p))
}
