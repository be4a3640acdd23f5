//! Drive health (SMART) of array members: what `smartctl` and `nvme-cli` say
//! about the physical drive under a member, and which figures deserve a
//! warning before the drive fails outright and the array degrades.
//!
//! The module runs the tools and does not issue ioctls itself. SMART
//! passthrough differs per transport (ATA behind SAT or USB bridges, SCSI log
//! pages, NVMe admin commands), and smartmontools and nvme-cli already handle
//! all of them. Only their JSON output is parsed. That output is versioned and
//! changes less than their text output. Real outputs are kept in
//! `tests/data/health/` (see SOURCES.md there).

use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Model, serial, firmware and the health figures of one drive.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct DriveHealth {
    /// "nvme", "ata" or "scsi" ("unknown" when smartctl names no protocol).
    pub kind: String,
    pub model: Option<String>,
    pub serial: Option<String>,
    pub firmware: Option<String>,
    /// NVMe critical warning bitfield (the bits are decoded in [`warnings`]).
    pub critical_warning: Option<u8>,
    /// NVMe media and data integrity errors: data the drive could not recover.
    pub media_errors: Option<u64>,
    pub available_spare_percent: Option<u8>,
    pub available_spare_threshold_percent: Option<u8>,
    /// NVMe endurance used, the vendor's estimate; may exceed 100.
    pub percentage_used: Option<u8>,
    pub temperature_celsius: Option<i64>,
    /// smartctl's overall assessment: the drive's own verdict.
    pub smart_passed: Option<bool>,
    /// ATA attribute 5 raw.
    pub reallocated_sectors: Option<u64>,
    /// ATA attribute 197 raw.
    pub pending_sectors: Option<u64>,
    /// ATA attribute 198 raw.
    pub offline_uncorrectable: Option<u64>,
    /// SCSI grown defect list length.
    pub grown_defects: Option<u64>,
}

/// The levels at which an operator wants a warning. Wear and heat are
/// matters of policy. Every other rule in [`warnings`] reports a fact about
/// the drive and needs no setting.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthThresholds {
    /// Warn once NVMe endurance used reaches this percentage.
    #[serde(default = "default_percentage_used")]
    pub percentage_used: u8,
    /// Warn once the drive reaches this temperature.
    #[serde(default = "default_temperature_celsius")]
    pub temperature_celsius: i64,
}

fn default_percentage_used() -> u8 {
    90
}

fn default_temperature_celsius() -> i64 {
    70
}

impl Default for HealthThresholds {
    fn default() -> Self {
        Self {
            percentage_used: default_percentage_used(),
            temperature_celsius: default_temperature_celsius(),
        }
    }
}

/// Kelvin to Celsius as nvme-cli and smartctl both convert it (273, not
/// 273.15), so that the figures agree with what those tools print.
const KELVIN_OFFSET: i64 = 273;

/// How long one tool run may take. A dying drive in error recovery can hang
/// a SMART query for minutes, and that must not block the daemon.
const TOOL_TIMEOUT: Duration = Duration::from_secs(20);

