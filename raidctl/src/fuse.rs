//! The FUSE export: the array as one file in a FUSE mount, so that a loop
//! device (`losetup --direct-io=on`) turns it into a real block device on
//! hosts without the NBD or ublk drivers (containers, these test machines).
//!
//! fsync is the array's flush; fallocate(PUNCH_HOLE) and
//! fallocate(ZERO_RANGE) are discard / write-zeroes. Requests need not be
//! block aligned: partial blocks are read, merged and written back with no
//! other write running (see `ArrayFs::partial`).
//!
//! Many requests at once: the thread that reads `/dev/fuse` only decodes a
//! request and hands it, with its reply, to a pool of workers
//! (`FUSE_WORKERS`), which call the array and reply as each finishes. The
//! kernel is asked for asynchronous direct I/O (so a loop device's queue
//! reaches here as concurrent requests, not one at a time), up to 1 MiB per
//! request, and up to `MAX_BACKGROUND` requests queued. (Several `/dev/fuse`
//! queues, or FUSE over io_uring, would also spread the reading of requests;
//! the FUSE crate used here reads from one.)

use parking_lot::RwLock;
use raid_core::array::{Array, BLOCK};
use raid_core::buf::AlignedBuf;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, Request,
};

const ROOT: u64 = 1;
const FILE: u64 = 2;
const TTL: Duration = Duration::from_secs(1);

/// Requests served at once: the array's API blocks a thread per request in
/// flight, so this is the export's queue depth (RAIDCTL_FUSE_WORKERS
/// changes it). More threads than requests in flight only cost wake-ups.
const FUSE_WORKERS: usize = 32;

