//! Writes a shard runs without a thread waiting on them (`crate::shard`):
//! a RAID5/6 write inside one stripe, by read-modify-write or reconstruct
//! write, and a RAID0/1/10 write of one chunk or several (each to every
//! copy; at most `MAX_COPY_WRITES` member writes), while every member they
//! touch is readable and nothing they need would block: a write-intent bit not yet durable, a
//! stripe or chunk lock another thread holds, any unsettled journal record
//! (for a stripe with every member there), the first write since the array
//! was clean. A RAID5/6 stripe with a chunk missing is written here too
//! where its reads need only chunks present (`Array::degraded_plan`):
//! through the journal, its record queued for the next group
//! (`Array::journal_submit`) and its writes started once the record is
//! durable; where none of its parity chunks is left, its data alone, with
//! no reads and no record (`Array::data_alone`). Every other write, and
//! each of these that meets such a case,
//! goes to the blocking path (`Array::write`) with nothing written, so
//! every rule of the write path beyond these cases stays in one place.
//!
//! The same rules as the blocking path, in the same order: counted into the
//! write-intent bitmap; the stripe's lock (RAID1/10: each chunk's; RAID0
//! takes none) from the first read to the last write; for RAID5/6, counted
//! in `unjournaled` (a write of its data alone is not: it has no parity
//! to tear) before the check that every member is readable, and
//! out of it before member errors fail members (a journaled write, as soon
//! as it is known to be one), which happens before the lock is given up;
//! a journal record's in-place write reported done (`journal_write_done`)
//! after its member errors are handled. Here these are owned values
//! (`Guards`): the write lives across completions and may end on another
//! thread.
//!
//! The caller (a shard) runs the member I/Os each step asks for (`ios`,
//! at `io_buf`) and hands back their results (`advance`).

use super::journal::{JournalDone, NotQueued, RoomWake};
use super::mirror_io::Piece as ChunkPiece;
use super::parity_io::{columns, covers, full_piece, Piece};
use super::write_guards::Guards;
use super::*;
use crate::buf::AlignedBuf;
use crate::layout::{PerMember, Place};
use crate::stats::Started;
use std::ops::RangeInclusive;

/// Member writes a RAID0/1/10 write may make on a shard, as many as a
/// shard's read may make: a larger one goes to the blocking path, whose
/// threads write it in batches.
const MAX_COPY_WRITES: usize = 256;

/// Where a member I/O's bytes are: a buffer of the write's own, or a
/// range of the request's data.
#[derive(Clone, Copy, Debug)]
pub(crate) enum IoBuf {
    Own(usize),
    Data { pos: usize, len: usize },
}

/// One member I/O a write asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MemberOp {
    pub slot: usize,
    /// Member byte offset.
    pub offset: u64,
    pub buf: IoBuf,
    pub write: bool,
}

/// What a write needs next.
pub(crate) enum Next {
    /// Run the member I/Os `ios` now lists, then `advance` with their
    /// results.
    Io,
    /// Finished: answer the client.
    Done(Result<()>),
    /// Nothing was written: fail these members (they erred on a read),
    /// then run the write on the blocking path.
    Blocking(Vec<(usize, MemberRef, io::Error)>),
    /// Some member write erred: `finish` it, with these results, on a
    /// thread that may block (failing a member waits for writers in
    /// flight, which may include the caller's own).
    Finish(Vec<io::Result<()>>),
}

enum Shape {
    /// RAID0/1/10: the chunks the write covers, in order, and every copy
    /// of each (RAID0: its one member), `Geometry::copies` per chunk in
    /// the chunks' order: one member write each.
    Chunks {
        pieces: Vec<ChunkPiece>,
        copies: Vec<Place>,
    },
    /// RAID5/6: the pieces of one stripe, by read-modify-write or not.
    /// `degraded`: which of the stripe's chunks were readable when the
    /// write was planned, where one was not (the write is journaled,
    /// unless `alone`: no parity chunk was readable, and the pieces are
    /// written alone, `Array::data_alone`).
    Stripe {
        s: u64,
        ps: Vec<Piece>,
        lo: u64,
        hi: u64,
        rmw: bool,
        degraded: Option<PerMember<bool>>,
        alone: bool,
    },
}

