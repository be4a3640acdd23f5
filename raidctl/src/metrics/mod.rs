//! What the daemon tells Prometheus: `[metrics] listen = "ADDR"` in the
//! config, or `raidctl daemon --metrics ADDR`, serves `GET /metrics`.
//!
//! Every value is read at scrape time from the daemon's arrays (their
//! status, I/O counters, event log and drive health) and its alert queue:
//! nothing is kept twice. Names follow the Prometheus conventions: the
//! `raidctl_` prefix, base units (bytes, seconds, ratios 0..1), `_total`
//! for counters; docs/operations.md lists them.

mod exposition;

pub use exposition::{Exposition, Kind};

mod http;

pub use http::serve;

use crate::error::{CliError, Result};
use crate::health::DriveHealth;
use crate::status::ArrayStatus;
use raid_core::stats::{ArrayIoSnapshot, IoSnapshot, OpSnapshot, LATENCY_BUCKETS_US};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// One member's drive health as last read.
#[derive(Clone, Debug)]
pub struct HealthSample {
    pub slot: usize,
    pub member: String,
    pub health: DriveHealth,
    /// How many warnings it raises now.
    pub warnings: usize,
}

/// How the I/O engine of an array's NBD exports served their requests,
/// summed over the exports.
#[derive(Clone, Debug, Default)]
pub struct EngineSample {
    /// Shards (a thread and an io_uring each); 0 where io_uring was
    /// refused and every request runs on the blocking threads.
    pub shards: u64,
    /// Threads running requests on the blocking path (`Engine::
    /// fallback_threads`): they grow while a member the shards cannot
    /// serve keeps them busy.
    pub blocking_threads: u64,
    pub reads_on_shards: u64,
    /// Reads copied from members in memory in the requester's thread.
    pub reads_inline: u64,
    pub reads_blocking: u64,
    pub writes_on_shards: u64,
    /// Writes to members in memory run in the requester's thread.
    pub writes_inline: u64,
    pub writes_blocking: u64,
    /// Writes merged into the write of another: a merged write counts once
    /// above, as the one request it was served as; client writes are the
    /// writes above plus these, minus `writes_split`.
    pub writes_merged: u64,
    /// Parts beyond the first of RAID5/6 writes across stripes cut into a
    /// write per stripe, each part counted once above: client writes are
    /// the writes above plus `writes_merged` minus these.
    pub writes_split: u64,
    /// Times a degraded write waited on its shard for room in the journal.
    pub journal_waits: u64,
}

impl EngineSample {
    /// Adds what `e` served so far.
    pub fn add(&mut self, e: &raid_core::shard::Engine) {
        let c = e.counts();
        let n = |a: &raid_core::stats::StripedCounter| a.load(std::sync::atomic::Ordering::Relaxed);
        self.shards += e.shard_count() as u64;
        self.blocking_threads += e.fallback_threads() as u64;
        self.reads_on_shards += n(&c.on_shards);
        self.reads_inline += n(&c.inline);
        self.reads_blocking += n(&c.blocking);
        self.writes_on_shards += n(&c.writes_on_shards);
        self.writes_inline += n(&c.writes_inline);
        self.writes_blocking += n(&c.writes_blocking);
        self.writes_merged += n(&c.writes_merged);
        self.writes_split += n(&c.writes_split);
        self.journal_waits += n(&c.journal_waits);
    }
}

/// One array at scrape time.
pub struct ArraySample {
    pub status: ArrayStatus,
    pub io: ArrayIoSnapshot,
    /// Its NBD exports' engine; None without an export.
    pub engine: Option<EngineSample>,
    /// Events in the array's log since start, by kind.
    pub events: BTreeMap<String, u64>,
    pub health: Vec<HealthSample>,
}

/// The daemon at scrape time.
#[derive(Default)]
pub struct Sample {
    pub arrays: Vec<ArraySample>,
    /// Alerts enabled in the config.
    pub alerts_enabled: bool,
    pub alerts_queued: u64,
    pub alerts_sent: u64,
    pub alert_send_failures: u64,
}

/// The states an array can be in; one series each, 1 for the current one.
const ARRAY_STATES: [&str; 4] = ["optimal", "degraded", "rebuilding", "failed"];
const MEMBER_STATES: [&str; 4] = ["active", "rebuilding", "failed", "missing"];

