//! The array's background work: a rebuild (or a hot replace's copy), a
//! scrub and the resync an unclean start owes, each on its own thread, at
//! most one of each at a time. The array
//! owns them, not its caller: whoever asks (the daemon's monitor, an
//! operator's command, a schedule) goes through here, `stop_jobs` cancels
//! and joins all of them before the array is closed, and their rate limits
//! can change while they run.
//!
//! The work itself (`rebuild`, `hot_replace_copy`, `scrub`) re-checks
//! membership at every step (see `membership`); this module only runs it.

use super::*;
use std::thread::JoinHandle;
use std::time::Instant;

/// What the rebuild thread does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyKind {
    /// Rebuild of a slot from redundancy (or a re-add's resync).
    Rebuild,
    /// Hot replace: copying an active member onto its replacement.
    HotReplace,
}

struct CopyRun {
    kind: CopyKind,
    slot: usize,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
    started: Instant,
}

struct ResyncRun {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

struct ScrubRun {
    /// Which run this is (`start_scrub` returns it; `wait_scrub` asks for it).
    id: u64,
    repair: bool,
    started: Instant,
    rows: u64,
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<ScrubReport>>,
}

/// The scrub now running or last run, and the results of runs that
/// ended unwaited-for before another started.
#[derive(Default)]
struct ScrubSlot {
    run: Option<ScrubRun>,
    /// (id, result) of runs a later `start_scrub` displaced, newest last,
    /// at most `ENDED_KEPT`: a waiter that polls after a schedule started
    /// the next run still gets its own run's report.
    ended: std::collections::VecDeque<(u64, Result<ScrubReport>)>,
}

/// How many displaced scrub results are kept for their waiters.
const ENDED_KEPT: usize = 8;

impl ScrubSlot {
    /// Joins a finished run and keeps its result for `wait_scrub`.
    fn keep(&mut self, run: ScrubRun) {
        let r = join_scrub(run.handle);
        if self.ended.len() == ENDED_KEPT {
            self.ended.pop_front();
        }
        self.ended.push_back((run.id, r));
    }
}

fn join_scrub(h: JoinHandle<Result<ScrubReport>>) -> Result<ScrubReport> {
    h.join()
        .unwrap_or_else(|_| Err(ArrayError::Invalid("the scrub thread panicked".into())))
}

/// The background work of one array.
#[derive(Default)]
pub(super) struct Jobs {
    copy: Mutex<Option<CopyRun>>,
    scrub: Mutex<ScrubSlot>,
    resync: Mutex<Option<ResyncRun>>,
    /// Rate limits, bytes per second (0: none), read at every step.
    rebuild_rate: Arc<AtomicU64>,
    scrub_rate: Arc<AtomicU64>,
    /// Numbers scrub runs.
    scrub_seq: AtomicU64,
    /// Set by `stop_jobs`: the array is closing, and no job starts again
    /// (a monitor tick must not restart the rebuild `close` just paused).
    closed: AtomicBool,
    /// The slots the running rebuild pass writes (or will, once its
    /// cursor reaches them), in the order they joined it.
    pub(super) pass: Mutex<Vec<usize>>,
    /// Rows the running rebuild pass has moved its cursor over.
    pub(super) pass_moved: AtomicU64,
}

/// A copy (rebuild or hot replace) as a status shows it.
#[derive(Clone, Debug)]
pub struct CopyProgress {
    pub kind: CopyKind,
    pub slot: usize,
    /// Other slots the same rebuild pass writes (RAID5/6: one pass reads
    /// for every member being rebuilt).
    pub with: Vec<usize>,
    /// Bytes per second written since this run started, at most its
    /// rate limit (`under_limit`).
    pub rate: f64,
}

/// A scrub as a status shows it.
#[derive(Clone, Debug)]
pub struct ScrubProgress {
    pub repair: bool,
    pub rows_done: u64,
    pub rows_total: u64,
    /// Bytes per second read from the members since it started, at most
    /// its rate limit (`under_limit`).
    pub rate: f64,
}

/// The resync an unclean start owes, as a status shows it: regions of the
/// write-intent bitmap resynced, and marked in all.
#[derive(Clone, Debug)]
pub struct ResyncProgress {
    pub regions_done: u64,
    pub regions_total: u64,
}

/// Called with the result of a finished copy, on its thread.
pub type CopyDone = Box<dyn FnOnce(&Array, Result<RebuildEnd>) + Send>;

/// Called with the report of a finished scrub, on its thread.
pub type ScrubDone = Box<dyn FnOnce(&Array, &Result<ScrubReport>) + Send>;

impl Array {
    /// The rate limits of rebuilds and hot replaces, and of scrubs, bytes
    /// per second (0: none). They apply to the work running now too.
    pub fn set_rates(&self, rebuild: Option<u64>, scrub: Option<u64>) {
        if let Some(r) = rebuild {
            self.jobs.rebuild_rate.store(r, Ordering::Release);
        }
        if let Some(r) = scrub {
            self.jobs.scrub_rate.store(r, Ordering::Release);
        }
    }

