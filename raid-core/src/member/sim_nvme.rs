//! A simulated NVMe drive: RAM-backed, each I/O completing after a service
//! latency, at most `queue` I/Os in service at once (more wait their turn,
//! first come first served), like a drive's internal parallelism.
//!
//! RAM and tmpfs members answer in a microsecond or two, so they cannot show
//! whether the engine hides device latency; this member can, on any
//! machine, and the bare members measured under the same model in the same
//! run give the bound.
//!
//! An I/O's bytes move at submission (RAM) and its completion time is
//! computed from the queue model. A shard asks for that time
//! (`Member::start_due`) and reaps the I/O itself when it comes, as it
//! would a real drive's completion from its ring: no other thread runs
//! per I/O. Other callers wait until one timer thread for the whole
//! process says the time has come, not a sleeping thread per I/O. `submit` starts
//! every I/O of a batch before it waits for any (see `Member::begin`), so a
//! request's member I/Os overlap on the devices as they would through a
//! submission queue.
//!
//! Its cache is power-protected, as a datacenter drive's is: a flush costs
//! a command's round trip (one write's service time), and a write with FUA
//! what any write does.

use super::{DeviceKey, IoOp, Member, MemberIo, Pending, RamMember};
use parking_lot::{Condvar, Mutex};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The device model.
#[derive(Clone, Copy, Debug)]
pub struct NvmeModel {
    /// Service time of one read (any size up to 128 KiB; larger ones scale).
    pub read: Duration,
    /// Service time of one write (to the drive's cache).
    pub write: Duration,
    /// How many I/Os the drive services at once.
    pub queue: usize,
    /// Bytes per second the drive moves, reads and writes through one
    /// channel (0: no limit, the latencies alone). With it, a large
    /// transfer's bytes queue behind the others' as on a drive's bus and
    /// flash, so that sequential work (a rebuild, a full-stripe write) is
    /// bound by bandwidth, not by latency alone.
    pub read_bw: u64,
    pub write_bw: u64,
}

impl NvmeModel {
    /// The figures of a datacenter TLC drive's 4 KiB random I/O at depth:
    /// 80 us read, 20 us write (into its power-protected cache), 128 in
    /// service at once.
    pub fn datacenter() -> NvmeModel {
        NvmeModel {
            read: Duration::from_micros(80),
            write: Duration::from_micros(20),
            queue: 128,
            read_bw: 0,
            write_bw: 0,
        }
    }

    /// This model, with the drive's bandwidth limited to `read_bw` and
    /// `write_bw` bytes per second.
    pub fn with_bandwidth(self, read_bw: u64, write_bw: u64) -> NvmeModel {
        NvmeModel {
            read_bw,
            write_bw,
            ..self
        }
    }

    /// How long the drive's channel is busy moving `len` bytes.
    fn transfer(&self, write: bool, len: usize) -> Duration {
        match if write { self.write_bw } else { self.read_bw } {
            0 => Duration::ZERO,
            bw => Duration::from_secs_f64(len as f64 / bw as f64),
        }
    }

    fn service(&self, write: bool, len: usize) -> Duration {
        // Transfers beyond 128 KiB take proportionally longer.
        let base = if write { self.write } else { self.read };
        base * (len.div_ceil(128 << 10).max(1) as u32)
    }
}

