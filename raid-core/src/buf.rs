//! Page-aligned buffers: what O_DIRECT and io_uring need from memory.

use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};

/// Alignment of every buffer the array hands to a member: the largest
/// logical block size of NVMe and 4Kn drives, and the page size.
pub const ALIGN: usize = 4096;

/// A 4 KiB-aligned heap buffer: zeroed (`new`), or filled at once
/// (`concat`).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        Self::allocate(len, true)
    }

    /// `len` bytes, zeroed or not (the caller then writes every byte
    /// before any is read).
    fn allocate(len: usize, zeroed: bool) -> AlignedBuf {
        if len == 0 {
            return AlignedBuf {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                len: 0,
            };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer size");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe {
            match zeroed {
                true => alloc_zeroed(layout),
                false => alloc(layout),
            }
        };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }

    /// A buffer holding `parts` one after another, not zeroed first: for
    /// a copy of many buffers into one, where the zeroing would be a
    /// second pass over every byte.
    pub fn concat(parts: &[&[u8]]) -> AlignedBuf {
        let b = Self::allocate(parts.iter().map(|p| p.len()).sum(), false);
        let mut at = 0;
        for p in parts {
            // SAFETY: `at + p.len() <= b.len`, the allocation's size (the
            // parts' lengths sum to it), and a fresh allocation overlaps
            // no part (an empty part copies nothing, even to the dangling
            // pointer of an empty buffer). Every byte is written here
            // before the buffer is handed out, so none is read
            // uninitialised.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), b.ptr.add(at), p.len()) };
            at += p.len();
        }
        b
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `allocate` with this very layout.
            unsafe { dealloc(self.ptr, Layout::from_size_align(self.len, ALIGN).unwrap()) }
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr addresses len initialised (zeroed at allocation) bytes we own.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        let mut b = AlignedBuf::new(self.len);
        b.copy_from_slice(self);
        b
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Buffers of one length kept for reuse by a loop over many batches (a
/// rebuild, a scrub): a zeroed allocation per chunk per batch cost as much
/// as the reads. What a taken buffer holds is whatever its last user left:
/// only for a caller that writes every byte before it reads any.
pub struct BufPool {
    len: usize,
    free: Vec<AlignedBuf>,
}

impl BufPool {
    pub fn new(len: usize) -> BufPool {
        BufPool {
            len,
            free: Vec::new(),
        }
    }

    /// `n` buffers of the pool's length, reused where there are some.
    pub fn take(&mut self, n: usize) -> Vec<AlignedBuf> {
        (0..n).map(|_| self.take_one()).collect()
    }

    pub fn take_one(&mut self) -> AlignedBuf {
        self.free.pop().unwrap_or_else(|| AlignedBuf::new(self.len))
    }

    /// Gives buffers back (each of the pool's length: they came from it).
    pub fn put(&mut self, bufs: impl IntoIterator<Item = AlignedBuf>) {
        self.free.extend(bufs.into_iter().inspect(|b| {
            debug_assert_eq!(b.len(), self.len, "a buffer from another pool");
        }));
    }
}

/// Whether a slice may be handed to an O_DIRECT file as it is.
pub fn is_aligned(b: &[u8]) -> bool {
    (b.as_ptr() as usize).is_multiple_of(ALIGN) && b.len().is_multiple_of(ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concat_holds_its_parts_in_order_aligned() {
        let (a, b, c) = (vec![1u8; 4096], vec![2u8; 8192], vec![3u8; 100]);
        let j = AlignedBuf::concat(&[&a, &b, &c]);
        assert_eq!(j.len(), 4096 + 8192 + 100);
        assert!((j.as_ptr() as usize).is_multiple_of(ALIGN));
        assert_eq!(&j[..4096], &a[..]);
        assert_eq!(&j[4096..12288], &b[..]);
        assert_eq!(&j[12288..], &c[..]);
        assert!(AlignedBuf::concat(&[]).is_empty());
        assert!(AlignedBuf::concat(&[&[], &[]]).is_empty());
    }
}
