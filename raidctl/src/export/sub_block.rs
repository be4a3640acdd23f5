//! Requests not aligned to the array's 4 KiB block, from clients that did
//! not ask for the block size.
//!
//! The export advertises a 4 KiB minimum block size, and a client that
//! asked for it (NBD_INFO_BLOCK_SIZE: qemu, libnbd) aligns its requests,
//! doing any read-modify-write itself. A client that did not ask (one
//! that negotiates with NBD_OPT_EXPORT_NAME, or NBD_OPT_GO without that
//! info: a kernel client set to 512-byte sectors) may send requests on any
//! byte: the protocol asks the server to serve those, not to fail them
//! (which the kernel turns into I/O errors under a filesystem). Such a
//! connection's unaligned reads, writes and write-zeroes are served as the
//! FUSE export serves any range (`crate::any_bytes`: a read-modify-write
//! alone among the array's writes); a trim trims the whole blocks inside
//! it (a trim may leave any of its bytes as they were).
//!
//! A connection that asked for the block size gets EINVAL for an
//! unaligned read, write or write-zeroes, as the protocol allows; its
//! unaligned trims are cut to the whole blocks inside them too (qemu
//! passes a guest's 512-byte discards on as they are, and a discard that
//! fails is an error in the guest).

use crate::any_bytes::AnyBytes;
use crate::nbd::{self, Request};
use raid_core::array::BLOCK;

/// Whether `req` (checked already) touches part of a 4 KiB block.
pub(super) fn is_sub_block(req: &Request) -> bool {
    matches!(
        req.kind,
        nbd::CMD_READ | nbd::CMD_WRITE | nbd::CMD_TRIM | nbd::CMD_WRITE_ZEROES
    ) && (!req.offset.is_multiple_of(BLOCK) || !(req.length as u64).is_multiple_of(BLOCK))
}

/// Serves a sub-block request (checked: inside the array, within the
/// size limits) in the calling thread: its error (0 for none), a read's
/// bytes copied into `buf` (`req.length` long). `buf` holds a write's
/// data. The caller has let its own writes in flight go to the engine
/// (a read-modify-write waits for them).
pub(super) fn serve(bytes: &AnyBytes, req: &Request, buf: &mut [u8]) -> u32 {
    let (off, len) = (req.offset, req.length as u64);
    let fua = req.flags & nbd::CMD_FLAG_FUA != 0;
    let run = || match req.kind {
        nbd::CMD_READ => bytes.read_any(off, buf.len()).map(|(b, at)| {
            buf.copy_from_slice(&b[at..at + buf.len()]);
        }),
        nbd::CMD_WRITE => bytes.write_any(off, buf),
        nbd::CMD_WRITE_ZEROES => bytes.zero_any(off, len),
        _ => bytes.trim_inside(off, len),
    };
    // A panic in the array's code is answered EIO, as on the engine's
    // threads: unanswered, the request would hold the connection (and the
    // export's stop) for ever.
    let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(r) => r.and_then(|()| match fua && req.kind != nbd::CMD_READ {
            true => bytes.array.flush(),
            false => Ok(()),
        }),
        Err(_) => {
            tracing::error!(
                "nbd command {} at {}+{}: panicked; answered EIO",
                req.kind,
                req.offset,
                req.length
            );
            return nbd::EIO;
        }
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::warn!(
                "nbd command {} at {}+{} (not 4 KiB aligned): {e}",
                req.kind,
                req.offset,
                req.length
            );
            super::errno_of(&e)
        }
    }
}
