//! An NBD connection's transmission phase served on one of the engine's
//! shards (`raid_core::shard::Client`), as SPDK's NBD target runs on its
//! reactors: the shard's loop receives the requests from the socket, gives
//! them to itself (a write whose stripe another shard owns crosses to it),
//! and sends the replies as their completions run, on the same thread. No
//! request, completion or reply crosses between threads of the export; on
//! drives that complete in tens of microseconds each crossing (a wake-up)
//! costs as much as the drive, which `transmission.rs`'s reader and writer
//! threads pay twice per request.
//!
//! The socket is never waited on: it is read and written without blocking
//! (`MSG_DONTWAIT`), and where it has nothing to read (no room to write)
//! the connection asks its shard to poll it on the ring (`Local::watch`),
//! so that the shard, which sleeps in its ring, turns when the client
//! sends (reads). Work that waits on other requests (a write of part of a
//! block, which waits for every write in flight on the array; a write
//! while such a one runs; a block status, a system call per run of data on
//! each member) runs on a helper thread of the connection's, one request
//! at a time, the connection reading nothing further meanwhile, as the
//! threaded reader does. A TLS connection runs the same way, its records
//! made and read by rustls on the shard (`TlsStream::recv_now`,
//! `send_now`): a reply is taken once rustls has it in a record, and the
//! records that wait for room in the socket have the shard poll it for
//! room as replies do.
//!
//! The limits on what is in flight, the pool of buffers, the checks and
//! every command's meaning are the threaded reader's (`requests.rs`).

use super::protocol_error;
use super::requests::{
    checked, form_of, replies_after_flush, route, submit, writes, Giver, Out, Outbox, Pending,
    Room, Route,
};
use super::structured::Negotiated;
use super::wire::{with_slices, Form, Payload, Reply};
use crate::any_bytes::{AnyBytes, Counted};
use crate::nbd::{self, Check, Request};
use crate::remote::tls::Stream;
use raid_core::array::Array;
use raid_core::buf::AlignedBuf;
use raid_core::shard::{Client, Done, Engine, Home, Local, ReadDone, WriteDone};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// Rounds of taking requests in one poll, where replies sent at once keep
/// making room (errors, holes): past them the shard turns first.
const ROUNDS: usize = 4;
/// Bytes received from the socket at once (a write's payload larger than
/// what is left of it is received straight into its buffer).
const RECEIVE: usize = 256 << 10;
/// Bytes of TLS records rustls may hold for the socket.
const TLS_UNSENT: usize = 1 << 20;

/// Whether connections are served on the shards (the default, TLS or
/// not); `RAIDCTL_NBD_ON_SHARDS=0` keeps them on threads of their own
/// (`transmission.rs`), to compare the two. So does an engine with no
/// shards (no io_uring).
pub(super) fn wanted(engine: &Engine) -> bool {
    engine.shard_count() > 0 && std::env::var("RAIDCTL_NBD_ON_SHARDS").as_deref() != Ok("0")
}

/// Serves the transmission phase of `sock` on one of `engine`'s shards
/// (which must have some: `wanted`) until the client disconnects or the
/// connection fails; returns once every request read was answered (or,
/// once writing to the client failed, completed and dropped).
pub(super) fn transmission(
    sock: Stream,
    array: Arc<Array>,
    engine: &Engine,
    (lenient, read_only): (bool, bool),
    negotiated: Negotiated,
    any: Arc<AnyBytes>,
) -> io::Result<()> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    static TOKENS: AtomicU64 = AtomicU64::new(0);
    if let Stream::Tls(t) = &sock {
        // Replies of 256 KiB and more each go to rustls in one call.
        t.set_buffer_limit(TLS_UNSENT);
    }
    let (ended, outcome) = mpsc::channel();
    let conn = Connection {
        token: TOKENS.fetch_add(1, Ordering::Relaxed) % (1 << 60),
        sock,
        array: array.clone(),
        any,
        rules: (lenient, read_only, negotiated),
        rx: vec![0; RECEIVE],
        head: 0,
        tail: 0,
        payload: None,
        outbox: Arc::new(Queue::default()),
        outgoing: Vec::new(),
        sent: 0,
        room: Room::default(),
        reading: true,
        broken: false,
        closed: false,
        aside: None,
        helper: None,
        watching: [false; 2],
        outcome: Ok(()),
        ended,
    };
    let shard = NEXT.fetch_add(1, Ordering::Relaxed) % engine.shard_count().max(1);
    if engine.run_client(shard, Box::new(conn)).is_err() {
        return Err(io::Error::other("the array's I/O engine has no shards"));
    }
    // Sent as the connection is dropped, on its shard. Work still on its
    // helper thread (a connection dropped early: a panic in its poll)
    // finishes before the flush.
    let (r, helper) = outcome.recv().unwrap_or((Ok(()), None));
    if let Some(h) = helper {
        h.join();
    }
    // A client that disconnects without FLUSH still gets its writes made
    // durable, as a clean close would.
    let _ = array.flush();
    r
}

