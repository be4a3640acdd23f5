//! Exports: the array served over NBD on a Unix socket or TCP (loopback
//! unless an address is given): listening and accepting are here, the
//! handshake in `handshake.rs`; each connection's requests go to the
//! array's engine, many in flight at once, and replies go out as they
//! complete (`transmission.rs`). Every connection of an export shares one
//! engine.

mod handshake;
mod on_shard;
mod requests;
mod structured;
mod sub_block;
mod transmission;
mod wire;

use crate::error::{CliError, Result};
use crate::nbd;
use crate::remote::tls::{self, Sock, TlsStream};
use raid_core::array::Array;
use raid_core::shard::Engine;
use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A stream NBD can run over: a socket, or TLS on one.
trait Conn: Read + Write + Send + Sync + 'static {
    fn try_clone_box(&self) -> io::Result<Box<dyn Conn>>;
    fn shutdown_both(&self);
    fn shutdown_read(&self);
    /// Sends what the socket takes now without waiting for room: the bytes
    /// sent (0 where it has no room), or None where the stream cannot
    /// (TLS: its records are framed by one writer, which may wait).
    fn send_now(&self, _bufs: &[io::IoSlice<'_>]) -> Option<io::Result<usize>> {
        None
    }
    /// Whether `send_now` sends.
    fn sends_now(&self) -> bool {
        false
    }
    /// The stream, to be read and written without waiting (`on_shard`).
    fn into_stream(self: Box<Self>) -> tls::Stream;
    /// Ends what the server sends, once every reply is out: TLS's
    /// close_notify (`TlsStream::close_notify`); a plain socket's end is
    /// its close.
    fn close_notify(&mut self) -> io::Result<()> {
        Ok(())
    }
}
/// Both streams clone and shut down alike (`try_clone`, `shutdown`); the
/// methods given in braces are the stream's own.
macro_rules! conn {
    ($t:ty { $($own:item)* }) => {
        impl Conn for $t {
            fn try_clone_box(&self) -> io::Result<Box<dyn Conn>> {
                Ok(Box::new(self.try_clone()?))
            }
            fn shutdown_both(&self) {
                self.shutdown(std::net::Shutdown::Both)
            }
            fn shutdown_read(&self) {
                self.shutdown(std::net::Shutdown::Read)
            }
            $($own)*
        }
    };
}
conn!(Sock {
    fn send_now(&self, bufs: &[io::IoSlice<'_>]) -> Option<io::Result<usize>> {
        Some(Sock::send_now(self, bufs))
    }
    fn sends_now(&self) -> bool {
        true
    }
    fn into_stream(self: Box<Self>) -> tls::Stream {
        tls::Stream::Plain(*self)
    }
});
conn!(TlsStream {
    fn into_stream(self: Box<Self>) -> tls::Stream {
        tls::Stream::Tls(*self)
    }
    fn close_notify(&mut self) -> io::Result<()> {
        TlsStream::close_notify(self)
    }
});

/// How a TCP export is secured.
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// A directory with `server-cert.pem` and `server-key.pem` (and
    /// `ca-cert.pem` to check clients' certificates): TLS required.
    pub tls: Option<PathBuf>,
    /// Clients must present a certificate signed by `ca-cert.pem`.
    pub verify_peer: bool,
    /// Serve a non-loopback address without TLS anyway.
    pub insecure: bool,
}

/// Connections served at once per export: a client that opens more gets
/// them closed, rather than a thread each. When all are taken, a new one
/// closes the oldest still negotiating instead (`accept_loop`).
const MAX_CONNECTIONS: usize = 128;

enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

/// Clones of the open connections' sockets, so `stop` can close them;
/// each connection removes its own entry when it ends.
type Conns = Arc<Mutex<std::collections::HashMap<u64, Sock>>>;

/// A running export.
pub struct Export {
    desc: String,
    /// The array's I/O engine serving its connections, for its counters:
    /// not held, so that it still goes with the last connection (see
    /// `accept_loop`).
    engine: std::sync::Weak<Engine>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    conns: Conns,
    socket_path: Option<PathBuf>,
    /// The TCP address listened on, if on TCP.
    tcp_addr: Option<std::net::SocketAddr>,
}

