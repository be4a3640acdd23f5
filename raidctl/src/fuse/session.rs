//! Serving the FUSE connection: `threads` threads, each with its own
//! `/dev/fuse` descriptor (the first is the mount's, the others clones of
//! it), each reading a request, running it against the array and writing
//! the reply itself. No hand-off between threads: a request costs one
//! wake-up of the thread that reads it, and `threads` requests are served
//! at once (the array's API blocks a thread per request in flight).

use super::abi::{self, InHeader};
use super::io::Io;
use raid_core::buf::AlignedBuf;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;

pub const ROOT: u64 = 1;
pub const FILE: u64 = 2;
/// Seconds the kernel may cache names and attributes.
const TTL: u64 = 1;
/// Largest read or write the kernel sends in one request.
pub const MAX_IO: u32 = 1 << 20;
/// Requests the kernel keeps queued for the filesystem (asynchronous reads
/// and direct I/O count against it).
const MAX_BACKGROUND: u16 = 256;

/// What every serving thread shares.
pub struct Fs {
    pub io: Io,
    pub name: String,
    pub ctime: u64,
}

impl Fs {
    fn attr(&self, ino: u64) -> [u8; 88] {
        if ino == ROOT {
            abi::attr(ROOT, 0, libc::S_IFDIR | 0o755, 2, self.ctime)
        } else {
            abi::attr(
                FILE,
                self.io.array.capacity(),
                libc::S_IFREG | 0o600,
                1,
                self.ctime,
            )
        }
    }
}

/// A second descriptor on the connection `fd` serves.
pub fn clone_fd(fd: &File) -> io::Result<File> {
    let new = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let old: u32 = fd.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the fd to clone) from the
    // pointer; `old` lives across the call and `new` is an open /dev/fuse.
    let r = unsafe { libc::ioctl(new.as_raw_fd(), abi::DEV_IOC_CLONE, &old as *const u32) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(new)
}

/// One thread's loop: until the connection ends (unmount).
pub fn serve(fd: File, fs: Arc<Fs>) {
    // Requests are read at an offset that puts a write's data (after its
    // 80 bytes of headers) on a page boundary: members opened with O_DIRECT
    // then take it as it is, with no bounce copy.
    const AT: usize = 4096 - abi::IN_HEADER - abi::RW_IN;
    let mut page = AlignedBuf::new(MAX_IO as usize + 2 * 4096);
    let buf = &mut page[AT..];
    loop {
        // SAFETY: `buf` is writable for its whole length and outlives the
        // call; the kernel writes one whole request into it.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match io::Error::last_os_error().raw_os_error() {
                // Interrupted, or the request was aborted before we read it.
                Some(libc::EINTR) | Some(libc::ENOENT) | Some(libc::EAGAIN) => continue,
                // Unmounted: the connection is gone.
                Some(libc::ENODEV) => return,
                e => {
                    tracing::error!("FUSE: reading /dev/fuse: {:?}", e);
                    return;
                }
            }
        }
        let req = &buf[..n as usize];
        let Some(h) = InHeader::parse(req) else {
            tracing::error!("FUSE: a malformed request of {n} bytes");
            // The kernel waits for an answer to whatever it sent.
            if let Some(u) = req.get(8..16) {
                let u = u64::from_ne_bytes(u.try_into().expect("8 bytes"));
                error(&fd, u, libc::EIO);
            }
            continue;
        };
        let body = &req[abi::IN_HEADER..];
        if h.opcode == abi::DESTROY {
            let _ = reply(&fd, h.unique, 0, &[]);
            return;
        }
        handle(&fd, &fs, h, body);
    }
}

/// Writes one reply (header and parts in one system call). An error means
/// the request is gone (interrupted) or the connection is: nothing to do.
fn reply(fd: &File, unique: u64, error: i32, parts: &[&[u8]]) -> io::Result<()> {
    let len = abi::OUT_HEADER + parts.iter().map(|p| p.len()).sum::<usize>();
    let h = abi::out_header(len, -error, unique);
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(parts.len() + 1);
    for p in std::iter::once(&h[..]).chain(parts.iter().copied()) {
        iov.push(libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        });
    }
    // SAFETY: each iovec points into a slice that lives across the call;
    // writev only reads them.
    let n = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn error(fd: &File, unique: u64, errno: i32) {
    let _ = reply(fd, unique, errno, &[]);
}

