//! The control protocol between the CLI and the daemon: one JSON object per
//! line over a Unix socket (mode 0600), a request then its response. Schema
//! in docs/operations.md.

use crate::error::{code, CliError, Result};
use crate::status::ArrayStatus;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Ping,
    /// Assemble and serve an array. `members` overrides the recorded ones
    /// (an array moved to another host).
    Start {
        name: String,
        #[serde(default)]
        members: Vec<PathBuf>,
        #[serde(default)]
        nbd: Option<String>,
        /// TLS for a TCP export: the certificates' directory.
        #[serde(default)]
        tls: Option<PathBuf>,
        /// Clients must present a certificate signed by the directory's CA.
        #[serde(default)]
        tls_verify_peer: bool,
        /// Serve a non-loopback TCP address without TLS.
        #[serde(default)]
        insecure: bool,
        /// cpu, gpu or auto; None keeps the recorded choice.
        #[serde(default)]
        parity: Option<String>,
        /// Assemble from members marked failed or stale (md's
        /// `--assemble --force`).
        #[serde(default)]
        force: bool,
        /// `members` were typed by the operator (`--members`): every slot
        /// in sync must be among them, since one left out by mistake would
        /// start the array degraded. Not for a scan's or the config's
        /// list, where a member not found is a drive gone.
        #[serde(default)]
        listed: bool,
    },
    Stop {
        name: String,
        /// Stop even where it loses the array's data (member files
        /// deleted while it ran, beyond its redundancy).
        #[serde(default)]
        force: bool,
    },
    Status {
        #[serde(default)]
        name: Option<String>,
    },
    Fail {
        name: String,
        member: PathBuf,
        /// Fail it even if the array then loses its data.
        #[serde(default)]
        force: bool,
    },
    Remove {
        name: String,
        member: PathBuf,
    },
    Add {
        name: String,
        member: PathBuf,
    },
    ReAdd {
        name: String,
        member: PathBuf,
    },
    Replace {
        name: String,
        old: PathBuf,
        new: PathBuf,
    },
    /// FUSE-mount the array as one file, optionally with a loop device on it.
    /// Rate limits of background work, bytes per second (0: none).
    Rate {
        name: String,
        #[serde(default)]
        rebuild: Option<u64>,
        #[serde(default)]
        scrub: Option<u64>,
    },
    Mount {
        name: String,
        #[serde(default)]
        dir: Option<PathBuf>,
        #[serde(default)]
        loop_dev: bool,
    },
    Unmount {
        name: String,
    },
    /// I/O counters of one array or all (`iostat`).
    Stats {
        #[serde(default)]
        name: Option<String>,
    },
    /// Check redundancy against data; with `repair`, fix what disagrees.
    Scrub {
        name: String,
        #[serde(default)]
        repair: bool,
        /// Answer at once; the scrub goes on in the background.
        #[serde(default)]
        background: bool,
        /// Stop the running scrub.
        #[serde(default)]
        cancel: bool,
    },
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    /// On failure: the message and the exit code the CLI should use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arrays: Vec<ArrayStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub: Option<ScrubResult>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub io: Vec<ArrayIo>,
}

/// One array's I/O counters at one instant (see raid_core::stats).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArrayIo {
    pub name: String,
    /// When they were read: nanoseconds on the daemon's monotonic clock,
    /// so intervals between two answers are exact.
    pub at_ns: u64,
    pub io: raid_core::stats::ArrayIoSnapshot,
}

/// What `scrub` reports (also its JSON form).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ScrubResult {
    pub array: String,
    pub repair: bool,
    /// Stripes (RAID5/6) or mirrored chunks (RAID1/10) checked.
    pub rows_checked: u64,
    /// What `rows_checked` counts: "stripes" or "mirrored chunks" (empty
    /// from a daemon before it).
    #[serde(default)]
    pub rows_are: String,
    pub bytes_read: u64,
    pub mismatches: Vec<ScrubMismatch>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScrubMismatch {
    /// Stripe (RAID5/6) or logical chunk (RAID1/10).
    pub stripe: u64,
    /// The slot found to hold the wrong chunk (RAID6), or the mirror copy
    /// that differs from the first; null where nothing says which chunk
    /// is wrong (RAID5, more than one chunk wrong).
    pub slot: Option<usize>,
    pub member: Option<String>,
    pub what: String,
    pub repaired: bool,
    /// Whether the wrong chunk was found (RAID6, one chunk wrong); where
    /// not, a repair rewrites the redundancy from the data.
    #[serde(default)]
    pub located: bool,
    /// More chunks were wrong than the level can locate (RAID6): a repair
    /// made the parity agree with data that may itself be wrong.
    #[serde(default)]
    pub unresolved: bool,
}

impl Response {
    pub fn ok(message: impl Into<String>) -> Response {
        Response {
            ok: true,
            message: Some(message.into()),
            ..Default::default()
        }
    }
    pub fn err(e: &CliError) -> Response {
        Response {
            ok: false,
            error: Some(e.msg.clone()),
            code: Some(e.code),
            ..Default::default()
        }
    }
    pub fn into_result(self) -> Result<Response> {
        if self.ok {
            Ok(self)
        } else {
            Err(CliError::new(
                self.code.unwrap_or(code::FAILED),
                self.error.unwrap_or_else(|| "daemon error".into()),
            ))
        }
    }
}

/// Sends one request; None when no daemon listens on `socket`.
pub fn call(socket: &Path, req: &Request) -> Result<Option<Response>> {
    let stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        // A daemon is there, but not for this user: say so, never pretend
        // no array runs.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(CliError::daemon(format!(
                "permission denied on the daemon's socket {}: run raidctl as root (or as the user that runs the daemon)",
                socket.display()
            )))
        }
        Err(_) => return Ok(None),
    };
    stream.set_read_timeout(Some(Duration::from_secs(600))).ok();
    let mut w = &stream;
    let line = serde_json::to_string(req).expect("request serialises");
    w.write_all(line.as_bytes())
        .and_then(|_| w.write_all(b"\n"))
        .map_err(|e| {
            CliError::daemon(format!(
                "cannot talk to the daemon at {}: {e}",
                socket.display()
            ))
        })?;
    let mut answer = String::new();
    match BufReader::new(&stream).read_line(&mut answer) {
        // Closed before a word: a daemon exiting idle, which answers every
        // request it accepted, had not accepted this one. Same as no daemon.
        Ok(0) => return Ok(None),
        Err(e) if answer.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {
            return Ok(None)
        }
        Ok(_) => {}
        Err(e) => {
            return Err(CliError::daemon(format!(
                "no answer from the daemon at {}: {e}",
                socket.display()
            )))
        }
    }
    let resp: Response = serde_json::from_str(&answer).map_err(|e| {
        CliError::daemon(format!(
            "the daemon answered something unreadable ({e}): {answer:?}"
        ))
    })?;
    Ok(Some(resp))
}
