//! The journal at assembly: every record past the newest header, followed
//! from member to member (a record is on some members only:
//! `journal_copies`), replayed in sequence order; then a fresh ring.
//!
//! Two passes over the rings of the members in sync: the first indexes
//! every sealed record (sequence, place, length) without keeping its
//! bytes (a ring is up to 64 MiB per member); the chain is followed in
//! that index; the second reads back, from each member, the records of
//! the chain it holds.

use super::format::{decode_head, decode_record, legacy_records_owed, sealed_records};
use super::format::{encode_head, Kind, Record, BLOCK, RECORDS};
use super::{JState, Journal};
use crate::array::{Array, ArrayError, MemberRef, Result, SlotState};
use crate::buf::AlignedBuf;
use crate::member::{submit_uncounted, IoOp, MemberIo};
use crate::metadata::JOURNAL_OFFSET;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// Most bytes of rings a start reads at once (`journal_scan`): several
/// members' rings of 16 MiB, every member's of 1 MiB, one of 64 MiB.
const RINGS_READ_BYTES: usize = 64 << 20;

/// Every whole record of this array in the rings of the members in
/// sync, by sequence: where each copy lies (slot, member offset, length).
type Places = HashMap<u64, Vec<(usize, u64, usize)>>;

/// What the first pass found.
struct Scan {
    /// The newest header: its sequence, and the place of the record after.
    head: Option<(u64, u64)>,
    /// The highest sequence any member's ring holds, chained or not.
    seen: u64,
    places: Places,
    /// Members whose journal area could not be read.
    unread: Vec<(usize, std::io::Error)>,
}

impl Array {
    /// At assembly: replays every record past the header's sequence, in
    /// order, onto the members present, then starts a fresh journal.
    /// Returns the number of records replayed.
    pub(in crate::array) fn journal_recover(&self) -> Result<usize> {
        let Some(j) = &self.journal else { return Ok(0) };
        let handles = self.member_handles();
        let mut area = AlignedBuf::new((j.area_end - JOURNAL_OFFSET) as usize);
        let Scan {
            head,
            mut seen,
            places,
            unread,
        } = self.journal_scan(j, &handles, &mut area)?;
        let (after, at) = head.unwrap_or((0, RECORDS));
        self.journal_unread(j, unread, &mut seen, after);
        let chain = chain_of(&places, after, at);
        let records = self.read_chain(&handles, &places, chain, after, &mut area);
        for r in &records {
            match r.kind {
                Kind::Columns => {
                    let cols: Vec<(usize, &[u8])> = r
                        .entries
                        .iter()
                        .map(|(_, slot, d)| (*slot, &d[..]))
                        .collect();
                    self.replay_write(&handles, r, &cols);
                }
                Kind::Parity => self.replay_parity(&handles, r),
            }
        }
        if !records.is_empty() {
            self.flush_members()?;
        }
        let last = records.last().map_or(after, |r| r.seq).max(after).max(seen);
        j.any_unsettled.store(false, Ordering::Release);
        *j.state.lock() = JState::fresh(last, j.area_end);
        j.parity_unflushed.lock().clear();
        self.write_journal_block(&encode_head(last, RECORDS, &self.uuid), JOURNAL_OFFSET)?;
        Ok(records.len())
    }

    /// Writes `cols` (slot, columns [lo, hi) of record `r`'s stripe) to
    /// the slots that are readable there; a write that fails fails its
    /// member.
    fn replay_write(&self, handles: &[MemberRef], r: &Record, cols: &[(usize, &[u8])]) {
        let off = self.row_offset(r.stripe, r.lo);
        for &(slot, data) in cols {
            if slot < handles.len() && self.readable(slot, r.stripe) {
                if let Err(e) = handles[slot].write_at(data, off) {
                    self.fail_slot(slot, &format!("journal replay failed: {e}"));
                }
            }
        }
    }

