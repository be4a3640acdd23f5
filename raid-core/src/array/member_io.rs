//! How the array reaches its members outside the level paths: reads of
//! planned places (handles first, readability after), the handling of a
//! member's write error (a full filesystem stops writes, anything else
//! fails the member), the member table the data path reads, and the pacing
//! of background work.

use super::local::TableCopy;
use super::*;
use crate::stats::Started;

/// Paces background work (rebuild, scrub, hot replace) after a step that
/// moved `bytes` and began at `began`: sleeps what the rate asks. The live
/// rate (bytes per second, 0: none) is read at every step, so the operator
/// can change it while the work runs; when present it replaces the fixed
/// one (its 0 lifts the limit). The sleep is cut into short slices that
/// ask `interrupted` and read the live rate again: a step of a large batch
/// at a low rate may ask for many seconds, and neither a stop (which a
/// closing array waits for), nor what ends the work early (a hot replace's
/// source failing), nor a rate raised meanwhile should wait them out.
pub(super) fn pace(
    fixed: Option<u64>,
    live: &Option<Arc<AtomicU64>>,
    bytes: u64,
    began: std::time::Instant,
    interrupted: &dyn Fn() -> bool,
) {
    const SLICE: std::time::Duration = std::time::Duration::from_millis(50);
    loop {
        let limit = match live {
            Some(l) => Some(l.load(Ordering::Acquire)).filter(|&l| l > 0),
            None => fixed,
        };
        let Some(limit) = limit else { return };
        let want = std::time::Duration::from_secs_f64(bytes as f64 / limit as f64);
        let Some(wait) = want.checked_sub(began.elapsed()).filter(|w| !w.is_zero()) else {
            return;
        };
        if interrupted() {
            return;
        }
        std::thread::sleep(wait.min(SLICE));
    }
}

/// Flushes the members of `slots` (counted in their statistics or not)
/// and returns those that failed. Flushes that wait
/// (`Member::flush_waits`: a drive's cache draining, a remote server's
/// answer) run together: started together where the member can
/// (`Member::begin_flush`: a simulated drive), each on a thread of its own
/// otherwise; the others (memory) on the caller's thread, where a thread
/// each would cost more than the flush.
pub(super) fn flush_each(
    handles: &[MemberRef],
    slots: &[usize],
    counted: bool,
) -> Vec<(usize, io::Error)> {
    let flush = |m: &dyn Member| match counted {
        true => crate::member::flush_counted(m),
        false => m.flush(),
    };
    let (devices, others): (Vec<usize>, Vec<usize>) =
        slots.iter().partition(|&&i| handles[i].flush_waits());
    let mut failed: Vec<(usize, io::Error)> = others
        .iter()
        .filter_map(|&i| flush(handles[i].as_ref()).err().map(|e| (i, e)))
        .collect();
    let began = Started::now();
    let mut started = Vec::new();
    let mut threaded = Vec::new();
    for i in devices {
        match handles[i].begin_flush() {
            Some(wait) => started.push((i, wait)),
            None => threaded.push(i),
        }
    }
    let wait_started = |failed: &mut Vec<(usize, io::Error)>| {
        for (i, wait) in started {
            let r = wait();
            if let Some(s) = handles[i].io_stats().filter(|_| counted) {
                s.flush.record(0, began.took(), r.is_ok());
            }
            failed.extend(r.err().map(|e| (i, e)));
        }
    };
    match &threaded[..] {
        [] => wait_started(&mut failed),
        &[i] => {
            failed.extend(flush(handles[i].as_ref()).err().map(|e| (i, e)));
            wait_started(&mut failed);
        }
        _ => std::thread::scope(|sc| {
            let running: Vec<_> = threaded
                .iter()
                .map(|&i| (i, sc.spawn(move || flush(handles[i].as_ref()))))
                .collect();
            wait_started(&mut failed);
            failed.extend(
                running
                    .into_iter()
                    .filter_map(|(i, h)| h.join().expect("flush thread").err().map(|e| (i, e))),
            );
        }),
    }
    failed
}

