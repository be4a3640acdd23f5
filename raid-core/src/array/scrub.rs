//! Scrub: read every stripe (or mirrored chunk), check that redundancy
//! agrees with data, report mismatches by stripe and member, and with
//! `repair` fix them. Online: each step of a run (256 KiB of each member,
//! `runs::STEP_BYTES`, or the stripes a GPU engine asks for in one call)
//! holds its stripe (or chunk) locks while it is read, checked and
//! repaired, so writers wait only for that step. A batch is
//! cut into `parallel` runs of `batch_rows`, checked side by side as a
//! rebuild's are (`runs.rs`): one run's reads in flight while another's
//! parity is recomputed. Rows of holes are judged without the locks: a
//! write that lands there meanwhile is left unchecked, never misjudged.
//!
//! Repair rules:
//! - RAID6: the syndromes locate a single bad chunk in each sector of the
//!   columns (512 bytes, judged one by one, so faults in different chunks
//!   at different places are each found). With Pd = P ^ P(data) and Qd =
//!   Q ^ Q(data): only Pd set -> P is bad; only Qd set -> Q is bad; both
//!   set and Qd = g^z * Pd in every byte for one z < n -> data chunk z is
//!   bad and is repaired as Dz ^ Pd. Anything else (several bad chunks in
//!   one sector) cannot be located: the parity is rewritten from the data
//!   there, and the finding says it is unresolved.
//! - RAID5: one parity cannot say which chunk is wrong: the parity is
//!   rewritten from the data (md's rule).
//! - RAID1/10: the first readable copy is taken as the truth and copied over
//!   the others (md's rule).

use super::runs;
use super::step_io::StepJob;
use super::*;
use crate::buf::AlignedBuf;
use crate::parity::gf;
use std::time::Instant;

/// How a scrub runs.
#[derive(Clone, Debug)]
pub struct ScrubOptions {
    pub repair: bool,
    /// Most bytes read per second from all members together (None: no limit).
    pub rate_limit: Option<u64>,
    /// Rows per run. A run is checked a step at a time (256 KiB of each
    /// member, or the parity engine's batch where it asks for larger ones:
    /// a GPU's), each step's rows locked while it is.
    pub batch_rows: u64,
    /// Runs of `batch_rows` checked side by side, each on a thread (each
    /// locking a step of its rows at a time); 1: one at a time. By default the
    /// cores, at most 4 (as a rebuild's). A scrub on a rayon thread runs
    /// them one at a time whatever this says.
    pub parallel: usize,
    /// A rate the operator can change while the scrub runs (bytes per
    /// second, 0: none); replaces `rate_limit` when set.
    pub live_rate: Option<Arc<AtomicU64>>,
    /// Where to publish the rows checked so far (for a status display).
    pub progress: Option<Arc<AtomicU64>>,
    /// The shortest run of holes on every member, in bytes per member,
    /// that the scrub skips rather than reads (`RebuildOptions::hole_bytes`).
    pub hole_bytes: u64,
}

impl Default for ScrubOptions {
    fn default() -> Self {
        ScrubOptions {
            repair: false,
            rate_limit: None,
            batch_rows: 16,
            parallel: RebuildOptions::default().parallel,
            live_rate: None,
            progress: None,
            hole_bytes: super::skip_holes::HOLE_BYTES,
        }
    }
}

/// Mismatches a `scrub_finished` event names (the rest are in the log).
pub const SCRUB_FINDINGS_SAID: usize = 4;

/// One inconsistency found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Stripe (RAID5/6) or logical chunk (mirrors).
    pub stripe: u64,
    /// The slot found to hold the wrong chunk (a RAID6 chunk located by
    /// its syndromes, a mirror's copy that differs from a majority of
    /// three or more); None where nothing says which chunk is wrong
    /// (RAID5, two copies that differ, a RAID6 stretch with more than one
    /// chunk wrong).
    pub slot: Option<usize>,
    /// What was decided.
    pub what: String,
    pub repaired: bool,
    /// Whether the wrong chunk was found (RAID6's syndromes, a mirror's
    /// majority): where not (RAID5, two copies, more than one chunk
    /// wrong), a repair makes the redundancy agree with the data, which
    /// may be the bad part.
    pub located: bool,
    /// More chunks were wrong than the level can locate (RAID6: two or
    /// more in one sector): a repair made the parity agree with data that
    /// may itself be wrong there.
    pub unresolved: bool,
}