/// A `Shape::Chunks`' chunks, each with its copies.
fn by_chunk<'a>(
    a: &Array,
    pieces: &'a [ChunkPiece],
    copies: &'a [Place],
) -> impl Iterator<Item = (&'a ChunkPiece, &'a [Place])> {
    pieces.iter().zip(copies.chunks(a.geo.copies()))
}

/// Whether every member write of `shape` (a stripe's members are
/// `slots`) has its space (`Member::reserved`): where a sparse
/// file's rows are not yet reserved, the blocking path reserves them
/// first (that may block). Not asked of a RAID0 write of one chunk, which
/// has nothing to tear (the blocking path writes it as it comes); one
/// across chunks is reserved whole first there, so it is asked here too.
fn space_reserved(a: &Array, shape: &Shape, slots: &[usize], handles: &[MemberRef]) -> bool {
    let has = |slot: usize, at: u64, n: u64| handles[slot].reserved(at, n);
    match shape {
        Shape::Chunks { pieces, .. } if a.geo.level == Level::Raid0 && pieces.len() == 1 => true,
        Shape::Chunks { pieces, copies } => by_chunk(a, pieces, copies).all(|(p, cs)| {
            cs.iter()
                .all(|c| has(c.member, a.data_offset + c.offset + p.within, p.len))
        }),
        Shape::Stripe {
            s,
            ps,
            lo,
            hi,
            degraded,
            ..
        } => {
            let nd = a.geo.data_chunks();
            let written = |i: &usize| degraded.as_ref().is_none_or(|r| r[*i]);
            (ps.iter().map(|p| p.idx))
                .chain(nd..nd + a.geo.level.parity_chunks())
                .filter(written)
                .all(|i| has(slots[i], a.row_offset(*s, *lo), hi - lo))
        }
    }
}

/// A write in progress (see the module's doc).
pub(crate) struct AsyncWrite {
    g: Guards,
    offset: u64,
    data: AlignedBuf,
    shape: Shape,
    /// The write's own buffers: what the reads brought, then what the
    /// writes take (new columns, parity).
    bufs: Vec<AlignedBuf>,
    ios: Vec<MemberOp>,
    /// The member table the current step's I/Os were planned on.
    handles: Arc<MemberTable>,
    /// Whether the caller can run I/O on a member without blocking; asked
    /// again of the table the writes go to (a hot replace may have put a
    /// pair of devices in a slot meanwhile).
    can: fn(&dyn Member) -> bool,
    writing: bool,
    /// The writes are planned, and their journal record is to be made
    /// durable before they start (`journal`).
    journal_due: bool,
    /// The journal record queued for the next group (its sequence).
    queued: Option<u64>,
    started: Started,
    /// Whether its end is counted as a client's write in the array's
    /// statistics: not a part of one the shards cut (`uncounted`).
    counted: bool,
}

/// Whether `start` took the write.
pub(crate) enum Start {
    Go(Box<AsyncWrite>),
    /// The blocking path's: the request's data back.
    Blocking(AlignedBuf),
}

