//! What `status`, `list` and `detail` show, for running arrays (from the
//! daemon) and stopped ones (from the members' metadata). The JSON form is
//! these structs, documented in docs/operations.md.

use crate::registry::ArrayRecord;
use raid_core::array::Array;
use raid_core::metadata::{read_superblock, SlotState, Superblock};
use raid_gpu::EngineReport;
use serde::{Deserialize, Serialize};

mod render;
pub use render::{
    human_bytes, rate_and_time_left, render, render_health, scrub_progress, state_line,
};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MemberStatus {
    pub slot: usize,
    /// Path of the member in the slot; for a `missing` slot of a running
    /// array, the device its record names (not in use); null where
    /// nothing names one.
    pub path: Option<String>,
    pub uuid: String,
    /// active, failed, rebuilding or missing.
    pub state: String,
    /// The drive's identity and health, for a member that is a drive, as
    /// last read by the daemon (absent for files, loop devices, stopped
    /// arrays, and until the first check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<MemberHealth>,
    /// A warning about the member that is not a drive's reading: its file
    /// deleted (or replaced at its path) while the array uses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Whether its device takes writes with FUA, so that the journal's
    /// and the bitmap's writes need no flush after them there (a member
    /// of a running array only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fua: Option<bool>,
}

/// A member drive's last health reading.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MemberHealth {
    #[serde(flatten)]
    pub drive: crate::health::DriveHealth,
    /// What deserves a warning now, one sentence each (empty: healthy).
    pub warnings: Vec<String>,
    /// When it was read (Unix seconds).
    pub checked_unix: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RebuildStatus {
    pub slot: usize,
    pub member: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub percent: f64,
    /// Bytes per second since the rebuild (re)started; 0 until measurable.
    pub rate_bytes_per_sec: f64,
    /// Seconds left at that rate; null until measurable.
    pub eta_seconds: Option<f64>,
    /// Other slots to rebuild, each after the one before (one copy runs
    /// at a time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_slots: Vec<usize>,
    /// Other slots rebuilt by the same pass (RAID5/6: one pass of reads
    /// serves every member being rebuilt), each with its own progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub same_pass: Vec<RebuildStatus>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ArrayStatus {
    pub name: String,
    pub uuid: String,
    /// optimal, degraded, rebuilding, failed; or stopped.
    pub state: String,
    /// optimal, degraded, rebuilding or failed, also for a stopped array.
    pub health: String,
    pub running: bool,
    pub level: String,
    pub chunk_bytes: u64,
    pub capacity_bytes: u64,
    /// The parity engine in use ("cpu/avx512-gfni", "gpu/NVIDIA H200");
    /// the configured mode when stopped.
    pub parity_engine: String,
    /// The engine choice and what became of it (flattened into this object).
    #[serde(flatten)]
    pub parity: ParityStatus,
    pub events: u64,
    pub members: Vec<MemberStatus>,
    pub spares: Vec<String>,
    pub rebuild: Option<RebuildStatus>,
    /// A rebuild is pending but cannot run (the array lost a member it
    /// rebuilds from); it is retried when membership changes.
    #[serde(default)]
    pub rebuild_stalled: bool,
    /// A hot replace in progress (`member` is the new device).
    #[serde(default)]
    pub hot_replace: Option<RebuildStatus>,
    /// A scrub in progress.
    #[serde(default)]
    pub scrub: Option<ScrubStatus>,
    /// The resync an unclean stop left, running while the array is served
    /// (until it ends, a crash or a stop resyncs again at the next start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync: Option<ResyncStatus>,
    /// The member whose full filesystem stopped writes (until the array is
    /// started again), if one did.
    #[serde(default)]
    pub out_of_space: Option<String>,
    /// Why the array's record (the devices its next start opens) lags its
    /// membership, if it does: the daemon writes it again until it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_lags: Option<String>,
    /// The daemon was asked to stop (SIGTERM, SIGINT) and keeps serving
    /// this array only until what is mounted on it is unmounted: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<String>,
    /// A stopped array (here) whose member files another process holds as
    /// a running array's members do: another daemon (another state
    /// directory) may be running it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_elsewhere: Option<String>,
    /// A stopped array whose metadata says it was not stopped cleanly (a
    /// crash, a kill, a power cut): its next start resyncs the regions
    /// that were being written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unclean: bool,
    /// A running array's write-intent bitmap: its regions, and those marked
    /// now (written in the last linger, or not yet cleared), which a crash
    /// now would resync. None without a bitmap (RAID0) or when stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bitmap_regions: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bitmap_dirty_regions: Option<u64>,
    pub exports: Vec<String>,
}

