//! Where a mount may go. A FUSE mount hides what its folder held, and an
//! unmount takes off whatever mount is on top: so the folder must be empty
//! and not a mount point already (two arrays mounted on one folder hid one
//! another, and unmounting one took the other's mount off). A mount left
//! by a daemon that died (killed, crashed) answers nothing: it is cleared
//! here when nothing is mounted on its loop devices, and named with the
//! commands that clear it otherwise.

use super::mount::{is_mounted, umount_lazy};
use std::path::{Path, PathBuf};

/// Checks that `dir` can take a mount (clearing a dead one); Err says why
/// not and what to do. Ok(Some(note)) when a dead mount was cleared.
pub fn check(dir: &Path) -> Result<Option<String>, String> {
    let d = dir.display();
    if is_dead(dir) {
        return clear_dead(dir).map(Some);
    }
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot use {d} as a mount point: {e}")),
        Ok(m) if !m.is_dir() => Err(format!(
            "{d} is not a folder: name an empty folder to mount on (--dir)"
        )),
        Ok(_) if is_mounted(dir) => Err(format!(
            "{d} is a mount point already: a mount there would hide it, and unmounting would take the wrong one off. Name an empty folder that is not a mount point (--dir)"
        )),
        Ok(_) => match std::fs::read_dir(dir).map(|mut r| r.next()) {
            Ok(None) => Ok(None),
            Ok(Some(first)) => Err(format!(
                "{d} is not empty (it holds {}{}): a mount there would hide what it holds. Name an empty folder (--dir)",
                first
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .unwrap_or_default(),
                if std::fs::read_dir(dir).map_or(0, |r| r.count()) > 1 { ", ..." } else { "" }
            )),
            Err(e) => Err(format!("cannot read {d}: {e}")),
        },
    }
}

/// A note when `dir` is a mount left by a daemon that died, for `start`.
pub fn dead_note(dir: &Path) -> Option<String> {
    is_dead(dir).then(|| {
        format!(
            "{} is a FUSE mount left by a daemon that ended without unmounting (killed?): nothing serves it; raidctl mount clears it",
            dir.display()
        )
    })
}

/// Whether `dir` is a mount whose FUSE server is gone: listing it fails
/// with ENOTCONN (its own attributes may still be answered from the
/// kernel's cache, so a stat does not tell).
fn is_dead(dir: &Path) -> bool {
    is_mounted(dir)
        && std::fs::read_dir(dir)
            .err()
            .is_some_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
}

/// Clears the dead mount on `dir`: its loop devices detached, then the
/// mount itself, lazily. Refused, naming the commands, while a loop
/// device on it is mounted (that filesystem is the operator's to unmount:
/// its I/O already fails).
fn clear_dead(dir: &Path) -> Result<String, String> {
    let d = dir.display();
    let loops = loops_under(dir);
    let busy: Vec<(String, String)> = loops
        .iter()
        .filter_map(|l| super::mounted_at(l).map(|mp| (l.clone(), mp)))
        .collect();
    if !busy.is_empty() {
        let mut steps: Vec<String> = busy.iter().map(|(_, mp)| format!("umount {mp}")).collect();
        steps.extend(loops.iter().map(|l| format!("losetup -d {l}")));
        steps.push(format!("umount -l {d}"));
        return Err(format!(
            "{d} is a FUSE mount left by a daemon that ended without unmounting (killed?), and a filesystem is still mounted on its loop device ({}): its I/O fails. Clear it, then mount again: {}",
            busy.iter()
                .map(|(l, mp)| format!("{l} on {mp}"))
                .collect::<Vec<_>>()
                .join(", "),
            steps.join("; ")
        ));
    }
    for l in &loops {
        let out = std::process::Command::new("losetup")
            .arg("-d")
            .arg(l)
            .output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            return Err(format!(
                "{d} is a FUSE mount left by a daemon that died; its loop device {l} could not be detached: losetup -d {l}; umount -l {d}"
            ));
        }
    }
    umount_lazy(dir).map_err(|e| {
        format!("{d} is a FUSE mount left by a daemon that died and could not be cleared ({e}): umount -l {d}")
    })?;
    let detached = match loops.len() {
        0 => String::new(),
        _ => format!(" and its loop device {} detached", loops.join(", ")),
    };
    Ok(format!(
        "{d} was a FUSE mount left by a daemon that died: unmounted{detached}"
    ))
}

/// The loop devices whose backing file lies under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return vec![];
    };
    let mut out: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            let backing = PathBuf::from(backing.trim().trim_end_matches(" (deleted)"));
            backing.starts_with(dir).then(|| format!("/dev/{name}"))
        })
        .collect();
    out.sort();
    out
}
