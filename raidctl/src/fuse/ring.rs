//! FUSE over io_uring (Linux 6.14 on, when the fuse module's `enable_uring`
//! is on): requests arrive as completions of commands on io_uring rings
//! instead of reads of `/dev/fuse`, and a reply is committed together with
//! the fetch of the next request, so a request costs one system call
//! instead of a read and a write. Requests are queued per CPU: the kernel
//! hands each to the queue of the CPU its submitter runs on, so no queue is
//! shared between CPUs.
//!
//! The kernel serves ring *entries*, each a header buffer and a payload
//! buffer; the entries of a queue are that queue's depth. A thread
//! (`Worker`) serves its share of a queue's entries on its own io_uring:
//! - where a member is a device, one entry, because the array's API
//!   blocks a thread per request in flight;
//! - where every member is in memory, several: a request is answered
//!   without waiting, so the replies to all that one wake-up brought are
//!   committed, and the next requests waited for, in one io_uring_enter
//!   (a queue's entries are shared by a few threads: see
//!   `RING_THREADS_IN_MEMORY`).
//!
//! The threads are not pinned to their queue's CPU (libfuse pins its one
//! thread per queue): with a thread blocked per request, pinning cost
//! 10-30% on every job of `scripts/bench-mount.sh` on 2 vCPUs; with the
//! threads answering in batches, pinned to their queue's CPU 0.9x on 4 KiB
//! random reads, spread over the CPUs the same as not pinned.
//!
//! Order, set by the kernel (fs/fuse/dev_uring.c):
//! - INIT is answered on `/dev/fuse`, asking for FUSE_OVER_IO_URING; only
//!   then may entries register (before, the kernel answers EAGAIN).
//! - From that INIT until every CPU's queue holds an entry, the kernel
//!   holds new requests back. So the rings and buffers are all made before
//!   INIT (`Ring::prepare`), and io_uring is asked for only if they were:
//!   a ring that cannot be made must not leave the mount waiting for it.
//! - A registration the kernel refuses puts the connection back on
//!   `/dev/fuse`, which the session threads keep serving.
//!
//! Buffers: the kernel copies into an entry's buffers only while a command
//! of that entry is in flight, in the context of the thread that submitted
//! it. A thread frees its entries' buffers only after reaping the
//! completion of each one's last command (ENOTCONN at unmount, or an
//! error), after which nothing in the kernel writes to them; if
//! io_uring_enter keeps failing with commands in flight, the buffers are
//! kept for good instead (`Worker::abandon`).
//!
//! An entry is not given up while the ring serves: a reply the kernel
//! refuses is followed by a new registration, and a request whose handling
//! panics is answered EIO. A queue left without entries would hold its
//! CPU's requests until unmount.

use super::abi::{self, ring, InHeader};
use super::ops::{self, Answer, Fs, Request};
use super::MAX_IO;
use io_uring::{opcode, squeue, types, IoUring};
use parking_lot::{Condvar, Mutex};
use raid_core::buf::AlignedBuf;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long registration is retried while the kernel has not yet taken
/// INIT's reply (EAGAIN).
const REGISTER_PATIENCE: Duration = Duration::from_secs(10);
/// How long a failing io_uring_enter is retried before its thread's
/// entries are abandoned.
const ENTER_PATIENCE: Duration = Duration::from_secs(10);

/// Opened by INIT: whether the ring threads register (the kernel agreed to
/// FUSE over io_uring) or end (it did not, or the mount ended first).
pub struct Gate {
    state: Mutex<Option<bool>>,
    cv: Condvar,
    queues: usize,
    entries: usize,
    threads: usize,
    /// Requests answered through the ring, said at unmount.
    served: AtomicU64,
    /// The most requests one io_uring_enter brought a thread (requests,
    /// not other completions), said at unmount: above 1 where a thread
    /// serves several entries and requests came together.
    largest_batch: AtomicU64,
    /// Said once: threads serving several entries found a member no
    /// longer in memory.
    shape_outgrown: std::sync::atomic::AtomicBool,
}