impl AsyncWrite {
    /// Plans a write of `data` at `offset` whose member I/Os run where
    /// `can` says a member can take them without blocking; its first I/Os
    /// are in `ios`.
    pub(crate) fn start(
        array: &LocalArray,
        offset: u64,
        data: AlignedBuf,
        can: fn(&dyn Member) -> bool,
    ) -> Start {
        let len = data.len() as u64;
        let a = array.as_ref();
        // Bad requests, empty ones, a failed or full array, the first write
        // since clean: the blocking path answers (and marks dirty).
        if len == 0
            || a.check_range(offset, len).is_err()
            || !a.dirty_marked.load(Ordering::Acquire)
            || !a.within_redundancy()
            || a.full.load(Ordering::Acquire)
            || a.needs_bounce(&data)
        {
            return Start::Blocking(data);
        }
        let mut shape = match a.geo.level {
            Level::Raid5 | Level::Raid6 => {
                let Some((s, ps)) = a.stripe_pieces(offset, len) else {
                    return Start::Blocking(data);
                };
                let (lo, hi) = columns(&ps);
                let rmw = a.prefers_rmw(s, &ps);
                Shape::Stripe {
                    s,
                    ps,
                    lo,
                    hi,
                    rmw,
                    degraded: None,
                    alone: false,
                }
            }
            Level::Raid0 | Level::Raid1 | Level::Raid10 => {
                let chunks = (offset + len - 1) / a.geo.chunk - offset / a.geo.chunk + 1;
                if chunks as usize * a.geo.copies() > MAX_COPY_WRITES {
                    return Start::Blocking(data);
                }
                let pieces = a.chunk_pieces(offset, len);
                // By `copy_place`: no vector per chunk on the way.
                let n = a.geo.copies();
                let mut copies = Vec::with_capacity(pieces.len() * n);
                for p in &pieces {
                    copies.extend((0..n).map(|k| a.geo.copy_place(p.chunk, k)));
                }
                Shape::Chunks { pieces, copies }
            }
        };
        // A stripe's members, by their place in it (none for chunks: each
        // copy names its own).
        let slots: PerMember<usize> = match &shape {
            Shape::Stripe { s, .. } => a.geo.stripe_map(*s).members,
            Shape::Chunks { .. } => PerMember::new(),
        };
        let mut g = Guards {
            array: array.clone(),
            record: None,
            queued: false,
            locks: None,
            intent: None,
            in_flight: None,
        };
        match a.try_intend_write(offset, len) {
            Some(intent) => g.intent = intent,
            None => return Start::Blocking(data),
        }
        if let Some(keys) = a.write_lock_keys(offset, len) {
            if !a.locks.try_lock_range_raw(keys.clone()) {
                return Start::Blocking(data);
            }
            g.locks = Some(keys);
        }
        // Under the lock, the member table then the readability (the
        // blocking path's order: a rebuild cannot pass this stripe between
        // them). A stripe with a chunk missing is written here where its
        // reads need no recovery (`Array::degraded_plan`), through the
        // journal, or where no parity chunk is left, its pieces alone
        // (`Array::data_alone`); other degraded writes go to the blocking
        // path. So is,
        // through the journal, one whose chunks are all readable but not
        // all so after a crash (`Array::readable_after_a_crash`: rows a
        // rebuild has written, not yet saved as in sync).
        let handles = array.member_handles();
        let rows_ok = match &mut shape {
            Shape::Stripe {
                s,
                ps,
                rmw,
                degraded,
                alone,
                ..
            } => {
                let readable: PerMember<bool> = slots.iter().map(|&m| a.readable(m, *s)).collect();
                let kept_one = |i: usize| a.readable_after_a_crash(slots[i], *s);
                let kept = || (0..slots.len()).all(kept_one);
                match readable.iter().all(|&r| r) && kept() {
                    // A stripe with an unsettled journal record is written
                    // through the journal, by the blocking path. Asked
                    // here, under the stripe's lock (its records are added
                    // only under it, so the answer holds until the write
                    // ends) and before the write is counted in
                    // `unjournaled` (a member failure may hold the
                    // journal's lock while it waits for those counted in).
                    true => a.journal_pending_now(*s) == Some(false),
                    // No record of it pending either (the same question):
                    // its replay would write older columns over these.
                    false if a.data_alone(|i| readable[i], kept_one) => {
                        *alone = true;
                        *degraded = Some(readable);
                        a.journal_pending_now(*s) == Some(false)
                    }
                    // Its record is of every column: where the stripe
                    // has a parity-only record not yet durable in place,
                    // the blocking path's (which takes a parity-only
                    // record too, or flushes first:
                    // `Array::journal_parity_barrier`).
                    false => match a.degraded_plan(*s, ps, |i| readable[i]) {
                        Some(by_rmw) => {
                            *rmw = by_rmw;
                            *degraded = Some(readable);
                            !a.journal_parity_unflushed(*s)
                        }
                        None => false,
                    },
                }
            }
            // Every copy in sync: a write that would skip one (degraded, or
            // being rebuilt past here) is the blocking path's.
            Shape::Chunks { copies, .. } => copies.iter().all(|p| a.copy_readable(p)),
        };
        // The members written or read (a degraded stripe's missing ones
        // are neither).
        let used = |i: usize| match &shape {
            Shape::Stripe {
                degraded: Some(r), ..
            } => r[i],
            _ => true,
        };
        let runs = |(i, &m): (usize, &usize)| !used(i) || can(handles[m].as_ref());
        let every_member_runs = match &shape {
            Shape::Stripe { .. } => slots.iter().enumerate().all(runs),
            Shape::Chunks { copies, .. } => copies.iter().all(|p| can(handles[p.member].as_ref())),
        };
        // A write into a sparse file's rows not yet reserved: the blocking
        // path reserves them first (`Member::reserve` may block).
        if !rows_ok || !every_member_runs || !space_reserved(a, &shape, &slots, &handles) {
            return Start::Blocking(data);
        }
        let mut w = AsyncWrite {
            g,
            offset,
            data,
            shape,
            bufs: Vec::new(),
            ios: Vec::new(),
            handles,
            can,
            writing: false,
            journal_due: false,
            queued: None,
            started: Started::now(),
            counted: true,
        };
        match w.plan_reads() {
            true => Start::Go(Box::new(w)),
            false => match w.plan_writes() {
                Some(Ok(())) => Start::Go(Box::new(w)),
                _ => Start::Blocking(w.give_up()),
            },
        }
    }