/// Why `read_places` read nothing.
pub(super) enum ReadFailure {
    /// Membership changed under the caller's plan: plan again.
    Changed,
    /// These slots' devices returned errors (slot, the device, the error).
    Failed(Vec<(usize, MemberRef, io::Error)>),
}

/// A write to one of a submission's extra devices (`read_places_writing`):
/// its index among them, the bytes, the member offset.
pub(super) type TargetWrite<'a> = (usize, &'a [u8], u64);

/// Stands in for a missing member in I/O batches: never called, because
/// I/O is only planned for readable slots.
pub(super) struct Absent;
impl Member for Absent {
    fn identity(&self) -> &str {
        "(missing)"
    }
    fn device_key(&self) -> crate::member::DeviceKey {
        // Never taken for a member: membership checks look at filled
        // slots only (and no disk is shared with RAM's key).
        crate::member::DeviceKey::Ram(0)
    }
    fn size(&self) -> u64 {
        0
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> io::Result<()> {
        Err(io::Error::other("member is missing"))
    }
    fn write_at(&self, _: &[u8], _: u64) -> io::Result<()> {
        Err(io::Error::other("member is missing"))
    }
    fn flush(&self) -> io::Result<()> {
        Err(io::Error::other("member is missing"))
    }
    fn write_zeroes(&self, _: u64, _: u64) -> io::Result<()> {
        Err(io::Error::other("member is missing"))
    }
}

impl Array {
    /// Writes `blocks` (member offset, bytes) to the members of slots `to`
    /// durably, in one submission: the journal's and the bitmap's writes,
    /// which must be durable before the writes they guard. A member that
    /// takes FUA (`Member::fua`) gets each write with it and no flush;
    /// the others are flushed, those whose writes succeeded, all together
    /// (`flush_each`). Returns the handles written through and each
    /// member that erred in either step (once), for the caller to fail as
    /// its rule says.
    pub(super) fn write_durably(
        &self,
        to: &[usize],
        blocks: &[(u64, &[u8])],
    ) -> (HandlesNow, Vec<(usize, io::Error)>) {
        let placed: Vec<(usize, u64, &[u8])> = to
            .iter()
            .flat_map(|&m| blocks.iter().map(move |&(at, b)| (m, at, b)))
            .collect();
        self.write_placed_durably(&placed)
    }

    /// Writes each of `placed` (slot, member offset, bytes) durably in one
    /// submission, as `write_durably` does: with FUA, or followed by a
    /// flush of every member written whose writes all succeeded. For
    /// blocks with members of their own (the journal's records, spread
    /// over the members). Returns as `write_durably` does.
    pub(super) fn write_placed_durably(
        &self,
        placed: &[(usize, u64, &[u8])],
    ) -> (HandlesNow, Vec<(usize, io::Error)>) {
        use crate::member::{submit_uncounted, IoOp, MemberIo};
        let handles = self.member_handles();
        let mut ios: Vec<MemberIo> = placed
            .iter()
            .map(|&(m, at, b)| MemberIo {
                member: m,
                offset: at,
                op: match handles[m].fua() {
                    true => IoOp::WriteFua(b),
                    false => IoOp::Write(b),
                },
            })
            .collect();
        let results = submit_uncounted(&handles, &mut ios);
        let mut failed: Vec<(usize, io::Error)> = Vec::new();
        for (io, r) in ios.iter().zip(results) {
            if let Err(e) = r {
                if !failed.iter().any(|(m, _)| *m == io.member) {
                    failed.push((io.member, e));
                }
            }
        }
        // Written without FUA: to flush.
        let mut written: Vec<usize> = ios
            .iter()
            .filter(|io| matches!(io.op, IoOp::Write(_)))
            .map(|io| io.member)
            .collect();
        written.sort_unstable();
        written.dedup();
        written.retain(|m| !failed.iter().any(|(f, _)| f == m));
        failed.extend(flush_each(&handles, &written, false));
        (handles, failed)
    }