impl ArrayStatus {
    /// `raidctl status`'s exit status: 0 optimal, 1 degraded or
    /// rebuilding, 2 failed.
    pub fn exit_code(&self) -> u8 {
        match self.health.as_str() {
            "failed" => 2,
            "optimal" if self.out_of_space.is_none() => 0,
            _ => 1,
        }
    }
}

/// A scrub in progress.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ScrubStatus {
    /// Whether it repairs what it finds (else it only checks).
    pub repair: bool,
    /// Stripes (mirrored chunks for RAID1/10) checked so far, and in all.
    pub rows_done: u64,
    pub rows_total: u64,
    pub percent: f64,
    /// Bytes read from the members per second since it started.
    pub rate_bytes_per_sec: f64,
    pub eta_seconds: Option<f64>,
}

/// A resync in progress: regions of the write-intent bitmap resynced, and
/// marked in all.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ResyncStatus {
    pub regions_done: u64,
    pub regions_total: u64,
    pub percent: f64,
}

/// The parity engine part of a status.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ParityStatus {
    /// What the operator chose: cpu, gpu or auto.
    pub parity_mode: String,
    /// The GPU adapter opened, if any ("NVIDIA H200 (vulkan)").
    pub gpu_adapter: Option<String>,
    /// auto: data bytes per parity call from which the GPU is used, as
    /// measured at start; null when the GPU never won or is not used.
    pub gpu_threshold_bytes: Option<u64>,
    /// Why the GPU is not in use (none found, CPU adapter, lost), if so.
    pub parity_note: Option<String>,
    /// Parity calls served by the GPU and by the CPU since start.
    pub parity_calls_gpu: u64,
    pub parity_calls_cpu: u64,
}

impl ParityStatus {
    fn running(e: EngineReport) -> ParityStatus {
        ParityStatus {
            parity_mode: e.mode,
            gpu_adapter: e.adapter,
            gpu_threshold_bytes: e.threshold_bytes,
            parity_note: e.note,
            parity_calls_gpu: e.gpu_calls,
            parity_calls_cpu: e.cpu_calls,
        }
    }

    /// A stopped array: only the recorded choice.
    fn stopped(r: &ArrayRecord) -> ParityStatus {
        ParityStatus {
            parity_mode: r.parity.clone(),
            ..ParityStatus::default()
        }
    }
}

