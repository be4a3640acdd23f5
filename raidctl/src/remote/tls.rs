//! TLS (rustls) over a socket that several threads use at once, for the NBD
//! export and for network members: one thread reads replies or requests
//! while others write, as on a plain socket.
//!
//! rustls keeps one state machine per connection and does no I/O itself.
//! Here each handle (`try_clone`) has its own clone of the socket; the state
//! machine is shared under a lock that is never held across a blocking
//! socket call:
//! - a reader reads ciphertext from its socket without the lock, then takes
//!   it to decrypt;
//! - a writer encrypts under the lock into its own buffer, then sends it
//!   under a second lock that keeps records in the order they were
//!   encrypted.
//!
//! So a writer blocked on a full send buffer never stops the reader from
//! draining replies (which is what lets the peer go on reading). The
//! reader never sends: what TLS 1.3 wants sent after the handshake (a
//! key update's answer) goes out with the next write.

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A connected stream socket of either family.
pub enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl std::os::fd::AsRawFd for Sock {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Sock {
    pub fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
        })
    }
    pub fn shutdown(&self, how: std::net::Shutdown) {
        let _ = match self {
            Sock::Tcp(s) => s.shutdown(how),
            Sock::Unix(s) => s.shutdown(how),
        };
    }
    /// Ends the connection at once, dropping what is still queued to send:
    /// a TCP socket is disconnected (connect to AF_UNSPEC: the kernel
    /// purges its send queue and resets the peer), where a shutdown would
    /// keep retransmitting queued requests. A network member needs this:
    /// a write queued on a dead connection must never reach the server
    /// later, after newer data went to the same place another way.
    pub fn abort(&self) {
        if let Sock::Tcp(s) = self {
            use std::os::fd::AsRawFd;
            // SAFETY: a zeroed sockaddr with family AF_UNSPEC is a valid
            // argument of that size; connect() only reads it, and the fd is
            // the live socket `s` owns.
            unsafe {
                let mut a: libc::sockaddr = std::mem::zeroed();
                a.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
                libc::connect(
                    s.as_raw_fd(),
                    &a,
                    std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
                );
            }
        }
        self.shutdown(std::net::Shutdown::Both);
    }
    /// Sends what the socket takes now, never waiting for room in its
    /// send buffer: the bytes sent, 0 where there was no room.
    pub fn send_now(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let fd = self.as_raw_fd();
        // SAFETY: a zeroed msghdr is valid; it points at `bufs`, whose
        // IoSlices have iovec's layout (std guarantees it on Unix) and
        // outlive the call, which only reads them. The fd is the live
        // socket `self` owns.
        let n = unsafe {
            let mut m: libc::msghdr = std::mem::zeroed();
            m.msg_iov = bufs.as_ptr() as *mut libc::iovec;
            m.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
            libc::sendmsg(fd, &m, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            e if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            e => Err(e),
        }
    }
    /// Receives into `into` without waiting: the bytes (0 at the end of
    /// the stream), or None where there are none now.
    pub fn recv_now(&self, into: &mut [u8]) -> io::Result<Option<usize>> {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: `into` is a live, writable buffer of that length; the
            // fd is the live socket `self` owns.
            let n = unsafe {
                libc::recv(
                    self.as_raw_fd(),
                    into.as_mut_ptr().cast(),
                    into.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                return Ok(Some(n as usize));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(e),
            }
        }
    }
    pub fn set_read_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_read_timeout(t),
            Sock::Unix(s) => s.set_read_timeout(t),
        }
    }
    pub fn set_write_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.set_write_timeout(t),
            Sock::Unix(s) => s.set_write_timeout(t),
        }
    }
}