    /// The rebuild's rate limit as its work reads it at every step, also
    /// the resync's while the array is served (md paces both by one).
    pub(super) fn rebuild_rate_live(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.jobs.rebuild_rate)
    }

    /// (rebuild, scrub) rate limits, bytes per second (0: none).
    pub fn rates(&self) -> (u64, u64) {
        (
            self.jobs.rebuild_rate.load(Ordering::Acquire),
            self.jobs.scrub_rate.load(Ordering::Acquire),
        )
    }

    /// Whether a rebuild or hot replace copy runs now.
    fn copy_running(run: &Option<CopyRun>) -> bool {
        run.as_ref().is_some_and(|r| !r.handle.is_finished())
    }

    /// Starts the rebuild of the first slot that wants one, if no copy runs.
    /// Returns whether one was started.
    pub fn kick_rebuild(self: &Arc<Self>, opts: &RebuildOptions) -> bool {
        let mut run = self.jobs.copy.lock();
        if Self::copy_running(&run) || self.jobs.closed.load(Ordering::Acquire) {
            return false;
        }
        if let Some(r) = run.take() {
            let _ = r.handle.join();
        }
        let Some(slot) = self.rebuild_wanted() else {
            return false;
        };
        let stop = Arc::new(AtomicBool::new(false));
        let opts = RebuildOptions {
            live_rate: Some(self.jobs.rebuild_rate.clone()),
            ..opts.clone()
        };
        let (array, st) = (self.clone(), stop.clone());
        let handle = std::thread::spawn(move || match array.rebuild_all(&opts, &st) {
            Ok(RebuildEnd::Finished) => {}
            Ok(RebuildEnd::Interrupted) => {
                tracing::info!(array = array.name(), slot, "rebuild paused")
            }
            Err(e) => tracing::error!(array = array.name(), slot, "rebuild failed: {e}"),
        });
        *run = Some(CopyRun {
            kind: CopyKind::Rebuild,
            slot,
            stop,
            handle,
            started: Instant::now(),
        });
        true
    }

