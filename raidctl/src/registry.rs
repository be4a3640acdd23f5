//! The state directory: where arrays are recorded (one TOML file each), and
//! where the daemon keeps its socket and log. Default /var/lib/raidctl;
//! `--state-dir` or RAIDCTL_STATE_DIR override it, so tests never touch the
//! system's.

use crate::error::{CliError, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const DEFAULT_STATE_DIR: &str = "/var/lib/raidctl";
pub const STATE_DIR_ENV: &str = "RAIDCTL_STATE_DIR";

/// What `create` records about an array, and `start` reads back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ArrayRecord {
    pub name: String,
    pub uuid: String,
    pub level: u32,
    pub chunk: u64,
    /// Members in slot order, as absolute paths.
    pub members: Vec<PathBuf>,
    #[serde(default)]
    pub spares: Vec<PathBuf>,
    /// cpu, gpu or auto.
    pub parity: String,
}

#[derive(Clone, Debug)]
pub struct StateDir {
    pub root: PathBuf,
}

impl StateDir {
    pub fn resolve(flag: Option<PathBuf>) -> StateDir {
        let root = flag
            .or_else(|| std::env::var_os(STATE_DIR_ENV).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        StateDir { root }
    }

    pub fn socket(&self) -> PathBuf {
        self.root.join("raidctl.sock")
    }
    pub fn log(&self) -> PathBuf {
        self.root.join("daemon.log")
    }
    fn arrays(&self) -> PathBuf {
        self.root.join("arrays")
    }
    fn record_path(&self, name: &str) -> PathBuf {
        self.arrays().join(format!("{name}.toml"))
    }

    /// Creates the state directory (mode 0700: it holds member paths,
    /// alert settings and the daemon's socket), and tightens one an older
    /// version left open.
    pub fn ensure(&self) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(self.arrays()).map_err(|e| {
            CliError::failed(format!(
                "cannot create state directory {}: {e} (choose another with --state-dir or {STATE_DIR_ENV})",
                self.root.display()
            ))
        })?;
        for (p, mode) in [
            (self.root.clone(), 0o700),
            (self.arrays(), 0o700),
            (self.log(), 0o600),
        ] {
            if std::fs::metadata(&p).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode));
            }
        }
        Ok(())
    }

    pub fn exists(&self, name: &str) -> bool {
        self.record_path(name).exists()
    }

    pub fn load(&self, name: &str) -> Result<ArrayRecord> {
        let p = self.record_path(name);
        let text = std::fs::read_to_string(&p).map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                return CliError::daemon(format!(
                    "permission denied on {}: run raidctl as root (or as the user that owns {})",
                    p.display(),
                    self.root.display()
                ));
            }
            CliError::not_found(format!(
                "no array named '{name}' in {} (raidctl list shows the known arrays; raidctl start {name} --members ... imports one)",
                self.root.display()
            ))
        })?;
        toml::from_str(&text)
            .map_err(|e| CliError::failed(format!("{} is corrupt: {e}", p.display())))
    }

    pub fn save(&self, r: &ArrayRecord) -> Result<()> {
        self.ensure()?;
        let p = self.record_path(&r.name);
        let tmp = p.with_extension("toml.tmp");
        let text = toml::to_string_pretty(r).expect("record serialises");
        std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, &p))
            .map_err(|e| CliError::failed(format!("cannot write {}: {e}", p.display())))
    }

    pub fn list(&self) -> Vec<ArrayRecord> {
        let mut out: Vec<ArrayRecord> = std::fs::read_dir(self.arrays())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|t| toml::from_str(&t).ok())
            .collect();
        out.sort_by(|a: &ArrayRecord, b| a.name.cmp(&b.name));
        out
    }

    /// The recorded array (other than `except`) that lists `path`.
    pub fn owner_of(&self, path: &Path, except: Option<&str>) -> Option<ArrayRecord> {
        self.list()
            .into_iter()
            .filter(|r| Some(r.name.as_str()) != except)
            .find(|r| r.members.iter().chain(&r.spares).any(|m| m == path))
    }
}

/// Array names become file names and appear in metadata: keep them plain.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= raid_core::metadata::NAME_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(CliError::usage(format!(
            "array name '{name}' is invalid: use 1 to {} letters, digits, '.', '_' or '-', not starting with '.'",
            raid_core::metadata::NAME_LEN
        )))
    }
}
