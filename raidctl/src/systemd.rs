//! Living under systemd: readiness and watchdog (`Type=notify`,
//! `WatchdogSec=`) and logging to the journal with priorities. Outside
//! systemd every call here does nothing.

use std::time::{Duration, Instant};

/// Whether stderr is connected to the journal: systemd sets
/// `JOURNAL_STREAM` to the device and inode of the stream it gave the
/// service, and the check against fd 2 (as sd_journal_stream_fd(3) asks)
/// keeps a child whose stderr was redirected from logging there.
pub fn stderr_is_journal() -> bool {
    let Ok(v) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    // SAFETY: fstat on fd 2 into a zeroed stat buffer it fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(2, &mut st) } == 0) && st.st_dev == dev && st.st_ino == ino
}

/// Tells the service manager the daemon serves (its socket listens and the
/// arrays it was asked to start are up), with a status line.
pub fn ready(status: &str) {
    if let Err(e) = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(status),
    ]) {
        tracing::warn!("telling systemd the daemon is ready: {e}");
    }
}

/// Tells the service manager the daemon is stopping its arrays.
pub fn stopping() {
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping every array cleanly"),
    ]);
}

/// A new status line for the service manager (`systemctl status`).
pub fn status(status: &str) {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(status)]);
}

/// The watchdog, when the unit has `WatchdogSec=`: pinged at half the
/// period, and only while the caller says the daemon is healthy (its
/// monitor keeps running), so a daemon wedged there is restarted.
pub struct Watchdog {
    period: Duration,
    last: Option<Instant>,
}

impl Watchdog {
    pub fn from_env() -> Option<Watchdog> {
        let period = sd_notify::watchdog_enabled()?;
        tracing::info!(?period, "systemd watchdog enabled");
        Some(Watchdog { period, last: None })
    }

    /// The longest the monitor may go without a round before the daemon
    /// stops pinging.
    pub fn period(&self) -> Duration {
        self.period
    }

    pub fn tick(&mut self, healthy: bool) {
        if healthy && self.last.is_none_or(|l| l.elapsed() >= self.period / 2) {
            self.last = Some(Instant::now());
            if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]) {
                tracing::warn!("systemd watchdog ping: {e}");
            }
        }
    }
}