/// Replies queued by completions, for the connection's next poll.
#[derive(Default)]
struct Queue {
    out: Mutex<Vec<Out>>,
    /// The connection's shard, set at its first poll.
    home: std::sync::OnceLock<Home>,
}

impl Outbox for Queue {
    /// Completions run on the connection's shard, which polls it next. A
    /// reply queued on another thread (a claim dropped unanswered there, by
    /// a panic in the engine's blocking threads) turns the shard, or an idle
    /// connection would not send it.
    fn push(&self, o: Out) {
        self.out.lock().unwrap().push(o);
        match self.home.get() {
            Some(h) if !h.is_current() => h.call(|| {}),
            _ => {}
        }
    }
}

/// Why `receive` stopped taking requests.
#[derive(PartialEq, Eq, Debug)]
enum Stop {
    /// The socket has nothing more now: worth a poll.
    Empty,
    /// The limits on what is in flight let no more in.
    Full,
    /// A request runs aside, or the stream ended, or the replies cannot go.
    Held,
}

/// A write's header, read; its payload still coming.
struct Incoming {
    req: Request,
    check: Check,
    buf: AlignedBuf,
    filled: usize,
    bytes: usize,
}

/// What work done on the helper thread brings back.
enum Aside {
    /// It queued its reply itself.
    Replied,
    /// A write let through the gate, to be given now.
    Admitted(Counted, Pending, Request, AlignedBuf),
}

type Slot = Arc<Mutex<Option<Aside>>>;

struct Connection {
    /// Names its polls on the shard's ring (twice it, and once more).
    token: u64,
    sock: Stream,
    array: Arc<Array>,
    any: Arc<AnyBytes>,
    rules: (bool, bool, Negotiated),
    /// Bytes received and not yet taken: `rx[head..tail]`.
    rx: Vec<u8>,
    head: usize,
    tail: usize,
    payload: Option<Incoming>,
    outbox: Arc<Queue>,
    /// Replies being sent, the first `sent` bytes of their wire form out.
    outgoing: Vec<Reply>,
    sent: usize,
    /// Requests read and not yet answered, and the buffers kept for the
    /// next.
    room: Room,
    /// The client may send more (no EOF, no NBD_CMD_DISC, no error).
    reading: bool,
    /// Sending to the client failed: replies are dropped as they come.
    broken: bool,
    /// The end of the stream was marked (`Stream::close_notify_now`).
    closed: bool,
    /// Work on the helper thread, the connection reading nothing meanwhile.
    aside: Option<Slot>,
    helper: Option<Helper>,
    /// Polls on the shard's ring: for reading, for writing.
    watching: [bool; 2],
    outcome: io::Result<()>,
    ended: mpsc::Sender<(io::Result<()>, Option<Helper>)>,
}

