//! The text `status` and `detail` print, from `ArrayStatus`: the state
//! line, members, rebuild and scrub progress, drive health.

use super::{ArrayStatus, RebuildStatus, ScrubStatus};

/// " at RATE/s, N s left" for a rebuild or hot replace, once its rate is
/// measurable; empty before.
pub fn rate_and_time_left(r: &RebuildStatus) -> String {
    match r.rate_bytes_per_sec > 0.0 {
        true => format!(
            " at {}/s, {:.0} s left",
            human_bytes(r.rate_bytes_per_sec as u64),
            r.eta_seconds.unwrap_or(0.0)
        ),
        false => String::new(),
    }
}

/// "N.N% at RATE/s, N s left" for a running scrub (the time left once
/// measurable).
pub fn scrub_progress(sc: &ScrubStatus) -> String {
    format!(
        "{:.1}% at {}/s{}",
        sc.percent,
        human_bytes(sc.rate_bytes_per_sec as u64),
        sc.eta_seconds
            .map(|e| format!(", {e:.0} s left"))
            .unwrap_or_default()
    )
}

pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// A member drive's lines in `detail`: identity, figures, warnings.
pub fn render_health(d: &crate::health::DriveHealth, warnings: &[String]) -> String {
    let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
    let mut out = format!(
        "           drive: {} {} serial {} firmware {}\n",
        d.kind,
        or(&d.model),
        or(&d.serial),
        or(&d.firmware)
    );
    let mut figs = Vec::new();
    if let Some(t) = d.temperature_celsius {
        figs.push(format!("{t} C"));
    }
    if let Some(p) = d.percentage_used {
        figs.push(format!("{p}% of rated endurance used"));
    }
    if let (Some(a), Some(t)) = (
        d.available_spare_percent,
        d.available_spare_threshold_percent,
    ) {
        figs.push(format!("spare {a}% (threshold {t}%)"));
    }
    if let Some(n) = d.media_errors {
        figs.push(format!("{n} media errors"));
    }
    if let Some(p) = d.smart_passed {
        figs.push(format!("SMART {}", if p { "passed" } else { "FAILED" }));
    }
    for (name, v) in [
        ("reallocated sectors", d.reallocated_sectors),
        ("pending sectors", d.pending_sectors),
        ("offline uncorrectable", d.offline_uncorrectable),
        ("grown defects", d.grown_defects),
    ] {
        if let Some(v) = v {
            figs.push(format!("{v} {name}"));
        }
    }
    let verdict = if warnings.is_empty() {
        "healthy".to_string()
    } else {
        format!("WARNING: {}", warnings.join("; "))
    };
    out.push_str(&format!("           health: {verdict}"));
    if !figs.is_empty() {
        out.push_str(&format!(" ({})", figs.join(", ")));
    }
    out.push('\n');
    out
}

/// An array's state as `status` and `list` write it: a stopped one's
/// health with it, and whether it was stopped cleanly.
pub fn state_line(s: &ArrayStatus) -> String {
    match (s.running, s.unclean) {
        (false, _) if s.held_elsewhere.is_some() => {
            format!("stopped here ({}), in use elsewhere", s.health)
        }
        // Redundancy is one thing, taking writes another: an optimal
        // array that refuses every write is not what "optimal" reads as.
        (true, _) if s.out_of_space.is_some() => format!("{}, writes stopped", s.state),
        // A RAID6 missing two reads "degraded" like one missing one: say
        // that the next failure takes the data.
        (true, _) if s.state != "failed" && no_margin(s) => {
            format!("{}, no redundancy left", s.state)
        }
        (true, _) => s.state.clone(),
        (false, false) => format!("stopped ({})", s.health),
        (false, true) => format!("stopped ({}, unclean)", s.health),
    }
}

/// Whether a RAID5/6 has as many slots down (failed, missing, being
/// rebuilt) as it has parity, or a RAID1 one copy left: one more and its
/// data is lost.
fn no_margin(s: &ArrayStatus) -> bool {
    let tolerates = match s.level.as_str() {
        "raid5" => 1,
        "raid6" => 2,
        "raid1" => s.members.len().saturating_sub(1),
        _ => return false,
    };
    s.members.iter().filter(|m| m.state != "active").count() == tolerates
}