    /// Starts a hot replace of active `slot` by `new` and its copy (see
    /// `hot_replace`); `done` runs on the copy's thread when it ends.
    pub fn start_hot_replace(
        self: &Arc<Self>,
        slot: usize,
        new: MemberRef,
        opts: &RebuildOptions,
        done: CopyDone,
    ) -> Result<()> {
        let mut run = self.jobs.copy.lock();
        if self.jobs.closed.load(Ordering::Acquire) {
            return Err(ArrayError::Invalid(format!(
                "array '{}' is stopping",
                self.name
            )));
        }
        if Self::copy_running(&run) {
            return Err(ArrayError::Refused {
                rule: Rule::WrongSlotState,
                detail: format!(
                    "a rebuild or replace of '{}' is running: wait for it",
                    self.name
                ),
            });
        }
        if let Some(r) = run.take() {
            let _ = r.handle.join();
        }
        self.hot_replace(slot, new)?;
        let stop = Arc::new(AtomicBool::new(false));
        let opts = RebuildOptions {
            live_rate: Some(self.jobs.rebuild_rate.clone()),
            ..opts.clone()
        };
        let (array, st) = (self.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let r = array.hot_replace_copy(&opts, &st);
            if let Err(e) = &r {
                tracing::error!(array = array.name(), slot, "hot replace failed: {e}");
            }
            done(&array, r);
        });
        *run = Some(CopyRun {
            kind: CopyKind::HotReplace,
            slot,
            stop,
            handle,
            started: Instant::now(),
        });
        Ok(())
    }

    /// The running copy's kind, slot and rate, if one runs.
    pub fn copy_progress(&self) -> Option<CopyProgress> {
        let run = self.jobs.copy.lock();
        let r = run.as_ref().filter(|r| !r.handle.is_finished())?;
        let (slot, with, moved) = match r.kind {
            CopyKind::Rebuild => {
                let pass = self.jobs.pass.lock().clone();
                let moved = self.jobs.pass_moved.load(Ordering::Acquire);
                match pass.split_first() {
                    Some((&first, rest)) => (first, rest.to_vec(), moved),
                    None => (r.slot, Vec::new(), moved),
                }
            }
            CopyKind::HotReplace => {
                let done = self.hot_replace_progress().map(|p| p.2).unwrap_or(0);
                (r.slot, Vec::new(), done)
            }
        };
        let secs = r.started.elapsed().as_secs_f64().max(1e-3);
        Some(CopyProgress {
            kind: r.kind,
            slot,
            with,
            rate: under_limit(
                (moved * self.geo.chunk) as f64 / secs,
                &self.jobs.rebuild_rate,
            ),
        })
    }

    /// Starts a scrub in the background; refused while one runs.
    /// `done` runs on its thread with the report when it ends. Returns the
    /// run's id, for `wait_scrub`.
    pub fn start_scrub(self: &Arc<Self>, opts: &ScrubOptions, done: ScrubDone) -> Result<u64> {
        let mut job = self.jobs.scrub.lock();
        if self.jobs.closed.load(Ordering::Acquire) {
            return Err(ArrayError::Invalid(format!(
                "array '{}' is stopping",
                self.name
            )));
        }
        self.scrub_possible()?;
        if job.run.as_ref().is_some_and(|j| !j.handle.is_finished()) {
            return Err(ArrayError::Refused {
                rule: Rule::WrongSlotState,
                detail: format!(
                    "a scrub of '{n}' is already running: raidctl status {n} shows its progress, raidctl scrub {n} --cancel stops it",
                    n = self.name
                ),
            });
        }
        if let Some(old) = job.run.take() {
            job.keep(old);
        }
        let progress = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let opts = ScrubOptions {
            progress: Some(progress.clone()),
            live_rate: Some(self.jobs.scrub_rate.clone()),
            ..opts.clone()
        };
        let repair = opts.repair;
        let id = self.jobs.scrub_seq.fetch_add(1, Ordering::AcqRel) + 1;
        let (array, st) = (self.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let r = array.scrub(&opts, &st);
            done(&array, &r);
            r
        });
        job.run = Some(ScrubRun {
            id,
            repair,
            started: Instant::now(),
            rows: self.scrub_rows(),
            done: progress,
            stop,
            handle,
        });
        Ok(id)
    }

    /// Waits for scrub run `id` to end and returns its result; None when
    /// that run was cancelled (or its result was collected already).
    pub fn wait_scrub(&self, id: u64) -> Option<Result<ScrubReport>> {
        loop {
            {
                let mut job = self.jobs.scrub.lock();
                if let Some(i) = job.ended.iter().position(|(e, _)| *e == id) {
                    return job.ended.remove(i).map(|(_, r)| r);
                }
                match job.run.as_ref() {
                    Some(j) if j.id == id && j.handle.is_finished() => {
                        let j = job.run.take().expect("checked above");
                        drop(job);
                        return Some(join_scrub(j.handle));
                    }
                    Some(j) if j.id == id => {}
                    _ => return None,
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Stops the running scrub and waits for it; returns (rows checked,
    /// rows in all), or None when no scrub runs.
    pub fn cancel_scrub(&self) -> Option<(u64, u64)> {
        let mut job = self.jobs.scrub.lock();
        let j = job.run.take()?;
        if j.handle.is_finished() {
            // Ended by itself: its waiter, if any, still gets the report.
            job.keep(j);
            return None;
        }
        drop(job);
        j.stop.store(true, Ordering::Release);
        let _ = j.handle.join();
        Some((j.done.load(Ordering::Acquire), j.rows))
    }

    /// The running scrub, if one runs.
    pub fn scrub_progress(&self) -> Option<ScrubProgress> {
        let job = self.jobs.scrub.lock();
        let j = job.run.as_ref().filter(|j| !j.handle.is_finished())?;
        let done = j.done.load(Ordering::Acquire);
        let secs = j.started.elapsed().as_secs_f64().max(1e-3);
        Some(ScrubProgress {
            repair: j.repair,
            rows_done: done,
            rows_total: j.rows,
            rate: under_limit(
                (done * self.geo.chunk * self.geo.members as u64) as f64 / secs,
                &self.jobs.scrub_rate,
            ),
        })
    }

    /// Starts the resync an unclean start owes (`ResyncAt::Background`) on
    /// a thread of its own, where one is owed, can run now (a parity
    /// array's needs every member in sync) and none runs. The daemon's
    /// monitor calls it on every round; a stop leaves the resync owed, and
    /// the next start resyncs again. Not while a full filesystem stops
    /// the array's writes: its repairs would be refused, round after round
    /// (the next start, with space freed, runs it).
    pub fn kick_resync(self: &Arc<Self>) {
        let mut job = self.jobs.resync.lock();
        if job.as_ref().is_some_and(|j| !j.handle.is_finished()) {
            return;
        }
        if let Some(j) = job.take() {
            let _ = j.handle.join();
        }
        if self.jobs.closed.load(Ordering::Acquire)
            || !self.resync_runnable()
            || self.full.load(Ordering::Acquire)
        {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (a, st) = (Arc::clone(self), Arc::clone(&stop));
        let spawned = std::thread::Builder::new()
            .name("resync".into())
            .spawn(move || {
                if let Err(e) = a.resync_owed_pass(&st) {
                    tracing::error!(array = %a.name, "resync after the unclean stop ended: {e}");
                }
            });
        match spawned {
            Ok(handle) => *job = Some(ResyncRun { stop, handle }),
            Err(e) => tracing::warn!(array = %self.name, "no thread for the resync: {e}"),
        }
    }

    /// Stops every background job (a rebuild pauses at its checkpoint, a
    /// hot replace is dropped, a scrub ends, a resync stops still owed)
    /// and waits for each to end. `close` calls it first.
    pub fn stop_jobs(&self) {
        {
            // Under every lock: a start racing this either finished its
            // spawn (and is joined below) or sees `closed`.
            let _copy = self.jobs.copy.lock();
            let _scrub = self.jobs.scrub.lock();
            let _resync = self.jobs.resync.lock();
            self.jobs.closed.store(true, Ordering::Release);
        }
        // Taken out first, joined without the lock held (status reads
        // it). Both told to stop before either is joined: a resync thread
        // may wait for the pass a rebuild's end runs, which stops only
        // with the rebuild.
        let resync = self.jobs.resync.lock().take();
        let run = self.jobs.copy.lock().take();
        for stop in resync
            .iter()
            .map(|r| &r.stop)
            .chain(run.iter().map(|r| &r.stop))
        {
            stop.store(true, Ordering::Release);
        }
        if let Some(r) = resync {
            let _ = r.handle.join();
        }
        if let Some(r) = run {
            let _ = r.handle.join();
        }
        let _ = self.cancel_scrub();
    }
}

/// A rate measured since a job began, at most its limit (0: none): a
/// job's first batch runs before its first pause, so for its first
/// seconds the plain average reads far above the limit it keeps.
fn under_limit(measured: f64, limit: &AtomicU64) -> f64 {
    match limit.load(Ordering::Acquire) {
        0 => measured,
        l => measured.min(l as f64),
    }
}
