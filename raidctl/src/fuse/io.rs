//! The array's side of the FUSE export: any byte range read, written or
//! zeroed, whatever its alignment.

use parking_lot::RwLock;
use raid_core::array::{Array, BLOCK};
use raid_core::buf::AlignedBuf;
use std::sync::Arc;

/// The array, and the lock that keeps partial-block writes whole.
pub struct Io {
    pub array: Arc<Array>,
    /// Whole-block writes take it shared, a read-merge-write of a partial
    /// block exclusive: no write can land between its read and its write.
    pub partial: RwLock<()>,
}

impl Io {
    /// Whether a range is whole blocks, which `read_whole` takes.
    pub fn is_whole(offset: u64, len: usize) -> bool {
        offset.is_multiple_of(BLOCK) && (len as u64).is_multiple_of(BLOCK)
    }

    /// Reads whole blocks (`is_whole`) straight into `dst`, a buffer the
    /// transport hands out (the ring's payload, page aligned): no copy.
    pub fn read_whole(&self, offset: u64, dst: &mut [u8]) -> Result<(), i32> {
        self.array.read(offset, dst).map_err(|_| libc::EIO)
    }

    /// Reads any byte range inside the array; returns the buffer and where
    /// in it the range starts. Page-aligned buffers, so members opened with
    /// O_DIRECT take them through io_uring as they are, with no copy.
    pub fn read_any(&self, offset: u64, len: usize) -> Result<(AlignedBuf, usize), i32> {
        let start = offset / BLOCK * BLOCK;
        let end = (offset + len as u64).div_ceil(BLOCK) * BLOCK;
        let mut buf = AlignedBuf::new((end - start) as usize);
        self.array.read(start, &mut buf).map_err(|_| libc::EIO)?;
        Ok((buf, (offset - start) as usize))
    }

    /// Writes any byte range inside the array.
    pub fn write_any(&self, offset: u64, data: &[u8]) -> Result<(), i32> {
        let end = offset + data.len() as u64;
        if offset.is_multiple_of(BLOCK) && end.is_multiple_of(BLOCK) {
            let _g = self.partial.read();
            return self.array.write(offset, data).map_err(|_| libc::EIO);
        }
        let _g = self.partial.write();
        let start = offset / BLOCK * BLOCK;
        let aend = end.div_ceil(BLOCK) * BLOCK;
        let mut buf = AlignedBuf::new((aend - start) as usize);
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
    pub fn zero_any(&self, offset: u64, len: u64) -> Result<(), i32> {
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
