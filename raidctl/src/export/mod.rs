//! Exports: the array served over NBD on a Unix socket or TCP (loopback
//! unless an address is given). The handshake is here; each connection's
//! requests go to the array's engine, many in flight at once, and replies
//! go out as they complete (`transmission.rs`). Every connection of an
//! export shares one engine.

mod sub_block;
mod transmission;
mod wire;

use crate::error::{CliError, Result};
use crate::nbd;
use crate::remote::tls::{self, Sock, TlsStream};
use raid_core::array::{Array, BLOCK};
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
});
conn!(TlsStream {});

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

/// How long a client may take over the TLS handshake.
const TLS_HANDSHAKE: Duration = Duration::from_secs(10);
/// How long a client may stay silent while it negotiates (each read).
const NEGOTIATION: Duration = Duration::from_secs(30);
/// Options one client may send before it must pick an export.
const MAX_OPTIONS: usize = 256;
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

/// Whether structured replies (and with them block status) are offered:
/// yes, unless RAIDCTL_NBD_STRUCTURED_REPLIES=off in the daemon's
/// environment (nbdkit's `--no-sr`). A libnbd client spends about a
/// quarter more CPU on a structured read reply than on a simple one (an
/// extra receive per reply): where such a client shares the machine's
/// CPUs and never copies the array (block status is what structured
/// replies bring), simple replies serve it more reads.
fn offers_structured_replies() -> bool {
    std::env::var("RAIDCTL_NBD_STRUCTURED_REPLIES").map_or(true, |v| v != "off")
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
                    if let Err(e) = serve(c, array, &engine, tls, &any, &flag) {
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

fn read_u32(c: &mut dyn Conn) -> io::Result<u32> {
    let mut b = [0u8; 4];
    c.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(c: &mut dyn Conn) -> io::Result<u64> {
    let mut b = [0u8; 8];
    c.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn option_reply(c: &mut dyn Conn, opt: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&nbd::REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    c.write_all(&b)
}

fn protocol_error(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// The transmission flags and block sizes of an array export.
fn tflags(a: &Array) -> u16 {
    // An array beyond its redundancy takes no writes.
    let ro = if a.state() == raid_core::array::ArrayState::Failed {
        nbd::TFLAG_READ_ONLY
    } else {
        0
    };
    // Flush flushes every member, so a flush on any connection covers the
    // writes completed on all of them: multi-conn is safe.
    ro | nbd::TFLAG_HAS_FLAGS
        | nbd::TFLAG_SEND_FLUSH
        | nbd::TFLAG_SEND_FUA
        | nbd::TFLAG_SEND_TRIM
        | nbd::TFLAG_SEND_WRITE_ZEROES
        | nbd::TFLAG_CAN_MULTI_CONN
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

fn preferred_block(a: &Array) -> u32 {
    let g = a.geometry();
    let stripe = g.stripe_data_bytes();
    let p = if stripe.is_power_of_two() {
        stripe
    } else {
        g.chunk
    };
    p.min(nbd::MAX_REQUEST as u64) as u32
}

/// The id of the one meta context served (`base:allocation`), as a
/// client that selects it is told.
pub(super) const ALLOCATION_CONTEXT: u32 = 1;

/// Handshake, then transmission. With `tls`, the client must start TLS
/// (NBD_OPT_STARTTLS) before any other option; the rest of the handshake
/// and the transmission run inside it.
fn serve(
    sock: Sock,
    array: Arc<Array>,
    engine: &Engine,
    tls: Option<Arc<rustls::ServerConfig>>,
    any: &crate::any_bytes::AnyBytes,
    negotiating: &AtomicBool,
) -> io::Result<()> {
    // The socket itself, until TLS (when required) is started on it.
    let mut plain = match tls {
        Some(_) => Some(sock.try_clone()?),
        None => None,
    };
    // A client silent this long while it negotiates is let go; cleared
    // for transmission, where a client may be idle as long as it likes.
    let ctl = sock.try_clone()?;
    ctl.set_read_timeout(Some(NEGOTIATION))?;
    let mut options = 0;
    // Whether the client asked for the block size (NBD_INFO_BLOCK_SIZE):
    // if not, requests not aligned to it are served (`sub_block`).
    let mut asked_block_size = false;
    // The transmission flags last told to the client (GO's, or
    // EXPORT_NAME's): what it was offered is what it is held to.
    let mut flags_sent: u16;
    // Structured replies (NBD_OPT_STRUCTURED_REPLY), and the block status
    // context selected by the last NBD_OPT_SET_META_CONTEXT.
    let mut negotiated = transmission::Negotiated::default();
    let mut c: Box<dyn Conn> = Box::new(sock);
    let mut hello = Vec::new();
    hello.extend_from_slice(&nbd::NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&nbd::IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(nbd::FLAG_FIXED_NEWSTYLE | nbd::FLAG_NO_ZEROES).to_be_bytes());
    c.write_all(&hello)?;
    let cflags = read_u32(c.as_mut())?;
    if cflags & nbd::FLAG_C_FIXED_NEWSTYLE == 0 {
        return Err(protocol_error("client does not speak fixed newstyle"));
    }
    // As nbdkit does: a flag this server does not know asks for a protocol
    // it does not speak.
    if cflags & !(nbd::FLAG_C_FIXED_NEWSTYLE | nbd::FLAG_C_NO_ZEROES) != 0 {
        return Err(protocol_error(format!("unknown client flags {cflags:#x}")));
    }
    let no_zeroes = cflags & nbd::FLAG_C_NO_ZEROES != 0;
    let size = array.capacity();
    let name = array.name().to_string();
    loop {
        if read_u64(c.as_mut())? != nbd::IHAVEOPT {
            return Err(protocol_error("bad option magic"));
        }
        options += 1;
        if options > MAX_OPTIONS {
            return Err(protocol_error("too many options"));
        }
        let opt = read_u32(c.as_mut())?;
        let len = read_u32(c.as_mut())?;
        if len > nbd::MAX_OPTION {
            return Err(protocol_error("option too long"));
        }
        let mut data = vec![0u8; len as usize];
        c.read_exact(&mut data)?;
        // TLS required and not started: only STARTTLS and ABORT are heard.
        if tls.is_some() && plain.is_some() && opt != nbd::OPT_STARTTLS && opt != nbd::OPT_ABORT {
            if opt == nbd::OPT_EXPORT_NAME {
                // No error reply exists for this option: the spec says close.
                return Err(protocol_error("EXPORT_NAME before STARTTLS"));
            }
            option_reply(
                c.as_mut(),
                opt,
                nbd::REP_ERR_TLS_REQD,
                b"TLS is required: STARTTLS first",
            )?;
            continue;
        }
        match opt {
            nbd::OPT_STARTTLS => {
                let (Some(cfg), Some(_)) = (&tls, &plain) else {
                    let why: &[u8] = if tls.is_none() {
                        b"TLS is not set up on this export"
                    } else {
                        b"TLS is already on"
                    };
                    let kind = if tls.is_none() {
                        nbd::REP_ERR_UNSUP
                    } else {
                        nbd::REP_ERR_INVALID
                    };
                    option_reply(c.as_mut(), opt, kind, why)?;
                    continue;
                };
                if !data.is_empty() {
                    option_reply(
                        c.as_mut(),
                        opt,
                        nbd::REP_ERR_INVALID,
                        b"STARTTLS takes no data",
                    )?;
                    continue;
                }
                option_reply(c.as_mut(), opt, nbd::REP_ACK, &[])?;
                // What was negotiated in the clear does not hold inside
                // TLS (the spec's rule).
                negotiated = transmission::Negotiated::default();
                let sock = plain.take().expect("checked above");
                let conn = rustls::ServerConnection::new(cfg.clone()).map_err(io::Error::other)?;
                // Said at warning level: a client refused for its
                // certificate gets only an alert, so the reason is here.
                let t = TlsStream::handshake(conn, sock, TLS_HANDSHAKE).map_err(|e| {
                    tracing::warn!("nbd: a client's TLS handshake failed: {e}");
                    e
                })?;
                c = Box::new(t);
            }
            nbd::OPT_EXPORT_NAME => {
                let want = String::from_utf8_lossy(&data);
                if !want.is_empty() && want != name {
                    return Err(protocol_error(format!("unknown export '{want}'")));
                }
                let mut b = Vec::new();
                b.extend_from_slice(&size.to_be_bytes());
                flags_sent = tflags(&array);
                b.extend_from_slice(&flags_sent.to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                c.write_all(&b)?;
                break;
            }
            nbd::OPT_ABORT => {
                option_reply(c.as_mut(), opt, nbd::REP_ACK, &[])?;
                return Ok(());
            }
            nbd::OPT_LIST => {
                if !data.is_empty() {
                    option_reply(c.as_mut(), opt, nbd::REP_ERR_INVALID, b"LIST takes no data")?;
                    continue;
                }
                let mut d = (name.len() as u32).to_be_bytes().to_vec();
                d.extend_from_slice(name.as_bytes());
                option_reply(c.as_mut(), opt, nbd::REP_SERVER, &d)?;
                option_reply(c.as_mut(), opt, nbd::REP_ACK, &[])?;
            }
            nbd::OPT_STRUCTURED_REPLY => {
                if !offers_structured_replies() {
                    option_reply(
                        c.as_mut(),
                        opt,
                        nbd::REP_ERR_UNSUP,
                        b"structured replies are switched off here",
                    )?;
                    continue;
                }
                if !data.is_empty() {
                    option_reply(
                        c.as_mut(),
                        opt,
                        nbd::REP_ERR_INVALID,
                        b"STRUCTURED_REPLY takes no data",
                    )?;
                    continue;
                }
                negotiated.structured = true;
                option_reply(c.as_mut(), opt, nbd::REP_ACK, &[])?;
            }
            nbd::OPT_LIST_META_CONTEXT | nbd::OPT_SET_META_CONTEXT => {
                let set = opt == nbd::OPT_SET_META_CONTEXT;
                if set {
                    // Each SET replaces the one before, even one that fails.
                    negotiated.block_status = false;
                }
                let (kind, why) = match nbd::parse_meta_context_request(&data) {
                    None => (
                        nbd::REP_ERR_INVALID,
                        "malformed meta context request".into(),
                    ),
                    Some(_) if set && !negotiated.structured => (
                        nbd::REP_ERR_INVALID,
                        "structured replies first (NBD_OPT_STRUCTURED_REPLY)".into(),
                    ),
                    Some((want, _)) if !want.is_empty() && want != name => {
                        (nbd::REP_ERR_UNKNOWN, format!("no export '{want}'"))
                    }
                    Some((_, queries)) => {
                        let wanted =
                            |q: &String| q == nbd::CONTEXT_ALLOCATION || (!set && q == "base:");
                        // LIST with no query lists every context; SET
                        // with none selects none.
                        if queries.iter().any(wanted) || (!set && queries.is_empty()) {
                            let id = if set { ALLOCATION_CONTEXT } else { 0 };
                            let mut d = id.to_be_bytes().to_vec();
                            d.extend_from_slice(nbd::CONTEXT_ALLOCATION.as_bytes());
                            option_reply(c.as_mut(), opt, nbd::REP_META_CONTEXT, &d)?;
                            negotiated.block_status |= set;
                        }
                        (nbd::REP_ACK, String::new())
                    }
                };
                option_reply(c.as_mut(), opt, kind, why.as_bytes())?;
            }
            nbd::OPT_INFO | nbd::OPT_GO => {
                let Some((want, infos)) = nbd::parse_info_request(&data) else {
                    option_reply(
                        c.as_mut(),
                        opt,
                        nbd::REP_ERR_INVALID,
                        b"malformed INFO/GO request",
                    )?;
                    continue;
                };
                if !want.is_empty() && want != name {
                    option_reply(
                        c.as_mut(),
                        opt,
                        nbd::REP_ERR_UNKNOWN,
                        format!("no export '{want}'").as_bytes(),
                    )?;
                    continue;
                }
                asked_block_size |= infos.contains(&nbd::INFO_BLOCK_SIZE);
                let mut e = nbd::INFO_EXPORT.to_be_bytes().to_vec();
                e.extend_from_slice(&size.to_be_bytes());
                flags_sent = tflags(&array);
                e.extend_from_slice(&flags_sent.to_be_bytes());
                option_reply(c.as_mut(), opt, nbd::REP_INFO, &e)?;
                let mut bs = nbd::INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                bs.extend_from_slice(&(BLOCK as u32).to_be_bytes());
                bs.extend_from_slice(&preferred_block(&array).to_be_bytes());
                bs.extend_from_slice(&nbd::MAX_REQUEST.to_be_bytes());
                option_reply(c.as_mut(), opt, nbd::REP_INFO, &bs)?;
                if infos.contains(&nbd::INFO_NAME) {
                    let mut n = nbd::INFO_NAME.to_be_bytes().to_vec();
                    n.extend_from_slice(name.as_bytes());
                    option_reply(c.as_mut(), opt, nbd::REP_INFO, &n)?;
                }
                option_reply(c.as_mut(), opt, nbd::REP_ACK, &[])?;
                if opt == nbd::OPT_GO {
                    break;
                }
            }
            _ => option_reply(c.as_mut(), opt, nbd::REP_ERR_UNSUP, b"unsupported option")?,
        }
    }
    ctl.set_read_timeout(None)?;
    // Out of the handshake, out of reach of `accept_loop`'s eviction;
    // unless it was evicted just now.
    if negotiating
        .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(protocol_error(
            "closed while negotiating: every connection place was taken",
        ));
    }
    let read_only = flags_sent & nbd::TFLAG_READ_ONLY != 0;
    transmission::transmission(
        c,
        array,
        engine,
        (!asked_block_size, read_only),
        negotiated,
        any,
    )
}
