//! What a shard holds for each request in flight: the types only, so the
//! loop (`event_loop.rs`) and the request kinds (`read.rs`, `write.rs`)
//! each depend on them and not on one another.

use super::{ReadJob, WriteDone};
use crate::array::async_write::AsyncWrite;
use crate::array::copies_read::CopiesRead;
use crate::array::degraded_read::DegradedRead;
use crate::array::DirectPiece;
use crate::array::MemberTable;
use crate::stats::Started;
use std::io;
use std::sync::Arc;

/// A request in flight on a shard, by slab key.
pub(super) enum Op {
    Read(Box<ReadOp>),
    Write(Box<WriteOp>),
    /// A write to both devices of a pair (`pair.rs`), for an I/O of
    /// another request.
    Pair(Box<super::pair::PairOp>),
}

/// A read in flight on a shard.
pub(super) struct ReadOp {
    /// The request, its buffer the pieces' destination (unless gathered).
    pub(super) job: ReadJob,
    /// A read whose pieces land in a buffer of its own, from which the
    /// request's bytes are made once all are in.
    pub(super) gathered: Option<Gathered>,
    /// The member table the read was planned on: keeps its devices open.
    pub(super) handles: Arc<MemberTable>,
    pub(super) pieces: Vec<DirectPiece>,
    /// Bytes each piece has moved.
    pub(super) moved: Vec<usize>,
    pub(super) left: usize,
    /// The first member that erred.
    pub(super) failed: Option<(usize, io::Error)>,
    /// A piece came back empty (says nothing against its member).
    pub(super) short: bool,
    pub(super) started: Started,
}

/// A read that is not one member read per chunk into the request's
/// buffer.
pub(super) enum Gathered {
    /// A RAID5/6 chunk with no readable member, recovered from the rest
    /// of its stripe.
    Degraded(DegradedRead),
    /// Mirror chunks an unclean stop may have torn: every copy read, and
    /// compared.
    Copies(CopiesRead),
}

impl Gathered {
    /// Where its pieces land.
    pub(super) fn scratch(&mut self) -> &mut crate::buf::AlignedBuf {
        match self {
            Gathered::Degraded(d) => d.scratch(),
            Gathered::Copies(c) => c.scratch(),
        }
    }
}

/// A write in flight on a shard.
pub(super) struct WriteOp {
    pub(super) w: Box<AsyncWrite>,
    pub(super) done: WriteDone,
    /// The current step's I/Os: bytes moved so far, and each one's result
    /// (Ok until it has one: `left` says how many are still out). Both
    /// kept from step to step.
    pub(super) moved: Vec<usize>,
    pub(super) results: Vec<io::Result<()>>,
    pub(super) left: usize,
    pub(super) started: Started,
    /// Asked for with FUA: its member writes go as `IoKind::WriteFua`.
    pub(super) fua: bool,
}
