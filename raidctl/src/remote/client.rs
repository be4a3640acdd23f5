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
//!   flags, and the same member identity in its array metadata.
//! - Reconnecting is retried with backoff; an I/O that cannot be done within
//!   the member timeout (`[remote] timeout_seconds`, default 30) fails, and
//!   the member is given up.
//!
//! A member given up answers every I/O with an error at once, and says so
//! through `Member::unreachable`: the daemon then tries to reach the export
//! again and re-adds it when it answers.

use super::tls::{self, Sock, TlsStream};
use super::uri::{Addr, NbdUri};
use crate::nbd;
use parking_lot::{Condvar, Mutex};
use raid_core::member::{DeviceKey, IoOp, Member, MemberIo, Pending};
use raid_core::stats::IoStats;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an I/O may take, reconnections included, before the member is
/// given up (ms; `[remote] timeout_seconds`).
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(30_000);

pub fn set_timeout(d: Duration) {
    TIMEOUT_MS.store(d.as_millis().max(100) as u64, Ordering::Relaxed);
}

pub fn timeout() -> Duration {
    Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed))
}

/// The longest a handshake step may take.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// A stream, plain or TLS.
enum Stream {
    Plain(Sock),
    Tls(TlsStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Plain(s) => Stream::Plain(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(s.try_clone()?),
        })
    }
    /// Ends the connection at once, queued requests dropped (see
    /// `Sock::abort`).
    fn abort(&self) {
        match self {
            Stream::Plain(s) => s.abort(),
            Stream::Tls(s) => s.abort(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(b),
            Stream::Tls(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(b),
            Stream::Tls(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the export told us in the handshake.
#[derive(Clone, Copy, Debug)]
struct Export {
    size: u64,
    flags: u16,
    /// Largest payload the server takes in one request.
    max_payload: usize,
}

#[derive(Clone, Copy)]
enum Kind {
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
}

/// One request in flight.
struct Slot {
    kind: Kind,
    len: usize,
    /// None until the reply came: Ok(data) for a read, Ok(empty) otherwise,
    /// or the server's error, or the connection's loss.
    done: Mutex<Option<Result<Vec<u8>, Failure>>>,
    cv: Condvar,
}

#[derive(Debug)]
enum Failure {
    /// The server answered with this errno.
    Server(u32),
    /// The connection died before the reply.
    Lost,
}

/// One connection to the export.
struct Conn {
    writer: Mutex<Stream>,
    /// For shutting the socket from any thread (wakes the reader).
    closer: Stream,
    inflight: Mutex<HashMap<u64, Arc<Slot>>>,
    next_cookie: AtomicU64,
    dead: AtomicBool,
    /// Writes acknowledged on this connection, and how many of them a
    /// completed flush covers.
    acked_writes: AtomicU64,
    flushed: AtomicU64,
    /// Writes whose outcome is unknown: in flight when the connection died.
    lost_writes: AtomicU64,
    /// The reader has ended (and counted every request it failed).
    reader_done: Mutex<bool>,
    reader_cv: Condvar,
}

impl Kind {
    fn writes(&self) -> bool {
        matches!(self, Kind::Write { .. } | Kind::Zero)
    }
}

impl Conn {
    fn kill(&self) {
        self.dead.store(true, Ordering::Release);
        self.closer.abort();
    }

    /// Acknowledged writes no flush has covered.
    fn unflushed(&self) -> u64 {
        self.acked_writes
            .load(Ordering::Acquire)
            .saturating_sub(self.flushed.load(Ordering::Acquire))
    }

    fn send(&self, kind: Kind, offset: u64, len: usize, payload: &[u8]) -> io::Result<Arc<Slot>> {
        if self.dead.load(Ordering::Acquire) {
            return Err(io::ErrorKind::ConnectionAborted.into());
        }
        let (cmd, flags) = match kind {
            Kind::Read => (nbd::CMD_READ, 0),
            Kind::Write { fua } => (nbd::CMD_WRITE, if fua { nbd::CMD_FLAG_FUA } else { 0 }),
            Kind::Zero => (nbd::CMD_WRITE_ZEROES, 0),
            Kind::Flush { .. } => (nbd::CMD_FLUSH, 0),
        };
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            kind,
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
            Kind::Write { .. } => {
                let mut msg = Vec::with_capacity(h.len() + payload.len());
                msg.extend_from_slice(&h);
                msg.extend_from_slice(payload);
                w.write_all(&msg)
            }
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
    fn wait(&self, slot: &Slot, deadline: Instant) -> Result<Vec<u8>, Failure> {
        let mut d = slot.done.lock();
        loop {
            if let Some(r) = d.take() {
                return r;
            }
            if slot.cv.wait_until(&mut d, deadline).timed_out() && d.is_none() {
                drop(d);
                self.kill();
                return Err(Failure::Lost);
            }
        }
    }

    /// The reader: replies in, matched to their requests, until the stream
    /// ends; then every request still waiting is told the connection is
    /// lost.
    fn read_replies(&self, mut r: io::BufReader<Stream>) {
        let why = loop {
            let mut h = [0u8; 16];
            if let Err(e) = r.read_exact(&mut h) {
                break e.to_string();
            }
            let magic = u32::from_be_bytes(h[0..4].try_into().unwrap());
            let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
            let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
            if magic != nbd::SIMPLE_REPLY_MAGIC {
                break format!("bad reply magic {magic:#x}");
            }
            let Some(slot) = self.inflight.lock().remove(&cookie) else {
                break format!("reply to unknown request {cookie}");
            };
            let res = if err == nbd::ESHUTDOWN {
                // The server is going away: the request is not done.
                if slot.kind.writes() {
                    self.lost_writes.fetch_add(1, Ordering::AcqRel);
                }
                self.kill();
                Err(Failure::Lost)
            } else if err != 0 {
                Err(Failure::Server(err))
            } else {
                match slot.kind {
                    Kind::Read => {
                        let mut data = vec![0u8; slot.len];
                        if let Err(e) = r.read_exact(&mut data) {
                            self.inflight.lock().insert(cookie, slot);
                            break e.to_string();
                        }
                        Ok(data)
                    }
                    Kind::Write { fua: false } | Kind::Zero => {
                        self.acked_writes.fetch_add(1, Ordering::AcqRel);
                        Ok(Vec::new())
                    }
                    Kind::Write { fua: true } => Ok(Vec::new()),
                    Kind::Flush { covers } => {
                        self.flushed.fetch_max(covers, Ordering::AcqRel);
                        Ok(Vec::new())
                    }
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
    fn reader_ended(&self) -> bool {
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
    /// The server answered a request with an error.
    errored: AtomicBool,
    /// The member identity in the export's array metadata, once known.
    member_uuid: Mutex<Option<raid_core::metadata::Uuid>>,
    stats: IoStats,
}

/// A member reached over NBD.
pub struct NbdMember(Arc<Inner>);

impl NbdMember {
    /// Connects to the export `text` names and negotiates it. Refused: a
    /// read-only export, or one that does not take flushes (writes could
    /// not be made durable).
    pub fn open(text: &str) -> io::Result<NbdMember> {
        let uri =
            NbdUri::parse(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let tls = match &uri.tls {
            Some(t) => Some(tls::client_config(t.certificates.as_ref())?),
            None => None,
        };
        let (conn, export) = connect(&uri, tls.as_ref(), HANDSHAKE.min(timeout()))
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
        let uuid = member_uuid(&conn, Instant::now() + HANDSHAKE);
        Ok(NbdMember(Arc::new(Inner {
            text: text.to_string(),
            key: key(&uri),
            uri,
            export,
            tls,
            conn: Mutex::new(Some(conn)),
            reconnecting: Mutex::new(()),
            lost: AtomicBool::new(false),
            errored: AtomicBool::new(false),
            member_uuid: Mutex::new(uuid),
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

/// Connects, negotiates (STARTTLS first when asked), and starts the
/// connection's reader.
fn connect(
    uri: &NbdUri,
    tls: Option<&Arc<rustls::ClientConfig>>,
    limit: Duration,
) -> io::Result<(Arc<Conn>, Export)> {
    let sock = match &uri.addr {
        Addr::Tcp { host, port } => {
            let mut last =
                io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
            let mut found = None;
            for a in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&a, limit) {
                    Ok(s) => {
                        found = Some(s);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let s = found.ok_or(last)?;
            s.set_nodelay(true)?;
            Sock::Tcp(s)
        }
        Addr::Unix(p) => Sock::Unix(UnixStream::connect(p)?),
    };
    sock.set_read_timeout(Some(limit))?;
    // A send blocked this long (the peer not reading) ends the connection.
    sock.set_write_timeout(Some(timeout()))?;
    let mut s = Stream::Plain(sock);
    let mut b8 = [0u8; 8];
    s.read_exact(&mut b8)?;
    if u64::from_be_bytes(b8) != nbd::NBDMAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an NBD server",
        ));
    }
    s.read_exact(&mut b8)?;
    if u64::from_be_bytes(b8) != nbd::IHAVEOPT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the server does not speak newstyle NBD",
        ));
    }
    let mut b2 = [0u8; 2];
    s.read_exact(&mut b2)?;
    let hflags = u16::from_be_bytes(b2);
    if hflags & nbd::FLAG_FIXED_NEWSTYLE == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the server does not speak fixed newstyle NBD",
        ));
    }
    let no_zeroes = hflags & nbd::FLAG_NO_ZEROES != 0;
    let cflags = nbd::FLAG_C_FIXED_NEWSTYLE | if no_zeroes { nbd::FLAG_C_NO_ZEROES } else { 0 };
    s.write_all(&cflags.to_be_bytes())?;
    if let Some(cfg) = tls {
        let name = match &uri.tls {
            Some(t) => tls::server_name(&t.hostname)?,
            None => unreachable!("a TLS config comes from the URI's TLS"),
        };
        send_option(&mut s, nbd::OPT_STARTTLS, &[])?;
        let (kind, data) = option_reply(&mut s, nbd::OPT_STARTTLS)?;
        if kind != nbd::REP_ACK {
            return Err(option_error("STARTTLS", kind, &data));
        }
        let Stream::Plain(sock) = s else {
            unreachable!()
        };
        let c = rustls::ClientConnection::new(cfg.clone(), name).map_err(io::Error::other)?;
        let t = TlsStream::handshake(c, sock, limit).map_err(|e| {
            let dir = uri.tls.as_ref().and_then(|t| t.certificates.as_ref());
            io::Error::new(
                e.kind(),
                format!(
                    "TLS handshake failed ({e}): check the certificates{} (ca-cert.pem signs the server's; client-cert.pem and client-key.pem where the server asks for one)",
                    dir.map(|d| format!(" in {}", d.display())).unwrap_or_default()
                ),
            )
        })?;
        s = Stream::Tls(t);
    }
    // GO: the export by name, with its block sizes.
    let mut d = (uri.export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(uri.export.as_bytes());
    d.extend_from_slice(&1u16.to_be_bytes());
    d.extend_from_slice(&nbd::INFO_BLOCK_SIZE.to_be_bytes());
    send_option(&mut s, nbd::OPT_GO, &d)?;
    let mut size_flags = None;
    let mut max_payload = nbd::MAX_REQUEST as usize;
    loop {
        let (kind, data) = option_reply(&mut s, nbd::OPT_GO).map_err(|e| match &uri.tls {
            // TLS 1.3 refuses a client certificate after the handshake.
            Some(t) if tls.is_some() => io::Error::new(
                e.kind(),
                format!(
                    "the server ended the TLS session ({e}): it may want a client certificate: client-cert.pem and client-key.pem in {}",
                    t.certificates
                        .as_ref()
                        .map_or("the tls-certificates directory".into(), |d| d.display().to_string())
                ),
            ),
            _ => e,
        })?;
        match kind {
            nbd::REP_ACK => break,
            nbd::REP_INFO if data.len() >= 2 => {
                let t = u16::from_be_bytes([data[0], data[1]]);
                if t == nbd::INFO_EXPORT && data.len() >= 12 {
                    let size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                    let flags = u16::from_be_bytes([data[10], data[11]]);
                    size_flags = Some((size, flags));
                } else if t == nbd::INFO_BLOCK_SIZE && data.len() >= 14 {
                    let min = u32::from_be_bytes(data[2..6].try_into().unwrap());
                    let max = u32::from_be_bytes(data[10..14].try_into().unwrap());
                    if min as u64 > raid_core::array::BLOCK {
                        return Err(io::Error::new(
                            io::ErrorKind::Unsupported,
                            format!("the export's minimum block size is {min} bytes; the array needs 4096 or less"),
                        ));
                    }
                    max_payload = max_payload
                        .min(max as usize)
                        .max(raid_core::array::BLOCK as usize);
                }
            }
            nbd::REP_INFO => {}
            _ => return Err(option_error("GO", kind, &data)),
        }
    }
    let (size, flags) = size_flags.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the server did not give the export's size",
        )
    })?;
    let (r, closer) = (s.try_clone()?, s.try_clone()?);
    // Negotiated: replies may be far apart now (the reader waits).
    match &closer {
        Stream::Plain(x) => x.set_read_timeout(None)?,
        Stream::Tls(x) => x.socket().set_read_timeout(None)?,
    }
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
    });
    let c = conn.clone();
    std::thread::Builder::new()
        .name("nbd-member".into())
        .spawn(move || c.read_replies(io::BufReader::with_capacity(256 * 1024, r)))?;
    Ok((
        conn,
        Export {
            size,
            flags,
            max_payload,
        },
    ))
}

/// The member identity in the array metadata at the start of the export,
/// read on `c`; None when it carries none (or cannot be read in time).
fn member_uuid(c: &Conn, deadline: Instant) -> Option<raid_core::metadata::Uuid> {
    let len = raid_core::metadata::SB_SIZE;
    let slot = c
        .send(Kind::Read, raid_core::metadata::SB_OFFSETS[0], len, &[])
        .ok()?;
    let data = c.wait(&slot, deadline).ok()?;
    raid_core::metadata::Superblock::decode(&data)
        .ok()
        .map(|sb| sb.member_uuid)
}

fn send_option(s: &mut Stream, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut b = nbd::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b)
}

fn option_reply(s: &mut Stream, opt: u32) -> io::Result<(u32, Vec<u8>)> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h)?;
    if u64::from_be_bytes(h[0..8].try_into().unwrap()) != nbd::REPLY_MAGIC
        || u32::from_be_bytes(h[8..12].try_into().unwrap()) != opt
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad option reply",
        ));
    }
    let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    if len > nbd::MAX_OPTION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "option reply too long",
        ));
    }
    let mut d = vec![0u8; len as usize];
    s.read_exact(&mut d)?;
    Ok((kind, d))
}