/// When an I/O completes; `wait` blocks until then.
pub struct Completion {
    done: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
    /// Called at the completion time instead of waking a waiter
    /// (`Member::read_timed`).
    then: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Completion {
    fn new() -> Arc<Completion> {
        Arc::new(Completion {
            done: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            then: Mutex::new(None),
        })
    }

    fn fire(&self) {
        if let Some(f) = self.then.lock().take() {
            f();
        }
        let _g = self.lock.lock();
        self.done.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// Blocks until the I/O's completion time has come.
    pub fn wait(&self) {
        if self.done.load(Ordering::Acquire) {
            return;
        }
        let mut g = self.lock.lock();
        while !self.done.load(Ordering::Acquire) {
            self.cv.wait(&mut g);
        }
    }
}

/// The one timer thread: fires completions at their times.
struct Timer {
    heap: Mutex<BinaryHeap<Reverse<(Instant, u64, TimerEntry)>>>,
    wake: Condvar,
    seq: std::sync::atomic::AtomicU64,
}

/// A completion waiting in the timer heap (ordered by time, then sequence).
struct TimerEntry(Arc<Completion>);
impl PartialEq for TimerEntry {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for TimerEntry {}
impl PartialOrd for TimerEntry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for TimerEntry {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// The timer thread's timer slack, in nanoseconds: how late the kernel may
/// wake it past the time it asked for. A thread's default is 50 us, as long
/// as two writes' service; at 1 ns a completion fires a few microseconds
/// late (the wake-up itself), which the bare drives' p50 in the benches
/// shows beside the model's figure.
///
/// The thread sleeps even when the next completion is microseconds away,
/// rather than spinning: a drive's completions cost the host nothing, and
/// a timer thread that spun while any I/O was in service held one of a
/// small machine's cores whenever the drives were busy (about 40% of a
/// two-vCPU machine's CPU under load), which the engine and the bare
/// drives under test then lacked.
const TIMER_SLACK_NS: libc::c_ulong = 1;

fn timer() -> &'static Timer {
    static T: OnceLock<&'static Timer> = OnceLock::new();
    T.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer {
            heap: Mutex::new(BinaryHeap::new()),
            wake: Condvar::new(),
            seq: Default::default(),
        }));
        std::thread::Builder::new()
            .name("sim-nvme-timer".into())
            .spawn(move || {
                // SAFETY: PR_SET_TIMERSLACK takes its value as an integer
                // and changes only the calling thread's slack; no memory
                // is passed. Should it fail, the timer is only later.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0) };
                t.run()
            })
            .expect("spawn the simulated drives' timer thread");
        t
    })
}

impl Timer {
    fn add(&self, at: Instant, c: Arc<Completion>) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut h = self.heap.lock();
        let earliest = h.peek().is_none_or(|Reverse((t, _, _))| at < *t);
        h.push(Reverse((at, seq, TimerEntry(c))));
        if earliest {
            self.wake.notify_one();
        }
    }

    fn run(&self) {
        let mut h = self.heap.lock();
        loop {
            let now = Instant::now();
            while let Some(Reverse((t, _, _))) = h.peek() {
                if *t > now {
                    break;
                }
                let Reverse((_, _, TimerEntry(c))) = h.pop().expect("peeked");
                c.fire();
            }
            match h.peek().map(|Reverse((t, _, _))| *t) {
                None => self.wake.wait(&mut h),
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    if !left.is_zero() {
                        self.wake.wait_for(&mut h, left);
                    }
                }
            }
        }
    }
}

/// A simulated NVMe drive (see the module's documentation).
pub struct SimNvme {
    ram: RamMember,
    model: NvmeModel,
    /// When each of the drive's `queue` service slots is next free, and
    /// when its channel is (`NvmeModel::read_bw`).
    slots: Mutex<(BinaryHeap<Reverse<Instant>>, Instant)>,
    /// Counted by the array's I/O paths (see `Member::io_stats`).
    stats: crate::stats::IoStats,
    /// Every command the drive took (reads, writes, zeroing, flushes),
    /// whoever sent it: the journal's writes, uncounted in `stats`, among
    /// them.
    commands: AtomicU64,
}

impl SimNvme {
    pub fn new(name: impl Into<String>, size: u64, model: NvmeModel) -> SimNvme {
        let now = Instant::now();
        SimNvme {
            stats: Default::default(),
            commands: AtomicU64::new(0),
            ram: RamMember::new(name, size),
            model,
            slots: Mutex::new(((0..model.queue.max(1)).map(|_| Reverse(now)).collect(), now)),
        }
    }

