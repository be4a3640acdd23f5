//! A member that is a file or a block device, opened with O_DIRECT where
//! the filesystem or device allows it (tmpfs and some FUSE filesystems do
//! not: then it is opened buffered and `flush` is what makes data durable).
//!
//! A member is held exclusively while an array uses it: a block device is
//! opened O_EXCL (the kernel then refuses it to mount, md, dm and every
//! other exclusive opener), a regular file carries an exclusive `flock`.
//! Both follow the device, not the path, so a hard link or a second path
//! to a member in use is refused too, by any process. A loop device holds
//! its backing file (or device) the same way while it is a member: a
//! loop device over a member's file is that member by another name, which
//! neither lock sees by itself.

use super::reserved::Reserved;
use super::{DeviceKey, Member};
use crate::buf::{is_aligned, AlignedBuf};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub struct FileMember {
    path: PathBuf,
    name: String,
    file: File,
    size: u64,
    direct: bool,
    /// On tmpfs or ramfs (`Member::in_memory`); tmpfs takes O_DIRECT
    /// since Linux 6.6, and copies through its page cache all the same.
    in_memory: bool,
    /// On a filesystem whose holes are trusted (`Member::data_from`).
    holes_known: bool,
    block_device: bool,
    /// The device under it takes FUA (`device_takes_fua`).
    fua: bool,
    key: DeviceKey,
    /// A regular file with every block allocated: zeroing keeps the blocks
    /// (FALLOC_FL_ZERO_RANGE) instead of punching holes, so it stays safe
    /// from a filling filesystem.
    allocated: std::sync::atomic::AtomicBool,
    /// The regions of a sparse file whose blocks the array reserved before
    /// writing there (`Member::reserve`).
    reserved: Reserved,
    /// Counted by the array's I/O paths (see `Member::io_stats`).
    stats: crate::stats::IoStats,
    /// A loop device's backing file (flocked) or device (O_EXCL), held
    /// while this member is (`hold_loop_backing`).
    _backing: Option<File>,
}

/// Whether block device `dev` (a device number) takes writes with FUA,
/// as its queue says in sysfs (`<sys>/MAJ:MIN/queue/fua`, a partition's
/// on its disk's queue). Where it does not (this VM's virtio disk, a file
/// on tmpfs, a device sysfs does not know), the kernel would write then
/// flush for each `RWF_DSYNC` write: a flush per write, where the
/// journal's group flushes each member once, all members at once.
fn device_takes_fua(sys: &Path, dev: u64) -> bool {
    let node = sys.join(format!("{}:{}", libc::major(dev), libc::minor(dev)));
    [node.join("queue/fua"), node.join("../queue/fua")]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .is_some_and(|v| v.trim() == "1")
}

const TMPFS_MAGIC: u32 = 0x0102_1994;
const RAMFS_MAGIC: u32 = 0x8584_58f6;
const EXT4_MAGIC: u32 = 0xef53;
const XFS_MAGIC: u32 = 0x5846_5342;
const BTRFS_MAGIC: u32 = 0x9123_683e;

/// The magic number of the filesystem `f` lives on, if fstatfs answers.
fn fs_magic(f: &File) -> Option<u32> {
    // SAFETY: statfs is plain old data, filled by the kernel for our fd.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and a pointer to a live statfs.
    if unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    // f_type's width differs between targets; the magic numbers are 32-bit.
    Some(st.f_type as u32)
}

/// Whether a filesystem (by its magic number) is in memory (tmpfs, ramfs).
fn in_memory_fs(magic: Option<u32>) -> bool {
    matches!(magic, Some(TMPFS_MAGIC | RAMFS_MAGIC))
}

/// Whether the holes `f`'s filesystem reports (SEEK_DATA) can be trusted
/// to read as zeros, written data never among them: those whose lseek
/// counts data still in the page cache (delayed allocation, dirty pages
/// over unwritten extents) as data. Not every filesystem does: FUSE passes
/// lseek to its server without writing back the kernel's dirty pages, and
/// some ZFS releases reported holes over dirty data.
fn holes_known(magic: Option<u32>) -> bool {
    matches!(
        magic,
        Some(TMPFS_MAGIC | EXT4_MAGIC | XFS_MAGIC | BTRFS_MAGIC)
    )
}

/// Whether member files in the folder `dir` would have their holes
/// trusted (`holes_known`): false where it cannot be opened.
pub fn holes_trusted_at(dir: &Path) -> bool {
    File::open(dir).is_ok_and(|f| holes_known(fs_magic(&f)))
}

