//! A member in RAM (like SPDK's malloc bdev): for measuring the engine alone
//! and for fast model tests.

use super::Member;
use parking_lot::Mutex;
use std::io;

/// Segment size: concurrent I/O to different segments runs in parallel.
const SEG: u64 = 64 * 1024;

pub struct RamMember {
    name: String,
    key: u64,
    size: u64,
    segs: Vec<Mutex<Box<[u8]>>>,
    /// Counted by the array's I/O paths (see `Member::io_stats`).
    stats: crate::stats::IoStats,
}

impl RamMember {
    pub fn new(name: impl Into<String>, size: u64) -> RamMember {
        let n = size.div_ceil(SEG);
        let segs = (0..n)
            .map(|i| {
                let len = (size - i * SEG).min(SEG) as usize;
                Mutex::new(vec![0u8; len].into_boxed_slice())
            })
            .collect();
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        RamMember {
            stats: Default::default(),
            name: name.into(),
            key: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            size,
            segs,
        }
    }

    fn check(&self, offset: u64, len: usize) -> io::Result<()> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.size)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: I/O at {offset}+{len} past the end ({})",
                    self.name, self.size
                ),
            ));
        }
        Ok(())
    }

    /// Calls f(segment bytes, range within segment, range within buffer)
    /// for every segment the I/O touches.
    fn each(&self, offset: u64, len: usize, mut f: impl FnMut(&mut [u8], usize)) {
        let mut done = 0usize;
        while done < len {
            let pos = offset + done as u64;
            let seg = (pos / SEG) as usize;
            let within = (pos % SEG) as usize;
            let mut s = self.segs[seg].lock();
            let n = (s.len() - within).min(len - done);
            f(&mut s[within..within + n], done);
            done += n;
        }
    }
}

impl Member for RamMember {
    fn io_stats(&self) -> Option<&crate::stats::IoStats> {
        Some(&self.stats)
    }
    fn identity(&self) -> &str {
        &self.name
    }
    fn device_key(&self) -> super::DeviceKey {
        super::DeviceKey::Ram(self.key)
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len())?;
        self.each(offset, buf.len(), |seg, at| {
            buf[at..at + seg.len()].copy_from_slice(seg)
        });
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len())?;
        self.each(offset, buf.len(), |seg, at| {
            seg.copy_from_slice(&buf[at..at + seg.len()])
        });
        Ok(())
    }
    /// RAM completes an I/O as it starts: `done` runs before the timed
    /// calls return (and a due I/O is due at once), so the shards serve
    /// RAM members too (and the engine's own cost per I/O can be measured
    /// with no device under it).
    fn timed(&self) -> bool {
        true
    }
    /// A FUA write is a write here (`write_fua_at`: nothing to flush).
    fn fua_timed(&self) -> bool {
        true
    }
    fn start_timed(
        &self,
        mut op: super::IoOp<'_>,
        offset: u64,
        done: super::TimedDone,
    ) -> Option<io::Result<()>> {
        let r = op.run_on(self, offset);
        if r.is_ok() {
            done(Ok(()));
        }
        Some(r)
    }
    /// Due as it starts: a shard reaps it at its next pass, as it reaps a
    /// ring's completions, where a timed I/O's completion goes through
    /// the shard's inbox (its lock) at every I/O, which no drive costs.
    fn start_due(
        &self,
        mut op: super::IoOp<'_>,
        offset: u64,
    ) -> Option<io::Result<std::time::Instant>> {
        Some(op.run_on(self, offset).map(|()| std::time::Instant::now()))
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn flush_waits(&self) -> bool {
        false
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len as usize)?;
        self.each(offset, len as usize, |seg, _| seg.fill(0));
        Ok(())
    }
}
