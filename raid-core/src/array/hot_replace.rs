//! Hot replace: a new device takes an active member's place while the array
//! loses no redundancy (mdadm's `--replace --with`). Used to retire a
//! drive that still works but is wearing out, without ever running degraded.
//!
//! While it runs, the slot's member is a `Mirrored` pair: reads come from
//! the old device, every write goes to both. A copier goes through the
//! slot's rows in order, each step of rows under the stripe (or chunk)
//! locks the writers of those rows take, and copies the old device's rows
//! to the new one (`hot_copy.rs`). Rows already copied get every later
//! write through the pair; rows not yet copied get it too and are copied
//! after, under the lock, so both orders end with the new device holding
//! the current data. A batch is cut into runs copied side by side, as a
//! rebuild's (`runs.rs`): one run's read from the old device in flight
//! while another writes the new one.
//!
//! When the copy is complete the new device becomes the slot's member under
//! a fresh member uuid, and the metadata says so; the old device is let go,
//! its metadata erased (it would name itself the slot's active member, and
//! alone at a start would be assembled with the data of the day it left;
//! given back beside the members, it is left out). If the old device fails
//! meanwhile, the slot fails as usual and the replacement takes it as a
//! rebuilding member, rebuilt from the other members (mdadm does the same:
//! the device the operator chose for the slot is the one it gets, with no
//! second command and no window in which a spare or nothing takes it); if
//! the new one fails (or the operator fails it: `drop_replacement`), the
//! replacement is dropped and the old device simply stays.
//!
//! Nothing is recorded on disk until the end: a crash or stop midway leaves
//! the old device the member, and the replacement can be started again.

use super::runs;
use super::*;
use crate::member::Pair;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// The old device and its replacement, as one member.
pub(super) struct Mirrored {
    pub(super) old: MemberRef,
    pub(super) new: MemberRef,
    /// The replacement failed a write or flush: the copier drops it.
    pub(super) new_failed: AtomicBool,
    /// Why it failed (the first error): the event that ends the copy says
    /// so, as a member's failure does.
    new_why: Mutex<String>,
    /// The new device has taken the slot: a writer still holding this pair
    /// must see the new device's errors (they are the member's now).
    switched: AtomicBool,
}

impl Mirrored {
    /// An error of the new device: the caller's once the new device is the
    /// member, else it only drops the replacement.
    fn new_result(&self, e: io::Error) -> io::Result<()> {
        if self.switched.load(Ordering::Acquire) {
            return Err(e);
        }
        self.new_err(e);
        Ok(())
    }

    pub(super) fn new_err(&self, e: io::Error) {
        if !self.new_failed.swap(true, Ordering::AcqRel) {
            *self.new_why.lock() = e.to_string();
            tracing::error!(
                member = self.new.identity(),
                "replacement member failed: {e}"
            );
        }
    }
}

impl Mirrored {
    /// What is wrong with the new device's file, if anything: shrunk under
    /// the `used` bytes the array uses, or deleted, while the copy runs.
    /// The copy's own writes would grow a truncated file again with holes
    /// where rows were copied, and a deleted one is gone at the next start:
    /// either switched in would be a member that lost data.
    fn new_file_trouble(&self, used: u64) -> Option<String> {
        let Some(Ok(now)) = self.new.file_now() else {
            return None;
        };
        if now.len < used {
            Some(format!(
                "shrank to {} bytes, under the {used} the array uses (truncated underneath the copy?)",
                now.len
            ))
        } else if !now.linked {
            Some("was deleted during the copy".into())
        } else {
            None
        }
    }

    /// After the switch the pair is only the new device: a handle taken
    /// before it (a bitmap or journal write, a flush) reaches the member.
    fn after_switch(&self) -> Option<&MemberRef> {
        self.switched.load(Ordering::Acquire).then_some(&self.new)
    }
}

