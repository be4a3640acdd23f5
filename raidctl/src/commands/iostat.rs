//! `raidctl iostat [NAME] [INTERVAL] [COUNT]`: a live view of each running
//! array and its members, like `iostat -x`: operations and megabytes per
//! second, mean and 99th-percentile latency, average queue depth, errors.
//! Each report covers the interval before it (the first one too, as with
//! `iostat -y`); `--format json` prints one object per interval.

use super::*;
use crate::protocol::ArrayIo;
use raid_core::stats::{IoSnapshot, OpSnapshot};
use serde::Serialize;

/// One kind of operation over an interval.
#[derive(Serialize)]
pub struct OpRate {
    pub per_second: f64,
    pub bytes_per_second: f64,
    /// Mean completion time, milliseconds (null without operations). Like
    /// the percentile, from the requests the array timed (one in eight per
    /// thread).
    pub await_ms: Option<f64>,
    /// 99th percentile, as the upper bound of its latency bucket.
    pub p99_ms: Option<f64>,
    pub errors: u64,
}

/// A device (the array or a member) over an interval.
#[derive(Serialize)]
pub struct DeviceRate {
    pub read: OpRate,
    pub write: OpRate,
    pub flush: OpRate,
    /// Average operations in flight (Little's law over the interval, what
    /// iostat calls aqu-sz).
    pub queue: f64,
}

#[derive(Serialize)]
pub struct MemberRate {
    pub slot: usize,
    pub member: String,
    #[serde(flatten)]
    pub rate: DeviceRate,
}

#[derive(Serialize)]
pub struct ArrayRate {
    pub name: String,
    #[serde(flatten)]
    pub rate: DeviceRate,
    pub members: Vec<MemberRate>,
}

/// One report.
#[derive(Serialize)]
pub struct Report {
    /// Unix seconds at the end of the interval.
    pub time: u64,
    pub interval_seconds: f64,
    pub arrays: Vec<ArrayRate>,
}

fn op_rate(d: &OpSnapshot, secs: f64) -> OpRate {
    OpRate {
        per_second: d.ops as f64 / secs,
        bytes_per_second: d.bytes as f64 / secs,
        await_ms: d.mean_ns().map(|ns| ns / 1e6),
        p99_ms: d.quantile_us(0.99).map(|us| us as f64 / 1e3),
        errors: d.errors,
    }
}

fn device_rate(now: &IoSnapshot, before: &IoSnapshot, secs: f64) -> DeviceRate {
    let (r, w, f) = (
        now.read.since(&before.read),
        now.write.since(&before.write),
        now.flush.since(&before.flush),
    );
    let busy_ns = r.busy_ns() + w.busy_ns() + f.busy_ns();
    DeviceRate {
        queue: busy_ns / 1e9 / secs,
        read: op_rate(&r, secs),
        write: op_rate(&w, secs),
        flush: op_rate(&f, secs),
    }
}

/// The report between two answers of the daemon.
pub fn report(now: &[ArrayIo], before: &[ArrayIo]) -> Report {
    let mut arrays = Vec::new();
    for a in now {
        // An array started during the interval is reported from the next.
        let Some(b) = before.iter().find(|b| b.name == a.name) else {
            continue;
        };
        let secs = (a.at_ns.saturating_sub(b.at_ns) as f64 / 1e9).max(1e-3);
        // A member that joined its slot during the interval (a replace, a
        // spare) is reported from the next: its counters began elsewhere
        // (a rebuild's or hot replace's copy) and would show as one burst.
        let members =
            a.io.members
                .iter()
                .filter_map(|m| {
                    let prev =
                        b.io.members
                            .iter()
                            .find(|p| p.slot == m.slot && p.member == m.member)?;
                    Some(MemberRate {
                        slot: m.slot,
                        member: m.member.clone(),
                        rate: device_rate(&m.io, &prev.io, secs),
                    })
                })
                .collect();
        arrays.push(ArrayRate {
            name: a.name.clone(),
            rate: device_rate(&a.io.client, &b.io.client, secs),
            members,
        });
    }
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let interval_seconds = now
        .iter()
        .zip(before)
        .map(|(a, b)| a.at_ns.saturating_sub(b.at_ns) as f64 / 1e9)
        .next()
        .unwrap_or(0.0);
    Report {
        time,
        interval_seconds,
        arrays,
    }
}

fn ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
}

/// rMB/s and wMB/s are MiB per second, as sysstat's `iostat -m` counts
/// them (and `status` and `rate` print rates).
const MIB: f64 = (1u64 << 20) as f64;

/// The text form: one line per array and per member.
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "{:<24} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>7} {:>7} {:>6}\n",
        "device",
        "r/s",
        "rMB/s",
        "r_await",
        "r_p99",
        "w/s",
        "wMB/s",
        "w_await",
        "w_p99",
        "f/s",
        "aqu-sz",
        "errors"
    );
    let line = |name: &str, d: &DeviceRate| {
        format!(
            "{:<24} {:>9.1} {:>8.2} {:>8} {:>8} {:>9.1} {:>8.2} {:>8} {:>8} {:>7.1} {:>7.2} {:>6}\n",
            name,
            d.read.per_second,
            d.read.bytes_per_second / MIB,
            ms(d.read.await_ms),
            ms(d.read.p99_ms),
            d.write.per_second,
            d.write.bytes_per_second / MIB,
            ms(d.write.await_ms),
            ms(d.write.p99_ms),
            d.flush.per_second,
            d.queue,
            d.read.errors + d.write.errors + d.flush.errors,
        )
    };
    for a in &r.arrays {
        out.push_str(&line(&a.name, &a.rate));
        for m in &a.members {
            let short = match crate::remote::uri::NbdUri::parse(&m.member) {
                Ok(u) => u.short(),
                Err(_) => std::path::Path::new(&m.member)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_else(|| m.member.clone()),
            };
            out.push_str(&line(&format!("  {} {}", m.slot, short), &m.rate));
        }
    }
    out
}

fn sample(st: &StateDir, name: Option<&str>) -> Result<Vec<ArrayIo>> {
    let req = Request::Stats {
        name: name.map(String::from),
    };
    let r = match name {
        Some(n) => daemon_call(st, n, req)?,
        None => match call(&st.socket(), &req)? {
            Some(r) => r.into_result()?,
            None => {
                return Err(CliError::refused(
                    "no array is running (raidctl start NAME)".to_string(),
                ))
            }
        },
    };
    Ok(r.io)
}

/// Runs `iostat`: `count` reports (forever when None), `interval` apart.
pub fn iostat(
    st: &StateDir,
    name: Option<&str>,
    interval: f64,
    count: Option<u64>,
    fmt: Format,
) -> Result<()> {
    if !(interval.is_finite() && interval > 0.0) {
        return Err(CliError::usage(format!(
            "interval {interval} must be a positive number of seconds"
        )));
    }
    if let Some(n) = name {
        st.load(n)?;
    }
    let mut before = sample(st, name)?;
    let mut done = 0;
    while count.is_none_or(|c| done < c) {
        std::thread::sleep(std::time::Duration::from_secs_f64(interval));
        let now = sample(st, name)?;
        let r = report(&now, &before);
        match fmt {
            Format::Json => out!("{}", serde_json::to_string(&r).expect("serialises")),
            Format::Text => out!("{}", render(&r)),
        }
        before = now;
        done += 1;
    }
    Ok(())
}
