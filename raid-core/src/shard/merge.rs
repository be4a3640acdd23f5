//! Writes that waited on a shard for their stripe, merged where they meet:
//! the first piece of a stripe cache, with no delay (only writes already
//! waiting merge, when the write ahead of them ends). Small sequential
//! writes at depth, which would each read and write the stripe's parity in
//! turn, become one write of the run they make, a full-stripe write where
//! they cover the stripe.
//!
//! Each client write is answered when the merged write is, with its own
//! buffer back, or with the merged write's error. Writes in flight together
//! have no order among them (as on a drive), so the ones that do not
//! overlap may land as one; where any two waiting writes overlap, none are
//! merged and they start in arrival order, as before. Only well-formed
//! writes that stay inside the lock's stripe (chunk) merge: a bad request
//! gets its own answer, and does not make its neighbours' bad or good.
//!
//! Runs start oldest first (the run holding the write that has waited
//! longest), and the others wait again in that order, so a stream of
//! writes to one part of a stripe cannot keep another waiting for ever.

use super::{answer, Counts, WriteDone, WriteJob};
use crate::array::LocalArray;
use crate::buf::AlignedBuf;
use crate::stats::Started;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// `jobs` (oldest first) as the writes to start, oldest first: each run of
/// two or more that `fits` allows and that follow one another in the array
/// merged into one.
pub(super) fn runs(
    jobs: VecDeque<WriteJob>,
    fits: impl Fn(&WriteJob) -> bool,
    merged_into: &dyn Fn(Vec<WriteJob>) -> WriteJob,
) -> Vec<WriteJob> {
    let jobs: Vec<WriteJob> = jobs.into();
    if jobs.len() < 2 {
        return jobs;
    }
    let end = |j: &WriteJob| j.offset + j.data.len() as u64;
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| (jobs[i].offset, end(&jobs[i])));
    let overlap = order
        .windows(2)
        .any(|w| end(&jobs[w[0]]) > jobs[w[1]].offset);
    if overlap {
        return jobs;
    }
    // Runs by offset, each as the arrival indices of its writes.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &i in &order {
        let joins = groups.last().is_some_and(|g| {
            let last = &jobs[*g.last().expect("not empty")];
            fits(last) && fits(&jobs[i]) && end(last) == jobs[i].offset
        });
        match joins {
            true => groups.last_mut().expect("checked").push(i),
            false => groups.push(vec![i]),
        }
    }
    // Oldest first: by the earliest arrival in each run.
    groups.sort_by_key(|g| g.iter().min().copied());
    let mut slots: Vec<Option<WriteJob>> = jobs.into_iter().map(Some).collect();
    groups
        .into_iter()
        .map(|g| {
            let mut run: Vec<WriteJob> = g
                .iter()
                .map(|&i| slots[i].take().expect("each write in one run"))
                .collect();
            match run.len() {
                1 => run.pop().expect("one"),
                _ => merged_into(run),
            }
        })
        .collect()
}