fn option_error(what: &str, kind: u32, data: &[u8]) -> io::Error {
    let msg = String::from_utf8_lossy(data);
    let (k, why) = match kind {
        nbd::REP_ERR_TLS_REQD => (
            io::ErrorKind::PermissionDenied,
            "the server requires TLS: use nbds://".to_string(),
        ),
        nbd::REP_ERR_UNKNOWN => (io::ErrorKind::NotFound, format!("no such export ({msg})")),
        nbd::REP_ERR_POLICY => (
            io::ErrorKind::PermissionDenied,
            format!("refused by the server's policy ({msg})"),
        ),
        nbd::REP_ERR_UNSUP => (
            io::ErrorKind::Unsupported,
            format!("{what} is not supported by the server ({msg})"),
        ),
        _ => (
            io::ErrorKind::Other,
            format!("{what} refused ({kind:#x}: {msg})"),
        ),
    };
    io::Error::new(k, why)
}

impl Inner {
    /// The server's own error: the member is then not "unreachable" (the
    /// daemon does not bring back a member that reported errors).
    fn server_error(&self, errno: u32) -> io::Error {
        self.errored.store(true, Ordering::Release);
        io::Error::from_raw_os_error(errno as i32)
    }

    fn gone(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotConnected,
            format!("{} was given up (unreachable, or its connection was lost with writes not yet flushed)", self.text),
        )
    }

    fn give_up(&self, why: &str) -> io::Error {
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::error!(member = %self.text, "network member given up: {why}");
            if let Some(c) = self.conn.lock().take() {
                c.kill();
            }
        }
        self.gone()
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
        let now = member_uuid(c, Instant::now() + HANDSHAKE);
        let mut known = self.member_uuid.lock();
        match (*known, now) {
            (Some(a), Some(b)) if a != b => Err(format!(
                "another disk answers there now (member {b}, not {a})"
            )),
            (Some(a), None) => Err(format!(
                "the export no longer carries this member's metadata (member {a})"
            )),
            (None, b) => {
                *known = b;
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
                    return Ok(());
                }
                Err(Failure::Server(errno)) => return Err(self.server_error(errno)),
                Err(Failure::Lost) => {}
            }
        }
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
            // A polite goodbye, then the socket closed (the reader ends).
            let mut h = [0u8; nbd::Request::LEN];
            h[0..4].copy_from_slice(&nbd::REQUEST_MAGIC.to_be_bytes());
            h[6..8].copy_from_slice(&nbd::CMD_DISC.to_be_bytes());
            let _ = c.writer.lock().write_all(&h);
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
                if let IoOp::Read(b) = &mut io.op {
                    b.copy_from_slice(&data);
                }
                Ok(())
            }
            Err(Failure::Server(errno)) => Err(self.inner.server_error(errno)),
            // Sent again the slow way, on a new connection if one can be had
            // (a write never is: `after_loss` gives the member up).
            Err(Failure::Lost) => {
                let i = &self.inner;
                match &mut io.op {
                    IoOp::Read(b) => {
                        i.run(Kind::Read, io.offset, b.len(), &[], Some(b), self.began)
                    }
                    IoOp::Write(b) => i.run(
                        Kind::Write { fua: false },
                        io.offset,
                        b.len(),
                        b,
                        None,
                        self.began,
                    ),
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
        for (s, n) in self.0.pieces(buf.len()) {
            self.0.run(
                Kind::Write { fua: false },
                offset + s as u64,
                n,
                &buf[s..s + n],
                None,
                Instant::now(),
            )?;
        }
        Ok(())
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
            IoOp::Write(b) => conn.send(Kind::Write { fua: false }, io.offset, b.len(), b),
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