impl Member for Mirrored {
    /// The slot's device: the old one until the switch, then the new one,
    /// whose counters include the copy's writes (what the device did, as
    /// iostat of the drive would show; `raidctl iostat` reports a member
    /// that changed during an interval from the next one).
    fn io_stats(&self) -> Option<&crate::stats::IoStats> {
        match self.after_switch() {
            Some(n) => n.io_stats(),
            None => self.old.io_stats(),
        }
    }
    fn identity(&self) -> &str {
        match self.after_switch() {
            Some(n) => n.identity(),
            None => self.old.identity(),
        }
    }
    /// The new device's once switched, so an error through a handle taken
    /// before the switch fails the slot's member (the new device).
    fn device_key(&self) -> crate::member::DeviceKey {
        match self.after_switch() {
            Some(n) => n.device_key(),
            None => self.old.device_key(),
        }
    }
    fn size(&self) -> u64 {
        self.old.size()
    }
    /// The slot's device's (the old one until the switch): the monitor's
    /// shrink check covers a slot being hot-replaced too.
    fn file_now(&self) -> Option<io::Result<crate::member::FileNow>> {
        self.read_from().file_now()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_from().read_at(buf, offset)
    }
    // The new device is written first, so a write whose old half fails
    // still reached it (it may be the member by now); after the switch its
    // errors are the caller's. A shard writes both halves at once
    // (`Member::pair`), which keeps that: both are written whatever the
    // other's outcome.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let (first, second) = self.write_to(offset);
        if let Some(n) = second {
            if let Err(e) = n.write_at(buf, offset) {
                self.second_failed(e)?;
            }
        }
        first.write_at(buf, offset)
    }
    /// Both devices a write there goes to, as `write_at`.
    fn reserved(&self, offset: u64, len: u64) -> bool {
        let (first, second) = self.write_to(offset);
        first.reserved(offset, len) && second.is_none_or(|n| n.reserved(offset, len))
    }
    /// The new device's full filesystem drops the replacement, as its
    /// write error would, before anything is written to either.
    fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        let (first, second) = self.write_to(offset);
        if let Some(n) = second {
            if let Err(e) = n.reserve(offset, len) {
                self.second_failed(e)?;
            }
        }
        first.reserve(offset, len)
    }
    fn flush(&self) -> io::Result<()> {
        if let Some(n) = self.after_switch() {
            return n.flush();
        }
        if let Err(e) = self.new.flush() {
            self.new_result(e)?;
        }
        self.old.flush()
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if let Some(n) = self.after_switch() {
            return n.write_zeroes(offset, len);
        }
        if let Err(e) = self.new.write_zeroes(offset, len) {
            self.new_result(e)?;
        }
        self.old.write_zeroes(offset, len)
    }
    fn is_direct(&self) -> bool {
        self.old.is_direct() || self.new.is_direct()
    }
    /// Both devices in memory: every I/O of the pair is a copy, so reads
    /// of the slot are still copied in the caller's thread.
    fn in_memory(&self) -> bool {
        self.old.in_memory() && self.new.in_memory()
    }
    fn flush_waits(&self) -> bool {
        self.old.flush_waits() || self.new.flush_waits()
    }
    fn pair(&self) -> Option<&dyn Pair> {
        Some(self)
    }
}

impl Pair for Mirrored {
    fn devices(&self) -> [&MemberRef; 2] {
        [&self.old, &self.new]
    }
    fn read_from(&self) -> &MemberRef {
        self.after_switch().unwrap_or(&self.old)
    }
    fn write_to(&self, offset: u64) -> (&MemberRef, Option<&MemberRef>) {
        if let Some(n) = self.after_switch() {
            return (n, None);
        }
        // The superblocks stay the old device's until the switch: a crash
        // midway must not leave the replacement claiming the slot.
        let both =
            offset >= crate::metadata::BITMAP_OFFSET && !self.new_failed.load(Ordering::Acquire);
        (&self.old, both.then_some(&self.new))
    }
    fn second_failed(&self, e: io::Error) -> io::Result<()> {
        self.new_result(e)
    }
}

/// A hot replacement in progress.
pub(super) struct HotReplace {
    slot: usize,
    pair: Arc<Mirrored>,
    /// Rows copied so far.
    row: AtomicU64,
}

