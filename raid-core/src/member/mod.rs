//! Members: the drives (or files, or RAM) an array is made of, behind one
//! trait, and the batch submission that puts one request's member I/Os in
//! flight together.

mod faulty;
mod file;
mod ram;
mod reserved;
mod sim_nvme;
mod uring;

pub use faulty::{undo_to_durable, Faults, FaultyMember};
pub use file::{holes_trusted_at, loop_backing, FileMember, LoopBacking};
pub use ram::RamMember;
pub use sim_nvme::{Completion, NvmeModel, SimNvme};
pub(crate) use uring::rw_entry;
pub use uring::{io_path, IoPath};

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::stats::{IoStats, Started};

/// What makes two member handles the same device, whatever path named
/// them: a hard link, a bind mount or a second path to one block device is
/// the same member. Paths are only how the operator names a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKey {
    /// A regular file: its filesystem and inode.
    File { dev: u64, ino: u64 },
    /// A block device: its device number.
    Block { rdev: u64 },
    /// A RAM member: a number unique in this process.
    Ram(u64),
    /// A device on another host (an NBD export): a hash of where it is
    /// served (host, port or socket, export name). Two URIs for one export
    /// are not recognised as one; the array metadata on the device is what
    /// identifies it as a member.
    Network(u64),
}

impl DeviceKey {
    /// Whether I/O to both lands on one device: files on one filesystem.
    /// A job that writes one while it reads the other gains nothing by
    /// overlapping the two there (the device does both in turn), and a
    /// single disk serves large runs of one kind better than the two mixed.
    pub fn shares_a_disk_with(self, other: DeviceKey) -> bool {
        matches!((self, other), (DeviceKey::File { dev: a, .. }, DeviceKey::File { dev: b, .. }) if a == b)
    }
}

impl std::fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceKey::File { dev, ino } => write!(f, "file dev {dev:#x} inode {ino}"),
            DeviceKey::Block { rdev } => {
                write!(
                    f,
                    "block device {}:{}",
                    libc::major(*rdev),
                    libc::minor(*rdev)
                )
            }
            DeviceKey::Ram(n) => write!(f, "ram member #{n}"),
            DeviceKey::Network(h) => write!(f, "network export {h:#018x}"),
        }
    }
}

impl DeviceKey {
    /// The key of what `path` names now (following symlinks), without
    /// opening it.
    pub fn of_path(path: &std::path::Path) -> io::Result<DeviceKey> {
        use std::os::unix::fs::FileTypeExt;
        let m = std::fs::metadata(path)?;
        Ok(DeviceKey::of_metadata(&m, m.file_type().is_block_device()))
    }

    pub(crate) fn of_metadata(m: &std::fs::Metadata, block: bool) -> DeviceKey {
        use std::os::unix::fs::MetadataExt;
        if block {
            DeviceKey::Block { rdev: m.rdev() }
        } else {
            DeviceKey::File {
                dev: m.dev(),
                ino: m.ino(),
            }
        }
    }
}

