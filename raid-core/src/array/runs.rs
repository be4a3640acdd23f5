//! Rows of the array worked side by side: a long job's batch (a rebuild's,
//! a hot replace's copy, a scrub's), whose runs each lock a step of
//! their rows at a time, cut into runs worked on threads made once per job, each keeping its chunk
//! buffers and its io_uring (member I/O keeps one ring per thread) from
//! batch to batch, fed runs over a channel.
//!
//! Their member reads are in flight together (on drives, one run's writes
//! or parity work overlap another's reads), and where members are memory
//! the copies run on every core. A job moves its position (and lets its
//! locks go) only once every run of the batch has ended.
//!
//! The runs' threads are plain threads, not rayon's: a run may wait for
//! writers in flight (failing a member drains them), and their parity
//! work needs a rayon thread free. A job that is itself on a rayon thread
//! makes none and works its runs one after another: waiting for runs, it
//! would hold a thread their parallel parity work may need (the
//! deterministic simulation runs its lives on rayon's threads).

use super::*;
use crate::buf::BufPool;
use crossbeam_channel as channel;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// Rows [lo, hi) of the array, worked as one run.
pub(super) type Run = (u64, u64);

/// What a job does with one run: its rows, with chunk buffers its thread
/// keeps from run to run.
pub(super) type Work<'w, T> = dyn Fn(Run, &mut BufPool) -> Result<T> + Sync + 'w;

/// Member bytes a run reads per member at a time where it also writes
/// (a rebuild, a hot replace's copy), by default
/// (`RebuildOptions::step_bytes`): the run goes in steps of this, and
/// each step's writes go out in the same submission as the next step's
/// reads, so that on drives the device written is busy while the others
/// are read, where reading a whole run, then writing it, left each side
/// idle half the time (not where one disk does both: see
/// `DeviceKey::shares_a_disk_with`). A run still begins with a step
/// that reads alone and ends with one that writes alone: at 256 KiB a
/// run of 32 rows of 64 KiB (the defaults) goes in 8 steps, so those two
/// ends are 2 of 9 phases, where 512 KiB made them 2 of 5 (the rebuild
/// bench: 0.66-0.72x of the new drive's write rate became 0.72-0.79x
/// with 2 to 4 runs side by side; one run alone, whose steps' CPU time
/// is in series with the drives, lost 5-10%).
pub(super) const STEP_BYTES: u64 = 256 << 10;

/// Rows per step of a run of `run_rows` (`bytes` per member; one at
/// least): the whole run where one disk holds a device written and one
/// read (`DeviceKey::shares_a_disk_with`).
pub(super) fn step_rows(bytes: u64, chunk: u64, run_rows: u64, one_disk: bool) -> u64 {
    match one_disk {
        true => run_rows,
        false => (bytes / chunk).max(1),
    }
}

/// Most rows of a job's batch (and so most a run locked whole holds: one
/// with holes or rows skipped, whose writers wait for all of it).
pub(super) const MOST_ROWS_LOCKED: u64 = 256;

/// A job's rows per run and per batch: runs of `run_rows` (1 to 256),
/// `parallel` of them side by side (1 to 16, `sync::MOST_RUNS`: a
/// rebuilding member keeps a mark for each), at most 256 rows in all.
pub(super) fn run_and_batch_rows(run_rows: u64, parallel: usize) -> (u64, u64) {
    let run = run_rows.clamp(1, MOST_ROWS_LOCKED);
    (
        run,
        (run * parallel.clamp(1, super::sync::MOST_RUNS) as u64).min(MOST_ROWS_LOCKED),
    )
}

/// The runs' threads of one job, or none (runs on the job's own thread).
/// Dropping it ends the threads once their runs are done.
pub(super) struct RunThreads<'w, T> {
    jobs: channel::Sender<(usize, Run)>,
    results: channel::Receiver<(usize, Result<T>)>,
    threads: usize,
    work: &'w Work<'w, T>,
    /// Buffers for runs on the job's own thread.
    pool: BufPool,
}