/// Status of a running array. `copy`: the running rebuild or hot replace
/// (its kind, slots and bytes per second so far).
pub fn of_running(
    a: &Array,
    copy: Option<&raid_core::array::CopyProgress>,
    exports: Vec<String>,
    engine: Option<EngineReport>,
) -> ArrayStatus {
    let g = a.geometry();
    let members: Vec<MemberStatus> = a
        .slots()
        .into_iter()
        .map(|s| MemberStatus {
            slot: s.slot,
            state: if s.member.is_none() {
                "missing".into()
            } else {
                s.state.name().into()
            },
            fua: s.member.is_some().then_some(s.fua),
            path: s.member,
            uuid: s.uuid.to_string(),
            health: None,
            warning: None,
        })
        .collect();
    // The slots being rebuilt now (one pass), else the next one; the
    // others wait.
    let pending = a.rebuilding_slots();
    let mut pass: Vec<usize> = copy
        .filter(|c| c.kind == raid_core::array::CopyKind::Rebuild)
        .map(|c| std::iter::once(c.slot).chain(c.with.iter().copied()))
        .into_iter()
        .flatten()
        .filter(|s| pending.contains(s))
        .collect();
    // On RAID5/6 a slot pending while a pass runs joins it at the pass's
    // next batch: shown in it from the start, not as waiting.
    if !pass.is_empty()
        && matches!(
            g.level,
            raid_core::layout::Level::Raid5 | raid_core::layout::Level::Raid6
        )
    {
        let joining: Vec<usize> = pending
            .iter()
            .copied()
            .filter(|s| !pass.contains(s) && a.rebuild_progress(*s).is_some_and(|p| p.0 == 0))
            .collect();
        pass.extend(joining);
    }
    let rate = copy
        .filter(|c| c.kind == raid_core::array::CopyKind::Rebuild)
        .map_or(0.0, |c| c.rate);
    let one = |slot: usize, rate: f64| {
        let (done, total) = a.rebuild_progress(slot)?;
        let left = (total.saturating_sub(done) * g.chunk) as f64;
        Some(RebuildStatus {
            slot,
            member: members[slot].path.clone().unwrap_or_default(),
            done_bytes: done * g.chunk,
            total_bytes: total * g.chunk,
            percent: done as f64 * 100.0 / total as f64,
            rate_bytes_per_sec: rate,
            eta_seconds: (rate > 0.0).then(|| left / rate),
            waiting_slots: vec![],
            same_pass: vec![],
        })
    };
    let rebuild = match pass.split_first() {
        Some((&first, rest)) => one(first, rate).map(|mut r| {
            r.same_pass = rest.iter().filter_map(|&s| one(s, rate)).collect();
            r
        }),
        None => pending.first().and_then(|&s| one(s, 0.0)),
    }
    .map(|mut r| {
        r.waiting_slots = pending
            .iter()
            .copied()
            .filter(|s| *s != r.slot && !pass.contains(s))
            .collect();
        r
    });
    ArrayStatus {
        name: a.name().into(),
        uuid: a.uuid().to_string(),
        state: a.state().name().into(),
        health: a.state().name().into(),
        running: true,
        level: g.level.to_string(),
        chunk_bytes: g.chunk,
        capacity_bytes: g.capacity(),
        parity_engine: a.engine_name(),
        parity: ParityStatus::running(engine.unwrap_or_default()),
        events: a.events(),
        members,
        spares: a.spares(),
        rebuild,
        rebuild_stalled: a.rebuild_stalled(),
        scrub: None,
        resync: a.resync_progress().map(|p| ResyncStatus {
            regions_done: p.regions_done,
            regions_total: p.regions_total,
            percent: p.regions_done as f64 * 100.0 / p.regions_total.max(1) as f64,
        }),
        out_of_space: a.out_of_space(),
        record_lags: None,
        stopping: None,
        held_elsewhere: None,
        unclean: false,
        bitmap_regions: a.bitmap_regions().map(|n| n as u64),
        bitmap_dirty_regions: a.bitmap_regions().map(|_| a.bitmap_dirty_regions() as u64),
        hot_replace: a.hot_replace_progress().map(|(slot, member, done, total)| {
            let chunk = g.chunk;
            let rate = copy
                .filter(|c| c.kind == raid_core::array::CopyKind::HotReplace && c.slot == slot)
                .map_or(0.0, |c| c.rate);
            let left = (total.saturating_sub(done) * chunk) as f64;
            RebuildStatus {
                slot,
                member,
                done_bytes: done * chunk,
                total_bytes: total * chunk,
                percent: done as f64 * 100.0 / total.max(1) as f64,
                rate_bytes_per_sec: rate,
                eta_seconds: (rate > 0.0).then(|| left / rate),
                waiting_slots: vec![],
                same_pass: vec![],
            }
        }),
        exports,
    }
}

/// The metadata on the device at `p` (opened read-only: safe on a member
/// in use), or why it could not be read.
pub fn superblock_at(p: &std::path::Path) -> std::result::Result<Superblock, String> {
    crate::remote::inspect_member(p)
        .map_err(|e| e.to_string())
        .and_then(|m| read_superblock(m.as_ref()).map_err(|e| e.to_string()))
}