impl Gate {
    /// Called once INIT's reply is written: `used`, the reply asked for
    /// io_uring; `offered`, the kernel offered it. Says which transport
    /// serves the mount.
    pub fn open(&self, used: bool, offered: bool) {
        if used {
            tracing::info!(
                queues = self.queues,
                entries = self.entries,
                threads = self.threads,
                "FUSE transport: io_uring, {} queues (one per CPU), {} entries in all, served by {} threads; /dev/fuse threads answer the rest (INIT, FORGET, INTERRUPT)",
                self.queues,
                self.entries,
                self.threads
            );
        } else if !offered {
            tracing::info!(
                "FUSE transport: threads reading /dev/fuse (the kernel did not offer io_uring on this connection)"
            );
        }
        self.set(used);
    }

    /// The mount ended: threads still waiting end without registering.
    pub fn close(&self) {
        self.set(false);
    }

    fn set(&self, go: bool) {
        let mut s = self.state.lock();
        if s.is_none() {
            *s = Some(go);
        }
        self.cv.notify_all();
    }

    fn wait(&self) -> bool {
        let mut s = self.state.lock();
        loop {
            if let Some(go) = *s {
                return go;
            }
            self.cv.wait(&mut s);
        }
    }
}

/// The ring's threads, waiting at the gate until INIT opens it.
pub struct Ring {
    pub gate: Arc<Gate>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Ring {
    /// Makes `depth` entries for each online CPU's queue (one for a CPU
    /// that is possible but offline: the kernel needs every possible
    /// CPU's queue filled before it uses any), with their buffers, and
    /// `threads_per_queue` threads sharing a queue's entries, each on its
    /// own io_uring (`Worker`). Fails, with nothing left running, if any
    /// cannot be made: the export then does not ask for io_uring.
    pub fn prepare(
        fd: &File,
        fs: Arc<Fs>,
        depth: usize,
        threads_per_queue: usize,
    ) -> io::Result<Ring> {
        let possible = cpus("possible").ok_or_else(|| io::Error::other("no CPU list in /sys"))?;
        let online = cpus("online").unwrap_or_else(|| possible.clone());
        let mut workers = Vec::new();
        for &q in &possible {
            let n = if online.contains(&q) { depth } else { 1 };
            let t = threads_per_queue.clamp(1, n);
            for k in 0..t {
                let m = n / t + usize::from(k < n % t);
                workers.push(Worker::new(fd, q as u16, m)?);
            }
        }
        let gate = Arc::new(Gate {
            state: Mutex::new(None),
            cv: Condvar::new(),
            queues: possible.len(),
            entries: workers.iter().map(|w| w.entries.len()).sum(),
            threads: workers.len(),
            served: AtomicU64::new(0),
            largest_batch: AtomicU64::new(0),
            shape_outgrown: Default::default(),
        });
        let threads = workers
            .into_iter()
            .enumerate()
            .map(|(i, w)| {
                let (fs, gate) = (fs.clone(), gate.clone());
                std::thread::Builder::new()
                    .name(format!("fuse-ring-{i}"))
                    .spawn(move || {
                        if gate.wait() {
                            w.serve_or_abandon(&fs, &gate);
                        }
                    })
            })
            .collect::<io::Result<Vec<_>>>();
        match threads {
            Ok(threads) => Ok(Ring { gate, threads }),
            Err(e) => {
                gate.close();
                Err(e)
            }
        }
    }

    /// Whether INIT put the mount on the ring (None: not decided yet).
    pub fn used(&self) -> Option<bool> {
        *self.gate.state.lock()
    }

    /// The ring's shape, for status: queues, entries in all, threads.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.gate.queues, self.gate.entries, self.gate.threads)
    }

    /// Joins the threads; the connection must be ended (or the gate
    /// closed) first.
    pub fn join(&mut self) {
        self.gate.close();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if *self.gate.state.lock() == Some(true) {
            tracing::info!(
                "FUSE over io_uring: {} requests served through the ring, up to {} per io_uring_enter",
                self.gate.served.load(Ordering::Relaxed),
                self.gate.largest_batch.load(Ordering::Relaxed)
            );
        }
    }
}

