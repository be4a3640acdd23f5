//! `raidctl bench`: the published CSD comparison's four fio profiles, run by
//! raidctl itself against the array in-process (through its blocking API and
//! through its shards), the array through its NBD export, and one member
//! alone (the plain-SSD baseline), with incompressible
//! and 72%-compressible data. Reports IOPS, GB/s, latency percentiles, the
//! highest IOPS with p99 under 1 ms (a queue-depth sweep), the lz4 ratio of
//! the data per 4 KiB block, and the capacity trade-off.
//!
//! Queue depth: see `jobs.rs`.

mod jobs;

use crate::error::{CliError, Result};
use jobs::{run, Target};
use raid_core::array::{Array, CreateOptions};
use raid_core::layout::Level;
use raid_core::member::{FileMember, MemberRef, SimNvme};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One fio-style profile.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Profile {
    pub name: &'static str,
    pub write: bool,
    pub random: bool,
    pub bs: usize,
    pub jobs: usize,
    pub qd: usize,
}

/// The published side-by-side's profiles (shared/reference/figures.md).
pub fn profiles() -> Vec<Profile> {
    vec![
        Profile {
            name: "seq-write",
            write: true,
            random: false,
            bs: 128 << 10,
            jobs: 1,
            qd: 128,
        },
        Profile {
            name: "seq-read",
            write: false,
            random: false,
            bs: 128 << 10,
            jobs: 1,
            qd: 128,
        },
        Profile {
            name: "rand-write",
            write: true,
            random: true,
            bs: 4096,
            jobs: 4,
            qd: 128,
        },
        Profile {
            name: "rand-read",
            write: false,
            random: true,
            bs: 4096,
            jobs: 4,
            qd: 128,
        },
    ]
}

/// Data written: fio's buffer_compress_percentage with 4 KiB chunks.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub enum Data {
    Incompressible,
    /// This percentage of every 4 KiB chunk is zeros, the rest random.
    Compressible(u8),
}

impl Data {
    pub fn name(self) -> String {
        match self {
            Data::Incompressible => "incompressible".into(),
            Data::Compressible(p) => format!("compressible-{p}"),
        }
    }

    /// Fills a buffer the way fio would.
    pub fn fill(self, rng: &mut SmallRng, buf: &mut [u8]) {
        rng.fill(buf);
        if let Data::Compressible(p) = self {
            for c in buf.chunks_mut(4096) {
                let random = c.len() * (100 - p as usize) / 100;
                c[random..].fill(0);
            }
        }
    }
}

/// Logical bytes / lz4-compressed bytes, compressing 4 KiB blocks one by one
/// as a CSD's inline compressor does.
pub fn compression_ratio(data: &[u8]) -> f64 {
    let compressed: usize = data
        .chunks(4096)
        .map(|c| lz4_flex::compress(c).len().min(c.len()))
        .sum();
    data.len() as f64 / compressed.max(1) as f64
}

/// Usable bytes per raw byte, and drive failures survived.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CapacityRow {
    pub system: String,
    pub usable_fraction: f64,
    pub survives_failures: usize,
}

pub fn capacity_rows(members: usize, csd_ratio: f64) -> Vec<CapacityRow> {
    let n = members as f64;
    vec![
        CapacityRow {
            system: format!("RAID5 of {members}"),
            usable_fraction: (n - 1.0) / n,
            survives_failures: 1,
        },
        CapacityRow {
            system: format!("RAID6 of {members}"),
            usable_fraction: (n - 2.0) / n,
            survives_failures: 2,
        },
        CapacityRow {
            system: "single CSD".into(),
            usable_fraction: csd_ratio,
            survives_failures: 0,
        },
    ]
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub profile: String,
    pub data: String,
    pub target: String,
    pub iops: f64,
    pub gb_per_s: f64,
    pub latency: Latency,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepPoint {
    pub target: String,
    pub qd: usize,
    pub iops: f64,
    pub p99_us: f64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub level: String,
    pub members: usize,
    pub member_bytes: u64,
    pub seconds_per_run: f64,
    /// "files", or "simulated NVMe" drives (a report from before the
    /// choice ran on files).
    #[serde(default = "on_files")]
    pub drives: String,
    pub compression_ratio: Vec<(String, f64)>,
    pub capacity: Vec<CapacityRow>,
    pub results: Vec<Row>,
    pub sweep: Vec<SweepPoint>,
    /// Per target: the highest IOPS of 4 KiB random reads with p99 < 1 ms.
    pub latency_bound: Vec<SweepPoint>,
}

pub fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64
}

