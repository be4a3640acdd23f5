//! Serving the FUSE connection: `threads` threads, each with its own
//! `/dev/fuse` descriptor (the first is the mount's, the others clones of
//! it), each reading a request, running it against the array and writing
//! the reply itself. No hand-off between threads: a request costs one
//! wake-up of the thread that reads it, and `threads` requests are served
//! at once (the array's API blocks a thread per request in flight).
//!
//! With FUSE over io_uring (`ring`), these threads still answer INIT (which
//! decides whether the ring is used), FORGET and INTERRUPT, and everything
//! if the kernel turns the ring down.

use super::abi::{self, InHeader};
use super::ops::{self, Answer, Fs, Request};
use super::ring::Gate;
use super::MAX_IO;
use raid_core::buf::AlignedBuf;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;

/// Requests the kernel keeps queued for the filesystem (asynchronous reads
/// and direct I/O count against it).
const MAX_BACKGROUND: u16 = 256;

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

/// Answers on a `/dev/fuse` descriptor: one `writev` per reply.
struct Dev<'a>(&'a File);

impl Answer for Dev<'_> {
    fn send(&mut self, unique: u64, error: i32, parts: &[&[u8]]) {
        let _ = reply(self.0, unique, error, parts);
    }
}

/// One thread's loop: until the connection ends (unmount).
fn serve(fd: File, fs: Arc<Fs>, gate: Option<Arc<Gate>>) {
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
        if h.opcode == abi::INIT {
            init(&fd, h.unique, body, gate.as_deref());
            continue;
        }
        let req = Request {
            h,
            op: body,
            data: body.get(abi::RW_IN..).unwrap_or_default(),
        };
        ops::handle(&mut Dev(&fd), &fs, req);
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

/// Asks for concurrent direct I/O and large requests, within what the
/// kernel offers; what it lacks is logged and the export works without it.
/// With a ring prepared (`gate`) and the kernel offering FUSE over
/// io_uring, asks for that too, and opens the gate once the reply is
/// written: the ring's threads may register only after INIT.
fn init(fd: &File, u: u64, body: &[u8], gate: Option<&Gate>) {
    let Some(i) = abi::InitIn::parse(body) else {
        if let Some(g) = gate {
            g.open(false, false);
        }
        return error(fd, u, libc::EINVAL);
    };
    if i.major != abi::KERNEL_MAJOR {
        tracing::error!(
            major = i.major,
            "FUSE: the kernel speaks another major version"
        );
        if let Some(g) = gate {
            g.open(false, false);
        }
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
    let mut out = abi::InitOut {
        minor: i.minor.min(abi::KERNEL_MINOR),
        max_readahead: i.max_readahead.min(MAX_IO),
        flags,
        max_background: MAX_BACKGROUND,
        congestion_threshold: MAX_BACKGROUND * 3 / 4,
        max_write,
        // In the kernel's pages: a ring entry's payload (MAX_IO) must hold
        // max_pages of them.
        max_pages: (max_write / page_size()).max(1) as u16,
        flags2: 0,
    };
    let uring = gate.is_some() && i.offers_uring();
    if uring {
        out.flags |= abi::INIT_EXT;
        out.flags2 |= abi::OVER_IO_URING;
    }
    let sent = reply(fd, u, 0, &[&out.encode()]).is_ok();
    if let Some(g) = gate {
        g.open(sent && uring, i.offers_uring());
    }
    if sent {
        tracing::info!(
            kernel = format!("{}.{}", i.major, i.minor),
            max_io = max_write,
            "FUSE export ready"
        );
    }
}

/// Starts `threads` serving threads on `fd` (the first uses it, the
/// others clones); fewer if the kernel refuses clones.
pub fn start(
    fd: File,
    fs: Arc<Fs>,
    threads: usize,
    gate: Option<Arc<Gate>>,
) -> Vec<std::thread::JoinHandle<()>> {
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
            let gate = gate.clone();
            std::thread::Builder::new()
                .name(format!("fuse-{i}"))
                .spawn(move || serve(f, fs, gate))
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

/// The kernel's page size.
fn page_size() -> u32 {
    // SAFETY: sysconf only reads its argument.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(p).unwrap_or(4096).max(4096)
}
