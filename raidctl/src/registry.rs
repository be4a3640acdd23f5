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
    /// `raidctl rate`'s limits, bytes per second (0: none), kept across
    /// restarts; None: the daemon's environment decides at each start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild_rate: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub_rate: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct StateDir {
    pub root: PathBuf,
}

/// A record that cannot be read, and how to make it again: its array's
/// members carry everything it says.
fn corrupt(p: &Path, name: &str, why: &str) -> String {
    let why = why.lines().next().unwrap_or_default();
    format!(
        "{} is corrupt ({why}): the array's members carry its metadata, so raidctl start {name} --members DEVICE... (or --scan DIR...) writes it again",
        p.display()
    )
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

    /// Where the scrub schedule remembers the last scrub of array `name`
    /// (seconds since the epoch): one that completed, or was cancelled.
    pub fn scrub_last(&self, name: &str) -> PathBuf {
        self.root.join("scrub").join(format!("{name}.last"))
    }

    /// Where a running scrub of array `name` is marked (`repair` or
    /// `check`): one the daemon never saw end is said at the next start.
    pub fn scrub_running(&self, name: &str) -> PathBuf {
        self.root.join("scrub").join(format!("{name}.running"))
    }

    /// Removes the scrub marks kept under `name`: those of another array
    /// once one is created, deleted or imported under that name.
    pub fn remove_scrub_marks(&self, name: &str) {
        let _ = std::fs::remove_file(self.scrub_last(name));
        let _ = std::fs::remove_file(self.scrub_running(name));
    }

    /// Creates the state directory (mode 0700: it holds member paths,
    /// alert settings and the daemon's socket), and tightens one an older
    /// version left open.
    pub fn ensure(&self) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(self.arrays()).map_err(|e| {
            // It may exist and be read-only (a read-only mount): then it
            // is its arrays folder that could not be made.
            let what = match self.root.is_dir() {
                true => format!("cannot write in state directory {}", self.root.display()),
                false => format!("cannot create state directory {}", self.root.display()),
            };
            CliError::failed(format!(
                "{what}: {e} (make it writable, or choose another with --state-dir or {STATE_DIR_ENV})"
            ))
        })?;
        for (p, mode) in [
            (self.root.clone(), 0o700),
            (self.arrays(), 0o700),
            (self.log(), 0o600),
            // The alert settings (an SMTP password, say).
            (self.root.join("raidctl.toml"), 0o600),
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
        toml::from_str(&text).map_err(|e| CliError::failed(corrupt(&p, name, &e.to_string())))
    }

    /// Writes the record; block devices are recorded under a stable name
    /// (`/dev/disk/by-id/...`) where one exists, since `/dev/nvme1n1` can
    /// name another drive after a reboot.
    pub fn save(&self, r: &ArrayRecord) -> Result<()> {
        self.ensure()?;
        let mut r = r.clone();
        for p in r.members.iter_mut().chain(r.spares.iter_mut()) {
            *p = stable_name(p, Path::new(BY_ID));
        }
        let r = &r;
        let p = self.record_path(&r.name);
        let tmp = p.with_extension("toml.tmp");
        let text = toml::to_string_pretty(r).map_err(|e| {
            CliError::failed(format!("cannot write the record of '{}': {e}", r.name))
        })?;
        // Durable before it replaces the old one, and the rename durable
        // too: after a power cut the record is the old or the new, whole.
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &p)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            CliError::failed(format!("cannot write {}: {e}", p.display()))
        })?;
        // The record is in place; where the folder's filesystem cannot
        // sync a directory (EINVAL on some network and FUSE filesystems)
        // its rename is as durable as that filesystem makes it.
        if let Err(e) = std::fs::File::open(self.arrays()).and_then(|d| d.sync_all()) {
            tracing::debug!("{}: the folder's sync: {e}", self.arrays().display());
        }
        Ok(())
    }

    /// Whether a record can be written now: a file of a record's size is
    /// written, synced and removed in the records' folder.
    pub fn check_writable(&self) -> Result<()> {
        let p = self.arrays().join(".writable");
        let probe = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&p)?;
            std::io::Write::write_all(&mut f, &[b'#'; 4096])?;
            f.sync_all()
        };
        let r = probe();
        let _ = std::fs::remove_file(&p);
        r.map_err(|e| CliError::failed(format!("cannot write in {}: {e}", self.arrays().display())))
    }

    /// The lock on array `name` that its `start` and `delete` meet on:
    /// the daemon holds it shared from a start's first step until the
    /// array stops (two of those cannot both hold the array: the daemon's
    /// own reservation keeps them apart), `delete` exclusive while it
    /// removes the record and the event log. `Ok(None)` where the other
    /// side holds it; an error where the lock file cannot be made (a
    /// read-only state folder), which callers go on without.
    pub fn hold_name(&self, name: &str, exclusive: bool) -> std::io::Result<Option<std::fs::File>> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
        let dir = self.root.join("locks");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        let path = self.name_lock_path(name);
        let how = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        // A delete removes the file while it holds it: a lock taken on the
        // file it removed (opened just before) holds nothing, so the file
        // locked must still be the one at the path, or it is opened again.
        loop {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(&path)?;
            // SAFETY: flock on a descriptor this function owns (f, open
            // above); it reads nothing from memory.
            if unsafe { libc::flock(f.as_raw_fd(), how | libc::LOCK_NB) } != 0 {
                return match std::io::Error::last_os_error() {
                    e if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
                    e => Err(e),
                };
            }
            let held = f.metadata()?;
            match std::fs::metadata(&path) {
                Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => {
                    return Ok(Some(f))
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn name_lock_path(&self, name: &str) -> PathBuf {
        self.root.join("locks").join(format!("{name}.lock"))
    }

    /// Removes the lock file of `name`, which the caller holds exclusive
    /// (`delete`: the name is free again, and no file is left per name
    /// ever used). A lock taken on it meanwhile sees it gone and takes the
    /// next (`hold_name`).
    pub fn forget_name(&self, name: &str, _held: &std::fs::File) {
        let _ = std::fs::remove_file(self.name_lock_path(name));
    }

    /// Removes the record of `name` (`delete`).
    pub fn remove(&self, name: &str) -> Result<()> {
        let p = self.record_path(name);
        std::fs::remove_file(&p)
            .map_err(|e| CliError::failed(format!("cannot remove {}: {e}", p.display())))
    }

    pub fn list(&self) -> Vec<ArrayRecord> {
        self.list_all().0
    }

    /// The records, and for each record file that cannot be read or
    /// parsed, why (with the fix): `list` and `status` name those, rather
    /// than leave the array out as if it did not exist.
    pub fn list_all(&self) -> (Vec<ArrayRecord>, Vec<String>) {
        let mut out = Vec::new();
        let mut bad = Vec::new();
        for e in std::fs::read_dir(self.arrays())
            .into_iter()
            .flatten()
            .flatten()
        {
            let p = e.path();
            if p.extension().is_none_or(|x| x != "toml") {
                continue;
            }
            let name = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            match std::fs::read_to_string(&p)
                .map_err(|e| e.to_string())
                .and_then(|t| toml::from_str::<ArrayRecord>(&t).map_err(|e| e.to_string()))
            {
                Ok(r) => out.push(r),
                Err(why) => bad.push(corrupt(&p, &name, &why)),
            }
        }
        out.sort_by(|a: &ArrayRecord, b| a.name.cmp(&b.name));
        bad.sort();
        (out, bad)
    }

    /// The recorded array (other than `except`) that lists `path`, or
    /// another name of the same device.
    pub fn owner_of(&self, path: &Path, except: Option<&str>) -> Option<ArrayRecord> {
        let key = raid_core::member::DeviceKey::of_path(path).ok();
        self.list()
            .into_iter()
            .filter(|r| Some(r.name.as_str()) != except)
            .find(|r| {
                r.members.iter().chain(&r.spares).any(|m| {
                    m == path
                        || key.is_some_and(|k| {
                            raid_core::member::DeviceKey::of_path(m).ok() == Some(k)
                        })
                })
            })
    }
}

/// Where udev keeps the stable names of block devices.
pub const BY_ID: &str = "/dev/disk/by-id";

/// A stable name for `path`: for a block device not already named under
/// /dev/disk, the link in `by_id` that points to it (the drive's model and
/// serial, or its WWN/EUI, which do not change across reboots), preferring
/// WWN/EUI names; anything else is returned as it is.
pub fn stable_name(path: &Path, by_id: &Path) -> PathBuf {
    use std::os::unix::fs::FileTypeExt;
    let is_block = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    if !is_block || path.starts_with("/dev/disk") {
        return path.to_path_buf();
    }
    stable_link(path, by_id).unwrap_or_else(|| path.to_path_buf())
}

/// The link in `dir` that resolves to the same file as `path`, WWN/EUI
/// names first.
fn stable_link(path: &Path, dir: &Path) -> Option<PathBuf> {
    let target = std::fs::canonicalize(path).ok()?;
    let mut links: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|l| std::fs::canonicalize(l).ok().as_ref() == Some(&target))
        .collect();
    let rank = |l: &PathBuf| {
        let n = l.file_name().and_then(|n| n.to_str()).unwrap_or("");
        (
            !(n.starts_with("wwn-") || n.starts_with("nvme-eui.")),
            n.to_string(),
        )
    };
    links.sort_by_key(rank);
    links.into_iter().next()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The link picked is the one that resolves to the device, WWN first.
    #[test]
    fn stable_link_finds_the_links_to_a_device() {
        let d = std::env::temp_dir().join(format!("raid-byid-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("by-id")).unwrap();
        let dev = d.join("nvme1n1");
        let other = d.join("nvme2n1");
        std::fs::write(&dev, b"x").unwrap();
        std::fs::write(&other, b"y").unwrap();
        let link = |name: &str, to: &Path| {
            std::os::unix::fs::symlink(to, d.join("by-id").join(name)).unwrap()
        };
        link("nvme-Model_SERIAL1", &dev);
        link("wwn-0x5000c500a1b2c3d4", &dev);
        link("nvme-Model_SERIAL2", &other);
        assert_eq!(
            stable_link(&dev, &d.join("by-id")),
            Some(d.join("by-id/wwn-0x5000c500a1b2c3d4"))
        );
        assert_eq!(
            stable_link(&other, &d.join("by-id")),
            Some(d.join("by-id/nvme-Model_SERIAL2"))
        );
        assert_eq!(stable_link(&d.join("none"), &d.join("by-id")), None);
        // Regular files keep their path.
        assert_eq!(stable_name(&dev, &d.join("by-id")), dev);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
