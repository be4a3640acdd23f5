//! Byte ranges of any alignment on an array whose I/O is in 4 KiB blocks,
//! for the front ends: the FUSE export (the kernel's page cache may ask
//! for any range), and NBD clients that did not ask for the block size.
//!
//! A write of part of a block reads the blocks around it, puts its bytes
//! in and writes them back: a read-modify-write. Another write landing on
//! those blocks between its read and its write would be undone, so each
//! runs alone among the array's writes of every front end (`Gate`, one per
//! array): whole-block writes count themselves in for as long as they are
//! in flight, and a read-modify-write waits for none to be, letting no
//! new one in meanwhile.

use raid_core::array::{Array, ArrayError, BLOCK};
use raid_core::buf::AlignedBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

type Result<T> = std::result::Result<T, ArrayError>;

/// Keeps a read-modify-write alone among the array's writes: every other
/// write counts itself in (`admit`, `admit_waiting`) until it completes
/// (its `Counted` dropped); a read-modify-write (`alone`) closes the gate
/// to new ones and waits for those in flight to end.
#[derive(Default)]
pub struct Gate {
    writes: AtomicUsize,
    closed: AtomicBool,
    /// Read-modify-writes, one at a time.
    rmw: Mutex<()>,
    /// With `changed`: waits for the count to fall or the gate to open
    /// (held only around those waits and their wake-ups, never while a
    /// read-modify-write runs).
    lock: Mutex<()>,
    changed: Condvar,
}

/// The gates of the arrays that have one, by array.
static GATES: Mutex<Vec<(Weak<Array>, Weak<Gate>)>> = Mutex::new(Vec::new());

impl Gate {
    /// The array's gate, shared by every front end that serves it.
    pub fn of(array: &Arc<Array>) -> Arc<Gate> {
        let mut gates = GATES.lock().unwrap_or_else(|e| e.into_inner());
        gates.retain(|(a, g)| a.strong_count() > 0 && g.strong_count() > 0);
        let found = gates
            .iter()
            .find(|(a, _)| std::ptr::eq(a.as_ptr(), Arc::as_ptr(array)))
            .and_then(|(_, g)| g.upgrade());
        found.unwrap_or_else(|| {
            let g = Arc::new(Gate::default());
            gates.push((Arc::downgrade(array), Arc::downgrade(&g)));
            g
        })
    }

    /// Counts a write in, unless a read-modify-write holds the gate: then
    /// None, counting nothing. A caller with writes of its own in flight
    /// lets them go on first (they may be what the holder waits for), then
    /// calls `admit_waiting`.
    pub fn admit(self: &Arc<Self>) -> Option<Counted> {
        self.try_enter().then(|| Counted(self.clone()))
    }

    /// Counts a write in, waiting while a read-modify-write runs.
    pub fn admit_waiting(self: &Arc<Self>) -> Counted {
        while !self.try_enter() {
            let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            let _g = self
                .changed
                .wait_timeout_while(g, Duration::from_millis(100), |_| {
                    self.closed.load(Ordering::SeqCst)
                })
                .unwrap_or_else(|e| e.into_inner());
        }
        Counted(self.clone())
    }

    fn try_enter(&self) -> bool {
        // SeqCst with `alone`: either this sees the gate closed, or the
        // holder sees this write counted.
        self.writes.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.leave();
            return false;
        }
        true
    }

    /// A counted write completed.
    fn leave(&self) {
        if self.writes.fetch_sub(1, Ordering::SeqCst) == 1 && self.closed.load(Ordering::SeqCst) {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.changed.notify_all();
        }
    }

    /// Runs `f` with no other write of the array in flight.
    pub fn alone<R>(&self, f: impl FnOnce() -> R) -> R {
        let _one = self.rmw.lock().unwrap_or_else(|e| e.into_inner());
        {
            let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.closed.store(true, Ordering::SeqCst);
            let _g = self
                .changed
                .wait_while(g, |_| self.writes.load(Ordering::SeqCst) > 0)
                .unwrap_or_else(|e| e.into_inner());
        }
        /// Opens the gate however `f` ends.
        struct Open<'a>(&'a Gate);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                let _g = self.0.lock.lock().unwrap_or_else(|e| e.into_inner());
                self.0.closed.store(false, Ordering::SeqCst);
                self.0.changed.notify_all();
            }
        }
        let _open = Open(self);
        f()
    }
}

