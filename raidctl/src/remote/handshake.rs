//! Reaching an NBD export: connect, fixed-newstyle negotiation (STARTTLS
//! first when TLS is asked, then GO with block sizes), and the errors a
//! server's refusals become.

use super::conn::{Conn, Replies};
use super::timeout;
use super::tls::{self, Sock, Stream, TlsStream};
use super::uri::{Addr, NbdUri};
use crate::nbd;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// The longest a handshake step may take.
pub(super) const HANDSHAKE: Duration = Duration::from_secs(10);

/// What the export told us in the handshake.
#[derive(Clone, Copy, Debug)]
pub(super) struct Export {
    pub(super) size: u64,
    pub(super) flags: u16,
    /// Largest payload the server takes in one request.
    pub(super) max_payload: usize,
}

/// Connects, negotiates (STARTTLS first when asked), and starts the
/// connection's reader.
pub(super) fn connect(
    uri: &NbdUri,
    tls: Option<&Arc<rustls::ClientConfig>>,
    limit: Duration,
) -> io::Result<(Arc<Conn>, Export)> {
    // A read past the socket's timeout is EAGAIN ("Resource temporarily
    // unavailable, os error 11"), which tells an operator nothing.
    negotiate(uri, tls, limit).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock => io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no answer within {:.1} s: the server took the connection but did not go on with the NBD handshake (overloaded, hung, or not an NBD server)",
                limit.as_secs_f64()
            ),
        ),
        _ => e,
    })
}

fn negotiate(
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
    // The first replies read under TLS: a server that wants a client
    // certificate ends the session at the first (TLS 1.3 refuses one
    // after the handshake).
    let tls_hint = |e: io::Error| match (&uri.tls, tls) {
        (Some(t), Some(_)) => {
            let dir = t
                .certificates
                .as_ref()
                .map_or("the tls-certificates directory".into(), |d| {
                    d.display().to_string()
                });
            io::Error::new(
                e.kind(),
                format!("the server ended the TLS session ({e}): it may want a client certificate: client-cert.pem and client-key.pem in {dir}"),
            )
        }
        _ => e,
    };
    let replies = structured_replies(&mut s, &uri.export).map_err(tls_hint)?;
    // GO: the export by name, with its block sizes.
    let mut d = (uri.export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(uri.export.as_bytes());
    d.extend_from_slice(&1u16.to_be_bytes());
    d.extend_from_slice(&nbd::INFO_BLOCK_SIZE.to_be_bytes());
    send_option(&mut s, nbd::OPT_GO, &d)?;
    let mut size_flags = None;
    let mut max_payload = nbd::MAX_REQUEST as usize;
    loop {
        let (kind, data) = option_reply(&mut s, nbd::OPT_GO).map_err(tls_hint)?;
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
    let conn = Conn::start(s, replies)?;
    Ok((
        conn,
        Export {
            size,
            flags,
            max_payload,
        },
    ))
}

/// Asks for structured replies and, where the server takes them, the
/// `base:allocation` context (where the member's holes are). A refusal of
/// either is no error: the member then says it cannot tell where its
/// holes are, as before.
fn structured_replies(s: &mut Stream, export: &str) -> io::Result<Replies> {
    send_option(s, nbd::OPT_STRUCTURED_REPLY, &[])?;
    let (kind, _) = option_reply(s, nbd::OPT_STRUCTURED_REPLY)?;
    if kind != nbd::REP_ACK {
        return Ok(Replies::default());
    }
    let structured = |allocation| Replies {
        structured: true,
        allocation,
    };
    let query = nbd::CONTEXT_ALLOCATION.as_bytes();
    let d = nbd::meta_context_request(export, &[nbd::CONTEXT_ALLOCATION]);
    send_option(s, nbd::OPT_SET_META_CONTEXT, &d)?;
    let mut id = None;
    loop {
        let (kind, data) = option_reply(s, nbd::OPT_SET_META_CONTEXT)?;
        match kind {
            nbd::REP_META_CONTEXT if data.len() >= 4 && &data[4..] == query => {
                id = Some(u32::from_be_bytes(data[0..4].try_into().unwrap()));
            }
            nbd::REP_ACK => return Ok(structured(id)),
            // Refused (an error reply ends the option).
            k if k & nbd::REP_ERR != 0 => return Ok(structured(None)),
            // Another context than asked for, or a reply not known here:
            // not ours to read, and the option's replies go on.
            _ => {}
        }
    }
}

pub(super) fn send_option(s: &mut Stream, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut b = nbd::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b)
}

pub(super) fn option_reply(s: &mut Stream, opt: u32) -> io::Result<(u32, Vec<u8>)> {
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

pub(super) fn option_error(what: &str, kind: u32, data: &[u8]) -> io::Error {
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