    /// The member I/Os of the current step.
    pub(crate) fn ios(&self) -> &[MemberOp] {
        &self.ios
    }

    /// The member table the current step's I/Os were planned on: hold it
    /// until they complete (it keeps their devices open).
    pub(crate) fn handles(&self) -> &Arc<MemberTable> {
        &self.handles
    }

    /// Where the bytes of I/O `i` of the current step are, and how many:
    /// a pointer, not a slice, since several I/Os in flight may share
    /// bytes (a mirror's copies all write the request's data). The buffers
    /// are heap memory that stays put while the write lives, even as it
    /// moves.
    pub(crate) fn io_buf(&mut self, i: usize) -> (*mut u8, usize) {
        match self.ios[i].buf {
            IoBuf::Own(b) => (self.bufs[b].as_mut_ptr(), self.bufs[b].len()),
            IoBuf::Data { pos, len } => {
                assert!(pos + len <= self.data.len());
                // SAFETY: in bounds (checked above).
                (unsafe { self.data.as_mut_ptr().add(pos) }, len)
            }
        }
    }

    /// The keys of the locks the write holds (`Array::write_lock_keys`).
    pub(crate) fn lock_keys(&self) -> Option<RangeInclusive<u64>> {
        self.g.locks.clone()
    }

    /// Not counted in the array's client statistics when it ends: a part
    /// of a client's write that the shards cut (or a merged write holding
    /// one), whose client writes the shards count.
    pub(crate) fn uncounted(&mut self) {
        self.counted = false;
    }

    /// Whether its end is counted (`uncounted`).
    pub(crate) fn is_counted(&self) -> bool {
        self.counted
    }

    /// The offset the client asked to write at.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Ends the write (done, or given up with nothing written for the
    /// blocking path): its guards released, its data back.
    pub(crate) fn give_up(self) -> AlignedBuf {
        let AsyncWrite { g, data, .. } = self;
        drop(g);
        data
    }

    /// The reads a read-modify-write (old data and parity) or a
    /// reconstruct-write (the data chunks the request does not cover)
    /// needs; false if it needs none.
    fn plan_reads(&mut self) -> bool {
        let a = self.g.array.clone();
        let Shape::Stripe {
            s,
            ref ps,
            lo,
            hi,
            rmw,
            alone: false,
            ..
        } = self.shape
        else {
            return false;
        };
        let nd = a.geo.data_chunks();
        let np = a.geo.level.parity_chunks();
        let idxs: PerMember<usize> = if rmw {
            ps.iter().map(|p| p.idx).chain(nd..nd + np).collect()
        } else {
            (0..nd)
                .filter(|&i| full_piece(ps, i, lo, hi).is_none())
                .collect()
        };
        let map = a.geo.stripe_map(s);
        // Each filled by its read; a read step with one not filled goes
        // no further (`advance`). Room for the writes' I/Os too, and for
        // a read-modify-write's buffers (`plan_writes`), so that neither
        // vector grows.
        let writes = a.geo.members;
        self.bufs = Vec::with_capacity(idxs.len() + writes);
        self.bufs
            .extend((0..idxs.len()).map(|_| AlignedBuf::for_overwrite((hi - lo) as usize)));
        self.ios = Vec::with_capacity(idxs.len().max(writes));
        self.ios
            .extend(idxs.iter().enumerate().map(|(k, &i)| MemberOp {
                slot: map.members[i],
                offset: a.row_offset(s, lo),
                buf: IoBuf::Own(k),
                write: false,
            }));
        !self.ios.is_empty()
    }