pub struct BenchArgs {
    pub dir: Option<PathBuf>,
    pub members: usize,
    pub level: u32,
    pub member_bytes: u64,
    pub seconds: f64,
    pub sweep_seconds: f64,
    /// Simulated NVMe drives in memory for members, not files.
    pub simulated: bool,
    pub json: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    pub throughput_plot: Option<PathBuf>,
}

/// Draws the plots of a report saved with `--json`, without running.
pub fn replot(json: &Path, a: &BenchArgs) -> Result<Report> {
    let text = std::fs::read_to_string(json)
        .map_err(|e| CliError::failed(format!("{}: {e}", json.display())))?;
    let report: Report = serde_json::from_str(&text)
        .map_err(|e| CliError::usage(format!("{} is not a bench report: {e}", json.display())))?;
    write_plots(&report, a)?;
    Ok(report)
}

fn write_plots(report: &Report, a: &BenchArgs) -> Result<()> {
    let plots = [
        (&a.plot, crate::plot::latency_svg(&report.sweep)),
        (
            &a.throughput_plot,
            crate::plot::throughput_svg(&report.results),
        ),
    ];
    for (path, svg) in plots {
        if let Some(p) = path {
            let svg = svg.map_err(CliError::failed)?;
            std::fs::write(p, svg)
                .map_err(|e| CliError::failed(format!("{}: {e}", p.display())))?;
        }
    }
    Ok(())
}

/// The smallest member the profiles run on.
const MIN_MEMBER_BYTES: u64 = 16 << 20;
/// The longest run asked of one profile or sweep point.
const MAX_SECONDS: f64 = 86_400.0;

/// Checks the arguments before anything is made: the level and its member
/// count, the member size, the run lengths.
fn check_args(a: &BenchArgs) -> Result<Level> {
    let level = Level::from_number(a.level)
        .ok_or_else(|| CliError::usage(format!("level {} is not 0, 1, 5, 6 or 10", a.level)))?;
    let (min, max) = (level.min_members(), raid_core::layout::MAX_MEMBERS);
    if !(min..=max).contains(&a.members) {
        return Err(CliError::usage(format!(
            "--members {}: {level} takes {min} to {max} members",
            a.members
        )));
    }
    if a.member_bytes < MIN_MEMBER_BYTES {
        return Err(CliError::usage(format!(
            "--member-size {} bytes is too small to bench: give 16M or more (the default is 1G)",
            a.member_bytes
        )));
    }
    for (flag, s) in [
        ("--seconds", a.seconds),
        ("--sweep-seconds", a.sweep_seconds),
    ] {
        if !(s.is_finite() && s > 0.0 && s <= MAX_SECONDS) {
            return Err(CliError::usage(format!(
                "{flag} {s}: give a number of seconds above 0, at most {MAX_SECONDS}"
            )));
        }
    }
    Ok(level)
}

/// The bench's files, removed however it ends (an error, a panic): the
/// members, the lone member and the socket, and the folder if the bench
/// made it.
struct Scratch {
    dir: PathBuf,
    owned: bool,
    files: std::sync::Mutex<Vec<PathBuf>>,
}

