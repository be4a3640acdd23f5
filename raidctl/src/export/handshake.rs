//! The NBD handshake of one connection (fixed newstyle): TLS where the
//! export requires it, the options (export list, info, structured replies,
//! meta contexts), then the transmission phase with what was negotiated.

use super::structured::{Negotiated, ALLOCATION_CONTEXT};
use super::{on_shard, transmission};
use super::{protocol_error, Conn};
use crate::nbd::{self, read_u32, read_u64};
use crate::remote::tls::{Sock, TlsStream};
use raid_core::array::{Array, BLOCK};
use raid_core::shard::Engine;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a client may take over the TLS handshake.
const TLS_HANDSHAKE: Duration = Duration::from_secs(10);
/// How long a client may stay silent while it negotiates (each read).
const NEGOTIATION: Duration = Duration::from_secs(30);
/// Options one client may send before it must pick an export.
const MAX_OPTIONS: usize = 256;
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

fn option_reply(c: &mut dyn Conn, opt: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&nbd::REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    c.write_all(&b)
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

/// Handshake, then transmission. With `tls`, the client must start TLS
/// (NBD_OPT_STARTTLS) before any other option; the rest of the handshake
/// and the transmission run inside it.
pub(super) fn serve(
    sock: Sock,
    array: Arc<Array>,
    engine: &Engine,
    tls: Option<Arc<rustls::ServerConfig>>,
    any: &Arc<crate::any_bytes::AnyBytes>,
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
    let mut negotiated = Negotiated::default();
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
                negotiated = Negotiated::default();
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
                let (kind, why): (u32, &[u8]) = if !offers_structured_replies() {
                    (
                        nbd::REP_ERR_UNSUP,
                        b"structured replies are switched off here (RAIDCTL_NBD_STRUCTURED_REPLIES=off): use simple replies",
                    )
                } else if !data.is_empty() {
                    (nbd::REP_ERR_INVALID, b"STRUCTURED_REPLY takes no data")
                } else {
                    negotiated.structured = true;
                    (nbd::REP_ACK, b"")
                };
                option_reply(c.as_mut(), opt, kind, why)?;
            }
            nbd::OPT_LIST_META_CONTEXT | nbd::OPT_SET_META_CONTEXT => {
                meta_context(c.as_mut(), opt, &data, &name, &mut negotiated)?;
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
    let rules = (!asked_block_size, read_only);
    // Served on a shard, TLS or not, unless told otherwise.
    if on_shard::wanted(engine) {
        let any = any.clone();
        return on_shard::transmission(c.into_stream(), array, engine, rules, negotiated, any);
    }
    transmission::transmission(c, array, engine, rules, negotiated, any)
}

/// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT: the one
/// context served, `base:allocation`, listed or selected (SET needs
/// structured replies first, and replaces what an earlier SET selected,
/// even where it fails), then the option's last reply.
fn meta_context(
    c: &mut dyn Conn,
    opt: u32,
    data: &[u8],
    name: &str,
    negotiated: &mut Negotiated,
) -> io::Result<()> {
    let set = opt == nbd::OPT_SET_META_CONTEXT;
    if set {
        negotiated.block_status = false;
    }
    let (kind, why) = match nbd::parse_meta_context_request(data) {
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
            let wanted = |q: &String| q == nbd::CONTEXT_ALLOCATION || (!set && q == "base:");
            // LIST with no query lists every context; SET with none
            // selects none.
            if queries.iter().any(wanted) || (!set && queries.is_empty()) {
                let id = if set { ALLOCATION_CONTEXT } else { 0 };
                let mut d = id.to_be_bytes().to_vec();
                d.extend_from_slice(nbd::CONTEXT_ALLOCATION.as_bytes());
                option_reply(c, opt, nbd::REP_META_CONTEXT, &d)?;
                negotiated.block_status |= set;
            }
            (nbd::REP_ACK, String::new())
        }
    };
    option_reply(c, opt, kind, why.as_bytes())
}
