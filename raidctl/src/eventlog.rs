//! The persistent per-array event log: one JSON object per line in
//! STATE_DIR/events/NAME.jsonl, appended by the daemon, read by
//! `raidctl events` (with or without a daemon).

use crate::error::{CliError, Result};
use crate::registry::StateDir;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// One event as logged, mailed and handed to the hook.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EventRecord {
    /// RFC 3339, UTC.
    pub time: String,
    pub unix: u64,
    pub host: String,
    pub array: String,
    /// member_failed, array_degraded, ... (see docs/alerts.md).
    pub event: String,
    /// info, warning or critical.
    pub severity: String,
    pub message: String,
    /// The array's state when the event was recorded.
    pub array_state: String,
    pub slot: Option<usize>,
    pub member: Option<String>,
    pub member_uuid: Option<String>,
    pub member_serial: Option<String>,
    /// A hot replace's new device (its `member` is the one it replaces,
    /// while that holds the slot). Absent from other events, and from
    /// records an earlier version wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_member: Option<String>,
    /// The command to run next, when there is an obvious one.
    pub next: Option<String>,
}

pub fn path(st: &StateDir, array: &str) -> std::path::PathBuf {
    st.root.join("events").join(format!("{array}.jsonl"))
}

/// The log's previous generation: where `append` moves it once it holds
/// `ROTATE_BYTES`.
pub fn older_path(st: &StateDir, array: &str) -> std::path::PathBuf {
    st.root.join("events").join(format!("{array}.jsonl.1"))
}

/// Size at which the log starts a new generation (the one before is kept,
/// the one before that dropped): about 700 events each, so a long-lived
/// array with weekly scrubs keeps years of events in at most twice this.
const ROTATE_BYTES: u64 = 1 << 20;

pub fn append(st: &StateDir, r: &EventRecord) -> Result<()> {
    append_rotating_at(st, r, ROTATE_BYTES)
}

fn append_rotating_at(st: &StateDir, r: &EventRecord, rotate_bytes: u64) -> Result<()> {
    let p = path(st, &r.array);
    std::fs::create_dir_all(p.parent().unwrap())
        .map_err(|e| CliError::failed(format!("{}: {e}", p.display())))?;
    if std::fs::metadata(&p).is_ok_and(|m| m.len() >= rotate_bytes) {
        // Only the daemon appends, one event at a time.
        std::fs::rename(&p, older_path(st, &r.array))
            .map_err(|e| CliError::failed(format!("{}: {e}", p.display())))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p)
        .map_err(|e| CliError::failed(format!("{}: {e}", p.display())))?;
    let line = serde_json::to_string(r).expect("event serialises");
    f.write_all(format!("{line}\n").as_bytes())
        .and_then(|_| f.sync_data())
        .map_err(|e| CliError::failed(format!("{}: {e}", p.display())))
}