    /// Puts a `Kind::Parity` record in place: the stripe's other data
    /// columns read from their members as they lie (each old or new where
    /// the write tore), the parity computed from them and the record's
    /// columns, and both written. The stripe then agrees with itself, and
    /// its chunks that exist only as parity read back as the record says.
    /// Such a record is made only where the array can lose no more
    /// (`Array::parity_record`): a data member missing here too leaves
    /// the array past its redundancy, and the record is not put in place.
    fn replay_parity(&self, handles: &[MemberRef], r: &Record) {
        let nd = self.geo.data_chunks();
        let map = self.geo.stripe_map(r.stripe);
        let recorded = |i: usize| r.entries.iter().find(|e| e.0 == i).map(|e| &e.2[..]);
        let others: Vec<usize> = (0..nd).filter(|&i| recorded(i).is_none()).collect();
        if others
            .iter()
            .any(|&i| !self.readable(map.members[i], r.stripe))
        {
            // Only where the array is past its redundancy (a forced
            // start): the stripe's chunks that exist only as parity may
            // read back wrong.
            tracing::error!(array = %self.name, seq = r.seq, stripe = r.stripe,
                "a degraded write's journal record could not be put in place: another data chunk of its stripe is missing too, so the stripe may read back wrong; scrub it once the array is whole");
            return;
        }
        let places: Vec<(usize, u64)> = others
            .iter()
            .map(|&i| (map.members[i], self.row_offset(r.stripe, r.lo)))
            .collect();
        let read = match self.read_places(&places, (r.hi - r.lo) as usize) {
            Ok(read) => read,
            Err(failed) => {
                self.fail_slots(failed, "journal replay could not read it");
                return;
            }
        };
        let mut read = read.iter();
        let srcs: Vec<&[u8]> = (0..nd)
            .map(|i| recorded(i).unwrap_or_else(|| &read.next().expect("one per other")[..]))
            .collect();
        let parity = match self.parity_of(&srcs) {
            Ok(parity) => parity,
            Err(e) => {
                tracing::error!(array = %self.name, seq = r.seq, stripe = r.stripe,
                    "a journal record could not be put in place: its parity could not be computed: {e}");
                return;
            }
        };
        let cols: Vec<(usize, &[u8])> = r
            .entries
            .iter()
            .map(|(_, slot, d)| (*slot, &d[..]))
            .chain(
                parity
                    .iter()
                    .enumerate()
                    .map(|(k, b)| (map.members[nd + k], &b[..])),
            )
            .collect();
        self.replay_write(handles, r, &cols);
    }

    /// The first pass: each present member's ring read whole, into `area`
    /// and, for the rings read with it, buffers of their own.
    fn journal_scan(
        &self,
        j: &Journal,
        handles: &[MemberRef],
        area: &mut AlignedBuf,
    ) -> Result<Scan> {
        let mut scan = Scan {
            head: None,
            seen: 0,
            places: HashMap::new(),
            unread: Vec::new(),
        };
        // Several members' rings read together, in one submission: one
        // after another, a start waited for each ring in turn (190 ms of
        // a start on eight simulated drives with 16 MiB rings). At most
        // `RINGS_READ_BYTES` of buffers at once, `area` among them.
        let wanted: Vec<usize> = (0..handles.len())
            .filter(|&i| self.slots[i].state() != SlotState::Failed)
            .collect();
        let at_once = (RINGS_READ_BYTES / area.len().max(1)).clamp(1, wanted.len().max(1));
        let mut more: Vec<AlignedBuf> = (1..at_once).map(|_| AlignedBuf::new(area.len())).collect();
        for group in wanted.chunks(at_once) {
            let results = {
                let bufs = std::iter::once(&mut *area).chain(more.iter_mut());
                let mut ios: Vec<MemberIo> = group
                    .iter()
                    .zip(bufs)
                    .map(|(&i, b)| MemberIo {
                        member: i,
                        offset: JOURNAL_OFFSET,
                        op: IoOp::Read(&mut b[..]),
                    })
                    .collect();
                submit_uncounted(handles, &mut ios)
            };
            for (k, (&i, read)) in group.iter().zip(results).enumerate() {
                if let Err(e) = read {
                    scan.unread.push((i, e));
                    continue;
                }
                let ring: &AlignedBuf = match k {
                    0 => area,
                    _ => &more[k - 1],
                };
                self.scan_ring(j, (i, &handles[i]), ring, &mut scan)?;
            }
        }
        Ok(scan)
    }

    /// Indexes the ring of slot `i` (member `m`), read into `ring`.
    fn scan_ring(
        &self,
        j: &Journal,
        (i, m): (usize, &MemberRef),
        ring: &AlignedBuf,
        scan: &mut Scan,
    ) -> Result<()> {
        // The next sequence goes past every record of this array any
        // member's ring holds, chained or not: a group's records reach
        // the members in any order, so a crash can leave one durable
        // past a gap (and a member out of sync may hold one), and a
        // sequence number reused after this start would chain on to it.
        let found: Vec<(u64, usize, usize)> =
            sealed_records(&ring[BLOCK as usize..], &self.uuid).collect();
        scan.seen = scan
            .seen
            .max(found.iter().map(|&(seq, ..)| seq).max().unwrap_or(0));
        // Replayed from members in sync only: one that joined
        // (rebuilding, re-added) got every record written since from
        // the others too, and what its own ring holds from before may
        // be records never put in place.
        if self.slots[i].state() != SlotState::Active {
            return Ok(());
        }
        if let Some(n) = legacy_records_owed(ring) {
            return Err(ArrayError::Assembly(format!(
                "array '{}': {} holds {n} degraded-write journal record(s) written by an earlier version of raidctl and not yet in place; start the array once with that version and stop it cleanly (raidctl stop), then start it with this one",
                self.name,
                m.identity()
            )));
        }
        let h = decode_head(&ring[..BLOCK as usize], &self.uuid, j.area_end);
        scan.head = scan.head.max(h);
        for (seq, at, len) in found {
            let place = RECORDS + at as u64;
            scan.places.entry(seq).or_default().push((i, place, len));
        }
        Ok(())
    }