/// Reads through a shared handle, as `&TcpStream` and `&UnixStream` do.
impl Read for &Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match *self {
            Sock::Tcp(s) => (&*s).read(b),
            Sock::Unix(s) => (&*s).read(b),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(b),
            Sock::Unix(s) => s.read(b),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(b),
            Sock::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write_vectored(b),
            Sock::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes a message's header and payload, gathered (one system call where
/// the stream takes vectored writes), without copying them together.
pub fn write_two<W: Write + ?Sized>(w: &mut W, head: &[u8], data: &[u8]) -> io::Result<()> {
    let (mut hd, mut dd) = (head, data);
    while !hd.is_empty() || !dd.is_empty() {
        let n = w.write_vectored(&[io::IoSlice::new(hd), io::IoSlice::new(dd)])?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let from_h = n.min(hd.len());
        hd = &hd[from_h..];
        dd = &dd[n - from_h..];
    }
    Ok(())
}

struct Shared {
    conn: Mutex<rustls::Connection>,
    /// Ciphertext read from the socket and not yet taken by rustls: shared
    /// by the handles, since the one that negotiated may have read ahead of
    /// the one that reads later. Held by the one reader for its whole read.
    rbuf: Mutex<Ciphertext>,
    /// Held while a writer encrypts and sends, so records leave in order.
    send: Mutex<()>,
}

/// Ciphertext read ahead of rustls: `buf[pos..end]` is still to be
/// taken. The buffer is zeroed once, when first read into, not at every
/// read (a shard polls an idle socket often).
#[derive(Default)]
struct Ciphertext {
    buf: Vec<u8>,
    pos: usize,
    end: usize,
}

/// Bytes of ciphertext read from the socket at once.
const CIPHERTEXT: usize = 64 * 1024;

/// One handle on a TLS connection (see the module's doc).
pub struct TlsStream {
    sock: Sock,
    shared: Arc<Shared>,
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

impl TlsStream {
    /// Runs the handshake on `sock` (blocking), within `timeout`.
    pub fn handshake(
        conn: impl Into<rustls::Connection>,
        mut sock: Sock,
        timeout: std::time::Duration,
    ) -> io::Result<TlsStream> {
        let mut conn = conn.into();
        sock.set_read_timeout(Some(timeout))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).map_err(|e| {
                if e.kind() == io::ErrorKind::WouldBlock {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                } else {
                    e
                }
            })?;
        }
        // The read timeout stays: the caller clears it when the NBD
        // negotiation that follows is done.
        Ok(TlsStream {
            sock,
            shared: Arc::new(Shared {
                conn: Mutex::new(conn),
                rbuf: Mutex::new(Ciphertext::default()),
                send: Mutex::new(()),
            }),
        })
    }

    /// Another handle on the same connection (for another thread).
    pub fn try_clone(&self) -> io::Result<TlsStream> {
        Ok(TlsStream {
            sock: self.sock.try_clone()?,
            shared: self.shared.clone(),
        })
    }

    pub fn shutdown(&self, how: std::net::Shutdown) {
        self.sock.shutdown(how)
    }

    pub fn socket(&self) -> &Sock {
        &self.sock
    }

    /// `Sock::recv_now` for the plaintext: what rustls holds decrypted,
    /// else what the socket holds now, decrypted (None where a record is
    /// not whole yet, or nothing came).
    pub fn recv_now(&self, out: &mut [u8]) -> io::Result<Option<usize>> {
        self.read_plaintext(out, Sock::recv_now)
    }

