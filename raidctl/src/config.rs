//! The daemon's config file (TOML): arrays to start with their exports, and
//! alert settings. `raidctl daemon --config FILE`; a daemon started on
//! demand by `raidctl start` reads STATE_DIR/raidctl.toml when it exists.

use crate::alerts::AlertConfig;
use crate::error::{CliError, Result};
use crate::protocol::Request;
use crate::registry::StateDir;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub array: Vec<ConfigArray>,
    pub alerts: Option<AlertConfig>,
    pub scrub: Option<ScrubSchedule>,
    pub metrics: Option<MetricsConfig>,
    pub health: Option<crate::daemon::HealthConfig>,
    pub remote: Option<RemoteConfig>,
    pub bitmap: Option<BitmapConfig>,
}

/// `[bitmap]`: the write-intent bitmap of every array served.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct BitmapConfig {
    /// How long a region's bit stays set after its last write (default 5,
    /// as md's bitmap): longer spares bitmap writes to workloads that come
    /// back to a region less often; a crash resyncs the regions written
    /// that long before it.
    #[serde(default = "default_linger")]
    pub linger_seconds: f64,
}

fn default_linger() -> f64 {
    raid_core::array::BITMAP_LINGER.as_secs_f64()
}

/// `[remote]`: network members.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// How long one I/O to a network member may take, reconnections
    /// included, before the member is given up and failed (default 30).
    #[serde(default = "default_remote_timeout")]
    pub timeout_seconds: f64,
    /// Whether the members' servers are trusted to say where their holes
    /// are (block status): off unless set, since a server answers from
    /// its filesystem's lseek, which on some (FUSE, NFS, ZFS) can call
    /// data not yet written back a hole, and a copy would skip it.
    #[serde(default)]
    pub trust_holes: bool,
}

fn default_remote_timeout() -> f64 {
    30.0
}

/// An absent `[remote]`: its fields' defaults.
impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            timeout_seconds: default_remote_timeout(),
            trust_holes: false,
        }
    }
}

/// `[metrics]`: serve Prometheus metrics.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// HOST:PORT to listen on, e.g. "127.0.0.1:9469".
    pub listen: String,
}

/// `[scrub]`: scrub every running array this often.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct ScrubSchedule {
    /// Hours between scrubs of an array (e.g. 168 for weekly).
    pub every_hours: f64,
    /// Repair what the scrub finds (default: report only).
    #[serde(default)]
    pub repair: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigArray {
    pub name: String,
    #[serde(default)]
    pub nbd: Option<String>,
    /// TLS for a TCP export: a directory with server-cert.pem and
    /// server-key.pem (and ca-cert.pem for `tls_verify_peer`).
    #[serde(default)]
    pub tls: Option<PathBuf>,
    #[serde(default)]
    pub tls_verify_peer: bool,
    /// Serve a non-loopback TCP address without TLS.
    #[serde(default)]
    pub insecure: bool,
    /// Only to import an array not yet recorded.
    #[serde(default)]
    pub members: Vec<PathBuf>,
    /// Parity engine: cpu, gpu or auto (default: the one recorded at create).
    #[serde(default)]
    pub parity: Option<String>,
}

/// A number of the config at `p` (`what`: "[section] key") inside
/// `range`, else the error that says what to give.
fn in_range(
    p: &std::path::Path,
    what: &str,
    v: f64,
    range: std::ops::RangeInclusive<f64>,
    give: &str,
) -> Result<()> {
    if v.is_finite() && range.contains(&v) {
        return Ok(());
    }
    Err(CliError::usage(format!(
        "{}: {what} = {v} is out of range: give {give}",
        p.display()
    )))
}