    /// Fails each member that erred in `what` (an operation: "flush",
    /// "journal write"), then says whether the array is still within its
    /// redundancy.
    pub(super) fn fail_erred(
        &self,
        handles: &[MemberRef],
        erred: Vec<(usize, io::Error)>,
        what: &str,
    ) -> bool {
        for (i, e) in erred {
            self.fail_slot_if(i, &handles[i], &format!("{what} failed: {e}"));
        }
        self.within_redundancy()
    }

    /// Flushes every member not failed (`flush_slots`).
    pub(super) fn flush_present(&self, counted: bool) -> Result<()> {
        self.flush_slots(&self.present_slots(), counted)
    }

    /// Flushes the members of `slots` (`flush_each`: counted or not) and
    /// fails those that err: Err when the array is then beyond its
    /// redundancy.
    pub(super) fn flush_slots(&self, slots: &[usize], counted: bool) -> Result<()> {
        let handles = self.member_handles();
        let erred = flush_each(&handles, slots, counted);
        if !self.fail_erred(&handles, erred, "flush") {
            return Err(self.failed_error());
        }
        Ok(())
    }

    /// Reads `len` bytes at each `(slot, member offset)` of the data area
    /// into aligned buffers (`for_overwrite`: each read fills its buffer,
    /// or the call fails and none is handed out), all in one submission.
    ///
    /// The members' handles are loaded first and each place's slot checked
    /// readable after: a caller that judged a slot readable, then saw it
    /// failed and given a new device before this load, gets
    /// `ReadFailure::Changed` (plan again) instead of the new device's
    /// blank rows taken for data.
    pub(super) fn read_places(
        &self,
        places: &[(usize, u64)],
        len: usize,
    ) -> std::result::Result<Vec<crate::buf::AlignedBuf>, ReadFailure> {
        let mut bufs: Vec<crate::buf::AlignedBuf> = places
            .iter()
            .map(|_| crate::buf::AlignedBuf::for_overwrite(len))
            .collect();
        self.read_places_into(places, &mut bufs)?;
        Ok(bufs)
    }

    /// `read_places` into buffers the caller has (one per place, each the
    /// length to read): a loop over many batches (rebuild) reuses its
    /// buffers instead of a zeroed allocation per chunk per batch.
    pub(super) fn read_places_into(
        &self,
        places: &[(usize, u64)],
        bufs: &mut [crate::buf::AlignedBuf],
    ) -> std::result::Result<(), ReadFailure> {
        self.read_places_writing(places, bufs, (&[], &[])).0
    }

