//! RAID5/6 data paths: writes by read-modify-write or reconstruct-write,
//! chosen by the number of member reads each needs, and zeroing; the
//! pieces and columns a request maps to. Reads are `parity_read.rs`.
//!
//! A write holds its stripe's lock from the first read to the last write,
//! so two writers never compute parity from each other's half-written data.
//! A member error during a read fails the member and the stripe is tried
//! again without it; a member error during a write fails the member and the
//! write stands as long as the stripe is within its redundancy (the lost
//! chunk is implied by the parity that was written with it).

use super::journal::Kind;
use super::*;
use crate::buf::AlignedBuf;
use crate::layout::PerMember;
use crate::member::{submit, IoOp, MemberIo};
use crate::parity::{GenJob, ParityKind};

/// Most whole stripes one batched full-stripe write covers (and only for an
/// engine whose `preferred_batch` asks for batches: a GPU's, not the CPU's):
/// enough for a GPU to pay, few enough that the stripe locks it holds and
/// its parity buffers (64 x 2 chunks) stay small.
const FULL_STRIPE_BATCH: usize = 64;

/// A piece of a request that falls in one chunk.
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    pub stripe: u64,
    /// Data chunk index within the stripe.
    pub idx: usize,
    /// Byte offset within the chunk.
    pub within: u64,
    pub len: u64,
    /// Byte offset within the request.
    pub pos: usize,
}

/// What went wrong inside one stripe attempt.
enum StepErr {
    /// A member failed during reads: plan the stripe again without it.
    Retry,
    Fatal(ArrayError),
}

impl From<ArrayError> for StepErr {
    fn from(e: ArrayError) -> Self {
        StepErr::Fatal(e)
    }
}

/// The columns [lo, hi) the pieces of one stripe's write span.
pub(super) fn columns(ps: &[Piece]) -> (u64, u64) {
    let lo = ps.iter().map(|p| p.within).min().unwrap();
    let hi = ps.iter().map(|p| p.within + p.len).max().unwrap();
    (lo, hi)
}

/// The piece that covers data chunk `i`'s columns [lo, hi) entirely, if
/// one does: reconstruct-write takes that chunk from the request itself.
pub(super) fn full_piece(ps: &[Piece], i: usize, lo: u64, hi: u64) -> Option<&Piece> {
    ps.iter().find(|p| p.idx == i && covers(p, lo, hi))
}

/// Whether piece `p` covers its chunk's columns [lo, hi) entirely: its
/// new column is then the request's own bytes, with nothing to merge.
pub(super) fn covers(p: &Piece, lo: u64, hi: u64) -> bool {
    p.within == lo && p.within + p.len == hi
}

/// Data chunk `i`'s new columns in a reconstruct-write: read and merged
/// (`cols[i]`), or the request's own bytes.
pub(super) fn new_column<'a>(
    ps: &[Piece],
    data: &'a [u8],
    lo: u64,
    hi: u64,
    cols: &'a [Option<AlignedBuf>],
    i: usize,
) -> &'a [u8] {
    match (&cols[i], full_piece(ps, i, lo, hi)) {
        (Some(b), _) => &b[..],
        (None, Some(p)) => &data[p.pos..p.pos + p.len as usize],
        (None, None) => unreachable!("every data chunk is covered or read"),
    }
}

pub(super) fn xor_into(dst: &mut [u8], src: &[u8]) {
    xor_into_nonzero(dst, src);
}

/// `xor_into`, saying whether any byte of the result is not zero, in the
/// same pass: a scrub's syndrome and its test (a test of byte after byte
/// that stops at the first is not vectorised: after the XOR it made the
/// scrub about 1.4x slower where the CPU bounds it). Inlined into
/// `xor_into`, whose callers ignore it, the test is compiled away.
#[inline(always)]
pub(super) fn xor_into_nonzero(dst: &mut [u8], src: &[u8]) -> bool {
    let mut any = 0u64;
    for (d, s) in dst.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
        let v =
            u64::from_ne_bytes(d.try_into().unwrap()) ^ u64::from_ne_bytes(s.try_into().unwrap());
        d.copy_from_slice(&v.to_ne_bytes());
        any |= v;
    }
    any != 0
}

impl Array {
    /// Only called on the RAID5/6 paths.
    pub(super) fn kind(&self) -> ParityKind {
        self.geo.level.parity_kind().unwrap_or(ParityKind::P)
    }