/// A write counted in the gate (`Gate::admit`) until this is dropped: at
/// its completion, or with its completion where that is dropped unrun.
pub struct Counted(Arc<Gate>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// The array, and its gate.
pub struct AnyBytes {
    pub array: Arc<Array>,
    pub gate: Arc<Gate>,
}

impl AnyBytes {
    pub fn new(array: Arc<Array>) -> AnyBytes {
        let gate = Gate::of(&array);
        AnyBytes { array, gate }
    }

    /// Whether a range is whole blocks.
    pub fn is_whole(offset: u64, len: usize) -> bool {
        offset.is_multiple_of(BLOCK) && (len as u64).is_multiple_of(BLOCK)
    }

    /// Reads any byte range inside the array; returns the buffer and where
    /// in it the range starts. Page-aligned buffers, so members opened with
    /// O_DIRECT take them through io_uring as they are, with no copy.
    pub fn read_any(&self, offset: u64, len: usize) -> Result<(AlignedBuf, usize)> {
        let start = offset / BLOCK * BLOCK;
        let end = (offset + len as u64).div_ceil(BLOCK) * BLOCK;
        let mut buf = AlignedBuf::new((end - start) as usize);
        self.array.read(start, &mut buf)?;
        Ok((buf, (offset - start) as usize))
    }

    /// Writes any byte range inside the array.
    pub fn write_any(&self, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset + data.len() as u64;
        if offset.is_multiple_of(BLOCK) && end.is_multiple_of(BLOCK) {
            let _in = self.gate.admit_waiting();
            return self.array.write(offset, data);
        }
        self.gate.alone(|| {
            let start = offset / BLOCK * BLOCK;
            let aend = end.div_ceil(BLOCK) * BLOCK;
            let mut buf = AlignedBuf::new((aend - start) as usize);
            // Only the first and last blocks need their old contents.
            self.array.read(start, &mut buf[..BLOCK as usize])?;
            let last = (aend - BLOCK - start) as usize;
            self.array.read(aend - BLOCK, &mut buf[last..])?;
            let from = (offset - start) as usize;
            buf[from..from + data.len()].copy_from_slice(data);
            self.array.write(start, &buf)
        })
    }

    /// Zeroes any byte range: whole blocks through the array's
    /// write-zeroes (a discard on the members), edges by writing zeros.
    pub fn zero_any(&self, offset: u64, len: u64) -> Result<()> {
        let end = offset + len;
        let a = offset.div_ceil(BLOCK) * BLOCK;
        let b = end / BLOCK * BLOCK;
        if a >= b {
            return self.write_any(offset, &vec![0u8; len as usize]);
        }
        if a > offset {
            self.write_any(offset, &vec![0u8; (a - offset) as usize])?;
        }
        {
            let _in = self.gate.admit_waiting();
            self.array.write_zeroes(a, b - a)?;
        }
        if end > b {
            self.write_any(b, &vec![0u8; (end - b) as usize])?;
        }
        Ok(())
    }

    /// Trims the whole blocks inside any byte range (a trim may leave any
    /// of its bytes as they were), none where there are none.
    pub fn trim_inside(&self, offset: u64, len: u64) -> Result<()> {
        let a = offset.div_ceil(BLOCK) * BLOCK;
        let b = (offset + len) / BLOCK * BLOCK;
        if a >= b {
            return Ok(());
        }
        let _in = self.gate.admit_waiting();
        self.array.write_zeroes(a, b - a)
    }
}

#[cfg(test)]
mod tests {
    use super::Gate;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_read_modify_write_runs_with_no_write_in_flight() {
        let gate = Arc::new(Gate::default());
        assert!(gate.try_enter());
        let ran = Arc::new(AtomicBool::new(false));
        let t = {
            let (gate, ran) = (gate.clone(), ran.clone());
            std::thread::spawn(move || gate.alone(|| ran.store(true, Ordering::SeqCst)))
        };
        while !gate.closed.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!ran.load(Ordering::SeqCst), "ran with a write in flight");
        // A new write waits for it: the gate is closed.
        assert!(!gate.try_enter());
        gate.leave();
        t.join().unwrap();
        assert!(ran.load(Ordering::SeqCst));
        assert!(gate.try_enter(), "the gate opens again");
        gate.leave();
    }
}