/// Parses the output of `smartctl -j -a DEV` (or `-x`) for ATA, SCSI and NVMe
/// devices. An error means smartctl could not read the device: bits 0-1 of
/// its exit status (embedded in the JSON) are set, or no drive data came back.
/// Higher status bits (failing disk, prefail attributes, error-log entries)
/// come with valid data, and this function reads that data.
pub fn parse_smartctl_json(text: &str) -> Result<DriveHealth, String> {
    let root = parse_object(text, "smartctl output")?;
    let exit = at(&root, "/smartctl/exit_status")
        .and_then(as_u64)
        .unwrap_or(0);
    if exit & 0b11 != 0 {
        let messages = at(&root, "/smartctl/messages").and_then(Value::as_array);
        let texts: Vec<&str> = messages
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("string").and_then(Value::as_str))
            .collect();
        let sep = if texts.is_empty() { "" } else { ": " };
        let texts = texts.join("; ");
        return Err(format!(
            "smartctl could not read the device (exit status {exit}){sep}{texts}"
        ));
    }
    let (protocol, dtype) = (
        str_at(&root, "/device/protocol"),
        str_at(&root, "/device/type"),
    );
    let nvme = root.get("nvme_smart_health_information_log");
    let table = at(&root, "/ata_smart_attributes/table").and_then(Value::as_array);
    let kind = match protocol.to_ascii_lowercase().as_str() {
        "nvme" => "nvme",
        "ata" => "ata",
        "scsi" => "scsi",
        _ if nvme.is_some() || dtype == "nvme" => "nvme",
        _ if table.is_some() || dtype == "sat" || dtype == "ata" => "ata",
        _ if root.get("scsi_grown_defect_list").is_some() || dtype == "scsi" => "scsi",
        _ => "unknown",
    };
    let nvme_u8 = |key: &str| nvme.and_then(|l| l.get(key)).and_then(as_u8);
    // smartctl up to 7.3 names a SCSI drive "model_name" and "revision". 7.4
    // renamed them "scsi_model_name" and "scsi_revision" (both are sampled).
    let firmware = first(&root, &["firmware_version", "scsi_revision", "revision"]);
    let temperature = at(&root, "/temperature/current").or(nvme.and_then(|l| l.get("temperature")));
    let h = DriveHealth {
        kind: kind.to_string(),
        model: first(&root, &["model_name", "scsi_model_name"]).and_then(trimmed),
        serial: root.get("serial_number").and_then(trimmed),
        firmware: firmware.and_then(trimmed),
        critical_warning: nvme_u8("critical_warning")
            .or_else(|| at(&root, "/smart_status/nvme/value").and_then(as_u8)),
        media_errors: nvme.and_then(|l| l.get("media_errors")).and_then(as_u64),
        available_spare_percent: nvme_u8("available_spare"),
        available_spare_threshold_percent: nvme_u8("available_spare_threshold"),
        percentage_used: nvme_u8("percentage_used"),
        // smartctl reports both temperatures in Celsius already.
        temperature_celsius: temperature.and_then(as_i64),
        smart_passed: at(&root, "/smart_status/passed").and_then(Value::as_bool),
        reallocated_sectors: ata_raw(table, 5),
        pending_sectors: ata_raw(table, 197),
        offline_uncorrectable: ata_raw(table, 198),
        grown_defects: root.get("scsi_grown_defect_list").and_then(as_u64),
    };
    let empty = DriveHealth {
        kind: h.kind.clone(),
        ..DriveHealth::default()
    };
    if h == empty {
        return Err(format!(
            "smartctl output holds no drive data (exit status {exit})"
        ));
    }
    Ok(h)
}

/// Parses the output of `nvme smart-log -o json DEV`: only the health figures
/// (kind "nvme"). [`parse_nvme_id_ctrl_json`] adds the drive's identity.
///
/// nvme-cli's JSON output has changed across versions, and this accepts:
/// - `critical_warning` as a number, or, in verbose/`-H` output (nvme-cli
///   1.11 and later), as an object of decoded bits whose `"value"` is the byte;
/// - `temperature` in Kelvin as a number (every version's default), or as a
///   string with a unit ("35 C", "308 K");
/// - `avail_spare`/`spare_thresh`/`percent_used` (nvme-cli's own names) or
///   smartctl's `available_spare`/`available_spare_threshold`/`percentage_used`;
/// - counters as integers, or as floats like `0.0` (nvme-cli 1.x printed its
///   128-bit counters as doubles; 2.x prints big integers);
/// - keys in any case (nvme-cli 2.7 briefly printed "Temperature" and "Value",
///   until 565b322b, "nvme-print-json: Revert field name changes").
pub fn parse_nvme_smart_log_json(text: &str) -> Result<DriveHealth, String> {
    let root = parse_object(text, "nvme smart-log output")?;
    let critical_warning = match field(&root, "critical_warning") {
        Some(bits) if bits.is_object() => field(bits, "value").and_then(as_u8),
        Some(v) => as_u8(v),
        None => None,
    };
    let h = DriveHealth {
        kind: "nvme".to_string(),
        critical_warning,
        media_errors: field(&root, "media_errors").and_then(as_u64),
        available_spare_percent: byte(&root, &["avail_spare", "available_spare"]),
        available_spare_threshold_percent: byte(
            &root,
            &["spare_thresh", "available_spare_threshold"],
        ),
        percentage_used: byte(&root, &["percent_used", "percentage_used"]),
        temperature_celsius: field(&root, "temperature").and_then(nvme_cli_temperature),
        ..DriveHealth::default()
    };
    let figures = [
        h.available_spare_percent,
        h.percentage_used,
        h.critical_warning,
    ];
    if figures.iter().all(Option::is_none) && h.media_errors.is_none() {
        return Err("nvme smart-log output has none of its health fields".to_string());
    }
    Ok(h)
}

