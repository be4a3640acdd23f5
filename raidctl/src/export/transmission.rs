//! An NBD connection's transmission phase on threads of its own, where the
//! engine has no shards or `RAIDCTL_NBD_ON_SHARDS=0` says so (otherwise a
//! connection is served on a shard: `on_shard.rs`). One thread reads requests and
//! hands each to the array's engine (`raid_core::shard::Engine`), which
//! answers through a completion; the connection's writer thread sends the
//! replies in the order they complete, every reply that is ready in one
//! system call. No thread waits for a request: how many are in flight is
//! the client's choice, up to `MAX_IN_FLIGHT`, not a count of threads.
//!
//! Reads from members in memory complete in the reader's own thread (the
//! engine copies them there). Their replies wake no one as they queue: the
//! reader lets them go once before it may wait (for the client or
//! for room), every `BATCH` requests, or once `DEFER_BYTES` are queued,
//! so a socket read's worth of them costs one vectored write, not one per
//! reply. On a plain socket the reader sends them itself where the socket
//! takes them without waiting and they carry little data (`DIRECT_BYTES`),
//! and the writer is not woken at all; what the socket does not take goes
//! to the writer, which sends it first. The reader never waits on the
//! socket's send side: a client that sends before it reads would then
//! hold both ends. Replies completed on other threads wake the writer at
//! once, as they must: the reader may be about to wait for the client,
//! which waits for them.

use super::requests::{
    checked, form_of, replies_after_flush, route, submit, writes, Giver, Out, Outbox, Pending,
    Room, Route, Waiting,
};
use super::structured::Negotiated;
use super::wire::{send, with_slices, Carry, Form, Payload, Reply};
use super::{protocol_error, Conn};
use crate::any_bytes::AnyBytes;
use crate::nbd::{self, Request};
use raid_core::array::Array;
use raid_core::buf::AlignedBuf;
use raid_core::shard::{Batch, Done, Engine, ReadDone, WriteDone};
use std::io::{self, Read};
use std::sync::{Arc, Condvar, Mutex};

/// Requests handed to the engine before the shards owed a wake-up are
/// rung, though more are at hand.
const BATCH: usize = 16;
/// Bytes of replies queued by the reader's thread before it wakes the
/// writer without waiting for the end of its batch: beyond this, sending
/// while the reader copies pays more than the wake-up it saves.
const DEFER_BYTES: usize = 256 << 10;
/// Most bytes of read data in the replies the reader sends itself; more
/// go to the writer, so that their copy into the socket runs beside the
/// reader's next copies (sending 256 KiB batches from the reader cost
/// 128 KiB reads a tenth).
const DIRECT_BYTES: usize = 64 << 10;