fn workers() -> usize {
    std::env::var("RAIDCTL_FUSE_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| (1..=1024).contains(&n))
        .unwrap_or(FUSE_WORKERS)
}
/// Largest read or write the kernel sends in one request.
const MAX_IO: u32 = 1 << 20;
/// Requests the kernel keeps queued for the filesystem (asynchronous reads
/// and direct I/O count against it).
const MAX_BACKGROUND: u16 = 256;

/// The array's side of the export: what the workers call.
struct Io {
    array: Arc<Array>,
    /// Whole-block writes take it shared, a read-merge-write of a partial
    /// block exclusive: no write can land between its read and its write.
    partial: RwLock<()>,
}

type Job = Box<dyn FnOnce(&Io) + Send>;

/// The workers and the queue they take jobs from.
struct Pool {
    tx: Option<std::sync::mpsc::Sender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Pool {
    fn new(io: Arc<Io>, n: usize) -> Pool {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let rx = Arc::new(parking_lot::Mutex::new(rx));
        let threads = (0..n)
            .map(|i| {
                let (rx, io) = (rx.clone(), io.clone());
                std::thread::Builder::new()
                    .name(format!("fuse-io-{i}"))
                    .spawn(move || loop {
                        let job = rx.lock().recv();
                        match job {
                            Ok(job) => job(&io),
                            Err(_) => return,
                        }
                    })
                    .expect("spawn a FUSE worker")
            })
            .collect();
        Pool {
            tx: Some(tx),
            threads,
        }
    }

    fn run(&self, job: impl FnOnce(&Io) + Send + 'static) {
        if let Some(tx) = &self.tx {
            // The workers live as long as the pool: the send cannot fail.
            let _ = tx.send(Box::new(job));
        }
    }
}

impl Drop for Pool {
    /// Lets the workers finish what is queued, then joins them. The pool is
    /// dropped with the filesystem when the session ends, which
    /// `Mounted::unmount` waits for: it returns once every request has been
    /// answered.
    fn drop(&mut self) {
        drop(self.tx.take());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

pub struct ArrayFs {
    array: Arc<Array>,
    name: String,
    ctime: SystemTime,
    pool: Pool,
}

impl ArrayFs {
    pub fn new(array: Arc<Array>) -> ArrayFs {
        let name = array.name().to_string();
        let io = Arc::new(Io {
            array: array.clone(),
            partial: RwLock::new(()),
        });
        ArrayFs {
            array,
            name,
            ctime: SystemTime::now(),
            pool: Pool::new(io, workers()),
        }
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let (kind, perm, size, nlink) = if ino == ROOT {
            (FileType::Directory, 0o755, 0, 2)
        } else {
            (FileType::RegularFile, 0o600, self.array.capacity(), 1)
        };
        FileAttr {
            ino,
            size,
            blocks: size / 512,
            atime: self.ctime,
            mtime: self.ctime,
            ctime: self.ctime,
            crtime: self.ctime,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: BLOCK as u32,
            flags: 0,
        }
    }
}

impl Io {
    /// Reads any byte range inside the array; returns the buffer and where
    /// in it the range starts. Page-aligned buffers, so members opened with
    /// O_DIRECT take them through io_uring as they are, with no copy.
    fn read_any(&self, offset: u64, len: usize) -> Result<(AlignedBuf, usize), i32> {
        let start = offset / BLOCK * BLOCK;
        let end = (offset + len as u64).div_ceil(BLOCK) * BLOCK;
        let mut buf = AlignedBuf::new((end - start) as usize);
        self.array.read(start, &mut buf).map_err(|_| libc::EIO)?;
        Ok((buf, (offset - start) as usize))
    }

    /// Writes any byte range inside the array.
    fn write_any(&self, offset: u64, data: &[u8]) -> Result<(), i32> {
        let end = offset + data.len() as u64;
        if offset.is_multiple_of(BLOCK) && end.is_multiple_of(BLOCK) {
            let _g = self.partial.read();
            return self.array.write(offset, data).map_err(|_| libc::EIO);
        }
        let _g = self.partial.write();
        let start = offset / BLOCK * BLOCK;
        let aend = end.div_ceil(BLOCK) * BLOCK;
        let mut buf = vec![0u8; (aend - start) as usize];
        // Only the first and last blocks need their old contents.
        self.array
            .read(start, &mut buf[..BLOCK as usize])
            .map_err(|_| libc::EIO)?;
        let last = (aend - BLOCK - start) as usize;
        self.array
            .read(aend - BLOCK, &mut buf[last..])
            .map_err(|_| libc::EIO)?;
        let from = (offset - start) as usize;
        buf[from..from + data.len()].copy_from_slice(data);
        self.array.write(start, &buf).map_err(|_| libc::EIO)
    }

    /// Zeroes any byte range: whole blocks through the array's
    /// write-zeroes (a discard on the members), edges by writing zeros.
    fn zero_any(&self, offset: u64, len: u64) -> Result<(), i32> {
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
            let _g = self.partial.read();
            self.array.write_zeroes(a, b - a).map_err(|_| libc::EIO)?;
        }
        if end > b {
            self.write_any(b, &vec![0u8; (end - b) as usize])?;
        }
        Ok(())
    }
}

impl Filesystem for ArrayFs {
    /// Asks for concurrent direct I/O and large requests; what the kernel
    /// refuses is logged and the export works without it.
    fn init(
        &mut self,
        _req: &Request<'_>,
        config: &mut fuser::KernelConfig,
    ) -> Result<(), libc::c_int> {
        if let Err(e) = config.add_capabilities(fuser::consts::FUSE_ASYNC_DIO) {
            tracing::warn!(
                missing = e,
                "FUSE: no asynchronous direct I/O; requests come one at a time per file"
            );
        }
        if let Err(max) = config.set_max_write(MAX_IO) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        tracing::info!(
            workers = self.pool.threads.len(),
            max_io = MAX_IO,
            "FUSE export ready"
        );
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == OsStr::new(&self.name) {
            reply.entry(&TTL, &self.attr(FILE), 0);
        } else {
            reply.error(libc::ENOENT);
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyAttr) {
        match ino {
            ROOT | FILE => reply.attr(&TTL, &self.attr(ino)),
            _ => reply.error(libc::ENOENT),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        // The file is the array: its size cannot change.
        if size.is_some_and(|s| s != self.array.capacity()) {
            reply.error(libc::EPERM);
            return;
        }
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if ino != FILE {
            reply.error(libc::EISDIR);
            return;
        }
        // Direct I/O: no second cache in front of the array, so fsync and
        // the loop device see exactly what the array holds.
        reply.opened(0, fuser::consts::FOPEN_DIRECT_IO);
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock: Option<u64>,
        reply: ReplyData,
    ) {
        let cap = self.array.capacity();
        let off = offset.max(0) as u64;
        if off >= cap {
            reply.data(&[]);
            return;
        }
        let len = (size as u64).min(cap - off) as usize;
        self.pool.run(move |io| match io.read_any(off, len) {
            Ok((buf, from)) => reply.data(&buf[from..from + len]),
            Err(e) => reply.error(e),
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock: Option<u64>,
        reply: ReplyWrite,
    ) {
        let off = offset.max(0) as u64;
        if off + data.len() as u64 > self.array.capacity() {
            reply.error(libc::ENOSPC);
            return;
        }
        // The request's buffer is the session's, reused for the next
        // request: the worker gets a copy, page-aligned (see read_any).
        let mut copy = AlignedBuf::new(data.len());
        copy.copy_from_slice(data);
        let data = copy;
        self.pool.run(move |io| match io.write_any(off, &data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        });
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Covers every write answered before it was sent: a write is
        // answered only once the array has it.
        self.pool.run(move |io| match io.array.flush() {
            Ok(()) => reply.ok(),
            Err(_) => reply.error(libc::EIO),
        });
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let (off, len) = (offset.max(0) as u64, length.max(0) as u64);
        if off + len > self.array.capacity() {
            reply.error(libc::ENOSPC);
            return;
        }
        if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) == 0 {
            // Plain allocation: every byte of the array already exists.
            reply.ok();
            return;
        }
        self.pool.run(move |io| match io.zero_any(off, len) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            reply.error(libc::ENOTDIR);
            return;
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (FILE, FileType::RegularFile, self.name.as_str()),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as i64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// A FUSE mount of an array, and the loop device on it if any.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    pub dir: std::path::PathBuf,
    pub file: std::path::PathBuf,
    pub loop_dev: Option<String>,
}

impl Mounted {
    pub fn mount(
        array: Arc<Array>,
        dir: &std::path::Path,
        with_loop: bool,
    ) -> Result<Mounted, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create mount point {}: {e}", dir.display()))?;
        let file = dir.join(array.name());
        let opts = [
            fuser::MountOption::FSName(format!("raidctl:{}", array.name())),
            fuser::MountOption::AllowOther,
        ];
        let session = fuser::spawn_mount2(ArrayFs::new(array), dir, &opts).map_err(|e| {
            format!(
                "FUSE mount on {} failed: {e} (is /dev/fuse there? are you root?)",
                dir.display()
            )
        })?;
        let mut m = Mounted {
            session: Some(session),
            dir: dir.to_path_buf(),
            file,
            loop_dev: None,
        };
        if with_loop {
            m.loop_dev = Some(attach_loop(&m.file)?);
        }
        Ok(m)
    }

    /// Detaches the loop device and unmounts; refuses while the loop
    /// device is mounted somewhere, or the FUSE mount is still in use (a
    /// loop device detached lazily by the kernel because something still
    /// holds it, a process with the file open). Refused, the mount is
    /// handed back as it was. Done, every request the workers had is
    /// answered: the session and its workers are joined.
    pub fn unmount(mut self) -> Result<(), Box<(Mounted, String)>> {
        if let Some(dev) = self.loop_dev.clone() {
            if let Some(mp) = mounted_at(&dev) {
                return Err(Box::new((
                    self,
                    format!("{dev} is mounted on {mp}: umount {mp} first"),
                )));
            }
            let out = match std::process::Command::new("losetup")
                .arg("-d")
                .arg(&dev)
                .output()
            {
                Ok(o) => o,
                Err(e) => return Err(Box::new((self, format!("losetup: {e}")))),
            };
            if !out.status.success() {
                let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
                return Err(Box::new((self, format!("losetup -d {dev}: {why}"))));
            }
            self.loop_dev = None;
        }
        // Unmounted here rather than by the FUSE crate, which only logs a
        // failure: a mount that is still busy keeps serving the array.
        if let Err(e) = umount(&self.dir) {
            let dir = self.dir.display().to_string();
            return Err(Box::new((
                self,
                format!("{dir} is still in use ({e}): stop what holds it (fuser -vm {dir}), then unmount again"),
            )));
        }
        if let Some(session) = self.session.take() {
            // The kernel has ended the connection: the session thread ends,
            // and with it the filesystem, whose pool answers what it holds.
            session.join();
        }
        Ok(())
    }
}

/// Unmounts a FUSE mount point (not lazily: busy is an error).
fn umount(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a NUL-terminated path that lives across the call;
    // umount2 reads it and nothing else.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Where a block device is mounted, from /proc/mounts.
pub fn mounted_at(dev: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/mounts").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == dev).then(|| f.next().unwrap_or("").to_string())
    })
}

fn attach_loop(file: &std::path::Path) -> Result<String, String> {
    let run = |direct: bool| {
        let mut c = std::process::Command::new("losetup");
        c.args(["--find", "--show", "--sector-size", "4096"]);
        if direct {
            c.arg("--direct-io=on");
        }
        c.arg(file).output()
    };
    let out = run(true).map_err(|e| format!("losetup: {e} (package util-linux / mount)"))?;
    let out = if out.status.success() {
        out
    } else {
        run(false).map_err(|e| format!("losetup: {e}"))?
    };
    if !out.status.success() {
        return Err(format!(
            "losetup {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