/// One member device. Offsets are absolute byte offsets on the device.
///
/// Durability: a completed `write_at` may sit in a volatile cache (the
/// drive's, or the page cache of a file opened without O_DIRECT) until
/// `flush` returns.
pub trait Member: Send + Sync {
    /// How the operator names it: a path, or "ram:N".
    fn identity(&self) -> &str;
    /// Which device this is, by identity rather than name (see
    /// `DeviceKey`): the array refuses a device it already holds.
    fn device_key(&self) -> DeviceKey;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// The file behind the member now (one fstat), where it can change
    /// under the array: a regular file someone truncates or deletes. None
    /// where it cannot (block devices, memory, network).
    fn file_now(&self) -> Option<io::Result<FileNow>> {
        None
    }
    /// The first run of data at or after `offset`, `start..end`: every
    /// byte of [offset, start) is a hole, which reads back as zeros
    /// without being stored, and [start, end) may hold data (`end` may
    /// lie past anything known: counted as data too). `None` where the
    /// device cannot tell, which counts as data from `offset` on. Used to
    /// tell a copy which parts of the array it may skip
    /// (`Array::zero_extents`), so a hole said where data was written
    /// would lose that data in the copy: a device answers only from a
    /// filesystem trusted to count unwritten-back data as data.
    fn data_from(&self, offset: u64) -> Option<std::ops::Range<u64>> {
        let _ = offset;
        None
    }
    /// `data_from(offset)`'s start alone: every byte of [offset, it) is
    /// a hole. Where the run's end is dear to find (tmpfs walks every
    /// page of a run of data to find where it ends: a millisecond for
    /// 512 MiB), a caller that only asks whether a range is all holes
    /// (an NBD read, `Array::reads_as_zeros`) asks this.
    fn data_start_from(&self, offset: u64) -> Option<u64> {
        self.data_from(offset).map(|r| r.start)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Whether the device makes one write durable by itself, in the one
    /// command (Force Unit Access: `write_fua_at`, `IoOp::WriteFua`). A
    /// write that must be durable before others may start (a journal
    /// record, a write-intent bit) then costs one round trip instead of
    /// a write and a flush, and on a drive with a volatile cache it makes
    /// its own bytes durable, not all the cache holds. False: such writes
    /// are written, then the member flushed once (`Array::write_durably`),
    /// which is cheaper where FUA would be a flush per write.
    fn fua(&self) -> bool {
        false
    }
    /// `write_at`, durable when it returns: one command where `fua` is
    /// true; by default `write_then_flush`.
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        write_then_flush(self, buf, offset)
    }
    /// Whether `flush` waits for something (a device's cache, a remote
    /// server): flushes of several members that wait run together, each on
    /// a thread (`Array::flush`, the journal's group commit). False where
    /// a flush returns at once (memory), so no thread is spent on it.
    fn flush_waits(&self) -> bool {
        !self.in_memory()
    }
    /// Makes the range read back as zeros, discarding it where the device
    /// can (hole punch, discard-with-zeroes).
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;
    /// `write_zeroes` for a job that fills a new member (a rebuild's or a
    /// hot replace's rows of holes): the range keeps, or gets, its blocks
    /// where the device can, as the rows the job writes do, so that the
    /// new member is as safe from a filling filesystem as `create` made
    /// its peers (`FileMember::allocate`).
    fn write_zeroes_allocated(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }
    /// Whether the blocks a write to [offset, offset+len) needs are there
    /// already, so it cannot meet a full filesystem: true but for a sparse
    /// file's regions not yet reserved (`reserve`). Asked by a caller that
    /// must not block before it writes; false sends it to one that may.
    fn reserved(&self, _offset: u64, _len: u64) -> bool {
        true
    }
    /// Makes `reserved(offset, len)` true where the device can: a sparse
    /// file's blocks allocated (`fallocate`, the bytes kept), so that a
    /// full filesystem refuses the write here, before anything of its
    /// request is written (`reserved.rs`). May block.
    fn reserve(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// I/O on this member is a copy between memory and memory (a file on
    /// tmpfs): it is run in place, by the caller, even where the caller
    /// must not block. io_uring would hand each such I/O to a kernel worker
    /// thread (these files take no non-blocking I/O), which costs more
    /// than the copy.
    fn in_memory(&self) -> bool {
        false
    }
    /// The file descriptor for the io_uring path, when I/O on this member is
    /// plain reads and writes of an fd. `None` sends its I/O through
    /// `read_at`/`write_at`.
    fn uring_fd(&self) -> Option<RawFd> {
        None
    }
    /// Whether the fd was opened with O_DIRECT (buffers must then be aligned).
    fn is_direct(&self) -> bool {
        false
    }
    /// Starts one I/O of a batch without waiting for it, for a member that
    /// can have many in flight without a thread each (the simulated drive,
    /// a network member with many requests on one connection):
    /// `submit` starts every such I/O of a batch, then waits for them all.
    /// `None`: not such a member; the I/O goes the other ways.
    fn begin(&self, io: &mut MemberIo<'_>) -> Option<io::Result<Box<dyn Pending>>> {
        let _ = io;
        None
    }
    /// Starts a flush that completes at a time of the member's own (the
    /// simulated drive's), for a caller flushing several members at once
    /// without a thread each (`Array`'s flushes, the journal's groups);
    /// what it returns waits for the flush. `None`: not such a member; the
    /// caller runs `flush`. A wrapper that does work of its own in `flush`
    /// (a test's power-cut tracking) must not pass this through.
    fn begin_flush(&self) -> Option<FlushWait> {
        None
    }
    /// Whether this member serves `start_timed`.
    fn timed(&self) -> bool {
        false
    }
    /// Whether `start_timed` (and `start_due`, where it serves that) takes
    /// `IoOp::WriteFua` too, durable when it completes: a shard's write
    /// asked for with FUA (`shard::Engine::write_fua`) runs on the shard
    /// only on members that take it there (or on its ring, or in memory).
    fn fua_timed(&self) -> bool {
        false
    }
    /// Starts a read or a plain write (`IoOp::WriteFua` only where
    /// `fua_timed` says so) for a caller that must not block (a
    /// shard's event loop), on a member that completes I/O at a time of
    /// its own without a thread waiting (the simulated drive, RAM): the bytes have
    /// moved when this returns `Some(Ok)`, and `done` is called when the
    /// I/O completes (from another thread, or before this returns), with
    /// its outcome: a device may fail an I/O it had taken. `None`: not
    /// such a member.
    fn start_timed(&self, op: IoOp<'_>, offset: u64, done: TimedDone) -> Option<io::Result<()>> {
        let _ = (op, offset, done);
        None
    }
    /// Starts a read or write, as `start_timed` does, on a member that
    /// can tell as it starts when the I/O will complete (the simulated
    /// drive): the bytes have moved when this returns `Some(Ok(at))`, and
    /// the I/O completes at `at` (on the monotonic clock, which `Instant`
    /// reads), which the caller waits for on its own ring (an io_uring
    /// timeout, a kernel timer) as it would for a real device's
    /// completion, with no thread of the member's woken per I/O. `None`:
    /// not such a member (the caller tries `start_timed`). A wrapper that
    /// does work of its own per I/O (faults) must not pass this through.
    /// A member that serves this serves `start_timed` too, and says so
    /// (`timed`): that is what tells a shard it may take its I/O at all,
    /// and what it uses where its ring cannot wait for a time.
    fn start_due(&self, op: IoOp<'_>, offset: u64) -> Option<io::Result<std::time::Instant>> {
        let _ = (op, offset);
        None
    }
    /// The device stopped answering, as opposed to reporting errors: a
    /// network member whose export could not be reached within its
    /// timeout. It may come back by itself, and the daemon then re-adds
    /// it; a member failed for any other reason is left to the operator.
    fn unreachable(&self) -> bool {
        false
    }
    /// This device's I/O counters, kept by `submit` and the array's fast
    /// paths (the member only holds them, so each device counts its own
    /// and a replacement starts from zero). `None`: not counted.
    fn io_stats(&self) -> Option<&IoStats> {
        None
    }
    /// A member that is two devices written together (a hot replace's
    /// old device and its replacement): where each of its I/Os goes, so a
    /// caller that must not block (a shard) can run them on the devices'
    /// own paths, both halves of a write in flight at once. `None`: one
    /// device.
    fn pair(&self) -> Option<&dyn Pair> {
        None
    }
}

/// Where the I/O of a member made of two devices goes (`Member::pair`).
/// Its own `read_at`/`write_at` follow the same rules one I/O at a time.
pub trait Pair: Send + Sync {
    /// Both devices, whatever the I/Os now go to.
    fn devices(&self) -> [&MemberRef; 2];
    /// The device a read goes to now.
    fn read_from(&self) -> &MemberRef;
    /// The devices a write at `offset` goes to now: the one whose result
    /// is the write's, and the one written alongside, if any, whose error
    /// goes to `second_failed`.
    fn write_to(&self, offset: u64) -> (&MemberRef, Option<&MemberRef>);
    /// The device written alongside failed a write (`e`): `Ok` where that
    /// only drops it and the write stands on the first, `Err` where its
    /// errors are the write's by now.
    fn second_failed(&self, e: io::Error) -> io::Result<()>;
}

/// Waits for a flush `Member::begin_flush` started, and says how it went.
pub type FlushWait = Box<dyn FnOnce() -> io::Result<()> + Send>;

/// What a timed I/O's completion is told (`Member::start_timed`).
pub type TimedDone = Box<dyn FnOnce(io::Result<()>) + Send>;

/// An I/O a member started (`Member::begin`) and has not finished.
pub trait Pending: Send {
    /// Blocks until the I/O completes; a read's data is then in `io`'s
    /// buffer (the same `io` that was given to `begin`).
    fn wait(self: Box<Self>, io: &mut MemberIo<'_>) -> io::Result<()>;
}

/// `read_at`, counted in the member's `io_stats`.
pub fn read_counted(m: &dyn Member, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let t = Started::now();
    let r = m.read_at(buf, offset);
    count_took(m, true, buf.len(), t.took(), r.is_ok());
    r
}

/// A write made durable the way any member can: written, then the member
/// flushed. What `Member::write_fua_at` does by default, and where a
/// member that takes FUA falls back (its FUA off, or refused).
pub fn write_then_flush<M: Member + ?Sized>(m: &M, buf: &[u8], offset: u64) -> io::Result<()> {
    m.write_at(buf, offset)?;
    m.flush()
}

/// `write_at`, counted in the member's `io_stats`.
pub fn write_counted(m: &dyn Member, buf: &[u8], offset: u64) -> io::Result<()> {
    counted_write(m, buf, || m.write_at(buf, offset))
}

/// `write_fua_at`, counted as a write in the member's `io_stats`.
pub fn write_fua_counted(m: &dyn Member, buf: &[u8], offset: u64) -> io::Result<()> {
    counted_write(m, buf, || m.write_fua_at(buf, offset))
}

/// `write`, a write of `buf` to `m`, timed and counted.
fn counted_write(
    m: &dyn Member,
    buf: &[u8],
    write: impl FnOnce() -> io::Result<()>,
) -> io::Result<()> {
    let t = Started::now();
    let r = write();
    count_took(m, false, buf.len(), t.took(), r.is_ok());
    r
}

/// `flush`, counted in the member's `io_stats`.
pub fn flush_counted(m: &dyn Member) -> io::Result<()> {
    let t = Started::now();
    let r = m.flush();
    if let Some(s) = m.io_stats() {
        s.flush.record(0, t.took(), r.is_ok());
    }
    r
}

/// Counts one read or write in the member's `io_stats`, with its latency
/// when it was timed (`took` from a `Started`: the caller may share one
/// clock read between counts, as the array's fast path and a ring batch do).
pub fn count_took(
    m: &dyn Member,
    read: bool,
    len: usize,
    took: Option<std::time::Duration>,
    ok: bool,
) {
    if let Some(s) = m.io_stats() {
        let op = if read { &s.read } else { &s.write };
        op.record(len as u64, took, ok);
    }
}

/// A shared member handle.
pub type MemberRef = Arc<dyn Member>;

/// One member I/O of a batch.
/// A member file as `Member::file_now` finds it.
#[derive(Clone, Copy, Debug)]
pub struct FileNow {
    /// Its size in bytes.
    pub len: u64,
    /// Still named by some path: deleted while in use, the array reaches
    /// it through its open file, but a start will not find it.
    pub linked: bool,
}

pub struct MemberIo<'a> {
    /// Index into the member slice given to `submit`.
    pub member: usize,
    pub offset: u64,
    pub op: IoOp<'a>,
}

pub enum IoOp<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
    /// A write durable when it completes (`Member::write_fua_at`): sent
    /// where the member's `fua` is true by `Array::write_durably`, and by
    /// a shard for a client's write asked for with FUA
    /// (`shard::Engine::write_fua`; timed only where `fua_timed`).
    WriteFua(&'a [u8]),
}

/// What one member I/O does, without its buffer: the ring entry's
/// (`uring::rw_entry`) and a shard's request's (`shard`) word for it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum IoKind {
    Read,
    Write,
    /// A write durable when it completes (`IoOp::WriteFua`).
    WriteFua,
}