    /// How many commands the drive has taken (reads, writes, zeroing and
    /// flushes), as a drive's own log counts them: what a benchmark weighs
    /// an I/O path by, where the drives' command rate is the bound.
    pub fn commands(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
    }

    /// When an I/O of this kind submitted now completes: it enters service
    /// when the earliest slot is free, and holds that slot for its service
    /// time; its bytes move through the drive's channel after those
    /// submitted before it, and it completes no sooner than they have.
    fn schedule(&self, write: bool, len: usize) -> Instant {
        self.commands.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut g = self.slots.lock();
        let (slots, channel) = &mut *g;
        let Reverse(free) = slots.pop().expect("at least one slot");
        let start = free.max(now);
        *channel = (*channel).max(start) + self.model.transfer(write, len);
        let done = (start + self.model.service(write, len)).max(*channel);
        slots.push(Reverse(done));
        done
    }

    fn io(&self, write: bool, len: usize) -> Arc<Completion> {
        self.completion_at(self.schedule(write, len))
    }

    /// A completion the timer thread fires at `at`.
    fn completion_at(&self, at: Instant) -> Arc<Completion> {
        let c = Completion::new();
        timer().add(at, c.clone());
        c
    }

    /// Moves `op`'s bytes (RAM) and says when the drive completes it: how
    /// every I/O a caller does not wait for in place starts.
    fn start(&self, op: &mut IoOp<'_>, offset: u64) -> io::Result<Instant> {
        op.run_on(&self.ram, offset)?;
        Ok(self.schedule(op.is_write(), op.len()))
    }
}

impl Member for SimNvme {
    fn io_stats(&self) -> Option<&crate::stats::IoStats> {
        Some(&self.stats)
    }
    fn identity(&self) -> &str {
        self.ram.identity()
    }
    fn device_key(&self) -> DeviceKey {
        self.ram.device_key()
    }
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.ram.read_at(buf, offset)?;
        self.io(false, buf.len()).wait();
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.ram.write_at(buf, offset)?;
        self.io(true, buf.len()).wait();
        Ok(())
    }
    /// The drive's cache is power-protected in this model: a flush costs
    /// one write's service time.
    fn flush(&self) -> io::Result<()> {
        self.io(true, 0).wait();
        Ok(())
    }
    /// Power-protected, a write with FUA costs what any write does.
    fn fua(&self) -> bool {
        true
    }
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.ram.write_zeroes(offset, len)?;
        self.io(true, 0).wait();
        Ok(())
    }
    fn begin_flush(&self) -> Option<super::FlushWait> {
        let c = self.io(true, 0);
        Some(Box::new(move || {
            c.wait();
            Ok(())
        }))
    }
    fn timed(&self) -> bool {
        true
    }
    /// A FUA write costs what any write does (above), timed or due alike.
    fn fua_timed(&self) -> bool {
        true
    }
    /// Its completion calls `done` on the timer thread.
    fn start_timed(
        &self,
        mut op: IoOp<'_>,
        offset: u64,
        done: super::TimedDone,
    ) -> Option<io::Result<()>> {
        Some(self.start(&mut op, offset).map(|at| {
            let c = Completion::new();
            *c.then.lock() = Some(Box::new(move || done(Ok(()))));
            timer().add(at, c);
        }))
    }
    /// The completion time alone, for a caller that waits on its own ring:
    /// the timer thread is not involved.
    fn start_due(&self, mut op: IoOp<'_>, offset: u64) -> Option<io::Result<Instant>> {
        Some(self.start(&mut op, offset))
    }
    fn begin(&self, io: &mut MemberIo<'_>) -> Option<io::Result<Box<dyn Pending>>> {
        let r = self.start(&mut io.op, io.offset);
        Some(r.map(|at| Box::new(self.completion_at(at)) as Box<dyn Pending>))
    }
}

