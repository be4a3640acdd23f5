//! I/O on a member made of two devices written together (a hot replace's
//! old device and its replacement, `Member::pair`), run by a shard on each
//! device's own path (its ring, timed I/O, a copy in memory) rather than on
//! a blocking thread: a read goes to the device reads come from; a write
//! goes to both at once, and the request's I/O completes when both halves
//! are in, with the outcome the pair's own `write_at` would give
//! (`joined`). Without this, every request touching the slot of a long
//! hot replace waited for a thread of the small fallback pool.

use super::event_loop::{non_blocking, ud, Shard, NOT_SERVED};
use super::ops::Op;
use crate::member::{IoKind, MemberRef, Pair};
use std::io;

/// A write in flight to both devices of a pair.
pub(super) struct PairOp {
    /// The request's I/O this write is (its user_data).
    parent: u64,
    /// Bytes each half was asked to move.
    len: usize,
    /// The pair: its rule for the second device's error, and its two
    /// devices, which it holds (their fds stay open while the halves are
    /// in flight).
    pair: MemberRef,
    /// Each half's result, once in (as `Shard::complete` takes them).
    results: [Option<Option<i32>>; 2],
}

/// Whether a shard can run every I/O of pair `p` without blocking: both
/// its devices can (which of them an I/O goes to changes only to fewer,
/// as the replacement is dropped or takes the slot).
pub(super) fn pair_non_blocking(p: &dyn Pair) -> bool {
    p.devices().iter().all(|d| non_blocking(d.as_ref()))
}

impl Shard {
    /// Starts I/O `ud` on member `m`, a pair (as `start_io`).
    ///
    /// # Safety
    /// As `start_io`'s: the buffer stays put and alive until I/O `ud`'s
    /// completion is reaped, which is after both halves' are.
    pub(super) unsafe fn start_pair_io(
        &mut self,
        ud_: u64,
        m: &MemberRef,
        kind: IoKind,
        ptr: *mut u8,
        len: usize,
        at: u64,
    ) {
        let p = m.pair().expect("a pair member");
        if kind == IoKind::Read {
            // SAFETY: the caller's promise; the device is held by the
            // pair, which the request holds.
            return unsafe { self.start_io(ud_, p.read_from(), kind, ptr, len, at) };
        }
        let (first, second) = p.write_to(at);
        let Some(second) = second else {
            // SAFETY: as above.
            return unsafe { self.start_io(ud_, first, kind, ptr, len, at) };
        };
        let op = PairOp {
            parent: ud_,
            len,
            pair: m.clone(),
            results: [None, None],
        };
        let k = self.key(Op::Pair(Box::new(op)));
        // SAFETY: the caller's promise for both halves: the same bytes,
        // only read by both; each half's device is held by the pair, which
        // the pair's entry in the slab holds until both have completed,
        // and the request's I/O completes (its buffer may go) only then.
        unsafe {
            self.start_io(ud(k, 0), first, kind, ptr, len, at);
            self.start_io(ud(k, 1), second, kind, ptr, len, at);
        }
    }

    /// Half `sub` of pair write `k` completed (`res` as in
    /// `Shard::complete`): once both are in, the request's I/O completes.
    pub(super) fn pair_io_done(&mut self, k: usize, sub: usize, res: Option<i32>) {
        let Some(Op::Pair(op)) = self.slab[k].as_mut() else {
            unreachable!("a pair write in flight")
        };
        op.results[sub] = Some(res);
        if op.results.iter().any(Option::is_none) {
            return;
        }
        let Op::Pair(op) = self.remove(k) else {
            unreachable!("a pair write")
        };
        let [first, second] = op.results.map(|r| r.expect("both in"));
        let p = op.pair.pair().expect("a pair member");
        let res = joined(op.len, first, second, p);
        self.complete(op.parent, res);
    }
}

/// What moved, as `Shard::complete` takes results: bytes, or the errno,
/// or `None` where the device could not start the I/O.
fn moved(len: usize, r: Option<i32>) -> Result<usize, Option<i32>> {
    match r {
        None => Ok(len),
        Some(NOT_SERVED) => Err(None),
        Some(r) if r < 0 => Err(Some(-r)),
        Some(r) => Ok(r as usize),
    }
}

