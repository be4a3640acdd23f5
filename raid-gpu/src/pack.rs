//! Cutting a call's jobs into sub-batches that fit the device.
//!
//! A sub-batch is what one submission carries: its sources must fit one
//! input buffer, its outputs one output buffer, its plan one plan buffer,
//! and its tasks (one per output piece) one dispatch dimension. A job too
//! large for a buffer on its own (very wide stripes of very large chunks) is
//! cut by column into pieces, which is correct because parity is computed
//! byte column by byte column.

use std::ops::Range;

/// Pieces are cut at multiples of this many bytes (a multiple of the
/// shader's 16-byte step and of wgpu's 4-byte copy alignment).
const PIECE_ALIGN: usize = 256;

/// The device limits a sub-batch must respect.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Most bytes in any one buffer (input, output, plan).
    pub buffer_bytes: u64,
    /// Most tasks (output pieces) in one dispatch.
    pub tasks: usize,
}

/// The sizes of a job, all that packing needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub srcs: usize,
    pub outs: usize,
    /// Terms over all of the job's rows.
    pub terms: usize,
    /// Bytes per chunk.
    pub len: usize,
}

/// A column range of one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub job: usize,
    pub range: Range<usize>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Batch {
    pub pieces: Vec<Piece>,
    pub in_bytes: u64,
    pub out_bytes: u64,
    pub tasks: usize,
    pub terms: usize,
    /// The longest piece, which sizes the dispatch.
    pub max_len: usize,
}

impl Batch {
    /// 8 words per task, 2 per term.
    pub fn plan_bytes(&self) -> u64 {
        (self.tasks as u64 * 8 + self.terms as u64 * 2) * 4
    }
}

/// Greedy, in call order: a piece goes into the current sub-batch if it
/// fits, else starts the next one.
pub(crate) fn pack(jobs: &[Shape], limits: &Limits) -> Vec<Batch> {
    let cap = limits.buffer_bytes;
    let mut out = Vec::new();
    let mut cur = Batch::default();
    for (j, s) in jobs.iter().enumerate() {
        let widest = s.srcs.max(s.outs).max(1) as u64;
        let piece_max = ((cap / widest) as usize / PIECE_ALIGN * PIECE_ALIGN).max(PIECE_ALIGN);
        let mut start = 0;
        while start < s.len {
            let end = (start + piece_max).min(s.len);
            let len = (end - start) as u64;
            let (inb, outb) = (s.srcs as u64 * len, s.outs as u64 * len);
            let fits = |b: &Batch| {
                let mut t = b.clone();
                t.tasks += s.outs;
                t.terms += s.terms;
                b.in_bytes + inb <= cap
                    && b.out_bytes + outb <= cap
                    && t.tasks <= limits.tasks
                    && t.plan_bytes().next_multiple_of(256) <= cap
            };
            if !cur.pieces.is_empty() && !fits(&cur) {
                out.push(std::mem::take(&mut cur));
            }
            cur.pieces.push(Piece {
                job: j,
                range: start..end,
            });
            cur.in_bytes += inb;
            cur.out_bytes += outb;
            cur.tasks += s.outs;
            cur.terms += s.terms;
            cur.max_len = cur.max_len.max(end - start);
            start = end;
        }
    }
    if !cur.pieces.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(jobs: &[Shape], limits: Limits) -> Vec<Batch> {
        let batches = pack(jobs, &limits);
        // Every job's columns are covered once, in order.
        let mut next = vec![0usize; jobs.len()];
        for b in &batches {
            assert!(b.in_bytes <= limits.buffer_bytes && b.out_bytes <= limits.buffer_bytes);
            assert!(b.tasks <= limits.tasks);
            assert!(b.plan_bytes() <= limits.buffer_bytes);
            for p in &b.pieces {
                assert_eq!(p.range.start, next[p.job]);
                assert_eq!(p.range.len() % 16, 0);
                next[p.job] = p.range.end;
            }
        }
        for (j, s) in jobs.iter().enumerate() {
            assert_eq!(next[j], s.len, "job {j} not covered");
        }
        batches
    }

    #[test]
    fn small_jobs_share_one_batch() {
        let jobs = vec![
            Shape {
                srcs: 8,
                outs: 2,
                terms: 16,
                len: 65536
            };
            4
        ];
        let b = check(
            &jobs,
            Limits {
                buffer_bytes: 32 << 20,
                tasks: 65535,
            },
        );
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].in_bytes, 4 * 8 * 65536);
    }

    #[test]
    fn batches_split_at_buffer_and_task_limits() {
        let jobs = vec![
            Shape {
                srcs: 8,
                outs: 2,
                terms: 16,
                len: 65536
            };
            100
        ];
        let b = check(
            &jobs,
            Limits {
                buffer_bytes: 1 << 20,
                tasks: 65535,
            },
        );
        assert_eq!(b.len(), 50, "two 512 KiB stripes per 1 MiB input buffer");
        let b = check(
            &jobs,
            Limits {
                buffer_bytes: 64 << 20,
                tasks: 10,
            },
        );
        assert_eq!(b.len(), 20, "five stripes of two outputs per 10 tasks");
    }

    #[test]
    fn a_job_larger_than_a_buffer_is_cut_by_column() {
        let jobs = [Shape {
            srcs: 30,
            outs: 2,
            terms: 60,
            len: 4 << 20,
        }];
        let b = check(
            &jobs,
            Limits {
                buffer_bytes: 16 << 20,
                tasks: 65535,
            },
        );
        assert!(b.len() >= 8, "{}", b.len());
        // Ragged lengths too.
        check(
            &[Shape {
                srcs: 3,
                outs: 1,
                terms: 3,
                len: 64 * 1001,
            }],
            Limits {
                buffer_bytes: 4096,
                tasks: 65535,
            },
        );
    }
}
