//! The array's record (STATE_DIR/arrays/NAME.toml) kept in step with its
//! membership. A start opens the devices the record names, so a record
//! that lags a change (its folder full or read-only) brings the array up
//! without a member it has: a new member's rebuild lost, the array
//! degraded. So a command that changes membership first checks that the
//! record can be written, and changes nothing where it cannot; and a
//! record the daemon could not write after a change (one the daemon made
//! itself: a spare taking a slot, a hot replace's switch; or a folder that
//! filled meanwhile) is written again by the monitor every round until it
//! lands, while `status` says it lags.

use super::{Daemon, Served};
use crate::error::{CliError, Result};
use crate::registry::StateDir;
use raid_core::member::DeviceKey;
use std::path::Path;

/// How a refusal by `record_writable` begins: the daemon's own membership
/// changes (a network member taken back) tell it from other errors by it.
pub(super) const NOT_RECORDABLE: &str = "nothing changed: the array's record could not be written";

impl Daemon {
    /// Writes the record as it is (the same content as on disk, where
    /// nothing lags): an error, before a membership change is made, means
    /// the change could not be recorded, so it is refused.
    pub(super) fn record_writable(&self, s: &Served) -> Result<()> {
        write(&self.state, s, false).map_err(|e| {
            CliError::failed(format!(
                "{NOT_RECORDABLE} ({e}). The record names the array's devices for its next start: free space on that filesystem (or make it writable), then run the command again"
            ))
        })
    }

    /// Writes the record after a change. Where it cannot, remembers why
    /// (the monitor writes it again) and returns the warning a command's
    /// answer carries.
    pub(super) fn save_record(&self, s: &Served) -> std::result::Result<(), String> {
        save(&self.state, s)
    }

    /// The monitor's round: a record that could not be written is written
    /// again.
    pub(super) fn save_record_again(&self, s: &Served) {
        if s.record_unsaved.lock().is_none() {
            return;
        }
        if write(&self.state, s, true).is_ok() {
            tracing::info!(array = %s.array.name(), "the array's record is written again");
        }
    }

    /// Why the record on disk lags the array, if it does.
    pub(super) fn record_lag(&self, s: &Served) -> Option<String> {
        s.record_unsaved.lock().clone()
    }
}

impl Served {
    /// Names `path` in the record as `slot`'s device where the array's slot
    /// holds device `key` now, and says whether it did. Checked and written
    /// under the record's lock: of two changes to one slot made close
    /// together (a replace, then a fail and another replace; a spare's
    /// activation beside a command), the record ends naming the device
    /// the array ended with, whichever thread reaches here last.
    pub(super) fn record_slot(&self, slot: usize, key: DeviceKey, path: &Path) -> bool {
        let mut rec = self.record.lock();
        let holds = self.array.slot_by_key(key) == Some(slot);
        if holds {
            rec.members[slot] = path.to_path_buf();
        }
        holds
    }

    /// Brings the record's spares in step with the array's: a path stays
    /// while the device it names is a spare, and `added` is named where it
    /// is one now (the same rule as `record_slot`, for the list of spares).
    /// Returns whether that changed the record.
    pub(super) fn record_spares(&self, added: Option<&Path>) -> bool {
        let mut rec = self.record.lock();
        let before = rec.spares.len();
        // By the name the array knows it by, else by identity (the same
        // device under another path); a spare whose path no longer stats
        // is still the array's while the array names it.
        let names = self.array.spares();
        let is_spare = |p: &Path| {
            names.iter().any(|n| Path::new(n) == p)
                || crate::remote::key_of(p).is_ok_and(|k| {
                    self.array.holds(k)
                        && self.array.slot_by_key(k).is_none()
                        && !self.array.is_replacement(k)
                })
        };
        rec.spares.retain(|p| is_spare(p));
        let dropped = rec.spares.len() != before;
        if let Some(p) = added.filter(|p| is_spare(p) && !rec.spares.iter().any(|q| q == p)) {
            rec.spares.push(p.to_path_buf());
            return true;
        }
        dropped
    }
}

/// `Daemon::save_record`, for a change made away from a command (a hot
/// replace's switch, on its copy's thread).
pub(super) fn save(state: &StateDir, s: &Served) -> std::result::Result<(), String> {
    write(state, s, true).map_err(|e| {
        let name = s.array.name();
        tracing::error!(array = %name, "the array's record lags its membership: {e}");
        format!(
            "\nwarning: the change is made, but the array's record could not be written ({e}): until it is, a restart would not find the array's new membership. The daemon writes it again every quarter second: free space on that filesystem (or make it writable); raidctl status {name} says when it is written."
        )
    })
}

/// Writes the record as it is in memory, under its lock (so writes land in
/// the order the record changed): one that lands ends any lag; one that
/// fails after a change (`lags`) marks it, still under that lock.
fn write(state: &StateDir, s: &Served, lags: bool) -> Result<()> {
    let rec = s.record.lock();
    let r = state.save(&rec);
    match &r {
        Ok(()) => *s.record_unsaved.lock() = None,
        Err(e) if lags => *s.record_unsaved.lock() = Some(e.msg.clone()),
        Err(_) => {}
    }
    r
}