/// The request's result for a write of `len` bytes to both devices of
/// pair `p`, from each half's: the first device's, where the second moved
/// as much; the fewer bytes where the second moved fewer (the rest goes
/// again, to both); where the second failed (or moved nothing while the
/// first moved some, or could not start: a device no longer servable
/// here), what the pair says: nothing against the write (the replacement
/// is dropped, the safe side of a doubt) or, once its errors are the
/// write's, its error.
pub(super) fn joined(
    len: usize,
    first: Option<i32>,
    second: Option<i32>,
    p: &dyn Pair,
) -> Option<i32> {
    let first = moved(len, first);
    let cap = match moved(len, second) {
        Ok(b) if b > 0 || first == Ok(0) => Some(b),
        second => {
            let errno = match second {
                Err(Some(errno)) => errno,
                _ => libc::EIO,
            };
            if let Err(e) = p.second_failed(io::Error::from_raw_os_error(errno)) {
                return Some(-e.raw_os_error().unwrap_or(libc::EIO));
            }
            None
        }
    };
    match first {
        Err(None) => Some(NOT_SERVED),
        Err(Some(errno)) => Some(-errno),
        Ok(a) => Some(cap.map_or(a, |b| a.min(b)) as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member::{MemberRef, RamMember};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A pair whose second device's errors are the write's once
    /// `switched`, counting the errors it was told of.
    struct Fake {
        devices: [MemberRef; 2],
        switched: bool,
        told: AtomicUsize,
    }

    impl Pair for Fake {
        fn devices(&self) -> [&MemberRef; 2] {
            [&self.devices[0], &self.devices[1]]
        }
        fn read_from(&self) -> &MemberRef {
            &self.devices[0]
        }
        fn write_to(&self, _: u64) -> (&MemberRef, Option<&MemberRef>) {
            (&self.devices[0], Some(&self.devices[1]))
        }
        fn second_failed(&self, e: io::Error) -> io::Result<()> {
            self.told.fetch_add(1, Ordering::Relaxed);
            match self.switched {
                true => Err(e),
                false => Ok(()),
            }
        }
    }

    fn fake(switched: bool) -> Fake {
        let ram = || Arc::new(RamMember::new("ram:pair", 1 << 20)) as MemberRef;
        Fake {
            devices: [ram(), ram()],
            switched,
            told: AtomicUsize::new(0),
        }
    }

    #[test]
    fn both_halves_joined_as_one_write_at_a_time_would_end() {
        let eio = Some(-libc::EIO);
        let p = fake(false);
        // Both moved all (a timed I/O's None, a ring's byte count).
        assert_eq!(joined(4096, None, Some(4096), &p), Some(4096));
        // The second moved fewer: the rest goes again, to both.
        assert_eq!(joined(4096, Some(4096), Some(512), &p), Some(512));
        assert_eq!(joined(4096, Some(1024), None, &p), Some(1024));
        // Nothing moved on either (past the end): nothing said.
        assert_eq!(joined(4096, Some(0), Some(0), &p), Some(0));
        assert_eq!(p.told.load(Ordering::Relaxed), 0);
        // The second failed, or moved nothing while the first moved all:
        // the pair is told, and the write stands on the first.
        assert_eq!(joined(4096, None, eio, &p), Some(4096));
        assert_eq!(joined(4096, Some(4096), Some(0), &p), Some(4096));
        assert_eq!(p.told.load(Ordering::Relaxed), 2);
        // The first failed: its error, whatever the second did.
        assert_eq!(joined(4096, eio, None, &p), eio);
        assert_eq!(
            joined(4096, Some(-libc::ENOSPC), eio, &p),
            Some(-libc::ENOSPC)
        );
        assert_eq!(joined(4096, Some(NOT_SERVED), None, &p), Some(NOT_SERVED));
        // Once the second is the member, its error is the write's.
        let p = fake(true);
        assert_eq!(
            joined(4096, None, Some(-libc::ENOSPC), &p),
            Some(-libc::ENOSPC)
        );
        assert_eq!(joined(4096, None, None, &p), Some(4096));
    }
}