    /// Plaintext into `out`: what rustls holds decrypted, else ciphertext
    /// already read, else what `fill` reads from the socket (None: nothing
    /// now, which is returned). 0 is the end of the stream: the peer's
    /// close_notify, or the socket closed without one (NBD frames its own
    /// messages).
    fn read_plaintext(
        &self,
        out: &mut [u8],
        mut fill: impl FnMut(&Sock, &mut [u8]) -> io::Result<Option<usize>>,
    ) -> io::Result<Option<usize>> {
        if out.is_empty() {
            return Ok(Some(0));
        }
        let mut rb = self.shared.rbuf.lock();
        let rb = &mut *rb;
        loop {
            {
                let mut c = self.shared.conn.lock();
                match c.reader().read(out) {
                    Ok(n) => return Ok(Some(n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                // Ciphertext already read: give rustls as much as it takes
                // (it holds a bounded amount of undelivered plaintext).
                if rb.pos < rb.end {
                    let mut rest = &rb.buf[rb.pos..rb.end];
                    let n = c.read_tls(&mut rest)?;
                    rb.pos += n;
                    c.process_new_packets().map_err(tls_err)?;
                    continue;
                }
            }
            // Nothing buffered: read more ciphertext, without the lock.
            if rb.buf.is_empty() {
                rb.buf = vec![0; CIPHERTEXT];
            }
            (rb.pos, rb.end) = (0, 0);
            match fill(&self.sock, &mut rb.buf)? {
                Some(0) => return Ok(Some(0)),
                Some(n) => rb.end = n,
                None => return Ok(None),
            }
        }
    }

    /// Lets rustls hold up to `bytes` of records not yet sent (64 KiB by
    /// default): a connection that sends replies of 256 KiB then hands
    /// each to rustls in one call, not four.
    pub fn set_buffer_limit(&self, bytes: usize) {
        self.shared.conn.lock().set_buffer_limit(Some(bytes));
    }

    /// `Sock::send_now` for plaintext: what rustls takes into its records
    /// once the records before them went out whole (0 while they wait for
    /// room in the socket: `unsent`), and as much of them as the socket
    /// takes now. What it took is the connection's to send: `flush_now`
    /// again when the socket has room.
    pub fn send_now(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let _order = self.shared.send.lock();
        let mut c = self.shared.conn.lock();
        self.flush_locked(&mut c)?;
        if c.wants_write() {
            return Ok(0);
        }
        let n = c.writer().write_vectored(bufs)?;
        self.flush_locked(&mut c)?;
        Ok(n)
    }

    /// Sends what the socket takes now of the records waiting (and what
    /// rustls wants sent of its own, such as a key update's answer).
    pub fn flush_now(&self) -> io::Result<()> {
        let _order = self.shared.send.lock();
        self.flush_locked(&mut self.shared.conn.lock())
    }

    /// Whether records wait for room in the socket.
    pub fn unsent(&self) -> bool {
        self.shared.conn.lock().wants_write()
    }

    /// Ends what this side sends as TLS ends it, with the close_notify
    /// alert (a peer that reads on can tell the end of the stream from a
    /// connection cut short), sending what the socket takes now: the
    /// rest is `unsent`, for `flush_now`.
    pub fn close_notify_now(&self) -> io::Result<()> {
        let _order = self.shared.send.lock();
        let mut c = self.shared.conn.lock();
        c.send_close_notify();
        self.flush_locked(&mut c)
    }

    /// `close_notify_now` for a blocking writer: returns once the alert
    /// and every record before it are in the socket.
    pub fn close_notify(&mut self) -> io::Result<()> {
        self.seal_and_send(0, |c| {
            c.send_close_notify();
            Ok(())
        })
    }

    /// For a blocking writer: `make` has rustls make records (under the
    /// lock that keeps records in order), and every record ready is then
    /// sent in one write, waiting for room (`room`: the bytes `make` puts
    /// in, to size the ciphertext).
    fn seal_and_send<T>(
        &mut self,
        room: usize,
        make: impl FnOnce(&mut rustls::Connection) -> io::Result<T>,
    ) -> io::Result<T> {
        let _order = self.shared.send.lock();
        let mut cipher = Vec::with_capacity(room + 64);
        let made = {
            let mut c = self.shared.conn.lock();
            let made = make(&mut c)?;
            while c.wants_write() {
                c.write_tls(&mut cipher)?;
            }
            made
        };
        self.sock.write_all(&cipher)?;
        Ok(made)
    }

    fn flush_locked(&self, c: &mut rustls::Connection) -> io::Result<()> {
        /// The socket as rustls writes to it: no room is WouldBlock.
        struct Now<'a>(&'a Sock);
        impl Write for Now<'_> {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.write_vectored(&[io::IoSlice::new(b)])
            }
            /// Every record rustls has ready in one system call.
            fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
                match self.0.send_now(bufs)? {
                    0 if bufs.iter().any(|b| !b.is_empty()) => {
                        Err(io::ErrorKind::WouldBlock.into())
                    }
                    n => Ok(n),
                }
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        while c.wants_write() {
            match c.write_tls(&mut Now(&self.sock)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Read for TlsStream {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.read_plaintext(out, |mut s, b| s.read(b).map(Some))?;
        Ok(n.expect("a blocking read has an answer"))
    }
}

impl Write for TlsStream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[io::IoSlice::new(b)])
    }
    /// Every slice into the TLS records, then the ciphertext in one write:
    /// a reply's header and data do not each become a record of their own.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        self.seal_and_send(len, |c| c.writer().write_vectored(bufs))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A stream, plain or TLS: a network member's connection (blocking
/// `Read` and `Write`), or an export's connection on a shard (the `_now`
/// calls, which never wait).
pub enum Stream {
    Plain(Sock),
    Tls(TlsStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Plain(s) => Stream::Plain(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(s.try_clone()?),
        })
    }
    /// Ends the connection at once, queued requests dropped (see
    /// `Sock::abort`).
    pub fn abort(&self) {
        self.socket().abort()
    }
    /// The socket under it.
    pub fn socket(&self) -> &Sock {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => t.socket(),
        }
    }
    /// The bytes received now (0 at the end of the stream), or None.
    pub fn recv_now(&self, into: &mut [u8]) -> io::Result<Option<usize>> {
        match self {
            Stream::Plain(s) => s.recv_now(into),
            Stream::Tls(t) => t.recv_now(into),
        }
    }
    /// The bytes of `bufs` sent (TLS: taken) now, 0 where there is no room.
    pub fn send_now(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.send_now(bufs),
            Stream::Tls(t) => t.send_now(bufs),
        }
    }
    /// Sends what the socket takes now of the records taken before
    /// (TLS), never waiting; a plain stream holds nothing unsent.
    pub fn flush_now(&self) -> io::Result<()> {
        match self {
            Stream::Plain(_) => Ok(()),
            Stream::Tls(t) => t.flush_now(),
        }
    }
    /// Whether bytes taken wait for room in the socket.
    pub fn unsent(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(t) => t.unsent(),
        }
    }
    /// The end of what this side sends, where the stream marks one (TLS:
    /// `TlsStream::close_notify_now`); nothing for a plain stream, whose
    /// end is the socket's.
    pub fn close_notify_now(&self) -> io::Result<()> {
        match self {
            Stream::Plain(_) => Ok(()),
            Stream::Tls(t) => t.close_notify_now(),
        }
    }
    /// `close_notify_now` for a blocking writer (`TlsStream::close_notify`).
    pub fn close_notify(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(_) => Ok(()),
            Stream::Tls(t) => t.close_notify(),
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
    fn write_vectored(&mut self, b: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write_vectored(b),
            Stream::Tls(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A PEM file that could not be read: NotFound where it is not there (the
/// command's "not found" exit), else what was wrong with it.
fn pem_err(p: &Path, e: impl std::fmt::Display) -> io::Error {
    if p.exists() {
        io::Error::other(format!("{}: {e}", p.display()))
    } else {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: no such file", p.display()),
        )
    }
}

fn certs(p: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let v: Vec<_> = CertificateDer::pem_file_iter(p)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| pem_err(p, e))?;
    if v.is_empty() {
        return Err(io::Error::other(format!(
            "{}: no certificate in it",
            p.display()
        )));
    }
    Ok(v)
}

/// `certs`, the first of which (the one presented) is within its dates:
/// peers check it at every handshake and refuse it once expired, which
/// rustls never checks on its own side, so an expired certificate started
/// and every client then failed. Refused when expired or not valid yet;
/// warned of in its last two weeks.
fn own_certs(p: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let v = certs(p)?;
    let Some((not_before, not_after)) = super::cert_dates::validity(v[0].as_ref()) else {
        // Not the shape read here: rustls, and the peers, judge it.
        return Ok(v);
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let when = super::cert_dates::utc;
    let wrong = if now > not_after {
        Some(format!(
            "the certificate expired on {}, and every peer refuses it: renew it",
            when(not_after)
        ))
    } else if now < not_before {
        Some(format!(
            "the certificate is not valid before {}: check this host's clock, or the certificate",
            when(not_before)
        ))
    } else {
        None
    };
    if let Some(why) = wrong {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: {why}", p.display()),
        ));
    }
    if not_after - now < 14 * 86_400 {
        tracing::warn!(
            "{}: the certificate expires on {}: renew it before then",
            p.display(),
            when(not_after)
        );
    }
    Ok(v)
}

fn key(p: &Path) -> io::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(p).map_err(|e| pem_err(p, e))
}