/// The connection's helper thread, and how work reaches it.
struct Helper {
    jobs: mpsc::Sender<Box<dyn FnOnce() + Send>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Helper {
    /// Ends the thread once it finished what it was given.
    fn join(self) {
        drop(self.jobs);
        if let Some(t) = self.thread {
            let _ = t.join();
        }
    }
}

impl Client for Connection {
    fn poll(&mut self, io: &mut Local<'_>) -> bool {
        if self.outbox.home.get().is_none() {
            let _ = self.outbox.home.set(io.home());
        }
        for (i, w) in self.watching.iter_mut().enumerate() {
            if *w && io.fired(self.token * 2 + i as u64) {
                *w = false;
            }
        }
        if let Some(back) = self.aside.as_ref().and_then(|s| s.lock().unwrap().take()) {
            self.aside = None;
            if let Aside::Admitted(counted, p, req, buf) = back {
                submit(&mut OnShard(io), p, req, buf, Some(counted));
            }
        }
        let mut rounds = 0;
        let stop = loop {
            rounds += 1;
            self.take_replies(io);
            self.send();
            let stop = self.receive(io).unwrap_or_else(|e| {
                self.reading = false;
                self.outcome = Err(e);
                Stop::Held
            });
            // Replies the requests just read were answered with at once
            // (errors, holes): sent, they may make room for the requests
            // still in `rx`, which no poll of the socket would bring back.
            let held = self.room.in_flight;
            self.take_replies(io);
            self.send();
            if stop != Stop::Full || self.room.in_flight == held {
                break stop;
            }
            if rounds == ROUNDS {
                // Requests answered at once, for as long as the client
                // sends them: the shard's other work goes first, then this
                // poll again.
                io.home().call(|| {});
                break stop;
            }
        };
        if !self.reading || self.broken {
            // A write whose payload will not come (the stream ended, or its
            // replies cannot go): answered EIO, as the threaded reader does.
            if let Some(inc) = self.payload.take() {
                let p = Pending::new(self.outbox.clone(), &inc.req, inc.bytes, Form::Simple);
                p.reply(nbd::EIO, Payload::Spare(inc.buf));
                self.take_replies(io);
                self.send();
            }
        }
        if stop == Stop::Empty {
            self.watch(io, 0, libc::POLLIN as u32);
        }
        // Every reply out and nothing more to read: TLS ends as TLS ends,
        // with close_notify after the last reply (once).
        let open = self.reading && !self.broken;
        let answered = self.room.in_flight == 0 && self.aside.is_none() && self.outgoing.is_empty();
        if !self.reading && !self.broken && answered && !self.closed {
            self.closed = true;
            if let Err(e) = self.sock.close_notify_now() {
                self.broke(e);
            }
        }
        // TLS: replies rustls took are settled, but their records (and the
        // close_notify) may still wait for room; the connection lasts until
        // they are out (or cannot go).
        let unsent = !self.broken && self.sock.unsent();
        if unsent || (!self.outgoing.is_empty() && !self.broken) {
            self.watch(io, 1, libc::POLLOUT as u32);
        }
        open || self.room.in_flight > 0 || self.aside.is_some() || unsent
    }
}

/// The shard, as the connection gives it requests.
struct OnShard<'l, 'a>(&'l mut Local<'a>);

impl Giver for OnShard<'_, '_> {
    fn read(&mut self, offset: u64, buf: AlignedBuf, done: ReadDone) {
        self.0.read(offset, buf, done)
    }
    fn write(&mut self, offset: u64, data: AlignedBuf, done: WriteDone) {
        self.0.write(offset, data, done)
    }
    fn write_fua(&mut self, offset: u64, data: AlignedBuf, done: WriteDone) {
        self.0.write_fua(offset, data, done)
    }
    fn flush(&mut self, done: Done) {
        self.0.flush(done)
    }
    fn write_zeroes(&mut self, offset: u64, len: u64, done: Done) {
        self.0.write_zeroes(offset, len, done)
    }
}

impl Connection {
    fn watch(&mut self, io: &mut Local<'_>, i: usize, events: u32) {
        if !self.watching[i] {
            self.watching[i] = true;
            io.watch(
                self.sock.socket().as_raw_fd(),
                events,
                self.token * 2 + i as u64,
            );
        }
    }