/// The CPUs in /sys/devices/system/cpu/{possible,online} ("0-3,6").
fn cpus(which: &str) -> Option<Vec<usize>> {
    let s = std::fs::read_to_string(format!("/sys/devices/system/cpu/{which}")).ok()?;
    let mut v = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        v.extend(a.parse::<usize>().ok()?..=b.parse::<usize>().ok()?);
    }
    (!v.is_empty()).then_some(v)
}

/// One thread's share of a queue: its io_uring and the entries it serves.
/// Where every member is in memory a request is answered without waiting,
/// so a thread serves several of its queue's entries and answers in
/// batches: the replies to what one wake-up brought are committed in one
/// io_uring_enter, which also waits for the next requests. Where a member
/// is a device, each entry has its own thread (the array's API blocks one
/// per request in flight). The shape is chosen at mount: an array whose
/// members later move to a device (a hot replace onto a drive) is served
/// the same way, each thread waiting for the device request by request,
/// until it is mounted again (said once in the log: `outgrown`).
struct Worker {
    qid: u16,
    uring: IoUring<squeue::Entry128>,
    /// This worker's own descriptor on the connection (a dup), so the
    /// session threads closing theirs cannot pull it from under it.
    fd: File,
    entries: Vec<Entry>,
}

/// One ring entry: the buffers the kernel puts a request in and takes its
/// reply from.
struct Entry {
    header: AlignedBuf,
    payload: AlignedBuf,
    /// The two buffers, as REGISTER hands them to the kernel.
    iov: [libc::iovec; 2],
}

// SAFETY: `iov` holds pointers into `header` and `payload`, which the
// entry owns and which move with it (their heap memory does not move).
unsafe impl Send for Entry {}

/// What an entry does next, once its command completed.
enum Next {
    /// Sends this command (REGISTER or COMMIT_AND_FETCH) under this id.
    Send(u32, u64),
    /// Registers again after a pause (the kernel has not taken INIT's
    /// reply yet).
    RegisterLater,
    /// Registers with an empty payload buffer, which the kernel must
    /// refuse (putting the connection back on `/dev/fuse` and waking the
    /// requests held for the ring), and then ends.
    Refuse,
    /// Ends: the connection is gone, or the entry cannot serve.
    End,
    /// Serves the request the kernel put in the buffers, then commits
    /// the reply with the fetch of the next.
    Serve,
}

impl Entry {
    fn new() -> Entry {
        let mut header = AlignedBuf::new(4096);
        // The kernel wants room for its largest request: MAX_IO of data.
        let mut payload = AlignedBuf::new(MAX_IO as usize);
        let iov = [
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: ring::HEADER,
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ];
        Entry {
            header,
            payload,
            iov,
        }
    }
}

impl Worker {
    fn new(fd: &File, qid: u16, entries: usize) -> io::Result<Worker> {
        let uring = IoUring::<squeue::Entry128>::builder()
            .build(entries.next_power_of_two().max(2) as u32)?;
        Ok(Worker {
            qid,
            uring,
            fd: fd.try_clone()?,
            entries: (0..entries).map(|_| Entry::new()).collect(),
        })
    }

    /// The SQE of entry `i`'s command: REGISTER (with the buffers) or
    /// COMMIT_AND_FETCH (the reply in the buffers, under `commit_id`).
    fn sqe(&self, i: usize, cmd: u32, commit_id: u64) -> squeue::Entry128 {
        let mut b = opcode::UringCmd80::new(types::Fd(self.fd.as_raw_fd()), cmd)
            .cmd(ring::cmd_req(commit_id, self.qid));
        if cmd == ring::CMD_REGISTER {
            b = b.addr(Some(self.entries[i].iov.as_ptr() as u64));
        }
        let sqe = b.build().user_data(i as u64);
        if cmd != ring::CMD_REGISTER {
            return sqe;
        }
        // REGISTER also needs the iovec count in `len` (2), which the
        // builder has no setter for.
        // SAFETY: Entry128 is repr(C): the kernel's 64-byte io_uring_sqe
        // (no padding) followed by 64 bytes of command; `len` is the u32
        // at byte 24 of io_uring_sqe. Every byte is initialised (the
        // builder starts from a zeroed SQE), and any bytes are a valid
        // Entry128.
        unsafe {
            let mut raw: [u8; 128] = std::mem::transmute(sqe);
            raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
            std::mem::transmute::<[u8; 128], squeue::Entry128>(raw)
        }
    }

