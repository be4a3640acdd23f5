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
        if let Some(m) = slot.as_ref() {
            return Err(CliError::refused(format!(
                "array '{name}' is already mounted at {} (raidctl unmount {name})",
                m.dir.display()
            )));
        }
        // RAIDCTL_MOUNT_DIR: where the systemd unit keeps mount points (its
        // runtime directory); else the state directory's mnt/.
        let base = std::env::var_os("RAIDCTL_MOUNT_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| self.state.root.join("mnt"));
        let dir = dir.unwrap_or_else(|| base.join(name));
        let m = crate::fuse::Mounted::mount(s.array.clone(), &dir, with_loop)
            .map_err(CliError::failed)?;
        let mut msg = format!("array '{name}' is the file {}", m.file.display());
        if let Some(d) = &m.loop_dev {
            msg = format!("{d}\n{msg}, attached to {d}");
        }
        *slot = Some(m);
        Ok(msg)
    }

    pub(super) fn unmount(&self, name: &str) -> Result<String> {
        let s = self.served(name)?;
        let m = s
            .mount
            .lock()
            .take()
            .ok_or_else(|| CliError::refused(format!("array '{name}' is not mounted")))?;
        let dir = m.dir.clone();
        let loop_dev = m.loop_dev.clone();
        if let Some(dev) = &loop_dev {
            if let Some(mp) = crate::fuse::mounted_at(dev) {
                *s.mount.lock() = Some(m);
                return Err(CliError::refused(format!(
                    "{dev} is mounted on {mp}: umount {mp} first"
                )));
            }
        }
        if let Err(refused) = m.unmount() {
            // Still mounted: it stays recorded (stop keeps refusing).
            let (m, why) = *refused;
            *s.mount.lock() = Some(m);
            return Err(CliError::refused(why));
        }
        s.array.flush()?;
        Ok(format!("array '{name}' unmounted from {}", dir.display()))
    }
}