/// Parses `nvme id-ctrl -o json DEV` into `into`'s model ("mn"), serial ("sn")
/// and firmware ("fr"), trimmed: the controller pads these fields with spaces
/// to a fixed width, and older nvme-cli passed the padding through. Fields
/// absent from the output leave `into` unchanged.
pub fn parse_nvme_id_ctrl_json(text: &str, into: &mut DriveHealth) -> Result<(), String> {
    let root = parse_object(text, "nvme id-ctrl output")?;
    let model = field(&root, "mn").and_then(trimmed);
    let serial = field(&root, "sn").and_then(trimmed);
    let firmware = field(&root, "fr").and_then(trimmed);
    if model.is_none() && serial.is_none() && firmware.is_none() {
        return Err("nvme id-ctrl output has none of mn, sn, fr".to_string());
    }
    into.model = model.or(into.model.take());
    into.serial = serial.or(into.serial.take());
    into.firmware = firmware.or(into.firmware.take());
    Ok(())
}

/// The parsed text, which must be a JSON object.
fn parse_object(text: &str, what: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err(format!("{what} is JSON but not an object")),
        Err(e) => Err(format!("{what} is not JSON: {e}")),
    }
}

/// A JSON pointer ("/a/b") into `v`.
fn at<'a>(v: &'a Value, pointer: &str) -> Option<&'a Value> {
    v.pointer(pointer)
}

/// The string at a JSON pointer, "" when absent.
fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// `key` in object `v`, exactly, else ignoring ASCII case (nvme-cli 2.7).
fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    let obj = v.as_object()?;
    let loose = || obj.iter().find(|(k, _)| k.eq_ignore_ascii_case(key));
    obj.get(key).or_else(|| loose().map(|(_, v)| v))
}

/// The first of `keys` present in object `v`.
fn first<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| field(v, k))
}

fn byte(v: &Value, keys: &[&str]) -> Option<u8> {
    first(v, keys).and_then(as_u8)
}

fn trimmed(v: &Value) -> Option<String> {
    let s = v.as_str()?.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// A whole number from a JSON integer, an integral float (nvme-cli 1.x), or a
/// numeric string.
fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            let f = n.as_f64()?;
            (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.2e18).then_some(f as i64)
        }),
        Value::String(s) => leading_int(s),
        _ => None,
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    as_i64(v).and_then(|n| u64::try_from(n).ok())
}

/// A byte-sized field. The NVMe fields are bytes, so values above 255 do not
/// occur in valid output and are clamped to 255.
fn as_u8(v: &Value) -> Option<u8> {
    as_u64(v).map(|n| n.min(255) as u8)
}

/// The integer a string starts with ("1,975", "100%", "-5 C").
fn leading_int(s: &str) -> Option<i64> {
    let s = s.trim_start();
    let (sign, rest) = s.strip_prefix('-').map_or((1, s), |r| (-1, r));
    let digits = rest.chars().take_while(|c| c.is_ascii_digit() || *c == ',');
    let digits: String = digits.filter(char::is_ascii_digit).collect();
    digits.parse::<i64>().ok().map(|n| sign * n)
}

/// nvme-cli's composite temperature in Celsius: a number is Kelvin; a string
/// carries its unit ("35 C", "49 °C (322 Kelvin)", "308 K"). 0 K means that
/// no temperature was reported.
fn nvme_cli_temperature(v: &Value) -> Option<i64> {
    let (n, unit) = match v {
        Value::String(s) => {
            let number = |c: char| c == '-' || c == ',' || c.is_ascii_digit();
            let unit = s.trim_start().trim_start_matches(number).trim_start();
            (leading_int(s)?, unit.chars().next().unwrap_or('K'))
        }
        other => (as_i64(other)?, 'K'),
    };
    match unit {
        'C' | 'c' | '°' => Some(n),
        'K' | 'k' => (n > 0).then_some(n - KELVIN_OFFSET),
        _ => None,
    }
}

