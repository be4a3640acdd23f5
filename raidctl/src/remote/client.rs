//! A member served by an NBD server, on another host or this one (nbdkit,
//! qemu-nbd, another raidctl): the array's I/O to it becomes NBD requests
//! on one connection, many in flight, replies matched by cookie.
//!
//! Connection loss, and what may be retried:
//! - Reads and flushes whose connection dies are sent again on a new
//!   connection.
//! - Writes are not: NBD orders nothing between connections, so a write
//!   the server may still be running on the old one could land after a
//!   newer write sent on the new one. A connection lost with a write in
//!   flight gives the member up (the dead connection is also reset at
//!   once, its send queue purged: `Sock::abort`).
//! - So does one lost with writes the server acknowledged and no flush has
//!   covered yet: they may be gone if the server (or its host) restarted,
//!   and that cannot be seen from here.
//! - A member given up is failed by the array and comes back by re-add,
//!   which resyncs what the write-intent bitmap marked (every region
//!   written since the last flush that reached every member).
//! - On reconnecting, the export must be the same disk: same size and
//!   flags, the same member identity in its array metadata, and that
//!   metadata as new as the last this member wrote (a server restarted on
//!   an older image of the disk carries an older one: it lacks writes).
//! - Reconnecting is retried with backoff; an I/O that cannot be done within
//!   the member timeout (`[remote] timeout_seconds`, default 30) fails, and
//!   the member is given up.
//!
//! A member given up answers every I/O with an error at once, and says so
//! through `Member::unreachable`: the daemon then tries to reach the export
//! again and re-adds it when it answers.

use super::conn::{superblock, Conn, Failure, Kind, Slot};
use super::handshake::{connect, Export, HANDSHAKE};
use super::structured::{self, Extents};
use super::timeout;
use super::tls;
use super::uri::NbdUri;
use crate::nbd;
use parking_lot::Mutex;
use raid_core::member::{DeviceKey, IoOp, Member, MemberIo, Pending};
use raid_core::stats::IoStats;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most bytes one block status request asks about.
const STATUS_SPAN: u64 = 1 << 30;
/// The most block status requests one `data_from` sends before it calls
/// the rest data, and how long it waits for each.
const STATUS_ASKS: usize = 64;
const STATUS_WAIT: Duration = Duration::from_secs(5);

struct Inner {
    text: String,
    uri: NbdUri,
    key: DeviceKey,
    export: Export,
    tls: Option<Arc<rustls::ClientConfig>>,
    conn: Mutex<Option<Arc<Conn>>>,
    /// Held by the one thread reconnecting.
    reconnecting: Mutex<()>,
    /// Given up: every I/O fails (see the module's doc).
    lost: AtomicBool,
    /// Why it was given up, said by every I/O that fails for it.
    lost_why: Mutex<Option<String>>,
    /// The server answered a request with an error.
    errored: AtomicBool,
    /// The array metadata the export must carry: found at open, then
    /// written through this member (see `SbWritten`).
    written: Mutex<SbWritten>,
    stats: IoStats,
}

/// The array metadata on the export's first copy, as this member knows
/// it. A reconnection finds the member identity `uuid` there, and the
/// event counter `acked`, or `pending` if that write reached the server
/// before the connection went (one that was in flight, or acknowledged and
/// not flushed, gives the member up anyway); any other is another disk, or
/// another copy of it.
#[derive(Clone, Copy, Default)]
struct SbWritten {
    uuid: Option<raid_core::metadata::Uuid>,
    acked: Option<u64>,
    pending: Option<u64>,
}

/// A member reached over NBD.
pub struct NbdMember(Arc<Inner>);

impl NbdMember {
    /// Connects to the export `text` names and negotiates it. Refused: a
    /// read-only export, or one that does not take flushes (writes could
    /// not be made durable).
    pub fn open(text: &str) -> io::Result<NbdMember> {
        Self::open_within(text, HANDSHAKE.min(timeout()))
    }