/// The exposition of `s`.
pub fn render(s: &Sample) -> String {
    let mut e = Exposition::default();
    e.family("raidctl_arrays", Kind::Gauge, "Arrays this daemon serves.")
        .sample(&[], s.arrays.len() as f64);
    {
        let mut f = e.family(
            "raidctl_array_info",
            Kind::Gauge,
            "Constant 1, with the array's level, uuid and parity engine as labels.",
        );
        for a in &s.arrays {
            let st = &a.status;
            f.sample(
                &[
                    ("array", &st.name),
                    ("level", &st.level),
                    ("uuid", &st.uuid),
                    ("parity_engine", &st.parity_engine),
                ],
                1.0,
            );
        }
    }
    {
        let mut f = e.family(
            "raidctl_array_state",
            Kind::Gauge,
            "1 for the array's state (optimal, degraded, rebuilding, failed), 0 for the others.",
        );
        for a in &s.arrays {
            for state in ARRAY_STATES {
                let v = (a.status.state == state) as u8 as f64;
                f.sample(&[("array", &a.status.name), ("state", state)], v);
            }
        }
    }
    per_array(
        &mut e,
        s,
        "raidctl_array_capacity_bytes",
        Kind::Gauge,
        "Bytes the array offers its clients.",
        |a| Some(a.status.capacity_bytes as f64),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_slots",
        Kind::Gauge,
        "Member slots of the array.",
        |a| Some(a.status.members.len() as f64),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_degraded_slots",
        Kind::Gauge,
        "Slots whose member is not in sync (failed, missing or rebuilding).",
        |a| {
            Some(
                a.status
                    .members
                    .iter()
                    .filter(|m| m.state != "active")
                    .count() as f64,
            )
        },
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_spares",
        Kind::Gauge,
        "Hot spares waiting.",
        |a| Some(a.status.spares.len() as f64),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_rebuild_progress_ratio",
        Kind::Gauge,
        "Share of the running rebuild (or hot replace) done, 0 to 1; absent when none runs.",
        |a| {
            a.status
                .rebuild
                .as_ref()
                .or(a.status.hot_replace.as_ref())
                .map(|r| r.percent / 100.0)
        },
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_rebuild_rate_bytes_per_second",
        Kind::Gauge,
        "Bytes per second the running rebuild (or hot replace) writes; absent when none runs.",
        |a| {
            a.status
                .rebuild
                .as_ref()
                .or(a.status.hot_replace.as_ref())
                .map(|r| r.rate_bytes_per_sec)
        },
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_scrub_progress_ratio",
        Kind::Gauge,
        "Share of the running scrub done, 0 to 1; absent when none runs.",
        |a| a.status.scrub.as_ref().map(|r| r.percent / 100.0),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_resync_progress_ratio",
        Kind::Gauge,
        "Share of the resync after an unclean stop done (regions of the write-intent bitmap), 0 to 1; absent when none runs.",
        |a| a.status.resync.as_ref().map(|r| r.percent / 100.0),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_scrub_rate_bytes_per_second",
        Kind::Gauge,
        "Bytes per second the running scrub reads; absent when none runs.",
        |a| a.status.scrub.as_ref().map(|r| r.rate_bytes_per_sec),
    );
    io_families(
        &mut e,
        "raidctl_array",
        "the array's clients",
        s.arrays
            .iter()
            .map(|a| (vec![("array", a.status.name.as_str())], &a.io.client)),
    );
    {
        let mut f = e.family(
            "raidctl_array_parity_calls_total",
            Kind::Counter,
            "Parity computations, by the engine that served them (cpu, gpu).",
        );
        for a in &s.arrays {
            let n = &a.status.name;
            f.sample(
                &[("array", n), ("engine", "cpu")],
                a.status.parity.parity_calls_cpu as f64,
            );
            f.sample(
                &[("array", n), ("engine", "gpu")],
                a.status.parity.parity_calls_gpu as f64,
            );
        }
    }
    per_array(&mut e, s, "raidctl_array_parity_fallbacks_total", Kind::Counter,
        "Times parity moved off the engine in use (a GPU missing, lost or hung) without failing I/O.",
        |a| Some(a.events.get("parity_engine_fallback").copied().unwrap_or(0) as f64));
    {
        let mut f = e.family(
            "raidctl_array_events_total",
            Kind::Counter,
            "Events in the array's log since the daemon started it, by kind (member_failed, rebuild_finished, ...).",
        );
        for a in &s.arrays {
            for (kind, n) in &a.events {
                f.sample(&[("array", &a.status.name), ("kind", kind)], *n as f64);
            }
        }
    }
    per_array(
        &mut e,
        s,
        "raidctl_array_journal_records_total",
        Kind::Counter,
        "Degraded-write journal records made durable.",
        |a| Some(a.io.journal_records as f64),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_journal_bytes_total",
        Kind::Counter,
        "Bytes of degraded-write journal records made durable.",
        |a| Some(a.io.journal_bytes as f64),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_journal_commits_total",
        Kind::Counter,
        "Groups the degraded-write journal records were made durable in (one write and one flush of each member per group).",
        |a| Some(a.io.journal_commits as f64),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_journal_checkpoints_total",
        Kind::Counter,
        "Times the degraded-write journal freed the space of records already in place without waiting for the writes in flight.",
        |a| Some(a.io.journal_checkpoints as f64),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_journal_parity_records_total",
        Kind::Counter,
        "Degraded-write journal records that carry only the chunks that exist only as parity (the parity is recomputed from the data at replay).",
        |a| Some(a.io.journal_parity_records as f64),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_bitmap_writes_total",
        Kind::Counter,
        "Write-intent bitmap writes (each to every member in sync).",
        |a| Some(a.io.bitmap_writes as f64),
    );
    per_array(
        &mut e,
        s,
        "raidctl_array_bitmap_dirty_regions",
        Kind::Gauge,
        "Write-intent bitmap regions marked now (written in the last linger): what a crash now would resync.",
        |a| a.status.bitmap_dirty_regions.map(|n| n as f64),
    );
    engine_families(&mut e, s);
    {
        let mut f = e.family(
            "raidctl_member_state",
            Kind::Gauge,
            "1 for the slot's state (active, rebuilding, failed, missing), 0 for the others.",
        );
        for a in &s.arrays {
            for m in &a.status.members {
                let slot = m.slot.to_string();
                let path = m.path.clone().unwrap_or_default();
                for state in MEMBER_STATES {
                    f.sample(
                        &[
                            ("array", &a.status.name),
                            ("slot", &slot),
                            ("member", &path),
                            ("state", state),
                        ],
                        (m.state == state) as u8 as f64,
                    );
                }
            }
        }
    }
    {
        // Every slot of a rebuild pass, not only the first (which the
        // array's own ratio follows): a joined slot's progress too.
        let mut f = e.family(
            "raidctl_member_rebuild_progress_ratio",
            Kind::Gauge,
            "Share of each slot's rebuild done, 0 to 1, for every slot of the rebuild pass under way (or next to run); absent for the others.",
        );
        for a in &s.arrays {
            let Some(r) = &a.status.rebuild else { continue };
            for p in std::iter::once(r).chain(&r.same_pass) {
                let slot = p.slot.to_string();
                f.sample(
                    &[
                        ("array", &a.status.name),
                        ("slot", &slot),
                        ("member", &p.member),
                    ],
                    p.percent / 100.0,
                );
            }
        }
    }
    let member_labels: Vec<(String, String, String, &IoSnapshot)> = s
        .arrays
        .iter()
        .flat_map(|a| {
            a.io.members.iter().map(|m| {
                (
                    a.status.name.clone(),
                    m.slot.to_string(),
                    m.member.clone(),
                    &m.io,
                )
            })
        })
        .collect();
    io_families(
        &mut e,
        "raidctl_member",
        "this member device (the data path's reads and writes, and flushes)",
        member_labels.iter().map(|(a, slot, m, io)| {
            (
                vec![
                    ("array", a.as_str()),
                    ("slot", slot.as_str()),
                    ("member", m.as_str()),
                ],
                *io,
            )
        }),
    );
    health_families(&mut e, s);
    e.family(
        "raidctl_alerts_enabled",
        Kind::Gauge,
        "1 when email alerts are configured.",
    )
    .sample(&[], s.alerts_enabled as u8 as f64);
    e.family(
        "raidctl_alerts_queued",
        Kind::Gauge,
        "Alerts waiting to be sent.",
    )
    .sample(&[], s.alerts_queued as f64);
    e.family(
        "raidctl_alerts_sent_total",
        Kind::Counter,
        "Alert emails sent since the daemon started.",
    )
    .sample(&[], s.alerts_sent as f64);
    e.family(
        "raidctl_alert_send_failures_total",
        Kind::Counter,
        "Attempts to send an alert email that failed (each is retried).",
    )
    .sample(&[], s.alert_send_failures as f64);
    e.finish()
}

