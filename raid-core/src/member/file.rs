//! A member that is a file or a block device, opened with O_DIRECT where
//! the filesystem or device allows it (tmpfs and some FUSE filesystems do
//! not: then it is opened buffered and `flush` is what makes data durable).

use super::Member;
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
    block_device: bool,
}

impl FileMember {
    /// Opens an existing file or block device read-write.
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
        let (file, direct) = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (OpenOptions::new().read(true).write(true).open(path)?, false)
            }
            Err(e) => return Err(e),
        };
        let size = if block_device {
            block_device_size(&file)?
        } else {
            meta.len()
        };
        tracing::debug!(path = %path.display(), direct, size, "member opened");
        Ok(FileMember {
            path: path.to_owned(),
            name: path.display().to_string(),
            file,
            size,
            direct,
            block_device,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
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

impl Member for FileMember {
    fn identity(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.direct && !is_aligned(buf) {
            let mut b = AlignedBuf::new(buf.len().next_multiple_of(crate::buf::ALIGN));
            self.file.read_exact_at(&mut b[..buf.len()], offset)?;
            buf.copy_from_slice(&b[..buf.len()]);
            return Ok(());
        }
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.direct && !is_aligned(buf) {
            let mut b = AlignedBuf::new(buf.len().next_multiple_of(crate::buf::ALIGN));
            b[..buf.len()].copy_from_slice(buf);
            return self.file.write_all_at(&b[..buf.len()], offset);
        }
        self.file.write_all_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        // Punching a hole reads back as zeros on files and, since Linux 4.9,
        // on block devices (it becomes a zeroing discard).
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: plain syscall on our own fd.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as i64, len as i64) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if !matches!(
            err.raw_os_error(),
            Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) | Some(libc::EINVAL)
        ) {
            return Err(err);
        }
        tracing::debug!(member = %self.name, block_device = self.block_device, "hole punch refused ({err}); writing zeros");
        let zeros = AlignedBuf::new(1 << 20);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
    fn uring_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }
    fn is_direct(&self) -> bool {
        self.direct
    }
}
