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
    if is_dead(dir) {
        let cleared = clear_dead(dir)?;
        // What was under it must pass the same checks.
        return check_live(dir).map(|()| Some(cleared));
    }
    check_live(dir).map(|()| None)
}

/// The top mount on `dir` (the last in mountinfo: mounts stack in order).
pub struct Top {
    /// Its device number, as `stat` gives it.
    pub dev: u64,
    fstype: String,
    source: String,
}

/// The mount on top at `dir`, from /proc/self/mountinfo (no call into the
/// filesystem itself, which may hang or be dead).
pub fn top_mount(dir: &Path) -> Option<Top> {
    let want = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    mounts()
        .into_iter()
        .rev()
        .find(|(d, _)| *d == want)
        .map(|(_, t)| t)
}

/// Where the mount with device `dev` and source `source` (a FUSE mount of
/// an array: `source_for`) is on `dir`: on top, under another mount put
/// there since, or not there at all (taken off outside raidctl).
/// The device number alone does not tell: the kernel gives a freed one
/// to the next mount that asks (a tmpfs mounted there by hand).
#[derive(Debug, PartialEq, Eq)]
pub enum Ours {
    OnTop,
    Under,
    Gone,
}

/// `dir` as mountinfo writes it: resolved (symbolic links followed) by the
/// caller, before the mount. Where mountinfo cannot be read, the mount is
/// taken as there, on top: never as gone on no evidence.
pub fn ours_at(dir: &Path, dev: u64, source: &str) -> Ours {
    let Some(all) = read_mounts() else {
        return Ours::OnTop;
    };
    let here: Vec<Top> = all
        .into_iter()
        .filter(|(d, _)| d == dir)
        .map(|(_, t)| t)
        .collect();
    let is_ours = |t: &Top| t.dev == dev && t.fstype.starts_with("fuse") && t.source == source;
    match (here.last(), here.iter().any(is_ours)) {
        (Some(t), true) if is_ours(t) => Ours::OnTop,
        (_, true) => Ours::Under,
        (_, false) => Ours::Gone,
    }
}

/// Every mount, in mountinfo's order (mounts stack in it): where, and what.
fn mounts() -> Vec<(PathBuf, Top)> {
    read_mounts().unwrap_or_default()
}

/// `mounts`, None where mountinfo cannot be read (out of descriptors).
fn read_mounts() -> Option<Vec<(PathBuf, Top)>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let all = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let (maj, min) = f.get(2)?.split_once(':')?;
            let dash = f.iter().position(|x| *x == "-")?;
            let top = Top {
                dev: libc::makedev(maj.parse().ok()?, min.parse().ok()?),
                fstype: f.get(dash + 1)?.to_string(),
                source: f.get(dash + 2)?.to_string(),
            };
            Some((unescape(f.get(4)?), top))
        })
        .collect();
    Some(all)
}

/// A mountinfo path: the kernel writes space, tab, newline and backslash
/// as octal escapes (`\040`, `\011`, `\012`, `\134`).
fn unescape(s: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

fn check_live(dir: &Path) -> Result<(), String> {
    let d = dir.display();
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot use {d} as a mount point: {e}. Name another folder (--dir)")),
        Ok(m) if !m.is_dir() => Err(format!(
            "{d} is not a folder: name an empty folder to mount on (--dir)"
        )),
        Ok(_) if is_mounted(dir) => Err(format!(
            "{d} is a mount point already: a mount there would hide it, and unmounting would take the wrong one off. Name an empty folder that is not a mount point (--dir)"
        )),
        Ok(_) => match std::fs::read_dir(dir).map(|mut r| r.next()) {
            Ok(None) => Ok(()),
            Ok(Some(first)) => Err(format!(
                "{d} is not empty (it holds {}{}): a mount there would hide what it holds. Name an empty folder (--dir)",
                first
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .unwrap_or_default(),
                if std::fs::read_dir(dir).map_or(0, |r| r.count()) > 1 { ", ..." } else { "" }
            )),
            Err(e) => Err(format!("cannot read {d}: {e}. Name another folder (--dir)")),
        },
    }
}

/// Notes for `start`: the mounts of `array` (wherever they were made, and
/// `default_dir`) left by a daemon that died, each with what to do. A
/// filesystem mounted on such a mount's loop device fails every I/O until
/// it is unmounted.
pub fn dead_notes(array: &raid_core::array::Array, default_dir: &Path) -> Vec<String> {
    let name = array.name();
    let source = source_of(array);
    let mut dirs: Vec<PathBuf> = mounts()
        .into_iter()
        .filter(|(d, t)| t.source == source && is_dead(d))
        .map(|(d, _)| d)
        .collect();
    // mountinfo names a mount by its real path.
    let default_dir = std::fs::canonicalize(default_dir).unwrap_or_else(|_| default_dir.into());
    if is_dead(&default_dir) && !dirs.contains(&default_dir) {
        dirs.push(default_dir);
    }
    dirs.iter()
        .map(|d| {
            let mounted: Vec<String> = loops_under(d)
                .iter()
                .filter_map(|l| super::mounted_at(l).map(|mp| format!("{l} mounted on {mp}")))
                .collect();
            // `unmount` clears the array's dead mounts wherever they are
            // (`mount` only the one in the folder it mounts in).
            let what = if mounted.is_empty() {
                format!("raidctl unmount {name} clears it")
            } else {
                format!(
                    "its loop device is still in use ({}), and every I/O there fails: unmount that filesystem, then raidctl unmount {name} clears the rest",
                    mounted.join(", ")
                )
            };
            format!(
                "{} is a FUSE mount left by a daemon that ended without unmounting (killed?): nothing serves it; {what}",
                d.display()
            )
        })
        .collect()
}