/// Status of a stopped array, from the newest metadata on its members.
pub fn of_stopped(r: &ArrayRecord) -> ArrayStatus {
    // Why a device could not be read, by path: said for a missing slot.
    let mut unread = std::collections::HashMap::new();
    let found: Vec<(String, Option<Superblock>)> = r
        .members
        .iter()
        .chain(&r.spares)
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| {
            let sb = superblock_at(p);
            let path = p.display().to_string();
            if let Err(e) = &sb {
                unread.insert(path.clone(), e.clone());
            }
            (
                path,
                sb.ok().filter(|sb| sb.array_uuid.to_string() == r.uuid),
            )
        })
        .collect();
    let newest = found
        .iter()
        .filter_map(|(_, sb)| sb.as_ref())
        .max_by_key(|sb| sb.events)
        .cloned();
    let Some(truth) = newest else {
        return ArrayStatus {
            name: r.name.clone(),
            uuid: r.uuid.clone(),
            state: "stopped".into(),
            health: "failed".into(),
            running: false,
            level: format!("raid{}", r.level),
            chunk_bytes: r.chunk,
            capacity_bytes: 0,
            parity_engine: r.parity.clone(),
            parity: ParityStatus::stopped(r),
            events: 0,
            members: r
                .members
                .iter()
                .enumerate()
                .map(|(i, p)| MemberStatus {
                    slot: i,
                    path: (!p.as_os_str().is_empty()).then(|| p.display().to_string()),
                    uuid: String::new(),
                    state: "missing".into(),
                    health: None,
                    warning: None,
                    fua: None,
                })
                .collect(),
            spares: vec![],
            rebuild: None,
            rebuild_stalled: false,
            hot_replace: None,
            scrub: None,
            resync: None,
            out_of_space: None,
            record_lags: None,
            stopping: None,
            held_elsewhere: held_elsewhere(r),
            unclean: false,
            bitmap_regions: None,
            bitmap_dirty_regions: None,
            exports: vec![],
        };
    };
    let g = truth.geometry();
    let members: Vec<MemberStatus> = truth
        .slots
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let held = found.iter().find_map(|(p, sb)| {
                sb.as_ref()
                    .filter(|sb| sb.member_uuid == e.uuid)
                    .map(|sb| (p.clone(), sb))
            });
            // The rule a start applies (`array::assemble`): an older copy
            // of a serving slot's member does not serve.
            let stale = held
                .as_ref()
                .filter(|_| e.state != SlotState::Failed)
                .and_then(|(p, sb)| {
                    sb.older_copy_in(&truth, i).map(|settled| {
                        format!(
                            "{p} holds an older copy of this slot's member (metadata event {}; every member took event {settled} since): a start leaves it out; raidctl re-add copies it whole",
                            sb.events
                        )
                    })
                });
            let path = held.map(|(p, _)| p).filter(|_| stale.is_none());
            let state = match (&path, e.state) {
                (None, SlotState::Failed) => "failed",
                (None, _) => "missing",
                (Some(_), s) => s.name(),
            };
            // A slot whose member was not found names the device the record
            // has for it, and says what was wrong there.
            let recorded = r
                .members
                .get(i)
                .filter(|p| !p.as_os_str().is_empty())
                .map(|p| p.display().to_string());
            let warning = stale.or_else(|| match (&path, &recorded) {
                (None, Some(p)) => Some(format!(
                    "{p}, recorded for this slot, {}",
                    match (
                        crate::remote::is_remote(std::path::Path::new(p)),
                        std::fs::metadata(p)
                    ) {
                        (true, _) => match unread.get(p) {
                            Some(e) => format!("cannot be read: {e}"),
                            None => "does not hold this slot's member".to_string(),
                        },
                        (false, Err(_)) => "is gone".to_string(),
                        (false, Ok(_)) => "does not hold this slot's member".to_string(),
                    }
                )),
                _ => None,
            });
            MemberStatus {
                slot: i,
                path: path.or(recorded),
                uuid: e.uuid.to_string(),
                state: state.into(),
                health: None,
                warning,
                fua: None,
            }
        })
        .collect();
    let down: Vec<bool> = members.iter().map(|m| m.state != "active").collect();
    let rebuilding = members.iter().any(|m| m.state == "rebuilding");
    // As a running array judges it (a RAID10 pair by pair).
    let health = if !down.contains(&true) {
        "optimal"
    } else if !g.serves_all_without(&down) {
        "failed"
    } else if rebuilding
        && members
            .iter()
            .all(|m| m.state != "failed" && m.state != "missing")
    {
        // As a running array says (`Array::state`): one slot with nothing
        // to rebuild onto is degraded, whatever else is rebuilt.
        "rebuilding"
    } else {
        "degraded"
    };
    let spares = found
        .iter()
        .filter(|(_, sb)| {
            sb.as_ref()
                .is_some_and(|sb| truth.spares.contains(&sb.member_uuid))
        })
        .map(|(p, _)| p.clone())
        .collect();
    ArrayStatus {
        name: r.name.clone(),
        uuid: r.uuid.clone(),
        state: "stopped".into(),
        health: health.into(),
        running: false,
        level: g.level.to_string(),
        chunk_bytes: g.chunk,
        capacity_bytes: g.capacity(),
        parity_engine: r.parity.clone(),
        parity: ParityStatus::stopped(r),
        events: truth.events,
        members,
        spares,
        rebuild: None,
        rebuild_stalled: false,
        hot_replace: None,
        scrub: None,
        resync: None,
        out_of_space: None,
        record_lags: None,
        stopping: None,
        held_elsewhere: held_elsewhere(r),
        unclean: !truth.clean,
        bitmap_regions: None,
        bitmap_dirty_regions: None,
        exports: vec![],
    }
}