impl Array {
    /// Starts replacing the active member of `slot` by `new`, keeping full
    /// redundancy; `hot_replace_copy` does the copying. Refused when the
    /// slot is not active, `new` is already in the array, or another hot
    /// replacement runs.
    pub fn hot_replace(&self, slot: usize, new: MemberRef) -> Result<()> {
        if self.geo.level == Level::Raid0 {
            // RAID0 writes take no stripe locks, which the copy relies on.
            return Err(ArrayError::Refused {
                rule: Rule::NoRedundancy,
                detail: "RAID0 cannot hot-replace a member: copy it while the array is stopped (dd), or move the data to a redundant array".into(),
            });
        }
        let meta = self.meta.lock();
        self.check_new_device(&meta, &new)?;
        let s = self
            .slots
            .get(slot)
            .ok_or_else(|| ArrayError::Invalid(format!("no slot {slot}")))?;
        if s.state() != SlotState::Active {
            return Err(ArrayError::Refused {
                rule: Rule::WrongSlotState,
                detail: format!(
                    "slot {slot} is {}: a hot replace copies from an active member; put a new device in a failed slot with replace",
                    s.state().name()
                ),
            });
        }
        let mut hot = self.hot.lock();
        if let Some(h) = hot.as_ref() {
            return Err(ArrayError::Refused {
                rule: Rule::WrongSlotState,
                detail: format!(
                    "slot {} is being replaced already: wait for it (raidctl wait {})",
                    h.slot, self.name
                ),
            });
        }
        let old = s
            .member
            .read()
            .clone()
            .expect("an active slot has a member");
        let pair = Arc::new(Mirrored {
            old: old.clone(),
            new: new.clone(),
            new_failed: AtomicBool::new(false),
            new_why: Mutex::new(String::new()),
            switched: AtomicBool::new(false),
        });
        self.set_member(slot, pair.clone());
        *hot = Some(HotReplace {
            slot,
            pair,
            row: AtomicU64::new(0),
        });
        drop(hot);
        let mut meta = meta;
        self.record(
            &mut meta,
            ArrayEvent::HotReplaceStarted {
                slot,
                old: old.identity().into(),
                new: new.identity().into(),
            },
        );
        drop(meta);
        // The new device holds the bitmap as it is from now on (every later
        // write of it goes to both devices): at the switch it may be the
        // only device left with it (its old one erased, another member
        // failed), and what it held before is no bitmap of this array.
        self.rewrite_bitmap();
        tracing::info!(array = %self.name, slot, old = old.identity(), new = new.identity(), "hot replace started");
        Ok(())
    }

    /// Refuses the device a hot replace copies onto, under another name:
    /// it carries no metadata of this array until the switch, so only its
    /// content tells (`create::find_aliases`, on its first block, which
    /// nothing reads until the switch writes its metadata there; the
    /// switch waits for `meta`, held here).
    pub(super) fn not_the_hot_replacement_by_content(&self, m: &MemberRef) -> Result<()> {
        // A replacement that failed is on its way out (the copy drops it
        // at its next batch) and takes no writes: nothing to compare.
        let Some((slot, new)) = self
            .hot
            .lock()
            .as_ref()
            .filter(|h| !h.pair.new_failed.load(Ordering::Acquire))
            .map(|h| (h.slot, h.pair.new.clone()))
        else {
            return Ok(());
        };
        match super::create::find_aliases(&[new.clone(), m.clone()]) {
            Ok(None) => Ok(()),
            // An I/O error on either says nothing of who is who: the
            // candidate's own errors show in what follows, and the
            // replacement's are the copy's to handle. A block not put back
            // is said (`find_aliases`).
            Err(ArrayError::Member { member, source }) => {
                tracing::warn!(array = %self.name, device = %member, "cannot compare with the hot replace's device: {source}");
                Ok(())
            }
            Err(e) => Err(e),
            Ok(Some(_)) => Err(super::membership::refuse(
                Rule::AlreadyMember,
                format!(
                    "{} is {}, the device the hot replace of slot {slot} of '{}' copies onto, under another name (the same export by another URI?): name a device that is in no array",
                    m.identity(),
                    new.identity(),
                    self.name
                ),
            )),
        }
    }

    /// The slot being hot-replaced, the new device, rows copied and total.
    pub fn hot_replace_progress(&self) -> Option<(usize, String, u64, u64)> {
        self.hot.lock().as_ref().map(|h| {
            (
                h.slot,
                h.pair.new.identity().to_string(),
                h.row.load(Ordering::Acquire),
                self.geo.rows(),
            )
        })
    }

    /// Whether the device `key` is the replacement being copied to.
    pub fn is_replacement(&self, key: crate::member::DeviceKey) -> bool {
        self.hot
            .lock()
            .as_ref()
            .is_some_and(|h| h.pair.new.device_key() == key)
    }

