//! What happens to an array, with a severity: logged with tracing, kept in
//! the array's event log, and turned into alerts by the daemon.

use std::fmt;

/// How urgent an event is. Ordered: Info < Warning < Critical.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }

    pub fn from_name(s: &str) -> Option<Severity> {
        [Severity::Info, Severity::Warning, Severity::Critical]
            .into_iter()
            .find(|v| v.name() == s)
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Something that happened to the array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArrayEvent {
    MemberFailed {
        slot: usize,
        member: String,
        /// The failed member's own uuid, taken as it failed: a spare or a
        /// new device may hold the slot (with another uuid) by the time
        /// the event is read.
        uuid: crate::metadata::Uuid,
        reason: String,
    },
    MemberMissing {
        slot: usize,
        /// Why its device, though given, was left out (an older copy of
        /// the member); None where none was found.
        left_out: Option<String>,
    },
    ArrayDegraded,
    /// The array started with a slot that had failed before (and still
    /// waits for a device): said at every start, so that an operator told
    /// once, before a reboot, is told again (mdadm's DegradedArray).
    StartedDegraded {
        slot: usize,
        member: String,
    },
    ArrayFailed,
    RebuildStarted {
        slot: usize,
        member: String,
        /// The row it starts from: 0, or where an earlier run of it
        /// stopped (a restart resumes from its checkpoint).
        from_row: u64,
        rows: u64,
    },
    RebuildFinished {
        slot: usize,
        /// Rows written to the member by this run: from where it started
        /// or resumed for a new member, the regions written meanwhile for
        /// a re-added one.
        rows_copied: u64,
        rows: u64,
    },
    /// A hot replace began copying `old` onto `new` (full redundancy kept).
    HotReplaceStarted {
        slot: usize,
        old: String,
        new: String,
    },
    /// `new` took `old`'s place.
    HotReplaceFinished {
        slot: usize,
        old: String,
        new: String,
    },
    /// The old member failed during its hot replace: `new` took the slot
    /// as a rebuilding member, rebuilt from the other members.
    HotReplaceRebuilding {
        slot: usize,
        old: String,
        new: String,
    },
    /// The hot replace was dropped: the old member stays (or, if it was
    /// the one that failed, the slot is failed).
    HotReplaceFailed {
        slot: usize,
        new: String,
        reason: String,
    },
    /// A member's filesystem is full: the array takes no more writes until
    /// space is freed and it is started again (no member failed).
    OutOfSpace {
        slot: usize,
        member: String,
    },
    /// A member that had left its slot was taken back (`re-add`).
    MemberReAdded {
        slot: usize,
        member: String,
        /// Why it is copied whole, not only the regions written since it
        /// left (`Array::re_add`).
        whole: Option<String>,
    },
    RebuildFailed {
        slot: usize,
        reason: String,
    },
    /// A network member the daemon takes back by itself when its server
    /// answers again was not taken back, and is left to the operator: it
    /// answers with another disk or an older copy of its own, or it was
    /// lost again each time it came back (a server too slow for the
    /// member timeout, a flapping link).
    MemberKeptOut {
        slot: usize,
        member: String,
        reason: String,
    },
    SpareActivated {
        slot: usize,
        member: String,
    },
    /// `raidctl add`: a hot spare joined the array.
    SpareAdded {
        member: String,
    },
    /// `raidctl remove` of a spare.
    SpareRemoved {
        member: String,
    },
    /// A hot spare the array called on could not be written, and was
    /// dropped so the next spare takes the slot: the array has one spare
    /// fewer than the operator gave it, which they must hear about (a
    /// warning, unlike the operator's own `remove`).
    SpareDropped {
        member: String,
        reason: String,
    },
    /// `raidctl remove` of a failed member: its slot waits empty for a
    /// replacement.
    MemberRemoved {
        slot: usize,
        member: String,
    },
    /// One scrub run ended: what it checked and found.
    ScrubFinished {
        rows: u64,
        mismatches: u64,
        repaired: u64,
        /// Findings beyond what the level can locate (RAID6: two chunks
        /// wrong in one sector): the parity agrees with data that may be
        /// wrong there.
        unresolved: u64,
        /// Mirror chunks whose copies differ with no majority among them
        /// (two copies): nothing says which is right, and a repair keeps
        /// the first, which may be the bad one.
        undecided: u64,
        interrupted: bool,
        /// Why it stopped early, if it did.
        error: Option<String>,
        /// The first mismatches found (at most `SCRUB_FINDINGS_SAID`),
        /// each with its stripe, member and what was decided: where an
        /// alert or `events` is all the operator sees of a scrub run in
        /// the background, whether a fault was located is said here.
        findings: Vec<String>,
    },
    /// The parity engine in use could not serve (GPU missing, lost or
    /// hung): parity moved to `to` without failing any I/O.
    ParityEngineFallback {
        from: String,
        to: String,
        reason: String,
    },
    /// The parity engine the array started with, and why that one.
    ParityEngineChosen {
        engine: String,
        detail: String,
    },
    /// A member's drive reports trouble (SMART / NVMe health) while it
    /// still works: the warning to act before it fails.
    MemberHealthWarning {
        slot: usize,
        member: String,
        reason: String,
    },
    /// The array was not stopped cleanly (a crash, a kill, a power cut,
    /// or a stop after writes failed on a full filesystem): at its start,
    /// the regions its write-intent bitmap marked were resynced, or are
    /// being resynced while it is served (`background`).
    UncleanStop {
        regions: u64,
        /// The array is degraded: parity cannot be checked until the
        /// rebuild ends, which resyncs them then.
        deferred: bool,
        /// They are being resynced while the array is served (`regions`
        /// marked, not yet resynced).
        background: bool,
    },
    /// The resync an unclean stop left, run while the array was served (or
    /// after the rebuild of a parity array that started degraded), ended:
    /// redundancy agrees with the data again.
    ResyncFinished {
        regions: u64,
    },
    /// A scrub did not end: the process that ran it stopped meanwhile
    /// (killed, a crash). Said at the next start; what it checked before
    /// is not known, the rest of the array is unchecked.
    ScrubCut {
        repair: bool,
    },
    /// `raidctl alert test`.
    Test,
}

impl ArrayEvent {
    pub fn severity(&self) -> Severity {
        match self {
            ArrayEvent::MemberFailed { .. }
            | ArrayEvent::ArrayDegraded
            | ArrayEvent::StartedDegraded { .. }
            | ArrayEvent::ArrayFailed
            | ArrayEvent::RebuildFailed { .. }
            | ArrayEvent::OutOfSpace { .. } => Severity::Critical,
            ArrayEvent::MemberMissing { .. }
            | ArrayEvent::SpareActivated { .. }
            | ArrayEvent::ParityEngineFallback { .. }
            | ArrayEvent::HotReplaceFailed { .. }
            | ArrayEvent::HotReplaceRebuilding { .. }
            | ArrayEvent::MemberHealthWarning { .. }
            | ArrayEvent::MemberKeptOut { .. }
            | ArrayEvent::SpareDropped { .. }
            | ArrayEvent::UncleanStop { .. }
            | ArrayEvent::ScrubCut { .. } => Severity::Warning,
            ArrayEvent::ScrubFinished {
                mismatches, error, ..
            } => {
                if *mismatches > 0 || error.is_some() {
                    Severity::Warning
                } else {
                    Severity::Info
                }
            }
            ArrayEvent::RebuildStarted { .. }
            | ArrayEvent::RebuildFinished { .. }
            | ArrayEvent::MemberReAdded { .. }
            | ArrayEvent::SpareAdded { .. }
            | ArrayEvent::SpareRemoved { .. }
            | ArrayEvent::MemberRemoved { .. }
            | ArrayEvent::HotReplaceStarted { .. }
            | ArrayEvent::HotReplaceFinished { .. }
            | ArrayEvent::ParityEngineChosen { .. }
            | ArrayEvent::ResyncFinished { .. }
            | ArrayEvent::Test => Severity::Info,
        }
    }

    /// A stable machine name ("member_failed").
    pub fn kind(&self) -> &'static str {
        match self {
            ArrayEvent::MemberFailed { .. } => "member_failed",
            ArrayEvent::MemberMissing { .. } => "member_missing",
            ArrayEvent::ArrayDegraded => "array_degraded",
            ArrayEvent::StartedDegraded { .. } => "started_degraded",
            ArrayEvent::ArrayFailed => "array_failed",
            ArrayEvent::RebuildStarted { .. } => "rebuild_started",
            ArrayEvent::RebuildFinished { .. } => "rebuild_finished",
            ArrayEvent::MemberReAdded { .. } => "member_re_added",
            ArrayEvent::SpareAdded { .. } => "spare_added",
            ArrayEvent::SpareRemoved { .. } => "spare_removed",
            ArrayEvent::SpareDropped { .. } => "spare_dropped",
            ArrayEvent::MemberRemoved { .. } => "member_removed",
            ArrayEvent::OutOfSpace { .. } => "out_of_space",
            ArrayEvent::HotReplaceStarted { .. } => "hot_replace_started",
            ArrayEvent::HotReplaceFinished { .. } => "hot_replace_finished",
            ArrayEvent::HotReplaceFailed { .. } => "hot_replace_failed",
            ArrayEvent::HotReplaceRebuilding { .. } => "hot_replace_rebuilding",
            ArrayEvent::RebuildFailed { .. } => "rebuild_failed",
            ArrayEvent::SpareActivated { .. } => "spare_activated",
            ArrayEvent::ScrubFinished { .. } => "scrub_finished",
            ArrayEvent::ParityEngineFallback { .. } => "parity_engine_fallback",
            ArrayEvent::ParityEngineChosen { .. } => "parity_engine_chosen",
            ArrayEvent::MemberHealthWarning { .. } => "member_health_warning",
            ArrayEvent::MemberKeptOut { .. } => "member_kept_out",
            ArrayEvent::UncleanStop { .. } => "unclean_stop",
            ArrayEvent::ResyncFinished { .. } => "resync_finished",
            ArrayEvent::ScrubCut { .. } => "scrub_cut",
            ArrayEvent::Test => "test",
        }
    }

    /// The slot the event is about, if any.
    pub fn slot(&self) -> Option<usize> {
        match self {
            ArrayEvent::MemberFailed { slot, .. }
            | ArrayEvent::MemberMissing { slot, .. }
            | ArrayEvent::StartedDegraded { slot, .. }
            | ArrayEvent::RebuildStarted { slot, .. }
            | ArrayEvent::RebuildFinished { slot, .. }
            | ArrayEvent::MemberReAdded { slot, .. }
            | ArrayEvent::MemberRemoved { slot, .. }
            | ArrayEvent::OutOfSpace { slot, .. }
            | ArrayEvent::HotReplaceStarted { slot, .. }
            | ArrayEvent::HotReplaceFinished { slot, .. }
            | ArrayEvent::HotReplaceFailed { slot, .. }
            | ArrayEvent::HotReplaceRebuilding { slot, .. }
            | ArrayEvent::RebuildFailed { slot, .. }
            | ArrayEvent::SpareActivated { slot, .. }
            | ArrayEvent::MemberHealthWarning { slot, .. }
            | ArrayEvent::MemberKeptOut { slot, .. } => Some(*slot),
            _ => None,
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            ArrayEvent::MemberFailed {
                slot,
                member,
                reason,
                ..
            } => format!("member {member} (slot {slot}) failed: {reason}"),
            ArrayEvent::MemberMissing {
                slot,
                left_out: None,
            } => format!("the member of slot {slot} was missing at start"),
            ArrayEvent::MemberMissing {
                slot,
                left_out: Some(why),
            } => format!("the member of slot {slot} was left out at start: {why}"),
            ArrayEvent::ArrayDegraded => {
                "the array is degraded: it runs with less redundancy".into()
            }
            ArrayEvent::StartedDegraded { slot, member } => format!(
                "started degraded: slot {slot}{} failed before this start and has no member in sync yet; the array runs with less redundancy",
                if member.is_empty() { String::new() } else { format!(" ({member})") }
            ),
            ArrayEvent::ArrayFailed => {
                "the array has failed: more members are lost than its level tolerates".into()
            }
            ArrayEvent::RebuildStarted {
                slot,
                member,
                from_row: 0,
                ..
            } => format!("rebuild of slot {slot} onto {member} started"),
            ArrayEvent::RebuildStarted {
                slot,
                member,
                from_row,
                rows,
            } => format!(
                "rebuild of slot {slot} onto {member} resumed at row {from_row} of {rows} ({:.1}%), where it stopped",
                *from_row as f64 * 100.0 / (*rows).max(1) as f64
            ),
            ArrayEvent::RebuildFinished {
                slot,
                rows_copied,
                rows,
            } => format!("rebuild of slot {slot} finished: {rows_copied} of {rows} rows copied"),
            ArrayEvent::HotReplaceStarted { slot, old, new } => format!(
                "hot replace of slot {slot} started: copying {old} onto {new}, redundancy kept"
            ),
            ArrayEvent::HotReplaceFinished { slot, old, new } => {
                format!("{new} replaced {old} in slot {slot}")
            }
            ArrayEvent::HotReplaceRebuilding { slot, old, new } => format!(
                "{old} failed during the hot replace of slot {slot}: {new} takes the slot and is rebuilt from the other members"
            ),
            ArrayEvent::HotReplaceFailed { slot, new, reason } => {
                format!("hot replace of slot {slot} onto {new} dropped: {reason}")
            }
            ArrayEvent::OutOfSpace { slot, member } => format!(
                "member {member} (slot {slot}) is on a full filesystem: the array takes no more writes until space is freed and it is started again; no member was failed, no data lost"
            ),
            ArrayEvent::MemberReAdded {
                slot,
                member,
                whole: None,
            } => format!(
                "{member} re-added to slot {slot}: resyncing the regions written since it left"
            ),
            ArrayEvent::MemberReAdded {
                slot,
                member,
                whole: Some(why),
            } => format!("{member} re-added to slot {slot}: copied whole, as {why}"),
            ArrayEvent::RebuildFailed { slot, reason } => {
                format!("rebuild of slot {slot} failed: {reason}")
            }
            ArrayEvent::SpareActivated { slot, member } => {
                format!("spare {member} took slot {slot}")
            }
            ArrayEvent::SpareAdded { member } => format!("{member} added as a hot spare"),
            ArrayEvent::SpareRemoved { member } => format!("spare {member} removed"),
            ArrayEvent::SpareDropped { member, reason } => format!(
                "spare {member} dropped: it could not be written ({reason}), so the array has one hot spare fewer"
            ),
            ArrayEvent::MemberRemoved { slot, member } => {
                format!("failed member {member} removed from slot {slot}: the slot waits for a replacement")
            }
            ArrayEvent::ScrubFinished {
                rows,
                mismatches,
                repaired,
                unresolved,
                undecided,
                interrupted,
                error,
                findings,
            } => {
                let mut t = format!(
                    "scrub {}: {rows} rows checked, {mismatches} mismatch(es), {repaired} repaired",
                    if error.is_some() {
                        "stopped"
                    } else if *interrupted {
                        "interrupted"
                    } else {
                        "finished"
                    }
                );
                if *unresolved > 0 {
                    t.push_str(&format!(
                        ", {unresolved} unresolved (more than one chunk wrong: the data there may be wrong)"
                    ));
                }
                if *undecided > 0 && repaired < mismatches {
                    t.push_str(&format!(
                        ", {undecided} where two copies differ and nothing says which is right"
                    ));
                }
                if let Some(e) = error {
                    t.push_str(&format!(": {e}"));
                }
                if !findings.is_empty() {
                    t.push_str(&format!("; {}", findings.join("; ")));
                    if *mismatches > findings.len() as u64 {
                        t.push_str(&format!(
                            "; and {} more (daemon log)",
                            *mismatches - findings.len() as u64
                        ));
                    }
                }
                t
            }
            ArrayEvent::ParityEngineFallback { from, to, reason } => {
                format!("parity moved from {from} to {to}: {reason}")
            }
            ArrayEvent::UncleanStop {
                deferred: true, ..
            } => "the array was not stopped cleanly (a crash, a kill, a power cut, or a stop after writes failed on a full filesystem) while degraded: the stripes being written cannot be checked until the rebuild ends, which resyncs them".into(),
            ArrayEvent::UncleanStop {
                regions,
                background: true,
                ..
            } => format!(
                "the array was not stopped cleanly (a crash, a kill, a power cut, or a stop after writes failed on a full filesystem): the {regions} region(s) marked as being written are being resynced while the array is served (status shows the progress)"
            ),
            ArrayEvent::UncleanStop { regions, .. } => format!(
                "the array was not stopped cleanly (a crash, a kill, a power cut, or a stop after writes failed on a full filesystem): {regions} region(s) marked as being written were resynced at this start"
            ),
            ArrayEvent::ResyncFinished { regions } => format!(
                "the resync after the unclean stop ended: {regions} region(s) resynced, the members in sync agree with each other again"
            ),
            ArrayEvent::ScrubCut { repair } => format!(
                "a scrub{} did not end: the daemon stopped while it ran (killed, a crash); the part it had not reached is unchecked",
                if *repair { " with repair" } else { "" }
            ),
            ArrayEvent::ParityEngineChosen { engine, detail } => {
                format!("parity engine {engine} ({detail})")
            }
            ArrayEvent::MemberHealthWarning {
                slot,
                member,
                reason,
            } => format!(
                "member {member} (slot {slot}) reports a health problem: {reason}; \
                 it still works: replace it before it fails (raidctl replace, or \
                 add a spare)"
            ),
            ArrayEvent::MemberKeptOut {
                slot,
                member,
                reason,
            } => format!(
                "network member {member} (slot {slot}) answers again but is not taken back by itself: {reason}"
            ),
            ArrayEvent::Test => "test message".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn severities_order_and_names() {
        assert!(Severity::Info < Severity::Warning && Severity::Warning < Severity::Critical);
        assert_eq!(Severity::from_name("warning"), Some(Severity::Warning));
        assert_eq!(ArrayEvent::ArrayFailed.severity(), Severity::Critical);
        assert_eq!(
            ArrayEvent::MemberMissing {
                slot: 2,
                left_out: None
            }
            .kind(),
            "member_missing"
        );
    }
}