/// Raw value of ATA attribute `id`. smartctl's `raw.string` is preferred:
/// it is smartctl's per-drive reading of the 48-bit raw field, while
/// `raw.value` may pack several numbers on some drives. The two agree for
/// plain counts.
fn ata_raw(table: Option<&Vec<Value>>, id: u64) -> Option<u64> {
    let is_id = |a: &&Value| a.get("id").and_then(Value::as_u64) == Some(id);
    let raw = table?.iter().find(is_id)?.get("raw")?;
    let shown = raw
        .get("string")
        .and_then(Value::as_str)
        .and_then(leading_int);
    let shown = shown.and_then(|n| u64::try_from(n).ok());
    shown.or_else(|| raw.get("value").and_then(as_u64))
}

/// The reasons this drive deserves a warning now, one sentence each for an
/// operator (empty: healthy). A figure the tool did not report is not judged:
/// missing data does not count as a problem here.
///
/// Rules: any NVMe critical-warning bit; media errors > 0; available spare at
/// or below its threshold (when the threshold is above 0); endurance used at
/// or above `t.percentage_used`; temperature at or above
/// `t.temperature_celsius`; a failed overall SMART assessment; reallocated,
/// pending or offline-uncorrectable sectors, or grown defects, above 0.
pub fn warnings(h: &DriveHealth, t: &HealthThresholds) -> Vec<String> {
    let mut w = Vec::new();
    let cw = h.critical_warning.unwrap_or(0);
    w.extend(
        (0..8u8)
            .filter(|&bit| cw & (1u8 << bit) != 0)
            .map(critical_warning_sentence),
    );
    if let Some(n) = h.media_errors.filter(|&n| n > 0) {
        w.push(format!(
            "{n} media and data integrity errors: data the drive could not recover"
        ));
    }
    if let (Some(spare), Some(threshold)) = (
        h.available_spare_percent,
        h.available_spare_threshold_percent,
    ) {
        if threshold > 0 && spare <= threshold {
            w.push(format!(
                "available spare is {spare}%, at or below the drive's threshold of {threshold}%"
            ));
        }
    }
    if let Some(used) = h.percentage_used.filter(|&u| u >= t.percentage_used) {
        w.push(format!(
            "endurance used is {used}% (warning from {}%): plan to replace the drive",
            t.percentage_used
        ));
    }
    if let Some(c) = h
        .temperature_celsius
        .filter(|&c| c >= t.temperature_celsius)
    {
        w.push(format!(
            "temperature is {c} °C (warning from {} °C)",
            t.temperature_celsius
        ));
    }
    if h.smart_passed == Some(false) {
        w.push("the drive's own SMART overall-health self-assessment says FAILED".to_string());
    }
    let mut count = |n: Option<u64>, what: &str| {
        if let Some(n) = n.filter(|&n| n > 0) {
            w.push(format!("{n} {what}"));
        }
    };
    count(
        h.reallocated_sectors,
        "reallocated sectors (ATA attribute 5)",
    );
    count(
        h.pending_sectors,
        "sectors pending reallocation (ATA attribute 197)",
    );
    count(
        h.offline_uncorrectable,
        "offline uncorrectable sectors (ATA attribute 198)",
    );
    count(h.grown_defects, "entries in the SCSI grown defect list");
    w
}

/// The NVMe base specification's meaning of each critical-warning bit.
fn critical_warning_sentence(bit: u8) -> String {
    let what = match bit {
        0 => "available spare capacity has fallen below the threshold",
        1 => "temperature is beyond the drive's over- or under-temperature threshold",
        2 => "NVM subsystem reliability is degraded by media or internal errors",
        3 => "the media has been placed in read-only mode",
        4 => "the volatile memory backup device has failed",
        5 => "the persistent memory region has become read-only or unreliable",
        _ => "a bit reserved by the specification is set",
    };
    format!("NVMe critical warning bit {bit}: {what}")
}

/// What probing a member found.
#[derive(Clone, Debug, PartialEq)]
pub enum Probe {
    Drive(DriveHealth),
    /// A regular file, loop device, tmpfs, device-mapper, md, nbd or another
    /// device with no physical drive of its own under it.
    NotADrive,
    /// The tool to install, as advice for the operator.
    NoTool(String),
    Failed(String),
}

