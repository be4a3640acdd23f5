//! What the daemon shows of its arrays beyond their status: the metrics
//! scrape, the I/O counters `iostat` reads, and the drive health of members
//! that are drives (read on a schedule, warnings raised as events).

use super::{Daemon, Served};
use crate::error::{CliError, Result};
use crate::health::{DriveHealth, HealthThresholds, Probe};
use crate::metrics::{ArraySample, EngineSample, HealthSample, Sample};
use crate::protocol::{ArrayIo, Response};
use crate::status::MemberHealth;
use raid_core::array::ArrayEvent;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Alert mail sent and failed, counted by the sender for the metrics.
#[derive(Default)]
pub struct AlertCounters {
    pub sent: AtomicU64,
    pub send_failures: AtomicU64,
}

/// What the daemon last read of one member drive.
#[derive(Clone)]
pub(super) struct HealthReading {
    pub member: String,
    pub drive: DriveHealth,
    pub warnings: Vec<String>,
    pub checked_unix: u64,
}

/// `[health]`: how often member drives are read, and where to warn.
#[derive(serde::Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// Minutes between readings (smartd's default is 30).
    #[serde(default = "default_every")]
    pub every_minutes: f64,
    /// Warn when an NVMe drive has used this much of its rated endurance.
    #[serde(default = "default_used")]
    pub percentage_used: u8,
    /// Warn at this temperature.
    #[serde(default = "default_temp")]
    pub temperature_celsius: i64,
}

fn default_every() -> f64 {
    30.0
}
fn default_used() -> u8 {
    HealthThresholds::default().percentage_used
}
fn default_temp() -> i64 {
    HealthThresholds::default().temperature_celsius
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            every_minutes: default_every(),
            percentage_used: default_used(),
            temperature_celsius: default_temp(),
        }
    }
}

impl HealthConfig {
    pub fn thresholds(&self) -> HealthThresholds {
        HealthThresholds {
            percentage_used: self.percentage_used,
            temperature_celsius: self.temperature_celsius,
        }
    }

    pub fn check(&self) -> Result<()> {
        if !(self.every_minutes.is_finite() && self.every_minutes > 0.0) {
            return Err(CliError::usage(format!(
                "[health] every_minutes = {} must be a positive number of minutes",
                self.every_minutes
            )));
        }
        Ok(())
    }
}

/// A warning's rule, for telling a new warning from one already raised: its
/// sentence without the figures in it (a temperature that moves from 71 to
/// 72 C is the same warning, not a new alert).
fn rule_of(warning: &str) -> String {
    warning.chars().filter(|c| !c.is_ascii_digit()).collect()
}

pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Daemon {
    /// Everything a scrape reports, read now.
    pub(super) fn metrics_sample(&self) -> Sample {
        let arrays: Vec<Arc<Served>> = self.arrays.lock().values().cloned().collect();
        let statuses = self.status(None).map(|r| r.arrays).unwrap_or_default();
        let mut out = Vec::new();
        for st in statuses {
            let Some(s) = arrays.iter().find(|s| s.array.name() == st.name) else {
                continue;
            };
            let mut events: BTreeMap<String, u64> = BTreeMap::new();
            for (_, ev) in s.array.event_log() {
                *events.entry(ev.kind().to_string()).or_default() += 1;
            }
            let health = s
                .health
                .lock()
                .iter()
                .map(|(slot, h)| HealthSample {
                    slot: *slot,
                    member: h.member.clone(),
                    health: h.drive.clone(),
                    warnings: h.warnings.len(),
                })
                .collect();
            let exports = s.exports.lock();
            let engine = (!exports.is_empty()).then(|| {
                let mut g = EngineSample::default();
                for e in exports.iter().filter_map(|x| x.engine()) {
                    g.add(&e);
                }
                g
            });
            drop(exports);
            out.push(ArraySample {
                engine,
                io: s.array.io_stats(),
                status: st,
                events,
                health,
            });
        }
        Sample {
            arrays: out,
            alerts_enabled: self.alerts.is_some(),
            alerts_queued: crate::alerts::queue_len(&self.state) as u64,
            alerts_sent: self.alert_counters.sent.load(Ordering::Relaxed),
            alert_send_failures: self.alert_counters.send_failures.load(Ordering::Relaxed),
        }
    }

    /// The I/O counters of one array or all, for `iostat`.
    pub(super) fn io_stats(&self, name: Option<&str>) -> Result<Response> {
        let arrays: Vec<Arc<Served>> = match name {
            Some(n) => vec![self.served(n)?],
            None => self.arrays.lock().values().cloned().collect(),
        };
        let mut io: Vec<ArrayIo> = arrays
            .iter()
            .map(|s| ArrayIo {
                name: s.array.name().to_string(),
                at_ns: self.started.elapsed().as_nanos() as u64,
                io: s.array.io_stats(),
            })
            .collect();
        io.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response {
            ok: true,
            io,
            ..Default::default()
        })
    }

    /// The last health reading of each member of `s` that is a drive, for
    /// `status` and `detail`.
    pub(super) fn member_health(&self, s: &Served) -> BTreeMap<usize, (String, MemberHealth)> {
        s.health
            .lock()
            .iter()
            .map(|(slot, h)| {
                (
                    *slot,
                    (
                        h.member.clone(),
                        MemberHealth {
                            drive: h.drive.clone(),
                            warnings: h.warnings.clone(),
                            checked_unix: h.checked_unix,
                        },
                    ),
                )
            })
            .collect()
    }

    /// A member file deleted while the array uses it serves on through its
    /// open file, and `status` would say optimal until the next start
    /// finds it missing: warned once per member, with the way out (a hot
    /// replace keeps every bit of redundancy while it moves it).
    /// Not said of a slot being hot-replaced: the copy that moves it runs.
    pub(super) fn warn_deleted_members(
        &self,
        s: &Served,
        deleted: Vec<(usize, raid_core::member::MemberRef)>,
    ) {
        let copying = s.array.hot_replace_progress().map(|h| h.0);
        for (slot, m) in deleted {
            if copying == Some(slot) || !s.deleted_warned.lock().insert((slot, m.device_key())) {
                continue;
            }
            let member = m.identity().to_string();
            tracing::warn!(array = s.array.name(), member = %member, "member file deleted while in use");
            s.array.record_event(ArrayEvent::MemberHealthWarning {
                slot,
                member,
                reason: "its file was deleted (or replaced at its path) while the array uses it: the array serves on from the open file, but the next start will not find it there".into(),
            });
        }
    }

    /// Reads every member drive of every array once; a warning not raised
    /// before for that member becomes a `member_health_warning` event
    /// (logged and alerted like the others).
    pub(super) fn check_health(&self, cfg: &HealthConfig, only_new: bool) {
        let thresholds = cfg.thresholds();
        let arrays: Vec<Arc<Served>> = self.arrays.lock().values().cloned().collect();
        for s in arrays {
            if s.health_checked.swap(true, Ordering::AcqRel) && only_new {
                continue;
            }
            for slot in s.array.slots() {
                let Some(member) = slot.member.clone() else {
                    continue;
                };
                let drive = match crate::health::probe(std::path::Path::new(&member)) {
                    Probe::Drive(d) => d,
                    Probe::NotADrive => {
                        s.health.lock().remove(&slot.slot);
                        continue;
                    }
                    Probe::NoTool(what) => {
                        if self.health_tool_noted.swap(true, Ordering::AcqRel) {
                            tracing::debug!(member = %member, "drive health not read: {what}");
                        } else {
                            tracing::warn!(member = %member, "drive health not read: {what}");
                        }
                        continue;
                    }
                    Probe::Failed(e) => {
                        tracing::warn!(member = %member, "drive health not read: {e}");
                        continue;
                    }
                };
                let warnings = crate::health::warnings(&drive, &thresholds);
                let mut all = s.health.lock();
                let before: BTreeSet<String> = all
                    .get(&slot.slot)
                    .filter(|h| h.member == member)
                    .map(|h| h.warnings.iter().map(|w| rule_of(w)).collect())
                    .unwrap_or_default();
                for w in &warnings {
                    if !before.contains(&rule_of(w)) {
                        tracing::warn!(array = s.array.name(), member = %member, "drive health: {w}");
                        s.array.record_event(ArrayEvent::MemberHealthWarning {
                            slot: slot.slot,
                            member: member.clone(),
                            reason: w.clone(),
                        });
                    }
                }
                all.insert(
                    slot.slot,
                    HealthReading {
                        member: member.clone(),
                        drive,
                        warnings,
                        checked_unix: unix_now(),
                    },
                );
            }
        }
        self.process_events();
    }

    /// Reads member drives every `cfg.every_minutes` until the daemon stops,
    /// and those of an array as soon as it starts. On its own thread: a
    /// tool may take seconds per drive.
    pub(super) fn health_loop(self: Arc<Self>, cfg: HealthConfig) {
        let every = Duration::from_secs_f64(cfg.every_minutes * 60.0);
        let mut next = Instant::now() + every;
        while !self.exiting.load(Ordering::Acquire) {
            if Instant::now() >= next {
                self.check_health(&cfg, false);
                next = Instant::now() + every;
            } else {
                self.check_health(&cfg, true);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}