fn handle(fd: &File, fs: &Fs, h: InHeader, body: &[u8]) {
    let u = h.unique;
    match h.opcode {
        abi::INIT => init(fd, u, body),
        // No reply exists for these.
        abi::FORGET | abi::BATCH_FORGET | abi::INTERRUPT => {}
        abi::LOOKUP => {
            let name = body.split(|&b| b == 0).next().unwrap_or_default();
            if h.nodeid == ROOT && name == fs.name.as_bytes() {
                let _ = reply(fd, u, 0, &[&abi::entry_out(FILE, &fs.attr(FILE), TTL)]);
            } else {
                error(fd, u, libc::ENOENT);
            }
        }
        abi::GETATTR => match h.nodeid {
            ROOT | FILE => {
                let _ = reply(fd, u, 0, &[&abi::attr_out(&fs.attr(h.nodeid), TTL)]);
            }
            _ => error(fd, u, libc::ENOENT),
        },
        abi::SETATTR => {
            // The file is the array: its size cannot change.
            let cap = fs.io.array.capacity();
            match abi::setattr_in(body) {
                Some((valid, size)) if valid & abi::FATTR_SIZE != 0 && size != cap => {
                    error(fd, u, libc::EPERM)
                }
                Some(_) => {
                    let _ = reply(fd, u, 0, &[&abi::attr_out(&fs.attr(h.nodeid), TTL)]);
                }
                None => error(fd, u, libc::EINVAL),
            }
        }
        abi::OPEN => {
            if h.nodeid != FILE {
                return error(fd, u, libc::EISDIR);
            }
            // Direct I/O: no second cache in front of the array, so fsync
            // and the loop device see exactly what the array holds. Direct
            // writes in parallel: the array orders writes to one stripe.
            let flags = abi::FOPEN_DIRECT_IO | abi::FOPEN_PARALLEL_DIRECT_WRITES;
            let _ = reply(fd, u, 0, &[&abi::open_out(flags)]);
        }
        abi::OPENDIR => {
            if h.nodeid != ROOT {
                return error(fd, u, libc::ENOTDIR);
            }
            let _ = reply(fd, u, 0, &[&abi::open_out(0)]);
        }
        abi::READ => read(fd, fs, u, body),
        abi::WRITE => write(fd, fs, u, body),
        abi::FLUSH | abi::RELEASE | abi::RELEASEDIR | abi::FSYNCDIR | abi::ACCESS => {
            let _ = reply(fd, u, 0, &[]);
        }
        abi::FSYNC => {
            // Covers every write answered before it was sent: a write is
            // answered only once the array has it.
            match fs.io.array.flush() {
                Ok(()) => {
                    let _ = reply(fd, u, 0, &[]);
                }
                Err(_) => error(fd, u, libc::EIO),
            }
        }
        abi::FALLOCATE => fallocate(fd, fs, u, body),
        abi::READDIR => readdir(fd, fs, h, body),
        abi::STATFS => {
            let _ = reply(fd, u, 0, &[&abi::statfs_out(fs.io.array.capacity())]);
        }
        _ => error(fd, u, libc::ENOSYS),
    }
}

/// Asks for concurrent direct I/O and large requests, within what the
/// kernel offers; what it lacks is logged and the export works without it.
fn init(fd: &File, u: u64, body: &[u8]) {
    let Some(i) = abi::InitIn::parse(body) else {
        return error(fd, u, libc::EINVAL);
    };
    if i.major != abi::KERNEL_MAJOR {
        tracing::error!(
            major = i.major,
            "FUSE: the kernel speaks another major version"
        );
        return error(fd, u, libc::EPROTO);
    }
    let want = abi::ASYNC_READ | abi::BIG_WRITES | abi::ASYNC_DIO | abi::MAX_PAGES;
    let flags = i.flags & want;
    if flags & abi::ASYNC_DIO == 0 {
        tracing::warn!("FUSE: no asynchronous direct I/O; requests come one at a time per file");
    }
    let max_write = if flags & abi::MAX_PAGES != 0 {
        MAX_IO
    } else {
        128 << 10
    };
    let out = abi::InitOut {
        minor: i.minor.min(abi::KERNEL_MINOR),
        max_readahead: i.max_readahead.min(MAX_IO),
        flags,
        max_background: MAX_BACKGROUND,
        congestion_threshold: MAX_BACKGROUND * 3 / 4,
        max_write,
        max_pages: (max_write / 4096) as u16,
    };
    if reply(fd, u, 0, &[&out.encode()]).is_ok() {
        tracing::info!(
            kernel = format!("{}.{}", i.major, i.minor),
            max_io = max_write,
            "FUSE export ready"
        );
    }
}