    /// Moves the replies completions queued to `outgoing`; FUA zeroings
    /// and trims that completed get one flush for all of them, then their
    /// replies.
    fn take_replies(&mut self, io: &mut Local<'_>) {
        let queued = std::mem::take(&mut *self.outbox.out.lock().unwrap());
        let mut fua = Vec::new();
        for o in queued {
            match o {
                Out::Reply(r) if self.broken => self.settle(r),
                Out::Reply(r) => self.outgoing.push(r),
                Out::FlushThenReply(p, buf) => fua.push((p, buf)),
            }
        }
        if !fua.is_empty() {
            io.flush(replies_after_flush(fua));
        }
    }

    /// A reply is out (or dropped): its room and buffer come back.
    fn settle(&mut self, r: Reply) {
        drop(self.room.settle(r));
    }

    /// Sends what the socket takes now of `outgoing` (TLS: the records
    /// taken before first); the replies sent (taken) whole are settled.
    fn send(&mut self) {
        if self.broken {
            return;
        }
        if let Err(e) = self.sock.flush_now() {
            return self.broke(e);
        }
        while !self.outgoing.is_empty() && !self.broken {
            match with_slices(&self.outgoing, self.sent, |s| self.sock.send_now(s)) {
                Ok(0) => return,
                Ok(n) => {
                    self.sent += n;
                    let mut whole = 0;
                    for r in &self.outgoing {
                        if self.sent < r.wire_len() {
                            break;
                        }
                        self.sent -= r.wire_len();
                        whole += 1;
                    }
                    for r in self.outgoing.drain(..whole).collect::<Vec<_>>() {
                        self.settle(r);
                    }
                }
                Err(e) => self.broke(e),
            }
        }
    }

    /// Replies cannot go: those queued are dropped (settled), and so are
    /// those to come.
    fn broke(&mut self, e: io::Error) {
        tracing::debug!("nbd: replies not sent: {e}");
        self.broken = true;
        self.sent = 0;
        for r in std::mem::take(&mut self.outgoing) {
            self.settle(r);
        }
    }

    /// Takes the requests the socket holds, while the limits let them in
    /// and nothing runs aside, giving each as it is read.
    fn receive(&mut self, io: &mut Local<'_>) -> io::Result<Stop> {
        while self.reading && !self.broken && self.aside.is_none() {
            if let Some(inc) = &mut self.payload {
                let have = (self.tail - self.head).min(inc.buf.len() - inc.filled);
                inc.buf[inc.filled..inc.filled + have]
                    .copy_from_slice(&self.rx[self.head..self.head + have]);
                self.head += have;
                inc.filled += have;
                if inc.filled < inc.buf.len() {
                    // Nothing buffered is left: the rest straight into the
                    // payload. A payload cut short stays for `poll` to
                    // answer.
                    match self.sock.recv_now(&mut inc.buf[inc.filled..])? {
                        Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                        Some(n) => inc.filled += n,
                        None => return Ok(Stop::Empty),
                    }
                    continue;
                }
                let inc = self.payload.take().expect("looked at");
                self.serve(io, inc.req, inc.check, inc.buf, inc.bytes);
                continue;
            }
            // Another request may go in flight (its bytes are weighed once
            // its header is read).
            if !self.room.fits(0) {
                return Ok(Stop::Full);
            }
            if self.tail - self.head < Request::LEN {
                self.rx.copy_within(self.head..self.tail, 0);
                self.tail -= self.head;
                self.head = 0;
                match self.sock.recv_now(&mut self.rx[self.tail..])? {
                    // The end of the stream (mid-header too, as the
                    // threaded reader takes it).
                    Some(0) => {
                        self.reading = false;
                        return Ok(Stop::Held);
                    }
                    Some(n) => self.tail += n,
                    None => return Ok(Stop::Empty),
                }
                continue;
            }
            let head: &[u8; Request::LEN] = self.rx[self.head..self.head + Request::LEN]
                .try_into()
                .expect("LEN bytes");
            let req = Request::decode(head).map_err(|e| protocol_error(format!("{e:?}")))?;
            if req.kind == nbd::CMD_DISC {
                self.reading = false;
                return Ok(Stop::Held);
            }
            let (lenient, read_only, _) = self.rules;
            let (check, bytes) = checked(&req, &self.array, lenient, read_only)?;
            if !self.room.fits(bytes) {
                // Its header is taken again once replies made room.
                return Ok(Stop::Full);
            }
            self.head += Request::LEN;
            let buf = self.room.admit(bytes);
            if req.kind == nbd::CMD_WRITE {
                // Its payload is read even when the write is refused, so
                // the stream stays in step.
                self.payload = Some(Incoming {
                    req,
                    check,
                    buf,
                    filled: 0,
                    bytes,
                });
                continue;
            }
            self.serve(io, req, check, buf, bytes);
        }
        Ok(Stop::Held)
    }