/// Whether the export may listen at `path`: nothing there, or a stale
/// socket (returns true: to be removed before the bind). A socket a
/// server answers on, or any other file, is refused: only a stale socket
/// is replaced, never a file that sits at the path the operator typed.
fn unix_path_free(path: &Path) -> Result<bool> {
    if UnixStream::connect(path).is_ok() {
        return Err(CliError::refused(format!(
            "{} is in use by another server: choose another path for the NBD socket",
            path.display()
        )));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => Ok(true),
        Ok(_) => Err(CliError::refused(format!(
            "{} exists and is not a socket: choose another path for the NBD socket, or remove it yourself if it is not wanted",
            path.display()
        ))),
        Err(_) => Ok(false),
    }
}

/// Checks an export spec and its security before anything is assembled:
/// a TCP address other than loopback is served only with TLS, unless
/// `insecure` says otherwise.
pub fn check_spec(spec: &str, sec: &Security) -> Result<()> {
    if sec.verify_peer && sec.tls.is_none() {
        return Err(CliError::usage(
            "--tls-verify-peer needs --tls DIR (its ca-cert.pem signs the clients' certificates)",
        ));
    }
    match spec.split_once(':') {
        Some(("unix", p)) if !p.is_empty() => unix_path_free(Path::new(p)).map(|_| ()),
        Some(("tcp", a)) if !a.is_empty() => {
            let addr = tcp_addr(a);
            let loopback = std::net::ToSocketAddrs::to_socket_addrs(&addr)
                .map(|mut v| v.all(|x| x.ip().is_loopback()))
                .map_err(|e| CliError::usage(format!("export address {addr}: {e}")))?;
            if !loopback && sec.tls.is_none() && !sec.insecure {
                return Err(CliError::refused(format!(
                    "NBD on {addr} (not loopback) without TLS would let anyone who reaches it read and overwrite the array: give --tls DIR (server-cert.pem and server-key.pem in it; with --tls-verify-peer, clients need a certificate signed by its ca-cert.pem), or --insecure to serve it unencrypted on a network you trust"
                )));
            }
            Ok(())
        }
        _ => Err(CliError::usage(format!(
            "export '{spec}' is not understood: use unix:PATH, tcp:PORT (loopback) or tcp:HOST:PORT"
        ))),
    }
}