    /// Submits what is queued and waits for at least one completion.
    /// False: io_uring_enter kept failing for `ENTER_PATIENCE`, with
    /// commands perhaps still in flight: the caller must then never free
    /// the buffers (`abandon`).
    fn enter(&mut self) -> bool {
        let began = Instant::now();
        loop {
            match self.uring.submit_and_wait(1) {
                Ok(_) => return true,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => return true,
                Err(e) => {
                    if began.elapsed() > ENTER_PATIENCE {
                        tracing::error!(queue = self.qid, "FUSE ring: io_uring_enter: {e}");
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// Says once per mount that this shape (threads serving several
    /// entries, chosen because every member was in memory) now waits on a
    /// device request by request, and what to do.
    fn outgrown(&self, gate: &Gate) {
        if !gate.shape_outgrown.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                queue = self.qid,
                "FUSE ring: a member is no longer in memory, and this mount's ring threads serve several requests each, one after another: unmount and mount again to have a thread per request"
            );
        }
    }

    /// Gives the worker up with commands perhaps still in flight: its
    /// buffers stay allocated for good, so the kernel never writes into
    /// freed memory.
    fn abandon(self) {
        tracing::error!(
            queue = self.qid,
            "FUSE ring: {} entries are abandoned with their buffers ({} KiB kept)",
            self.entries.len(),
            self.entries
                .iter()
                .map(|e| e.payload.len() + e.header.len())
                .sum::<usize>()
                >> 10
        );
        std::mem::forget(self);
    }

    /// Serves until the connection ends, then frees the buffers; gives
    /// them up instead (`abandon`) where a command may still be in flight:
    /// io_uring_enter kept failing, or serving panicked (a panic past a
    /// request's own handling, which is answered EIO), since then other
    /// entries' commands are in flight and the kernel may still copy a
    /// request into their buffers.
    fn serve_or_abandon(mut self, fs: &Fs, gate: &Gate) {
        let served =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve(fs, gate)));
        match served {
            Ok(true) => {}
            Ok(false) => self.abandon(),
            Err(_) => {
                tracing::error!(queue = self.qid, "FUSE ring: a serving thread panicked");
                self.abandon()
            }
        }
    }

    /// Registers every entry, then serves requests until the connection
    /// ends. Each entry has at most one command in flight. True: every
    /// command the kernel took was reaped; false: io_uring_enter kept
    /// failing with commands in flight.
    fn serve(&mut self, fs: &Fs, gate: &Gate) -> bool {
        let began = Instant::now();
        let n = self.entries.len();
        let mut next: Vec<Next> = (0..n).map(|_| Next::Send(ring::CMD_REGISTER, 0)).collect();
        // The command each entry has in flight.
        let mut sent: Vec<Option<(u32, u64)>> = vec![None; n];
        let mut reaped = Vec::with_capacity(n);
        // The membership epoch the shape was last checked at (none yet).
        let mut checked = u64::MAX;
        loop {
            if next.iter().any(|x| matches!(x, Next::RegisterLater)) {
                // INIT's reply not taken yet.
                std::thread::sleep(Duration::from_millis(1));
            }
            for i in 0..n {
                let cmd = match std::mem::replace(&mut next[i], Next::End) {
                    Next::Send(cmd, id) => (cmd, id),
                    Next::RegisterLater => (ring::CMD_REGISTER, 0),
                    Next::Refuse => {
                        // A payload buffer too small: a registration the
                        // kernel must refuse.
                        self.entries[i].iov[1].iov_len = 0;
                        (ring::CMD_REGISTER, 0)
                    }
                    // (Serve is turned into its commit as it is reaped.)
                    Next::End | Next::Serve => continue,
                };
                let sqe = self.sqe(i, cmd.0, cmd.1);
                // SAFETY: the buffers the command names (`iov`, `header`,
                // `payload` of entry i) belong to this worker, which is
                // freed only after this command's completion was reaped,
                // or never (`serve_or_abandon`: also on a panic). The
                // ring has room: it has at least as many slots as the
                // worker has entries, and each entry has one command
                // queued or in flight at most.
                unsafe { self.uring.submission().push(&sqe) }.expect("a slot per entry");
                sent[i] = Some(cmd);
            }
            if sent.iter().all(Option::is_none) {
                return true;
            }
            if !self.enter() {
                return false;
            }
            reaped.extend(
                self.uring
                    .completion()
                    .map(|c| (c.user_data() as usize, c.result())),
            );
            let mut served = 0;
            for (i, r) in reaped.drain(..) {
                let done = sent[i].take().expect("a command in flight");
                next[i] = match self.outcome(i, done, r, began) {
                    Next::Serve => {
                        served += 1;
                        let id = self.entries[i].request(fs, self.qid);
                        Next::Send(ring::CMD_COMMIT_AND_FETCH, id)
                    }
                    n => n,
                };
            }
            gate.served.fetch_add(served, Ordering::Relaxed);
            gate.largest_batch.fetch_max(served, Ordering::Relaxed);
            // Whether the shape still fits: asked again only once the
            // members changed (reading every member's handle per batch
            // would tax the batches).
            let epoch = fs.io.array.membership_epoch();
            if n > 1 && epoch != checked {
                checked = epoch;
                if !fs.io.array.all_in_memory() {
                    self.outgrown(gate);
                }
            }
        }
    }

    /// What entry `i` does after its command (`cmd`, sent under
    /// `commit_id`) completed with `r`; registration is retried until
    /// `REGISTER_PATIENCE` after `began`.
    fn outcome(&self, i: usize, (cmd, commit_id): (u32, u64), r: i32, began: Instant) -> Next {
        if cmd == ring::CMD_REGISTER && self.entries[i].iov[1].iov_len == 0 {
            // A refusal's registration: whatever the kernel said, done.
            return Next::End;
        }
        match -r {
            0 => Next::Serve,
            libc::EAGAIN | libc::EINTR if cmd == ring::CMD_REGISTER => {
                if began.elapsed() < REGISTER_PATIENCE {
                    return Next::RegisterLater;
                }
                tracing::warn!(
                    queue = self.qid,
                    "FUSE ring: cannot register; sending the connection back to /dev/fuse"
                );
                Next::Refuse
            }
            libc::EINTR | libc::EAGAIN => Next::Send(cmd, commit_id),
            // Unmounted, or the connection was ended.
            libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV => Next::End,
            e if cmd == ring::CMD_REGISTER => {
                tracing::warn!(
                    queue = self.qid,
                    "FUSE ring: the kernel refused to register a ring entry ({}); if the ring was not complete yet, /dev/fuse serves the connection",
                    io::Error::from_raw_os_error(e)
                );
                Next::End
            }
            e => {
                // The entry is still needed: a queue with none left
                // would hold its CPU's requests for good.
                tracing::warn!(
                    queue = self.qid,
                    "FUSE ring: the kernel refused a reply ({}); the entry registers again",
                    io::Error::from_raw_os_error(e)
                );
                Next::Send(ring::CMD_REGISTER, 0)
            }
        }
    }
}

impl Entry {
    /// Serves the request the kernel put in the buffers, leaving the reply
    /// there; returns the id to commit it under.
    fn request(&mut self, fs: &Fs, qid: u16) -> u64 {
        let h = InHeader::fields(&self.header[ring::IN_OUT..]).expect("header buffer");
        let commit_id = ring::commit_id(&self.header).expect("header buffer");
        let len = ring::payload_sz(&self.header).expect("header buffer") as usize;
        let op: [u8; ring::OP_IN_LEN] = self.header[ring::OP_IN..ring::OP_IN + ring::OP_IN_LEN]
            .try_into()
            .expect("128 bytes");
        let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.handle(fs, h, &op, len)
        }));
        let reply = handled.unwrap_or_else(|_| {
            tracing::error!(
                queue = qid,
                opcode = h.opcode,
                "FUSE ring: a request's handling panicked; answered EIO"
            );
            Reply::error(h.unique, libc::EIO)
        });
        // Every request through the ring expects an answer.
        let reply = reply
            .or(Reply::error(h.unique, libc::ENOSYS))
            .expect("an answer");
        let n = match &reply.held {
            Some(b) => {
                self.payload[..b.len()].copy_from_slice(b);
                b.len()
            }
            None => reply.len,
        };
        let out = abi::out_header(abi::OUT_HEADER + n, -reply.error, reply.unique);
        self.header[ring::IN_OUT..ring::IN_OUT + abi::OUT_HEADER].copy_from_slice(&out);
        ring::set_reply(&mut self.header, n as u32);
        commit_id
    }

    /// Runs one request against the filesystem; its reply, if it made one.
    fn handle(&mut self, fs: &Fs, h: InHeader, op: &[u8], len: usize) -> Option<Reply> {
        if len > self.payload.len() {
            Reply::error(h.unique, libc::EINVAL)
        } else if h.opcode == abi::DESTROY {
            Reply::error(h.unique, 0)
        } else if h.opcode == abi::WRITE {
            // A write's data stays where the kernel put it (page aligned:
            // members opened with O_DIRECT take it with no copy); its
            // reply is held aside and put in the payload after.
            let mut ans = RingAnswer {
                payload: None,
                reply: None,
            };
            let data = &self.payload[..len];
            ops::handle(&mut ans, fs, Request { h, op, data });
            ans.reply
        } else {
            // LOOKUP has no fixed part: the kernel (6.14 on) puts its
            // name, its first argument it sends, in the payload, not in
            // op_in.
            let name: Vec<u8>;
            let op: &[u8] = if h.opcode == abi::LOOKUP && len > 0 {
                name = self.payload[..len].to_vec();
                &name
            } else {
                op
            };
            let mut ans = RingAnswer {
                payload: Some(&mut self.payload),
                reply: None,
            };
            ops::handle(&mut ans, fs, Request { h, op, data: &[] });
            ans.reply
        }
    }
}