/// What a scrub found.
#[derive(Clone, Debug, Default)]
pub struct ScrubReport {
    /// Rows checked, up to the end of the last batch checked whole. A
    /// scrub that ended with an error may have found (and repaired)
    /// mismatches past it, in the runs of its last batch.
    pub rows: u64,
    pub bytes_read: u64,
    pub mismatches: Vec<Mismatch>,
    pub interrupted: bool,
}

impl ScrubReport {
    /// The findings from `from` on were not repaired after all: their
    /// write failed (the scrub then ends with that error). Kept in the
    /// report, and so in the run's event, which used to lose them.
    fn unrepaired_from(&mut self, from: usize) {
        for m in &mut self.mismatches[from..] {
            m.repaired = false;
        }
    }
}

impl Array {
    /// Rows a scrub goes through (stripes; mirrored chunks for RAID1/10).
    pub fn scrub_rows(&self) -> u64 {
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => self.geo.rows(),
            _ => self.capacity() / self.geo.chunk,
        }
    }

    /// Whether a scrub can run now: with a member missing or out of sync
    /// there is nothing to check against. Asked again by the scrub itself;
    /// asked first by `start_scrub`, so a scrub in the background that
    /// cannot run is refused to its caller, not only logged.
    pub(super) fn scrub_possible(&self) -> Result<()> {
        if self.state() != ArrayState::Optimal {
            // Nothing to wait for where a slot has no member to rebuild
            // onto (a rebuild of another slot leaves it degraded).
            let failed = self.slots.iter().any(|s| s.state() == SlotState::Failed);
            let next = if failed || self.rebuilding_slots().is_empty() {
                format!("raidctl replace {} FAILED NEW_DEVICE first", self.name)
            } else {
                format!("raidctl wait {} for the rebuild first", self.name)
            };
            return Err(ArrayError::Refused {
                rule: Rule::WrongSlotState,
                detail: format!(
                    "array '{}' is {}: scrub needs every member in sync ({next})",
                    self.name,
                    self.state().name(),
                ),
            });
        }
        if self.resync.pending() {
            // It would find the stripes a crash tore, which the resync
            // makes agree, and judge mirrors by other rules than it does.
            return Err(ArrayError::Refused {
                rule: Rule::WrongSlotState,
                detail: format!(
                    "array '{}' is resyncing the regions an unclean stop left: scrub once it ends (raidctl wait {} waits for it)",
                    self.name, self.name
                ),
            });
        }
        Ok(())
    }

    /// Checks (and with `repair`, fixes) every stripe. The array must be
    /// optimal: with a member missing, there is nothing to check against.
    pub fn scrub(&self, opts: &ScrubOptions, stop: &AtomicBool) -> Result<ScrubReport> {
        self.scrub_possible()?;
        if self.geo.level == Level::Raid0 {
            return Err(ArrayError::Invalid(
                "RAID0 has no redundancy to check".into(),
            ));
        }
        let mut report = ScrubReport::default();
        let rows = self.scrub_rows();
        // Every batch is checked against this: a member that failed or was
        // replaced since is not in sync, and nothing is judged (let alone
        // repaired) from what it holds.
        let epoch = self.membership_epoch();
        let repair = opts.repair;
        // A run's findings, with the error that ended it (what it found
        // before counts). Once a run has erred, the runs not yet begun
        // do nothing: the scrub ends with this batch.
        let erred = AtomicBool::new(false);
        let work = |(lo, hi): runs::Run, pool: &mut crate::buf::BufPool| {
            let mut found = ScrubReport::default();
            if erred.load(Ordering::Acquire) {
                return Ok((found, Ok(())));
            }
            // Rows every member holds holes on are skipped (`skip_holes.rs`).
            let spans = self.scrub_spans((lo, hi), opts.hole_bytes);
            let data = spans.into_iter().filter(|&(_, _, h)| !h);
            let step = runs::step_rows(runs::STEP_BYTES, self.geo.chunk, hi - lo, false).max(
                match self.geo.level {
                    Level::Raid5 | Level::Raid6 => {
                        self.engine.preferred_batch(self.geo.stripe_data_bytes()) as u64
                    }
                    _ => 1,
                },
            );
            let steps = data.flat_map(|(a, b, _)| runs::runs_of((a, b), step));
            let r = steps.into_iter().try_for_each(|(a, b)| {
                let _held = self.locks.lock(a..b);
                match self.geo.level {
                    Level::Raid5 | Level::Raid6 => {
                        self.scrub_stripes(a..b, repair, epoch, &mut found, pool)
                    }
                    _ => self.scrub_chunks(a..b, repair, epoch, &mut found, pool),
                }
            });
            if r.is_err() {
                erred.store(true, Ordering::Release);
            }
            Ok((found, r))
        };
        let (run_rows, batch) = runs::run_and_batch_rows(opts.batch_rows, opts.parallel);
        tracing::info!(array = %self.name, rows, repair = opts.repair, "scrub started");
        let r = std::thread::scope(|sc| {
            let mut runs = self.run_threads(sc, (run_rows, batch), "scrub-run", &work);
            self.scrub_batches(opts, stop, (batch, run_rows), &mut runs, &mut report)
        });
        if let Err(e) = r {
            self.record_scrub_end(&report, Some(&e));
            return Err(e);
        }
        self.record_scrub_end(&report, None);
        tracing::info!(array = %self.name, rows = report.rows, mismatches = report.mismatches.len(), "scrub finished");
        Ok(report)
    }

    /// The scrub's batches (`batch` rows each, in runs of `run_rows`),
    /// their findings added to `report`.
    fn scrub_batches(
        &self,
        opts: &ScrubOptions,
        stop: &AtomicBool,
        (batch, run_rows): (u64, u64),
        runs: &mut runs::RunThreads<'_, (ScrubReport, Result<()>)>,
        report: &mut ScrubReport,
    ) -> Result<()> {
        let rows = self.scrub_rows();
        let mut next_report = 0;
        let mut row = 0;
        while row < rows {
            if stop.load(Ordering::Acquire) {
                report.interrupted = true;
                break;
            }
            let end = (row + batch).min(rows);
            let (began, read_before) = (Instant::now(), report.bytes_read);
            // Its runs lock their own steps' rows.
            let mut failed = None;
            for r in runs.batch((row, end), run_rows) {
                let (found, ended) = r.unwrap_or_else(|e| (ScrubReport::default(), Err(e)));
                report.bytes_read += found.bytes_read;
                report.mismatches.extend(found.mismatches);
                if failed.is_none() {
                    failed = ended.err();
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
            report.rows = end;
            if let Some(p) = &opts.progress {
                p.store(end, Ordering::Release);
            }
            row = end;
            let pct = row * 100 / rows;
            if pct >= next_report {
                tracing::info!(array = %self.name, percent = pct, mismatches = report.mismatches.len(), "scrub progress");
                next_report = pct + 10;
            }
            pace(
                opts.rate_limit,
                &opts.live_rate,
                report.bytes_read - read_before,
                began,
                &|| stop.load(Ordering::Acquire),
            );
        }
        Ok(())
    }

    /// One event per scrub run, whatever it found.
    fn record_scrub_end(&self, report: &ScrubReport, error: Option<&ArrayError>) {
        let findings = report
            .mismatches
            .iter()
            .take(SCRUB_FINDINGS_SAID)
            .map(|m| {
                let slot = m
                    .slot
                    .map_or(String::new(), |i| format!(" {}", self.slot_name(i)));
                format!("stripe {}{slot}: {}", m.stripe, m.what)
            })
            .collect();
        let mut meta = self.meta.lock();
        self.record(
            &mut meta,
            ArrayEvent::ScrubFinished {
                rows: report.rows,
                mismatches: report.mismatches.len() as u64,
                repaired: report.mismatches.iter().filter(|m| m.repaired).count() as u64,
                unresolved: report.mismatches.iter().filter(|m| m.unresolved).count() as u64,
                undecided: match self.geo.level {
                    Level::Raid1 | Level::Raid10 => {
                        report.mismatches.iter().filter(|m| !m.located).count() as u64
                    }
                    _ => 0,
                },
                interrupted: report.interrupted,
                error: error.map(|e| e.to_string()),
                findings,
            },
        );
    }

    /// Whether membership is what it was when the scrub began; if not, the
    /// scrub stops before judging what it read.
    fn scrub_still_in_sync(&self, epoch: u64) -> Result<()> {
        if self.membership_epoch() == epoch && self.state() == ArrayState::Optimal {
            return Ok(());
        }
        Err(ArrayError::Invalid(format!(
            "scrub stopped: the members of '{}' changed while it ran (a member failed or was replaced); nothing was judged or repaired from a member not in sync. Scrub again once the array is optimal",
            self.name
        )))
    }

    /// Checks a step of stripes: every chunk read in one submission, the
    /// parity of all of them recomputed in one batched engine call (as
    /// many stripes as a GPU engine asks for, where one runs), then each
    /// stripe judged on its own.
    fn scrub_stripes(
        &self,
        rows: std::ops::Range<u64>,
        repair: bool,
        epoch: u64,
        report: &mut ScrubReport,
        pool: &mut crate::buf::BufPool,
    ) -> Result<()> {
        self.scrub_still_in_sync(epoch)?;
        let np = self.geo.level.parity_chunks();
        let width = self.geo.data_chunks() + np;
        let checked = || self.scrub_still_in_sync(epoch);
        self.with_stripe_step(
            StepJob::Scrub,
            rows.clone(),
            pool,
            checked,
            |places, chunks, parity| {
                report.bytes_read += self.geo.chunk * places.len() as u64;
                let mut fresh = parity.chunks_mut(np);
                for (s, st) in rows.zip(chunks.chunks_mut(width)) {
                    let par = fresh.next().expect("one per stripe");
                    let (p, q) = match par {
                        [p] => (p, None),
                        [p, q] => (p, Some(q)),
                        _ => unreachable!("RAID5/6"),
                    };
                    self.judge_stripe(s, st, p, q, repair, report)?;
                }
                Ok(())
            },
        )
    }

    /// Compares a stripe's parity on disk with `p` (and `q`), the parity
    /// recomputed from its data; on a mismatch decides which chunk is
    /// wrong and, with `repair`, rewrites it.
    fn judge_stripe(
        &self,
        s: u64,
        chunks: &mut [AlignedBuf],
        p: &mut AlignedBuf,
        q: Option<&mut AlignedBuf>,
        repair: bool,
        report: &mut ScrubReport,
    ) -> Result<()> {
        let map = self.geo.stripe_map(s);
        let nd = self.geo.data_chunks();
        let off = self.data_offset + s * self.geo.chunk;
        let mut no_q = AlignedBuf::new(0);
        let q = q.unwrap_or(&mut no_q);
        // p, q become the syndromes Pd, Qd.
        let p_bad = parity_io::xor_into_nonzero(p, &chunks[nd]);
        let q_bad =
            self.geo.level == Level::Raid6 && parity_io::xor_into_nonzero(q, &chunks[nd + 1]);
        if !p_bad && !q_bad {
            return Ok(());
        }
        if self.geo.level == Level::Raid5 {
            // One parity cannot say which chunk is wrong (md's rule):
            // the parity is made to agree with the data. No member named:
            // P's own is no likelier the bad one than any other.
            if repair {
                xor_slice(&mut chunks[nd], p);
            }
            let what = if repair {
                "P disagrees with the data: P rewritten (RAID5 cannot locate the bad chunk)"
            } else {
                "P disagrees with the data (RAID5 cannot locate the bad chunk; repair rewrites P)"
            };
            tracing::warn!(array = %self.name, stripe = s, "{what}");
            let from = report.mismatches.len();
            report.mismatches.push(Mismatch {
                stripe: s,
                slot: None,
                what: what.into(),
                repaired: repair,
                located: false,
                unresolved: false,
            });
            if repair {
                let written = self.scrub_write(StepJob::Scrub, map.members[nd], off, &chunks[nd]);
                return written.inspect_err(|_| report.unrepaired_from(from));
            }
            return Ok(());
        }
        // RAID6: each sector of the columns located on its own.
        let found = judge_units(p, q, nd);
        let mut touched = vec![false; chunks.len()];
        if repair {
            for (c, r) in &found {
                let mut fix = |i: usize, d: &[u8]| {
                    xor_slice(&mut chunks[i][r.clone()], &d[r.clone()]);
                    touched[i] = true;
                };
                match *c {
                    Culprit::Data(z) => fix(z, p),
                    Culprit::P => fix(nd, p),
                    Culprit::Q => fix(nd + 1, q),
                    Culprit::Unknown => {
                        fix(nd, p);
                        fix(nd + 1, q);
                    }
                }
            }
        }
        // One finding per culprit, with every stretch it was found in.
        let from = report.mismatches.len();
        let mut culprits: Vec<Culprit> = Vec::new();
        for (c, _) in &found {
            if !culprits.contains(c) {
                culprits.push(*c);
            }
        }
        for c in culprits {
            let at = stretches(found.iter().filter(|(x, _)| *x == c).map(|(_, r)| r));
            let (slot, what) = match c {
                Culprit::Data(z) => (
                    Some(map.members[z]),
                    format!("data chunk {z} is corrupt at {at} (located by the P and Q syndromes)"),
                ),
                Culprit::P => (
                    Some(map.members[nd]),
                    format!("P is corrupt at {at} (Q agrees with the data)"),
                ),
                Culprit::Q => (
                    Some(map.members[nd + 1]),
                    format!("Q is corrupt at {at} (P agrees with the data)"),
                ),
                Culprit::Unknown if repair => (
                    None,
                    format!("more than one chunk disagrees at {at}: cannot locate; P and Q rewritten there from the data, which may itself be wrong"),
                ),
                Culprit::Unknown => (
                    None,
                    format!("more than one chunk disagrees at {at}: cannot locate (repair rewrites P and Q there from the data)"),
                ),
            };
            tracing::warn!(array = %self.name, stripe = s, slot, "{what}");
            report.mismatches.push(Mismatch {
                stripe: s,
                slot,
                what,
                repaired: repair,
                located: c != Culprit::Unknown,
                unresolved: c == Culprit::Unknown,
            });
        }
        // Written after the findings are in the report: one whose write
        // fails ends the scrub, and the findings say they were not repaired.
        for (i, _) in touched.iter().enumerate().filter(|(_, &t)| t) {
            if let Err(e) = self.scrub_write(StepJob::Scrub, map.members[i], off, &chunks[i]) {
                report.unrepaired_from(from);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Checks a step of a mirror's chunks: every copy of each read in one
    /// submission, into buffers the run keeps, then each chunk's copies
    /// compared (`judge_copies`).
    fn scrub_chunks(
        &self,
        chunks: std::ops::Range<u64>,
        repair: bool,
        epoch: u64,
        report: &mut ScrubReport,
        pool: &mut crate::buf::BufPool,
    ) -> Result<()> {
        self.scrub_still_in_sync(epoch)?;
        let copies: Vec<_> = chunks.clone().map(|c| self.geo.chunk_copies(c)).collect();
        let places: Vec<(usize, u64)> = copies
            .iter()
            .flatten()
            .map(|p| (p.member, self.data_offset + p.offset))
            .collect();
        // Every byte of a buffer taken from `pool` is read into before it
        // is looked at.
        let mut bufs = pool.take(places.len());
        let read = self
            .scrub_read_into(StepJob::Scrub, &places, &mut bufs)
            .and_then(|()| self.scrub_still_in_sync(epoch));
        let judged = read.and_then(|()| {
            report.bytes_read += self.geo.chunk * places.len() as u64;
            let mut at = 0;
            chunks.zip(&copies).try_for_each(|(c, cs)| {
                let n = cs.len();
                let r = self.judge_copies(
                    c,
                    cs,
                    (&places[at..at + n], &bufs[at..at + n]),
                    repair,
                    report,
                );
                at += n;
                r
            })
        });
        pool.put(bufs);
        judged
    }

    /// Compares a mirror chunk's copies (`copies`, read from `places` into
    /// `bufs`); on a mismatch says which is wrong where a majority agrees
    /// and, with `repair`, writes the right one over the others.
    fn judge_copies(
        &self,
        c: u64,
        copies: &[crate::layout::Place],
        (places, bufs): (&[(usize, u64)], &[AlignedBuf]),
        repair: bool,
        report: &mut ScrubReport,
    ) -> Result<()> {
        if bufs[1..].iter().all(|b| b[..] == bufs[0][..]) {
            return Ok(());
        }
        // The copy more than half of them hold (three copies or more),
        // if any: the others are the wrong ones. Two that differ (or no
        // majority) say nothing of which is right: the first is kept, as
        // md's repair does, and no member is named.
        let agreeing = |k: usize| bufs.iter().filter(|b| b[..] == bufs[k][..]).count();
        let majority = (0..bufs.len()).find(|&k| agreeing(k) * 2 > bufs.len());
        let (truth, located) = majority.map_or((0, false), |k| (k, true));
        for (k, b) in bufs.iter().enumerate() {
            if b[..] == bufs[truth][..] {
                continue;
            }
            let slot = copies[k].member;
            let what = match located {
                true => format!(
                    "copy on slot {slot} differs from the {} other copies, which agree{}",
                    agreeing(truth),
                    if repair {
                        ": theirs written over it"
                    } else {
                        " (repair writes theirs over it)"
                    }
                ),
                false => format!(
                    "the copies on slots {} and {slot} differ, and nothing says which is right{}",
                    copies[truth].member,
                    if repair {
                        format!(
                            ": slot {}'s (the first) written over the other",
                            copies[truth].member
                        )
                    } else {
                        format!(
                            " (repair writes slot {}'s, the first, over the other)",
                            copies[truth].member
                        )
                    }
                ),
            };
            tracing::warn!(array = %self.name, chunk = c, slot, "{what}");
            let from = report.mismatches.len();
            report.mismatches.push(Mismatch {
                stripe: c,
                slot: located.then_some(slot),
                what,
                repaired: repair,
                located,
                unresolved: false,
            });
            if repair {
                if let Err(e) = self.scrub_write(StepJob::Scrub, slot, places[k].1, &bufs[truth]) {
                    report.unrepaired_from(from);
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

fn xor_slice(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

/// Bytes of a stripe's columns located together: a sector. Each is
/// judged on its own (md's raid6check does it per page), so that faults
/// in different chunks at different places of one stripe are each found
/// and repaired; all the differing bytes of one sector must point at the
/// same chunk, which a fault in two chunks there almost never does.
const LOCATE_UNIT: usize = 512;

/// Which chunk a RAID6 sector's syndromes point at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Culprit {
    /// Data chunk z: repaired as Dz ^ Pd.
    Data(usize),
    P,
    Q,
    /// More than one chunk: nothing says which; P and Q are rewritten
    /// from the data.
    Unknown,
}

/// The stretches of a stripe's columns whose syndromes are not zero, in
/// column order, each with the chunk it points at (neighbouring sectors
/// that point at the same chunk merged).
fn judge_units(pd: &[u8], qd: &[u8], n_data: usize) -> Vec<(Culprit, std::ops::Range<usize>)> {
    let mut out: Vec<(Culprit, std::ops::Range<usize>)> = Vec::new();
    for at in (0..pd.len()).step_by(LOCATE_UNIT) {
        let end = (at + LOCATE_UNIT).min(pd.len());
        let (p, q) = (&pd[at..end], &qd[at..end]);
        let c = match (p.iter().any(|&b| b != 0), q.iter().any(|&b| b != 0)) {
            (false, false) => continue,
            (true, false) => Culprit::P,
            (false, true) => Culprit::Q,
            (true, true) => locate(p, q, n_data).map_or(Culprit::Unknown, Culprit::Data),
        };
        match out.last_mut() {
            Some((last, r)) if *last == c && r.end == at => r.end = end,
            _ => out.push((c, at..end)),
        }
    }
    out
}

/// "bytes 0-511, 32768-33279 of the chunk", at most four stretches named.
fn stretches<'a>(rs: impl Iterator<Item = &'a std::ops::Range<usize>>) -> String {
    let rs: Vec<String> = rs.map(|r| format!("{}-{}", r.start, r.end - 1)).collect();
    let more = match rs.len() {
        0..=4 => String::new(),
        n => format!(" and {} more stretches", n - 4),
    };
    format!(
        "bytes {}{more} of the chunk",
        rs[..rs.len().min(4)].join(", ")
    )
}

/// The data index z with Qd = g^z * Pd in every byte, if one exists.
fn locate(pd: &[u8], qd: &[u8], n_data: usize) -> Option<usize> {
    let mut z = None;
    for (&p, &q) in pd.iter().zip(qd) {
        match (p, q) {
            (0, 0) => continue,
            (0, _) | (_, 0) => return None,
            _ => {
                let here =
                    (gf::LOG[q as usize] as usize + 255 - gf::LOG[p as usize] as usize) % 255;
                match z {
                    None => z = Some(here),
                    Some(prev) if prev != here => return None,
                    _ => {}
                }
            }
        }
    }
    z.filter(|&z| z < n_data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The syndrome is the XOR, and it is called not zero wherever one
    /// byte of it is, whichever byte.
    #[test]
    fn a_syndrome_is_zero_only_where_every_byte_is() {
        let a: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut same = a.clone();
        assert!(!parity_io::xor_into_nonzero(&mut same, &a));
        assert!(same.iter().all(|&b| b == 0));
        for at in [0, 1, 7, 8, 2047, 4095] {
            let mut b = a.clone();
            b[at] ^= 0x10;
            let mut want = b.clone();
            xor_slice(&mut want, &a);
            assert!(parity_io::xor_into_nonzero(&mut b, &a), "byte {at}");
            assert_eq!(b, want, "byte {at}");
        }
    }
}
