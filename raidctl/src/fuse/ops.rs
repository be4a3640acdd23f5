//! The filesystem's operations: one directory holding one file, the
//! array. A request comes in as its header, its operation's fixed part and
//! its data, and is answered through `Answer`, so the same code serves
//! every transport (`session`: threads reading `/dev/fuse`; `ring`: FUSE
//! over io_uring).

use super::abi::{self, InHeader};
use super::io::Io;

pub const ROOT: u64 = 1;
pub const FILE: u64 = 2;
/// Seconds the kernel may cache names and attributes.
const TTL: u64 = 1;

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

/// One request, as a transport received it.
pub struct Request<'a> {
    pub h: InHeader,
    /// The operation's arguments (`fuse_read_in`, a name, ...).
    pub op: &'a [u8],
    /// A write's data.
    pub data: &'a [u8],
}

/// How a transport answers a request.
pub trait Answer {
    /// Answers request `unique`: `error` is a positive errno (0: success)
    /// and `parts` the reply's body, sent as one.
    fn send(&mut self, unique: u64, error: i32, parts: &[&[u8]]);

    fn send_error(&mut self, unique: u64, errno: i32) {
        self.send(unique, errno, &[]);
    }

    /// A page-aligned buffer of `len` bytes that a read can fill in
    /// place, where the transport has one (the ring's payload buffer):
    /// the data then moves once, from the members into the buffer the
    /// kernel copies from. `send_filled` answers with it.
    fn buffer(&mut self, len: usize) -> Option<&mut [u8]> {
        let _ = len;
        None
    }

    /// Answers `unique` with the first `len` bytes of `buffer`.
    fn send_filled(&mut self, unique: u64, len: usize) {
        let _ = (unique, len);
        unreachable!("send_filled without a buffer");
    }
}

pub fn handle(ans: &mut dyn Answer, fs: &Fs, req: Request<'_>) {
    let h = req.h;
    let body = req.op;
    let u = h.unique;
    match h.opcode {
        // No reply exists for these.
        abi::FORGET | abi::BATCH_FORGET | abi::INTERRUPT => {}
        abi::LOOKUP => {
            let name = body.split(|&b| b == 0).next().unwrap_or_default();
            if h.nodeid == ROOT && name == fs.name.as_bytes() {
                ans.send(u, 0, &[&abi::entry_out(FILE, &fs.attr(FILE), TTL)]);
            } else {
                ans.send_error(u, libc::ENOENT);
            }
        }
        abi::GETATTR => match h.nodeid {
            ROOT | FILE => {
                ans.send(u, 0, &[&abi::attr_out(&fs.attr(h.nodeid), TTL)]);
            }
            _ => ans.send_error(u, libc::ENOENT),
        },
        abi::SETATTR => {
            // The file is the array: its size cannot change.
            let cap = fs.io.array.capacity();
            match abi::setattr_in(body) {
                Some((valid, size)) if valid & abi::FATTR_SIZE != 0 && size != cap => {
                    ans.send_error(u, libc::EPERM)
                }
                Some(_) => {
                    ans.send(u, 0, &[&abi::attr_out(&fs.attr(h.nodeid), TTL)]);
                }
                None => ans.send_error(u, libc::EINVAL),
            }
        }
        abi::OPEN => {
            if h.nodeid != FILE {
                return ans.send_error(u, libc::EISDIR);
            }
            // Direct I/O: no second cache in front of the array, so fsync
            // and the loop device see exactly what the array holds. Direct
            // writes in parallel: the array orders writes to one stripe.
            let flags = abi::FOPEN_DIRECT_IO | abi::FOPEN_PARALLEL_DIRECT_WRITES;
            ans.send(u, 0, &[&abi::open_out(flags)]);
        }
        abi::OPENDIR => {
            if h.nodeid != ROOT {
                return ans.send_error(u, libc::ENOTDIR);
            }
            ans.send(u, 0, &[&abi::open_out(0)]);
        }
        abi::READ => read(ans, fs, u, body),
        abi::WRITE => write(ans, fs, u, body, req.data),
        abi::FLUSH | abi::RELEASE | abi::RELEASEDIR | abi::FSYNCDIR | abi::ACCESS => {
            ans.send(u, 0, &[]);
        }
        abi::FSYNC => {
            // Covers every write answered before it was sent: a write is
            // answered only once the array has it.
            match fs.io.array.flush() {
                Ok(()) => {
                    ans.send(u, 0, &[]);
                }
                Err(_) => ans.send_error(u, libc::EIO),
            }
        }
        abi::FALLOCATE => fallocate(ans, fs, u, body),
        abi::LSEEK => lseek(ans, fs, h, body),
        abi::READDIR => readdir(ans, fs, h, body),
        abi::STATFS => {
            ans.send(u, 0, &[&abi::statfs_out(fs.io.array.capacity())]);
        }
        _ => ans.send_error(u, libc::ENOSYS),
    }
}

