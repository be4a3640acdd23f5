//! Members on other hosts: NBD URIs as member names, the NBD client that
//! serves them to the array, and the TLS both it and the export speak.

mod cert_dates;
pub mod client;
mod conn;
mod handshake;
mod structured;
pub mod tls;
pub mod uri;

use raid_core::member::{DeviceKey, FileMember, MemberRef};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use uri::looks_like_uri;

/// How long an I/O may take, reconnections included, before the member is
/// given up (ms; `[remote] timeout_seconds`).
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(30_000);

/// Sets it (the daemon, from its configuration; at least 100 ms).
pub fn set_timeout(d: Duration) {
    TIMEOUT_MS.store(d.as_millis().max(100) as u64, Ordering::Relaxed);
}

/// Whether network members ask their servers where their holes are
/// (`[remote] trust_holes`): off by default, see `RemoteConfig`.
static TRUST_HOLES: AtomicBool = AtomicBool::new(false);

/// Sets it (the daemon, from its configuration).
pub fn set_trust_holes(on: bool) {
    TRUST_HOLES.store(on, Ordering::Relaxed);
}

pub(crate) fn trust_holes() -> bool {
    TRUST_HOLES.load(Ordering::Relaxed)
}

/// What the member client and its handshake give an I/O or a connect.
pub fn timeout() -> Duration {
    Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed))
}

/// Opens a member by the name the operator gave: an NBD URI, or a path.
pub fn open_member(p: &Path) -> io::Result<MemberRef> {
    match p.to_str().filter(|s| looks_like_uri(s)) {
        Some(u) => Ok(Arc::new(client::NbdMember::open(u)?)),
        None => Ok(Arc::new(FileMember::open(p)?)),
    }
}

/// Opens a device to read its metadata, by the name the operator gave:
/// a file or block device read-only (`FileMember::inspect`: safe on a
/// member in use), or an NBD export, given up after a few seconds (a
/// command that looks must not hang on a host that is down).
pub fn inspect_member(p: &Path) -> io::Result<MemberRef> {
    match p.to_str().filter(|s| looks_like_uri(s)) {
        Some(u) => Ok(Arc::new(client::NbdMember::open_within(
            u,
            std::time::Duration::from_secs(3),
        )?)),
        None => Ok(Arc::new(FileMember::inspect(p)?)),
    }
}

/// Whether `p` names a network member.
pub fn is_remote(p: &Path) -> bool {
    p.to_str().is_some_and(looks_like_uri)
}

/// The device key of what `p` names: for a URI, the export it names
/// (without connecting), else the file or block device.
pub fn key_of(p: &Path) -> io::Result<DeviceKey> {
    if let Some(u) = p.to_str().filter(|s| looks_like_uri(s)) {
        let u =
            uri::NbdUri::parse(u).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        return Ok(client::key(&u));
    }
    DeviceKey::of_path(p)
}