    /// Answers or gives one request read whole, as `transmission.rs`'s
    /// reader does.
    fn serve(
        &mut self,
        io: &mut Local<'_>,
        req: Request,
        check: Check,
        buf: AlignedBuf,
        bytes: usize,
    ) {
        let (_, _, negotiated) = self.rules;
        let form = form_of(negotiated, &self.array, &req, &check);
        // The request's claim to its reply: answered EIO if it is dropped
        // unanswered (a panic aside).
        let route = route(&req, &check, &form);
        let p = Pending::new(self.outbox.clone(), &req, bytes, form);
        match route {
            Route::Now(err) => p.reply(err, Payload::Spare(buf)),
            Route::Wait(w) => {
                let (array, any) = (self.array.clone(), self.any.clone());
                self.aside(io, move || {
                    w.serve(p, &req, buf, (&array, &any, negotiated));
                    Aside::Replied
                });
            }
            Route::Give => {
                let counted = match writes(&req) {
                    true => match self.any.gate.admit() {
                        Some(c) => Some(c),
                        None => {
                            // A read-modify-write holds the gate: wait for it
                            // aside, then give the write.
                            let gate = self.any.gate.clone();
                            return self.aside(io, move || {
                                Aside::Admitted(gate.admit_waiting(), p, req, buf)
                            });
                        }
                    },
                    false => None,
                };
                submit(&mut OnShard(io), p, req, buf, counted);
            }
        }
    }

    /// Runs `f` on the connection's helper thread (started at its first
    /// use); the connection reads no further request until it is done, and
    /// its shard turns when it is.
    fn aside(&mut self, io: &mut Local<'_>, f: impl FnOnce() -> Aside + Send + 'static) {
        let slot: Slot = Arc::new(Mutex::new(None));
        let (back, home): (Slot, Home) = (slot.clone(), io.home());
        let job: Box<dyn FnOnce() + Send> = Box::new(move || {
            // A panic answers nothing here: the claim it held answers EIO
            // as it is dropped.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            *back.lock().unwrap() = Some(r.unwrap_or(Aside::Replied));
            home.call(|| {});
        });
        let helper = self.helper.get_or_insert_with(|| {
            let (jobs, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
            let spawned = std::thread::Builder::new()
                .name("nbd-aside".into())
                .spawn(move || rx.into_iter().for_each(|job| job()));
            let thread = spawned
                .map_err(|e| {
                    tracing::error!("nbd: no thread for a connection's blocking requests: {e}")
                })
                .ok();
            Helper { jobs, thread }
        });
        match helper.jobs.send(job) {
            Ok(()) => self.aside = Some(slot),
            // No helper thread. The work may wait for this shard's own
            // requests, so it never runs here: dropped, its claim answers
            // EIO (and the next such request tries for a thread again).
            Err(mpsc::SendError(job)) => {
                self.helper = None;
                drop(job);
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if self.room.in_flight > 0 {
            tracing::warn!(
                "nbd: a connection ended with {} requests unanswered (the engine stopped, or its poll panicked)",
                self.room.in_flight
            );
        }
        let outcome = std::mem::replace(&mut self.outcome, Ok(()));
        let _ = self.ended.send((outcome, self.helper.take()));
    }
}