/// Shards of an export's engine: one per core, or RAIDCTL_SHARDS in the
/// daemon's environment (1 to 64).
fn shards() -> usize {
    std::env::var("RAIDCTL_SHARDS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| (1..=64).contains(n))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `tcp:PORT` is loopback; `tcp:HOST:PORT` as given.
fn tcp_addr(a: &str) -> String {
    if a.contains(':') {
        a.to_string()
    } else {
        format!("127.0.0.1:{a}")
    }
}

impl Export {
    /// The I/O engine serving the export's connections (None once it
    /// stopped).
    pub fn engine(&self) -> Option<Arc<Engine>> {
        self.engine.upgrade()
    }

    /// `spec`: `unix:PATH`, `tcp:PORT` (loopback) or `tcp:HOST:PORT`.
    pub fn start_nbd(array: Arc<Array>, spec: &str, sec: &Security) -> Result<Export> {
        check_spec(spec, sec)?;
        let tls = match &sec.tls {
            Some(dir) => Some(tls::server_config(dir, sec.verify_peer).map_err(|e| {
                let msg = format!(
                    "TLS for the NBD export: {e}. The directory needs server-cert.pem and server-key.pem (PEM), and ca-cert.pem with --tls-verify-peer"
                );
                match e.kind() {
                    io::ErrorKind::NotFound => CliError::not_found(msg),
                    _ => CliError::usage(msg),
                }
            })?),
            None => None,
        };
        // The requests of every connection share the engine's shards.
        let shards = shards();
        let engine =
            Arc::new(Engine::start(array.clone(), shards).map_err(|e| {
                CliError::failed(format!("cannot start the array's I/O engine: {e}"))
            })?);
        let (listener, desc) = if let Some(path) = spec.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if unix_path_free(&path)? {
                let _ = std::fs::remove_file(&path);
            }
            let l = UnixListener::bind(&path).map_err(|e| {
                CliError::failed(format!("cannot listen on {}: {e}", path.display()))
            })?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).ok();
            (
                Listener::Unix(l, path.clone()),
                format!("nbd unix:{} export '{}'", path.display(), array.name()),
            )
        } else if let Some(addr) = spec.strip_prefix("tcp:") {
            let addr = tcp_addr(addr);
            let l = TcpListener::bind(&addr)
                .map_err(|e| CliError::failed(format!("cannot listen on {addr}: {e}")))?;
            let network = l.local_addr().is_ok_and(|a| !a.ip().is_loopback());
            if network && tls.is_none() {
                tracing::warn!(
                    array = array.name(),
                    address = %addr,
                    "--insecure: NBD without TLS on {addr}: anyone who can reach it can read and overwrite array '{}'",
                    array.name()
                );
            } else if network && !sec.verify_peer {
                tracing::warn!(
                    array = array.name(),
                    address = %addr,
                    "NBD with TLS but no client certificates on {addr}: the traffic is encrypted, but anyone who can reach it can still read and overwrite array '{}'. --tls-verify-peer admits only clients with a certificate signed by the directory's ca-cert.pem",
                    array.name()
                );
            }
            (
                Listener::Tcp(l),
                format!("nbd tcp:{addr} export '{}'", array.name()),
            )
        } else {
            return Err(CliError::usage(format!(
                "export '{spec}' is not understood: use unix:PATH, tcp:PORT (loopback) or tcp:HOST:PORT"
            )));
        };
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Conns = Arc::new(Mutex::new(std::collections::HashMap::new()));
        let socket_path = match &listener {
            Listener::Unix(_, p) => Some(p.clone()),
            Listener::Tcp(_) => None,
        };
        let tcp_addr = match &listener {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(..) => None,
        };
        let desc = match (&tls, sec.verify_peer) {
            (Some(_), true) => format!("{desc}, TLS with client certificates"),
            (Some(_), false) => format!("{desc}, TLS"),
            (None, _) => desc,
        };
        let desc = format!("{desc}, {}", engine.describe());
        let weak_engine = Arc::downgrade(&engine);
        let thread = {
            let (stop, conns) = (stop.clone(), conns.clone());
            std::thread::spawn(move || accept_loop(listener, array, engine, tls, stop, conns))
        };
        Ok(Export {
            desc,
            engine: weak_engine,
            stop,
            thread: Some(thread),
            conns,
            socket_path,
            tcp_addr,
        })
    }

    pub fn describe(&self) -> String {
        self.desc.clone()
    }

    /// Whether `spec` names where this export listens: its socket (the
    /// same file, by inode, whatever the path), or an address whose bind
    /// would clash with its own (the same port, and the same address or
    /// either one the wildcard of its family).
    pub fn listens_at(&self, spec: &str) -> bool {
        if let Some(path) = spec.strip_prefix("unix:") {
            use std::os::unix::fs::MetadataExt;
            let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
            return self
                .socket_path
                .as_deref()
                .is_some_and(|ours| id(ours).is_some() && id(ours) == id(Path::new(path)));
        }
        let (Some(ours), Some(a)) = (self.tcp_addr, spec.strip_prefix("tcp:")) else {
            return false;
        };
        use std::net::ToSocketAddrs;
        let Ok(theirs) = tcp_addr(a).to_socket_addrs() else {
            return false;
        };
        theirs.into_iter().any(|t| {
            t.port() == ours.port()
                && t.is_ipv4() == ours.is_ipv4()
                && (t.ip() == ours.ip() || t.ip().is_unspecified() || ours.ip().is_unspecified())
        })
    }

    /// Stops accepting, closes every connection, waits for the acceptor
    /// (the requests in flight end in the array first; their replies go
    /// with the connection). Returns how many client connections were
    /// open: the operator is told they were cut.
    pub fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Release);
        let mut open = 0;
        for (_, c) in self.conns.lock().unwrap().drain() {
            c.shutdown_both();
            open += 1;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(p) = &self.socket_path {
            let _ = std::fs::remove_file(p);
        }
        open
    }
}