/// Whether every byte of a regular file has a block behind it.
fn fully_allocated(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    m.is_file() && m.blocks() * 512 >= m.len()
}

impl FileMember {
    /// A write's bytes in an aligned buffer, where O_DIRECT needs one and
    /// `buf` is not (its length is kept: the write is of `buf.len()`
    /// bytes from its start). None: `buf` goes as it is.
    fn bounced(&self, buf: &[u8]) -> Option<AlignedBuf> {
        (self.direct && !is_aligned(buf)).then(|| {
            let mut b = AlignedBuf::new(buf.len().next_multiple_of(crate::buf::ALIGN));
            b[..buf.len()].copy_from_slice(buf);
            b
        })
    }

    /// `write_all_at` with `RWF_DSYNC` (`pwritev2`): durable when it
    /// returns. A kernel or file that refuses the flag gets the write,
    /// then a flush.
    fn write_dsync(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            let iov = libc::iovec {
                iov_base: buf.as_ptr() as *mut libc::c_void,
                iov_len: buf.len(),
            };
            // SAFETY: `iov` points at `buf`, which is borrowed, alive and
            // unchanged for the whole call; the kernel only reads it.
            let n = unsafe {
                libc::pwritev2(
                    self.file.as_raw_fd(),
                    &iov,
                    1,
                    offset as libc::off_t,
                    libc::RWF_DSYNC,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EOPNOTSUPP | libc::ENOSYS) => {
                        return super::write_then_flush(self, buf, offset);
                    }
                    _ => return Err(e),
                }
            }
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            buf = &buf[n as usize..];
            offset += n as u64;
        }
        Ok(())
    }

    /// Opens an existing file or block device read-write, exclusively. A
    /// device another array (or any exclusive user) holds is refused with
    /// `ErrorKind::ResourceBusy`.
    pub fn open(path: &Path) -> io::Result<FileMember> {
        let meta = std::fs::metadata(path)?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                ),
            ));
        }
        let excl = if block_device { libc::O_EXCL } else { 0 };
        let busy = |e: io::Error| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                in_use(path)
            } else {
                e
            }
        };
        let (file, direct) = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | excl)
            .open(path)
        {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(excl)
                    .open(path)
                    .map_err(busy)?,
                false,
            ),
            Err(e) => return Err(busy(e)),
        };
        if !block_device {
            if let Err(e) = lock_exclusive(&file) {
                return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    in_use(path)
                } else {
                    e
                });
            }
        }
        let backing = match block_device {
            true => hold_loop_backing(&file, path)?,
            false => None,
        };
        // The key of what was opened, not of what the path names now.
        let opened = file.metadata()?;
        let key = DeviceKey::of_metadata(&opened, block_device);
        let allocated = std::sync::atomic::AtomicBool::new(fully_allocated(&opened));
        let size = if block_device {
            block_device_size(&file)?
        } else {
            meta.len()
        };
        // A block device's node lives on devtmpfs, which answers fstatfs
        // with tmpfs's magic: the device behind it is no copy in memory.
        let magic = fs_magic(&file);
        let in_memory = !block_device && in_memory_fs(magic);
        let holes_known = !block_device && holes_known(magic);
        let fua = !in_memory && {
            use std::os::unix::fs::MetadataExt;
            let dev = if block_device {
                opened.rdev()
            } else {
                opened.dev()
            };
            device_takes_fua(Path::new("/sys/dev/block"), dev)
        };
        tracing::debug!(path = %path.display(), direct, in_memory, fua, size, "member opened");
        Ok(FileMember {
            stats: Default::default(),
            path: path.to_owned(),
            name: path.display().to_string(),
            file,
            size,
            direct,
            in_memory,
            fua,
            holes_known,
            block_device,
            key,
            allocated,
            reserved: Reserved::new(size),
            _backing: backing,
        })
    }

    /// Opens a file or block device read-only, without holding it: for
    /// looking at the metadata of a device that may be in use (`examine`,
    /// the status of a stopped array). Writes through it fail.
    pub fn inspect(path: &Path) -> io::Result<FileMember> {
        let meta = std::fs::metadata(path)?;
        let block_device = meta.file_type().is_block_device();
        let file = File::open(path)?;
        let size = if block_device {
            block_device_size(&file)?
        } else {
            meta.len()
        };
        Ok(FileMember {
            stats: Default::default(),
            path: path.to_owned(),
            name: path.display().to_string(),
            key: DeviceKey::of_metadata(&file.metadata()?, block_device),
            file,
            size,
            direct: false,
            in_memory: false,
            fua: false,
            holes_known: false,
            block_device,
            allocated: std::sync::atomic::AtomicBool::new(false),
            reserved: Reserved::new(size),
            _backing: None,
        })
    }

    /// Allocates every block of a regular file (fallocate), so the array
    /// never meets a full filesystem on a write: a sparse member on a
    /// filesystem that fills fails writes that the array had every right to
    /// make. Block devices need nothing.
    pub fn allocate(&self) -> io::Result<()> {
        if self.block_device {
            return Ok(());
        }
        match self.fallocate(0, 0, self.size) {
            Ok(()) => {
                self.allocated
                    .store(true, std::sync::atomic::Ordering::Release);
                Ok(())
            }
            // A filesystem without fallocate: nothing to reserve with.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                tracing::warn!(member = %self.name, "the filesystem cannot preallocate; the member stays sparse");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Allocates bytes [offset, offset+len) of a regular file (nothing for
    /// a block device): the metadata, bitmap and journal area of a sparse
    /// member, so a full filesystem never stops those writes.
    pub fn allocate_range(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.block_device {
            return Ok(());
        }
        let len = len.min(self.size.saturating_sub(offset));
        // Mode 0 keeps the contents.
        match self.fallocate(0, offset, len) {
            Err(e) if e.raw_os_error() != Some(libc::EOPNOTSUPP) => Err(e),
            _ => Ok(()),
        }
    }

    /// A block device, or a file with every block allocated, has its
    /// space: a write never meets a full filesystem, nothing to reserve.
    fn has_its_space(&self) -> bool {
        self.block_device || self.allocated.load(std::sync::atomic::Ordering::Acquire)
    }

    /// fallocate(2) of `mode` over [offset, offset+len) of the file, again
    /// where a signal interrupted it (tmpfs checks for one between pages).
    fn fallocate(&self, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        loop {
            // SAFETY: plain syscall on our own fd.
            let rc =
                unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as i64, len as i64) };
            match rc {
                0 => return Ok(()),
                _ => match io::Error::last_os_error() {
                    e if e.kind() == io::ErrorKind::Interrupted => continue,
                    e => return Err(e),
                },
            }
        }
    }

    /// Makes [offset, offset+len) read as zeros: its blocks kept
    /// (`keep_blocks`: zeroed in place, unwritten extents that read as
    /// zeros and count as holes) or a hole punched, which reads back as
    /// zeros on files and, since Linux 4.9, on block devices (it becomes a
    /// zeroing discard). Where the device refuses either, zeros written.
    fn zero(&self, offset: u64, len: u64, keep_blocks: bool) -> io::Result<()> {
        let mode = match keep_blocks {
            true => libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            false => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        };
        let err = match self.fallocate(mode, offset, len) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if !matches!(
            err.raw_os_error(),
            Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) | Some(libc::EINVAL)
        ) {
            return Err(err);
        }
        tracing::debug!(member = %self.name, block_device = self.block_device, "zeroing refused ({err}); writing zeros");
        let zeros = AlignedBuf::new(1 << 20);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `struct loop_info64` of <linux/loop.h>.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