/// A reply: its body is in the payload (`len` bytes) or held aside.
struct Reply {
    unique: u64,
    error: i32,
    len: usize,
    held: Option<Vec<u8>>,
}

impl Reply {
    fn error(unique: u64, error: i32) -> Option<Reply> {
        Some(Reply {
            unique,
            error,
            len: 0,
            held: None,
        })
    }
}

/// Answers into the entry's payload buffer, or aside while the payload
/// holds a write's data.
struct RingAnswer<'a> {
    payload: Option<&'a mut [u8]>,
    reply: Option<Reply>,
}

impl Answer for RingAnswer<'_> {
    fn send(&mut self, unique: u64, error: i32, parts: &[&[u8]]) {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut reply = Reply {
            unique,
            error,
            len: total,
            held: None,
        };
        match self.payload.as_deref_mut() {
            Some(p) if total <= p.len() => {
                let mut at = 0;
                for part in parts {
                    p[at..at + part.len()].copy_from_slice(part);
                    at += part.len();
                }
            }
            Some(_) => {
                reply.error = libc::EIO;
                reply.len = 0;
            }
            None => reply.held = Some(parts.concat()),
        }
        self.reply = Some(reply);
    }

    fn buffer(&mut self, len: usize) -> Option<&mut [u8]> {
        self.payload.as_deref_mut()?.get_mut(..len)
    }

    fn send_filled(&mut self, unique: u64, len: usize) {
        self.reply = Some(Reply {
            unique,
            error: 0,
            len,
            held: None,
        });
    }
}