    /// Members whose journal area could not be read at the start. Their
    /// sequences cannot count in `seen`, so it goes past every sequence
    /// the ring could have held since the newest header (`tail`): none is
    /// used again. A member in sync among them may hold the only copy of
    /// a record owed (a record is kept on as few members as the array
    /// can lose, plus one): where any can be owed (the last stop was not
    /// clean, and the array is degraded, so writes were journaled) it is
    /// failed, rather than the stripes its records would repair being
    /// served torn. Elsewhere nothing is owed: failing it would only take
    /// redundancy, and, before the resync of an unclean stop, the parity
    /// that resync repairs torn stripes from. Said either way.
    fn journal_unread(
        &self,
        j: &Journal,
        unread: Vec<(usize, std::io::Error)>,
        seen: &mut u64,
        tail: u64,
    ) {
        if unread.is_empty() {
            return;
        }
        *seen = (*seen).max(tail + (j.area_end - RECORDS) / BLOCK);
        let owed = !self.meta.lock().clean && !self.every_slot_in_sync();
        for (i, e) in unread {
            if self.slots[i].state() != SlotState::Active {
                continue;
            }
            if owed {
                self.fail_slot(i, &format!("its journal could not be read at the start, and it may hold the only copy of a degraded write's record: {e}"));
            } else {
                tracing::warn!(array = %self.name, slot = i, "its journal could not be read at the start ({e}); nothing was owed there (the last stop was clean, or every member was in sync)");
            }
        }
    }

    /// The second pass: the chain's records read back, each member's
    /// area once, from the members in sync holding them (one that cannot
    /// be read now is failed, and another's copy taken); in order, up to
    /// the first that could not be read back or does not fit the layout.
    fn read_chain(
        &self,
        handles: &[MemberRef],
        places: &Places,
        mut chain: Vec<(u64, u64)>,
        after: u64,
        area: &mut AlignedBuf,
    ) -> Vec<Record> {
        let holds = |slot: usize, (seq, place): (u64, u64)| {
            places[&seq]
                .iter()
                .any(|&(s, p, _)| s == slot && p == place)
        };
        let mut records: Vec<Record> = Vec::new();
        for (i, m) in handles.iter().enumerate() {
            let mine: Vec<(u64, u64)> = chain.iter().copied().filter(|&c| holds(i, c)).collect();
            if mine.is_empty() || self.slots[i].state() != SlotState::Active {
                continue;
            }
            if let Err(e) = m.read_at(area, JOURNAL_OFFSET) {
                self.fail_slot(
                    i,
                    &format!("its journal could not be read at the start: {e}"),
                );
                continue;
            }
            for (seq, place) in mine {
                let at = (place - JOURNAL_OFFSET) as usize;
                let rec = decode_record(&area[at..], &self.uuid).filter(|(r, _)| r.seq == seq);
                if let Some((rec, _)) = rec {
                    chain.retain(|c| c.0 != seq);
                    records.push(rec);
                }
            }
        }
        records.sort_by_key(|r| r.seq);
        let mut kept = 0;
        for (r, want) in records.iter().zip(after + 1..) {
            if r.seq != want {
                tracing::warn!(array = %self.name, seq = want,
                    "a journal record could not be read back; it and those after it are not replayed");
                break;
            }
            if !self.record_fits(r) {
                tracing::warn!(array = %self.name, seq = r.seq, stripe = r.stripe,
                    "a journal record does not fit this array's layout; it and those after it are not replayed");
                break;
            }
            kept += 1;
        }
        records.truncate(kept);
        records
    }
}

/// The chain in `places`: from sequence `after` + 1 at `at` on, one after
/// another, each where the last one ended or (where it did not fit before
/// the area's end) at the area's start, on whichever member holds it;
/// the first break ends it. Each link: its sequence and place.
fn chain_of(places: &Places, after: u64, mut at: u64) -> Vec<(u64, u64)> {
    let mut chain = Vec::new();
    for want in after + 1.. {
        let found = places.get(&want).and_then(|p| {
            let on = |place: u64| p.iter().find(|&&(_, a, _)| a == place).copied();
            on(at).or_else(|| on(RECORDS))
        });
        let Some((_, place, len)) = found else { break };
        at = place + len as u64;
        chain.push((want, place));
    }
    chain
}