fn roots(p: &Path) -> io::Result<Arc<rustls::RootCertStore>> {
    let mut r = rustls::RootCertStore::empty();
    for c in certs(p)? {
        r.add(c)
            .map_err(|e| io::Error::other(format!("{}: {e}", p.display())))?;
    }
    Ok(Arc::new(r))
}

/// The server side: `DIR/server-cert.pem` and `DIR/server-key.pem` (the
/// layout of qemu's and nbdkit's x509 directories); with `verify_peer`,
/// clients must present a certificate signed by `DIR/ca-cert.pem`.
pub fn server_config(dir: &Path, verify_peer: bool) -> io::Result<Arc<rustls::ServerConfig>> {
    let b = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| io::Error::other(e.to_string()))?;
    let b = if verify_peer {
        let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots(&dir.join("ca-cert.pem"))?,
            provider(),
        )
        .build()
        .map_err(|e| io::Error::other(e.to_string()))?;
        b.with_client_cert_verifier(v)
    } else {
        b.with_no_client_auth()
    };
    let cfg = b
        .with_single_cert(
            own_certs(&dir.join("server-cert.pem"))?,
            key(&dir.join("server-key.pem"))?,
        )
        .map_err(|e| io::Error::other(format!("{}: {e}", dir.display())))?;
    Ok(Arc::new(cfg))
}

/// The client side: the server's certificate is checked against
/// `DIR/ca-cert.pem` (or the system's roots without a directory), and
/// `DIR/client-cert.pem` with `DIR/client-key.pem` is presented where it
/// exists.
pub fn client_config(dir: Option<&PathBuf>) -> io::Result<Arc<rustls::ClientConfig>> {
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| io::Error::other(e.to_string()))?;
    let b = match dir {
        Some(d) => b.with_root_certificates(roots(&d.join("ca-cert.pem"))?),
        None => b.with_root_certificates(Arc::new(rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        })),
    };
    let cfg = match dir {
        Some(d) if d.join("client-cert.pem").exists() => b
            .with_client_auth_cert(
                own_certs(&d.join("client-cert.pem"))?,
                key(&d.join("client-key.pem"))?,
            )
            .map_err(|e| io::Error::other(format!("{}: {e}", d.display())))?,
        _ => b.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// The name a server's certificate must carry (an IP address or a DNS
/// name).
pub fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("'{host}': {e}")))
}
