//! The daemon's side of `raidctl mount` and `unmount`: an array as a file
//! in a FUSE mount, and the loop device on it (`crate::fuse`). A mount that
//! cannot be undone stays recorded, so `stop` keeps refusing.

use super::Daemon;
use crate::error::{CliError, Result};
use std::path::PathBuf;

impl Daemon {
    pub(super) fn mount(
        &self,
        name: &str,
        dir: Option<PathBuf>,
        with_loop: bool,
    ) -> Result<String> {
        let s = self.served(name)?;
        let mut slot = s.mount.lock();
        // A mount taken off outside raidctl (umount by hand) is forgotten
        // here, its connection ended, rather than refusing every mount
        // after it as "already mounted".
        let mut forgot = None;
        if slot.as_ref().is_some_and(|m| m.gone()) {
            let old = slot.take().expect("checked");
            let at = old.dir.display().to_string();
            match old.unmount() {
                Ok(()) => forgot = Some(at),
                Err(b) => {
                    let (old, why) = *b;
                    *slot = Some(old);
                    return Err(CliError::refused(format!(
                        "array '{name}' was mounted at {at}, and that mount was taken off outside raidctl, but {why}"
                    )));
                }
            }
        }
        if let Some(m) = slot.as_ref() {
            return Err(CliError::refused(format!(
                "array '{name}' is already mounted at {} (raidctl unmount {name})",
                m.dir.display()
            )));
        }
        let dir = dir.unwrap_or_else(|| self.default_mount_dir(name));
        // A folder that cannot take the mount is refused (exit 4), before
        // anything is made; a mount that fails after is a failure (1).
        let cleared = crate::fuse::place::check(&dir).map_err(CliError::refused)?;
        let m = crate::fuse::Mounted::mount(s.array.clone(), &dir, with_loop)
            .map_err(CliError::failed)?;
        let mut msg = format!("array '{name}' is the file {}", m.file.display());
        if let Some(d) = &m.loop_dev {
            msg = format!("{d}\n{msg}, attached to {d}");
        }
        if let Some(c) = &cleared {
            msg.push_str(&format!("\nnote: {c}"));
        }
        if let Some(at) = &forgot {
            msg.push_str(&format!(
                "\nnote: its mount at {at} had been taken off outside raidctl: forgotten"
            ));
        }
        *slot = Some(m);
        Ok(msg)
    }

    /// Where `mount` puts array `name` without --dir: RAIDCTL_MOUNT_DIR
    /// (where the systemd unit keeps mount points, its runtime directory),
    /// else the state directory's mnt/.
    pub(super) fn default_mount_dir(&self, name: &str) -> PathBuf {
        std::env::var_os("RAIDCTL_MOUNT_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.state.root.join("mnt"))
            .join(name)
    }

    /// Unmounts and flushes. A failed array has nothing to flush to: it is
    /// unmounted all the same and says so; a flush error on a live array
    /// is reported with the unmount it followed.
    pub(super) fn unmount(&self, name: &str) -> Result<String> {
        let s = self.served(name)?;
        if s.mount.lock().is_none() {
            // A mount a killed daemon left (nothing serves it): cleared
            // here too, not only by the next `mount`.
            let cleared = crate::fuse::place::clear_dead_of(&s.array);
            if !cleared.is_empty() {
                let said: Vec<&str> = cleared
                    .iter()
                    .map(|r| r.as_deref().unwrap_or_else(|e| e))
                    .collect();
                return match cleared.iter().all(|r| r.is_ok()) {
                    true => Ok(said.join("\n")),
                    false => Err(CliError::refused(said.join("\n"))),
                };
            }
        }
        let was_gone = s.mount.lock().as_ref().is_some_and(|m| m.gone());
        let dir = self.unmount_only(name)?;
        let mut done = format!("array '{name}' unmounted from {}", dir.display());
        if was_gone {
            done.push_str(&format!(
                " (its mount had been taken off outside raidctl already: whatever is mounted on {} now was left alone)",
                dir.display()
            ));
        }
        match s.array.flush() {
            Ok(()) => Ok(done),
            Err(e) if s.array.state() == raid_core::array::ArrayState::Failed => Ok(format!(
                "{done}; it has failed, so its flush did not complete ({e})"
            )),
            Err(e) => Err(CliError::failed(format!(
                "{done}, but the flush after it failed: {e}"
            ))),
        }
    }

    /// Detaches the loop device and unmounts, without flushing (`stop`
    /// flushes as it closes the array). Returns the mount point.
    ///
    /// The mount's lock is held throughout, as `mount` holds it: a `stop`
    /// or `unmount` at the same time (the daemon's own, retried each
    /// second after a signal, and the operator's) must never find the
    /// mount gone while it is only being looked at, and go on to close
    /// the array under a mounted filesystem.
    pub(super) fn unmount_only(&self, name: &str) -> Result<PathBuf> {
        let s = self.served(name)?;
        let mut slot = s.mount.lock();
        let m = slot
            .take()
            .ok_or_else(|| CliError::refused(format!("array '{name}' is not mounted")))?;
        let dir = m.dir.clone();
        // Refused (a filesystem on its loop device, a program holding the
        // file, another mount on top): it stays recorded, and stop keeps
        // refusing.
        if let Err(refused) = m.unmount() {
            let (m, why) = *refused;
            *slot = Some(m);
            return Err(CliError::refused(why));
        }
        Ok(dir)
    }
}