/// The bytes moved at submission: waiting is only for the completion time.
impl Pending for Arc<Completion> {
    fn wait(self: Box<Self>, _io: &mut MemberIo<'_>) -> io::Result<()> {
        Completion::wait(&self);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads cost their service time, and the queue limit holds: 2 slots,
    /// 4 reads submitted together complete in two waves.
    #[test]
    fn latency_and_queue_limit() {
        let m = SimNvme::new(
            "sim:t",
            1 << 20,
            NvmeModel {
                read: Duration::from_millis(20),
                write: Duration::from_millis(5),
                queue: 2,
                read_bw: 0,
                write_bw: 0,
            },
        );
        let t = Instant::now();
        let mut b = vec![0u8; 4096];
        m.read_at(&mut b, 0).unwrap();
        let one = t.elapsed();
        assert!(one >= Duration::from_millis(20), "{one:?}");
        let t = Instant::now();
        let cs: Vec<_> = (0..4).map(|_| m.io(false, 4096)).collect();
        for c in &cs {
            c.wait();
        }
        let four = t.elapsed();
        assert!(four >= Duration::from_millis(40), "two waves: {four:?}");
        m.write_at(&[7u8; 4096], 8192).unwrap();
        m.read_at(&mut b, 8192).unwrap();
        assert!(b.iter().all(|&x| x == 7));
    }

    /// A due I/O moves its bytes at once and says when it completes: its
    /// service time on, the queue limit holding as for waited I/O (2
    /// slots: the third read's time is a service later), with no
    /// completion given to the timer thread.
    #[test]
    fn a_due_io_says_when_it_completes() {
        let model = NvmeModel {
            read: Duration::from_millis(20),
            write: Duration::from_millis(5),
            queue: 2,
            read_bw: 0,
            write_bw: 0,
        };
        let m = SimNvme::new("sim:due", 1 << 20, model);
        let t = Instant::now();
        let at = m
            .start_due(IoOp::Write(&[9u8; 4096]), 4096)
            .unwrap()
            .unwrap();
        assert!(at >= t + Duration::from_millis(5), "{:?}", at - t);
        let mut b = vec![0u8; 4096];
        let t = Instant::now();
        let first = m.start_due(IoOp::Read(&mut b), 4096).unwrap().unwrap();
        assert!(b.iter().all(|&x| x == 9), "the bytes moved at the start");
        m.start_due(IoOp::Read(&mut b), 0).unwrap().unwrap();
        let third = m.start_due(IoOp::Read(&mut b), 0).unwrap().unwrap();
        assert!(first >= t + Duration::from_millis(20));
        assert!(
            third >= first + Duration::from_millis(20),
            "{:?}",
            third - first
        );
        assert_eq!(m.commands(), 4);
        // Past the drive's end: refused, nothing scheduled.
        assert!(m.start_due(IoOp::Read(&mut b), 1 << 20).unwrap().is_err());
        assert_eq!(m.commands(), 4);
    }

    /// With a bandwidth, transfers queue on the drive's channel however
    /// many slots are free: four 1 MiB reads at 100 MB/s take 40 ms, where
    /// their latency alone is 1 ms.
    #[test]
    fn bandwidth_bounds_large_transfers() {
        let model = NvmeModel {
            read: Duration::from_millis(1),
            write: Duration::from_millis(1),
            queue: 64,
            read_bw: 0,
            write_bw: 0,
        }
        .with_bandwidth(100_000_000, 50_000_000);
        let m = SimNvme::new("sim:bw", 8 << 20, model);
        let t = Instant::now();
        let cs: Vec<_> = (0..4).map(|_| m.io(false, 1 << 20)).collect();
        for c in &cs {
            c.wait();
        }
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(41), "{took:?}");
        // Writes move at their own rate: 1 MiB at 50 MB/s is 21 ms.
        let t = Instant::now();
        m.io(true, 1 << 20).wait();
        assert!(
            t.elapsed() >= Duration::from_millis(20),
            "{:?}",
            t.elapsed()
        );
    }
}