/// Reads a member's health. Only block devices are probed, with symlinks
/// (/dev/disk/by-id/...) resolved. A partition is probed through its whole
/// disk, since SMART data belongs to the disk. NVMe devices use nvme-cli
/// (`smart-log` and `id-ctrl`), falling back to smartctl. All other devices
/// use `smartctl -j -a`.
///
/// The programs can be overridden through `RAIDCTL_SMARTCTL` and
/// `RAIDCTL_NVME`, so that an end-to-end test can use a script in their place.
pub fn probe(path: &Path) -> Probe {
    // A network member's drive is read on its own host.
    if crate::remote::is_remote(path) {
        return Probe::NotADrive;
    }
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return Probe::Failed(format!("{}: {e}", path.display())),
    };
    if !meta.file_type().is_block_device() {
        // RAIDCTL_HEALTH_FILES=1 asks the tool about member files too: the
        // end-to-end test's way to drive warnings, events and alerts from a
        // recorded tool output on a machine without drives.
        if meta.is_file() && std::env::var_os("RAIDCTL_HEALTH_FILES").is_some() {
            return probe_smartctl(path);
        }
        return Probe::NotADrive;
    }
    let real: PathBuf = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let Some(name) = real.file_name().and_then(OsStr::to_str) else {
        return Probe::Failed(format!("{}: no device name", real.display()));
    };
    let disk = whole_disk(name);
    if is_virtual(&disk) {
        return Probe::NotADrive;
    }
    let disk_node = Path::new("/dev").join(&disk);
    let dev = if disk != name && disk_node.exists() {
        disk_node
    } else {
        real.clone()
    };
    if disk.starts_with("nvme") {
        probe_nvme(&dev)
    } else {
        probe_smartctl(&dev)
    }
}

/// The whole disk under a partition ("sda3" -> "sda", "nvme0n1p2" ->
/// "nvme0n1"). In sysfs, a partition's directory sits inside its disk's.
fn whole_disk(name: &str) -> String {
    let sys = Path::new("/sys/class/block").join(name);
    if sys.join("partition").exists() {
        if let Ok(p) = std::fs::canonicalize(&sys) {
            if let Some(parent) = p.parent().and_then(Path::file_name).and_then(OsStr::to_str) {
                return parent.to_string();
            }
        }
    }
    name.to_string()
}

/// Whether a block device has no drive of its own to ask: loop (including
/// loop over a FUSE file), ram, zram, device-mapper, md, nbd, ublk, and
/// virtio/Xen disks, which have no SMART passthrough. Other names are also
/// checked in sysfs: a block device with no `device` link has no hardware
/// under it (FUSE- or userspace-backed, rbd, ...).
fn is_virtual(name: &str) -> bool {
    if name.starts_with("nvme") {
        return false;
    }
    const PREFIXES: [&str; 9] = [
        "loop", "ram", "zram", "dm-", "md", "nbd", "ublkb", "vd", "xvd",
    ];
    if PREFIXES.iter().any(|p| name.starts_with(p)) {
        return true;
    }
    let sys = Path::new("/sys/class/block").join(name);
    sys.exists() && !sys.join("device").exists()
}

fn probe_nvme(dev: &Path) -> Probe {
    let nvme = program("RAIDCTL_NVME", "nvme");
    let log_args = nvme_args("smart-log", dev);
    // None: nvme-cli is not installed; Some: why it could not be used.
    let nvme_error = match run_tool(&nvme, &log_args) {
        Ok(out) if out.status.success() => match parse_nvme_smart_log_json(&out.stdout) {
            Ok(mut h) => {
                // The identity is a bonus: the health figures stand without it.
                let why = match run_tool(&nvme, &nvme_args("id-ctrl", dev)) {
                    Ok(o) if o.status.success() => parse_nvme_id_ctrl_json(&o.stdout, &mut h).err(),
                    Ok(o) => Some(format!("nvme id-ctrl exited with {}", o.status)),
                    Err(ToolError::NotFound) => None,
                    Err(ToolError::Failed(e)) => Some(e),
                };
                if let Some(why) = why {
                    tracing::debug!(dev = %dev.display(), "no drive identity: {why}");
                }
                return Probe::Drive(h);
            }
            Err(e) => Some(e),
        },
        Ok(out) => Some(with_stderr(
            format!(
                "{} exited with {}",
                command_line(&nvme, &log_args),
                out.status
            ),
            &out.stderr,
        )),
        Err(ToolError::NotFound) => None,
        Err(ToolError::Failed(e)) => Some(e),
    };
    if let Some(e) = &nvme_error {
        tracing::debug!(dev = %dev.display(), "nvme-cli failed, trying smartctl: {e}");
    }
    match (probe_smartctl(dev), nvme_error) {
        (Probe::NoTool(_), None) => Probe::NoTool("install nvme-cli or smartmontools".to_string()),
        (Probe::NoTool(_), Some(e)) => Probe::Failed(e),
        (Probe::Failed(e), Some(n)) => Probe::Failed(format!("{n}; {e}")),
        (other, _) => other,
    }
}