/// What backs a loop device, as the kernel has it: the backing file's
/// filesystem device and inode, and for a block device its device number
/// (`LOOP_GET_STATUS64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopBacking {
    /// (major, minor) of the backing file's filesystem.
    pub fs: (u64, u64),
    pub inode: u64,
    /// (major, minor) of the backing block device (0, 0 for a file).
    pub rdev: (u64, u64),
}

/// The kernel's `new_encode_dev` form (`loop_info64`'s fields) as (major,
/// minor).
fn kernel_dev(d: u64) -> (u64, u64) {
    ((d & 0xfff00) >> 8, (d & 0xff) | ((d >> 12) & 0xfff00))
}

fn std_dev(d: u64) -> (u64, u64) {
    (libc::major(d) as u64, libc::minor(d) as u64)
}

/// What backs `dev` if it is a loop device with something attached.
pub fn loop_backing(dev: &File) -> Option<LoopBacking> {
    // SAFETY: loop_info64 is plain old data; zeroes are a valid value.
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes one loop_info64 through the pointer, which
    // points to a live one; on a device that is not a loop it fails.
    let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64 as _, &mut info) };
    (rc == 0).then(|| LoopBacking {
        fs: kernel_dev(info.lo_device),
        inode: info.lo_inode,
        rdev: kernel_dev(info.lo_rdevice),
    })
}