    /// Drops the replacement `key` of the hot replace that runs, as its own
    /// failure would (the operator's `fail` of the new device): the copy
    /// ends at its next batch and the old device stays the member. Returns
    /// the slot, or None where `key` is no running copy's replacement (or
    /// its copy has already switched it in: it is the member then).
    pub fn drop_replacement(&self, key: crate::member::DeviceKey) -> Option<usize> {
        let hot = self.hot.lock();
        let h = hot.as_ref()?;
        if h.pair.new.device_key() != key || h.pair.switched.load(Ordering::Acquire) {
            return None;
        }
        h.pair.new_err(io::Error::other(
            "failed by the operator: the hot replace is dropped",
        ));
        Some(h.slot)
    }

    /// Copies the slot being hot-replaced onto its replacement, then makes
    /// the replacement the member. Blocks; `stop` interrupts it (the old
    /// device stays the member; start the replacement again later).
    pub fn hot_replace_copy(&self, opts: &RebuildOptions, stop: &AtomicBool) -> Result<RebuildEnd> {
        let (slot, pair) = match self.hot.lock().as_ref() {
            Some(h) => (h.slot, h.pair.clone()),
            None => return Err(ArrayError::Invalid("no hot replace in progress".into())),
        };
        let copier = super::hot_copy::Copier::new(self, slot, &pair, opts);
        let work = |run: runs::Run, pool: &mut crate::buf::BufPool| copier.run(run, pool);
        let (run_rows, batch) = runs::run_and_batch_rows(opts.batch_rows, opts.parallel);
        let started = Instant::now();
        let copied = std::thread::scope(|sc| {
            let mut runs = self.run_threads(sc, (run_rows, batch), "hot-replace-run", &work);
            self.hot_replace_batches(slot, &pair, opts, stop, (batch, run_rows), &mut runs)
        })?;
        if copied == RebuildEnd::Interrupted {
            return Ok(copied);
        }
        self.hot_replace_switch(slot, &pair)?;
        tracing::info!(array = %self.name, slot, secs = started.elapsed().as_secs_f64(), "hot replace finished");
        Ok(RebuildEnd::Finished)
    }

    /// The copy's batches (`batch` rows each, in runs of `run_rows`):
    /// Finished once every row is on the new device.
    fn hot_replace_batches(
        &self,
        slot: usize,
        pair: &Arc<Mirrored>,
        opts: &RebuildOptions,
        stop: &AtomicBool,
        (batch, run_rows): (u64, u64),
        runs: &mut runs::RunThreads<'_, ()>,
    ) -> Result<RebuildEnd> {
        let total = self.geo.rows();
        let chunk = self.geo.chunk;
        let mut row = 0;
        while row < total {
            if stop.load(Ordering::Acquire) {
                self.end_hot_replace(slot, pair, "stopped before the copy was complete: the old member stays; replace again to restart it");
                return Ok(RebuildEnd::Interrupted);
            }
            let end = (row + batch).min(total);
            let began = Instant::now();
            if let Some(why) = self.hot_replace_broken(slot, pair) {
                self.end_hot_replace(slot, pair, &why);
                return Err(ArrayError::Refused {
                    rule: Rule::Superseded,
                    detail: why,
                });
            }
            // Its runs lock their own rows (`hot_copy.rs`).
            let copied: Result<()> = runs.batch((row, end), run_rows).into_iter().collect();
            if let Err(e) = copied {
                let why = match &e {
                    ArrayError::Member { source, .. } => {
                        self.fail_slot(slot, &format!("read error during hot replace: {source}"));
                        format!("the old member failed ({source})")
                    }
                    other => format!("the copy stopped ({other}); replace again to restart it"),
                };
                self.end_hot_replace(slot, pair, &why);
                return Err(e);
            }
            if let Some(h) = self.hot.lock().as_ref() {
                h.row.store(end, Ordering::Release);
            }
            // A source that fails meanwhile ends the pause too: its slot
            // is degraded until the replacement takes it, at the next batch.
            let ended =
                || stop.load(Ordering::Acquire) || self.hot_replace_broken(slot, pair).is_some();
            pace(
                opts.rate_limit,
                &opts.live_rate,
                (end - row) * chunk,
                began,
                &ended,
            );
            row = end;
        }
        Ok(RebuildEnd::Finished)
    }

