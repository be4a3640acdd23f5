//! The array's side of the FUSE export: any byte range read, written or
//! zeroed, whatever its alignment (`crate::any_bytes`), errors as errno.

use crate::any_bytes::AnyBytes;
use raid_core::array::Array;
use raid_core::buf::AlignedBuf;
use std::sync::Arc;

/// The array, and its byte ranges.
pub struct Io {
    pub array: Arc<Array>,
    bytes: AnyBytes,
}

impl Io {
    pub fn new(array: Arc<Array>) -> Io {
        Io {
            bytes: AnyBytes::new(array.clone()),
            array,
        }
    }

    /// Whether a range is whole blocks, which `read_whole` takes.
    pub fn is_whole(offset: u64, len: usize) -> bool {
        AnyBytes::is_whole(offset, len)
    }

    /// Reads whole blocks (`is_whole`) straight into `dst`, a buffer the
    /// transport hands out (the ring's payload, page aligned): no copy.
    pub fn read_whole(&self, offset: u64, dst: &mut [u8]) -> Result<(), i32> {
        self.array.read(offset, dst).map_err(|_| libc::EIO)
    }

    /// Reads any byte range inside the array; returns the buffer and where
    /// in it the range starts.
    pub fn read_any(&self, offset: u64, len: usize) -> Result<(AlignedBuf, usize), i32> {
        self.bytes.read_any(offset, len).map_err(|_| libc::EIO)
    }

    /// Writes any byte range inside the array.
    pub fn write_any(&self, offset: u64, data: &[u8]) -> Result<(), i32> {
        self.bytes.write_any(offset, data).map_err(|_| libc::EIO)
    }

    /// Zeroes any byte range.
    pub fn zero_any(&self, offset: u64, len: u64) -> Result<(), i32> {
        self.bytes.zero_any(offset, len).map_err(|_| libc::EIO)
    }
}