impl Scratch {
    /// Makes the file `name` in the folder, or refuses if something is
    /// there already: a user's file, another bench's or server's, is never
    /// overwritten, nor removed at the end.
    fn create(&self, name: &str) -> Result<(PathBuf, std::fs::File)> {
        let p = self.dir.join(name);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => CliError::refused(format!(
                    "{} exists: the bench makes its own files in --dir (m0.img, ..., alone.img, bench.sock); name a folder without them",
                    p.display()
                )),
                _ => CliError::failed(format!("{}: {e}", p.display())),
            })?;
        self.made(p.clone());
        Ok((p, f))
    }

    /// `p` is the bench's own: removed at the end.
    fn made(&self, p: PathBuf) {
        self.files.lock().unwrap_or_else(|e| e.into_inner()).push(p);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let files = self.files.get_mut().unwrap_or_else(|e| e.into_inner());
        for f in files.iter() {
            let _ = std::fs::remove_file(f);
        }
        if self.owned {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

pub fn bench(a: &BenchArgs) -> Result<Report> {
    let level = check_args(a)?;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("raidctl-bench-{}", std::process::id())),
    };
    let owned = a.dir.is_none();
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::failed(format!("{}: {e}", dir.display())))?;
    let scratch = Scratch {
        dir: dir.clone(),
        owned,
        files: Default::default(),
    };
    // The data starts where `raidctl create` would put it on such members;
    // the lone drive's data at the smallest offset (`jobs::Target`).
    let data_offset = raid_core::metadata::data_offset_for(level, a.member_bytes);
    let file = |name: &str, data_offset: u64| -> Result<MemberRef> {
        if a.simulated {
            let model = raid_core::member::NvmeModel::datacenter();
            let size = data_offset + a.member_bytes;
            return Ok(Arc::new(SimNvme::new(format!("sim:{name}"), size, model)));
        }
        let (p, f) = scratch.create(name)?;
        f.set_len(data_offset + a.member_bytes)
            .map_err(|e| CliError::failed(e.to_string()))?;
        Ok(Arc::new(FileMember::open(&p).map_err(|e| {
            CliError::failed(format!("{}: {e}", p.display()))
        })?))
    };
    let members: Vec<MemberRef> = (0..a.members)
        .map(|i| file(&format!("m{i}.img"), data_offset))
        .collect::<Result<_>>()?;
    let alone = file("alone.img", raid_core::metadata::MIN_DATA_OFFSET)?;
    let array = Arc::new(Array::create(
        members,
        vec![],
        CreateOptions {
            name: "bench".into(),
            level,
            chunk: 64 * 1024,
            data_offset: Some(data_offset),
        },
    )?);
    // The export makes the socket: it is the bench's once that succeeded
    // (the export refuses a path something else holds).
    let sock = dir.join("bench.sock");
    if sock.symlink_metadata().is_ok() {
        return Err(CliError::refused(format!(
            "{} exists: the bench makes its own files in --dir (m0.img, ..., alone.img, bench.sock); name a folder without them",
            sock.display()
        )));
    }
    let export = crate::export::Export::start_nbd(
        array.clone(),
        &format!("unix:{}", sock.display()),
        &Default::default(),
    )?;
    scratch.made(sock.clone());
    let shards = std::thread::available_parallelism().map_or(1, |n| n.get());
    let engine = Arc::new(
        raid_core::shard::Engine::start(array.clone(), shards)
            .map_err(|e| CliError::failed(format!("the array's shards: {e}")))?,
    );
    let targets = [
        Target::Array(array.clone()),
        Target::Shards(engine.clone(), array.clone()),
        Target::Nbd(sock.clone(), "bench".into()),
        Target::Member(alone),
    ];
    let datas = [Data::Incompressible, Data::Compressible(72)];
    let total = profiles().len() * datas.len() * targets.len();
    let mut results = Vec::new();
    let mut k = 0;
    for data in datas {
        for p in profiles() {
            for t in &targets {
                k += 1;
                let size = match t {
                    Target::Nbd(..) => array.capacity(),
                    _ => t.size(),
                };
                eprintln!("[{k}/{total}] {} {} on {}", p.name, data.name(), t.name());
                let (iops, lats) = run(t, &p, data, size, a.seconds);
                results.push(Row {
                    profile: p.name.into(),
                    data: data.name(),
                    target: t.name().into(),
                    iops,
                    gb_per_s: iops * p.bs as f64 / 1e9,
                    latency: Latency {
                        p50_us: percentile(&lats, 0.50),
                        p99_us: percentile(&lats, 0.99),
                        p999_us: percentile(&lats, 0.999),
                    },
                });
            }
        }
    }
    // The latency-bound method: 4 KiB random reads, one job, deeper and
    // deeper queues; keep the best IOPS whose p99 stays under 1 ms.
    let mut sweep = Vec::new();
    for t in &targets {
        let size = if let Target::Nbd(..) = t {
            array.capacity()
        } else {
            t.size()
        };
        for qd in [1, 2, 4, 8, 16, 32, 64, 128] {
            eprintln!("sweep {} QD {qd}", t.name());
            let p = Profile {
                name: "rand-read",
                write: false,
                random: true,
                bs: 4096,
                jobs: 1,
                qd,
            };
            let (iops, lats) = run(t, &p, Data::Incompressible, size, a.sweep_seconds);
            sweep.push(SweepPoint {
                target: t.name().into(),
                qd,
                iops,
                p99_us: percentile(&lats, 0.99),
            });
        }
    }
    let latency_bound = targets
        .iter()
        .filter_map(|t| {
            sweep
                .iter()
                .filter(|s| s.target == t.name() && s.p99_us < 1000.0)
                .max_by(|a, b| a.iops.partial_cmp(&b.iops).unwrap())
                .cloned()
        })
        .collect();
    export.stop();
    drop(targets);
    drop(engine);
    array.close()?;
    drop(array);
    let mut rng = SmallRng::seed_from_u64(9);
    let ratios: Vec<(String, f64)> = datas
        .iter()
        .map(|d| {
            let mut sample = vec![0u8; 4 << 20];
            d.fill(&mut rng, &mut sample);
            (d.name(), compression_ratio(&sample))
        })
        .collect();
    let report = Report {
        level: level.to_string(),
        members: a.members,
        member_bytes: a.member_bytes,
        seconds_per_run: a.seconds,
        drives: match a.simulated {
            true => "simulated NVMe".into(),
            false => on_files(),
        },
        capacity: capacity_rows(a.members, ratios.last().map(|r| r.1).unwrap_or(1.0)),
        compression_ratio: ratios,
        results,
        sweep,
        latency_bound,
    };
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&report).unwrap())
            .map_err(|e| CliError::failed(format!("{}: {e}", j.display())))?;
    }
    write_plots(&report, a)?;
    drop(scratch);
    Ok(report)
}