/// Accepts connections and serves each on a thread of its own; returns
/// once `stop` is set and every connection ended. The engine is dropped
/// here, after its last connection: its drop waits for its threads.
fn accept_loop(
    listener: Listener,
    array: Arc<Array>,
    engine: Arc<Engine>,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: Arc<AtomicBool>,
    conns: Conns,
) {
    // The array's byte ranges, its gate shared with every front end: a
    // client's read-modify-write must not be undone by another's write.
    let any = Arc::new(crate::any_bytes::AnyBytes::new(array.clone()));
    let mut next_id = 0u64;
    // Every connection's thread: joined before this returns, so `stop`
    // returns only once no request is in flight on the array.
    let mut served: Vec<std::thread::JoinHandle<()>> = Vec::new();
    // Connections still in the handshake, oldest first, each with the flag
    // its thread clears when transmission begins. With every place taken,
    // a new connection closes the oldest of them rather than being refused:
    // sockets opened and left silent (nothing to authenticate yet, TLS not
    // begun) would otherwise lock every client out until they time out, and
    // an honest client negotiates within milliseconds of its connect.
    let mut negotiating: std::collections::VecDeque<(u64, Arc<AtomicBool>)> =
        std::collections::VecDeque::new();
    match &listener {
        Listener::Unix(l, _) => l.set_nonblocking(true).ok(),
        Listener::Tcp(l) => l.set_nonblocking(true).ok(),
    };
    while !stop.load(Ordering::Acquire) {
        let accepted: io::Result<Sock> = match &listener {
            Listener::Unix(l, _) => l.accept().map(|(s, _)| {
                s.set_nonblocking(false).ok();
                roomy_send_buffer(&s);
                Sock::Unix(s)
            }),
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                s.set_nonblocking(false).ok();
                s.set_nodelay(true).ok();
                // TCP's buffer grows by itself (tcp_wmem); a size set here
                // would turn that off.
                Sock::Tcp(s)
            }),
        };
        served.retain(|t| !t.is_finished());
        negotiating.retain(|(_, n)| n.load(Ordering::Acquire));
        // Its thread ends once its socket is shut: the place is counted
        // free at a later accept; one over the cap meanwhile.
        let full = accepted.is_ok() && served.len() >= MAX_CONNECTIONS;
        let mut made_room = false;
        while full && !made_room {
            let Some((old, flag)) = negotiating.pop_front() else {
                break;
            };
            // Taken from its thread, which may be clearing it that instant
            // to begin transmission: then that one stays, the next goes.
            if flag
                .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                if let Some(s) = conns.lock().unwrap().get(&old) {
                    s.shutdown_both();
                }
                tracing::warn!("nbd: {MAX_CONNECTIONS} connections open already; closed the oldest one still negotiating to take a new one");
                made_room = true;
            }
        }
        match accepted {
            Ok(c) if full && !made_room => {
                tracing::warn!("nbd: {MAX_CONNECTIONS} connections open already, every one past its handshake; one more refused");
                c.shutdown(std::net::Shutdown::Both);
            }
            Ok(c) => {
                next_id += 1;
                let id = next_id;
                if let Ok(clone) = c.try_clone() {
                    conns.lock().unwrap().insert(id, clone);
                }
                let flag = Arc::new(AtomicBool::new(true));
                negotiating.push_back((id, flag.clone()));
                let (array, conns, tls) = (array.clone(), conns.clone(), tls.clone());
                let (engine, any) = (engine.clone(), any.clone());
                served.push(std::thread::spawn(move || {
                    if let Err(e) = handshake::serve(c, array, &engine, tls, &any, &flag) {
                        tracing::debug!("nbd connection ended: {e}");
                    }
                    // Ended: nothing to evict.
                    flag.store(false, Ordering::Release);
                    // Close it for the client too (the reader's clone would
                    // otherwise keep it open), and forget it.
                    if let Some(c) = conns.lock().unwrap().remove(&id) {
                        c.shutdown_both();
                    }
                }));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => {
                tracing::warn!("nbd accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // A connection accepted while `stop` ran is closed here too; then every
    // connection's requests finish before the array is closed.
    for (_, c) in conns.lock().unwrap().drain() {
        c.shutdown_both();
    }
    for t in served {
        let _ = t.join();
    }
}

/// Room in a Unix socket for the replies of every request a connection
/// may have in flight (4 MiB, or what `net.core.wmem_max` allows):
/// replies that do not fit leave the writer blocked mid-batch, and the
/// client and the writer then wake each other for every few kilobytes it
/// reads.
fn roomy_send_buffer(s: &impl std::os::fd::AsRawFd) {
    let want: libc::c_int = 4 << 20;
    // SAFETY: a plain setsockopt on a socket we own, from a live c_int.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&want as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

fn protocol_error(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// The NBD error for an array's refusal or failure.
fn errno_of(e: &raid_core::array::ArrayError) -> u32 {
    use raid_core::array::ArrayError;
    match e {
        ArrayError::Unaligned { .. } => nbd::EINVAL,
        ArrayError::OutOfRange { .. } => nbd::EINVAL,
        ArrayError::NoSpace { .. } => nbd::ENOSPC,
        _ => nbd::EIO,
    }
}
