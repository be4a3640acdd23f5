//! An NBD connection's transmission phase. One thread reads requests and
//! hands each to the array's engine (`raid_core::shard::Engine`), which
//! answers through a completion; the connection's writer thread sends the
//! replies in the order they complete, every reply that is ready in one
//! system call. No thread waits for a request: how many are in flight is
//! the client's choice, up to `MAX_IN_FLIGHT`, not a count of threads.

use super::{protocol_error, tflags, Conn};
use crate::nbd::{self, Check, Request};
use raid_core::array::{Array, ArrayError, BLOCK};
use raid_core::buf::AlignedBuf;
use raid_core::shard::Engine;
use std::collections::HashMap;
use std::io::{self, IoSlice, Read};
use std::sync::{Arc, Condvar, Mutex};

/// Requests in flight per connection before the reader waits for replies
/// to go out (Linux's NBD client sends up to 128 per connection).
const MAX_IN_FLIGHT: usize = 256;
/// Payload bytes in flight per connection before the reader waits; a
/// request alone is let through whatever its size (up to 32 MiB).
const MAX_IN_FLIGHT_BYTES: usize = 64 << 20;
/// Bytes of buffers a connection keeps for its next requests: one of
/// 128 KiB or more is otherwise a fresh mapping of memory each time.
const POOL_BYTES: usize = 16 << 20;

/// A reply's buffer.
enum Payload {
    None,
    /// A read's data, sent after the header.
    Data(AlignedBuf),
    /// A write's buffer, kept for the next requests.
    Spare(AlignedBuf),
}

/// What the writer thread is given.
enum Out {
    /// A simple reply; `bytes` is what its request counted in flight.
    Reply {
        cookie: u64,
        err: u32,
        payload: Payload,
        bytes: usize,
    },
    /// A write with the FUA flag that completed: flush, then reply.
    FlushThenReply {
        cookie: u64,
        buf: Option<AlignedBuf>,
        bytes: usize,
    },
}

#[derive(Default)]
struct State {
    out: Vec<Out>,
    /// Requests read and not yet answered (or dropped, once `broken`).
    in_flight: usize,
    bytes: usize,
    /// The reader stopped: the writer ends once nothing is in flight.
    reading_done: bool,
    /// Writing to the client failed: replies are dropped, the reader stops.
    broken: bool,
    /// The writer (the reader) sleeps on `ready` (`room`): a wake-up is a
    /// system call, made only when someone sleeps.
    writer_asleep: bool,
    reader_asleep: bool,
    pool: HashMap<usize, Vec<AlignedBuf>>,
    pool_bytes: usize,
}

impl State {
    fn take_buf(&mut self, len: usize) -> AlignedBuf {
        match self.pool.get_mut(&len).and_then(|v| v.pop()) {
            Some(b) => {
                self.pool_bytes -= len;
                b
            }
            None => AlignedBuf::new(len),
        }
    }

    fn keep_buf(&mut self, b: AlignedBuf) {
        if !b.is_empty() && self.pool_bytes + b.len() <= POOL_BYTES {
            self.pool_bytes += b.len();
            self.pool.entry(b.len()).or_default().push(b);
        }
    }
}

/// The connection's state, shared by its reader, its writer and the
/// completions of its requests (on the engine's threads).
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// The writer waits here for replies (or for the end).
    ready: Condvar,
    /// The reader waits here for room under the in-flight limits.
    room: Condvar,
}

impl Shared {
    /// Called by completions: never blocks beyond the lock.
    fn push(&self, o: Out) {
        let mut s = self.state.lock().unwrap();
        s.out.push(o);
        if s.writer_asleep {
            s.writer_asleep = false;
            drop(s);
            self.ready.notify_one();
        }
    }

    fn reply(&self, cookie: u64, err: u32, payload: Payload, bytes: usize) {
        self.push(Out::Reply {
            cookie,
            err,
            payload,
            bytes,
        });
    }
}

