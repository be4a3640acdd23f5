//! Rebuild: bring a replacement member in sync, online, batch by batch.
//!
//! Each batch of rows is rebuilt under the locks of its stripes (or mirrored
//! chunks), then the member's in-sync position moves past it, so a writer
//! either finds the rows not yet rebuilt (and skips the member: the rebuild
//! will compute them) or rebuilt (and writes the member). The position is
//! saved in the metadata every `checkpoint_bytes` or `checkpoint_every`,
//! whichever comes first, after a flush of the new
//! member, so a stop or crash resumes from there.
//!
//! A batch is cut into `parallel` runs of `batch_rows` rows (at most 256
//! rows in all), rebuilt side by side on threads made for the rebuild
//! (`runs.rs`) while the rebuild's own thread holds every lock of the
//! batch. The position moves only once the whole batch is written, so the
//! rule above holds for the batch as a whole.

use super::runs;
use super::*;
use crate::buf::AlignedBuf;
use crate::layout::ChunkRole;
use crate::member::{submit, IoOp, MemberIo};
use crate::parity::RecoverJob;
use std::time::{Duration, Instant};

/// How a rebuild runs.
#[derive(Clone, Debug)]
pub struct RebuildOptions {
    /// Most bytes written to the new member per second (None: as fast as it goes).
    pub rate_limit: Option<u64>,
    /// A rate the operator can change while the rebuild runs (bytes per
    /// second, 0: none); replaces `rate_limit` when set.
    pub live_rate: Option<Arc<AtomicU64>>,
    /// Rows (stripes) per batch: the parity engine's batch size.
    pub batch_rows: u64,
    /// Runs of `batch_rows` rebuilt side by side, each on a thread (see
    /// the module's doc); 1: one at a time. By default the cores, at most
    /// 4. A rebuild on a rayon thread runs them one at a time whatever
    /// this says. A hot replace's copy runs the same way. Writers into a
    /// batch wait for all of it: `batch_rows` x `parallel` rows, at most
    /// 256.
    pub parallel: usize,
    /// Save the restart position at least this often...
    pub checkpoint_bytes: u64,
    /// ...and at least this often in time, so a slow (rate-limited or
    /// loaded) rebuild loses little to a crash.
    pub checkpoint_every: Duration,
}

impl Default for RebuildOptions {
    fn default() -> Self {
        RebuildOptions {
            rate_limit: None,
            live_rate: None,
            batch_rows: 32,
            parallel: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
            checkpoint_bytes: 256 << 20,
            checkpoint_every: Duration::from_secs(5),
        }
    }
}

/// How a rebuild ended without error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebuildEnd {
    Finished,
    /// Stopped by the caller; resumes from the saved position.
    Interrupted,
}

impl Array {
    /// Rebuilt rows and total rows of a rebuilding slot.
    pub fn rebuild_progress(&self, slot: usize) -> Option<(u64, u64)> {
        let s = self.slots.get(slot)?;
        (s.state() == SlotState::Rebuilding)
            .then(|| (s.rebuild_row.load(Ordering::Acquire), self.geo.rows()))
    }

