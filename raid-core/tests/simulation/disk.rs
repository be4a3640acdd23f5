//! The simulated disks: RAM pages behind a volatile write cache, which
//! can lose power at any I/O, vanish, or return EIO on a range; sparse
//! files on one filesystem, which can fill up (`Space`); and, for lives on
//! a shard, member I/O completed when the simulation says so.

use super::{CHUNK, SECTOR};
use raid_core::member::{undo_to_durable, write_then_flush, DeviceKey, IoOp, Member, TimedDone};
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The power every disk of one simulated machine shares: I/Os left before
/// it goes (i64::MAX: no cut planned), and whether it is off.
pub struct Power {
    pub budget: AtomicI64,
    pub off: AtomicBool,
}

impl Power {
    /// Whether a cut is planned (each I/O counts the budget down from
    /// i64::MAX when none is).
    pub fn cut_planned(&self) -> bool {
        self.budget.load(Ordering::SeqCst) < i64::MAX / 2
    }

    pub fn tick(&self) -> io::Result<()> {
        if self.off.load(Ordering::SeqCst) {
            return Err(io::Error::other("power is off"));
        }
        if self.budget.fetch_sub(1, Ordering::SeqCst) <= 0 {
            self.off.store(true, Ordering::SeqCst);
            return Err(io::Error::other("power cut"));
        }
        Ok(())
    }
}

/// The filesystem every disk of one life is a sparse file on: pages it
/// can still give (i64::MAX: it never fills, and no disk counts pages).
pub struct Space {
    pub free: AtomicI64,
}

impl Space {
    pub fn unlimited() -> Space {
        Space {
            free: AtomicI64::new(i64::MAX),
        }
    }

    pub fn limited(&self) -> bool {
        self.free.load(Ordering::SeqCst) < i64::MAX / 2
    }

    /// Gives `pages`, or ENOSPC with none given.
    fn take(&self, pages: i64) -> io::Result<()> {
        let r = self
            .free
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| {
                (f >= pages).then_some(f - pages)
            });
        r.map(|_| ())
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOSPC))
    }
}

#[derive(Default)]
pub struct DiskState {
    /// 4 KiB pages written so far (absent: zeros).
    pub pages: BTreeMap<u64, Box<[u8]>>,
    /// (offset, previous bytes) of each write since the last flush, oldest first.
    pub unflushed: Vec<(u64, Vec<u8>)>,
    pub vanished: bool,
    /// Byte ranges that return EIO (a bad spot).
    pub bad: Vec<(u64, u64)>,
    /// Pages given by the filesystem and not written yet (a reserve, or a
    /// write that lands as it completes): holes that take no more space.
    pub reserved: BTreeSet<u64>,
}