/// The text form of `status` / `detail`.
pub fn render(s: &ArrayStatus, detail: bool) -> String {
    let mut out = String::new();
    let state = state_line(s);
    out.push_str(&format!(
        "{}: {} {}; chunk {}, capacity {}, engine {}\n",
        s.name,
        s.level,
        state,
        human_bytes(s.chunk_bytes),
        human_bytes(s.capacity_bytes),
        s.parity_engine
    ));
    if !s.running && s.unclean {
        out.push_str("  not stopped cleanly (a crash, a kill, a power cut, or a stop after writes failed on a full filesystem): its next start resyncs the regions that were being written\n");
    }
    if let (Some(all), Some(dirty @ 1..)) = (s.bitmap_regions, s.bitmap_dirty_regions) {
        out.push_str(&format!(
            "  write-intent bitmap: {dirty} of {all} regions marked (written within the bitmap's linger, [bitmap] linger_seconds): a crash now would resync those\n"
        ));
    }
    let p = &s.parity;
    if s.running && !p.parity_mode.is_empty() {
        let mut parts = vec![format!("mode {}", p.parity_mode)];
        if let Some(a) = &p.gpu_adapter {
            parts.push(format!("gpu adapter {a}"));
        }
        if let Some(t) = p.gpu_threshold_bytes {
            parts.push(format!("GPU for calls from {}", human_bytes(t)));
        }
        parts.push(format!(
            "calls gpu {} cpu {}",
            p.parity_calls_gpu, p.parity_calls_cpu
        ));
        if let Some(n) = &p.parity_note {
            parts.push(n.clone());
        }
        out.push_str(&format!("  parity: {}\n", parts.join("; ")));
    }
    for m in &s.members {
        out.push_str(&format!(
            "  slot {:<3} {:<11} {}{}{}\n",
            m.slot,
            m.state,
            m.path.as_deref().unwrap_or("-"),
            match (m.state.as_str(), &m.path, s.running) {
                ("missing" | "failed", Some(_), false) if m.warning.is_some() => " (recorded)",
                ("missing", Some(_), true) => " (recorded; not in use)",
                ("failed", Some(_), true) if m.warning.is_some() => " (not in use)",
                _ => "",
            },
            if detail {
                format!("  uuid {}", m.uuid)
            } else {
                String::new()
            }
        ));
        if let Some(w) = &m.warning {
            out.push_str(&format!("           warning: {w}\n"));
        }
        if let Some(h) = &m.health {
            if detail {
                out.push_str(&render_health(&h.drive, &h.warnings));
            } else if !h.warnings.is_empty() {
                out.push_str(&format!("           health: {}\n", h.warnings.join("; ")));
            }
        }
    }
    for sp in &s.spares {
        out.push_str(&format!("  spare    {:<11} {sp}\n", "spare"));
    }
    if let Some(r) = &s.rebuild {
        out.push_str(&format!(
            "  rebuild: slot {} {:.1}%{}\n",
            r.slot,
            r.percent,
            rate_and_time_left(r)
        ));
        for p in &r.same_pass {
            out.push_str(&format!(
                "  rebuild: slot {} {:.1}%{}, in the same pass as slot {}\n",
                p.slot,
                p.percent,
                rate_and_time_left(p),
                r.slot
            ));
        }
        // In line in slot order (the next rebuild is the first pending):
        // each waits for the running one and for those before it.
        for (i, w) in r.waiting_slots.iter().enumerate() {
            let ahead: Vec<String> = std::iter::once(r.slot)
                .chain(r.waiting_slots[..i].iter().copied())
                .map(|s| s.to_string())
                .collect();
            let ahead = match ahead.split_last() {
                Some((last, [])) => format!("slot {last}"),
                Some((last, rest)) => format!("slots {} and {last}", rest.join(", ")),
                None => unreachable!("the running slot is always ahead"),
            };
            out.push_str(&format!(
                "  rebuild: slot {w} waits, rebuilt after {ahead}\n"
            ));
        }
    }
    if let Some(h) = &s.hot_replace {
        out.push_str(&format!(
            "  hot replace: slot {} onto {} {:.1}%{}\n",
            h.slot,
            h.member,
            h.percent,
            rate_and_time_left(h)
        ));
    }
    if let Some(m) = &s.out_of_space {
        out.push_str(&format!(
            "  writes stopped: {m} is on a full filesystem; free space, then raidctl stop {n}; raidctl start {n}\n",
            n = s.name
        ));
    }
    if let Some(why) = &s.held_elsewhere {
        out.push_str(&format!("  in use elsewhere: {why}\n"));
    }
    if let Some(why) = &s.stopping {
        out.push_str(&format!("  stopping: {why}\n"));
    }
    if let Some(e) = &s.record_lags {
        out.push_str(&format!(
            "  record not written: {e}; a restart now would not find the array's new membership (free space there, or make it writable: the daemon writes it again every quarter second)\n"
        ));
    }
    if let Some(sc) = &s.scrub {
        out.push_str(&format!(
            "  scrub ({}): {}\n",
            if sc.repair { "repair" } else { "check only" },
            scrub_progress(sc)
        ));
    }
    if let Some(r) = &s.resync {
        out.push_str(&format!(
            "  resync after an unclean stop: {:.1}% ({} of {} regions); scrub waits for it\n",
            r.percent, r.regions_done, r.regions_total
        ));
    }
    if s.rebuild_stalled {
        out.push_str(&format!(
            "  rebuild: stalled, the array lost what it rebuilds from (raidctl events {} says why)\n",
            s.name
        ));
    }
    for e in &s.exports {
        out.push_str(&format!("  export: {e}\n"));
    }
    if detail {
        out.push_str(&format!("  uuid: {}\n  events: {}\n", s.uuid, s.events));
    }
    out
}