impl IoOp<'_> {
    /// What it does.
    pub(crate) fn kind(&self) -> IoKind {
        match self {
            IoOp::Read(_) => IoKind::Read,
            IoOp::Write(_) => IoKind::Write,
            IoOp::WriteFua(_) => IoKind::WriteFua,
        }
    }

    /// Where its bytes are, for a ring entry (a write's are only read).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            IoOp::Read(b) => b.as_mut_ptr(),
            IoOp::Write(b) | IoOp::WriteFua(b) => b.as_ptr().cast_mut(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            IoOp::Read(b) => b.len(),
            IoOp::Write(b) | IoOp::WriteFua(b) => b.len(),
        }
    }

    /// A write of either kind.
    pub fn is_write(&self) -> bool {
        !matches!(self, IoOp::Read(_))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves the bytes between the buffer and `m` at `offset` (its own
    /// `read_at`, `write_at` or `write_fua_at`, uncounted).
    pub fn run_on(&mut self, m: &dyn Member, offset: u64) -> io::Result<()> {
        self.run_from(m, offset, 0)
    }

    /// `run_on` for the part of the buffer from byte `done` on, at
    /// `offset + done`: the rest of an I/O that came back short.
    pub fn run_from(&mut self, m: &dyn Member, offset: u64, done: usize) -> io::Result<()> {
        let at = offset + done as u64;
        match self {
            IoOp::Read(b) => m.read_at(&mut b[done..], at),
            IoOp::Write(b) => m.write_at(&b[done..], at),
            IoOp::WriteFua(b) => m.write_fua_at(&b[done..], at),
        }
    }
}

impl MemberIo<'_> {
    pub fn len(&self) -> usize {
        self.op.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs this one I/O through the member's synchronous path.
    fn run_sync(&mut self, m: &dyn Member, counted: bool) -> io::Result<()> {
        match (&mut self.op, counted) {
            (IoOp::Read(b), true) => read_counted(m, b, self.offset),
            (IoOp::Write(b), true) => write_counted(m, b, self.offset),
            (IoOp::WriteFua(b), true) => write_fua_counted(m, b, self.offset),
            (op, false) => op.run_on(m, self.offset),
        }
    }

    fn is_read(&self) -> bool {
        matches!(self.op, IoOp::Read(_))
    }
}

/// Whether I/O on `m` goes through an io_uring (a batch's, a shard's): a
/// member with a file descriptor, not in memory, where io_uring is used.
pub(crate) fn on_ring(m: &dyn Member) -> bool {
    m.uring_fd().is_some() && !m.in_memory() && io_path() == IoPath::IoUring
}

/// Synchronous batches at least this large are spread over threads; below
/// it, a thread hand-off costs more than it saves.
const PARALLEL_SYNC_BYTES: usize = 1 << 20;

/// Submits a batch of member I/Os and waits for all of them. Members with an
/// fd go through this thread's io_uring together (one submission for the
/// whole batch); the rest run through their own `read_at`/`write_at`. The
/// result for each I/O is returned in order, so a caller knows exactly which
/// member failed. Each I/O is counted in its member's statistics.
pub fn submit(members: &[MemberRef], ios: &mut [MemberIo<'_>]) -> Vec<io::Result<()>> {
    submit_as(members, ios, true)
}

/// `submit`, not counted in the members' statistics: the array's own
/// journal and metadata writes, which it counts apart from the data path.
pub fn submit_uncounted(members: &[MemberRef], ios: &mut [MemberIo<'_>]) -> Vec<io::Result<()>> {
    submit_as(members, ios, false)
}

/// Whether an I/O error says a filesystem is full (ENOSPC, or the user's
/// quota: EDQUOT), which says nothing against the device.
pub fn is_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

fn submit_as(
    members: &[MemberRef],
    ios: &mut [MemberIo<'_>],
    counted: bool,
) -> Vec<io::Result<()>> {
    let count = |m: &dyn Member, read, len, took, ok| {
        if counted {
            count_took(m, read, len, took, ok)
        }
    };
    let mut results: Vec<Option<io::Result<()>>> = (0..ios.len()).map(|_| None).collect();
    let mut ring_ios: Vec<usize> = Vec::new();
    for (i, io) in ios.iter().enumerate() {
        let m = members[io.member].as_ref();
        let buf_ok = !m.is_direct()
            || match &io.op {
                IoOp::Read(b) => crate::buf::is_aligned(b),
                IoOp::Write(b) | IoOp::WriteFua(b) => crate::buf::is_aligned(b),
            };
        if on_ring(m) && buf_ok {
            ring_ios.push(i);
        }
    }
    // Members that start I/Os without blocking (simulated drives): all of
    // them started first, waited for together.
    let mut started: Vec<(usize, Box<dyn Pending>)> = Vec::new();
    let mut on_ring = ring_ios.iter().peekable();
    for (i, io) in ios.iter_mut().enumerate() {
        // Members on the ring have an fd and never start I/Os this way.
        if on_ring.next_if_eq(&&i).is_some() {
            continue;
        }
        match members[io.member].begin(io) {
            Some(Ok(c)) => started.push((i, c)),
            Some(Err(e)) => {
                count(
                    members[io.member].as_ref(),
                    io.is_read(),
                    io.len(),
                    None,
                    false,
                );
                results[i] = Some(Err(e));
            }
            None => {}
        }
    }
    // The started and ring I/Os are counted from the batch's start to when
    // their completion was collected (the ring's together, at the end of
    // its batch); the synchronous ones each on their own, in `run_sync`.
    let began = Started::now();
    for (i, p) in started {
        let io = &mut ios[i];
        let r = p.wait(io);
        count(
            members[io.member].as_ref(),
            io.is_read(),
            io.len(),
            began.took(),
            r.is_ok(),
        );
        results[i] = Some(r);
    }
    if ring_ios.len() > 1 {
        // None: no ring could be had; the I/Os go the synchronous way below.
        if let Some(done) = uring::run_batch(members, ios, &ring_ios) {
            // One clock read for the batch: its I/Os were collected together.
            let took = began.took();
            for (k, r) in ring_ios.iter().zip(done) {
                let io = &ios[*k];
                count(
                    members[io.member].as_ref(),
                    io.is_read(),
                    io.len(),
                    took,
                    r.is_ok(),
                );
                results[*k] = Some(r);
            }
        }
    }
    // The rest run through the members' own calls: in parallel when the
    // batch is large (a rebuild's reads, the pread/pwrite fallback), since
    // running them one after another would serialise the members.
    let sync_bytes: usize = ios
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_none())
        .map(|(io, _)| io.len())
        .sum();
    if sync_bytes >= PARALLEL_SYNC_BYTES {
        use rayon::prelude::*;
        ios.par_iter_mut()
            .zip(results.par_iter_mut())
            .for_each(|(io, r)| {
                if r.is_none() {
                    *r = Some(io.run_sync(members[io.member].as_ref(), counted));
                }
            });
    } else {
        for (i, io) in ios.iter_mut().enumerate() {
            if results[i].is_none() {
                results[i] = Some(io.run_sync(members[io.member].as_ref(), counted));
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every I/O ran"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files on one filesystem share a disk; two filesystems, block
    /// devices, RAM and network members do not.
    #[test]
    fn which_devices_share_a_disk() {
        let f = |dev, ino| DeviceKey::File { dev, ino };
        assert!(f(1, 10).shares_a_disk_with(f(1, 11)));
        assert!(!f(1, 10).shares_a_disk_with(f(2, 10)));
        assert!(!DeviceKey::Block { rdev: 5 }.shares_a_disk_with(DeviceKey::Block { rdev: 6 }));
        assert!(!DeviceKey::Ram(1).shares_a_disk_with(DeviceKey::Ram(2)));
        assert!(!f(1, 10).shares_a_disk_with(DeviceKey::Network(1)));
    }
}