impl Config {
    /// The file named, else STATE_DIR/raidctl.toml if present, else empty.
    pub fn load(st: &StateDir, path: Option<&Path>) -> Result<Config> {
        let default = st.root.join("raidctl.toml");
        let p = match path {
            Some(p) => p.to_path_buf(),
            None if default.exists() => default,
            None => return Ok(Config::default()),
        };
        let text = std::fs::read_to_string(&p)
            .map_err(|e| CliError::not_found(format!("cannot read {}: {e}", p.display())))?;
        let c: Config = toml::from_str(&text).map_err(|e| {
            // toml's own message quotes the offending line, which may hold
            // the SMTP password: say where and what, never the text.
            let line = e
                .span()
                .map(|s| format!("line {}", text[..s.start].matches('\n').count() + 1))
                .unwrap_or_else(|| "somewhere".into());
            CliError::usage(format!(
                "{} is not a valid config: {line}: {}",
                p.display(),
                e.message()
            ))
        })?;
        if let Some(a) = &c.alerts {
            a.min_severity()
                .map_err(|e| CliError::usage(format!("{}: [alerts] {}", p.display(), e.msg)))?;
            a.addresses()
                .map_err(|e| CliError::usage(format!("{}: [alerts] {}", p.display(), e.msg)))?;
        }
        if let Some(s) = &c.scrub {
            // Zero (or less) would scrub without pause, each run an event
            // and an alert.
            if !(s.every_hours.is_finite() && s.every_hours > 0.0) {
                return Err(CliError::usage(format!(
                    "{}: [scrub] every_hours = {} is out of range: give a number of hours above 0 (168 is weekly)",
                    p.display(),
                    s.every_hours
                )));
            }
        }
        if let Some(m) = &c.metrics {
            crate::metrics::parse_listen(&m.listen)
                .map_err(|e| CliError::usage(format!("{}: [metrics] {}", p.display(), e.msg)))?;
        }
        if let Some(h) = &c.health {
            h.check()
                .map_err(|e| CliError::usage(format!("{}: {}", p.display(), e.msg)))?;
        }
        if let Some(r) = &c.remote {
            in_range(
                &p,
                "[remote] timeout_seconds",
                r.timeout_seconds,
                0.5..=3600.0,
                "0.5 to 3600",
            )?;
        }
        if let Some(b) = &c.bitmap {
            in_range(
                &p,
                "[bitmap] linger_seconds",
                b.linger_seconds,
                0.0..=3600.0,
                "0 to 3600 (5 is the default)",
            )?;
        }
        let mut names = std::collections::HashSet::new();
        for a in &c.array {
            if !names.insert(a.name.as_str()) {
                return Err(CliError::usage(format!(
                    "{}: array '{}' has two [[array]] entries: keep one",
                    p.display(),
                    a.name
                )));
            }
            if let Some(mode) = &a.parity {
                mode.parse::<raid_gpu::ParityMode>().map_err(|e| {
                    CliError::usage(format!("{}: array '{}': {e}", p.display(), a.name))
                })?;
            }
        }
        Ok(c)
    }

    /// How a daemon runs with this config: `start` at once, metrics on
    /// `metrics` when given (the command line wins over `[metrics]`).
    /// `path`: the file the config was read from (None: the state
    /// folder's raidctl.toml), read again by the alert sender.
    pub fn daemon_options(
        self,
        path: Option<&Path>,
        exit_when_idle: bool,
        start: Vec<Request>,
        metrics: Option<std::net::SocketAddr>,
    ) -> crate::daemon::DaemonOptions {
        let from_file = self
            .metrics
            .as_ref()
            .and_then(|m| crate::metrics::parse_listen(&m.listen).ok());
        let remote = self.remote.unwrap_or_default();
        crate::daemon::DaemonOptions {
            exit_when_idle,
            start,
            alerts: self.alerts,
            config: path.map(Path::to_path_buf),
            scrub: self.scrub,
            metrics: metrics.or(from_file),
            health: self.health.unwrap_or_default(),
            remote_timeout: Duration::from_secs_f64(remote.timeout_seconds),
            remote_trust_holes: remote.trust_holes,
            bitmap_linger: self.bitmap.map_or(raid_core::array::BITMAP_LINGER, |b| {
                Duration::from_secs_f64(b.linger_seconds)
            }),
        }
    }