    /// `open`, giving up on the connection after `within`.
    pub fn open_within(text: &str, within: Duration) -> io::Result<NbdMember> {
        let uri =
            NbdUri::parse(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let tls = match &uri.tls {
            Some(t) => Some(tls::client_config(t.certificates.as_ref())?),
            None => None,
        };
        let (conn, export) = connect(&uri, tls.as_ref(), within)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", uri.place())))?;
        if export.flags & nbd::TFLAG_READ_ONLY != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{text}: the export is read-only"),
            ));
        }
        if export.flags & nbd::TFLAG_SEND_FLUSH == 0 {
            conn.kill();
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{text}: the export takes no flush, so no write to it could be made durable: serve it with flush (nbdkit and qemu-nbd do by default)"),
            ));
        }
        let sb = superblock(&conn, Instant::now() + HANDSHAKE);
        Ok(NbdMember(Arc::new(Inner {
            text: text.to_string(),
            key: key(&uri),
            uri,
            export,
            tls,
            conn: Mutex::new(Some(conn)),
            reconnecting: Mutex::new(()),
            lost: AtomicBool::new(false),
            lost_why: Mutex::new(None),
            errored: AtomicBool::new(false),
            written: Mutex::new(SbWritten {
                uuid: sb.as_ref().map(|s| s.member_uuid),
                acked: sb.map(|s| s.events),
                pending: None,
            }),
            stats: Default::default(),
        })))
    }
}

/// The device key of an export: where it is served and its name.
pub fn key(uri: &NbdUri) -> DeviceKey {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&uri.addr, &uri.export).hash(&mut h);
    DeviceKey::Network(h.finish())
}

impl Inner {
    /// The server's own error: the member is then not "unreachable" (the
    /// daemon does not bring back a member that reported errors).
    fn server_error(&self, errno: u32) -> io::Error {
        self.errored.store(true, Ordering::Release);
        io::Error::from_raw_os_error(errno as i32)
    }

    fn gone(&self) -> io::Error {
        let why = self.lost_why.lock().clone().unwrap_or_else(|| {
            "unreachable, or its connection was lost with writes not yet flushed".into()
        });
        io::Error::new(
            io::ErrorKind::NotConnected,
            format!("{} was given up: {why}", self.text),
        )
    }

