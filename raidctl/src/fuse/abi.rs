//! The FUSE kernel protocol, as far as a one-file filesystem needs it
//! (linux/fuse.h, protocol 7.x): opcodes, flags, and the layouts of the
//! messages read here, as offsets into host-endian bytes. Decoding is kept
//! free of I/O so it can be tested on its own.

pub const KERNEL_MAJOR: u32 = 7;
/// The minor version spoken: 7.31 (max_pages, parallel direct writes need
/// only the open flag).
pub const KERNEL_MINOR: u32 = 31;

pub const LOOKUP: u32 = 1;
pub const FORGET: u32 = 2;
pub const GETATTR: u32 = 3;
pub const SETATTR: u32 = 4;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const WRITE: u32 = 16;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FSYNC: u32 = 20;
pub const FLUSH: u32 = 25;
pub const INIT: u32 = 26;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const FSYNCDIR: u32 = 30;
pub const ACCESS: u32 = 34;
pub const INTERRUPT: u32 = 36;
pub const DESTROY: u32 = 38;
pub const BATCH_FORGET: u32 = 42;
pub const FALLOCATE: u32 = 43;
pub const LSEEK: u32 = 46;

pub const ASYNC_READ: u32 = 1 << 0;
pub const BIG_WRITES: u32 = 1 << 5;
pub const ASYNC_DIO: u32 = 1 << 15;
pub const MAX_PAGES: u32 = 1 << 22;
/// `flags2` is meaningful (in INIT, both ways).
pub const INIT_EXT: u32 = 1 << 30;
/// FUSE_OVER_IO_URING (bit 41 of the 64-bit flags: bit 9 of `flags2`).
pub const OVER_IO_URING: u32 = 1 << 9;

pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// Direct writes to one file run in parallel (Linux 6.2 on); without it
/// the kernel takes the inode lock for each, one write at a time.
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

/// `_IOR(229, 0, uint32_t)`: makes a second `/dev/fuse` descriptor serve
/// the same connection, with its own queue of requests being processed.
pub const DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

pub const IN_HEADER: usize = 40;
pub const OUT_HEADER: usize = 16;
/// fuse_read_in / fuse_write_in.
pub const RW_IN: usize = 40;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// fuse_in_header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
}

impl InHeader {
    /// The header of a request read whole from the device (`n` bytes).
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        let h = InHeader::fields(b)?;
        (h.len as usize == b.len()).then_some(h)
    }

    /// The header's fields, wherever the request's body is (a ring entry
    /// holds the header apart from the arguments).
    pub fn fields(b: &[u8]) -> Option<InHeader> {
        Some(InHeader {
            len: u32_at(b, 0)?,
            opcode: u32_at(b, 4)?,
            unique: u64_at(b, 8)?,
            nodeid: u64_at(b, 16)?,
        })
    }
}

/// fuse_init_in: what the kernel offers.
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub flags2: u32,
}

impl InitIn {
    pub fn parse(b: &[u8]) -> Option<InitIn> {
        Some(InitIn {
            major: u32_at(b, 0)?,
            minor: u32_at(b, 4)?,
            max_readahead: u32_at(b, 8)?,
            flags: u32_at(b, 12)?,
            flags2: u32_at(b, 16).unwrap_or(0),
        })
    }

    /// Whether the kernel offers FUSE over io_uring (it does only when the
    /// fuse module's `enable_uring` is on).
    pub fn offers_uring(&self) -> bool {
        self.flags & INIT_EXT != 0 && self.flags2 & OVER_IO_URING != 0
    }
}

/// fuse_init_out (64 bytes, 7.23 on).
pub struct InitOut {
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub max_pages: u16,
    pub flags2: u32,
}

impl InitOut {
    pub fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&KERNEL_MAJOR.to_ne_bytes());
        b[4..8].copy_from_slice(&self.minor.to_ne_bytes());
        b[8..12].copy_from_slice(&self.max_readahead.to_ne_bytes());
        b[12..16].copy_from_slice(&self.flags.to_ne_bytes());
        b[16..18].copy_from_slice(&self.max_background.to_ne_bytes());
        b[18..20].copy_from_slice(&self.congestion_threshold.to_ne_bytes());
        b[20..24].copy_from_slice(&self.max_write.to_ne_bytes());
        b[24..28].copy_from_slice(&1u32.to_ne_bytes()); // time_gran: 1 ns
        b[28..30].copy_from_slice(&self.max_pages.to_ne_bytes());
        b[32..36].copy_from_slice(&self.flags2.to_ne_bytes());
        b
    }
}

/// fuse_read_in / fuse_write_in: (offset, size); a write's data follows.
pub fn rw_in(b: &[u8]) -> Option<(u64, u32)> {
    Some((u64_at(b, 8)?, u32_at(b, 16)?))
}

