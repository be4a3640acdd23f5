//! A RAID5/6 write across two stripes that covers neither whole, on an array
//! with no member failed, missing or being rebuilt (`Array::split_on_shards`
//! says which), cut into a write per stripe, each given to the shard that owns
//! its stripe and run there as any write inside one stripe. The client's write
//! completes when its last part does, with the first error any part met (a
//! failed write may have written one stripe and not the other, as on the
//! blocking path, which writes them one after the other), and counts once in
//! the array's statistics, with its own time.
//!
//! Such writes went to the engine's blocking threads, eight then: at depth 128
//! of 128 KiB random writes (one in seven across stripes), those waited
//! behind each other while the rest overtook them, and made the tail
//! (p99 56-57 ms, against a median of 2.6-2.8 ms). On the shards every
//! write waits its turn at the drives alike: p99 21 ms, the median at the
//! mean's 9 ms (Little's law: the same 128 in flight at the same rate),
//! and 4-7% more written (the large I/O bench; `docs/benchmarks.md`).
//! Each part is a copy of its bytes, the cost of one memory copy of the
//! client's write, so that the parts live and end apart.

use super::event_loop::Shard;
use super::{answer, Request, WriteDone, WriteJob};
use crate::array::ArrayError;
use crate::buf::AlignedBuf;
use crate::stats::Started;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The client's write while its parts are in flight.
struct Whole {
    /// Parts not yet completed.
    left: usize,
    /// The first error a part met.
    error: Option<ArrayError>,
    /// The client's buffer (handed back on success) and completion.
    client: Option<(AlignedBuf, WriteDone)>,
}

impl Shard {
    /// Whether `job` is a RAID5/6 write across stripes that `split` cuts.
    pub(super) fn splits(&self, job: &WriteJob) -> bool {
        self.array
            .split_on_shards(job.offset, job.data.len() as u64)
    }

    /// Cuts `job` into one write per stripe (`splits`), each given to its
    /// stripe's owner (this shard's started here).
    pub(super) fn split(&mut self, job: WriteJob) {
        debug_assert!(!job.part, "a part is inside one stripe: never cut again");
        let WriteJob {
            offset,
            data,
            done,
            fua,
            ..
        } = job;
        // Timed from here, before the parts wait in their shards' inboxes
        // and behind writes holding their stripes (a write inside one
        // stripe is timed from its start on the shard).
        let started = Started::now();
        let sdb = self.array.geometry().stripe_data_bytes();
        let len = data.len() as u64;
        let end = offset + len;
        // Each stripe's bytes, copied: the parts live and end apart.
        let pieces: Vec<(u64, u64, AlignedBuf)> = (offset / sdb..=(end - 1) / sdb)
            .map(|s| {
                let (lo, hi) = (offset.max(s * sdb), end.min((s + 1) * sdb));
                let (pos, n) = ((lo - offset) as usize, (hi - lo) as usize);
                let mut buf = AlignedBuf::for_overwrite(n);
                buf.copy_from_slice(&data[pos..pos + n]);
                (s, lo, buf)
            })
            .collect();
        let whole = Arc::new(Mutex::new(Whole {
            left: pieces.len(),
            error: None,
            client: Some((data, done)),
        }));
        let counts = &self.blocking.counts;
        counts
            .writes_split
            .fetch_add(pieces.len() as u64 - 1, Ordering::Relaxed);
        let n = self.peers.len();
        for (s, lo, buf) in pieces {
            let (w, array) = (whole.clone(), self.array.clone());
            let part_done: WriteDone = Box::new(move |r| {
                let mut g = w.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(e) = r {
                    g.error.get_or_insert(e);
                }
                g.left -= 1;
                if g.left > 0 {
                    return;
                }
                let (data, done) = g.client.take().expect("answered once");
                let r = match g.error.take() {
                    Some(e) => Err(e),
                    None => Ok(data),
                };
                drop(g);
                array.count_client_write(len, started.took(), r.is_ok());
                answer(done, r);
            });
            let part = WriteJob {
                offset: lo,
                data: buf,
                done: part_done,
                part: true,
                fua,
            };
            let to = super::owner(s, n);
            match self.give_to_peer(to, Request::Write(part)) {
                Some(Request::Write(part)) => self.start_write(part),
                Some(Request::Read(_)) => unreachable!("given back as given"),
                None => {}
            }
        }
    }
}