/// Which process holds one of `r`'s member files as a running array holds
/// its members (an exclusive flock), from /proc/locks; else whether one a
/// reader cannot see there holds it (`held_unseen`).
fn held_elsewhere(r: &ArrayRecord) -> Option<String> {
    held_seen(r).or_else(|| held_unseen(r))
}

/// `held_elsewhere` from /proc/locks: asked without taking a lock. It
/// hides the locks of processes outside the reader's PID namespace (a
/// daemon on the host, seen from a container).
fn held_seen(r: &ArrayRecord) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    r.members.iter().chain(&r.spares).find_map(|p| {
        let m = std::fs::metadata(p).ok().filter(|m| m.is_file())?;
        // Matched by inode, then confirmed among the holder's open files:
        // /proc/locks gives the filesystem's own device number, which is
        // not what stat says on btrfs (a number per subvolume).
        let holds = |pid: u32| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| {
                    std::fs::metadata(fd.path())
                        .is_ok_and(|o| o.dev() == m.dev() && o.ino() == m.ino())
                })
        };
        let pid = locks.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // "1: FLOCK  ADVISORY  WRITE 1234 00:2f:5678 0 EOF"; lines of
            // waiters ("1: -> FLOCK ...") are not holders.
            if f.get(1) != Some(&"FLOCK") || f.get(3) != Some(&"WRITE") {
                return None;
            }
            let ino: u64 = f.get(5)?.rsplit(':').next()?.parse().ok()?;
            let pid = f.get(4)?.parse::<u32>().ok()?;
            (ino == m.ino() && holds(pid)).then_some(pid)
        })?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| {
                c.split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        Some(format!(
            "{} is held by process {pid} ({cmd}), as a running array holds its members: another daemon, with another state directory, may run this array; stop it there (raidctl --state-dir DIR stop {})",
            p.display(),
            r.name
        ))
    })
}

/// `held_elsewhere` where /proc/locks shows no holder: a shared flock
/// taken and let go at once, which fails where another process holds the
/// file exclusively. (A start at that instant waits the lock out: see
/// `FileMember::open`.)
fn held_unseen(r: &ArrayRecord) -> Option<String> {
    r.members
        .iter()
        .chain(&r.spares)
        .find(|p| held_exclusively(p))
        .map(|p| {
            format!(
                "{} is held exclusively by a process this PID namespace cannot see (a daemon on the host or in another container), as a running array holds its members: stop the array there (raidctl --state-dir DIR stop {})",
                p.display(),
                r.name
            )
        })
}

/// Whether another process holds the regular file `p` with an exclusive
/// flock: a shared one, taken without waiting, fails.
fn held_exclusively(p: &std::path::Path) -> bool {
    use std::os::fd::AsRawFd;
    let Some(f) = std::fs::File::open(p)
        .ok()
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
    else {
        return false;
    };
    // SAFETY: flock on a descriptor this function owns (f, open until it
    // returns, which lets go of any lock taken).
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use raid_core::array::CreateOptions;
    use raid_core::layout::Level;
    use raid_core::member::{FaultyMember, MemberRef, RamMember};
    use raid_core::metadata::MIN_DATA_OFFSET;
    use std::sync::Arc;

    /// Each member of a running array says whether its device takes
    /// writes with FUA (the machines the tests run on have no such disk,
    /// so the members here say it themselves).
    #[test]
    fn a_running_member_says_whether_it_takes_fua() {
        let members: Vec<Arc<FaultyMember>> = (0..3)
            .map(|i| {
                let ram = RamMember::new(format!("ram:st-fua{i}"), MIN_DATA_OFFSET + (1 << 20));
                Arc::new(FaultyMember::new(Arc::new(ram)))
            })
            .collect();
        members[1].take_fua(true);
        let refs: Vec<MemberRef> = members.iter().map(|m| m.clone() as MemberRef).collect();
        let opts = CreateOptions {
            name: "st-fua".into(),
            level: Level::Raid5,
            chunk: 64 << 10,
            data_offset: None,
        };
        let a = Array::create(refs, vec![], opts).unwrap();
        let st = of_running(&a, None, vec![], None);
        let fua: Vec<Option<bool>> = st.members.iter().map(|m| m.fua).collect();
        assert_eq!(fua, [Some(false), Some(true), Some(false)]);
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["members"][1]["fua"], true, "{json}");
    }
}