/// fuse_fallocate_in: (offset, length, mode).
pub fn fallocate_in(b: &[u8]) -> Option<(u64, u64, u32)> {
    Some((u64_at(b, 8)?, u64_at(b, 16)?, u32_at(b, 24)?))
}

/// fuse_lseek_in: (offset, whence).
pub fn lseek_in(b: &[u8]) -> Option<(u64, u32)> {
    Some((u64_at(b, 8)?, u32_at(b, 16)?))
}

/// fuse_setattr_in: (valid, size).
pub fn setattr_in(b: &[u8]) -> Option<(u32, u64)> {
    Some((u32_at(b, 0)?, u64_at(b, 16)?))
}

pub const FATTR_SIZE: u32 = 1 << 3;

/// fuse_attr (88 bytes).
pub fn attr(ino: u64, size: u64, mode: u32, nlink: u32, time: u64) -> [u8; 88] {
    let mut b = [0u8; 88];
    b[0..8].copy_from_slice(&ino.to_ne_bytes());
    b[8..16].copy_from_slice(&size.to_ne_bytes());
    b[16..24].copy_from_slice(&size.div_ceil(512).to_ne_bytes());
    for at in [24, 32, 40] {
        b[at..at + 8].copy_from_slice(&time.to_ne_bytes());
    }
    b[60..64].copy_from_slice(&mode.to_ne_bytes());
    b[64..68].copy_from_slice(&nlink.to_ne_bytes());
    // uid, gid, rdev 0; blksize:
    b[80..84].copy_from_slice(&4096u32.to_ne_bytes());
    b
}

/// fuse_entry_out: the attributes valid for `ttl` seconds.
pub fn entry_out(ino: u64, attr: &[u8; 88], ttl: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(128);
    b.extend_from_slice(&ino.to_ne_bytes());
    b.extend_from_slice(&0u64.to_ne_bytes()); // generation
    b.extend_from_slice(&ttl.to_ne_bytes()); // entry_valid
    b.extend_from_slice(&ttl.to_ne_bytes()); // attr_valid
    b.extend_from_slice(&[0u8; 8]); // the two nsec fields
    b.extend_from_slice(attr);
    b
}

/// fuse_attr_out.
pub fn attr_out(attr: &[u8; 88], ttl: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(104);
    b.extend_from_slice(&ttl.to_ne_bytes());
    b.extend_from_slice(&[0u8; 8]); // attr_valid_nsec, dummy
    b.extend_from_slice(attr);
    b
}

/// fuse_open_out.
pub fn open_out(flags: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b
}

/// fuse_write_out.
pub fn write_out(size: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&size.to_ne_bytes());
    b
}

/// fuse_statfs_out (fuse_kstatfs, 80 bytes): one file of `size` bytes.
pub fn statfs_out(size: u64) -> [u8; 80] {
    let mut b = [0u8; 80];
    b[0..8].copy_from_slice(&size.div_ceil(4096).to_ne_bytes()); // blocks
    b[24..32].copy_from_slice(&1u64.to_ne_bytes()); // files
    b[40..44].copy_from_slice(&4096u32.to_ne_bytes()); // bsize
    b[44..48].copy_from_slice(&255u32.to_ne_bytes()); // namelen
    b[48..52].copy_from_slice(&4096u32.to_ne_bytes()); // frsize
    b
}