/// Where `dev` (opened at `path`) is a loop device, holds what backs it as
/// a member is held (a file: an exclusive flock; a block device: O_EXCL)
/// and returns it, to keep while `dev` is a member; refuses with
/// `ErrorKind::ResourceBusy` where that is held already: by an array that
/// has the file as a member, or another loop device's array. Not a loop
/// device, or one whose file cannot be reached by its path (deleted since,
/// or the path names another file now, or is not visible from here): nothing
/// to hold. What is opened is checked against the kernel's own record of
/// the backing (device, inode), not the path.
fn hold_loop_backing(dev: &File, path: &Path) -> io::Result<Option<File>> {
    use std::os::unix::fs::MetadataExt;
    let Some(info) = loop_backing(dev) else {
        return Ok(None);
    };
    let rdev = dev.metadata()?.rdev();
    let sys = format!(
        "/sys/dev/block/{}:{}/loop/backing_file",
        libc::major(rdev),
        libc::minor(rdev)
    );
    let Ok(name) = std::fs::read_to_string(&sys) else {
        return Ok(None);
    };
    let name = name.trim_end_matches('\n');
    if name.ends_with(" (deleted)") {
        return Ok(None);
    }
    let back = Path::new(name);
    let held_by = |what: &str| {
        io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "{} is a loop device over {}, which is in use: {what}",
                path.display(),
                back.display()
            ),
        )
    };
    if info.rdev != (0, 0) {
        return match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(back)
        {
            Ok(f) if f.metadata().is_ok_and(|m| std_dev(m.rdev()) == info.rdev) => Ok(Some(f)),
            Ok(_) => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(held_by(
                "a running array (or another program) holds it exclusively",
            )),
            Err(_) => Ok(None),
        };
    }
    // Read-write where it can (a flock on NFS is a POSIX lock, which an
    // exclusive one needs a writable open for).
    let Ok(f) = OpenOptions::new()
        .read(true)
        .write(true)
        .open(back)
        .or_else(|_| File::open(back))
    else {
        return Ok(None);
    };
    if !f
        .metadata()
        .is_ok_and(|m| m.ino() == info.inode && std_dev(m.dev()) == info.fs)
    {
        return Ok(None);
    }
    if let Err(e) = lock_exclusive(&f) {
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(held_by(
                "another process holds it exclusively, as a running array holds its members",
            ));
        }
        return Ok(None);
    }
    Ok(Some(f))
}

/// Takes `f`'s exclusive flock, as a running array holds its member files,
/// without waiting for a holder: EWOULDBLOCK where another holds it. A
/// lock held for an instant is waited out (up to 50 ms): `raidctl status`
/// takes a shared one for an instant to ask whether a file is held, where
/// the holder is in a PID namespace its /proc/locks does not show, and a
/// start at that instant must not fail for it.
fn lock_exclusive(f: &File) -> io::Result<()> {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(50);
    loop {
        // SAFETY: plain syscall on an open fd the caller owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) || std::time::Instant::now() >= until {
            return Err(e);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

fn in_use(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "{} is in use: a running array (or another program) holds it exclusively",
            path.display()
        ),
    )
}