fn on_files() -> String {
    "files".into()
}

pub fn print(r: &Report) {
    out!(
        "{} of {} members ({}), {} per run",
        r.level,
        r.members,
        r.drives,
        r.seconds_per_run
    );
    out!("| profile | data | target | IOPS | GB/s | p50 µs | p99 µs | p99.9 µs |");
    out!("|---|---|---|---|---|---|---|---|");
    for x in &r.results {
        out!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} |",
            x.profile,
            x.data,
            x.target,
            x.iops,
            x.gb_per_s,
            x.latency.p50_us,
            x.latency.p99_us,
            x.latency.p999_us
        );
    }
    out!("\nhighest 4 KiB random-read IOPS with p99 < 1 ms:");
    for s in &r.latency_bound {
        out!(
            "  {:<10} {:>9.0} IOPS at QD {} (p99 {:.0} µs)",
            s.target,
            s.iops,
            s.qd,
            s.p99_us
        );
    }
    out!(
        "\nlz4 per 4 KiB block: {}",
        r.compression_ratio
            .iter()
            .map(|(d, v)| format!("{d} {v:.2}:1"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for c in &r.capacity {
        out!(
            "  {:<16} usable {:.2}x of raw, survives {} drive failure(s)",
            c.system,
            c.usable_fraction,
            c.survives_failures
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_profiles_of_the_published_comparison() {
        let p = profiles();
        assert_eq!(
            p.iter().map(|p| p.name).collect::<Vec<_>>(),
            ["seq-write", "seq-read", "rand-write", "rand-read"]
        );
        assert!(p[..2]
            .iter()
            .all(|p| p.bs == 128 << 10 && p.jobs == 1 && p.qd == 128 && !p.random));
        assert!(p[2..]
            .iter()
            .all(|p| p.bs == 4096 && p.jobs == 4 && p.qd == 128 && p.random));
    }

    #[test]
    fn compression_ratios_of_the_two_data_kinds() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut a = vec![0u8; 1 << 20];
        Data::Incompressible.fill(&mut rng, &mut a);
        let r = compression_ratio(&a);
        assert!((0.99..=1.01).contains(&r), "{r}");
        Data::Compressible(72).fill(&mut rng, &mut a);
        let r = compression_ratio(&a);
        // 28% of each block stays random: lz4 gets close to 1/0.28.
        assert!((3.0..3.6).contains(&r), "{r}");
        // Exactly 72% zeros per 4 KiB block.
        assert_eq!(a[..4096].iter().skip(1146).filter(|&&b| b != 0).count(), 0);
    }

    #[test]
    fn capacity_arithmetic() {
        let rows = capacity_rows(8, 2.5);
        assert_eq!(rows[0].usable_fraction, 7.0 / 8.0);
        assert_eq!(rows[1].usable_fraction, 6.0 / 8.0);
        assert_eq!(rows[2].usable_fraction, 2.5);
        assert_eq!(
            rows.iter().map(|r| r.survives_failures).collect::<Vec<_>>(),
            [1, 2, 0]
        );
    }

    #[test]
    fn percentiles_and_plot() {
        let v: Vec<u32> = (1..=1000).collect();
        assert_eq!(percentile(&v, 0.5), 501.0);
        assert_eq!(percentile(&v, 0.99), 990.0);
        assert_eq!(percentile(&v, 0.999), 999.0);
        let point = |target: &str, qd, iops, p99_us| SweepPoint {
            target: target.into(),
            qd,
            iops,
            p99_us,
        };
        let svg = crate::plot::latency_svg(&[
            point("array", 1, 90_000.0, 5.0),
            point("array", 2, 1_500_000.0, 80.0),
            point("member", 1, 120_000.0, 3.0),
        ])
        .unwrap()
        .replace('\n', "");
        // A log axis of IOPS from 10k to 10M, ticks labelled, a legend.
        for want in [
            "<svg",
            "IOPS (log scale)",
            ">10k<",
            ">1M<",
            ">array<",
            ">member<",
            "p99 latency",
        ] {
            assert!(svg.contains(want), "{want} missing from the plot");
        }
        let row = |target: &str, profile: &str, gb_per_s| Row {
            profile: profile.into(),
            data: "incompressible".into(),
            target: target.into(),
            iops: 1.0,
            gb_per_s,
            latency: Latency {
                p50_us: 1.0,
                p99_us: 1.0,
                p999_us: 1.0,
            },
        };
        let svg = crate::plot::throughput_svg(&[
            row("array", "seq-read", 5.0),
            row("member", "seq-read", 9.0),
            row("array", "rand-write", 0.1),
        ])
        .unwrap()
        .replace('\n', "");
        for want in [">seq-read<", ">rand-write<", "GB/s (log scale)", ">member<"] {
            assert!(svg.contains(want), "{want} missing from the plot");
        }
    }
}