    /// Once every row is copied: the new device flushed, the journal
    /// settled, then the new device made the slot's member.
    fn hot_replace_switch(&self, slot: usize, pair: &Arc<Mirrored>) -> Result<RebuildEnd> {
        if let Err(e) = pair.new.flush() {
            pair.new_err(e);
        }
        // Journal records name slots, not devices: settled (by the
        // admission of the new device, which starts with an empty journal
        // area: see journal_admit), so none is ever replayed from before
        // the switch.
        match self.journal_admit(&pair.new) {
            Ok(()) => {}
            Err(ArrayError::Member { source, .. }) => pair.new_err(source),
            Err(e) => {
                self.end_hot_replace(
                    slot,
                    pair,
                    &format!("the journal could not be settled: {e}"),
                );
                return Err(e);
            }
        }
        // No data write in flight from here to the switch (stripe locks
        // before `meta`, the order writers take them in): a write the new
        // device missed cannot slip in after the last check.
        let _quiet = self.locks.lock_all();
        let mut meta = self.meta.lock();
        let s = &self.slots[slot];
        // The new device must be able to take its metadata before anything
        // changes: written now as it will be after the switch (its new uuid,
        // the next event), with a flush that makes all it holds durable. If
        // it cannot, the old device stays the member and the array keeps all
        // its redundancy.
        // Only while the old device still holds the slot: had it failed
        // meanwhile (the flush and settle above run before `meta`), that
        // metadata would mark the slot failed in the new device's own
        // superblock, newest of all, which assembly reads as the last
        // member in sync recording its own failure.
        let new_uuid = Uuid::random();
        if s.state() == SlotState::Active {
            let mut sb = self.superblock(&meta, slot as u32, new_uuid);
            sb.events += 1;
            sb.slots[slot].uuid = new_uuid;
            if let Err(e) = metadata::write_superblock(pair.new.as_ref(), &sb) {
                pair.new_err(e);
            }
        }
        if let Some(why) = self.hot_replace_broken(slot, pair) {
            // A copy of that metadata may have landed: wipe it, and move the
            // array's own metadata past its event, so the device never
            // outranks the members if it is offered at a start.
            let _ = metadata::erase_superblocks(pair.new.as_ref());
            meta.events += 1;
            self.persist(&mut meta);
            drop(meta);
            // The stripes back to the writers first: if the old device
            // failed, the replacement now takes the slot to be rebuilt.
            drop(_quiet);
            self.end_hot_replace(slot, pair, &why);
            return Err(ArrayError::Refused {
                rule: Rule::Superseded,
                detail: why,
            });
        }
        pair.switched.store(true, Ordering::SeqCst);
        self.set_member(slot, pair.new.clone());
        let old_uuid = std::mem::replace(&mut *s.uuid.write(), new_uuid);
        s.incarnation.fetch_add(1, Ordering::AcqRel);
        *self.hot.lock() = None;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.record(
            &mut meta,
            ArrayEvent::HotReplaceFinished {
                slot,
                old: pair.old.identity().into(),
                new: pair.new.identity().into(),
            },
        );
        // The new member learns it is the member before the others say so.
        self.persist_from(&mut meta, Some(slot));
        // Under `meta`: no add of the old device as a spare comes between.
        self.let_go_of_replaced(&pair.old, old_uuid);
        drop(meta);
        self.rewrite_bitmap();
        Ok(RebuildEnd::Finished)
    }

    /// Erases the metadata of a device a hot replace took out of its slot.
    /// It would still say it is that slot's active member, only at an older
    /// event: offered alone at a start (its array deleted, the others
    /// wiped) it would be assembled, degraded, with the data of the day it
    /// left. Erased, it is a free device. Its data is left as it is.
    /// Only metadata naming it this array's member `was` is erased: two
    /// names of one disk that the array could not tell apart (a file and a
    /// loop device over it, two addresses of one NBD export) would make the
    /// old device the new one, which now carries the slot's new identity.
    fn let_go_of_replaced(&self, old: &MemberRef, was: Uuid) {
        match metadata::read_superblock(old.as_ref()) {
            Ok(sb) if sb.array_uuid == self.uuid && sb.member_uuid == was => {}
            Ok(_) => {
                tracing::warn!(array = %self.name, member = old.identity(), "the replaced device carries other metadata now (the new device under another name?): left as it is");
                return;
            }
            Err(_) => return,
        }
        match metadata::erase_superblocks(old.as_ref()) {
            Ok(()) => {
                tracing::info!(array = %self.name, member = old.identity(), "replaced device's metadata erased: it is in no array now")
            }
            Err(e) => {
                tracing::warn!(array = %self.name, member = old.identity(), "the replaced device's metadata could not be erased ({e}): it still names its old slot, at an older event than the array's")
            }
        }
    }