/// Runs the transmission phase until the client disconnects or the
/// connection fails; every request read is answered (or, once writing to
/// the client failed, completed and dropped) before it returns.
pub(super) fn transmission(c: Box<dyn Conn>, array: Arc<Array>, engine: &Engine) -> io::Result<()> {
    let mut reader = io::BufReader::with_capacity(256 * 1024, c.try_clone_box()?);
    let shared = Arc::new(Shared::default());
    let outcome = std::thread::scope(|sc| {
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("nbd-replies".into())
                .spawn_scoped(sc, move || write_replies(c, &shared, engine))?
        };
        let r = read_requests(&mut reader, &array, engine, &shared);
        shared.state.lock().unwrap().reading_done = true;
        shared.ready.notify_all();
        let _ = writer.join();
        r
    });
    // A client that disconnects without FLUSH still gets its writes made
    // durable, as a clean close would.
    let _ = array.flush();
    outcome
}

/// The reader: requests, one after another, each handed on as read.
fn read_requests(
    r: &mut impl Read,
    array: &Arc<Array>,
    engine: &Engine,
    shared: &Arc<Shared>,
) -> io::Result<()> {
    loop {
        let mut h = [0u8; Request::LEN];
        match r.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let req = Request::decode(&h).map_err(|e| protocol_error(format!("{e:?}")))?;
        if req.kind == nbd::CMD_DISC {
            return Ok(());
        }
        let read_only = tflags(array) & nbd::TFLAG_READ_ONLY != 0;
        let check = nbd::check(&req, array.capacity(), BLOCK, read_only);
        if let Check::Disconnect(why) = check {
            return Err(protocol_error(why));
        }
        // A write's payload (refused or not) and an accepted read's data:
        // both bounded by `check` (32 MiB).
        let bytes = match (req.kind, &check) {
            (nbd::CMD_WRITE, _) | (nbd::CMD_READ, Check::Ok) => req.length as usize,
            _ => 0,
        };
        let buf = {
            let mut s = shared.state.lock().unwrap();
            while !s.broken
                && s.in_flight > 0
                && (s.in_flight >= MAX_IN_FLIGHT || s.bytes + bytes > MAX_IN_FLIGHT_BYTES)
            {
                s.reader_asleep = true;
                s = shared.room.wait(s).unwrap();
            }
            if s.broken {
                return Ok(());
            }
            s.in_flight += 1;
            s.bytes += bytes;
            s.take_buf(bytes)
        };
        // A write's payload is read even when the write is refused, so the
        // stream stays in step. The request counts as in flight already: an
        // error here leaves it to be dropped with the connection.
        let mut buf = buf;
        if req.kind == nbd::CMD_WRITE {
            if let Err(e) = r.read_exact(&mut buf) {
                shared.reply(req.cookie, nbd::EIO, Payload::None, bytes);
                return Err(e);
            }
        }
        match check {
            Check::Ok => submit(engine, shared, req, buf, bytes),
            Check::Error(errno) => shared.reply(req.cookie, errno, Payload::Spare(buf), bytes),
            Check::Disconnect(_) => unreachable!("returned above"),
        }
    }
}

/// Hands one checked request to the engine; its completion queues the
/// reply.
fn submit(engine: &Engine, shared: &Arc<Shared>, req: Request, buf: AlignedBuf, bytes: usize) {
    let cookie = req.cookie;
    let fua = req.flags & nbd::CMD_FLAG_FUA != 0;
    let sh = shared.clone();
    let fail = move |e: ArrayError| {
        tracing::warn!(
            "nbd command {} at {}+{}: {e}",
            req.kind,
            req.offset,
            req.length
        );
        errno_of(&e)
    };
    match req.kind {
        nbd::CMD_READ => engine.read(
            req.offset,
            buf,
            Box::new(move |r| match r {
                Ok(data) => sh.reply(cookie, 0, Payload::Data(data), bytes),
                Err(e) => sh.reply(cookie, fail(e), Payload::None, bytes),
            }),
        ),
        nbd::CMD_WRITE => engine.write(
            req.offset,
            buf,
            Box::new(move |r| match r {
                Ok(b) if fua => sh.push(Out::FlushThenReply {
                    cookie,
                    buf: Some(b),
                    bytes,
                }),
                Ok(b) => sh.reply(cookie, 0, Payload::Spare(b), bytes),
                Err(e) => sh.reply(cookie, fail(e), Payload::None, bytes),
            }),
        ),
        nbd::CMD_FLUSH => engine.flush(Box::new(move |r| {
            sh.reply(cookie, r.map_or_else(fail, |()| 0), Payload::None, bytes)
        })),
        nbd::CMD_TRIM | nbd::CMD_WRITE_ZEROES => engine.write_zeroes(
            req.offset,
            req.length as u64,
            Box::new(move |r| match r {
                Ok(()) if fua => sh.push(Out::FlushThenReply {
                    cookie,
                    buf: None,
                    bytes,
                }),
                r => sh.reply(cookie, r.map_or_else(fail, |()| 0), Payload::None, bytes),
            }),
        ),
        _ => sh.reply(cookie, nbd::ENOTSUP, Payload::None, bytes),
    }
}