/// One gauge or counter per array; `None` leaves the array out.
fn per_array(
    e: &mut Exposition,
    s: &Sample,
    name: &str,
    kind: Kind,
    help: &str,
    value: impl Fn(&ArraySample) -> Option<f64>,
) {
    let mut f = e.family(name, kind, help);
    for a in &s.arrays {
        if let Some(v) = value(a) {
            f.sample(&[("array", &a.status.name)], v);
        }
    }
}

/// Operations, bytes, errors and latency of reads, writes and flushes,
/// for each series of `series` (its labels, its counters).
fn io_families<'a>(
    e: &mut Exposition,
    prefix: &str,
    of: &str,
    series: impl Iterator<Item = (Vec<(&'a str, &'a str)>, &'a IoSnapshot)>,
) {
    let series: Vec<_> = series.collect();
    let ops = |io: &'a IoSnapshot| -> [(&'static str, &'a OpSnapshot); 3] {
        [
            ("read", &io.read),
            ("write", &io.write),
            ("flush", &io.flush),
        ]
    };
    type Counted = (&'static str, &'static str, fn(&OpSnapshot) -> u64);
    let counters: [Counted; 3] = [
        ("operations_total", "Operations completed", |o| o.ops),
        (
            "bytes_total",
            "Bytes moved by operations that succeeded",
            |o| o.bytes,
        ),
        ("errors_total", "Operations that failed", |o| o.errors),
    ];
    for (suffix, help, get) in counters {
        let mut f = e.family(
            &format!("{prefix}_{suffix}"),
            Kind::Counter,
            &format!("{help} for {of}, by op (read, write, flush)."),
        );
        for (labels, io) in &series {
            for (op, o) in ops(io) {
                let mut l = labels.clone();
                l.push(("op", op));
                f.sample(&l, get(o) as f64);
            }
        }
    }
    let bounds: Vec<f64> = LATENCY_BUCKETS_US
        .iter()
        .map(|us| *us as f64 / 1e6)
        .collect();
    let mut f = e.family(
        &format!("{prefix}_latency_seconds"),
        Kind::Histogram,
        &format!("Time to complete an operation for {of}, by op (read, write, flush)."),
    );
    for (labels, io) in &series {
        for (op, o) in ops(io) {
            let mut l = labels.clone();
            l.push(("op", op));
            let buckets: Vec<(f64, u64)> = bounds
                .iter()
                .copied()
                .zip(o.buckets.iter().copied())
                .collect();
            f.histogram(
                &l,
                &buckets,
                o.buckets.iter().sum(),
                o.latency_ns as f64 / 1e9,
            );
        }
    }
}

