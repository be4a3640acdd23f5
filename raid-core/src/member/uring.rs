//! The io_uring path: one ring per thread, a whole batch of member I/Os
//! pushed in one submission. Falls back to pread/pwrite when the kernel (or a
//! seccomp policy) refuses io_uring, or when RAID_NO_URING=1 is set.

use super::{IoKind, Member, MemberIo, MemberRef};
use io_uring::{opcode, squeue, types, IoUring};
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

/// The ring entry that reads or writes `len` bytes at `ptr` from or to
/// `fd` at byte `at`, for a batch (`run_batch`) or a shard. A write with
/// FUA carries `RWF_DSYNC`: the kernel sends it with FUA where the device
/// takes it, and writes then flushes that device where it does not.
/// Building it touches no memory; pushing it is the caller's promise that
/// the buffer outlives the I/O.
pub(crate) fn rw_entry(
    fd: types::Fd,
    kind: IoKind,
    ptr: *mut u8,
    len: u32,
    at: u64,
) -> squeue::Entry {
    match kind {
        IoKind::Read => opcode::Read::new(fd, ptr, len).offset(at).build(),
        IoKind::Write => opcode::Write::new(fd, ptr, len).offset(at).build(),
        IoKind::WriteFua => opcode::Write::new(fd, ptr, len)
            .offset(at)
            .rw_flags(libc::RWF_DSYNC)
            .build(),
    }
}

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
        let mut refused = false;
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
                let (kind, ptr, len) = (io.op.kind(), io.op.as_mut_ptr(), io.len());
                let entry = rw_entry(fd, kind, ptr, len as u32, io.offset);
                // SAFETY: the buffer lives in `ios`, borrowed for this whole
                // call. `run_window` returns only once the kernel holds none
                // of these entries: every one it took has completed, and a
                // ring left with entries it never took is dropped below,
                // before this call returns, so they can never be submitted.
                unsafe {
                    ring.submission()
                        .push(&entry.user_data(w as u64))
                        .expect("ring has room: window <= entries")
                };
            }
            let done = run_window(ring, window.len(), &mut |w, res| {
                let io = &mut ios[which[w]];
                let want = io.len();
                results[w] = Some(if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else if (res as usize) < want {
                    finish_short(members[io.member].as_ref(), io, res as usize)
                } else {
                    Ok(())
                });
            });
            if !done {
                // The rest of the batch runs synchronously below.
                refused = true;
                break;
            }
        }
        if refused {
            // Entries the kernel never took are still queued in this ring:
            // it must never be entered again (they point into `ios`).
            *slot = None;
        }
        let all = which
            .iter()
            .enumerate()
            .map(|(w, &k)| match results[w].take() {
                Some(r) => r,
                None => {
                    let io = &mut ios[k];
                    io.op.run_on(members[io.member].as_ref(), io.offset)
                }
            })
            .collect();
        Some(all)
    })
}

/// How often a submission refused for a passing reason (EAGAIN: no memory
/// for requests now; EBUSY: the completion queue is full) is tried again,
/// completions reaped in between, before the window goes the synchronous
/// way.
const SUBMIT_RETRIES: u32 = 8;

