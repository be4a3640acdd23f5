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
//! merged and they start in arrival order, as before.

use super::{answer, Counts, WriteDone, WriteJob};
use crate::buf::AlignedBuf;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// `jobs` (in arrival order) as the writes to start: each run of two or
/// more that follow one another in the array merged into one.
pub(super) fn runs(jobs: VecDeque<WriteJob>, counts: &Counts) -> Vec<WriteJob> {
    let mut by_offset: Vec<WriteJob> = jobs.into();
    if by_offset.len() < 2 {
        return by_offset;
    }
    let mut order: Vec<usize> = (0..by_offset.len()).collect();
    order.sort_by_key(|&i| by_offset[i].offset);
    let end = |j: &WriteJob| j.offset + j.data.len() as u64;
    let overlap = order
        .windows(2)
        .any(|w| end(&by_offset[w[0]]) > by_offset[w[1]].offset);
    if overlap {
        return by_offset;
    }
    by_offset.sort_by_key(|j| j.offset);
    let mut out: Vec<WriteJob> = Vec::new();
    let mut run: Vec<WriteJob> = Vec::new();
    for j in by_offset {
        if run.last().is_some_and(|l| end(l) != j.offset) {
            out.push(merged(std::mem::take(&mut run), counts));
        }
        run.push(j);
    }
    out.push(merged(run, counts));
    out
}

/// One write of `run` (non-empty, each starting where the last ended),
/// whose completion answers each of them; a run of one as it is.
fn merged(mut run: Vec<WriteJob>, counts: &Counts) -> WriteJob {
    if run.len() == 1 {
        return run.pop().expect("one");
    }
    counts
        .writes_merged
        .fetch_add(run.len() as u64 - 1, Ordering::Relaxed);
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
    let done: WriteDone = Box::new(move |r| match r {
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
    });
    WriteJob { offset, data, done }
}