    /// Slots waiting for or in rebuild (`rebuild_wanted` says which may run).
    pub fn rebuilding_slots(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].state() == SlotState::Rebuilding)
            .collect()
    }

    /// Rebuilds `slot` from its saved position to the end. Blocks; run it
    /// on its own thread to keep serving I/O. `stop` interrupts it.
    pub fn rebuild(
        &self,
        slot: usize,
        opts: &RebuildOptions,
        stop: &AtomicBool,
    ) -> Result<RebuildEnd> {
        let ticket = &self.rebuild_ticket(slot)?;
        let s = &self.slots[slot];
        let target = &s
            .member
            .read()
            .clone()
            .expect("a rebuilding slot has a member");
        let total = self.geo.rows();
        let row = s.rebuild_row.load(Ordering::Acquire);
        {
            let mut meta = self.meta.lock();
            self.record(
                &mut meta,
                ArrayEvent::RebuildStarted {
                    slot,
                    member: target.identity().into(),
                    from_row: row,
                    rows: total,
                },
            );
        }
        tracing::info!(array = %self.name, slot, member = target.identity(), from_row = row, rows = total, "rebuild started");
        // Records from before this member arrived hold the slot's old
        // contents: settle them before the rebuild writes (see journal.rs).
        self.journal_settle()
            .map_err(|e| self.rebuild_ended_by(ticket, target, e))?;
        if let Err(e) = self.journal_admit(target) {
            self.fail_slot_if(slot, target, &format!("journal write failed: {e}"));
            let e = ArrayError::Member {
                member: target.identity().into(),
                source: e,
            };
            return Err(self.rebuild_ended_by(ticket, target, e));
        }
        // A re-added member holds every row no write touched since it left.
        let dirty_only = s.resync_dirty_only.load(Ordering::Acquire);
        let (run_rows, batch) = runs::run_and_batch_rows(opts.batch_rows, opts.parallel);
        let work = |(lo, hi): runs::Run, pool: &mut crate::buf::BufPool| -> Result<u64> {
            if dirty_only && self.rows_clean(lo, hi) {
                return Ok(0);
            }
            match self.geo.level {
                Level::Raid5 | Level::Raid6 => {
                    self.rebuild_parity_rows(slot, target, lo, hi, pool)?
                }
                _ => self.rebuild_mirror_rows(slot, target, lo, hi)?,
            }
            Ok(hi - lo)
        };
        std::thread::scope(|sc| {
            let mut runs = self.run_threads(sc, (run_rows, batch), "rebuild-run", &work);
            self.rebuild_rows(
                ticket,
                target,
                (row, batch, run_rows),
                opts,
                stop,
                &mut runs,
            )
        })
    }

    /// The rebuild's batches from `row` (`batch` rows each, in runs of
    /// `run_rows`), then its end (see `rebuild`).
    fn rebuild_rows(
        &self,
        ticket: &membership::RebuildTicket,
        target: &MemberRef,
        (mut row, batch, run_rows): (u64, u64, u64),
        opts: &RebuildOptions,
        stop: &AtomicBool,
        runs: &mut runs::RunThreads<'_, u64>,
    ) -> Result<RebuildEnd> {
        let slot = ticket.slot;
        let total = self.geo.rows();
        let chunk = self.geo.chunk;
        let started = Instant::now();
        let first_row = row;
        let mut saved = row;
        let mut saved_at = Instant::now();
        let mut copied = 0u64;
        let mut next_report = 0u64;
        let ckpt_rows = (opts.checkpoint_bytes / chunk).max(1);
        while row < total {
            if stop.load(Ordering::Acquire) {
                self.save_rebuild_position(ticket, target)?;
                tracing::info!(array = %self.name, slot, row, "rebuild interrupted; will resume here");
                return Ok(RebuildEnd::Interrupted);
            }
            let end = (row + batch).min(total);
            let began = Instant::now();
            let step = {
                let _held = self.locks.lock(self.rebuild_lock_keys(slot, row, end));
                let r: Result<u64> = runs.batch((row, end), run_rows).into_iter().sum();
                // Only while the slot still holds this rebuild's member.
                r.and_then(|n| self.advance_rebuild(ticket, end).map(|()| n))
            };
            // Rows written to the member: a re-added member's clean rows
            // are skipped, not paced (a resync of a few written regions
            // under a rate limit takes their time, not the member's).
            let this_batch = match step {
                Ok(n) => n,
                Err(e) => return Err(self.rebuild_ended_by(ticket, target, e)),
            };
            copied += this_batch;
            row = end;
            if row < total
                && (row - saved >= ckpt_rows || saved_at.elapsed() >= opts.checkpoint_every)
            {
                self.save_rebuild_position(ticket, target)
                    .map_err(|e| self.rebuild_ended_by(ticket, target, e))?;
                saved = row;
                saved_at = Instant::now();
            }
            let pct = row * 100 / total;
            if pct >= next_report {
                let secs = started.elapsed().as_secs_f64().max(1e-9);
                let rate = ((row - first_row) * chunk) as f64 / secs;
                let left = ((total - row) * chunk) as f64 / rate.max(1.0);
                tracing::info!(array = %self.name, slot, percent = pct, rate_mib_s = format!("{:.1}", rate / 1048576.0),
                    eta_s = format!("{left:.0}"), "rebuild progress");
                next_report = pct + 5;
            }
            pace(
                opts.rate_limit,
                &opts.live_rate,
                this_batch * chunk,
                began,
                &|| stop.load(Ordering::Acquire),
            );
        }
        if let Err(e) = target.flush() {
            self.fail_slot_if(slot, target, &format!("flush failed: {e}"));
            let e = ArrayError::Member {
                member: target.identity().into(),
                source: e,
            };
            return Err(self.rebuild_ended_by(ticket, target, e));
        }
        self.finish_rebuild(ticket, copied)
            .map_err(|e| self.rebuild_ended_by(ticket, target, e))?;
        self.resync_deferred()?;
        tracing::info!(array = %self.name, slot, rows_copied = copied, rows = total, secs = started.elapsed().as_secs_f64(), "rebuild finished");
        Ok(RebuildEnd::Finished)
    }

    /// Records why a rebuild ended with an error, once: its own member
    /// failed (the slot is failed now: a new member is needed), it was
    /// superseded (a rebuild for the new member follows), or the array lost
    /// what it rebuilds from (blocked until membership changes, so no retry
    /// storm).
    fn rebuild_ended_by(
        &self,
        t: &membership::RebuildTicket,
        target: &MemberRef,
        e: ArrayError,
    ) -> ArrayError {
        let s = &self.slots[t.slot];
        if matches!(
            e,
            ArrayError::Refused {
                rule: Rule::Superseded,
                ..
            }
        ) {
            tracing::warn!(array = %self.name, slot = t.slot, "{e}");
        } else if s.state() == SlotState::Failed {
            let mut meta = self.meta.lock();
            self.record(
                &mut meta,
                ArrayEvent::RebuildFailed {
                    slot: t.slot,
                    reason: format!(
                        "{e}; the new member {} is failed: replace it",
                        target.identity()
                    ),
                },
            );
        } else {
            self.rebuild_blocked(t, &e.to_string());
        }
        e
    }

    /// Flushes the new member, then saves its in-sync position (only while
    /// the slot still holds it).
    fn save_rebuild_position(
        &self,
        t: &membership::RebuildTicket,
        target: &MemberRef,
    ) -> Result<()> {
        target.flush().map_err(|e| {
            self.fail_slot_if(t.slot, target, &format!("flush failed: {e}"));
            ArrayError::Member {
                member: target.identity().into(),
                source: e,
            }
        })?;
        self.checkpoint_rebuild(t)
    }

    /// The same lock keys the writers of these rows take.
    pub(super) fn rebuild_lock_keys(&self, slot: usize, row: u64, end: u64) -> Vec<u64> {
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => (row..end).collect(),
            _ => (row..end)
                .map(|r| match self.geo.chunk_at(slot, r) {
                    ChunkRole::Data(c) => c,
                    _ => unreachable!("mirrors hold data only"),
                })
                .collect(),
        }
    }

    pub(super) fn rebuild_parity_rows(
        &self,
        slot: usize,
        target: &MemberRef,
        row: u64,
        end: u64,
        pool: &mut crate::buf::BufPool,
    ) -> Result<()> {
        let n = self.geo.members;
        // Every byte of a buffer taken from `pool` is read into or
        // recovered before it is used.
        loop {
            let maps: Vec<_> = (row..end).map(|s| self.geo.stripe_map(s)).collect();
            let missing: Vec<Vec<usize>> = maps
                .iter()
                .zip(row..end)
                .map(|(m, s)| {
                    (0..n)
                        .filter(|&i| !self.readable(m.members[i], s))
                        .collect()
                })
                .collect();
            if missing
                .iter()
                .any(|m| m.len() > self.geo.level.parity_chunks())
            {
                return Err(self.failed_error());
            }
            // Every present chunk of every stripe of the batch, in one submission.
            let wanted: Vec<(usize, usize)> = (0..maps.len())
                .flat_map(|k| {
                    (0..n)
                        .filter(|i| !missing[k].contains(i))
                        .map(move |i| (k, i))
                        .collect::<Vec<_>>()
                })
                .collect();
            let places: Vec<(usize, u64)> = wanted
                .iter()
                .map(|&(k, i)| (maps[k].members[i], self.row_offset_of(row + k as u64)))
                .collect();
            let mut got = pool.take(places.len());
            if let Err(failed) = self.read_places_into(&places, &mut got) {
                pool.put(got);
                self.fail_slots(failed, "read error during rebuild");
                continue;
            }
            // The chunks as read, in `wanted`'s order (stripe by stripe,
            // present chunks ascending); another buffer only where a chunk
            // is missing, for the recovery to fill.
            let mut got = got.into_iter();
            let mut bufs: Vec<Vec<AlignedBuf>> = missing
                .iter()
                .map(|miss| {
                    (0..n)
                        .map(|i| match miss.contains(&i) {
                            true => pool.take_one(),
                            false => got.next().expect("a read for each present chunk"),
                        })
                        .collect()
                })
                .collect();
            debug_assert!(got.next().is_none());
            {
                let mut jobs: Vec<RecoverJob> = bufs
                    .iter_mut()
                    .zip(&missing)
                    .map(|(stripe, miss)| RecoverJob {
                        chunks: stripe.iter_mut().map(|b| &mut b[..]).collect(),
                        missing: miss.clone(),
                    })
                    .collect();
                let kind = if self.geo.level == Level::Raid6 {
                    crate::parity::ParityKind::PQ
                } else {
                    crate::parity::ParityKind::P
                };
                self.engine.recover_batch(kind, &mut jobs)?;
            }
            let outs: Vec<(&[u8], u64)> = bufs
                .iter()
                .zip(&maps)
                .enumerate()
                .map(|(k, (stripe, map))| {
                    let i = map.members.iter().position(|&m| m == slot).unwrap();
                    (&stripe[i][..], self.row_offset_of(row + k as u64))
                })
                .collect();
            let written = self.write_target(slot, target, &outs);
            drop(outs);
            pool.put(bufs.into_iter().flatten());
            return written;
        }
    }

    /// Writes rebuilt chunks to the new member; an error fails it and ends
    /// the rebuild.
    fn write_target(&self, slot: usize, target: &MemberRef, outs: &[(&[u8], u64)]) -> Result<()> {
        let tmembers = std::slice::from_ref(target);
        let mut writes: Vec<MemberIo> = outs
            .iter()
            .map(|&(b, offset)| MemberIo {
                member: 0,
                offset,
                op: IoOp::Write(b),
            })
            .collect();
        for r in submit(tmembers, &mut writes) {
            if let Err(e) = r {
                self.fail_slot_if(slot, target, &format!("write error during rebuild: {e}"));
                return Err(ArrayError::Member {
                    member: target.identity().into(),
                    source: e,
                });
            }
        }
        Ok(())
    }

    fn row_offset_of(&self, row: u64) -> u64 {
        self.data_offset + row * self.geo.chunk
    }

    pub(super) fn rebuild_mirror_rows(
        &self,
        slot: usize,
        target: &MemberRef,
        row: u64,
        end: u64,
    ) -> Result<()> {
        let chunk = self.geo.chunk as usize;
        loop {
            let mut places = Vec::new();
            for r in row..end {
                let ChunkRole::Data(c) = self.geo.chunk_at(slot, r) else {
                    unreachable!("mirrors hold data only")
                };
                let src = self
                    .geo
                    .chunk_copies(c)
                    .into_iter()
                    .find(|p| {
                        p.member != slot && self.readable(p.member, p.offset / self.geo.chunk)
                    })
                    .ok_or_else(|| self.failed_error())?;
                places.push((src.member, self.data_offset + src.offset));
            }
            let bufs = match self.read_places(&places, chunk) {
                Ok(b) => b,
                Err(failed) => {
                    self.fail_slots(failed, "read error during rebuild");
                    continue;
                }
            };
            let outs: Vec<(&[u8], u64)> = bufs
                .iter()
                .zip(row..end)
                .map(|(b, r)| (&b[..], self.row_offset_of(r)))
                .collect();
            return self.write_target(slot, target, &outs);
        }
    }
}
