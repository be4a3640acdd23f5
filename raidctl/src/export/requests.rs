//! What an NBD connection gives the array's engine, whichever thread
//! serves it (`transmission.rs`'s reader, or its shard: `on_shard.rs`):
//! each request's claim to its one reply (`Pending`), where the replies
//! queue (`Outbox`), what takes the requests (`Giver`), how a checked
//! request is handed on (`submit`), and the limits and buffers both share.

use super::structured::{block_status, Negotiated};
use super::sub_block;
use super::wire::{Form, Payload, Reply};
use super::{errno_of, protocol_error};
use crate::any_bytes::{AnyBytes, Counted};
use crate::nbd::{self, Check, Request};
use raid_core::array::{Array, ArrayError, BLOCK};
use raid_core::buf::AlignedBuf;
use raid_core::shard::{Done, ReadDone, WriteDone};
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

/// Requests in flight per connection before the reader waits for replies
/// to go out (Linux's NBD client sends up to 128 per connection).
pub(super) const MAX_IN_FLIGHT: usize = 256;
/// Payload bytes in flight per connection before the reader waits; a
/// request alone is let through whatever its size (up to 32 MiB).
pub(super) const MAX_IN_FLIGHT_BYTES: usize = 64 << 20;
/// Bytes of buffers a connection keeps for its next requests: one of
/// 128 KiB or more is otherwise a fresh mapping of memory each time.
const POOL_BYTES: usize = 16 << 20;
/// What a connection's sender is given (the writer thread here, the
/// connection's own poll on a shard: `on_shard.rs`).
pub(super) enum Out {
    Reply(Reply),
    /// A zeroing or trim with the FUA flag that completed: flush, then
    /// reply (a write with it is made durable by the engine:
    /// `Engine::write_fua`).
    FlushThenReply(Pending, Option<AlignedBuf>),
}

/// A request's claim to its one reply. A completion that is dropped
/// without being called (a panic in the array's code on the engine's
/// side) still answers, with EIO: the connection's count of requests in
/// flight must drain, or the connection (and `Export::stop`) would wait
/// for it for ever.
pub(super) struct Pending {
    outbox: Arc<dyn Outbox>,
    cookie: u64,
    bytes: usize,
    form: Form,
    answered: bool,
}

/// Where a connection's replies queue, from the completions of its
/// requests, on whichever thread they run.
pub(super) trait Outbox: Send + Sync {
    fn push(&self, o: Out);
}

impl Pending {
    pub(super) fn new(outbox: Arc<dyn Outbox>, req: &Request, bytes: usize, form: Form) -> Pending {
        Pending {
            outbox,
            cookie: req.cookie,
            bytes,
            form,
            answered: false,
        }
    }

    pub(super) fn reply(mut self, err: u32, payload: Payload) {
        self.answered = true;
        self.send_reply(err, payload);
    }

    /// `reply`, in `form` (a block status's, known once it is worked out).
    pub(super) fn reply_as(mut self, form: Form, err: u32, payload: Payload) {
        self.form = form;
        self.reply(err, payload)
    }

    fn send_reply(&mut self, err: u32, payload: Payload) {
        let form = std::mem::replace(&mut self.form, Form::Simple);
        self.outbox.push(Out::Reply(Reply {
            cookie: self.cookie,
            err,
            payload,
            bytes: self.bytes,
            form,
        }));
    }

    /// Hands the claim to the sender, which flushes, then replies.
    fn flush_then_reply(self, buf: Option<AlignedBuf>) {
        let outbox = self.outbox.clone();
        outbox.push(Out::FlushThenReply(self, buf));
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            tracing::error!(
                "nbd: request {:#x} ended unanswered; answered EIO",
                self.cookie
            );
            self.send_reply(nbd::EIO, Payload::None);
        }
    }
}

/// A request's header checked, as both readers check it: what to answer
/// it (`Check`), and the payload bytes it counts in flight (a write's
/// payload, refused or not; an accepted read's data: both bounded by the
/// check, 32 MiB). An error where the client must be disconnected.
/// `lenient`: the client did not ask for the block size, so requests not
/// aligned to 4 KiB are served (`sub_block`).
pub(super) fn checked(
    req: &Request,
    array: &Array,
    lenient: bool,
    read_only: bool,
) -> io::Result<(Check, usize)> {
    // A trim may be cut to the whole blocks inside it whoever sends it
    // (qemu passes a guest's 512-byte discards on as they are).
    let block = if lenient || req.kind == nbd::CMD_TRIM {
        1
    } else {
        BLOCK
    };
    let check = nbd::check(req, array.capacity(), block, read_only);
    if let Check::Disconnect(why) = check {
        return Err(protocol_error(why));
    }
    let bytes = match (req.kind, &check) {
        (nbd::CMD_WRITE, _) | (nbd::CMD_READ, Check::Ok) => req.length as usize,
        _ => 0,
    };
    Ok((check, bytes))
}