/// One fuse_dirent (padded to 8 bytes).
pub fn dirent(out: &mut Vec<u8>, ino: u64, next: u64, kind: u32, name: &str) {
    out.extend_from_slice(&ino.to_ne_bytes());
    out.extend_from_slice(&next.to_ne_bytes());
    out.extend_from_slice(&(name.len() as u32).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(name.as_bytes());
    while !out.len().is_multiple_of(8) {
        out.push(0);
    }
}

/// FUSE over io_uring (protocol 7.42): the layouts of a ring entry's
/// header buffer (`fuse_uring_req_header`) and of the command that
/// registers an entry or commits a reply and fetches the next request
/// (`fuse_uring_cmd_req`, in the 80-byte command area of a 128-byte SQE).
pub mod ring {
    use super::{u32_at, u64_at};

    /// `fuse_uring_req_header`: in_out[128], op_in[128], ent_in_out.
    pub const HEADER: usize = 288;
    /// `fuse_in_header` of a request, `fuse_out_header` of its reply.
    pub const IN_OUT: usize = 0;
    /// The request's first argument (`fuse_read_in`, a name, ...).
    pub const OP_IN: usize = 128;
    pub const OP_IN_LEN: usize = 128;
    /// `fuse_uring_ent_in_out`: flags, commit_id, payload_sz, padding,
    /// reserved.
    const ENT: usize = 256;

    pub const CMD_REGISTER: u32 = 1;
    pub const CMD_COMMIT_AND_FETCH: u32 = 2;

    /// The id a reply is committed under (the request's unique).
    pub fn commit_id(h: &[u8]) -> Option<u64> {
        u64_at(h, ENT + 8)
    }

    /// Bytes of the payload buffer in use: the request's data, or the
    /// reply's.
    pub fn payload_sz(h: &[u8]) -> Option<u32> {
        u32_at(h, ENT + 16)
    }

    /// Sets the reply's payload size; flags and padding go back as zero.
    pub fn set_reply(h: &mut [u8], payload_sz: u32) {
        h[ENT..ENT + 8].fill(0);
        h[ENT + 16..ENT + 20].copy_from_slice(&payload_sz.to_ne_bytes());
        h[ENT + 20..ENT + 24].fill(0);
    }

    /// `fuse_uring_cmd_req`: flags 0, commit_id, qid.
    pub fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
        let mut b = [0u8; 80];
        b[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        b[16..18].copy_from_slice(&qid.to_ne_bytes());
        b
    }
}

/// fuse_out_header.
pub fn out_header(len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER] {
    let mut b = [0u8; OUT_HEADER];
    b[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    b[4..8].copy_from_slice(&error.to_ne_bytes());
    b[8..16].copy_from_slice(&unique.to_ne_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_bodies() {
        let mut b = vec![0u8; IN_HEADER + RW_IN];
        b[0..4].copy_from_slice(&((IN_HEADER + RW_IN) as u32).to_ne_bytes());
        b[4..8].copy_from_slice(&READ.to_ne_bytes());
        b[8..16].copy_from_slice(&77u64.to_ne_bytes());
        b[16..24].copy_from_slice(&2u64.to_ne_bytes());
        b[IN_HEADER + 8..IN_HEADER + 16].copy_from_slice(&8192u64.to_ne_bytes());
        b[IN_HEADER + 16..IN_HEADER + 20].copy_from_slice(&4096u32.to_ne_bytes());
        let h = InHeader::parse(&b).unwrap();
        assert_eq!((h.opcode, h.unique, h.nodeid), (READ, 77, 2));
        assert_eq!(rw_in(&b[IN_HEADER..]), Some((8192, 4096)));
        // A length that does not match what was read is refused.
        assert!(InHeader::parse(&b[..IN_HEADER]).is_none());
        assert!(rw_in(&[0u8; 10]).is_none());
    }

    #[test]
    fn init_offers_and_asks_for_io_uring() {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&7u32.to_ne_bytes());
        b[4..8].copy_from_slice(&44u32.to_ne_bytes());
        b[12..16].copy_from_slice(&(INIT_EXT | ASYNC_DIO).to_ne_bytes());
        b[16..20].copy_from_slice(&OVER_IO_URING.to_ne_bytes());
        assert!(InitIn::parse(&b).unwrap().offers_uring());
        // flags2 means nothing without INIT_EXT.
        b[12..16].copy_from_slice(&ASYNC_DIO.to_ne_bytes());
        assert!(!InitIn::parse(&b).unwrap().offers_uring());
        let out = InitOut {
            minor: 31,
            max_readahead: 0,
            flags: INIT_EXT,
            max_background: 1,
            congestion_threshold: 1,
            max_write: 4096,
            max_pages: 1,
            flags2: OVER_IO_URING,
        }
        .encode();
        // fuse_init_out: flags at 12, flags2 at 32; FUSE_OVER_IO_URING is
        // bit 41 of the flags taken as one u64.
        let flags = u32::from_ne_bytes(out[12..16].try_into().unwrap()) as u64
            | (u32::from_ne_bytes(out[32..36].try_into().unwrap()) as u64) << 32;
        assert_eq!(flags & (1 << 41), 1 << 41);
    }

    #[test]
    fn ring_entry_layout() {
        // fuse_uring_ent_in_out at 256: flags u64, commit_id u64,
        // payload_sz u32, padding u32, reserved u64.
        let mut h = [0xffu8; ring::HEADER];
        h[264..272].copy_from_slice(&42u64.to_ne_bytes());
        h[272..276].copy_from_slice(&4096u32.to_ne_bytes());
        assert_eq!(ring::commit_id(&h), Some(42));
        assert_eq!(ring::payload_sz(&h), Some(4096));
        ring::set_reply(&mut h, 8);
        assert_eq!(ring::payload_sz(&h), Some(8));
        assert_eq!(&h[256..264], &[0; 8]);
        assert_eq!(&h[276..280], &[0; 4]);
        // fuse_uring_cmd_req: flags u64, commit_id u64, qid u16.
        let c = ring::cmd_req(9, 3);
        assert_eq!(u64::from_ne_bytes(c[8..16].try_into().unwrap()), 9);
        assert_eq!(u16::from_ne_bytes(c[16..18].try_into().unwrap()), 3);
    }

    #[test]
    fn dirents_are_padded() {
        let mut d = Vec::new();
        dirent(&mut d, 2, 1, 8, "data");
        assert_eq!(d.len(), 32);
        dirent(&mut d, 1, 2, 4, "..");
        assert_eq!(d.len(), 64);
    }
}
