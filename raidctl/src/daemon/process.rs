//! The daemon as a process: the lock that makes it the only one for its
//! state directory, its log file (reopened on SIGHUP), and its socket.

use crate::error::{CliError, Result};
use crate::registry::StateDir;
use std::path::Path;

/// Takes STATE_DIR/daemon.lock exclusively for the daemon's lifetime.
/// `wait`: a daemon started on demand (`raidctl start`) may find the one
/// before it still holding the lock as it exits (idle, its socket gone
/// already): it waits for it, up to 30 s, unless a daemon answers on the
/// socket meanwhile (then that one serves).
pub(super) fn lock_daemon(st: &StateDir, wait: bool) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let p = st.root.join("daemon.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(|e| CliError::failed(format!("cannot open {}: {e}", p.display())))?;
    let t = std::time::Instant::now();
    // SAFETY: plain syscall on an fd we own.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let served = std::os::unix::net::UnixStream::connect(st.socket()).is_ok();
        if !wait || served || t.elapsed() > std::time::Duration::from_secs(30) {
            return Err(CliError::refused(format!(
                "a daemon already serves {} (it holds {})",
                st.root.display(),
                p.display()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(f)
}

/// Whether the process's stderr is the file at `path` (same device and
/// inode).
fn stderr_is(path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: fstat on fd 2, which the process owns for its lifetime, into
    // a zeroed stat buffer it fills.
    let mut cur: libc::stat = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::fstat(2, &mut cur) } == 0;
    ok && std::fs::metadata(path).is_ok_and(|m| m.ino() == cur.st_ino && m.dev() == cur.st_dev)
}

/// Whether the daemon logs to its state folder's `daemon.log` (started
/// in the background by the CLI, which points its output there), asked
/// once at its start: a daemon in the foreground whose output an operator
/// sent elsewhere (a terminal, the journal, a file of their own) keeps it
/// there.
pub(super) fn logs_to_state_log(st: &StateDir) -> bool {
    stderr_is(&st.log())
}

/// After SIGHUP: if the daemon logs to its log file (`logs_to_state_log`
/// at its start), reopens that file, so a rotated log is let go. A daemon
/// logging anywhere else has nothing to reopen, and keeps logging there.
pub(super) fn reopen_log(st: &StateDir, to_state_log: bool) {
    use std::os::fd::AsRawFd;
    if !to_state_log {
        tracing::info!("SIGHUP: logging to a terminal, the journal or a file of the operator's, not daemon.log; nothing to reopen");
        return;
    }
    let same = stderr_is(&st.log());
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(st.log())
    {
        Ok(f) => {
            // SAFETY: dup2 onto stdout and stderr; `f` is open and closed
            // after, the duplicates stay.
            unsafe {
                libc::dup2(f.as_raw_fd(), 1);
                libc::dup2(f.as_raw_fd(), 2);
            }
            tracing::info!(log = %st.log().display(), rotated = !same, "SIGHUP: log reopened");
        }
        Err(e) => tracing::error!(log = %st.log().display(), "SIGHUP: cannot reopen the log: {e}"),
    }
}

/// Removes the control socket only if it is still the one this daemon
/// created: a new daemon may have taken the path over meanwhile.
pub(super) fn remove_own_socket(sock: &Path, ino: u64) {
    let same =
        std::fs::metadata(sock).is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == ino);
    if same {
        let _ = std::fs::remove_file(sock);
    }
}