/// One write of `run` (two or more, each starting where the last ended),
/// whose completion answers each of them: Ok with its own buffer, or the
/// merged write's error. Counted as the client writes they are in the
/// array's client statistics: the merged write counts once where it runs,
/// with its bytes and time, and the others as operations. Where some of
/// `run` are parts of writes cut by `split.rs` (which count their own),
/// the merged write is a part too, and its completion counts the client
/// writes of `run` with their own bytes, timed from the merge.
pub(super) fn merged(run: Vec<WriteJob>, array: &LocalArray, counts: &Counts) -> WriteJob {
    let n = run.len() as u64;
    counts.writes_merged.fetch_add(n - 1, Ordering::Relaxed);
    let clients = run.iter().filter(|j| !j.part).count() as u64;
    let client_bytes: u64 = run
        .iter()
        .filter(|j| !j.part)
        .map(|j| j.data.len() as u64)
        .sum();
    let has_parts = clients < n;
    // One with FUA makes the merged write one: durable for all of them.
    let fua = run.iter().any(|j| j.fua);
    // Timed only where the completion counts (a run holding a part).
    let started = has_parts.then(Started::now);
    let offset = run[0].offset;
    let len = run.iter().map(|j| j.data.len()).sum();
    let mut data = AlignedBuf::new(len);
    let mut at = 0;
    let mut parts: Vec<(WriteDone, AlignedBuf)> = Vec::with_capacity(run.len());
    for j in run {
        data[at..at + j.data.len()].copy_from_slice(&j.data);
        at += j.data.len();
        parts.push((j.done, j.data));
    }
    let array = array.clone();
    let done: WriteDone = Box::new(move |r| {
        match has_parts {
            false => array.count_merged_writes(n - 1, r.is_ok()),
            true if clients > 0 => {
                let took = started.and_then(|s| s.took());
                array.count_client_write(client_bytes, took, r.is_ok());
                array.count_merged_writes(clients - 1, r.is_ok());
            }
            true => {}
        }
        match r {
            Ok(_) => {
                for (d, b) in parts {
                    answer(d, Ok(b));
                }
            }
            Err(e) => {
                let copies: Vec<_> = (1..parts.len()).map(|_| e.again()).collect();
                for ((d, _), e) in parts.into_iter().zip(std::iter::once(e).chain(copies)) {
                    answer(d, Err(e));
                }
            }
        }
    });
    WriteJob {
        offset,
        data,
        done,
        part: has_parts,
        fua,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write of `blocks` 4 KiB blocks at block `at`, answering nothing.
    fn job(at: u64, blocks: usize) -> WriteJob {
        WriteJob::new(
            at * 4096,
            AlignedBuf::new(blocks * 4096),
            false,
            Box::new(|_| {}),
        )
    }

    /// The writes to start, as (first block, blocks), with a stand-in for
    /// the merge that only joins the ranges.
    fn plan(jobs: Vec<WriteJob>, fits: impl Fn(&WriteJob) -> bool) -> Vec<(u64, usize)> {
        let join = |run: Vec<WriteJob>| {
            let len = run.iter().map(|j| j.data.len()).sum();
            WriteJob::new(run[0].offset, AlignedBuf::new(len), false, Box::new(|_| {}))
        };
        runs(jobs.into(), fits, &join)
            .into_iter()
            .map(|j| (j.offset / 4096, j.data.len() / 4096))
            .collect()
    }

    #[test]
    fn runs_that_meet_merge_and_start_oldest_first() {
        // Arrival: 10, 0, 1, 3, then 2, which joins 0..2 and 3 into one
        // run 0..4; 10 came first.
        let jobs = vec![job(10, 1), job(0, 1), job(1, 1), job(3, 1), job(2, 1)];
        assert_eq!(plan(jobs, |_| true), vec![(10, 1), (0, 4)]);
        // A gap keeps two runs apart; the run holding the oldest write
        // starts first.
        let jobs = vec![job(5, 1), job(0, 2), job(6, 2), job(2, 1)];
        assert_eq!(plan(jobs, |_| true), vec![(5, 3), (0, 3)]);
    }

    #[test]
    fn overlapping_writes_start_unmerged_in_arrival_order() {
        let jobs = vec![job(4, 2), job(0, 1), job(1, 1), job(5, 1)];
        assert_eq!(plan(jobs, |_| true), vec![(4, 2), (0, 1), (1, 1), (5, 1)]);
    }

    #[test]
    fn a_write_that_does_not_fit_starts_alone() {
        // Block 2's write is refused by `fits` (unaligned, past the end, or
        // across the stripe): 0..2 merge, 2 and 3 start on their own.
        let jobs = vec![job(0, 1), job(1, 1), job(2, 1), job(3, 1)];
        assert_eq!(
            plan(jobs, |j| j.offset != 2 * 4096),
            vec![(0, 2), (2, 1), (3, 1)]
        );
    }

    #[test]
    fn a_stream_to_one_place_does_not_keep_another_waiting() {
        // Block 10 waits; blocks 0 and 2 are rewritten again and again,
        // one write each waiting at every release: 10 starts first.
        let jobs = vec![job(10, 1), job(0, 1), job(2, 1)];
        assert_eq!(plan(jobs, |_| true)[0], (10, 1));
    }
}
