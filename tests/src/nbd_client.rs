//! A raw NBD client for the tests that speak the protocol byte by byte:
//! the handshakes (old EXPORT_NAME, GO, structured replies asked for),
//! requests, and simple and structured replies.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// A raw NBD client: fixed newstyle handshake for export `name`; returns
/// the connection and the export's size.
pub fn nbd_connect(sock: &Path, name: &str) -> (UnixStream, u64) {
    let mut c = UnixStream::connect(sock).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    nbd_hello(&mut c);
    let size = nbd_export_name(&mut c, name);
    (c, size)
}

/// The server's greeting read, and the client's flags sent: fixed
/// newstyle, no zeroes. Options follow.
pub fn nbd_hello(c: &mut (impl Read + Write)) {
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    c.write_all(&3u32.to_be_bytes()).unwrap();
}

/// NBD_OPT_EXPORT_NAME for `name`, which ends the options: the export's
/// size.
pub fn nbd_export_name(c: &mut (impl Read + Write), name: &str) -> u64 {
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&1u32.to_be_bytes()); // EXPORT_NAME
    opt.extend_from_slice(&(name.len() as u32).to_be_bytes());
    opt.extend_from_slice(name.as_bytes());
    c.write_all(&opt).unwrap();
    let mut info = [0u8; 10];
    c.read_exact(&mut info).unwrap();
    u64::from_be_bytes(info[..8].try_into().unwrap())
}

/// A raw NBD client negotiating with NBD_OPT_GO, asking for the block
/// size or not (a client that does not ask may send requests on any byte);
/// returns the connection and the export's size.
pub fn nbd_go(sock: &Path, name: &str, ask_block_size: bool) -> (UnixStream, u64) {
    nbd_go_with(sock, name, ask_block_size, false)
}

/// `nbd_go`, having first asked for structured replies
/// (NBD_OPT_STRUCTURED_REPLY) where `structured`, which the server must
/// grant: read replies then come as chunks (`nbd_chunk`).
pub fn nbd_go_with(
    sock: &Path,
    name: &str,
    ask_block_size: bool,
    structured: bool,
) -> (UnixStream, u64) {
    let mut c = UnixStream::connect(sock).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    c.write_all(&3u32.to_be_bytes()).unwrap();
    if structured {
        let mut opt = b"IHAVEOPT".to_vec();
        opt.extend_from_slice(&8u32.to_be_bytes()); // STRUCTURED_REPLY
        opt.extend_from_slice(&0u32.to_be_bytes());
        c.write_all(&opt).unwrap();
        let (kind, _) = option_reply(&mut c);
        assert_eq!(kind, 1, "structured replies refused");
    }
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    let infos: &[u16] = if ask_block_size { &[3] } else { &[] };
    data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        data.extend_from_slice(&i.to_be_bytes());
    }
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&7u32.to_be_bytes()); // GO
    opt.extend_from_slice(&(data.len() as u32).to_be_bytes());
    opt.extend_from_slice(&data);
    c.write_all(&opt).unwrap();
    let mut size = 0;
    loop {
        match option_reply(&mut c) {
            (1, _) => return (c, size), // ACK
            (3, d) if d[..2] == [0, 0] => size = u64::from_be_bytes(d[2..10].try_into().unwrap()),
            (3, _) => {}
            (kind, _) => panic!("GO refused: reply {kind:#x}"),
        }
    }
}

/// One option reply: its type and its data.
pub fn option_reply(c: &mut impl Read) -> (u32, Vec<u8>) {
    let mut h = [0u8; 20];
    c.read_exact(&mut h).unwrap();
    let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut d = vec![0u8; len];
    c.read_exact(&mut d).unwrap();
    (kind, d)
}

/// One request header (a write's payload follows it, sent by the caller).
pub fn nbd_request(
    c: &mut impl std::io::Write,
    kind: u16,
    flags: u16,
    cookie: u64,
    offset: u64,
    len: u32,
) {
    let mut r = 0x2560_9513u32.to_be_bytes().to_vec();
    r.extend_from_slice(&flags.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.extend_from_slice(&cookie.to_be_bytes());
    r.extend_from_slice(&offset.to_be_bytes());
    r.extend_from_slice(&len.to_be_bytes());
    c.write_all(&r).unwrap();
}

/// One simple reply's header: (error, cookie); None once the server closed.
pub fn nbd_reply(c: &mut impl std::io::Read) -> Option<(u32, u64)> {
    let mut h = [0u8; 16];
    c.read_exact(&mut h).ok()?;
    assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x6744_6698);
    Some((
        u32::from_be_bytes(h[4..8].try_into().unwrap()),
        u64::from_be_bytes(h[8..].try_into().unwrap()),
    ))
}

/// One structured reply chunk, as the NBD spec lays it out.
#[derive(Debug)]
pub struct Chunk {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    /// What follows the chunk's header.
    pub payload: Vec<u8>,
}

/// The chunk types a read's reply carries.
pub const CHUNK_OFFSET_DATA: u16 = 1;
pub const CHUNK_OFFSET_HOLE: u16 = 2;
/// The flag of a reply's last chunk.
pub const CHUNK_DONE: u16 = 1;

/// One structured reply chunk (after `nbd_go_with(.., true)`).
pub fn nbd_chunk(c: &mut impl Read) -> Chunk {
    let mut h = [0u8; 20];
    c.read_exact(&mut h).unwrap();
    assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x668e_33ef);
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut payload = vec![0u8; len];
    c.read_exact(&mut payload).unwrap();
    Chunk {
        flags: u16::from_be_bytes(h[4..6].try_into().unwrap()),
        kind: u16::from_be_bytes(h[6..8].try_into().unwrap()),
        cookie: u64::from_be_bytes(h[8..16].try_into().unwrap()),
        payload,
    }
}
