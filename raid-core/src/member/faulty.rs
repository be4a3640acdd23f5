//! A fault-injecting wrapper for tests: fail after N I/Os, fail a range,
//! fail everything, add latency, and a power cut that drops every write not
//! yet flushed.

use super::{Member, MemberRef};
use parking_lot::Mutex;
use std::io;
use std::time::Duration;

/// The faults currently armed.
#[derive(Default, Clone, Debug)]
pub struct Faults {
    /// Fail every I/O once this many more have succeeded.
    pub fail_after: Option<u64>,
    /// Fail I/O that touches any of these byte ranges [start, end).
    pub fail_ranges: Vec<(u64, u64)>,
    /// Fail reads (only) that touch any of these byte ranges: sectors
    /// that cannot be read back, where writes still land.
    pub fail_read_ranges: Vec<(u64, u64)>,
    /// Fail writes (only) that touch any of these byte ranges: a drive
    /// that still reads what it holds but takes no more writes there.
    pub fail_write_ranges: Vec<(u64, u64)>,
    /// Fail every I/O (a drive that vanished).
    pub fail_all: bool,
    /// Sleep before each I/O and flush (a slow drive).
    pub latency: Duration,
}

struct State {
    faults: Faults,
    /// (offset, previous contents) of writes since the last flush, oldest
    /// first, kept only while power-cut tracking is on.
    unflushed: Vec<(u64, Vec<u8>)>,
    track_power: bool,
    powered_off: bool,
    /// Takes writes with FUA (`take_fua`).
    fua: bool,
    /// Flushes and FUA writes that reached the member underneath (a timed
    /// FUA write counts as one or the other as it starts).
    flushes: u64,
    fua_writes: u64,
}

impl State {
    /// Every write so far is durable: a flush reached the member.
    fn flushed(&mut self) {
        self.unflushed.clear();
        self.flushes += 1;
    }

    /// `bytes` at `offset` were written durably (FUA): the power-cut log
    /// never takes them back (`undo_to_durable`).
    fn fua_written(&mut self, offset: u64, bytes: &[u8]) {
        undo_to_durable(&mut self.unflushed, offset, bytes);
        self.fua_writes += 1;
    }
}

pub struct FaultyMember {
    inner: MemberRef,
    state: Mutex<State>,
}

/// Whether I/O of `len` bytes at `offset` touches any of `ranges`
/// ([start, end) each).
fn touches(ranges: &[(u64, u64)], offset: u64, len: u64) -> bool {
    ranges.iter().any(|&(a, b)| offset < b && offset + len > a)
}

/// A power-cut undo log (offset, the bytes each write since the last
/// flush replaced, oldest first) after `bytes` were written durably at
/// `offset` (FUA): where an entry overlaps them, it now undoes to them,
/// so that unwinding the log never takes the durable write back. The
/// write itself adds no entry.
pub fn undo_to_durable(log: &mut [(u64, Vec<u8>)], offset: u64, bytes: &[u8]) {
    let end = offset + bytes.len() as u64;
    for (at, old) in log {
        let (lo, hi) = ((*at).max(offset), (*at + old.len() as u64).min(end));
        if lo < hi {
            old[(lo - *at) as usize..(hi - *at) as usize]
                .copy_from_slice(&bytes[(lo - offset) as usize..(hi - offset) as usize]);
        }
    }
}

fn injected(what: &str, name: &str) -> io::Error {
    io::Error::other(format!("{name}: injected fault ({what})"))
}

impl FaultyMember {
    pub fn new(inner: MemberRef) -> FaultyMember {
        FaultyMember {
            inner,
            state: Mutex::new(State {
                faults: Faults::default(),
                unflushed: Vec::new(),
                track_power: false,
                powered_off: false,
                fua: false,
                flushes: 0,
                fua_writes: 0,
            }),
        }
    }

    pub fn set_faults(&self, f: Faults) {
        self.state.lock().faults = f;
    }

    pub fn fail_all(&self) {
        self.state.lock().faults.fail_all = true;
    }

    pub fn heal(&self) {
        self.state.lock().faults = Faults::default();
    }

    /// From now on, remember what each write overwrote until the next flush.
    pub fn track_power_cut(&self) {
        let mut s = self.state.lock();
        s.track_power = true;
        s.unflushed.clear();
    }

    /// Drops every write since the last flush (newest first, so overlapping
    /// writes unwind correctly) and fails all I/O until `power_on`.
    pub fn power_cut(&self) -> io::Result<()> {
        self.cut(&mut self.state.lock())
    }

