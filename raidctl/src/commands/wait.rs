//! `raidctl wait`: until no rebuild, hot replace or resync after an
//! unclean stop is pending or running, with their progress; the exit
//! status says how the array ended.

use super::*;

/// Waits until no rebuild, hot replace or resync is pending or running,
/// then says how the array ended: 0 optimal; 1 degraded (nothing to
/// rebuild onto), failed, or a rebuild that cannot run.
pub(super) fn wait(st: &StateDir, name: &str, timeout: u64) -> Result<()> {
    st.load(name)?;
    let t = Instant::now();
    // The percent last printed, per copy and slot.
    let mut last: std::collections::HashMap<(&str, usize), f64> = Default::default();
    loop {
        let r = daemon_call(
            st,
            name,
            Request::Status {
                name: Some(name.into()),
            },
        )?;
        let s = r.arrays.into_iter().next().ok_or_else(|| {
            CliError::refused(format!(
                "array '{name}' is not running (raidctl start {name})"
            ))
        })?;
        // A line each 10% of each copy: a rebuild's (every slot of its
        // pass) or a hot replace's.
        let rebuilds = s
            .rebuild
            .iter()
            .flat_map(|r| std::iter::once(r).chain(&r.same_pass));
        let copies = rebuilds
            .map(|c| ("rebuilding", c))
            .chain(s.hot_replace.iter().map(|c| ("replacing", c)));
        for (doing, c) in copies {
            let was = last.entry((doing, c.slot)).or_insert(-1.0);
            if c.percent - *was >= 10.0 {
                out!(
                    "{name}: {doing} slot {} {:.0}%{}",
                    c.slot,
                    c.percent,
                    status::rate_and_time_left(c)
                );
                *was = c.percent;
            }
        }
        if let Some(r) = &s.resync {
            let was = last.entry(("resyncing", 0)).or_insert(-1.0);
            if r.percent - *was >= 10.0 {
                out!(
                    "{name}: resyncing after an unclean stop {:.0}% ({} of {} regions)",
                    r.percent,
                    r.regions_done,
                    r.regions_total
                );
                *was = r.percent;
            }
        }
        match s.state.as_str() {
            _ if s.hot_replace.is_some() => {}
            "optimal" if s.resync.is_some() => {}
            "optimal" => {
                out!("{name}: optimal");
                return Ok(());
            }
            "failed" => {
                return Err(CliError::failed(format!(
                    "array '{name}' has failed: see raidctl events {name} and docs/recovery.md"
                )))
            }
            _ if s.rebuild_stalled => {
                return Err(CliError::failed(format!(
                "array '{name}' is {} and its rebuild cannot run (raidctl events {name} says why)",
                s.state
            )))
            }
            // Degraded with nothing to rebuild onto: a spare about to be
            // taken by the monitor, or a rebuild of another slot (a RAID6
            // down two, one being rebuilt), is worth waiting for, nothing
            // else is.
            "degraded"
                if s.spares.is_empty() && !s.members.iter().any(|m| m.state == "rebuilding") =>
            {
                let failed: Vec<String> = s
                    .members
                    .iter()
                    .filter(|m| m.state != "active")
                    .map(|m| m.path.clone().unwrap_or_else(|| format!("slot {}", m.slot)))
                    .collect();
                // An outcome, not an error (a RAID6 down two, its members
                // replaced one at a time, ends each wait here): said on
                // stdout like "optimal", with its own exit status.
                out!(
                    "{name}: degraded, no rebuild pending ({} down): raidctl replace {name} OLD NEW",
                    failed.join(", ")
                );
                return Err(CliError::new(crate::error::code::FAILED, ""));
            }
            _ => {}
        }
        if t.elapsed() > Duration::from_secs(timeout) {
            let still = match (&s.resync, &s.hot_replace) {
                (Some(r), _) => format!(", resyncing after an unclean stop ({:.0}%)", r.percent),
                (_, Some(h)) => format!(", hot-replacing slot {} ({:.0}%)", h.slot, h.percent),
                _ => String::new(),
            };
            return Err(CliError::failed(format!(
                "array '{name}' is still {}{still} after {timeout} s: raidctl status {name} shows its progress; wait longer with --timeout",
                s.state
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
