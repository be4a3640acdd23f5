//! One NBD connection of a network member: requests sent under a writer
//! lock, a reader thread matching replies to them by cookie, and the counts
//! that decide whether a lost connection's requests may be sent again (see
//! `client`'s doc).

use super::structured::{Partial, NOT_KNOWN};
use super::tls::Stream;
use crate::nbd;
use parking_lot::{Condvar, Mutex};
use std::collections::hash_map::{Entry, HashMap};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy)]
pub(super) enum Kind {
    Read,
    Write {
        fua: bool,
    },
    Zero,
    /// The count of acknowledged writes when the flush was sent: a flush
    /// covers them.
    Flush {
        covers: u64,
    },
    /// Where the holes are (`base:allocation`): answered with the
    /// descriptors as sent.
    BlockStatus,
}

/// One request in flight.
pub(super) struct Slot {
    pub(super) kind: Kind,
    pub(super) offset: u64,
    pub(super) len: usize,
    /// None until the reply came: Ok(data) for a read, Ok(empty) otherwise,
    /// or the server's error, or the connection's loss.
    pub(super) done: Mutex<Option<Result<Vec<u8>, Failure>>>,
    pub(super) cv: Condvar,
}

#[derive(Debug)]
pub(super) enum Failure {
    /// The server answered with this errno.
    Server(u32),
    /// The connection died before the reply.
    Lost,
}

/// One connection to the export.
pub(super) struct Conn {
    pub(super) writer: Mutex<Stream>,
    /// For shutting the socket from any thread (wakes the reader).
    pub(super) closer: Stream,
    pub(super) inflight: Mutex<HashMap<u64, Arc<Slot>>>,
    pub(super) next_cookie: AtomicU64,
    pub(super) dead: AtomicBool,
    /// Writes acknowledged on this connection, and how many of them a
    /// completed flush covers.
    pub(super) acked_writes: AtomicU64,
    pub(super) flushed: AtomicU64,
    /// Writes whose outcome is unknown: in flight when the connection died.
    pub(super) lost_writes: AtomicU64,
    /// The reader has ended (and counted every request it failed).
    pub(super) reader_done: Mutex<bool>,
    pub(super) reader_cv: Condvar,
    /// What the handshake agreed on replies.
    pub(super) replies: Replies,
}

/// What a connection's handshake agreed on replies: structured replies,
/// and the id the server gave the `base:allocation` context, where it
/// took it (only with structured replies).
#[derive(Clone, Copy, Default)]
pub(super) struct Replies {
    pub(super) structured: bool,
    pub(super) allocation: Option<u32>,
}

impl Kind {
    pub(super) fn writes(&self) -> bool {
        matches!(self, Kind::Write { .. } | Kind::Zero)
    }
}

impl Conn {
    pub(super) fn kill(&self) {
        self.dead.store(true, Ordering::Release);
        self.closer.abort();
    }

    /// Acknowledged writes no flush has covered.
    pub(super) fn unflushed(&self) -> u64 {
        self.acked_writes
            .load(Ordering::Acquire)
            .saturating_sub(self.flushed.load(Ordering::Acquire))
    }

