//! `raidctl delete`: the end of an array's life on this host. Plainly, it
//! forgets a stopped array (its record and event log here); the members
//! keep its metadata, so `raidctl start NAME --members ...` brings it
//! back. With `--wipe --force` it also erases the array's metadata area
//! (superblocks, bitmap, journal) from every member and spare that still
//! carries this array's uuid, so the devices are free and can never be
//! assembled into it again; the data area is left as it is (no minutes of
//! zeroing), but without the metadata nothing will read it as this array.

use super::*;

pub(super) fn delete(st: &StateDir, name: &str, wipe: bool, force: bool) -> Result<()> {
    let r = st.load(name)?;
    // Held to the end: a start racing this one (whose daemon holds the
    // lock from its first step while the array runs) either finds this
    // delete under way, or makes it refuse here, with nothing removed.
    let held = match st.hold_name(name, true) {
        Ok(Some(f)) => Some(f),
        Ok(None) => {
            return Err(CliError::refused(format!(
                "array '{name}' is running or being started: stop it first (raidctl stop {name}), then delete it"
            )))
        }
        Err(e) => {
            tracing::debug!("no lock for '{name}' ({e}): the running check alone");
            None
        }
    };
    if running_names(st)?.iter().any(|n| n == name) {
        return Err(CliError::refused(format!(
            "array '{name}' is running: stop it first (raidctl stop {name}), then delete it"
        )));
    }
    // An empty path: a slot no device was ever recorded for.
    let devices: Vec<&PathBuf> = r
        .members
        .iter()
        .chain(&r.spares)
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    if wipe && !force {
        return Err(CliError::refused(format!(
            "--wipe erases the metadata of '{name}' from its {} devices ({}): its data can no longer be assembled from them. Add --force to do it; without --wipe, delete only forgets the array here (raidctl start {name} --members ... brings it back)",
            devices.len(),
            list_paths(&devices)
        )));
    }
    // Read before anything changes: a config that does not parse must not
    // turn a finished delete into an error.
    let in_config = Config::load(st, None).is_ok_and(|c| c.array.iter().any(|a| a.name == name));
    let mut said = Vec::new();
    if wipe {
        // Every device held (the exclusive open a start takes) before any
        // is touched: a start racing this one finds them busy, and one
        // that got there first makes this refuse, having changed nothing.
        let mut held = Vec::new();
        for p in &devices {
            // A network member is not held exclusively by an open here (a
            // start on another host could take it meanwhile): left to its
            // server.
            if crate::remote::is_remote(p) {
                said.push(format!(
                    "{}: a network member, not wiped from here (erase its first MiB on its server)",
                    p.display()
                ));
                continue;
            }
            match crate::remote::open_member(p) {
                Ok(m) => held.push((p, m)),
                Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => {
                    return Err(CliError::refused(format!(
                        "{} is in use ({e}): '{name}' is not deleted, nothing was wiped. Is it running (raidctl list)?",
                        p.display()
                    )))
                }
                Err(e) => said.push(format!("{}: cannot be opened ({e}): left as it is", p.display())),
            }
        }
        for (p, m) in &held {
            said.push(wipe_one(p, m.as_ref(), &r.uuid));
        }
    }
    st.remove(name)?;
    st.remove_scrub_marks(name);
    if let Some(f) = &held {
        st.forget_name(name, f);
    }
    for log in [
        crate::eventlog::path(st, name),
        crate::eventlog::older_path(st, name),
    ] {
        if log.exists() {
            if let Err(e) = std::fs::remove_file(&log) {
                said.push(format!("its event log {} is left: {e}", log.display()));
            }
        }
    }
    if wipe {
        out!("array '{name}' deleted: its record and event log removed, its metadata erased where it was found:");
    } else {
        out!(
            "array '{name}' forgotten: its record and event log removed. Its {} devices still carry its metadata: raidctl start {name} --members {} brings it back; create --force, or delete --wipe --force before this, frees them",
            devices.len(),
            list_paths(&devices)
        );
    }
    for s in said {
        out!("  {s}");
    }
    if in_config {
        out!(
            "note: {} still starts '{name}' ([[array]] name = \"{name}\"): remove that entry",
            st.root.join("raidctl.toml").display()
        );
    }
    Ok(())
}

/// Erases `m`'s metadata area if it carries array `uuid`; what was done.
fn wipe_one(p: &Path, m: &dyn Member, uuid: &str) -> String {
    let p = p.display();
    match raid_core::metadata::read_superblock(m) {
        Ok(sb) if sb.array_uuid.to_string() == uuid => {
            // The superblocks, bitmap and journal: all before the data.
            let area = sb.data_offset.min(m.size()) as usize;
            let zero = raid_core::buf::AlignedBuf::new(area);
            match m.write_at(&zero, 0).and_then(|()| m.flush()) {
                Ok(()) => format!("{p}: metadata erased"),
                Err(e) => format!(
                    "{p}: NOT erased, the write failed ({e}); wipe it by hand before reusing it"
                ),
            }
        }
        Ok(sb) => format!(
            "{p}: carries another array's metadata (uuid {}): left as it is",
            sb.array_uuid
        ),
        Err(_) => format!("{p}: carries no metadata of this array: left as it is"),
    }
}

fn list_paths(ps: &[&PathBuf]) -> String {
    ps.iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}
