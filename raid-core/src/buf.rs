//! Page-aligned buffers: what O_DIRECT and io_uring need from memory.

use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};

/// Alignment of every buffer the array hands to a member: the largest
/// logical block size of NVMe and 4Kn drives, and the page size.
pub const ALIGN: usize = 4096;

/// A 4 KiB-aligned heap buffer: zeroed (`new`), filled at once
/// (`concat`), or holding bytes the caller will overwrite
/// (`for_overwrite`).
///
/// A buffer dropped goes to its thread's spares (`spare`), where the next
/// buffer of its length on that thread is taken from: a small write's
/// planning takes a buffer per chunk it reads and per parity chunk, and
/// the allocator's aligned allocation and zeroing of each cost about a
/// tenth of a RAID6 4 KiB write's CPU time.
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
        match spare::take(len) {
            Some(mut b) => {
                b.fill(0);
                b
            }
            None => Self::allocate(len, true),
        }
    }

    /// `len` bytes whose values are unspecified: an earlier buffer's of
    /// this thread, or zeros. Only for a caller that writes every byte
    /// before it reads any, and never hands the buffer on before: a member
    /// read that fills it or fails, a parity computation's output; or one
    /// that writes a prefix and never reads or hands on past it (a
    /// journal group's records joined in a buffer of the most a run
    /// carries). Otherwise one request's bytes could reach another's
    /// reply.
    pub fn for_overwrite(len: usize) -> AlignedBuf {
        spare::take(len).unwrap_or_else(|| Self::allocate(len, true))
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
        let len = parts.iter().map(|p| p.len()).sum();
        let b = spare::take(len).unwrap_or_else(|| Self::allocate(len, false));
        let mut at = 0;
        for p in parts {
            // SAFETY: `at + p.len() <= b.len`, the allocation's size (the
            // parts' lengths sum to it); `b` overlaps no part, being a
            // fresh allocation or a spare (dropped, so nothing borrows
            // it); an empty part copies nothing, even to the dangling
            // pointer of an empty buffer. Every byte is written here
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
        if self.len > 0 && !spare::keep(self.ptr, self.len) {
            // SAFETY: allocated in `allocate` with this very layout (a
            // spare taken back keeps the allocation it was made with).
            unsafe { dealloc(self.ptr, Layout::from_size_align(self.len, ALIGN).unwrap()) }
        }
    }
}

/// Each thread's buffers dropped and kept for its next ones of the same
/// length, up to `KEEP_BYTES` in all: a thread that only drops buffers
/// others made (a connection's writer) holds no more than that. Their
/// bytes are what their last user left (initialised: every buffer is
/// zeroed or written whole when made).
mod spare {
    use super::{dealloc, AlignedBuf, Layout, ALIGN};
    use std::cell::RefCell;

    /// Bytes of spares one thread keeps.
    pub(super) const KEEP_BYTES: usize = 512 << 10;
    /// The largest buffer kept (a chunk's column, a parity chunk, a
    /// journal group's joined records: `commit::MAX_RUN`).
    pub(super) const KEEP_LARGEST: usize = 256 << 10;

    struct Spares {
        bufs: Vec<(*mut u8, usize)>,
        bytes: usize,
    }

    impl Drop for Spares {
        fn drop(&mut self) {
            for (ptr, len) in self.bufs.drain(..) {
                // SAFETY: each was an AlignedBuf's allocation of `len`
                // bytes, given up to this list by its drop.
                unsafe { dealloc(ptr, Layout::from_size_align(len, ALIGN).unwrap()) }
            }
        }
    }

    thread_local! {
        static SPARES: RefCell<Spares> = const {
            RefCell::new(Spares { bufs: Vec::new(), bytes: 0 })
        };
    }

    /// The last kept buffer of `len` bytes, if this thread has one.
    pub(super) fn take(len: usize) -> Option<AlignedBuf> {
        if len == 0 || len > KEEP_LARGEST {
            return None;
        }
        SPARES
            .try_with(|s| {
                let mut s = s.borrow_mut();
                let i = s.bufs.iter().rposition(|&(_, l)| l == len)?;
                let (ptr, len) = s.bufs.remove(i);
                s.bytes -= len;
                Some(AlignedBuf { ptr, len })
            })
            .ok()
            .flatten()
    }

    #[cfg(test)]
    pub(super) fn kept_bytes() -> usize {
        SPARES.with(|s| s.borrow().bytes)
    }

    /// Keeps a dropped buffer's allocation for this thread's next buffer
    /// of its length, giving up the oldest kept ones past `KEEP_BYTES`.
    /// False: not kept (too large, or the thread is ending); the caller
    /// frees it.
    pub(super) fn keep(ptr: *mut u8, len: usize) -> bool {
        if len > KEEP_LARGEST {
            return false;
        }
        SPARES
            .try_with(|s| {
                let mut s = s.borrow_mut();
                s.bufs.push((ptr, len));
                s.bytes += len;
                while s.bytes > KEEP_BYTES {
                    let (old, old_len) = s.bufs.remove(0);
                    s.bytes -= old_len;
                    // SAFETY: as in `Spares::drop`.
                    unsafe { dealloc(old, Layout::from_size_align(old_len, ALIGN).unwrap()) }
                }
            })
            .is_ok()
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr addresses len initialised bytes we own (zeroed or
        // written whole when allocated, and kept so as a spare).
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
        AlignedBuf::concat(&[self])
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
        self.free
            .pop()
            .unwrap_or_else(|| AlignedBuf::for_overwrite(self.len))
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

    #[test]
    fn a_dropped_buffer_is_taken_again_and_new_ones_are_zeroed() {
        let mut a = AlignedBuf::new(8192);
        a.fill(0xab);
        let at = a.as_ptr();
        drop(a);
        // The same thread's next buffer of that length is the spare...
        let b = AlignedBuf::for_overwrite(8192);
        assert_eq!(b.as_ptr(), at);
        assert!((b.as_ptr() as usize).is_multiple_of(ALIGN));
        drop(b);
        // ...and `new` clears what its last user left.
        let c = AlignedBuf::new(8192);
        assert_eq!(c.as_ptr(), at);
        assert!(c.iter().all(|&x| x == 0));
        // Another length is not served from it.
        let d = AlignedBuf::for_overwrite(4096);
        assert_ne!(d.as_ptr(), at);
        // A clone copies every byte, whatever its spare held.
        let mut e = AlignedBuf::new(8192);
        e.fill(7);
        drop(c);
        assert!(e.clone().iter().all(|&x| x == 7));
    }

    #[test]
    fn a_thread_keeps_at_most_its_share_of_spares() {
        std::thread::spawn(|| {
            // Too large to keep: freed, not held.
            let big = AlignedBuf::for_overwrite(spare::KEEP_LARGEST + ALIGN);
            drop(big);
            assert_eq!(spare::kept_bytes(), 0);
            let bufs: Vec<AlignedBuf> = (0..2 * spare::KEEP_BYTES / (64 << 10))
                .map(|_| AlignedBuf::for_overwrite(64 << 10))
                .collect();
            drop(bufs);
            assert_eq!(spare::kept_bytes(), spare::KEEP_BYTES);
            let _again = AlignedBuf::for_overwrite(64 << 10);
            assert_eq!(spare::kept_bytes(), spare::KEEP_BYTES - (64 << 10));
        })
        .join()
        .unwrap();
    }
}