impl Array {
    /// Starts the threads for a job's batches of `batch` rows in runs of
    /// `run_rows` in `sc`, named `name`: one per run (none where that is
    /// one, or the caller is on a rayon thread; fewer where a thread
    /// cannot be made).
    pub(super) fn run_threads<'s, 'e: 's, T: Send + 'e>(
        &'e self,
        sc: &'s std::thread::Scope<'s, 'e>,
        (run_rows, batch): (u64, u64),
        name: &str,
        work: &'e Work<'e, T>,
    ) -> RunThreads<'e, T> {
        let n = batch.div_ceil(run_rows.max(1)) as usize;
        let (jobs, jrx) = channel::unbounded::<(usize, Run)>();
        let (rtx, results) = channel::unbounded();
        let chunk = self.geo.chunk as usize;
        let mut threads = 0;
        if n > 1 && rayon::current_thread_index().is_none() {
            for _ in 0..n {
                let (jrx, rtx) = (jrx.clone(), rtx.clone());
                let what = name.to_string();
                let body = move || {
                    let mut pool = BufPool::new(chunk);
                    for (i, run) in jrx {
                        match catch_unwind(AssertUnwindSafe(|| work(run, &mut pool))) {
                            Ok(r) => drop(rtx.send((i, r))),
                            // Answered, so that the batch ends; then the
                            // panic goes on, raised again when the scope
                            // ends.
                            Err(p) => {
                                let why = format!("a {what} run panicked (the log says where); the job stopped where it was: start it again");
                                drop(rtx.send((i, Err(ArrayError::Invalid(why)))));
                                resume_unwind(p);
                            }
                        }
                    }
                };
                let b = std::thread::Builder::new().name(name.into());
                threads += usize::from(b.spawn_scoped(sc, body).is_ok());
            }
        }
        RunThreads {
            jobs,
            results,
            threads,
            work,
            pool: BufPool::new(chunk),
        }
    }
}

/// Rows [row, end) as the runs of `run_rows` a batch is worked in.
pub(super) fn runs_of((row, end): Run, run_rows: u64) -> Vec<Run> {
    (row..end)
        .step_by(run_rows.max(1) as usize)
        .map(|lo| (lo, (lo + run_rows).min(end)))
        .collect()
}

impl<T> RunThreads<'_, T> {
    /// Works rows [row, end), whose locks the caller holds (or the runs
    /// take), in runs of
    /// `run_rows` on the threads (or one after another, stopping at the
    /// first error, where there are none). Returns each run's result in
    /// row order once every run sent has ended: none is still at work when
    /// the caller gives the locks up. A run that could not be sent (every
    /// thread ended, each by a panic) is an error.
    pub(super) fn batch(&mut self, (row, end): Run, run_rows: u64) -> Vec<Result<T>> {
        let all = runs_of((row, end), run_rows);
        if self.threads == 0 || all.len() == 1 {
            let mut out = Vec::with_capacity(all.len());
            for run in all {
                let r = (self.work)(run, &mut self.pool);
                let failed = r.is_err();
                out.push(r);
                if failed {
                    break;
                }
            }
            return out;
        }
        let mut out: Vec<Option<Result<T>>> = all.iter().map(|_| None).collect();
        let mut sent = 0;
        for (i, run) in all.into_iter().enumerate() {
            if self.jobs.send((i, run)).is_err() {
                break;
            }
            sent += 1;
        }
        // Every run sent is answered (a panicking one too), or its thread
        // and every other ended: none is at work after this.
        for _ in 0..sent {
            match self.results.recv() {
                Ok((i, r)) => out[i] = Some(r),
                Err(_) => break,
            }
        }
        let gone = || {
            ArrayError::Invalid(
                "every thread of the job's runs ended (each panicked: the log says where); the job stopped where it was: start it again".into(),
            )
        };
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(gone())))
            .collect()
    }
}