    /// After the reads: the new columns and parity computed, counted in
    /// `unjournaled` and the stripe checked readable, the writes planned.
    /// `None`: the stripe changed (a member failed, a journal record
    /// appeared), nothing written.
    fn plan_writes(&mut self) -> Option<Result<()>> {
        let a = self.g.array.clone();
        self.writing = true;
        let (s, ps, lo, hi, rmw) = match &self.shape {
            Shape::Chunks { pieces, copies } => {
                // Each chunk's part of the request, to every copy of it.
                self.ios = by_chunk(&a, pieces, copies)
                    .flat_map(|(p, cs)| {
                        cs.iter().map(|c| MemberOp {
                            slot: c.member,
                            offset: a.data_offset + c.offset + p.within,
                            buf: IoBuf::Data {
                                pos: p.pos,
                                len: p.len as usize,
                            },
                            write: true,
                        })
                    })
                    .collect();
                return Some(Ok(()));
            }
            Shape::Stripe {
                s, ps, alone: true, ..
            } => {
                // Planned by `start` under the stripe's lock a moment ago,
                // on the member table it checked.
                self.ios = a.alone_writes(*s, ps);
                return Some(Ok(()));
            }
            Shape::Stripe {
                s, ps, lo, hi, rmw, ..
            } => (*s, ps, *lo, *hi, *rmw),
        };
        let nd = a.geo.data_chunks();
        let np = a.geo.level.parity_chunks();
        // The read step's vector, its room kept (`plan_reads`).
        let mut ios = std::mem::take(&mut self.ios);
        ios.clear();
        let map = a.geo.stripe_map(s);
        let at = a.row_offset(s, lo);
        let op = |i: usize, buf: IoBuf| MemberOp {
            slot: map.members[i],
            offset: at,
            buf,
            write: true,
        };
        if rmw {
            // bufs: old data (becoming deltas), old parity (becoming new),
            // then the merged data columns (`rmw_apply`); a piece that
            // covers its columns is written from the request.
            let mut merged = self.bufs.len();
            if let Err(e) = a.rmw_apply(ps, &self.data, lo, hi, &mut self.bufs) {
                return Some(Err(e));
            }
            ios.extend(ps.iter().map(|p| {
                let buf = match covers(p, lo, hi) {
                    true => IoBuf::Data {
                        pos: p.pos,
                        len: p.len as usize,
                    },
                    false => {
                        merged += 1;
                        IoBuf::Own(merged - 1)
                    }
                };
                op(p.idx, buf)
            }));
            ios.extend((0..np).map(|k| op(nd + k, IoBuf::Own(ps.len() + k))));
        } else {
            let mut read = std::mem::take(&mut self.bufs).into_iter();
            let mut cols: Vec<Option<AlignedBuf>> = (0..nd)
                .map(|i| {
                    full_piece(ps, i, lo, hi)
                        .is_none()
                        .then(|| read.next().expect("read"))
                })
                .collect();
            let parity = match a.rcw_apply(ps, &self.data, lo, hi, &mut cols) {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            for p in ps {
                // A chunk read and merged is written from its column; one
                // the request covers whole, from the request.
                let buf = match &cols[p.idx] {
                    Some(_) => IoBuf::Own(self.bufs.len()),
                    None => IoBuf::Data {
                        pos: p.pos,
                        len: p.len as usize,
                    },
                };
                if let Some(b) = cols[p.idx].take() {
                    self.bufs.push(b);
                }
                ios.push(op(p.idx, buf));
            }
            for (k, b) in parity.into_iter().enumerate() {
                ios.push(op(nd + k, IoBuf::Own(self.bufs.len())));
                self.bufs.push(b);
            }
        }
        // Counted in before the readability check (see unjournaled.rs);
        // a stripe with an unsettled journal record is written through the
        // journal, by the blocking path.
        self.g.in_flight = Some(a.unjournaled.enter_raw());
        let readable: PerMember<bool> = map.members.iter().map(|&m| a.readable(m, s)).collect();
        match &self.shape {
            Shape::Stripe {
                degraded: Some(was),
                ..
            } => {
                // Planned on the chunks readable then: a member failed
                // since (or came back) takes it to the blocking path.
                if *was != readable {
                    return None;
                }
                // Journaled, so not among the writes without a record
                // (the blocking path's order); the missing chunks are
                // not written.
                self.g.leave_in_flight();
                ios.retain(|op| {
                    map.members
                        .iter()
                        .zip(&readable)
                        .any(|(&m, &r)| r && m == op.slot)
                });
                self.journal_due = true;
            }
            _ => {
                // (Not journaled: `start` found no record of the stripe.)
                if !readable.iter().all(|&r| r) {
                    return None;
                }
            }
        }
        self.handles = a.member_handles();
        if !ios
            .iter()
            .all(|op| (self.can)(self.handles[op.slot].as_ref()))
        {
            return None;
        }
        self.ios = ios;
        Some(Ok(()))
    }

    /// Whether the write's journal record must be made durable (`journal`)
    /// before its planned writes start.
    pub(crate) fn journal_due(&self) -> bool {
        self.journal_due
    }

    /// Whether it skips a missing member (journaled, or written `alone`).
    pub(crate) fn skips_a_member(&self) -> bool {
        matches!(&self.shape, Shape::Stripe { degraded, .. } if degraded.is_some())
    }

    /// Whether the write was planned on a stripe with a chunk missing and
    /// will be journaled (not one written `alone`).
    pub(crate) fn degraded(&self) -> bool {
        matches!(
            self.shape,
            Shape::Stripe {
                degraded: Some(_),
                alone: false,
                ..
            }
        )
    }

    /// Queues the write's journal record (its new columns for every
    /// member written: a degraded stripe's) for the next group; `done` is
    /// called with whether it is durable, then `journaled` (or
    /// `journal_failed`). Not queued (`Array::journal_submit`): nothing is
    /// written, and the write tries again when `room` is called
    /// (`NotQueued::Later`) or goes to the blocking path.
    pub(crate) fn journal(
        &mut self,
        done: JournalDone,
        room: RoomWake,
    ) -> std::result::Result<(), NotQueued> {
        let a = self.g.array.clone();
        let Shape::Stripe { s, lo, .. } = self.shape else {
            unreachable!("only a stripe is journaled")
        };
        let map = a.geo.stripe_map(s);
        let chunks: Vec<(usize, &[u8])> = self
            .ios
            .iter()
            .map(|op| {
                let idx = map.members.iter().position(|&m| m == op.slot);
                let bytes = match op.buf {
                    IoBuf::Own(b) => &self.bufs[b][..],
                    IoBuf::Data { pos, len } => &self.data[pos..pos + len],
                };
                (idx.expect("a member of the stripe"), bytes)
            })
            .collect();
        self.queued = Some(a.shared().journal_submit(s, lo, &chunks, done, room)?);
        self.g.queued = true;
        self.journal_due = false;
        Ok(())
    }

    /// The record `journal` queued is durable: the writes may start, and
    /// the journal hears when they are done (as the write ends). They go
    /// to the member table planned on, one group commit old at most: under
    /// the stripe's lock no rebuild or hot replace copies this stripe
    /// meanwhile, and a member failed since takes a write no one reads.
    pub(crate) fn journaled(&mut self) {
        self.g.queued = false;
        self.g.record = self.queued.take();
    }

    /// The record `journal` queued was given up: nothing of the write is
    /// written. Ends it, with its error and its data back.
    pub(crate) fn journal_failed(mut self) -> (ArrayError, AlignedBuf) {
        self.g.queued = false;
        let e = self.g.array.journal_unwritten_error();
        self.count(false);
        (e, self.give_up())
    }

    /// The current step's I/Os completed with `results` (in `ios` order;
    /// the caller finished short transfers): what the write needs next.
    /// `results` is the caller's to fill again for the next step (emptied
    /// here, or taken where the write ends on another thread).
    pub(crate) fn advance(&mut self, results: &mut Vec<io::Result<()>>) -> Next {
        if !self.writing {
            if results.iter().all(|r| r.is_ok()) {
                results.clear();
                return match self.plan_writes() {
                    Some(Ok(())) => Next::Io,
                    Some(Err(e)) => Next::Done(self.counted(Err(e))),
                    None => Next::Blocking(Vec::new()),
                };
            }
            // A read that came back empty, or that its member could not
            // start, says nothing against the member: the blocking path
            // reads it again.
            let failed = self
                .ios
                .iter()
                .zip(results.drain(..))
                .filter_map(|(op, r)| {
                    let e = r
                        .err()
                        .filter(|e| e.kind() != io::ErrorKind::UnexpectedEof)?;
                    Some((op.slot, self.handles[op.slot].clone(), e))
                })
                .collect();
            return Next::Blocking(failed);
        }
        // The writes are done: out before member errors are handled
        // (failing a member waits for the writers counted in).
        self.g.leave_in_flight();
        if results.iter().any(|r| r.is_err()) {
            return Next::Finish(std::mem::take(results));
        }
        results.clear();
        Next::Done(self.counted(self.outcome(&[], false)))
    }

    /// The write's result once its member writes are done, `errors` the
    /// members that erred (failed by now), `full` whether one of them was
    /// out of space: what the blocking path answers.
    fn outcome(&self, errors: &[(usize, io::Error)], full: bool) -> Result<()> {
        let a = &self.g.array;
        match &self.shape {
            // Written where every chunk has a copy that took it, as the
            // blocking path says (and is still in sync: one failed
            // meanwhile holds nothing). RAID0's one copy: written where
            // no member erred.
            Shape::Chunks { copies, .. } => {
                let took = |(op, p): (&MemberOp, &Place)| {
                    !errors.iter().any(|(slot, _)| *slot == op.slot) && a.copy_readable(p)
                };
                let n = a.geo.copies();
                let each_held = (self.ios.chunks(n).zip(copies.chunks(n)))
                    .all(|(ops, cs)| ops.iter().zip(cs).any(took));
                match a.no_space_error().filter(|_| full) {
                    Some(e) => Err(e),
                    None if !each_held => Err(a.failed_error()),
                    None => Ok(()),
                }
            }
            Shape::Stripe { s, .. } => {
                let map = a.geo.stripe_map(*s);
                let missing = map.members.iter().filter(|&&m| !a.readable(m, *s)).count();
                match a.no_space_error().filter(|_| full) {
                    Some(e) => Err(e),
                    None if missing > a.geo.level.parity_chunks() => Err(a.failed_error()),
                    None => Ok(()),
                }
            }
        }
    }

    /// The write ends with `r`: counted as the client's write (its guards
    /// go when the caller gives it up).
    fn counted(&self, r: Result<()>) -> Result<()> {
        self.count(r.is_ok());
        r
    }

    /// Counts the write's end, `ok` or not, unless it is `uncounted`.
    fn count(&self, ok: bool) {
        if self.counted {
            let (len, took) = (self.data.len() as u64, self.started.took());
            self.g.array.client_io.write.record(len, took, ok);
        }
    }

    /// Ends a write whose member writes erred (`Next::Finish`), on a thread
    /// that may block: members with errors failed, and the result the
    /// blocking path would give. The stripe's lock is held until then, so
    /// no other writer reads a chunk its member did not take.
    pub(crate) fn finish(self, results: Vec<io::Result<()>>) -> (Result<()>, AlignedBuf) {
        let a = self.g.array.clone();
        let errors: Vec<(usize, io::Error)> = self
            .ios
            .iter()
            .zip(results)
            .filter_map(|(op, r)| r.err().map(|e| (op.slot, e)))
            .collect();
        let mut full = false;
        for (slot, e) in &errors {
            full |= a.member_write_failed(*slot, &self.handles[*slot], e);
        }
        let r = self.counted(self.outcome(&errors, full));
        (r, self.give_up())
    }
}