std::thread_local! {
    /// The connection whose reader runs on this thread (its `Shared`'s
    /// address), so that a reply queued here knows the reader will let it
    /// go (`Shared::push`); 0 on every other thread.
    static READER_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Who writes to the socket now (`State::sending`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sender {
    Reader,
    Writer,
}

#[derive(Default)]
struct State {
    out: Vec<Out>,
    /// Requests read and not yet answered (or dropped, once `broken`).
    room: Room,
    /// The reader stopped: the writer ends once nothing is in flight.
    reading_done: bool,
    /// Writing to the client failed: replies are dropped, the reader stops.
    broken: bool,
    /// The thread writing to the socket, if one is: the other leaves it
    /// alone, so replies never interleave.
    sending: Option<Sender>,
    /// What the reader's send left unsent, for the writer.
    carry: Option<Carry>,
    /// The writer (the reader) sleeps on `ready` (`room`): a wake-up is a
    /// system call, made only when someone sleeps.
    writer_asleep: bool,
    reader_asleep: bool,
    /// Bytes of read data in the replies in `out`.
    out_bytes: usize,
}

impl State {
    /// Replies sent (or dropped): their room goes back to the reader, their
    /// buffers to the pool. Returns the buffers the pool had no room for,
    /// to be freed once the lock is let go.
    fn settle(&mut self, replies: Vec<Reply>) -> Vec<AlignedBuf> {
        replies
            .into_iter()
            .filter_map(|r| self.room.settle(r))
            .collect()
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

impl Outbox for Shared {
    /// Called by completions: never blocks beyond the lock. One queued by
    /// the reader's own thread wakes no one until `DEFER_BYTES` are
    /// queued: the reader lets it go (`let_replies_go`).
    fn push(&self, o: Out) {
        let on_reader = READER_OF.with(|r| r.get()) == self as *const Shared as usize;
        let mut s = self.state.lock().unwrap();
        if let Out::Reply(r) = &o {
            s.out_bytes += r.data().map_or(0, <[u8]>::len);
        }
        s.out.push(o);
        // While the reader sends, the writer could not send this yet: the
        // reader wakes it when done (`let_replies_go`).
        let reader_sends = s.sending == Some(Sender::Reader);
        if s.writer_asleep && !reader_sends && (!on_reader || s.out_bytes >= DEFER_BYTES) {
            s.writer_asleep = false;
            drop(s);
            self.ready.notify_one();
        }
    }
}

impl Shared {
    /// Called by the reader before it may wait for the client, and every
    /// `BATCH` requests: sends the replies queued so far itself where `c`
    /// takes them without waiting, no one else is sending and they carry
    /// at most `DIRECT_BYTES` of data; otherwise (and for what the socket
    /// did not take) wakes the writer.
    fn let_replies_go(&self, c: &dyn Conn) {
        let mut s = self.state.lock().unwrap();
        let direct = c.sends_now()
            && s.sending.is_none()
            && !s.broken
            && s.carry.is_none()
            && !s.out.is_empty()
            && s.out_bytes <= DIRECT_BYTES
            && s.out.iter().all(|o| matches!(o, Out::Reply(_)));
        if !direct {
            return Self::let_go_locked(&mut s, &self.ready);
        }
        let replies: Vec<Reply> = std::mem::take(&mut s.out)
            .into_iter()
            .map(|o| match o {
                Out::Reply(r) => r,
                Out::FlushThenReply(..) => unreachable!("looked at"),
            })
            .collect();
        s.out_bytes = 0;
        s.sending = Some(Sender::Reader);
        drop(s);
        let total: usize = replies.iter().map(Reply::wire_len).sum();
        let sent = with_slices(&replies, 0, |slices| c.send_now(slices));
        let mut s = self.state.lock().unwrap();
        s.sending = None;
        let unkept = match sent {
            Some(Ok(n)) if n == total => s.settle(replies),
            // The rest (all of it, on an error: the writer meets the error
            // itself and ends the connection as it does for its own).
            Some(Ok(n)) => {
                s.carry = Some(Carry { replies, sent: n });
                Vec::new()
            }
            Some(Err(_)) | None => {
                s.carry = Some(Carry { replies, sent: 0 });
                Vec::new()
            }
        };
        Self::let_go_locked(&mut s, &self.ready);
        drop(s);
        drop(unkept);
    }

    /// Wakes the writer if it sleeps and has something to send.
    fn let_go_locked(s: &mut State, ready: &Condvar) {
        if s.writer_asleep && (!s.out.is_empty() || s.carry.is_some()) {
            s.writer_asleep = false;
            ready.notify_one();
        }
    }

    fn reply(&self, cookie: u64, form: Form, err: u32, payload: Payload, bytes: usize) {
        self.push(Out::Reply(Reply {
            cookie,
            err,
            payload,
            bytes,
            form,
        }));
    }
}

/// Runs the transmission phase until the client disconnects or the
/// connection fails; every request read is answered (or, once writing to
/// the client failed, completed and dropped) before it returns.
/// `lenient`: the client did not ask for the block size, so requests not
/// aligned to 4 KiB are served (`sub_block`). Every write counts itself
/// in `any`'s gate, the array's, while in flight.
pub(super) fn transmission(
    c: Box<dyn Conn>,
    array: Arc<Array>,
    engine: &Engine,
    (lenient, read_only): (bool, bool),
    negotiated: Negotiated,
    any: &AnyBytes,
) -> io::Result<()> {
    let mut reader = io::BufReader::with_capacity(256 * 1024, c.try_clone_box()?);
    let shared = Arc::new(Shared::default());
    let outcome = std::thread::scope(|sc| {
        let sh = &shared;
        let writer = std::thread::Builder::new()
            .name("nbd-replies".into())
            .spawn_scoped(sc, move || write_replies(c, sh, engine))?;
        let r = {
            // Told to the writer however reading ends, so that it ends too.
            let _done = Farewell {
                shared: sh,
                mark: |s| s.reading_done = true,
                wake: &sh.ready,
            };
            let _reader = ReaderOf::mark(sh);
            let rules = (lenient, read_only, negotiated);
            read_requests(&mut reader, &array, engine, sh, rules, any)
        };
        let _ = writer.join();
        r
    });
    // A client that disconnects without FLUSH still gets its writes made
    // durable, as a clean close would.
    let _ = array.flush();
    outcome
}

/// Tells the connection's other thread that this one ended, however it
/// ended (a panic included): marks the state and wakes that thread.
struct Farewell<'a> {
    shared: &'a Shared,
    mark: fn(&mut State),
    wake: &'a Condvar,
}

/// Marks this thread as `shared`'s reader while it lives (`READER_OF`).
struct ReaderOf;

impl ReaderOf {
    fn mark(shared: &Shared) -> ReaderOf {
        READER_OF.with(|r| r.set(shared as *const Shared as usize));
        ReaderOf
    }
}

impl Drop for ReaderOf {
    fn drop(&mut self) {
        READER_OF.with(|r| r.set(0));
    }
}

impl Drop for Farewell<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shared.state.lock() {
            (self.mark)(&mut s);
        }
        self.wake.notify_all();
    }
}

/// The reader: requests, one after another, each handed on as read.
/// Requests that one read of the socket brought are handed on in one
/// `Batch`: a sleeping shard is woken once for them, before the reader
/// waits for anything (the client, or room under the limits).
fn read_requests(
    r: &mut io::BufReader<Box<dyn Conn>>,
    array: &Arc<Array>,
    engine: &Engine,
    shared: &Arc<Shared>,
    (lenient, read_only, negotiated): (bool, bool, Negotiated),
    any: &AnyBytes,
) -> io::Result<()> {
    let gate = &any.gate;
    let mut batch = engine.batch();
    let mut in_batch = 0;
    loop {
        // Before the reader may wait for the client, and every few
        // requests: a shard owed a wake-up holds other connections'
        // requests too.
        if r.buffer().len() < Request::LEN || in_batch == BATCH {
            batch = ring(batch, engine);
            in_batch = 0;
            shared.let_replies_go(&**r.get_ref());
        }
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
        let (check, bytes) = checked(&req, array, lenient, read_only)?;
        let buf = {
            let mut s = shared.state.lock().unwrap();
            while !s.broken && !s.room.fits(bytes) {
                if !batch.is_empty() {
                    // The room comes from these requests' completions.
                    drop(s);
                    batch = ring(batch, engine);
                    in_batch = 0;
                    s = shared.state.lock().unwrap();
                    continue;
                }
                Shared::let_go_locked(&mut s, &shared.ready);
                s.reader_asleep = true;
                s = shared.room.wait(s).unwrap();
            }
            if s.broken {
                return Ok(());
            }
            s.room.admit(bytes)
        };
        // A write's payload is read even when the write is refused, so the
        // stream stays in step. The request counts as in flight already: an
        // error here leaves it to be dropped with the connection.
        let mut buf = buf;
        if req.kind == nbd::CMD_WRITE {
            if r.buffer().len() < buf.len() {
                batch = ring(batch, engine);
                in_batch = 0;
                shared.let_replies_go(&**r.get_ref());
            }
            if let Err(e) = r.read_exact(&mut buf) {
                shared.reply(req.cookie, Form::Simple, nbd::EIO, Payload::None, bytes);
                return Err(e);
            }
        }
        let form = form_of(negotiated, array, &req, &check);
        let route = route(&req, &check, &form);
        let p = Pending::new(shared.clone(), &req, bytes, form);
        match route {
            Route::Now(err) => p.reply(err, Payload::Spare(buf)),
            Route::Wait(w) => {
                // Served here, after the requests read before it are on
                // their way; a request not aligned to the block, alone
                // among the export's writes, after this connection's own
                // replies too.
                batch = ring(batch, engine);
                in_batch = 0;
                if w == Waiting::SubBlock {
                    shared.let_replies_go(&**r.get_ref());
                }
                w.serve(p, &req, buf, (array, any, negotiated));
            }
            Route::Give => {
                let counted = match writes(&req) {
                    true => {
                        Some(match gate.admit() {
                            Some(c) => c,
                            None => {
                                // A read-modify-write waits for this
                                // connection's writes in flight too.
                                batch = ring(batch, engine);
                                in_batch = 0;
                                shared.let_replies_go(&**r.get_ref());
                                gate.admit_waiting()
                            }
                        })
                    }
                    false => None,
                };
                let mut to = FromThread {
                    engine,
                    batch: &mut batch,
                };
                submit(&mut to, p, req, buf, counted);
                in_batch += 1;
            }
        }
    }
}

/// Wakes the shards `batch` owes a wake-up; a fresh batch.
fn ring<'e>(batch: Batch<'e>, engine: &'e Engine) -> Batch<'e> {
    drop(batch);
    engine.batch()
}

/// The engine, given requests from the reader's thread.
struct FromThread<'a, 'e> {
    engine: &'e Engine,
    batch: &'a mut Batch<'e>,
}

impl Giver for FromThread<'_, '_> {
    fn read(&mut self, offset: u64, buf: AlignedBuf, done: ReadDone) {
        self.batch.read(offset, buf, done)
    }
    fn write(&mut self, offset: u64, data: AlignedBuf, done: WriteDone) {
        self.batch.write(offset, data, done)
    }
    fn write_fua(&mut self, offset: u64, data: AlignedBuf, done: WriteDone) {
        self.batch.write_fua(offset, data, done)
    }
    fn flush(&mut self, done: Done) {
        self.engine.flush(done)
    }
    fn write_zeroes(&mut self, offset: u64, len: u64, done: Done) {
        self.engine.write_zeroes(offset, len, done)
    }
}

/// The writer: takes every reply ready, sends them in one vectored write
/// (a simple reply's header, then a read's data), and gives their room
/// back to the reader. The flush after FUA zeroings and trims is started
/// here, one for all that completed before it, not in their completions,
/// so that no engine thread starts a flush for each (a FUA write is made
/// durable by the engine itself: `Engine::write_fua`).
fn write_replies(mut c: Box<dyn Conn>, shared: &Arc<Shared>, engine: &Engine) {
    // However this ends (a panic included), the reader stops taking
    // requests that no one would answer.
    let _gone = Farewell {
        shared,
        mark: |s| s.broken = true,
        wake: &shared.room,
    };
    loop {
        let (carry, batch) = {
            let mut s = shared.state.lock().unwrap();
            // The reader may be sending: its replies hold `in_flight` up.
            while (s.sending.is_some() || (s.out.is_empty() && s.carry.is_none()))
                && !(s.reading_done && s.room.in_flight == 0)
            {
                s.writer_asleep = true;
                s = shared.ready.wait(s).unwrap();
            }
            if s.out.is_empty() && s.carry.is_none() {
                // Every reply is out: TLS ends as TLS ends.
                if !s.broken {
                    drop(s);
                    if let Err(e) = c.close_notify() {
                        tracing::debug!("nbd: close_notify not sent: {e}");
                    }
                }
                return;
            }
            s.out_bytes = 0;
            s.sending = Some(Sender::Writer);
            (s.carry.take(), std::mem::take(&mut s.out))
        };
        // What the reader's send left goes first, from where it stopped.
        let (mut replies, skip) = match carry {
            Some(c) => (c.replies, c.sent),
            None => (Vec::new(), 0),
        };
        let mut fua = Vec::new();
        for o in batch {
            match o {
                Out::Reply(r) => replies.push(r),
                Out::FlushThenReply(p, buf) => fua.push((p, buf)),
            }
        }
        if !fua.is_empty() {
            // Their writes all completed before this flush starts.
            engine.flush(replies_after_flush(fua));
        }
        if replies.is_empty() {
            shared.state.lock().unwrap().sending = None;
            continue;
        }
        let broken = shared.state.lock().unwrap().broken;
        if !broken {
            if let Err(e) = send(&mut *c, &replies, skip) {
                tracing::debug!("nbd: replies not sent: {e}");
                shared.state.lock().unwrap().broken = true;
                // Wake the reader out of its read of the socket.
                c.shutdown_read();
            }
        }
        let mut s = shared.state.lock().unwrap();
        s.sending = None;
        let wake = std::mem::take(&mut s.reader_asleep);
        let unkept = s.settle(replies);
        drop(s);
        drop(unkept);
        if wake {
            shared.room.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reader's own send on a socket with little room and a client not
    /// reading: what the socket did not take is left to the writer (the
    /// replies still in flight, no one sending), and the writer's send of
    /// it completes the stream byte for byte.
    #[test]
    fn a_reader_send_cut_short_is_finished_by_the_writer() {
        use crate::remote::tls::Sock;
        use std::io::Read;
        let (a, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let small: libc::c_int = 4096;
        // SAFETY: sets an int option on a live socket from a live int.
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&a),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&small as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
        let conn = Sock::Unix(a);
        let shared = Shared::default();
        for cookie in 0..6u64 {
            let mut d = AlignedBuf::new(8192);
            d.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (i as u64 ^ cookie) as u8);
            shared.state.lock().unwrap().room.in_flight += 1;
            shared.reply(cookie, Form::Simple, 0, Payload::Data(d), 0);
        }
        shared.let_replies_go(&conn);
        let carry = {
            let mut s = shared.state.lock().unwrap();
            assert_eq!(s.sending, None);
            assert!(s.out.is_empty());
            assert_eq!(s.room.in_flight, 6, "nothing settled before it is all sent");
            s.carry.take().expect("the socket could not take it all")
        };
        let total: usize = carry.replies.iter().map(Reply::wire_len).sum();
        assert!(carry.sent < total, "{} of {total}", carry.sent);
        let reading = std::thread::spawn(move || {
            let mut got = Vec::new();
            peer.read_to_end(&mut got).unwrap();
            got
        });
        let mut writer = conn.try_clone().unwrap();
        send(&mut writer, &carry.replies, carry.sent).unwrap();
        drop((writer, conn));
        let whole: Vec<u8> = with_slices(&carry.replies, 0, |s| {
            s.iter().flat_map(|x| x.to_vec()).collect()
        });
        assert!(reading.join().unwrap() == whole);
    }
}