    pub(super) fn send(
        &self,
        kind: Kind,
        offset: u64,
        len: usize,
        payload: &[u8],
    ) -> io::Result<Arc<Slot>> {
        if self.dead.load(Ordering::Acquire) {
            return Err(io::ErrorKind::ConnectionAborted.into());
        }
        let (cmd, flags) = match kind {
            Kind::Read => (nbd::CMD_READ, 0),
            Kind::Write { fua } => (nbd::CMD_WRITE, if fua { nbd::CMD_FLAG_FUA } else { 0 }),
            Kind::Zero => (nbd::CMD_WRITE_ZEROES, 0),
            Kind::Flush { .. } => (nbd::CMD_FLUSH, 0),
            // One extent: a server then finds no more than that (nbdkit's
            // file plugin walks the whole range otherwise, most of which
            // the member would not use).
            Kind::BlockStatus => (nbd::CMD_BLOCK_STATUS, nbd::CMD_FLAG_REQ_ONE),
        };
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            kind,
            offset,
            len,
            done: Mutex::new(None),
            cv: Condvar::new(),
        });
        let mut h = [0u8; nbd::Request::LEN];
        h[0..4].copy_from_slice(&nbd::REQUEST_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&flags.to_be_bytes());
        h[6..8].copy_from_slice(&cmd.to_be_bytes());
        h[8..16].copy_from_slice(&cookie.to_be_bytes());
        h[16..24].copy_from_slice(&offset.to_be_bytes());
        h[24..28].copy_from_slice(&(len as u32).to_be_bytes());
        let mut w = self.writer.lock();
        // In the table before it is sent, so the reader finds it.
        self.inflight.lock().insert(cookie, slot.clone());
        let sent = match kind {
            Kind::Write { .. } => super::tls::write_two(&mut *w, &h, payload),
            _ => w.write_all(&h),
        };
        drop(w);
        if let Err(e) = sent {
            // Part of it may have gone out.
            if self.inflight.lock().remove(&cookie).is_some() && kind.writes() {
                self.lost_writes.fetch_add(1, Ordering::AcqRel);
            }
            self.kill();
            return Err(e);
        }
        Ok(slot)
    }

    /// Waits for a reply until `deadline`; past it the connection is taken
    /// for dead (a cut link shows as silence, not as an error).
    pub(super) fn wait(&self, slot: &Slot, deadline: Instant) -> Result<Vec<u8>, Failure> {
        self.wait_quietly(slot, deadline).unwrap_or_else(|| {
            self.kill();
            Err(Failure::Lost)
        })
    }

    /// `wait`, for a request whose answer may be done without: past
    /// `deadline` None, and the connection lives on (the reader settles
    /// the request when its reply comes).
    pub(super) fn wait_quietly(
        &self,
        slot: &Slot,
        deadline: Instant,
    ) -> Option<Result<Vec<u8>, Failure>> {
        let mut d = slot.done.lock();
        loop {
            if let Some(r) = d.take() {
                return Some(r);
            }
            if slot.cv.wait_until(&mut d, deadline).timed_out() && d.is_none() {
                return None;
            }
        }
    }

    /// The reader: replies in, matched to their requests, until the stream
    /// ends; then every request still waiting is told the connection is
    /// lost.
    pub(super) fn read_replies(&self, mut r: io::BufReader<Stream>) {
        // Structured replies being gathered, by cookie (their requests
        // stay in `inflight` until the last chunk).
        let mut partial: HashMap<u64, Partial> = HashMap::new();
        let why = loop {
            let mut h = [0u8; 16];
            if let Err(e) = r.read_exact(&mut h) {
                break e.to_string();
            }
            let magic = u32::from_be_bytes(h[0..4].try_into().unwrap());
            let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
            let (slot, outcome) = match magic {
                nbd::SIMPLE_REPLY_MAGIC if !partial.contains_key(&cookie) => {
                    let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
                    let Some(slot) = self.inflight.lock().remove(&cookie) else {
                        break format!("reply to unknown request {cookie}");
                    };
                    let outcome = match (err, slot.kind) {
                        (0, Kind::Read) => {
                            let mut data = vec![0u8; slot.len];
                            if let Err(e) = r.read_exact(&mut data) {
                                self.inflight.lock().insert(cookie, slot);
                                break e.to_string();
                            }
                            Ok(data)
                        }
                        // Not an answer: counted as not known (a simple
                        // reply carries nothing after its header).
                        (0, Kind::BlockStatus) => Err(NOT_KNOWN),
                        (0, _) => Ok(Vec::new()),
                        (e, _) => Err(e),
                    };
                    (slot, outcome)
                }
                nbd::STRUCTURED_REPLY_MAGIC if self.replies.structured => {
                    let mut l = [0u8; 4];
                    if let Err(e) = r.read_exact(&mut l) {
                        break e.to_string();
                    }
                    let flags = u16::from_be_bytes([h[4], h[5]]);
                    let typ = u16::from_be_bytes([h[6], h[7]]);
                    let len = u32::from_be_bytes(l);
                    // The request is looked up at its reply's first chunk.
                    let p = match partial.entry(cookie) {
                        Entry::Occupied(e) => e.into_mut(),
                        Entry::Vacant(v) => match self.inflight.lock().get(&cookie) {
                            Some(s) => v.insert(Partial::new(s.kind, s.offset, s.len)),
                            None => break format!("reply to unknown request {cookie}"),
                        },
                    };
                    if let Err(why) = p.chunk(&mut r, typ, len, self.replies.allocation) {
                        break why;
                    }
                    if flags & nbd::REPLY_FLAG_DONE == 0 {
                        continue;
                    }
                    let p = partial.remove(&cookie).expect("gathered above");
                    let outcome = match p.finish() {
                        Ok(outcome) => outcome,
                        Err(why) => break why,
                    };
                    match self.inflight.lock().remove(&cookie) {
                        Some(slot) => (slot, outcome),
                        None => break format!("reply to unknown request {cookie}"),
                    }
                }
                nbd::SIMPLE_REPLY_MAGIC => {
                    break format!("a simple reply to request {cookie} among its structured ones")
                }
                _ => break format!("bad reply magic {magic:#x}"),
            };
            let res = match outcome {
                // The server is going away: the request is not done.
                Err(nbd::ESHUTDOWN) => {
                    if slot.kind.writes() {
                        self.lost_writes.fetch_add(1, Ordering::AcqRel);
                    }
                    self.kill();
                    Err(Failure::Lost)
                }
                Err(err) => Err(Failure::Server(err)),
                Ok(data) => {
                    match slot.kind {
                        Kind::Write { fua: false } | Kind::Zero => {
                            self.acked_writes.fetch_add(1, Ordering::AcqRel);
                        }
                        Kind::Flush { covers } => {
                            self.flushed.fetch_max(covers, Ordering::AcqRel);
                        }
                        Kind::Read | Kind::BlockStatus | Kind::Write { fua: true } => {}
                    }
                    Ok(data)
                }
            };
            *slot.done.lock() = Some(res);
            slot.cv.notify_all();
        };
        tracing::debug!("nbd member connection ended: {why}");
        self.dead.store(true, Ordering::Release);
        self.closer.abort();
        let waiting: Vec<Arc<Slot>> = self.inflight.lock().drain().map(|(_, s)| s).collect();
        for s in waiting {
            if s.kind.writes() {
                self.lost_writes.fetch_add(1, Ordering::AcqRel);
            }
            *s.done.lock() = Some(Err(Failure::Lost));
            s.cv.notify_all();
        }
        *self.reader_done.lock() = true;
        self.reader_cv.notify_all();
    }

    /// Waits (bounded) for the reader to end after the connection died, so
    /// that its counts are final. False: it did not end in time.
    pub(super) fn reader_ended(&self) -> bool {
        let end = Instant::now() + Duration::from_secs(5);
        let mut d = self.reader_done.lock();
        while !*d {
            if self.reader_cv.wait_until(&mut d, end).timed_out() {
                return *d;
            }
        }
        true
    }
}

