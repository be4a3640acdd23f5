//! The io_uring path: one ring per thread, a whole batch of member I/Os
//! pushed in one submission. Falls back to pread/pwrite when the kernel (or a
//! seccomp policy) refuses io_uring, or when RAID_NO_URING=1 is set.

use super::{IoOp, Member, MemberIo, MemberRef};
use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::io;
use std::sync::OnceLock;

/// Which path member I/O takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoPath {
    IoUring,
    PreadPwrite,
}

impl std::fmt::Display for IoPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoPath::IoUring => "io_uring",
            IoPath::PreadPwrite => "pread/pwrite",
        })
    }
}

const RING_ENTRIES: u32 = 256;

/// Decided once per process, and logged.
pub fn io_path() -> IoPath {
    static PATH: OnceLock<IoPath> = OnceLock::new();
    *PATH.get_or_init(|| {
        if std::env::var("RAID_NO_URING").is_ok_and(|v| v == "1") {
            tracing::info!("member I/O: pread/pwrite (RAID_NO_URING=1)");
            return IoPath::PreadPwrite;
        }
        match IoUring::new(8) {
            Ok(_) => {
                tracing::info!("member I/O: io_uring");
                IoPath::IoUring
            }
            Err(e) => {
                tracing::warn!("member I/O: pread/pwrite (io_uring refused: {e})");
                IoPath::PreadPwrite
            }
        }
    })
}

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Runs `ios[k]` for every k in `which` on this thread's ring. Short
/// transfers are finished through the synchronous path.
pub(super) fn run_batch(
    members: &[MemberRef],
    ios: &mut [MemberIo<'_>],
    which: &[usize],
) -> Option<Vec<io::Result<()>>> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            match IoUring::new(RING_ENTRIES) {
                Ok(r) => *slot = Some(r),
                // No ring (EMFILE, ENOMEM, a locked-down kernel): that says
                // nothing about the members, so none is failed for it; the
                // caller runs the batch through pread/pwrite instead.
                Err(e) => {
                    tracing::warn!(
                        "cannot create an io_uring ({e}); this batch runs through pread/pwrite"
                    );
                    return None;
                }
            }
        }
        let ring = slot.as_mut().unwrap();
        let mut results: Vec<Option<io::Result<()>>> = which.iter().map(|_| None).collect();
        for window in (0..which.len())
            .collect::<Vec<_>>()
            .chunks(RING_ENTRIES as usize)
        {
            for &w in window {
                let io = &mut ios[which[w]];
                let fd = types::Fd(
                    members[io.member]
                        .uring_fd()
                        .expect("selected for the ring"),
                );
                let entry = match &mut io.op {
                    IoOp::Read(b) => opcode::Read::new(fd, b.as_mut_ptr(), b.len() as u32)
                        .offset(io.offset)
                        .build(),
                    IoOp::Write(b) => opcode::Write::new(fd, b.as_ptr(), b.len() as u32)
                        .offset(io.offset)
                        .build(),
                };
                // SAFETY: the buffer lives in `ios`, borrowed for this whole
                // call, and we wait below for every entry to complete before
                // returning, so the kernel never touches freed memory.
                unsafe {
                    ring.submission()
                        .push(&entry.user_data(w as u64))
                        .expect("ring has room: window <= entries")
                };
            }
            let mut pending = window.len();
            if let Err(e) = ring.submit_and_wait(pending) {
                // Nothing can be trusted about this window: run it synchronously.
                tracing::warn!("io_uring submit failed ({e}); running the batch synchronously");
                drain(ring);
                for &w in window {
                    results[w] = None;
                }
                continue;
            }
            while pending > 0 {
                let cqes: Vec<(u64, i32)> = ring
                    .completion()
                    .map(|c| (c.user_data(), c.result()))
                    .collect();
                for (ud, res) in cqes {
                    let w = ud as usize;
                    let io = &mut ios[which[w]];
                    let want = io.len();
                    results[w] = Some(if res < 0 {
                        Err(io::Error::from_raw_os_error(-res))
                    } else if (res as usize) < want {
                        finish_short(members[io.member].as_ref(), io, res as usize)
                    } else {
                        Ok(())
                    });
                    pending -= 1;
                }
                if pending > 0 {
                    ring.submit_and_wait(1)
                        .map_err(|e| tracing::error!("io_uring wait: {e}"))
                        .ok();
                }
            }
        }
        let all = which
            .iter()
            .enumerate()
            .map(|(w, &k)| match results[w].take() {
                Some(r) => r,
                None => {
                    let io = &mut ios[k];
                    let m = members[io.member].as_ref();
                    match &mut io.op {
                        IoOp::Read(b) => m.read_at(b, io.offset),
                        IoOp::Write(b) => m.write_at(b, io.offset),
                    }
                }
            })
            .collect();
        Some(all)
    })
}

fn drain(ring: &mut IoUring) {
    while ring.completion().next().is_some() {}
}

/// Completes a short read or write synchronously (a read past the end of a
/// file comes back short: that is an error for a member).
fn finish_short(m: &dyn Member, io: &mut MemberIo<'_>, done: usize) -> io::Result<()> {
    let off = io.offset + done as u64;
    match &mut io.op {
        IoOp::Read(b) => m.read_at(&mut b[done..], off),
        IoOp::Write(b) => m.write_at(&b[done..], off),
    }
}