    /// The cut itself, under the state's lock.
    fn cut(&self, s: &mut State) -> io::Result<()> {
        while let Some((off, old)) = s.unflushed.pop() {
            self.inner.write_at(&old, off)?;
        }
        s.powered_off = true;
        Ok(())
    }

    /// A power cut that hits every member at one instant: no I/O reaches
    /// any of them between the first's cut and the last's (so nothing the
    /// software does on seeing the first fail, such as recording a member
    /// failure, lands on another). Each loses its own unflushed writes.
    pub fn power_cut_together(members: &[std::sync::Arc<FaultyMember>]) -> io::Result<()> {
        let mut held: Vec<_> = members.iter().map(|m| (m, m.state.lock())).collect();
        for (m, s) in held.iter_mut() {
            m.cut(s)?;
        }
        Ok(())
    }

    pub fn power_on(&self) {
        self.state.lock().powered_off = false;
    }

    /// Whether it takes writes with FUA (`Member::fua`): each durable as
    /// it completes, which a power cut then keeps. A capability, not a
    /// fault: `heal` leaves it.
    pub fn take_fua(&self, on: bool) {
        self.state.lock().fua = on;
    }

    /// The flushes and the FUA writes that reached the member underneath.
    pub fn flushes_and_fua_writes(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.flushes, s.fua_writes)
    }

    /// Counts an I/O against the faults; Err if it must fail.
    fn gate(&self, s: &mut State, offset: u64, len: u64) -> io::Result<()> {
        let name = self.inner.identity();
        if s.powered_off {
            return Err(injected("power is off", name));
        }
        if s.faults.fail_all {
            return Err(injected("member gone", name));
        }
        if let Some(n) = s.faults.fail_after.as_mut() {
            if *n == 0 {
                return Err(injected("failed after N I/Os", name));
            }
            *n -= 1;
        }
        if touches(&s.faults.fail_ranges, offset, len) {
            return Err(injected("bad range", name));
        }
        Ok(())
    }

    /// `gate`, then the ranges that fail only reads (`write` false) or
    /// only writes (zeroing included): one rule for every I/O, blocking
    /// or timed.
    fn gate_op(&self, s: &mut State, offset: u64, len: u64, write: bool) -> io::Result<()> {
        self.gate(s, offset, len)?;
        let (ranges, what) = match write {
            false => (&s.faults.fail_read_ranges, "unreadable range"),
            true => (&s.faults.fail_write_ranges, "unwritable range"),
        };
        match touches(ranges, offset, len) {
            true => Err(injected(what, self.inner.identity())),
            false => Ok(()),
        }
    }

    fn delay(&self) {
        let d = self.state.lock().faults.latency;
        if !d.is_zero() {
            std::thread::sleep(d);
        }
    }
}

