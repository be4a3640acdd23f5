//! A rebuild's batch in runs side by side (see `rebuild.rs`): threads
//! made once per rebuild, each keeping its chunk buffers and its io_uring
//! (member I/O keeps one ring per thread) from batch to batch, fed runs
//! over a channel while the rebuild's own thread holds the batch's locks.
//!
//! The runs' threads are plain threads, not rayon's: a run may wait for
//! writers in flight (failing a member drains them), and their parity
//! work needs a rayon thread free. A rebuild that is itself on a rayon
//! thread makes none and runs its runs one after another: waiting for
//! runs, it would hold a thread their parallel parity work may need (the
//! deterministic simulation runs its lives on rayon's threads).

use super::*;
use crate::buf::BufPool;
use crossbeam_channel as channel;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// Rows [lo, hi) of the array, rebuilt as one run.
type Run = (u64, u64);

/// The runs' threads of one rebuild, or none (runs on the rebuild's own
/// thread). Dropping it ends the threads once their runs are done.
pub(super) struct RunThreads {
    jobs: channel::Sender<Run>,
    results: channel::Receiver<Result<u64>>,
    threads: usize,
    /// Buffers for runs on the rebuild's own thread.
    pool: BufPool,
}

/// What every run of one rebuild shares.
#[derive(Clone, Copy)]
pub(super) struct RunOf<'a> {
    pub slot: usize,
    pub target: &'a MemberRef,
    /// A re-added member: rows no write touched since it left are skipped.
    pub dirty_only: bool,
}

impl Array {
    /// Starts `n` runs' threads in `sc` (none where `n` is 1 or the caller
    /// is on a rayon thread; fewer where a thread cannot be made).
    pub(super) fn run_threads<'s, 'e: 's>(
        &'e self,
        sc: &'s std::thread::Scope<'s, 'e>,
        n: usize,
        of: RunOf<'e>,
    ) -> RunThreads {
        let (jobs, jrx) = channel::unbounded::<Run>();
        let (rtx, results) = channel::unbounded();
        let chunk = self.geo.chunk as usize;
        let mut threads = 0;
        if n > 1 && rayon::current_thread_index().is_none() {
            for _ in 0..n {
                let (jrx, rtx) = (jrx.clone(), rtx.clone());
                let work = move || {
                    let mut pool = BufPool::new(chunk);
                    for (lo, hi) in jrx {
                        let r = catch_unwind(AssertUnwindSafe(|| {
                            self.rebuild_run(of, lo, hi, &mut pool)
                        }));
                        match r {
                            Ok(r) => drop(rtx.send(r)),
                            // Answered, so that the batch ends; then the
                            // panic goes on, raised again when the scope
                            // ends.
                            Err(p) => {
                                let why = "a rebuild run panicked".to_string();
                                drop(rtx.send(Err(ArrayError::Invalid(why))));
                                resume_unwind(p);
                            }
                        }
                    }
                };
                let b = std::thread::Builder::new().name("rebuild-run".into());
                threads += usize::from(b.spawn_scoped(sc, work).is_ok());
            }
        }
        RunThreads {
            jobs,
            results,
            threads,
            pool: BufPool::new(chunk),
        }
    }

    /// Rebuilds rows [row, end), whose locks the caller holds, in runs of
    /// `run_rows` on `runs`' threads (or one after another where it has
    /// none). Returns the rows copied, or an error once every run ended:
    /// no run is still at work when the caller gives the locks up.
    pub(super) fn rebuild_batch(
        &self,
        runs: &mut RunThreads,
        of: RunOf<'_>,
        (row, end): Run,
        run_rows: u64,
    ) -> Result<u64> {
        let all: Vec<Run> = (row..end)
            .step_by(run_rows as usize)
            .map(|lo| (lo, (lo + run_rows).min(end)))
            .collect();
        if runs.threads == 0 || all.len() == 1 {
            let pool = &mut runs.pool;
            return all
                .into_iter()
                .map(|(lo, hi)| self.rebuild_run(of, lo, hi, pool))
                .sum();
        }
        let gone = || ArrayError::Invalid("no rebuild run thread left".into());
        let mut copied = Ok(0u64);
        let mut sent = 0;
        for r in all {
            // Refused only once every thread ended (each panicked).
            if runs.jobs.send(r).is_err() {
                copied = Err(gone());
                break;
            }
            sent += 1;
        }
        // Every run sent is answered (a panicking one too), or its thread
        // and every other ended: none is at work after this.
        for _ in 0..sent {
            let r = runs.results.recv().unwrap_or_else(|_| Err(gone()));
            copied = match (copied, r) {
                (Ok(a), Ok(b)) => Ok(a + b),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        copied
    }

    /// One run: rows [lo, hi) rebuilt onto `of.target` (or skipped, clean
    /// rows of a re-added member). Returns the rows copied.
    fn rebuild_run(&self, of: RunOf<'_>, lo: u64, hi: u64, pool: &mut BufPool) -> Result<u64> {
        if of.dirty_only && self.rows_clean(lo, hi) {
            return Ok(0);
        }
        match self.geo.level {
            Level::Raid5 | Level::Raid6 => {
                self.rebuild_parity_rows(of.slot, of.target, lo, hi, pool)?
            }
            _ => self.rebuild_mirror_rows(of.slot, of.target, lo, hi)?,
        }
        Ok(hi - lo)
    }
}