    fn give_up(&self, why: &str) -> io::Error {
        {
            let mut w = self.lost_why.lock();
            if w.is_none() {
                *w = Some(why.to_string());
            }
        }
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::error!(member = %self.text, "network member given up: {why}");
            if let Some(c) = self.conn.lock().take() {
                c.kill();
            }
        }
        self.gone()
    }

    /// A write in pieces the server takes (`pieces`), each with FUA or
    /// none.
    fn write_pieces(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        for (s, n) in self.pieces(buf.len()) {
            self.run(
                Kind::Write { fua },
                offset + s as u64,
                n,
                &buf[s..s + n],
                None,
                Instant::now(),
            )?;
        }
        Ok(())
    }

    /// Notes array metadata written over the first metadata copy, for
    /// `same_disk`: as it is sent (`acked` false), and once the server
    /// acknowledged it, when it also becomes the member identity expected
    /// there (a replace or spare activation writes a new one).
    fn note_write(&self, offset: u64, payload: &[u8], acked: bool) {
        use raid_core::metadata::{Superblock, SB_OFFSETS, SB_SIZE};
        if offset != SB_OFFSETS[0] || payload.len() < SB_SIZE {
            return;
        }
        let Ok(sb) = Superblock::decode(&payload[..SB_SIZE]) else {
            return;
        };
        let mut w = self.written.lock();
        if acked {
            w.acked = Some(sb.events);
            if w.pending == Some(sb.events) {
                w.pending = None;
            }
            w.uuid = Some(sb.member_uuid);
        } else {
            w.pending = Some(sb.events);
        }
    }

    /// After `c` died: whether requests may be sent again on another
    /// connection (see the module's doc).
    fn after_loss(&self, c: &Conn) -> io::Result<()> {
        c.kill();
        if !c.reader_ended() {
            return Err(self.give_up("its connection died and did not end in time"));
        }
        let (n, w) = (c.unflushed(), c.lost_writes.load(Ordering::Acquire));
        if n > 0 || w > 0 {
            return Err(self.give_up(&format!(
                "connection lost with {w} writes in flight and {n} acknowledged writes not yet flushed"
            )));
        }
        Ok(())
    }

    /// Whether a new connection reached the same disk: same size and
    /// flags, and the member identity this member was opened with.
    fn same_disk(&self, c: &Conn, e: &Export) -> Result<(), String> {
        if e.size != self.export.size || e.flags != self.export.flags {
            return Err(format!(
                "the export came back with size {} and flags {:#x} instead of {} and {:#x}",
                e.size, e.flags, self.export.size, self.export.flags
            ));
        }
        let sb = superblock(c, Instant::now() + HANDSHAKE);
        let mut w = self.written.lock();
        if let (Some(acked), Some(sb)) = (w.acked, &sb) {
            if sb.events != acked && Some(sb.events) != w.pending {
                return Err(format!(
                    "the export carries array metadata event {} where this member last wrote event {acked}: {}",
                    sb.events,
                    if sb.events < acked {
                        "an older copy of the disk (a server restarted on an old image?), without the writes since"
                    } else {
                        "something else wrote to it meanwhile"
                    }
                ));
            }
        }
        match (w.uuid, sb.map(|s| s.member_uuid)) {
            (Some(a), Some(b)) if a != b => Err(format!(
                "another disk answers there now (member {b}, not {a})"
            )),
            (Some(a), None) => Err(format!(
                "the export no longer carries this member's metadata (member {a})"
            )),
            (None, b) => {
                w.uuid = b;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A live connection, reconnecting (with backoff) until `deadline`.
    fn connection(&self, deadline: Instant) -> io::Result<Arc<Conn>> {
        let mut backoff = Duration::from_millis(100);
        loop {
            if self.lost.load(Ordering::Acquire) {
                return Err(self.gone());
            }
            if let Some(c) = self
                .conn
                .lock()
                .as_ref()
                .filter(|c| !c.dead.load(Ordering::Acquire))
            {
                return Ok(c.clone());
            }
            let _one = self.reconnecting.lock();
            let old = self.conn.lock().clone();
            if let Some(c) = &old {
                if !c.dead.load(Ordering::Acquire) {
                    return Ok(c.clone());
                }
                self.after_loss(c)?;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match connect(
                &self.uri,
                self.tls.as_ref(),
                left.clamp(Duration::from_millis(100), HANDSHAKE),
            ) {
                Ok((c, e)) => {
                    if let Err(why) = self.same_disk(&c, &e) {
                        c.kill();
                        // It answered, with something else than this member:
                        // left to the operator, not re-added by the daemon.
                        self.errored.store(true, Ordering::Release);
                        return Err(self.give_up(&why));
                    }
                    tracing::info!(member = %self.text, "reconnected");
                    *self.conn.lock() = Some(c.clone());
                    return Ok(c);
                }
                Err(e) if Instant::now() + backoff >= deadline => {
                    return Err(self.give_up(&format!(
                        "unreachable for {:.1} s: {e}",
                        timeout().as_secs_f64()
                    )))
                }
                Err(e) => {
                    tracing::warn!(member = %self.text, "reconnecting: {e}");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// One request, sent again on a new connection as needed, until the
    /// member timeout from `began`.
    /// `len`: the request's length (a read's and a write's are their
    /// buffers').
    fn run(
        &self,
        kind: Kind,
        offset: u64,
        len: usize,
        payload: &[u8],
        mut out: Option<&mut [u8]>,
        began: Instant,
    ) -> io::Result<()> {
        let write = matches!(kind, Kind::Write { .. });
        if write {
            self.note_write(offset, payload, false);
        }
        let deadline = began + timeout();
        loop {
            if Instant::now() >= deadline {
                return Err(
                    self.give_up(&format!("no reply within {:.1} s", timeout().as_secs_f64()))
                );
            }
            let c = self.connection(deadline)?;
            let kind = match kind {
                Kind::Flush { .. } => Kind::Flush {
                    covers: c.acked_writes.load(Ordering::Acquire),
                },
                k => k,
            };
            let slot = match c.send(kind, offset, len, payload) {
                Ok(s) => s,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            };
            match c.wait(&slot, deadline) {
                Ok(data) => {
                    if let Some(o) = out.as_deref_mut() {
                        o.copy_from_slice(&data);
                    }
                    if write {
                        self.note_write(offset, payload, true);
                    }
                    return Ok(());
                }
                Err(Failure::Server(errno)) => return Err(self.server_error(errno)),
                Err(Failure::Lost) => {}
            }
        }
    }

    /// The server's block status descriptors for `len` bytes at
    /// `offset`, asked on the connection there is (none is made for it:
    /// not knowing where the holes are is no reason to wait on a
    /// reconnection, or to give the member up). None: not known (no live
    /// connection, no `base:allocation` context, an error).
    fn block_status(&self, offset: u64, len: u32) -> Option<Vec<u8>> {
        let c = self
            .conn
            .lock()
            .clone()
            .filter(|c| !c.dead.load(Ordering::Acquire) && c.replies.allocation.is_some())?;
        let slot = c.send(Kind::BlockStatus, offset, len as usize, &[]).ok()?;
        // Not waited for as an I/O is: a slow answer is no sign of a dead
        // link worth ending the connection over (which gives the member
        // up where writes are not yet flushed).
        c.wait_quietly(&slot, Instant::now() + STATUS_WAIT.min(timeout()))?
            .ok()
    }

    /// Large transfers cut to what the server takes in one request.
    fn pieces(&self, len: usize) -> impl Iterator<Item = (usize, usize)> {
        let max = self.export.max_payload;
        (0..len).step_by(max).map(move |s| (s, (len - s).min(max)))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(c) = self.conn.lock().take() {
            // A polite goodbye (TLS: and its close_notify), then the
            // socket closed (the reader ends).
            let mut h = [0u8; nbd::Request::LEN];
            h[0..4].copy_from_slice(&nbd::REQUEST_MAGIC.to_be_bytes());
            h[6..8].copy_from_slice(&nbd::CMD_DISC.to_be_bytes());
            let mut w = c.writer.lock();
            if w.write_all(&h).is_ok() {
                let _ = w.close_notify();
            }
            drop(w);
            c.kill();
        }
    }
}

/// A request sent by `begin`, waited for by `submit`.
struct InFlight {
    inner: Arc<Inner>,
    conn: Arc<Conn>,
    slot: Arc<Slot>,
    began: Instant,
}

impl Pending for InFlight {
    fn wait(self: Box<Self>, io: &mut MemberIo<'_>) -> io::Result<()> {
        let deadline = self.began + timeout();
        match self.conn.wait(&self.slot, deadline) {
            Ok(data) => {
                match &mut io.op {
                    IoOp::Read(b) => b.copy_from_slice(&data),
                    IoOp::Write(b) | IoOp::WriteFua(b) => self.inner.note_write(io.offset, b, true),
                }
                Ok(())
            }
            Err(Failure::Server(errno)) => Err(self.inner.server_error(errno)),
            // Sent again the slow way, on a new connection if one can be had
            // (a write never is: `after_loss` gives the member up).
            Err(Failure::Lost) => {
                let i = &self.inner;
                let fua = matches!(io.op, IoOp::WriteFua(_));
                match &mut io.op {
                    IoOp::Read(b) => {
                        i.run(Kind::Read, io.offset, b.len(), &[], Some(b), self.began)
                    }
                    IoOp::Write(b) | IoOp::WriteFua(b) => {
                        i.run(Kind::Write { fua }, io.offset, b.len(), b, None, self.began)
                    }
                }
            }
        }
    }
}

impl Member for NbdMember {
    fn identity(&self) -> &str {
        &self.0.text
    }
    fn device_key(&self) -> DeviceKey {
        self.0.key
    }
    fn size(&self) -> u64 {
        self.0.export.size
    }
    /// From the server's block status (`base:allocation`), where the
    /// operator trusts it (`[remote] trust_holes`): where it says the
    /// export reads as zeros (`STATE_ZERO`), a hole. One extent per
    /// request (`CMD_FLAG_REQ_ONE`), each at most a gigabyte, until data
    /// or the export's end: two round trips where a hole comes first.
    fn data_from(&self, offset: u64) -> Option<std::ops::Range<u64>> {
        if !super::trust_holes() {
            return None;
        }
        let size = self.0.export.size;
        let mut at = offset;
        for _ in 0..STATUS_ASKS {
            if at >= size {
                break;
            }
            let len = (size - at).min(STATUS_SPAN);
            let said = self.0.block_status(at, len as u32)?;
            // Within `at..at + len`, so within the export.
            match structured::first_data(at, len, &said)? {
                Extents::Data(r) => return Some(r),
                // No progress would be a server bug: data, to be safe.
                Extents::ZerosTo(end) if end <= at => return None,
                Extents::ZerosTo(end) => at = end,
            }
        }
        if at < size {
            // Asked enough: holes up to here, data from here on as far as
            // anyone can tell (a server answering in small pieces).
            return Some(at..u64::MAX);
        }
        // Zeros to the end of the export (as a file's SEEK_DATA says);
        // from past it, data as far as a copy is concerned.
        (offset < size).then_some(size..u64::MAX)
    }
    /// Not asked: a round trip to the server for each read that could be
    /// answered as a hole (`Array::read_of_holes`) costs more than the
    /// zeros it would spare; block status and a copy's map still ask
    /// `data_from`.
    fn data_start_from(&self, _offset: u64) -> Option<u64> {
        None
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        for (s, n) in self.0.pieces(buf.len()).collect::<Vec<_>>() {
            self.0.run(
                Kind::Read,
                offset + s as u64,
                n,
                &[],
                Some(&mut buf[s..s + n]),
                Instant::now(),
            )?;
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_pieces(buf, offset, false)
    }
    /// Where the server takes the FUA flag (`NBD_FLAG_SEND_FUA`).
    fn fua(&self) -> bool {
        self.0.export.flags & nbd::TFLAG_SEND_FUA != 0
    }
    fn write_fua_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.fua() {
            return raid_core::member::write_then_flush(self, buf, offset);
        }
        self.0.write_pieces(buf, offset, true)
    }
    fn flush(&self) -> io::Result<()> {
        if self.0.export.flags & nbd::TFLAG_SEND_FLUSH == 0 {
            return Ok(());
        }
        self.0
            .run(Kind::Flush { covers: 0 }, 0, 0, &[], None, Instant::now())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.0.export.flags & nbd::TFLAG_SEND_WRITE_ZEROES != 0 {
            // Within the 32-bit length of one request.
            let mut at = 0u64;
            while at < len {
                let n = (len - at).min(1 << 30);
                self.0.run(
                    Kind::Zero,
                    offset + at,
                    n as usize,
                    &[],
                    None,
                    Instant::now(),
                )?;
                at += n;
            }
            return Ok(());
        }
        let zeros = vec![0u8; self.0.export.max_payload.min(len as usize)];
        let mut at = 0u64;
        while at < len {
            let n = (len - at).min(zeros.len() as u64) as usize;
            self.0.run(
                Kind::Write { fua: false },
                offset + at,
                n,
                &zeros[..n],
                None,
                Instant::now(),
            )?;
            at += n as u64;
        }
        Ok(())
    }
    fn begin(&self, io: &mut MemberIo<'_>) -> Option<io::Result<Box<dyn Pending>>> {
        let i = &self.0;
        if io.len() > i.export.max_payload || i.lost.load(Ordering::Acquire) {
            return None;
        }
        let conn = i
            .conn
            .lock()
            .clone()
            .filter(|c| !c.dead.load(Ordering::Acquire))?;
        let began = Instant::now();
        let sent = match &io.op {
            IoOp::Read(b) => conn.send(Kind::Read, io.offset, b.len(), &[]),
            IoOp::Write(b) => {
                i.note_write(io.offset, b, false);
                conn.send(Kind::Write { fua: false }, io.offset, b.len(), b)
            }
            // Sent with the flag only where the server takes it.
            IoOp::WriteFua(_) if !self.fua() => return None,
            IoOp::WriteFua(b) => {
                i.note_write(io.offset, b, false);
                conn.send(Kind::Write { fua: true }, io.offset, b.len(), b)
            }
        };
        // Not sent: the synchronous path reconnects and sends it.
        let slot = sent.ok()?;
        Some(Ok(Box::new(InFlight {
            inner: i.clone(),
            conn,
            slot,
            began,
        })))
    }
    fn io_stats(&self) -> Option<&IoStats> {
        Some(&self.0.stats)
    }
    fn unreachable(&self) -> bool {
        self.0.lost.load(Ordering::Acquire) && !self.0.errored.load(Ordering::Acquire)
    }
}