    /// The starts the config asks for. An entry's `members` only imports
    /// an array not recorded in `st`: for one recorded they are left out
    /// (and that is logged), so a stale list never overrides the record and
    /// leaves a member it does not name out of the array.
    pub fn starts(&self, st: &StateDir) -> Vec<Request> {
        self.array
            .iter()
            .map(|a| Request::Start {
                name: a.name.clone(),
                members: match (a.members.is_empty(), st.load(&a.name)) {
                    (false, Ok(_)) => {
                        tracing::warn!(array = %a.name, "the config's members are ignored: they only import an array not yet recorded, and this one is (its record names its devices)");
                        vec![]
                    }
                    _ => a.members.clone(),
                },
                nbd: a.nbd.clone(),
                tls: a.tls.clone(),
                tls_verify_peer: a.tls_verify_peer,
                insecure: a.insecure,
                parity: a.parity.clone(),
                force: false,
                listed: false,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config> {
        let dir = std::env::temp_dir().join(format!(
            "raidctl-config-{}-{}",
            std::process::id(),
            text.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("raidctl.toml");
        std::fs::write(&p, text).unwrap();
        let st = StateDir { root: dir.clone() };
        let r = Config::load(&st, Some(&p));
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    /// What makes alerts or the schedule unusable is refused at load, by
    /// the rule it breaks (a daemon used to start with alerts that could
    /// never go, retrying them for ever, or scrub without pause); the
    /// example's `[alerts]` without `security` loads (STARTTLS).
    #[test]
    fn alerts_and_schedule_are_checked_at_load() {
        let alerts = |extra: &str| {
            format!(
                "[alerts]\nsmtp_host = \"mail.example.com\"\nfrom = \"raid@example.com\"\n{extra}"
            )
        };
        let c = load(&alerts("to = [\"ops@example.com\"]\n")).unwrap();
        assert_eq!(
            c.alerts.unwrap().security,
            crate::alerts::Security::Starttls
        );
        let e = load(&alerts("to = []\n")).err().unwrap();
        assert!(e.msg.contains("no recipient"), "{}", e.msg);
        let e = load(&alerts("to = [\"not an address\"]\n")).err().unwrap();
        assert!(e.msg.contains("recipient 'not an address'"), "{}", e.msg);
        for bad in ["0", "-5", "nan"] {
            let e = load(&format!("[scrub]\nevery_hours = {bad}\n"))
                .err()
                .unwrap();
            assert!(e.msg.contains("every_hours"), "{bad}: {}", e.msg);
        }
        assert!(load("[scrub]\nevery_hours = 168\n").is_ok());
    }

    /// `[bitmap] linger_seconds` reaches the daemon's options; out of its
    /// range it is refused at load, naming the range.
    #[test]
    fn the_bitmap_linger_is_read_and_checked() {
        let linger = |c: Config| c.daemon_options(None, false, vec![], None).bitmap_linger;
        assert_eq!(linger(load("").unwrap()), Duration::from_secs(5));
        let c = load("[bitmap]\nlinger_seconds = 0.5\n").unwrap();
        assert_eq!(linger(c), Duration::from_millis(500));
        for bad in ["-1", "nan", "7200"] {
            let e = load(&format!("[bitmap]\nlinger_seconds = {bad}\n"))
                .err()
                .unwrap();
            assert!(
                e.msg.contains("linger_seconds") && e.msg.contains("0 to 3600"),
                "{bad}: {}",
                e.msg
            );
        }
    }

    #[test]
    fn an_array_entry_carries_its_parity_engine_to_start() {
        let c = load("[[array]]\nname = \"data\"\nparity = \"gpu\"\n").unwrap();
        let none = StateDir {
            root: std::env::temp_dir().join("raidctl-config-no-state"),
        };
        match &c.starts(&none)[..] {
            [Request::Start { name, parity, .. }] => {
                assert_eq!(name, "data");
                assert_eq!(parity.as_deref(), Some("gpu"));
            }
            other => panic!("{} starts", other.len()),
        }
        // A syntax error names the line, never echoes it (a password).
        let Err(e) = load("[alerts]\npassword = \"hunter2\nto = [\"a@b\"]\n") else {
            panic!("a broken config was accepted");
        };
        assert!(e.msg.contains("line 2"), "{}", e.msg);
        assert!(
            !e.msg.contains("hunter2"),
            "the secret was echoed: {}",
            e.msg
        );
        let Err(e) = load("[[array]]\nname = \"data\"\nparity = \"tpu\"\n") else {
            panic!("parity = \"tpu\" was accepted");
        };
        let msg = e.to_string();
        assert!(
            msg.contains("array 'data'") && msg.contains("'tpu' is not one of cpu, gpu, auto"),
            "{msg}"
        );
    }
}