/// The drive health figures of members that are drives.
fn health_families(e: &mut Exposition, s: &Sample) {
    let all: Vec<(&ArraySample, &HealthSample)> = s
        .arrays
        .iter()
        .flat_map(|a| a.health.iter().map(move |h| (a, h)))
        .collect();
    type Get = fn(&HealthSample) -> Option<f64>;
    let figures: [(&str, Kind, &str, Get); 6] = [
        (
            "raidctl_member_health_warnings",
            Kind::Gauge,
            "Health warnings the drive raises now (0: healthy); `raidctl detail` says which.",
            |h| Some(h.warnings as f64),
        ),
        (
            "raidctl_member_temperature_celsius",
            Kind::Gauge,
            "The drive's temperature.",
            |h| h.health.temperature_celsius.map(|t| t as f64),
        ),
        (
            "raidctl_member_endurance_used_ratio",
            Kind::Gauge,
            "NVMe percentage used, as a ratio (1: rated endurance reached; may exceed 1).",
            |h| h.health.percentage_used.map(|p| p as f64 / 100.0),
        ),
        (
            "raidctl_member_available_spare_ratio",
            Kind::Gauge,
            "NVMe available spare, as a ratio.",
            |h| h.health.available_spare_percent.map(|p| p as f64 / 100.0),
        ),
        (
            "raidctl_member_available_spare_threshold_ratio",
            Kind::Gauge,
            "NVMe available spare threshold, as a ratio.",
            |h| {
                h.health
                    .available_spare_threshold_percent
                    .map(|p| p as f64 / 100.0)
            },
        ),
        (
            "raidctl_member_media_errors_total",
            Kind::Counter,
            "NVMe media and data integrity errors the drive counted in its life.",
            |h| h.health.media_errors.map(|n| n as f64),
        ),
    ];
    for (name, kind, help, get) in figures {
        let mut f = e.family(name, kind, help);
        for (a, h) in &all {
            if let Some(v) = get(h) {
                let slot = h.slot.to_string();
                f.sample(
                    &[
                        ("array", &a.status.name),
                        ("slot", &slot),
                        ("member", &h.member),
                    ],
                    v,
                );
            }
        }
    }
}