fn read(ans: &mut dyn Answer, fs: &Fs, u: u64, body: &[u8]) {
    let Some((off, size)) = abi::rw_in(body) else {
        return ans.send_error(u, libc::EINVAL);
    };
    let cap = fs.io.array.capacity();
    if off >= cap {
        ans.send(u, 0, &[]);
        return;
    }
    let len = (size as u64).min(cap - off) as usize;
    if Io::is_whole(off, len) {
        if let Some(dst) = ans.buffer(len) {
            match fs.io.read_whole(off, dst) {
                Ok(()) => ans.send_filled(u, len),
                Err(e) => ans.send_error(u, e),
            }
            return;
        }
    }
    match fs.io.read_any(off, len) {
        Ok((buf, from)) => {
            ans.send(u, 0, &[&buf[from..from + len]]);
        }
        Err(e) => ans.send_error(u, e),
    }
}

fn write(ans: &mut dyn Answer, fs: &Fs, u: u64, body: &[u8], data: &[u8]) {
    let Some((off, size)) = abi::rw_in(body) else {
        return ans.send_error(u, libc::EINVAL);
    };
    let Some(data) = data.get(..size as usize) else {
        return ans.send_error(u, libc::EINVAL);
    };
    if off + data.len() as u64 > fs.io.array.capacity() {
        return ans.send_error(u, libc::ENOSPC);
    }
    match fs.io.write_any(off, data) {
        Ok(()) => {
            ans.send(u, 0, &[&abi::write_out(size)]);
        }
        Err(e) => ans.send_error(u, e),
    }
}

fn fallocate(ans: &mut dyn Answer, fs: &Fs, u: u64, body: &[u8]) {
    let Some((off, len, mode)) = abi::fallocate_in(body) else {
        return ans.send_error(u, libc::EINVAL);
    };
    if off
        .checked_add(len)
        .is_none_or(|e| e > fs.io.array.capacity())
    {
        return ans.send_error(u, libc::ENOSPC);
    }
    if mode as i32 & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) == 0 {
        // Plain allocation: every byte of the array already exists.
        ans.send(u, 0, &[]);
        return;
    }
    match fs.io.zero_any(off, len) {
        Ok(()) => {
            ans.send(u, 0, &[]);
        }
        Err(e) => ans.send_error(u, e),
    }
}

/// SEEK_DATA and SEEK_HOLE on the array's file (the kernel answers the
/// other whences itself), so `cp --sparse`, `qemu-img convert` and `tar
/// --sparse` skip what reads as zeros without being stored: the parts
/// `Array::zero_extents` names, and the end of the file.
fn lseek(ans: &mut dyn Answer, fs: &Fs, h: InHeader, body: &[u8]) {
    let u = h.unique;
    let Some((off, whence)) = abi::lseek_in(body) else {
        return ans.send_error(u, libc::EINVAL);
    };
    let want_data = match whence as i32 {
        libc::SEEK_DATA => true,
        libc::SEEK_HOLE => false,
        _ => return ans.send_error(u, libc::EINVAL),
    };
    let array = &fs.io.array;
    let cap = array.capacity();
    if h.nodeid != FILE || off >= cap {
        return ans.send_error(u, libc::ENXIO);
    }
    // The extent at `off`, whole (the walk stops where the next begins,
    // of the other kind). None (never, inside the array) counts as data:
    // a hole said wrongly would lose data in a copy.
    let (len, zero) = array
        .zero_extents_upto(off, cap - off, 1)
        .first()
        .copied()
        .unwrap_or((cap - off, false));
    if zero != want_data {
        return ans.send(u, 0, &[&off.to_ne_bytes()]);
    }
    if off + len < cap {
        return ans.send(u, 0, &[&(off + len).to_ne_bytes()]);
    }
    // No data from `off` on; the end of the file is a hole.
    if want_data {
        ans.send_error(u, libc::ENXIO)
    } else {
        ans.send(u, 0, &[&cap.to_ne_bytes()])
    }
}

fn readdir(ans: &mut dyn Answer, fs: &Fs, h: InHeader, body: &[u8]) {
    if h.nodeid != ROOT {
        return ans.send_error(h.unique, libc::ENOTDIR);
    }
    let Some((offset, size)) = abi::rw_in(body) else {
        return ans.send_error(h.unique, libc::EINVAL);
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
    ans.send(h.unique, 0, &[&out]);
}