impl Member for FaultyMember {
    /// The device underneath keeps the counts; injected errors are counted
    /// there too, since they come back through the same calls.
    fn io_stats(&self) -> Option<&crate::stats::IoStats> {
        self.inner.io_stats()
    }
    fn identity(&self) -> &str {
        self.inner.identity()
    }
    fn device_key(&self) -> super::DeviceKey {
        self.inner.device_key()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.delay();
        let mut s = self.state.lock();
        self.gate_op(&mut s, offset, buf.len() as u64, false)?;
        drop(s);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.delay();
        let mut s = self.state.lock();
        self.gate_op(&mut s, offset, buf.len() as u64, true)?;
        if s.track_power {
            // Held under the lock so the undo log matches the write order.
            let mut old = vec![0u8; buf.len()];
            self.inner.read_at(&mut old, offset)?;
            s.unflushed.push((offset, old));
            return self.inner.write_at(buf, offset);
        }
        drop(s);
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.delay();
        let mut s = self.state.lock();
        self.gate(&mut s, 0, 0)?;
        self.inner.flush()?;
        s.flushed();
        Ok(())
    }
    fn fua(&self) -> bool {
        self.state.lock().fua
    }
    /// Gated as any write, then durable at once: the power-cut log keeps
    /// no undo of it, and the older writes it overwrote now undo to its
    /// bytes (`undo_to_durable`). Without FUA: the write, then a flush.
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.fua() {
            return super::write_then_flush(self, buf, offset);
        }
        self.delay();
        let mut s = self.state.lock();
        self.gate_op(&mut s, offset, buf.len() as u64, true)?;
        self.inner.write_fua_at(buf, offset)?;
        s.fua_written(offset, buf);
        Ok(())
    }
    /// A slow drive's (`Faults::latency`) flush waits as well.
    fn flush_waits(&self) -> bool {
        self.inner.flush_waits() || !self.state.lock().faults.latency.is_zero()
    }
    /// A copy in memory, as the member underneath is, unless a latency
    /// is armed: then each I/O sleeps, which no caller that must not block
    /// may be made to do.
    fn in_memory(&self) -> bool {
        self.inner.in_memory() && self.state.lock().faults.latency.is_zero()
    }
    /// Timed I/O goes to a device underneath that serves it, with the
    /// same faults and power-cut log (not the latency: a caller of timed
    /// I/O must not be made to sleep).
    fn timed(&self) -> bool {
        self.inner.timed()
    }
    /// Its timed FUA writes keep their durability in its own power-cut
    /// log (`start_timed_fua`), whatever the device underneath.
    fn fua_timed(&self) -> bool {
        self.inner.timed()
    }
    fn start_timed(
        &self,
        op: super::IoOp<'_>,
        offset: u64,
        done: super::TimedDone,
    ) -> Option<io::Result<()>> {
        if let super::IoOp::WriteFua(buf) = op {
            return self.start_timed_fua(buf, offset, done);
        }
        let mut s = self.state.lock();
        let write = op.is_write();
        if let Err(e) = self.gate_op(&mut s, offset, op.len() as u64, write) {
            return Some(Err(e));
        }
        if s.track_power && write {
            // Read as timed I/O too: the bytes are there at once, and the
            // caller is not made to wait for the device's service time.
            let mut old = vec![0u8; op.len()];
            let read = super::IoOp::Read(&mut old);
            let r = match self.inner.start_timed(read, offset, Box::new(|_| {})) {
                Some(r) => r,
                None => self.inner.read_at(&mut old, offset),
            };
            if let Err(e) = r {
                return Some(Err(e));
            }
            s.unflushed.push((offset, old));
        }
        self.inner.start_timed(op, offset, done)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zeroes(offset, len, false)
    }
    fn reserved(&self, offset: u64, len: u64) -> bool {
        self.inner.reserved(offset, len)
    }
    fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.reserve(offset, len)
    }
    fn write_zeroes_allocated(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zeroes(offset, len, true)
    }
}

impl FaultyMember {
    /// A timed write with FUA: gated as any write, sent underneath as a
    /// plain timed write, and durable in the power-cut log as it starts
    /// (with FUA, as `write_fua_at` keeps it; without, as a write then a
    /// flush, every write before it with it). Kept as it starts, not as it
    /// completes: the completion runs on the device's own thread (the
    /// simulated drive's timer), which may hold its lock then, while a
    /// writer here holds this member's state and waits for that lock to
    /// start its write (and a power cut holds this member's state while
    /// it writes its undo log back through the device, waiting for that
    /// thread). So a cut while it is in flight keeps it, which a drive may
    /// do; an acknowledged one is kept either way. The simulation's disks
    /// make such a write durable only as it completes.
    fn start_timed_fua(
        &self,
        buf: &[u8],
        offset: u64,
        done: super::TimedDone,
    ) -> Option<io::Result<()>> {
        let mut s = self.state.lock();
        if let Err(e) = self.gate_op(&mut s, offset, buf.len() as u64, true) {
            return Some(Err(e));
        }
        let started = self
            .inner
            .start_timed(super::IoOp::Write(buf), offset, done)?;
        if started.is_ok() {
            match s.fua {
                true => s.fua_written(offset, buf),
                false => s.flushed(),
            }
        }
        Some(started)
    }

    /// Either kind of zeroing, gated and tracked as a write.
    fn zeroes(&self, offset: u64, len: u64, allocated: bool) -> io::Result<()> {
        let mut s = self.state.lock();
        self.gate_op(&mut s, offset, len, true)?;
        if s.track_power {
            let mut old = vec![0u8; len as usize];
            self.inner.read_at(&mut old, offset)?;
            s.unflushed.push((offset, old));
        }
        match allocated {
            true => self.inner.write_zeroes_allocated(offset, len),
            false => self.inner.write_zeroes(offset, len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::undo_to_durable;

    /// Entries a durable write overlaps undo to its bytes where they
    /// overlap, and keep their own elsewhere; others are left alone.
    #[test]
    fn a_durable_write_is_what_older_writes_undo_to() {
        let mut log = vec![(0u64, vec![1u8; 8]), (6, vec![2u8; 4]), (20, vec![3u8; 4])];
        undo_to_durable(&mut log, 4, &[9, 8, 7, 6, 5, 4]);
        assert_eq!(log[0].1, vec![1, 1, 1, 1, 9, 8, 7, 6]);
        assert_eq!(log[1].1, vec![7, 6, 5, 4]);
        assert_eq!(log[2].1, vec![3u8; 4]);
    }
}
