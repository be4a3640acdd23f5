//! The work the engine's blocking threads run (`Fallback`): the fallback
//! pool's requests, the finishing thread's erred writes, and the flushing
//! thread's flushes, each joined with those queued behind it.

use super::{answer, Done, Fallback};
use crate::array::Array;
use crossbeam_channel as channel;

pub(super) fn fallback_loop(array: &Array, rx: &channel::Receiver<Fallback>) {
    while let Ok(f) = rx.recv() {
        run_blocking(array, f);
    }
}

/// Runs one request on a blocking thread. A panic in the array's code is
/// a bug; the thread stays to serve what follows (the request that met it
/// is not answered).
pub(super) fn run_blocking(array: &Array, f: Fallback) {
    let run = std::panic::AssertUnwindSafe(|| blocking_work(array, f));
    if std::panic::catch_unwind(run).is_err() {
        tracing::error!("shard: a request on the blocking path panicked");
    }
}

/// Flushes for every request queued when it starts: each was asked for
/// after the writes it must cover completed, so one flush started after
/// all of them were queued covers them all. On an error, each of the
/// others gets a flush (and an error) of its own.
pub(super) fn flusher_loop(array: &Array, rx: &channel::Receiver<Done>) {
    while let Ok(first) = rx.recv() {
        flush_for(array, first, rx);
    }
}

/// One flush for `first` and every request queued behind it in `rx`.
pub(super) fn flush_for(array: &Array, first: Done, rx: &channel::Receiver<Done>) {
    let dones: Vec<Done> = rx.try_iter().collect();
    let run = std::panic::AssertUnwindSafe(|| match array.flush() {
        Ok(()) => {
            answer(first, Ok(()));
            dones.into_iter().for_each(|d| answer(d, Ok(())));
        }
        Err(e) => {
            answer(first, Err(e));
            dones.into_iter().for_each(|d| answer(d, array.flush()));
        }
    });
    if std::panic::catch_unwind(run).is_err() {
        tracing::error!("shard: a flush panicked");
    }
}

pub(super) fn blocking_work(array: &Array, f: Fallback) {
    match f {
        Fallback::Read { mut job, failed } => {
            if let Some((slot, m, e)) = &failed {
                array.direct_read_failed(*slot, m, e);
            }
            let r = array.read(job.offset, &mut job.buf).map(|()| job.buf);
            answer(job.done, r);
        }
        Fallback::Write { job, failed } => {
            for (slot, m, e) in &failed {
                array.direct_read_failed(*slot, m, e);
            }
            let r = match job.part {
                true => array.write_part(job.offset, &job.data),
                false => array.write(job.offset, &job.data),
            };
            debug_assert!(!job.fua, "made a flush after it (`Blocking::send`)");
            let r = r.map(|()| job.data);
            answer(job.done, r);
        }
        Fallback::Zeroes { offset, len, done } => answer(done, array.write_zeroes(offset, len)),
        Fallback::Finish { w, results, done } => {
            let (r, data) = w.finish(results);
            answer(done, r.map(|()| data));
        }
    }
}
