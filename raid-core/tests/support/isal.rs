//! A test-only binding to ISA-L's RAID functions (libisal, Debian's
//! libisal-dev): the independent implementation our P and Q are checked and
//! benchmarked against. Only compiled when build.rs found the library.

use std::os::raw::{c_int, c_void};

extern "C" {
    fn xor_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    fn pq_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
}

/// P through ISA-L. Buffers must be 32-byte aligned (ISA-L's rule).
pub fn isal_xor(data: &[&[u8]], p: &mut [u8]) {
    let mut ptrs: Vec<*mut c_void> = data.iter().map(|d| d.as_ptr() as *mut c_void).collect();
    ptrs.push(p.as_mut_ptr() as *mut c_void);
    assert!(
        ptrs.iter().all(|&x| (x as usize).is_multiple_of(32)),
        "ISA-L needs 32-byte alignment"
    );
    // SAFETY: every pointer addresses p.len() bytes; ISA-L reads the sources
    // and writes only the last pointer.
    let rc = unsafe { xor_gen(ptrs.len() as c_int, p.len() as c_int, ptrs.as_mut_ptr()) };
    assert_eq!(rc, 0, "isal xor_gen failed");
}

/// P and Q through ISA-L. Buffers must be 32-byte aligned.
pub fn isal_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let mut ptrs: Vec<*mut c_void> = data.iter().map(|d| d.as_ptr() as *mut c_void).collect();
    ptrs.push(p.as_mut_ptr() as *mut c_void);
    ptrs.push(q.as_mut_ptr() as *mut c_void);
    assert!(
        ptrs.iter().all(|&x| (x as usize).is_multiple_of(32)),
        "ISA-L needs 32-byte alignment"
    );
    // SAFETY: as in isal_xor; the last two pointers are written.
    let rc = unsafe { pq_gen(ptrs.len() as c_int, p.len() as c_int, ptrs.as_mut_ptr()) };
    assert_eq!(rc, 0, "isal pq_gen failed");
}