/// The member identity in the array metadata at the start of the export,
/// read on `c`; None when it carries none (or cannot be read in time).
pub(super) fn superblock(c: &Conn, deadline: Instant) -> Option<raid_core::metadata::Superblock> {
    let len = raid_core::metadata::SB_SIZE;
    let slot = c
        .send(Kind::Read, raid_core::metadata::SB_OFFSETS[0], len, &[])
        .ok()?;
    let data = c.wait(&slot, deadline).ok()?;
    raid_core::metadata::Superblock::decode(&data).ok()
}

impl Conn {
    /// A connection over `s`, negotiated (`replies`), with its reader
    /// running.
    pub(super) fn start(s: Stream, replies: Replies) -> io::Result<Arc<Conn>> {
        let (r, closer) = (s.try_clone()?, s.try_clone()?);
        // Negotiated: replies may be far apart now (the reader waits).
        closer.socket().set_read_timeout(None)?;
        let conn = Arc::new(Conn {
            writer: Mutex::new(s),
            closer,
            inflight: Mutex::new(HashMap::new()),
            next_cookie: AtomicU64::new(1),
            dead: AtomicBool::new(false),
            acked_writes: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            lost_writes: AtomicU64::new(0),
            reader_done: Mutex::new(false),
            reader_cv: Condvar::new(),
            replies,
        });
        let c = conn.clone();
        std::thread::Builder::new()
            .name("nbd-member".into())
            .spawn(move || c.read_replies(io::BufReader::with_capacity(256 * 1024, r)))?;
        Ok(conn)
    }
}