/// Every event kept, oldest first (the previous generation, then this).
pub fn read(st: &StateDir, array: &str) -> Vec<EventRecord> {
    [older_path(st, array), path(st, array)]
        .iter()
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The record of `raidctl alert test`.
pub fn record_for_test() -> EventRecord {
    let unix = now();
    EventRecord {
        time: rfc3339(unix),
        unix,
        host: hostname(),
        array: "(test)".into(),
        event: "test".into(),
        severity: "info".into(),
        message: "test message from raidctl alert test: alerts reach you".into(),
        array_state: "-".into(),
        slot: None,
        member: None,
        member_uuid: None,
        member_serial: None,
        new_member: None,
        next: None,
    }
}

/// Whether the hot spares at hand are enough for every slot failed (none
/// at hand: false).
fn spares_cover(a: &raid_core::array::Array) -> bool {
    let spares = a.spares().len();
    let failed = a
        .slots()
        .iter()
        .filter(|s| s.state == raid_core::metadata::SlotState::Failed)
        .count();
    spares > 0 && failed <= spares
}

/// The record of an array event, with the member's details and the
/// command to run next; `state`: the array's as the event was recorded.
pub fn record_of(
    a: &raid_core::array::Array,
    ev: &raid_core::array::ArrayEvent,
    state: raid_core::array::ArrayState,
    unix: u64,
    record_members: &[std::path::PathBuf],
) -> EventRecord {
    use raid_core::array::ArrayEvent as E;
    let slots = a.slots();
    let slot = ev.slot();
    let s = slot.and_then(|i| slots.get(i));
    let member = match ev {
        E::MemberFailed { member, .. }
        | E::RebuildStarted { member, .. }
        | E::SpareActivated { member, .. }
        | E::MemberReAdded { member, .. }
        | E::MemberKeptOut { member, .. }
        | E::SpareAdded { member }
        | E::SpareRemoved { member }
        | E::SpareDropped { member, .. }
        | E::MemberRemoved { member, .. }
        | E::OutOfSpace { member, .. } => Some(member.clone()),
        E::HotReplaceRebuilding { new, .. } => Some(new.clone()),
        _ => s
            .and_then(|s| s.member.clone())
            .or_else(|| {
                slot.and_then(|i| record_members.get(i))
                    .map(|p| p.display().to_string())
            })
            .filter(|m| !m.is_empty()),
    };
    let name = a.name();
    let next = match ev {
        E::MemberFailed { .. } | E::ArrayDegraded
            if a.state() == raid_core::array::ArrayState::Failed =>
        {
            Some(format!(
                "raidctl stop {name}; bring the lost members back, then raidctl start {name} --force (docs/recovery.md)"
            ))
        }
        // A hot replace's source: its replacement takes the slot (at the
        // copy's next look) or took it already (`hot_replace_rebuilding`),
        // so nothing is to be replaced; a replace would drop that device.
        E::MemberFailed { member, slot: failed, .. }
            if a.hot_replace_progress().is_some_and(|h| h.0 == *failed)
                || s.is_some_and(|s| {
                    s.state != raid_core::metadata::SlotState::Failed
                        && s.member.as_ref().is_some_and(|m| m != member)
                }) =>
        {
            Some(format!("raidctl wait {name} (its slot is being rebuilt onto another device)"))
        }
        // A hot spare takes the slot at the monitor's next look (the array
        // is not failed: the arm above): a replace would be refused. Only
        // while the spares cover every slot that waits for one.
        E::MemberFailed { .. } | E::MemberMissing { .. } if spares_cover(a) => Some(format!(
            "raidctl wait {name} (a hot spare takes the slot and is rebuilt)"
        )),
        // Given up as unreachable: the daemon takes it back by itself
        // when its server answers again, resyncing what was written
        // meanwhile; a replace would copy a whole member for a reboot.
        E::MemberFailed { member, slot, .. }
            if a.member_of(*slot).is_some_and(|m| m.unreachable()) =>
        {
            Some(format!(
                "bring its server back: the daemon takes it back by itself and resyncs what was written meanwhile (raidctl status {name}); if it is gone for good, raidctl replace {name} {member} NEW_DEVICE"
            ))
        }
        E::MemberFailed { member, .. } => {
            Some(format!("raidctl replace {name} {member} NEW_DEVICE"))
        }
        E::SpareDropped { member, .. } => Some(format!(
            "check {member} (its kernel log, raidctl examine {member}); raidctl add {name} {member} offers it again once it takes writes, or raidctl add {name} ANOTHER_DEVICE"
        )),
        E::MemberKeptOut { member, .. } => Some(format!(
            "set its server right (raidctl examine {member} says which disk it serves), then raidctl re-add {name} {member}; to rebuild onto the disk it serves now, raidctl remove {name} {member}, then raidctl replace {name} {member} {member}; or raidctl replace {name} {member} NEW_DEVICE"
        )),
        E::StartedDegraded { .. } if spares_cover(a) => Some(format!(
            "raidctl wait {name} (a hot spare takes the slot and is rebuilt)"
        )),
        E::StartedDegraded { slot, .. } => Some(match &member {
            Some(m) => format!(
                "raidctl replace {name} {m} NEW_DEVICE (or raidctl re-add {name} {m} if it failed by mistake)"
            ),
            None => format!("raidctl status {name} (it names slot {slot}'s device), then raidctl replace {name} DEVICE NEW_DEVICE"),
        }),
        E::HotReplaceRebuilding { .. } => Some(format!("raidctl wait {name}")),
        // A spare took the slot since.
        E::MemberMissing { .. }
            if s.is_some_and(|s| s.state != raid_core::metadata::SlotState::Failed) =>
        {
            Some(format!("raidctl wait {name} (its slot is being rebuilt onto another device)"))
        }
        E::MemberMissing { slot, left_out } => Some(match &member {
            Some(m) if left_out.is_some() => format!(
                "raidctl re-add {name} {m} (copies it whole), or raidctl replace {name} {m} NEW_DEVICE"
            ),
            // There, yet not taken: its metadata did not read (the start's
            // note says why). Reconnecting would change nothing.
            Some(m) if Path::new(m).exists() => format!(
                "raidctl examine {m} ({m} is there but was not taken at start: the start's note says why), then raidctl replace {name} {m} NEW_DEVICE"
            ),
            Some(m) => format!(
                "reconnect {m}, then raidctl re-add {name} {m} (it resyncs what was written since), or raidctl replace {name} {m} NEW_DEVICE"
            ),
            None => format!(
                "bring back the device of slot {slot} (raidctl examine DEVICE says which slot a device held) and raidctl start {name} again"
            ),
        }),
        E::ArrayFailed => Some(format!(
            "raidctl stop {name}; bring the lost members back, then raidctl start {name} --force (docs/recovery.md)"
        )),
        // Its own member failed: a new one is needed; otherwise the array
        // lost a source and the rebuild resumes once membership changes.
        E::RebuildFailed { .. } => match (s, &member) {
            (Some(s), Some(m)) if s.state == raid_core::metadata::SlotState::Failed => {
                Some(format!("raidctl replace {name} {m} NEW_DEVICE"))
            }
            _ => Some(format!(
                "raidctl status {name}; bring back the members it lost (docs/recovery.md)"
            )),
        },
        // The drive still works: a hot replace copies it with all the
        // redundancy kept, before it fails.
        E::MemberHealthWarning { member, .. } => Some(format!(
            "raidctl replace {name} {member} NEW_DEVICE (a hot replace, redundancy kept)"
        )),
        E::OutOfSpace { member, .. } => Some(format!(
            "free space on the filesystem of {member}, then raidctl stop {name}; raidctl start {name} (docs/recovery.md)"
        )),
        // Two mirror copies that differ: a repair keeps the first, which
        // may be the bad one; find out first.
        E::ScrubFinished {
            mismatches,
            repaired,
            undecided,
            ..
        } if mismatches > repaired && *undecided > 0 => Some(format!(
            "find which copy is right before any repair: raidctl scrub {name} --repair writes the first copy over the other, which may be the bad one. Check the files in the stripes named (fsck; the daemon's log names each); if one member is suspect (raidctl health, errors in raidctl iostat), raidctl fail it and rebuild it instead (raidctl replace)"
        )),
        E::ScrubFinished {
            mismatches,
            repaired,
            ..
        } if mismatches > repaired => Some(format!("raidctl scrub {name} --repair")),
        E::ScrubFinished { unresolved, .. } if *unresolved > 0 => Some(
            "check the files in the stripes named (fsck; the daemon's log names every one) and restore damaged ones from a backup"
                .to_string(),
        ),
        E::ScrubCut { repair: true } => Some(format!("raidctl scrub {name} --repair")),
        E::ScrubCut { repair: false } => Some(format!("raidctl scrub {name}")),
        _ => None,
    };
    EventRecord {
        time: rfc3339(unix),
        unix,
        host: hostname(),
        array: name.to_string(),
        event: ev.kind().into(),
        severity: ev.severity().name().into(),
        message: ev.describe(),
        array_state: state.name().into(),
        slot,
        // The event's own member's: the slot may hold another device now
        // (a spare took it), whose uuid would send the operator to the
        // wrong drive.
        member_uuid: match ev {
            E::MemberFailed { uuid, .. } => Some(uuid.to_string()),
            // A slot with no device (member_missing) keeps the uuid of
            // the one it waits for; a slot whose device is another than
            // the event's has none to give.
            _ => s
                .filter(|s| s.member.is_none() || member.is_none() || s.member == member)
                .map(|s| s.uuid.to_string()),
        },
        member_serial: member.as_deref().and_then(serial_of),
        member,
        new_member: match ev {
            E::HotReplaceStarted { new, .. }
            | E::HotReplaceFinished { new, .. }
            | E::HotReplaceRebuilding { new, .. }
            | E::HotReplaceFailed { new, .. } => Some(new.clone()),
            _ => None,
        },
        next,
    }
}

/// Seconds since the epoch as RFC 3339 UTC (no time-zone database needed).
pub fn rfc3339(unix: u64) -> String {
    let days = (unix / 86400) as i64;
    let secs = unix % 86400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// The serial number of a block device, from sysfs; None for files.
pub fn serial_of(path: &str) -> Option<String> {
    let real = std::fs::canonicalize(path).ok()?;
    let name = real.file_name()?.to_str()?.to_string();
    if !real.starts_with("/dev") {
        return None;
    }
    for p in [
        format!("/sys/class/block/{name}/device/serial"),
        format!("/sys/class/block/{name}/serial"),
    ] {
        if let Ok(s) = std::fs::read_to_string(p) {
            let s = s.trim().to_string();
            if !s.is_empty() {
                return Some(s);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log keeps two generations: bounded, the newest events read
    /// after the older, none lost at the turn.
    #[test]
    fn the_log_keeps_two_generations() {
        let dir = std::env::temp_dir().join(format!("raidctl-eventlog-{}", std::process::id()));
        let st = StateDir { root: dir.clone() };
        let mut r = record_for_test();
        r.array = "gen".into();
        let line = serde_json::to_string(&r).unwrap().len() as u64 + 1;
        let cap = 8 * line;
        let n = 30;
        for i in 0..n {
            r.unix = i;
            append_rotating_at(&st, &r, cap).unwrap();
        }
        let kept: Vec<u64> = read(&st, "gen").iter().map(|r| r.unix).collect();
        // 30 events in generations of about 8: the oldest dropped, the
        // newest (a generation or more) kept in order.
        let first = n - kept.len() as u64;
        assert!(first > 0 && kept.len() >= 8, "{kept:?}");
        assert_eq!(kept, (first..n).collect::<Vec<_>>());
        let size = |p: std::path::PathBuf| std::fs::metadata(p).unwrap().len();
        assert!(size(path(&st, "gen")) + size(older_path(&st, "gen")) <= 2 * cap);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_008_845), "2026-11-30T03:20:45Z");
    }

    /// A log an earlier version wrote (no `new_member`) still reads, and
    /// a record without one writes none.
    #[test]
    fn records_without_a_new_member_read_and_write() {
        let mut r = record_for_test();
        let line = serde_json::to_string(&r).unwrap();
        assert!(!line.contains("new_member"), "{line}");
        assert_eq!(serde_json::from_str::<EventRecord>(&line).unwrap(), r);
        r.new_member = Some("/dev/nvme3n1".into());
        let line = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<EventRecord>(&line).unwrap(), r);
    }
}