    /// Why the hot replacement cannot go on, if it cannot.
    fn hot_replace_broken(&self, slot: usize, pair: &Arc<Mirrored>) -> Option<String> {
        if self.slots[slot].state() != SlotState::Active {
            return Some(format!(
                "{} failed during the hot replace",
                pair.old.identity()
            ));
        }
        if !pair.new_failed.load(Ordering::Acquire) {
            if let Some(trouble) = pair.new_file_trouble(self.data_offset + self.geo.member_size) {
                pair.new_err(io::Error::other(trouble.clone()));
                return Some(format!(
                    "the replacement {} {trouble}; {} stays the member",
                    pair.new.identity(),
                    pair.old.identity()
                ));
            }
        }
        if pair.new_failed.load(Ordering::Acquire) {
            return Some(format!(
                "the replacement {} failed ({}); {} stays the member",
                pair.new.identity(),
                pair.new_why.lock(),
                pair.old.identity()
            ));
        }
        // Another slot failing does not matter: the copy comes from this
        // slot's own device, not from redundancy.
        None
    }

    /// Ends the hot replacement, once. If the old device failed (its slot
    /// is failed, still holding the pair) and the replacement did not, the
    /// replacement takes the slot as a rebuilding member, as a `replace`
    /// would put it there, but holding the rows copied so far: its rebuild
    /// resyncs those only in the regions the bitmap marks (the writes it
    /// missed while the slot was failed are there), and rebuilds the rest.
    /// Otherwise the replacement is dropped and the slot gets the old
    /// device back alone. Either way it is recorded once.
    fn end_hot_replace(&self, slot: usize, pair: &Arc<Mirrored>, why: &str) {
        let mut meta = self.meta.lock();
        let mut hot = self.hot.lock();
        let Some(copied) = hot
            .as_ref()
            .filter(|h| Arc::ptr_eq(&h.pair, pair))
            .map(|h| h.row.load(Ordering::Acquire))
        else {
            return;
        };
        *hot = None;
        drop(hot);
        let holds_pair = self.slots[slot]
            .member
            .read()
            .as_ref()
            .is_some_and(|m| Arc::ptr_eq(m, &(pair.clone() as MemberRef)));
        let mut why = why.to_string();
        let source_failed = self.slots[slot].state() == SlotState::Failed;
        let new_failed = pair.new_failed.load(Ordering::Acquire);
        if source_failed && new_failed {
            why = format!(
                "{why}; the replacement {} failed too ({}), so it cannot take the slot",
                pair.new.identity(),
                pair.new_why.lock()
            );
        }
        if holds_pair && source_failed && !new_failed {
            // Its metadata write may fail it at once (the slot failed again).
            // The rows copied before the source failed are on the new
            // device, and every write it missed since (the slot failed
            // skips it) is in a region the bitmap marks: those rows are
            // resynced where marked, the rest rebuilt (md keeps a
            // replacement's recovery position the same way). Not where the
            // old device's file was cut short: a write past the cut grows
            // it again with a hole, read back as zeros without an error,
            // so rows copied since may be zeros: all are rebuilt.
            let used = self.data_offset + self.geo.member_size;
            let cut = pair
                .old
                .file_now()
                .is_some_and(|now| now.map_or(true, |now| now.len < used));
            let kept = if cut { 0 } else { copied };
            let took = self
                .replace_holding(&mut meta, slot, pair.new.clone(), kept)
                .and_then(|()| match self.slots[slot].state() {
                    SlotState::Rebuilding => Ok(()),
                    _ => Err(ArrayError::Invalid(
                        "it failed as its metadata was written".into(),
                    )),
                });
            match took {
                Ok(()) => {
                    tracing::warn!(array = %self.name, slot, old = pair.old.identity(), new = pair.new.identity(), "hot replace source failed: the replacement is rebuilt in its place");
                    self.record(
                        &mut meta,
                        ArrayEvent::HotReplaceRebuilding {
                            slot,
                            old: pair.old.identity().into(),
                            new: pair.new.identity().into(),
                        },
                    );
                    drop(meta);
                    self.rewrite_bitmap();
                    return;
                }
                Err(e) => {
                    why = format!(
                        "{why}; {} cannot be rebuilt in its place: {e}",
                        pair.new.identity()
                    )
                }
            }
        }
        if holds_pair {
            self.set_member(slot, pair.old.clone());
        }
        self.record(
            &mut meta,
            ArrayEvent::HotReplaceFailed {
                slot,
                new: pair.new.identity().into(),
                reason: why,
            },
        );
    }
}