    /// `read_places_into`, with writes to the devices `to` (a rebuild's
    /// targets) in the same submission, so that they overlap on the
    /// devices: a rebuild writes what it recovered of one step while it
    /// reads the next. `writes` are (index in `to`, the bytes, the member
    /// offset). Returns the reads' outcome and each write's; with
    /// `ReadFailure::Changed` (a place no longer readable) nothing was
    /// submitted, no write either.
    pub(super) fn read_places_writing(
        &self,
        places: &[(usize, u64)],
        bufs: &mut [crate::buf::AlignedBuf],
        (to, writes): (&[&MemberRef], &[TargetWrite<'_>]),
    ) -> (std::result::Result<(), ReadFailure>, Vec<io::Result<()>>) {
        use crate::member::{submit, IoOp, MemberIo};
        assert_eq!(bufs.len(), places.len(), "a buffer for each place");
        let handles = self.read_handles();
        if places
            .iter()
            .any(|&(slot, off)| !self.readable(slot, (off - self.data_offset) / self.geo.chunk))
        {
            return (Err(ReadFailure::Changed), Vec::new());
        }
        // The written devices after the slots' handles, by index; the
        // handles alone where nothing is written (every plain read).
        let joined: Vec<MemberRef>;
        let devices: &[MemberRef] = match to.is_empty() {
            true => &handles,
            false => {
                joined = handles.iter().chain(to.iter().copied()).cloned().collect();
                &joined
            }
        };
        let reads = bufs
            .iter_mut()
            .zip(places)
            .map(|(b, &(member, offset))| MemberIo {
                member,
                offset,
                op: IoOp::Read(&mut b[..]),
            });
        let written = writes.iter().map(|&(t, b, offset)| MemberIo {
            member: handles.len() + t,
            offset,
            op: IoOp::Write(b),
        });
        let mut ios: Vec<MemberIo> = reads.chain(written).collect();
        let mut results = submit(devices, &mut ios);
        let wrote = results.split_off(places.len());
        let failed: Vec<(usize, MemberRef, io::Error)> = ios
            .iter()
            .zip(results)
            .filter_map(|(io, r)| r.err().map(|e| (io.member, handles[io.member].clone(), e)))
            .collect();
        drop(ios);
        let read = match failed.is_empty() {
            true => Ok(()),
            false => Err(ReadFailure::Failed(failed)),
        };
        (read, wrote)
    }

    /// Fails the members of a `read_places` failure list (each only if its
    /// slot still holds the device that erred), saying `what` went wrong
    /// ("read error during rebuild"). `Changed` fails nothing.
    pub(super) fn fail_slots(&self, failure: ReadFailure, what: &str) {
        if let ReadFailure::Failed(failed) = failure {
            for (slot, m, e) in failed {
                self.fail_slot_if(slot, &m, &format!("{what}: {e}"));
            }
        }
    }

    /// A data write to the device `m` of `slot` failed. A full filesystem
    /// (ENOSPC, EDQUOT) says nothing about the device: it is not failed,
    /// but the array stops taking writes (every other member would fill
    /// next, and failing them one by one would fail the array with every
    /// byte intact), reported once. Anything else fails the member.
    /// Returns whether it was a full filesystem.
    pub(super) fn member_write_failed(&self, slot: usize, m: &MemberRef, e: &io::Error) -> bool {
        if crate::member::is_full(e) {
            let mut full = self.out_of_space.lock();
            if full.is_none() {
                *full = Some(m.identity().to_string());
                self.full.store(true, Ordering::Release);
                drop(full);
                let mut meta = self.meta.lock();
                self.record(
                    &mut meta,
                    ArrayEvent::OutOfSpace {
                        slot,
                        member: m.identity().to_string(),
                    },
                );
            }
            return true;
        }
        self.fail_slot_if(slot, m, &format!("write error: {e}"));
        false
    }

    /// Reserves the space of a stripe's (a chunk's copies', a batch of
    /// full stripes') member writes, `(slot, offset, len)`, before any of
    /// them or its journal record is made (`Member::reserve`: a sparse
    /// member file's blocks), under the locks of the rows written and not
    /// counted in `unjournaled` (a full filesystem is recorded under the
    /// metadata lock). A full filesystem refuses them together: that
    /// member is recorded as out of space, as its write would be
    /// (`member_write_failed`), and none is written, so no stripe is left
    /// with some of its writes and not others. Any other error to reserve
    /// leaves the writes to meet what they meet on their own.
    pub(super) fn reserve_writes(
        &self,
        handles: &[MemberRef],
        writes: impl IntoIterator<Item = (usize, u64, u64)>,
    ) -> Result<()> {
        for (slot, offset, len) in writes {
            let m = &handles[slot];
            match m.reserve(offset, len) {
                Ok(()) => {}
                Err(e) if crate::member::is_full(&e) => {
                    self.member_write_failed(slot, m, &e);
                    return Err(self.no_space_error().expect("just recorded"));
                }
                Err(e) => {
                    tracing::warn!(
                        member = m.identity(),
                        "could not reserve space for a write: {e}"
                    )
                }
            }
        }
        Ok(())
    }

    /// The error for a write refused because a member's filesystem is full.
    pub(super) fn no_space_error(&self) -> Option<ArrayError> {
        if !self.full.load(Ordering::Acquire) {
            return None;
        }
        self.out_of_space
            .lock()
            .as_ref()
            .map(|member| ArrayError::NoSpace {
                name: self.name.clone(),
                member: member.clone(),
            })
    }

    /// The member whose full filesystem stopped writes, if one did.
    pub fn out_of_space(&self) -> Option<String> {
        self.out_of_space.lock().clone()
    }

    /// Puts a member into a slot: control plane and data path together.
    pub(super) fn set_member(&self, slot: usize, m: MemberRef) {
        *self.slots[slot].member.write() = Some(m.clone());
        self.handles.put(slot, m);
    }

    pub(super) fn handles_of(slots: &[Slot]) -> Handles {
        let all = Arc::new(MemberTable(
            slots
                .iter()
                .map(|s| {
                    s.member
                        .read()
                        .clone()
                        .unwrap_or_else(|| Arc::new(Absent) as MemberRef)
                })
                .collect(),
        ));
        let reads = Arc::new(MemberTable(all.iter().map(read_side).collect()));
        Handles {
            all: arc_swap::ArcSwap::new(all),
            reads: arc_swap::ArcSwap::new(reads),
            copies: Mutex::new(Vec::new()),
        }
    }
}

/// Where `m`'s reads go, in the reads' table: a hot replace's pair reads
/// its old device; any other member is itself.
fn read_side(m: &MemberRef) -> MemberRef {
    m.pair()
        .map_or_else(|| m.clone(), |p| p.read_from().clone())
}

/// A member table: one member per slot, as the data path reads them.
/// Aligned to lines of its own, apart from the count its `Arc` keeps: each
/// request in flight holds a clone of its table's `Arc` (the devices it
/// plans on stay open until it ends), and the vector beside that count is
/// read at every member I/O. Shards plan on tables of their own
/// (`LocalArray`); the shared tables' counts are still changed by every
/// other thread's requests.
#[repr(align(128))]
pub(crate) struct MemberTable(pub(crate) Vec<MemberRef>);

impl std::ops::Deref for MemberTable {
    type Target = Vec<MemberRef>;
    fn deref(&self) -> &Vec<MemberRef> {
        &self.0
    }
}

/// The slots' members as tables for the data path, swapped whole on the
/// rare change (`Handles::put`), so the data path reads them without
/// taking a lock.
pub(super) struct Handles {
    /// Every slot's member (a slot with none: `Absent`).
    pub(super) all: arc_swap::ArcSwap<MemberTable>,
    /// The same, with a hot replace's pair as the device its reads go to:
    /// reads are planned on it, so that a read's error is that device's
    /// and fails the slot only while the slot still holds it (reads take
    /// no lock across the hot replace's switch, after which the pair
    /// names the new device). The pair reads its old device until the
    /// switch, which puts the new device in the slot.
    pub(super) reads: arc_swap::ArcSwap<MemberTable>,
    /// The copies threads keep of both tables (`local.rs`), replaced with
    /// the tables; held weakly, so a copy goes with its last `LocalArray`.
    copies: Mutex<Vec<std::sync::Weak<TableCopy>>>,
}

impl Handles {
    /// Puts `m` in `slot` of both tables, and of every thread's copy of
    /// them before it returns. Under the copies' lock: a copy is made
    /// before or after, never from a table half changed, and two changes
    /// never start from the same table.
    pub(super) fn put(&self, slot: usize, m: MemberRef) {
        let mut copies = self.copies.lock();
        let with = |t: &arc_swap::ArcSwap<MemberTable>, m: MemberRef| {
            let mut v: Vec<MemberRef> = t.load().0.clone();
            v[slot] = m;
            v
        };
        let (reads, all) = (with(&self.reads, read_side(&m)), with(&self.all, m));
        copies.retain(|c| c.strong_count() > 0);
        for c in copies.iter().filter_map(|c| c.upgrade()) {
            c.all.store(Arc::new(MemberTable(all.clone())));
            c.reads.store(Arc::new(MemberTable(reads.clone())));
        }
        self.all.store(Arc::new(MemberTable(all)));
        self.reads.store(Arc::new(MemberTable(reads)));
    }

    /// A copy of both tables for one thread, kept current by `put`.
    pub(super) fn copy(&self) -> Arc<TableCopy> {
        let mut copies = self.copies.lock();
        let own = |t: &arc_swap::ArcSwap<MemberTable>| {
            arc_swap::ArcSwap::new(Arc::new(MemberTable(t.load().0.clone())))
        };
        let c = Arc::new(TableCopy {
            all: own(&self.all),
            reads: own(&self.reads),
        });
        copies.retain(|c| c.strong_count() > 0);
        copies.push(Arc::downgrade(&c));
        c
    }
}