/// How a checked request's reply goes on the wire: a read of holes alone
/// (`hole_read`) as one hole chunk, nothing read; otherwise as negotiated.
pub(super) fn form_of(n: Negotiated, array: &Array, req: &Request, check: &Check) -> Form {
    match check {
        Check::Ok => n.hole_read(array, req),
        _ => None,
    }
    .unwrap_or_else(|| n.form(req))
}

/// Where a checked request goes, the same for both readers.
pub(super) enum Route {
    /// Answered at once with nothing done: an error (its errno), or a
    /// read of holes alone (0; its form says so).
    Now(u32),
    /// Work that waits on more than its own I/O (`Waiting`), run where
    /// the reader may wait.
    Wait(Waiting),
    /// Given to the engine (`submit`), a write counted in the gate first.
    Give,
}

/// Work a reader runs apart from the engine, one request at a time,
/// reading nothing further meanwhile.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Waiting {
    /// A block status: a system call per run of data or hole on each
    /// member.
    BlockStatus,
    /// A request not aligned to the block (`sub_block`): it waits for
    /// every write in flight on the array.
    SubBlock,
}

/// Where `req`, checked (`check`) and to be answered in `form`
/// (`form_of`), goes.
pub(super) fn route(req: &Request, check: &Check, form: &Form) -> Route {
    match check {
        Check::Ok if req.kind == nbd::CMD_BLOCK_STATUS => Route::Wait(Waiting::BlockStatus),
        Check::Ok if matches!(form, Form::Hole { .. }) => Route::Now(0),
        Check::Ok if sub_block::is_sub_block(req) => Route::Wait(Waiting::SubBlock),
        Check::Ok => Route::Give,
        Check::Error(errno) => Route::Now(*errno),
        Check::Disconnect(_) => unreachable!("`checked` returns it as an error"),
    }
}

impl Waiting {
    /// Runs the work and answers `p`.
    pub(super) fn serve(
        self,
        p: Pending,
        req: &Request,
        mut buf: AlignedBuf,
        (array, any, n): (&Array, &AnyBytes, Negotiated),
    ) {
        match self {
            Waiting::BlockStatus => {
                let (err, form) = block_status(array, req, n);
                p.reply_as(form, err, Payload::Spare(buf));
            }
            Waiting::SubBlock => {
                let err = sub_block::serve(any, req, &mut buf);
                let payload = match req.kind {
                    nbd::CMD_READ if err == 0 => Payload::Data(buf),
                    _ => Payload::Spare(buf),
                };
                p.reply(err, payload);
            }
        }
    }
}

/// Whether a request writes, and so counts itself in the array's gate
/// while in flight.
pub(super) fn writes(req: &Request) -> bool {
    matches!(
        req.kind,
        nbd::CMD_WRITE | nbd::CMD_TRIM | nbd::CMD_WRITE_ZEROES
    )
}

/// What a connection has in flight, against the limits, and the buffers
/// it keeps for its next requests.
#[derive(Default)]
pub(super) struct Room {
    /// Requests read and not yet answered (or dropped).
    pub(super) in_flight: usize,
    bytes: usize,
    pool: BufPool,
}

impl Room {
    /// Whether a request of `bytes` may go in flight now: under both
    /// limits, or alone whatever its size.
    pub(super) fn fits(&self, bytes: usize) -> bool {
        self.in_flight == 0
            || (self.in_flight < MAX_IN_FLIGHT && self.bytes + bytes <= MAX_IN_FLIGHT_BYTES)
    }

    /// Counts a request of `bytes` in flight; its buffer.
    pub(super) fn admit(&mut self, bytes: usize) -> AlignedBuf {
        self.in_flight += 1;
        self.bytes += bytes;
        self.pool.take(bytes)
    }

    /// A reply went out (or was dropped): its room and its buffer come
    /// back. Returns a buffer the pool had no room for, for the caller to
    /// free where that costs no one a wait (a large one is an munmap).
    pub(super) fn settle(&mut self, r: Reply) -> Option<AlignedBuf> {
        self.in_flight -= 1;
        self.bytes -= r.bytes;
        match r.payload {
            Payload::Data(b) | Payload::Spare(b) => self.pool.keep(b),
            Payload::None => None,
        }
    }
}

/// Buffers a connection keeps for its next requests, up to `POOL_BYTES`.
#[derive(Default)]
struct BufPool {
    bufs: HashMap<usize, Vec<AlignedBuf>>,
    bytes: usize,
}

impl BufPool {
    fn take(&mut self, len: usize) -> AlignedBuf {
        match self.bufs.get_mut(&len).and_then(|v| v.pop()) {
            Some(b) => {
                self.bytes -= len;
                b
            }
            None => AlignedBuf::new(len),
        }
    }