/// Whether `dir` is one of our FUSE mounts (source `raidctl:NAME`) whose
/// daemon is gone: listing it fails with ENOTCONN (its own attributes may
/// still be answered from the kernel's cache, so a stat does not tell).
/// Another program's dead mount (an sshfs) is not ours to clear.
fn is_dead(dir: &Path) -> bool {
    top_mount(dir).is_some_and(|t| t.fstype.starts_with("fuse") && t.source.starts_with("raidctl:"))
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
        .filter_map(|l| in_use(l).map(|by| (l.clone(), by)))
        .collect();
    if !busy.is_empty() {
        let mut steps: Vec<String> = busy
            .iter()
            .filter(|(_, by)| by.starts_with('/'))
            .map(|(_, mp)| format!("umount {mp}"))
            .collect();
        steps.extend(loops.iter().map(|l| format!("losetup -d {l}")));
        steps.push(format!("umount -l {d}"));
        return Err(format!(
            "{d} is a FUSE mount left by a daemon that ended without unmounting (killed?), and its loop device is still in use ({}): its I/O fails. Unmount that filesystem (or stop what holds the device), then run this again: it clears the rest. By hand: {}",
            busy.iter()
                .map(|(l, by)| match by.starts_with('/') {
                    true => format!("{l} mounted on {by}"),
                    false => format!("{l} {by}"),
                })
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

/// What uses loop device `dev`: where it (or a partition of it) is
/// mounted, what holds it (device-mapper, md: /sys/block/*/holders), or
/// which processes have it open (a VM, a dd). A detach while any does
/// only marks it to go when the last closes (the kernel's autoclear): the
/// export would be gone later with nothing said.
pub fn in_use(dev: &str) -> Option<String> {
    if let Some(mp) = super::mounted_at(dev) {
        return Some(mp);
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let part = format!("{dev}p");
    if let Some(mp) = mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        f.next()?
            .starts_with(&part)
            .then(|| f.next().unwrap_or("").to_string())
    }) {
        return Some(mp);
    }
    let name = dev.trim_start_matches("/dev/");
    let holders: Vec<String> = std::fs::read_dir(format!("/sys/block/{name}/holders"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if !holders.is_empty() {
        return Some(format!("held by {}", holders.join(", ")));
    }
    let openers = openers(Path::new(dev));
    (!openers.is_empty()).then(|| format!("open by {}", openers.join(", ")))
}

/// The processes with `dev` open, as "pid N (command)", from /proc/*/fd.
fn openers(dev: &Path) -> Vec<String> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    procs
        .flatten()
        .filter_map(|p| {
            let pid: u32 = p.file_name().to_str()?.parse().ok()?;
            let holds = std::fs::read_dir(p.path().join("fd"))
                .ok()?
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == dev));
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            (holds && !is_udev(&comm)).then(|| format!("pid {pid} ({})", comm.trim()))
        })
        .collect()
}

/// The mount's source as mountinfo shows it: `raidctl:NAME:UUID`, the
/// array's uuid telling it from an array of the same name served from
/// another state folder.
pub fn source_of(array: &raid_core::array::Array) -> String {
    source_for(array.name(), &array.uuid().to_string())
}

/// The mount source of the array named `name` with uuid `uuid`.
pub fn source_for(name: &str, uuid: &str) -> String {
    format!("raidctl:{name}:{uuid}")
}

/// Clears the mounts of `array` left by a daemon that died (`unmount`
/// after a kill: the daemon that runs now does not hold them): what each
/// cleared, or why it could not.
pub fn clear_dead_of(array: &raid_core::array::Array) -> Vec<Result<String, String>> {
    clear_dead_from(&source_of(array))
}

/// `clear_dead_of` by the mounts' source (`source_for`): for an array that
/// is not running, whose daemon was killed with it mounted.
pub fn clear_dead_from(source: &str) -> Vec<Result<String, String>> {
    mounts()
        .into_iter()
        .filter(|(d, t)| t.source == source && is_dead(d))
        .map(|(d, _)| clear_dead(&d))
        .collect()
}

/// The processes that probe a block device as it changes (udev's
/// workers): they hold it for a moment after an unmount, and are no user.
fn is_udev(comm: &str) -> bool {
    comm.contains("udev")
}

/// The loop devices whose backing file lies under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let dir = &std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
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

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(
            super::unescape("/a\\040b\\011c\\012d\\134e\\x"),
            std::path::PathBuf::from("/a b\tc\nd\\e\\x")
        );
    }
}