fn block_device_size(f: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64 through the pointer we pass.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

impl FileMember {
    /// A read that ended early: the file ends before `offset` plus the
    /// read, which for a member of the array's size means it was cut
    /// short underneath it (std says only "failed to fill whole buffer").
    fn short_read(&self, e: io::Error, offset: u64) -> io::Error {
        if e.kind() != io::ErrorKind::UnexpectedEof {
            return e;
        }
        let now = self
            .file
            .metadata()
            .map_or("unknown".to_string(), |m| m.len().to_string());
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "read at byte {offset} past the end of {} ({now} bytes now, {} when opened): truncated underneath the array?",
                self.name, self.size
            ),
        )
    }

    /// lseek with `whence` (SEEK_DATA, SEEK_HOLE) from `at`.
    fn seek(&self, at: u64, whence: i32) -> io::Result<u64> {
        // SAFETY: a plain lseek on our own open fd; every read and write
        // of the member gives its own offset, so moving the fd's position
        // changes nothing else.
        let r = unsafe { libc::lseek(self.file.as_raw_fd(), at as i64, whence) };
        if r >= 0 {
            Ok(r as u64)
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Member for FileMember {
    fn io_stats(&self) -> Option<&crate::stats::IoStats> {
        Some(&self.stats)
    }
    fn identity(&self) -> &str {
        &self.name
    }
    fn device_key(&self) -> DeviceKey {
        self.key
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn data_from(&self, offset: u64) -> Option<std::ops::Range<u64>> {
        let start = self.data_start_from(offset)?;
        // From there to the next hole (the end of the file is one); where
        // that cannot be told (`start` is the end: no data left), data
        // from `start` on, which says no more than is so.
        let end = self.seek(start, libc::SEEK_HOLE).unwrap_or(u64::MAX);
        Some(start..end)
    }
    fn data_start_from(&self, offset: u64) -> Option<u64> {
        // Not on a filesystem trusted, nor on a block device (lseek
        // treats it as all data, or refuses): `holes_known` is false.
        if !self.holes_known {
            return None;
        }
        match self.seek(offset, libc::SEEK_DATA) {
            Ok(start) => Some(start),
            // ENXIO: no data from `offset` to the end of the file, which is
            // a hole up to there; past the end (a file cut short) a read
            // does not return zeros: data, as far as a copy is concerned.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                let end = self.file.metadata().ok()?.len();
                (offset < end).then_some(end)
            }
            Err(_) => None,
        }
    }
    fn file_now(&self) -> Option<io::Result<super::FileNow>> {
        use std::os::unix::fs::MetadataExt;
        (!self.block_device).then(|| {
            self.file.metadata().map(|m| super::FileNow {
                len: m.len(),
                linked: m.nlink() > 0,
            })
        })
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.direct && !is_aligned(buf) {
            let mut b = AlignedBuf::new(buf.len().next_multiple_of(crate::buf::ALIGN));
            self.file
                .read_exact_at(&mut b[..buf.len()], offset)
                .map_err(|e| self.short_read(e, offset))?;
            buf.copy_from_slice(&b[..buf.len()]);
            return Ok(());
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.short_read(e, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.bounced(buf) {
            Some(b) => self.file.write_all_at(&b[..buf.len()], offset),
            None => self.file.write_all_at(buf, offset),
        }
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    /// Where the device under it takes FUA (`device_takes_fua`).
    fn fua(&self) -> bool {
        self.fua
    }
    /// `RWF_DSYNC`: the kernel sends the write with FUA where the device
    /// takes it (a block device; a file's blocks already allocated, under
    /// O_DIRECT), and writes then flushes where it does not; a file's
    /// write also syncs what it needs to read back.
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.bounced(buf) {
            Some(b) => self.write_dsync(&b[..buf.len()], offset),
            None => self.write_dsync(buf, offset),
        }
    }
    /// An allocated file keeps its blocks; any other has a hole punched,
    /// and the regions it touches are no longer reserved.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.allocated.load(std::sync::atomic::Ordering::Acquire) {
            true => self.zero(offset, len, true),
            false => self
                .reserved
                .punching(offset, len, || self.zero(offset, len, false)),
        }
    }
    fn reserved(&self, offset: u64, len: u64) -> bool {
        self.has_its_space() || self.reserved.covers(offset, len)
    }
    fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.has_its_space() {
            return Ok(());
        }
        self.reserved
            .reserve(offset, len, |start, n| self.fallocate(0, start, n))
    }
    /// A file keeps (or gets) its blocks, as the rows a job writes would
    /// hold them; a block device gets a zeroing discard.
    fn write_zeroes_allocated(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero(offset, len, !self.block_device)
    }
    fn uring_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }
    fn in_memory(&self) -> bool {
        self.in_memory
    }
    fn is_direct(&self) -> bool {
        self.direct
    }
}

#[cfg(test)]
mod tests {
    use super::device_takes_fua;

    /// A disk's queue says whether it takes FUA; a partition asks its
    /// disk's; a device sysfs does not know takes none.
    #[test]
    fn fua_is_what_the_device_queue_says() {
        let sys = std::env::temp_dir().join(format!("fua-sys-{}", std::process::id()));
        let queue = |node: &str, v: &str| {
            let q = sys.join(node).join("queue");
            std::fs::create_dir_all(&q).unwrap();
            std::fs::write(q.join("fua"), v).unwrap();
        };
        queue("block/nvme0n1", "1\n");
        queue("block/vda", "0\n");
        std::fs::create_dir_all(sys.join("block/nvme0n1/nvme0n1p1")).unwrap();
        let link = |name: &str, to: &str| {
            std::os::unix::fs::symlink(sys.join(to), sys.join(name)).unwrap();
        };
        link("259:0", "block/nvme0n1");
        link("259:1", "block/nvme0n1/nvme0n1p1");
        link("253:0", "block/vda");
        let dev = |maj, min| libc::makedev(maj, min);
        assert!(device_takes_fua(&sys, dev(259, 0)));
        assert!(
            device_takes_fua(&sys, dev(259, 1)),
            "a partition: its disk's"
        );
        assert!(!device_takes_fua(&sys, dev(253, 0)));
        assert!(!device_takes_fua(&sys, dev(0, 45)), "unknown to sysfs");
        std::fs::remove_dir_all(&sys).unwrap();
    }
}