/// Submits the `pushed` entries queued in the ring and reaps their
/// completions, calling `complete(user_data, result)` for each. Returns
/// true when all were submitted and completed; false when the kernel
/// refused a submission for good, with every entry it did take completed
/// and the others still queued (the caller must then drop the ring).
///
/// It never returns while the kernel holds an entry: that is what makes
/// the buffers' lifetime safe. If waiting fails (not EINTR), it keeps
/// reaping with short sleeps instead of spinning: the completions arrive
/// regardless, and returning early would free buffers the kernel still
/// reads or writes.
fn run_window(ring: &mut IoUring, pushed: usize, complete: &mut dyn FnMut(usize, i32)) -> bool {
    let mut queued = pushed;
    let mut in_flight = 0usize;
    let mut refused = false;
    let mut retries = 0u32;
    let mut wait_warned = false;
    loop {
        if queued > 0 && !refused {
            match submit_and_wait(ring, queued + in_flight) {
                Ok(n) if n > 0 => {
                    let n = n.min(queued);
                    queued -= n;
                    in_flight += n;
                    retries = 0;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => {
                    // Ok(0) with entries queued: nothing was taken, as with
                    // EAGAIN; retried a few times, then given up.
                    let transient = match &r {
                        Ok(_) => true,
                        Err(e) => matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)),
                    };
                    retries += 1;
                    if !transient || retries > SUBMIT_RETRIES {
                        tracing::warn!(
                            "io_uring submit refused ({}); {queued} I/Os run through pread/pwrite",
                            r.err()
                                .map_or("nothing taken".to_string(), |e| e.to_string())
                        );
                        refused = true;
                    } else if in_flight == 0 {
                        std::thread::sleep(std::time::Duration::from_micros(50 << retries));
                    } else {
                        // Room frees as completions are reaped: wait for one.
                        let _ = wait_only(ring, 1);
                    }
                }
            }
        } else if in_flight > 0 && ring.completion().is_empty() {
            if let Err(e) = wait_only(ring, in_flight) {
                if e.kind() != io::ErrorKind::Interrupted {
                    if !wait_warned {
                        tracing::error!("io_uring wait failed ({e}); polling for completions");
                        wait_warned = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
        for c in ring.completion() {
            complete(c.user_data() as usize, c.result());
            in_flight -= 1;
        }
        if in_flight == 0 && (queued == 0 || refused) {
            return queued == 0;
        }
    }
}

/// Submits what is queued and waits for `want` completions, through the
/// test hook that can make it fail.
fn submit_and_wait(ring: &IoUring, want: usize) -> io::Result<usize> {
    #[cfg(test)]
    if let Some(e) = inject::take() {
        return Err(e);
    }
    ring.submit_and_wait(want)
}

/// Waits for `want` completions without submitting anything: after a
/// refused submission, the entries still queued must stay untaken.
fn wait_only(ring: &IoUring, want: usize) -> io::Result<usize> {
    const IORING_ENTER_GETEVENTS: u32 = 1;
    // SAFETY: io_uring_enter with nothing to submit and no argument (None)
    // reads and writes no memory of ours; it only waits.
    unsafe {
        ring.submitter()
            .enter::<libc::sigset_t>(0, want as u32, IORING_ENTER_GETEVENTS, None)
    }
}

/// Failures to inject into this thread's next submissions (tests only).
#[cfg(test)]
pub(super) mod inject {
    use std::cell::RefCell;
    use std::io;

    thread_local! {
        static NEXT: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
    }

    /// The next submissions on this thread fail with these errnos, in order.
    pub fn fail_submits(errnos: &[i32]) {
        NEXT.with(|n| *n.borrow_mut() = errnos.iter().rev().copied().collect());
    }

    pub(super) fn take() -> Option<io::Error> {
        NEXT.with(|n| n.borrow_mut().pop().map(io::Error::from_raw_os_error))
    }

    /// How many injected failures are still to come.
    pub fn left() -> usize {
        NEXT.with(|n| n.borrow().len())
    }
}

/// Completes a short read or write synchronously (a read past the end of a
/// file comes back short: that is an error for a member).
fn finish_short(m: &dyn Member, io: &mut MemberIo<'_>, done: usize) -> io::Result<()> {
    io.op.run_from(m, io.offset, done)
}

#[cfg(test)]
mod tests {
    use super::inject;
    use crate::buf::AlignedBuf;
    use crate::member::{io_path, submit, FileMember, IoOp, IoPath, Member, MemberIo, MemberRef};
    use std::sync::Arc;

    const K4: usize = 4096;

    fn file_member(tag: &str) -> (MemberRef, std::path::PathBuf) {
        let p = std::env::temp_dir().join(format!("uring-{tag}-{}.img", std::process::id()));
        std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
        (Arc::new(FileMember::open(&p).unwrap()), p)
    }

    fn filled(byte: u8) -> AlignedBuf {
        let mut b = AlignedBuf::new(K4);
        b.fill(byte);
        b
    }

    /// Writes `bufs` to blocks 0, 1, 2... of the member in one batch;
    /// every write must succeed.
    fn write_blocks(handles: &[MemberRef], bufs: &[AlignedBuf]) {
        let mut ios: Vec<MemberIo> = bufs
            .iter()
            .enumerate()
            .map(|(k, b)| MemberIo {
                member: 0,
                offset: (k * K4) as u64,
                op: IoOp::Write(b),
            })
            .collect();
        for r in submit(handles, &mut ios) {
            r.unwrap();
        }
    }

    fn read(m: &dyn Member, at: u64) -> Vec<u8> {
        let mut b = AlignedBuf::new(K4);
        m.read_at(&mut b, at).unwrap();
        b.to_vec()
    }

    /// Writes with FUA (`RWF_DSYNC`) land as writes do: two in one batch
    /// through the ring, and one from a buffer out of alignment through
    /// the member's own call (a bounce buffer under O_DIRECT).
    #[test]
    fn writes_with_fua_land_as_writes_do() {
        let (m, path) = file_member("fua");
        let handles = vec![m.clone()];
        let (a, b) = (filled(0x11), filled(0x22));
        let mut ios = vec![
            MemberIo {
                member: 0,
                offset: 0,
                op: IoOp::WriteFua(&a),
            },
            MemberIo {
                member: 0,
                offset: K4 as u64,
                op: IoOp::WriteFua(&b),
            },
        ];
        for r in submit(&handles, &mut ios) {
            r.unwrap();
        }
        let odd = vec![0x33u8; K4 + 1];
        m.write_fua_at(&odd[1..], 2 * K4 as u64).unwrap();
        assert_eq!(read(m.as_ref(), 0), vec![0x11; K4]);
        assert_eq!(read(m.as_ref(), K4 as u64), vec![0x22; K4]);
        assert_eq!(read(m.as_ref(), 2 * K4 as u64), vec![0x33; K4]);
        std::fs::remove_file(path).unwrap();
    }

    /// A submission the kernel refuses for good leaves its entries queued
    /// in the ring. They point into buffers that die with the call: the
    /// ring must go with them, or the next batch on this thread submits
    /// them and writes freed memory over the member.
    #[test]
    fn a_refused_submit_leaves_no_entry_behind() {
        if io_path() != IoPath::IoUring {
            eprintln!("skipped: io_uring is not available here");
            return;
        }
        let (m, path) = file_member("refused");
        let handles = vec![m.clone()];
        let later = filled(0xBB);
        inject::fail_submits(&[libc::EIO]);
        {
            let bufs: Vec<AlignedBuf> = (0..4).map(|_| filled(0xAA)).collect();
            write_blocks(&handles, &bufs);
        }
        assert_eq!(inject::left(), 0, "the batch went through the ring");
        for k in 0..4 {
            assert!(
                read(&*m, (k * K4) as u64).iter().all(|&b| b == 0xAA),
                "fallback wrote"
            );
            m.write_at(&later, (k * K4) as u64).unwrap();
        }
        // The next batch on this thread: a stale entry would run now.
        let mut a = AlignedBuf::new(K4);
        let mut b = AlignedBuf::new(K4);
        let mut ios = vec![
            MemberIo {
                member: 0,
                offset: 64 * K4 as u64,
                op: IoOp::Read(&mut a),
            },
            MemberIo {
                member: 0,
                offset: 65 * K4 as u64,
                op: IoOp::Read(&mut b),
            },
        ];
        for r in submit(&handles, &mut ios) {
            r.unwrap();
        }
        for k in 0..4 {
            let got = read(&*m, (k * K4) as u64);
            assert!(
                got.iter().all(|&b| b == 0xBB),
                "block {k} was rewritten by an entry of the refused batch (now {:#x}...)",
                got[0]
            );
        }
        let _ = std::fs::remove_file(path);
    }

    /// EAGAIN and EBUSY say "not now": the batch is submitted again and
    /// goes through the ring.
    #[test]
    fn a_busy_ring_is_tried_again() {
        if io_path() != IoPath::IoUring {
            eprintln!("skipped: io_uring is not available here");
            return;
        }
        let (m, path) = file_member("busy");
        let handles = vec![m.clone()];
        inject::fail_submits(&[libc::EAGAIN, libc::EBUSY, libc::EINTR]);
        let bufs: Vec<AlignedBuf> = (0..3).map(|k| filled(0x10 + k as u8)).collect();
        write_blocks(&handles, &bufs);
        assert_eq!(inject::left(), 0);
        for k in 0..3 {
            assert!(read(&*m, (k * K4) as u64)
                .iter()
                .all(|&b| b == 0x10 + k as u8));
        }
        let _ = std::fs::remove_file(path);
    }
}