/// Where a metrics listener goes: an address with a port.
pub fn parse_listen(spec: &str) -> Result<SocketAddr> {
    spec.parse().map_err(|_| {
        CliError::usage(format!(
            "metrics address '{spec}' is not HOST:PORT (e.g. 127.0.0.1:9469, [::1]:9469)"
        ))
    })
}

/// The NBD exports' engine: how its requests were served (arrays without
/// an export have none of these series).
fn engine_families(e: &mut Exposition, s: &Sample) {
    per_array(
        e,
        s,
        "raidctl_engine_shards",
        Kind::Gauge,
        "Shards (a thread and an io_uring each) serving the array's NBD exports; 0 where io_uring is refused and every request runs on the blocking threads.",
        |a| a.engine.as_ref().map(|g| g.shards as f64),
    );
    per_array(
        e,
        s,
        "raidctl_engine_blocking_threads",
        Kind::Gauge,
        "Threads running the NBD exports' requests on the blocking path, one request each: their queue depth there. They start at 8 per export where the shards serve every member (64 to 128 otherwise) and grow while a member the shards cannot serve keeps them all busy.",
        |a| a.engine.as_ref().map(|g| g.blocking_threads as f64),
    );
    {
        let mut f = e.family(
            "raidctl_engine_requests_total",
            Kind::Counter,
            "Reads and writes of the NBD exports by where they were served: shard (on a shard), inline (a read copied from, or a write copied to, members in memory in the requester's thread), blocking (handed to the blocking threads). Writes merged into another count once, as that one.",
        );
        for a in &s.arrays {
            let Some(g) = &a.engine else { continue };
            for (op, path, v) in [
                ("read", "shard", g.reads_on_shards),
                ("read", "inline", g.reads_inline),
                ("read", "blocking", g.reads_blocking),
                ("write", "shard", g.writes_on_shards),
                ("write", "inline", g.writes_inline),
                ("write", "blocking", g.writes_blocking),
            ] {
                f.sample(
                    &[("array", &a.status.name), ("op", op), ("path", path)],
                    v as f64,
                );
            }
        }
    }
    per_array(
        e,
        s,
        "raidctl_engine_writes_merged_total",
        Kind::Counter,
        "Writes that waited for their stripe and were merged into the write of another.",
        |a| a.engine.as_ref().map(|g| g.writes_merged as f64),
    );
    per_array(
        e,
        s,
        "raidctl_engine_writes_split_total",
        Kind::Counter,
        "Parts beyond the first of RAID5/6 writes across stripes, cut into a write per stripe.",
        |a| a.engine.as_ref().map(|g| g.writes_split as f64),
    );
    per_array(
        e,
        s,
        "raidctl_engine_journal_waits_total",
        Kind::Counter,
        "Times a degraded write waited on its shard for room in the journal's ring.",
        |a| a.engine.as_ref().map(|g| g.journal_waits as f64),
    );
}