/// `nvme CMD -o json DEV`: works on the controller and on a namespace.
fn nvme_args<'a>(cmd: &'a str, dev: &'a Path) -> [&'a OsStr; 4] {
    [
        OsStr::new(cmd),
        OsStr::new("-o"),
        OsStr::new("json"),
        dev.as_os_str(),
    ]
}

fn probe_smartctl(dev: &Path) -> Probe {
    let smartctl = program("RAIDCTL_SMARTCTL", "smartctl");
    let args = [OsStr::new("-j"), OsStr::new("-a"), dev.as_os_str()];
    let out = match run_tool(&smartctl, &args) {
        Ok(out) => out,
        Err(ToolError::NotFound) => return Probe::NoTool("install smartmontools".to_string()),
        Err(ToolError::Failed(e)) => return Probe::Failed(e),
    };
    // smartctl's exit status is a bitmask (smartctl(8), RETURN VALUES). Bits
    // 0-1 mean the command line or the device open failed. Higher bits
    // report findings (failing disk, prefail attributes, logged errors) and
    // come with valid JSON, so only bits 0-1 count as failure.
    let opened = matches!(out.status.code(), Some(c) if c & 0b11 == 0);
    match parse_smartctl_json(&out.stdout) {
        Ok(h) if opened => Probe::Drive(h),
        Ok(_) => Probe::Failed(with_stderr(
            format!(
                "{} exited with {}",
                command_line(&smartctl, &args),
                out.status
            ),
            &out.stderr,
        )),
        Err(e) => Probe::Failed(with_stderr(e, &out.stderr)),
    }
}

/// The program to run: the environment override when set, else the tool's
/// usual name (looked up in PATH).
fn program(var: &str, default: &str) -> OsString {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.into())
}

struct ToolOutput {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

enum ToolError {
    /// The program does not exist: the operator has to install it.
    NotFound,
    Failed(String),
}

/// Runs a tool with [`TOOL_TIMEOUT`]. Its output is read on threads while it
/// runs, so that a large `smartctl -x` report cannot fill a pipe and stall
/// the tool. The tool gets its own process group, so that a timeout kills
/// anything it started as well.
fn run_tool(prog: &OsStr, args: &[&OsStr]) -> Result<ToolOutput, ToolError> {
    let shown = command_line(prog, args);
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ToolError::NotFound,
            _ => ToolError::Failed(format!("{shown}: {e}")),
        })?;
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    let deadline = Instant::now() + TOOL_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let secs = TOOL_TIMEOUT.as_secs();
                break Err(format!("{shown}: no answer within {secs} s, killed"));
            }
            Err(e) => break Err(format!("{shown}: {e}")),
        }
    };
    if status.is_err() {
        kill_group(&mut child);
    } else if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // Anything the tool left running holds our pipes open: its group
        // goes too, so reading the output below ends.
        // SAFETY: kill(2) on the group the child led; touches no memory.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let (stdout, stderr) = (collect(stdout), collect(stderr));
    Ok(ToolOutput {
        status: status.map_err(ToolError::Failed)?,
        stdout,
        stderr,
    })
}

fn drain<R: Read + Send + 'static>(mut r: R) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// The output a drain thread read, waiting at most a few seconds for it
/// (a pipe some process still holds open is given up, not waited on).
fn collect(h: Option<JoinHandle<Vec<u8>>>) -> String {
    let until = Instant::now() + Duration::from_secs(5);
    let h = h.filter(|h| {
        while !h.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        h.is_finished()
    });
    let bytes = h.and_then(|h| h.join().ok()).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Kills the tool's whole process group. This is called only before the
/// child has been reaped, so the group id cannot yet belong to anyone else.
fn kill_group(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours;
        // -pid names the group the child leads (process_group(0) above).
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn command_line(prog: &OsStr, args: &[&OsStr]) -> String {
    let mut words = vec![prog.to_string_lossy()];
    words.extend(args.iter().map(|a| a.to_string_lossy()));
    words.join(" ")
}

fn with_stderr(msg: String, stderr: &str) -> String {
    match stderr.trim() {
        "" => msg,
        e => format!("{msg}: {e}"),
    }
}

#[cfg(test)]
mod tests;