    /// Member byte offset of row `s`, plus `within`.
    pub(super) fn row_offset(&self, s: u64, within: u64) -> u64 {
        self.data_offset + s * self.geo.chunk + within
    }

    pub(super) fn pieces(&self, offset: u64, len: u64) -> Vec<Piece> {
        let chunk = self.geo.chunk;
        let nd = self.geo.data_chunks() as u64;
        let mut out = Vec::new();
        let mut pos = 0u64;
        while pos < len {
            let at = offset + pos;
            let c = at / chunk;
            let within = at % chunk;
            let n = (chunk - within).min(len - pos);
            out.push(Piece {
                stripe: c / nd,
                idx: (c % nd) as usize,
                within,
                len: n,
                pos: pos as usize,
            });
            pos += n;
        }
        out
    }

    /// The pieces of a request that lies inside one stripe, and that
    /// stripe; None where it crosses into the next (what the shards'
    /// writes and degraded reads serve, one stripe each).
    pub(super) fn stripe_pieces(&self, offset: u64, len: u64) -> Option<(u64, Vec<Piece>)> {
        let ps = self.pieces(offset, len);
        let s = ps.first()?.stripe;
        ps.iter().all(|p| p.stripe == s).then_some((s, ps))
    }

    pub(super) fn parity_write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let pieces = self.pieces(offset, data.len() as u64);
        let nd = self.geo.data_chunks();
        let batch = self
            .engine
            .preferred_batch(self.geo.stripe_data_bytes())
            .min(FULL_STRIPE_BATCH);
        let mut start = 0;
        while start < pieces.len() {
            let whole = self.whole_stripes(&pieces[start..], batch);
            if whole >= 2 && self.write_full_stripes(&pieces[start..start + whole * nd], data)? {
                start += whole * nd;
                continue;
            }
            let s = pieces[start].stripe;
            let end = start + pieces[start..].iter().take_while(|p| p.stripe == s).count();
            let _held = self.locks.lock([s]);
            self.write_stripe(s, &pieces[start..end], data)?;
            start = end;
        }
        Ok(())
    }

    /// How many whole stripes (every data chunk, entire) `ps` starts with,
    /// up to `most`.
    fn whole_stripes(&self, ps: &[Piece], most: usize) -> usize {
        let nd = self.geo.data_chunks();
        ps.chunks_exact(nd)
            .take(most)
            .take_while(|st| {
                st.iter().enumerate().all(|(i, p)| {
                    p.idx == i
                        && p.within == 0
                        && p.len == self.geo.chunk
                        && p.stripe == st[0].stripe
                })
            })
            .count()
    }

    /// Full-stripe writes of consecutive stripes: nothing to read, and the
    /// parity of all of them in one batched engine call (where a GPU
    /// engine pays off), then every chunk in one submission. Returns
    /// `Ok(false)`, having written nothing, when some member of these
    /// stripes is not readable, now or after a crash
    /// (`readable_after_a_crash`): the per-stripe path journals those
    /// writes.
    fn write_full_stripes(&self, ps: &[Piece], data: &[u8]) -> Result<bool> {
        let nd = self.geo.data_chunks();
        let np = self.geo.level.parity_chunks();
        let chunk = self.geo.chunk as usize;
        let stripes: Vec<u64> = ps.chunks(nd).map(|st| st[0].stripe).collect();
        let _held = self.locks.lock(stripes.iter().copied());
        // Before counting in: it takes the journal's lock, which a thread
        // failing a member may hold while it waits for those counted in.
        // (Under the stripe locks no record of these stripes can appear.)
        let pending = stripes.iter().any(|&s| self.journal_pending(s));
        // The space of every write, before counting in too (a full
        // filesystem is recorded under the metadata lock, which a thread
        // failing a member may hold while it waits for those counted in).
        let chunk_len = self.geo.chunk;
        self.reserve_writes(
            &self.member_handles(),
            stripes.iter().flat_map(|&s| {
                let at = self.row_offset(s, 0);
                self.geo
                    .stripe_map(s)
                    .members
                    .into_iter()
                    .map(move |m| (m, at, chunk_len))
            }),
        )?;
        // Counted in before the readability check (see unjournaled.rs).
        let in_flight = self.unjournaled.enter();
        let all_readable = stripes.iter().all(|&s| {
            self.geo
                .stripe_map(s)
                .members
                .iter()
                .all(|&m| self.readable_after_a_crash(m, s))
        });
        // A stripe with an unsettled journal record is written through the
        // journal as well (see journal.rs): the per-stripe path does that.
        if !all_readable || pending {
            return Ok(false);
        }
        // Written whole by the engine before any is read.
        let mut parity: Vec<AlignedBuf> = (0..stripes.len() * np)
            .map(|_| AlignedBuf::for_overwrite(chunk))
            .collect();
        {
            let mut jobs: Vec<GenJob> = parity
                .chunks_mut(np)
                .zip(ps.chunks(nd))
                .map(|(par, st)| GenJob {
                    data: st.iter().map(|p| &data[p.pos..p.pos + chunk]).collect(),
                    parity: par.iter_mut().map(|b| &mut b[..]).collect(),
                })
                .collect();
            self.engine.gen_batch(self.kind(), &mut jobs)?;
        }
        let mut ios: Vec<MemberIo> = Vec::with_capacity(stripes.len() * (nd + np));
        for (k, (st, &s)) in ps.chunks(nd).zip(&stripes).enumerate() {
            let map = self.geo.stripe_map(s);
            let offset = self.row_offset(s, 0);
            let chunks = st
                .iter()
                .map(|p| (p.idx, &data[p.pos..p.pos + chunk]))
                .chain((0..np).map(|j| (nd + j, &parity[k * np + j][..])));
            ios.extend(chunks.map(|(i, b)| MemberIo {
                member: map.members[i],
                offset,
                op: IoOp::Write(b),
            }));
        }
        let handles = self.member_handles();
        let results = submit(&handles, &mut ios);
        // Out before member errors are handled: failing a member waits for
        // the writers counted in.
        drop(in_flight);
        let mut full = false;
        for (io, r) in ios.iter().zip(results) {
            if let Err(e) = r {
                full |= self.member_write_failed(io.member, &handles[io.member], &e);
            }
        }
        if !self.within_redundancy() {
            return Err(self.failed_error());
        }
        if let Some(e) = self.no_space_error().filter(|_| full) {
            return Err(e);
        }
        Ok(true)
    }

    fn write_stripe(&self, s: u64, ps: &[Piece], data: &[u8]) -> Result<()> {
        let nd = self.geo.data_chunks();
        let np = self.geo.level.parity_chunks();
        let (lo, hi) = columns(ps);
        loop {
            let map = self.geo.stripe_map(s);
            let missing = (0..nd + np)
                .filter(|&i| !self.readable(map.members[i], s))
                .count();
            if missing > np {
                return Err(self.failed_error());
            }
            let readable = |i: usize| self.readable(map.members[i], s);
            let kept = |i: usize| self.readable_after_a_crash(map.members[i], s);
            // (The journal's lock is taken before any writer's count, as
            // in `write_chunks`; under the stripe's lock no record of it
            // appears meanwhile.)
            let step = if self.data_alone(readable, kept) && !self.journal_pending(s) {
                self.write_data_alone(s, ps, data)
            } else if self.journal_parity_unflushed(s) {
                // A parity-only record of the stripe may not be durable in
                // place yet: the chunks that exist only as parity are
                // recovered, and this write's record is parity-only too,
                // rather than one of every column, which would wait for a
                // flush of every member (`journal_parity_barrier`): on a
                // sequential stream, a flush per stripe.
                self.reconstruct_write(s, ps, data, lo, hi)
            } else if self.rmw_reads_fewer(s, ps, readable) {
                self.read_modify_write(s, ps, data, lo, hi)
            } else {
                self.reconstruct_write(s, ps, data, lo, hi)
            };
            match step {
                Ok(()) => return Ok(()),
                Err(StepErr::Retry) => continue,
                Err(StepErr::Fatal(e)) => return Err(e),
            }
        }
    }

    /// Writes the pieces of stripe `s` alone, one member write each, with
    /// nothing read and no parity (`data_alone`). Not counted among the
    /// writes without a journal record (`unjournaled.rs`): a failure
    /// waits for those because a torn stripe it makes degraded could not
    /// be repaired, and this stripe has no parity to tear; a data member
    /// failing takes it past its redundancy.
    fn write_data_alone(
        &self,
        s: u64,
        ps: &[Piece],
        data: &[u8],
    ) -> std::result::Result<(), StepErr> {
        let map = self.geo.stripe_map(s);
        let pieces: Vec<(usize, u64, &[u8])> = ps
            .iter()
            .map(|p| (p.idx, p.within, &data[p.pos..p.pos + p.len as usize]))
            .collect();
        // The space of every write first: a full filesystem refuses the
        // write with nothing of it written.
        let writes = pieces
            .iter()
            .map(|&(i, within, b)| (map.members[i], self.row_offset(s, within), b.len() as u64));
        self.reserve_writes(&self.member_handles(), writes)
            .map_err(StepErr::Fatal)?;
        self.write_in_place(s, &pieces, None)
    }

    /// Reads the chunks at `idxs` of stripe `s`, columns [lo, hi). A read
    /// error fails the member and asks for a retry.
    fn read_chunks(
        &self,
        s: u64,
        idxs: &[usize],
        lo: u64,
        hi: u64,
    ) -> std::result::Result<Vec<AlignedBuf>, StepErr> {
        let map = self.geo.stripe_map(s);
        let places: Vec<(usize, u64)> = idxs
            .iter()
            .map(|&i| (map.members[i], self.row_offset(s, lo)))
            .collect();
        self.read_places(&places, (hi - lo) as usize)
            .map_err(|failed| {
                self.fail_slots(failed, "read error");
                StepErr::Retry
            })
    }

    /// Writes chunk buffers (by stripe index) to the members that are
    /// readable; failures fail the member. Ok while the stripe stays within
    /// its redundancy. `carried`: columns of chunks the write leaves as
    /// they are but knows, which a parity-only journal record may hold
    /// (`Array::parity_record`); not written.
    fn write_chunks<'a>(
        &self,
        s: u64,
        chunks: &[(usize, &'a [u8])],
        carried: &[(usize, &'a [u8])],
        lo: u64,
    ) -> std::result::Result<(), StepErr> {
        let map = self.geo.stripe_map(s);
        // Before counting in (see write_full_stripes); the caller holds the
        // stripe's lock, so no record of it can appear meanwhile.
        let pending = self.journal_pending(s);
        // The space of every write first, before the journal record and
        // before counting in (see write_full_stripes): a full filesystem
        // refuses the write with nothing of it written anywhere. (Under
        // the stripe's lock no member of it turns readable meanwhile.)
        let at = self.row_offset(s, lo);
        let writes = chunks
            .iter()
            .filter(|(i, _)| self.readable(map.members[*i], s))
            .map(|&(i, b)| (map.members[i], at, b.len() as u64));
        self.reserve_writes(&self.member_handles(), writes)
            .map_err(StepErr::Fatal)?;
        // Counted in before the readability checks (see unjournaled.rs).
        let in_flight = self.unjournaled.enter();
        let present: Vec<(usize, &[u8])> = chunks
            .iter()
            .copied()
            .filter(|(i, _)| self.readable(map.members[*i], s))
            .collect();
        let degraded = map
            .members
            .iter()
            .any(|&m| !self.readable_after_a_crash(m, s));
        if (degraded || pending) && self.has_journal() && !present.is_empty() {
            // Only where it is the smaller record (a block of the missing
            // chunk alone is one column either way, and a stripe with a
            // parity-only record not yet durable in place sends its writes
            // to the blocking path), or the stripe has such a record
            // already (where a record of every column would wait for a
            // flush: `journal_parity_barrier`).
            let known = |i: usize| chunks.iter().chain(carried).find(|c| c.0 == i).map(|c| c.1);
            let parity_only = self
                .parity_record(s, known)
                .filter(|lost| lost.len() < present.len() || self.journal_parity_unflushed(s));
            // Journaled: nothing to wait for (and its member errors are
            // handled inside).
            drop(in_flight);
            // The write hole: journal each column slice before writing it in
            // place (see journal.rs): the columns of the chunks that exist
            // only as parity where that is enough, else every column.
            let lost = parity_only.filter(|_| self.journal_parity_allowed(s));
            let (kind, recorded) = match &lost {
                Some(lost) => (Kind::Parity, &lost[..]),
                None => {
                    self.journal_parity_barrier(s)?;
                    (Kind::Columns, &present[..])
                }
            };
            let width = present[0].1.len() as u64;
            let step = self.journal_slice(recorded.len()).min(width);
            let mut at = 0;
            while at < width {
                let end = (at + step).min(width);
                let slice_of = |cols: &[(usize, &'a [u8])]| -> Vec<(usize, &'a [u8])> {
                    cols.iter()
                        .map(|&(i, b)| (i, &b[at as usize..end as usize]))
                        .collect()
                };
                let slice = slice_of(&present);
                // A record of every column holds the slice written.
                let parity_cols = (kind == Kind::Parity).then(|| slice_of(recorded));
                let seq = self.journal_record(
                    kind,
                    s,
                    lo + at,
                    parity_cols.as_deref().unwrap_or(&slice),
                )?;
                let cols: Vec<(usize, u64, &[u8])> =
                    slice.iter().map(|&(i, b)| (i, lo + at, b)).collect();
                let written = self.write_in_place(s, &cols, None);
                self.journal_write_done(seq);
                written?;
                at = end;
            }
            return Ok(());
        }
        let cols: Vec<(usize, u64, &[u8])> = present.iter().map(|&(i, b)| (i, lo, b)).collect();
        self.write_in_place(s, &cols, Some(in_flight))
    }

    /// Writes to stripe `s`'s members each chunk index's bytes at its
    /// column, `(index, column, bytes)`; failures fail the member. Ok
    /// while the stripe stays within its redundancy.
    /// `in_flight`: the writer's count (see unjournaled.rs), given up once
    /// the writes are done and before their errors fail members.
    fn write_in_place(
        &self,
        s: u64,
        chunks: &[(usize, u64, &[u8])],
        in_flight: Option<super::unjournaled::InFlight<'_>>,
    ) -> std::result::Result<(), StepErr> {
        let map = self.geo.stripe_map(s);
        let handles = self.member_handles();
        let mut ios: Vec<MemberIo> = chunks
            .iter()
            .filter(|(i, _, _)| self.readable(map.members[*i], s))
            .map(|&(i, within, b)| MemberIo {
                member: map.members[i],
                offset: self.row_offset(s, within),
                op: IoOp::Write(b),
            })
            .collect();
        let results = submit(&handles, &mut ios);
        drop(in_flight);
        let mut full = false;
        for (io, r) in ios.iter().zip(results) {
            if let Err(e) = r {
                full |= self.member_write_failed(io.member, &handles[io.member], &e);
            }
        }
        if let Some(e) = self.no_space_error().filter(|_| full) {
            // Not every chunk of this stripe was written: its bitmap region
            // stays dirty (no clearing while out of space), and the next
            // start resyncs it; a degraded stripe has its journal record,
            // or no parity to disagree (`data_alone`).
            return Err(StepErr::Fatal(e));
        }
        let missing = map
            .members
            .iter()
            .filter(|&&m| !self.readable(m, s))
            .count();
        if missing > self.geo.level.parity_chunks() {
            return Err(StepErr::Fatal(self.failed_error()));
        }
        Ok(())
    }

    /// Old data and parity in, new parity = old parity + the change.
    fn read_modify_write(
        &self,
        s: u64,
        ps: &[Piece],
        data: &[u8],
        lo: u64,
        hi: u64,
    ) -> std::result::Result<(), StepErr> {
        let nd = self.geo.data_chunks();
        let np = self.geo.level.parity_chunks();
        let mut idxs: Vec<usize> = ps.iter().map(|p| p.idx).collect();
        idxs.extend(nd..nd + np);
        let mut old = self.read_chunks(s, &idxs, lo, hi)?;
        self.rmw_apply(ps, data, lo, hi, &mut old)?;
        // old: deltas, new parity, then the merged data columns.
        let (read, merged) = old.split_at(idxs.len());
        let mut merged = merged.iter();
        let mut writes: Vec<(usize, &[u8])> = ps
            .iter()
            .map(|p| match covers(p, lo, hi) {
                true => (p.idx, &data[p.pos..p.pos + p.len as usize]),
                false => (p.idx, &merged.next().expect("merged")[..]),
            })
            .collect();
        writes.extend(
            read[ps.len()..]
                .iter()
                .enumerate()
                .map(|(k, b)| (nd + k, &b[..])),
        );
        self.write_chunks(s, &writes, &[], lo)
    }

    /// Read-modify-write's arithmetic. `old` holds the old columns [lo, hi)
    /// of each piece's chunk, in the pieces' order, then the old parity.
    /// A piece that `covers` its columns is written from the request's own
    /// bytes; for each other one, in the pieces' order, its new column (the
    /// old with the request laid over it) is pushed after those. `old`'s
    /// parity becomes the new parity (old + the change: P ^= delta, Q ^=
    /// g^i * delta, one pass per changed chunk), and its data columns the
    /// deltas.
    pub(super) fn rmw_apply(
        &self,
        ps: &[Piece],
        data: &[u8],
        lo: u64,
        hi: u64,
        old: &mut Vec<AlignedBuf>,
    ) -> Result<()> {
        let first_new = old.len();
        for (k, p) in ps.iter().enumerate() {
            if !covers(p, lo, hi) {
                let merged = old[k].clone();
                old.push(merged);
            }
        }
        let (read, merged) = old.split_at_mut(first_new);
        let (old_data, old_parity) = read.split_at_mut(ps.len());
        let mut merged = merged.iter_mut();
        for (p, o) in ps.iter().zip(old_data.iter_mut()) {
            let bytes = &data[p.pos..p.pos + p.len as usize];
            if covers(p, lo, hi) {
                xor_into(o, bytes);
                continue;
            }
            let nb = merged.next().expect("one per piece not covered");
            let at = (p.within - lo) as usize;
            nb[at..at + bytes.len()].copy_from_slice(bytes);
            xor_into(o, nb);
        }
        // Inline, not on the heap: one stripe's chunks at most.
        let deltas: PerMember<(usize, &[u8])> = ps
            .iter()
            .zip(old_data.iter())
            .map(|(p, d)| (p.idx, &d[..]))
            .collect();
        let mut parity: PerMember<&mut [u8]> = old_parity.iter_mut().map(|b| &mut b[..]).collect();
        self.engine
            .update_parity(self.kind(), &deltas, &mut parity)
            .map_err(ArrayError::from)
    }

    /// Reconstruct-write's arithmetic: `cols[i]` holds data chunk `i`'s old
    /// columns [lo, hi) for every chunk the request does not cover entirely
    /// (None for those it does); the request is laid over them here, and
    /// the parity of the new columns returned.
    pub(super) fn rcw_apply(
        &self,
        ps: &[Piece],
        data: &[u8],
        lo: u64,
        hi: u64,
        cols: &mut [Option<AlignedBuf>],
    ) -> Result<Vec<AlignedBuf>> {
        for p in ps {
            if let Some(b) = cols[p.idx].as_mut() {
                let at = (p.within - lo) as usize;
                b[at..at + p.len as usize].copy_from_slice(&data[p.pos..p.pos + p.len as usize]);
            }
        }
        let srcs: Vec<&[u8]> = (0..cols.len())
            .map(|i| new_column(ps, data, lo, hi, cols, i))
            .collect();
        self.parity_of(&srcs)
    }

    /// The parity chunks (P, or P and Q) of the data columns `srcs`, all
    /// of one width.
    pub(super) fn parity_of(&self, srcs: &[&[u8]]) -> Result<Vec<AlignedBuf>> {
        let width = srcs.first().map_or(0, |c| c.len());
        // Written whole by the engine before any is read.
        let mut parity: Vec<AlignedBuf> = (0..self.geo.level.parity_chunks())
            .map(|_| AlignedBuf::for_overwrite(width))
            .collect();
        match &mut parity[..] {
            [p] => self.engine.gen_p(srcs, p),
            [p, q] => self.engine.gen_pq(srcs, p, q),
            _ => unreachable!("RAID5 or RAID6"),
        }
        .map_err(ArrayError::from)?;
        Ok(parity)
    }

    /// Every data chunk's new columns in hand (read, recovered or written),
    /// parity computed from scratch. Also the degraded path.
    fn reconstruct_write(
        &self,
        s: u64,
        ps: &[Piece],
        data: &[u8],
        lo: u64,
        hi: u64,
    ) -> std::result::Result<(), StepErr> {
        let nd = self.geo.data_chunks();
        let map = self.geo.stripe_map(s);
        // Chunks the request covers entirely are used straight from the
        // caller's buffer; the rest are read (or recovered) and merged.
        let need: Vec<usize> = (0..nd)
            .filter(|&i| full_piece(ps, i, lo, hi).is_none())
            .collect();
        let mut cols: Vec<Option<AlignedBuf>> = (0..nd).map(|_| None).collect();
        if need.iter().any(|&i| !self.readable(map.members[i], s)) {
            for (i, b) in self
                .stripe_columns(s, lo, hi)?
                .into_iter()
                .enumerate()
                .take(nd)
            {
                if full_piece(ps, i, lo, hi).is_none() {
                    cols[i] = Some(b);
                }
            }
        } else {
            for (i, b) in need.iter().zip(self.read_chunks(s, &need, lo, hi)?) {
                cols[*i] = Some(b);
            }
        }
        let parity = self.rcw_apply(ps, data, lo, hi, &mut cols)?;
        let mut writes: Vec<(usize, &[u8])> = ps
            .iter()
            .map(|p| (p.idx, new_column(ps, data, lo, hi, &cols, p.idx)))
            .collect();
        writes.extend(parity.iter().enumerate().map(|(k, b)| (nd + k, &b[..])));
        // The chunks that would exist only as parity after a crash, as
        // they stand, where the request does not cover them: not written,
        // but what a parity-only journal record holds
        // (`Array::parity_record`).
        let carried: Vec<(usize, &[u8])> = (0..nd)
            .filter(|&i| {
                !ps.iter().any(|p| p.idx == i) && !self.readable_after_a_crash(map.members[i], s)
            })
            .filter_map(|i| cols[i].as_deref().map(|b| (i, b)))
            .collect();
        self.write_chunks(s, &writes, &carried, lo)
    }

    pub(super) fn parity_zero(&self, offset: u64, len: u64) -> Result<()> {
        if self.state() != ArrayState::Optimal || self.journal_any_pending() {
            // Zeroing members directly could tear a stripe with no journal
            // record to repair it, or be undone by replaying an older one:
            // zero through the write path, which journals where needed.
            return self.zero_by_writing(offset, len);
        }
        let sdb = self.geo.stripe_data_bytes();
        let first_full = offset.div_ceil(sdb);
        let end_full = (offset + len) / sdb;
        if first_full >= end_full {
            return self.zero_by_writing(offset, len);
        }
        self.zero_by_writing(offset, first_full * sdb - offset)?;
        // Whole stripes: every chunk, parity included, becomes zero, which is
        // consistent parity. Groups of stripes under their locks.
        const GROUP: u64 = 256;
        let mut s = first_full;
        while s < end_full {
            let e = (s + GROUP).min(end_full);
            let held = self.locks.lock(s..e);
            let pending = (s..e).any(|x| self.journal_pending(x));
            // Zeroing in place carries no journal record: counted in like
            // any such write (see unjournaled.rs), before the state check.
            let in_flight = self.unjournaled.enter();
            // Checked again under the locks: a member may have failed (or a
            // degraded write journaled one of these stripes) since the check
            // above; then this group goes through the write path too.
            if self.state() != ArrayState::Optimal || pending {
                drop(in_flight);
                drop(held);
                self.zero_by_writing(s * sdb, (e - s) * sdb)?;
                s = e;
                continue;
            }
            let handles = self.member_handles();
            let mut errors = Vec::new();
            for (slot, m) in handles.iter().enumerate() {
                // Rows of this member that hold valid data.
                let ranges = match self.slots[slot].state() {
                    SlotState::Active => vec![(s, e)],
                    SlotState::Rebuilding => self.slots[slot].sync_ranges(self.geo.rows()),
                    SlotState::Failed => continue,
                };
                for (lo, hi) in ranges {
                    let (lo, hi) = (lo.max(s), hi.min(e));
                    if lo >= hi {
                        continue;
                    }
                    if let Err(err) =
                        m.write_zeroes(self.row_offset(lo, 0), (hi - lo) * self.geo.chunk)
                    {
                        errors.push((slot, err));
                        break;
                    }
                }
            }
            // Every member zeroed (or failed at it) before any failure is
            // handled: failing a member waits for those counted in.
            drop(in_flight);
            for (slot, err) in errors {
                self.member_write_failed(slot, &handles[slot], &err);
            }
            if !self.within_redundancy() {
                return Err(self.failed_error());
            }
            if let Some(e) = self.no_space_error() {
                return Err(e);
            }
            s = e;
        }
        self.zero_by_writing(end_full * sdb, offset + len - end_full * sdb)
    }

    /// Zeroes a range by writing zero blocks through the normal write path.
    pub(super) fn zero_by_writing(&self, offset: u64, len: u64) -> Result<()> {
        const STEP: u64 = 1 << 20;
        let zeros = AlignedBuf::new(STEP.min(len) as usize);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(STEP);
            self.write(offset + done, &zeros[..n as usize])?;
            done += n;
        }
        Ok(())
    }
}