fn errno_of(e: &ArrayError) -> u32 {
    match e {
        ArrayError::Unaligned { .. } => nbd::EINVAL,
        ArrayError::OutOfRange { .. } => nbd::EINVAL,
        ArrayError::NoSpace { .. } => nbd::ENOSPC,
        _ => nbd::EIO,
    }
}

/// The writer: takes every reply ready, sends them in one vectored write
/// (a simple reply's header, then a read's data), and gives their room
/// back to the reader. A FUA write's flush is started here, not in its
/// completion, so that no engine thread ever starts work on the engine.
fn write_replies(mut c: Box<dyn Conn>, shared: &Arc<Shared>, engine: &Engine) {
    loop {
        let batch = {
            let mut s = shared.state.lock().unwrap();
            while s.out.is_empty() && !(s.reading_done && s.in_flight == 0) {
                s.writer_asleep = true;
                s = shared.ready.wait(s).unwrap();
            }
            if s.out.is_empty() {
                return;
            }
            std::mem::take(&mut s.out)
        };
        let mut replies = Vec::with_capacity(batch.len());
        for o in batch {
            match o {
                Out::Reply { .. } => replies.push(o),
                Out::FlushThenReply { cookie, buf, bytes } => {
                    let sh = shared.clone();
                    engine.flush(Box::new(move |r| {
                        let err = match r {
                            Ok(()) => 0,
                            Err(e) => {
                                tracing::warn!("nbd: flush after a FUA write: {e}");
                                errno_of(&e)
                            }
                        };
                        let payload = buf.map_or(Payload::None, Payload::Spare);
                        sh.reply(cookie, err, payload, bytes)
                    }));
                }
            }
        }
        if replies.is_empty() {
            continue;
        }
        let broken = shared.state.lock().unwrap().broken;
        if !broken {
            if let Err(e) = send(&mut *c, &replies) {
                tracing::debug!("nbd: replies not sent: {e}");
                shared.state.lock().unwrap().broken = true;
                // Wake the reader out of its read of the socket.
                c.shutdown_read();
            }
        }
        let mut s = shared.state.lock().unwrap();
        let wake = std::mem::take(&mut s.reader_asleep);
        for o in replies {
            if let Out::Reply { payload, bytes, .. } = o {
                s.in_flight -= 1;
                s.bytes -= bytes;
                if let Payload::Data(b) | Payload::Spare(b) = payload {
                    s.keep_buf(b);
                }
            }
        }
        drop(s);
        if wake {
            shared.room.notify_one();
        }
    }
}

/// Writes simple replies: each header, and a successful read's data after
/// it, in as few system calls as the socket takes.
fn send(c: &mut dyn Conn, replies: &[Out]) -> io::Result<()> {
    let mut heads = Vec::with_capacity(replies.len());
    for o in replies {
        if let Out::Reply { cookie, err, .. } = o {
            let mut h = [0u8; 16];
            h[0..4].copy_from_slice(&nbd::SIMPLE_REPLY_MAGIC.to_be_bytes());
            h[4..8].copy_from_slice(&err.to_be_bytes());
            h[8..16].copy_from_slice(&cookie.to_be_bytes());
            heads.push(h);
        }
    }
    let mut slices = Vec::with_capacity(2 * replies.len());
    for (o, h) in replies.iter().zip(&heads) {
        slices.push(IoSlice::new(h));
        if let Out::Reply {
            err: 0,
            payload: Payload::Data(d),
            ..
        } = o
        {
            slices.push(IoSlice::new(d));
        }
    }
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = c.write_vectored(rest)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    c.flush()
}