impl DiskState {
    pub fn copy_out(&self, off: u64, buf: &mut [u8]) {
        let mut done = 0;
        while done < buf.len() {
            let at = off + done as u64;
            let within = (at % 4096) as usize;
            let n = (4096 - within).min(buf.len() - done);
            match self.pages.get(&(at / 4096)) {
                Some(p) => buf[done..done + n].copy_from_slice(&p[within..within + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
    }
    /// A write lands: into the cache, the bytes it replaced kept until the
    /// next flush (what a power cut may bring back).
    fn take(&mut self, off: u64, buf: &[u8]) {
        let mut old = vec![0u8; buf.len()];
        self.copy_out(off, &mut old);
        self.unflushed.push((off, old));
        self.copy_in(off, buf);
    }

    pub fn copy_in(&mut self, off: u64, buf: &[u8]) {
        let mut done = 0;
        while done < buf.len() {
            let at = off + done as u64;
            let within = (at % 4096) as usize;
            let n = (4096 - within).min(buf.len() - done);
            self.pages
                .entry(at / 4096)
                .or_insert_with(|| vec![0u8; 4096].into_boxed_slice())[within..within + n]
                .copy_from_slice(&buf[done..done + n]);
            done += n;
        }
    }
}

pub struct SimDisk {
    pub name: String,
    key: u64,
    size: u64,
    /// Where its data starts: the pages before are allocated, as a
    /// sparse member's metadata, bitmap and journal area is.
    data_offset: u64,
    power: Arc<Power>,
    space: Arc<Space>,
    pub st: Mutex<DiskState>,
    /// Where its timed I/O (a shard's) waits for the simulation to
    /// complete it; none: the disk serves only the blocking path.
    timeline: Option<Arc<Timeline>>,
    /// Itself, for a write that lands later (`Timeline::complete`).
    me: std::sync::Weak<SimDisk>,
    /// Takes writes with FUA (`Member::fua`): durable as they complete.
    fua: bool,
}

pub fn disk(
    name: String,
    (power, space): (&Arc<Power>, &Arc<Space>),
    timeline: Option<&Arc<Timeline>>,
    rows: u64,
    data_offset: u64,
    fua: bool,
) -> Arc<SimDisk> {
    static NEXT: AtomicU64 = AtomicU64::new(1 << 40);
    Arc::new_cyclic(|me| SimDisk {
        name,
        key: NEXT.fetch_add(1, Ordering::Relaxed),
        size: data_offset + rows * CHUNK,
        data_offset,
        power: power.clone(),
        space: space.clone(),
        st: Mutex::new(DiskState::default()),
        timeline: timeline.cloned(),
        me: me.clone(),
        fua,
    })
}

/// A timed member I/O started and not yet completed.
struct InFlight {
    /// Its disk and bytes.
    disk: Arc<SimDisk>,
    at: u64,
    len: u64,
    /// A write that lands when it completes: what.
    lands: Option<Vec<u8>>,
    /// A write with FUA: its bytes, durable as it completes.
    durable: Option<Vec<u8>>,
    /// Tells the shard it completed, and how.
    then: TimedDone,
}

/// The timed member I/Os in flight on every disk of one life, completed
/// one at a time in an order the seed chooses: a drive may complete the
/// I/Os it holds in any order, and a write may reach the medium as it is
/// taken or only as it completes (both happen here, by a coin the seed
/// also drives), so I/Os in flight together land in any order.
pub struct Timeline {
    in_flight: Mutex<Vec<InFlight>>,
    coin: Mutex<StdRng>,
}

impl Timeline {
    pub fn new(rng: StdRng) -> Arc<Timeline> {
        Arc::new(Timeline {
            in_flight: Mutex::new(Vec::new()),
            coin: Mutex::new(rng),
        })
    }

    pub fn pending(&self) -> usize {
        self.in_flight.lock().unwrap().len()
    }

    /// Completes the I/O in flight at `i` (of `pending`): where its disk
    /// vanished, went bad over its bytes or lost power since it started,
    /// it fails (a write still held does not land; one that landed as it
    /// was taken stays, as a drive may have written it before it died);
    /// otherwise a write still held lands now. Then the shard is told.
    pub fn complete(&self, i: usize) {
        let io = self.in_flight.lock().unwrap().swap_remove(i);
        let r = {
            let mut st = io.disk.st.lock().unwrap();
            let (a, b) = (io.at, io.at + io.len);
            let off = io.disk.power.off.load(Ordering::SeqCst);
            if off || st.vanished || st.bad.iter().any(|&(x, y)| a < y && b > x) {
                Err(io::Error::from_raw_os_error(libc::EIO))
            } else {
                if let Some(data) = &io.lands {
                    st.take(io.at, data);
                }
                if let Some(data) = &io.durable {
                    // Its own entry in the log undoes to itself now, and
                    // every other entry over its bytes too.
                    undo_to_durable(&mut st.unflushed, io.at, data);
                }
                Ok(())
            }
        };
        (io.then)(r);
    }

    /// The power went: what is in flight never completes, and no write of
    /// it lands.
    pub fn drop_all(&self) {
        self.in_flight.lock().unwrap().clear();
    }
}

impl SimDisk {
    fn gate(&self, st: &DiskState, off: u64, len: u64) -> io::Result<()> {
        self.power.tick()?;
        if st.vanished {
            return Err(io::Error::other(format!("{}: gone", self.name)));
        }
        if off.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "past the end"));
        }
        if st.bad.iter().any(|&(a, b)| off < b && off + len > a) {
            return Err(io::Error::other(format!("{}: bad range", self.name)));
        }
        Ok(())
    }

    /// The data pages of [off, off+len) that take space: neither written
    /// nor reserved.
    fn unallocated(&self, st: &DiskState, off: u64, len: u64) -> Vec<u64> {
        (off.max(self.data_offset) / 4096..(off + len).div_ceil(4096))
            .filter(|p| !st.pages.contains_key(p) && !st.reserved.contains(p))
            .collect()
    }

    /// The space a write to [off, off+len) needs, taken from the
    /// filesystem (all of it, or ENOSPC and none), where it can fill.
    fn claim(&self, st: &mut DiskState, off: u64, len: u64) -> io::Result<()> {
        if !self.space.limited() {
            return Ok(());
        }
        let pages = self.unallocated(st, off, len);
        self.space.take(pages.len() as i64)?;
        st.reserved.extend(pages);
        Ok(())
    }

    /// The power went: each sector written since the last flush keeps a
    /// prefix of its writes, `keep(n)` (0..=n) of its n, chosen per sector.
    pub fn lose_cache(&self, keep: &mut dyn FnMut(usize) -> usize) {
        let mut st = self.st.lock().unwrap();
        let writes = std::mem::take(&mut st.unflushed);
        let mut per: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (j, (off, old)) in writes.iter().enumerate() {
            let end = off + old.len() as u64;
            for s in off / SECTOR..end.div_ceil(SECTOR) {
                per.entry(s).or_default().push(j);
            }
        }
        for (s, js) in per {
            let k = keep(js.len());
            // Unwind this sector's writes after the k-th, newest first.
            for &j in js[k..].iter().rev() {
                let (off, old) = &writes[j];
                let lo = (s * SECTOR).max(*off);
                let hi = ((s + 1) * SECTOR).min(off + old.len() as u64);
                let from = (lo - off) as usize..(hi - off) as usize;
                st.copy_in(lo, &old[from]);
            }
        }
    }
}

impl Member for SimDisk {
    fn identity(&self) -> &str {
        &self.name
    }
    fn device_key(&self) -> DeviceKey {
        DeviceKey::Ram(self.key)
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let st = self.st.lock().unwrap();
        self.gate(&st, offset, buf.len() as u64)?;
        st.copy_out(offset, buf);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        self.gate(&st, offset, buf.len() as u64)?;
        self.claim(&mut st, offset, buf.len() as u64)?;
        st.take(offset, buf);
        Ok(())
    }
    /// Every page there has its space, or the filesystem cannot fill.
    fn reserved(&self, offset: u64, len: u64) -> bool {
        !self.space.limited()
            || self
                .unallocated(&self.st.lock().unwrap(), offset, len)
                .is_empty()
    }
    /// A sparse file's fallocate: no I/O (the power's budget is not
    /// counted down), all the pages or ENOSPC with none.
    fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.space.limited() {
            return Ok(());
        }
        let mut st = self.st.lock().unwrap();
        if st.vanished {
            return Err(io::Error::other(format!("{}: gone", self.name)));
        }
        self.claim(&mut st, offset, len)
    }
    fn flush(&self) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        self.gate(&st, 0, 0)?;
        st.unflushed.clear();
        Ok(())
    }
    fn fua(&self) -> bool {
        self.fua
    }
    /// The write lands in the cache, then is made durable: two steps of
    /// the power's budget, so that a cut can fall between them, leaving
    /// the write unacknowledged and in the cache, whose sectors the cut
    /// keeps or loses as any other's.
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.fua {
            return write_then_flush(self, buf, offset);
        }
        let mut st = self.st.lock().unwrap();
        self.gate(&st, offset, buf.len() as u64)?;
        self.claim(&mut st, offset, buf.len() as u64)?;
        st.take(offset, buf);
        self.gate(&st, offset, buf.len() as u64)?;
        // Under the same hold: the last write landed is this one.
        st.unflushed.pop();
        undo_to_durable(&mut st.unflushed, offset, buf);
        Ok(())
    }
    /// Flushed on the array's own thread, member after member: a thread
    /// each would only make the order of the flushes (and so what a cut
    /// planned inside them leaves) differ from run to run.
    fn flush_waits(&self) -> bool {
        false
    }
    /// Zeros written as a sparse file takes a punched hole: the whole
    /// pages in the range become holes again (a power cut may bring back
    /// what they held, as for any write since the last flush).
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        self.gate(&st, offset, len)?;
        st.take(offset, &vec![0u8; len as usize]);
        for page in offset.div_ceil(4096)..(offset + len) / 4096 {
            st.pages.remove(&page);
            st.reserved.remove(&page);
        }
        Ok(())
    }
    /// Pages never written are holes, as in a sparse file (a page once
    /// written stays data, zeros or not, also where a power cut takes its
    /// write back), so rebuilds, hot replaces and scrubs skip rows of holes
    /// here as on member files: a write still in flight that lands only
    /// as it completes is a hole until then. A vanished disk, or one
    /// without power, cannot tell. Asking is no I/O: the power's budget
    /// is not counted down.
    fn data_start_from(&self, offset: u64) -> Option<u64> {
        let st = self.st.lock().unwrap();
        if st.vanished || self.power.off.load(Ordering::SeqCst) || offset >= self.size {
            return None;
        }
        match st.pages.range(offset / 4096..).next() {
            Some((&page, _)) => Some((page * 4096).max(offset)),
            None => Some(self.size),
        }
    }
    fn timed(&self) -> bool {
        self.timeline.is_some()
    }
    /// A disk that takes FUA takes it timed too: durable as it completes.
    fn fua_timed(&self) -> bool {
        self.fua && self.timeline.is_some()
    }
    /// A read's bytes move as it starts; a write's as it starts or as it
    /// completes (the timeline's coin); either completes when the
    /// simulation says. A write with FUA is durable as it completes (not
    /// before: a cut while it is in flight may keep or lose it, as any
    /// write in the cache). A fault (the power, a vanished disk, a bad
    /// range) fails the I/O as it starts.
    fn start_timed(&self, op: IoOp<'_>, offset: u64, then: TimedDone) -> Option<io::Result<()>> {
        let tl = self.timeline.as_ref()?;
        if matches!(op, IoOp::WriteFua(_)) && !self.fua {
            // Never sent timed (`Member::fua_timed`).
            return None;
        }
        let mut st = self.st.lock().unwrap();
        let len = op.len() as u64;
        if let Err(e) = self.gate(&st, offset, len) {
            return Some(Err(e));
        }
        if op.is_write() {
            if let Err(e) = self.claim(&mut st, offset, len) {
                return Some(Err(e));
            }
        }
        let durable = match &op {
            IoOp::WriteFua(buf) => Some(buf.to_vec()),
            _ => None,
        };
        let lands = match op {
            IoOp::Read(buf) => {
                st.copy_out(offset, buf);
                None
            }
            IoOp::Write(buf) | IoOp::WriteFua(buf) if tl.coin.lock().unwrap().gen_bool(0.5) => {
                st.take(offset, buf);
                None
            }
            IoOp::Write(buf) | IoOp::WriteFua(buf) => Some(buf.to_vec()),
        };
        drop(st);
        let disk = self.me.upgrade().expect("alive: it is serving this I/O");
        tl.in_flight.lock().unwrap().push(InFlight {
            disk,
            at: offset,
            len,
            lands,
            durable,
            then,
        });
        Some(Ok(()))
    }
}