fn read(fd: &File, fs: &Fs, u: u64, body: &[u8]) {
    let Some((off, size)) = abi::rw_in(body) else {
        return error(fd, u, libc::EINVAL);
    };
    let cap = fs.io.array.capacity();
    if off >= cap {
        let _ = reply(fd, u, 0, &[]);
        return;
    }
    let len = (size as u64).min(cap - off) as usize;
    match fs.io.read_any(off, len) {
        Ok((buf, from)) => {
            let _ = reply(fd, u, 0, &[&buf[from..from + len]]);
        }
        Err(e) => error(fd, u, e),
    }
}

fn write(fd: &File, fs: &Fs, u: u64, body: &[u8]) {
    let Some((off, size)) = abi::rw_in(body) else {
        return error(fd, u, libc::EINVAL);
    };
    let Some(data) = body.get(abi::RW_IN..abi::RW_IN + size as usize) else {
        return error(fd, u, libc::EINVAL);
    };
    if off + data.len() as u64 > fs.io.array.capacity() {
        return error(fd, u, libc::ENOSPC);
    }
    match fs.io.write_any(off, data) {
        Ok(()) => {
            let _ = reply(fd, u, 0, &[&abi::write_out(size)]);
        }
        Err(e) => error(fd, u, e),
    }
}

fn fallocate(fd: &File, fs: &Fs, u: u64, body: &[u8]) {
    let Some((off, len, mode)) = abi::fallocate_in(body) else {
        return error(fd, u, libc::EINVAL);
    };
    if off
        .checked_add(len)
        .is_none_or(|e| e > fs.io.array.capacity())
    {
        return error(fd, u, libc::ENOSPC);
    }
    if mode as i32 & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) == 0 {
        // Plain allocation: every byte of the array already exists.
        let _ = reply(fd, u, 0, &[]);
        return;
    }
    match fs.io.zero_any(off, len) {
        Ok(()) => {
            let _ = reply(fd, u, 0, &[]);
        }
        Err(e) => error(fd, u, e),
    }
}

fn readdir(fd: &File, fs: &Fs, h: InHeader, body: &[u8]) {
    if h.nodeid != ROOT {
        return error(fd, h.unique, libc::ENOTDIR);
    }
    let Some((offset, size)) = abi::rw_in(body) else {
        return error(fd, h.unique, libc::EINVAL);
    };
    let entries = [
        (ROOT, libc::DT_DIR, "."),
        (ROOT, libc::DT_DIR, ".."),
        (FILE, libc::DT_REG, fs.name.as_str()),
    ];
    let mut out = Vec::new();
    for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
        let before = out.len();
        abi::dirent(&mut out, *ino, (i + 1) as u64, *kind as u32, name);
        if out.len() > size as usize {
            out.truncate(before);
            break;
        }
    }
    let _ = reply(fd, h.unique, 0, &[&out]);
}

/// Starts `threads` serving threads on `fd` (the first uses it, the
/// others clones); fewer if the kernel refuses clones.
pub fn start(fd: File, fs: Arc<Fs>, threads: usize) -> Vec<std::thread::JoinHandle<()>> {
    let mut fds = Vec::with_capacity(threads);
    for _ in 1..threads {
        match clone_fd(&fd) {
            Ok(c) => fds.push(c),
            Err(e) => {
                tracing::warn!(
                    "FUSE: cannot clone /dev/fuse ({e}): {} serving threads",
                    fds.len() + 1
                );
                break;
            }
        }
    }
    fds.insert(0, fd);
    fds.into_iter()
        .enumerate()
        .map(|(i, f)| {
            let fs = fs.clone();
            std::thread::Builder::new()
                .name(format!("fuse-{i}"))
                .spawn(move || serve(f, fs))
                .expect("spawn a FUSE thread")
        })
        .collect()
}

/// Wraps a raw descriptor received from fusermount.
pub fn file_from_raw(fd: i32) -> File {
    // SAFETY: `fd` was just received over SCM_RIGHTS and nothing else owns
    // it.
    unsafe { File::from_raw_fd(fd) }
}