    /// Keeps `b` for reuse if the pool has room; otherwise hands it back.
    fn keep(&mut self, b: AlignedBuf) -> Option<AlignedBuf> {
        if !b.is_empty() && self.bytes + b.len() <= POOL_BYTES {
            self.bytes += b.len();
            self.bufs.entry(b.len()).or_default().push(b);
            None
        } else {
            Some(b)
        }
    }
}

/// The completion of the one flush that follows FUA writes that completed
/// (all of them before it started): each gets its reply with the flush's
/// outcome.
pub(super) fn replies_after_flush(fua: Vec<(Pending, Option<AlignedBuf>)>) -> Done {
    Box::new(move |r| {
        let err = r.map_or_else(
            |e| {
                tracing::warn!("nbd: flush after FUA writes: {e}");
                errno_of(&e)
            },
            |()| 0,
        );
        for (p, buf) in fua {
            p.reply(err, buf.map_or(Payload::None, Payload::Spare));
        }
    })
}

/// What a connection gives its requests to: the engine from a thread of
/// its own (through a `Batch`), or the shard it runs on (`Local`).
pub(super) trait Giver {
    fn read(&mut self, offset: u64, buf: AlignedBuf, done: ReadDone);
    fn write(&mut self, offset: u64, data: AlignedBuf, done: WriteDone);
    /// A write durable when `done` hears it succeeded
    /// (`Engine::write_fua`).
    fn write_fua(&mut self, offset: u64, data: AlignedBuf, done: WriteDone);
    fn flush(&mut self, done: Done);
    fn write_zeroes(&mut self, offset: u64, len: u64, done: Done);
}

/// Hands one checked request to the engine (`to`); its completion answers
/// its claim `p`.
pub(super) fn submit(
    to: &mut dyn Giver,
    p: Pending,
    req: Request,
    buf: AlignedBuf,
    counted: Option<Counted>,
) {
    let fua = req.flags & nbd::CMD_FLAG_FUA != 0;
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
        nbd::CMD_READ => to.read(
            req.offset,
            buf,
            Box::new(move |r| match r {
                Ok(data) => p.reply(0, Payload::Data(data)),
                Err(e) => p.reply(fail(e), Payload::None),
            }),
        ),
        nbd::CMD_WRITE => {
            let done: WriteDone = Box::new(move |r| {
                // Written (or failed): out of the gate.
                drop(counted);
                match r {
                    Ok(b) => p.reply(0, Payload::Spare(b)),
                    Err(e) => p.reply(fail(e), Payload::None),
                }
            });
            // With FUA the engine answers once the write is durable: on
            // the members it wrote, with FUA, where it can, else after a
            // flush of the array.
            match fua {
                true => to.write_fua(req.offset, buf, done),
                false => to.write(req.offset, buf, done),
            }
        }
        nbd::CMD_FLUSH => to.flush(Box::new(move |r| {
            p.reply(r.map_or_else(fail, |()| 0), Payload::None)
        })),
        nbd::CMD_TRIM | nbd::CMD_WRITE_ZEROES => to.write_zeroes(
            req.offset,
            req.length as u64,
            Box::new(move |r| {
                drop(counted);
                match r {
                    Ok(()) if fua => p.flush_then_reply(None),
                    r => p.reply(r.map_or_else(fail, |()| 0), Payload::None),
                }
            }),
        ),
        _ => p.reply(nbd::ENOTSUP, Payload::None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Keeps what it is given (a claim handed on for a flush stays a
    /// claim, unanswered, as the sender holds it).
    #[derive(Default)]
    struct Queue(Mutex<Vec<Out>>);

    impl Outbox for Queue {
        fn push(&self, o: Out) {
            self.0.lock().unwrap().push(o);
        }
    }

    fn queued(q: &Queue) -> Vec<(u64, u32)> {
        let out = q.0.lock().unwrap();
        out.iter()
            .map(|o| match o {
                Out::Reply(r) => (r.cookie, r.err),
                Out::FlushThenReply(p, _) => (p.cookie, u32::MAX),
            })
            .collect()
    }

    fn pending(q: &Arc<Queue>, cookie: u64) -> Pending {
        let req = Request {
            flags: 0,
            kind: nbd::CMD_WRITE,
            cookie,
            offset: 0,
            length: 4096,
        };
        Pending::new(q.clone(), &req, 4096, Form::Simple)
    }

    /// A completion dropped without being called (what a panic in the
    /// array's code does to it) still answers its request, with EIO; one
    /// called answers once.
    #[test]
    fn every_claim_is_answered_once() {
        let q = Arc::new(Queue::default());
        drop(pending(&q, 1));
        pending(&q, 2).reply(0, Payload::None);
        let p = pending(&q, 3);
        let done: Box<dyn FnOnce(u32) + Send> = Box::new(move |e| p.reply(e, Payload::None));
        drop(done);
        pending(&q, 4).flush_then_reply(None);
        assert_eq!(
            queued(&q),
            vec![(1, nbd::EIO), (2, 0), (3, nbd::EIO), (4, u32::MAX)]
        );
    }
}
