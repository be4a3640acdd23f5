//! What the daemon answers to `raidctl status`: the arrays it serves, with
//! what only the daemon knows of them (exports and mounts, member health,
//! a scrub in progress).

use super::Daemon;
use crate::error::Result;
use crate::protocol::Response;
use crate::status;

impl Daemon {
    /// Every served array (or the one named) as `raidctl status` shows
    /// it: state and members, exports and mounts, member health, a rebuild
    /// or scrub in progress.
    pub(super) fn status(&self, name: Option<&str>) -> Result<Response> {
        let arrays = self.arrays.lock().clone();
        let mut out = Vec::new();
        for (n, s) in arrays.iter() {
            if name.is_some_and(|x| x != n) {
                continue;
            }
            let copy = s.array.copy_progress();
            let mut exports: Vec<String> = s.exports.lock().iter().map(|e| e.describe()).collect();
            if let Some(m) = s.mount.lock().as_ref() {
                exports.push(match m.gone() {
                    true => format!(
                        "fuse file {} (gone: its mount was taken off outside raidctl; raidctl unmount {n} forgets it)",
                        m.file.display()
                    ),
                    false => format!("fuse file {} ({})", m.file.display(), m.transport()),
                });
                if let Some(d) = &m.loop_dev {
                    exports.push(format!("loop {d}"));
                }
            }
            let mut st =
                status::of_running(&s.array, copy.as_ref(), exports, Some(s.engine.report()));
            st.record_lags = self.record_lag(s);
            // Served on after a signal only while a filesystem is mounted
            // on it (the stop is retried each second): said, since the
            // state alone reads as any running array's.
            if self.term.load(std::sync::atomic::Ordering::Acquire) {
                let on = s
                    .mount
                    .lock()
                    .as_ref()
                    .and_then(|m| m.loop_dev.clone())
                    .map(|d| match crate::fuse::mounted_at(&d) {
                        Some(mp) => format!("{d} is mounted on {mp}"),
                        None => format!("{d} is in use"),
                    })
                    .unwrap_or_else(|| "its mount is in use".into());
                st.stopping = Some(format!(
                    "the daemon was sent SIGTERM or SIGINT and stops this array once it can ({on}): unmount that, and it stops"
                ));
            }
            // A slot without a device in use (missing at start, or left out
            // there as failed or stale) names the device its record names,
            // the one to look for or to replace.
            let recorded = s.record.lock().members.clone();
            let slots = s.array.slots();
            let left: Vec<u64> = slots.iter().map(|x| x.left_events).collect();
            let missing: Vec<bool> = slots.iter().map(|x| x.missing_at_start).collect();
            let removed: Vec<bool> = slots.iter().map(|x| x.removed).collect();
            for m in st.members.iter_mut().filter(|m| m.path.is_none()) {
                let path = recorded.get(m.slot).filter(|p| !p.as_os_str().is_empty());
                m.path = path.map(|p| p.display().to_string());
                // The slot's own member, there but left out (its slot had
                // failed before the start, or it is an older copy): failed,
                // not missing, which would send the operator looking for a
                // device in place.
                let Some(events) = path.and_then(|p| member_events(p, &st.uuid, &m.uuid)) else {
                    continue;
                };
                m.state = "failed".into();
                let (name, p) = (&st.name, m.path.as_deref().unwrap_or("OLD"));
                let left = left.get(m.slot).copied().unwrap_or(0);
                // An older copy of the member (an image put back) never
                // failed: its metadata predates the slot's last event.
                let (why, re_add) = if events < left {
                    (
                        format!("left out at the start: an older copy of the slot's member (its metadata is of event {events}, the slot's member had taken {left}), missing the writes since"),
                        "copies it whole",
                    )
                } else if removed.get(m.slot).copied().unwrap_or(false) {
                    (
                        "removed (raidctl remove): it failed, and still holds the array's metadata"
                            .to_string(),
                        "takes it back if it failed by mistake",
                    )
                } else if missing.get(m.slot).copied().unwrap_or(false) {
                    (
                        "not in use: it was missing at the start and is there now".to_string(),
                        "takes it back, resyncing what was written since",
                    )
                } else {
                    (
                        "left out at the start: its slot had failed before".to_string(),
                        "takes it back if it failed by mistake",
                    )
                };
                m.warning = Some(format!(
                    "{why}. raidctl re-add {name} {p} {re_add}; raidctl replace {name} {p} NEW rebuilds onto another device"
                ));
            }
            // A member whose file was deleted under the array: said where
            // the slot still holds that very device.
            let deleted = s.deleted_warned.lock().clone();
            for m in &mut st.members {
                let key = s.array.member_of(m.slot).map(|d| d.device_key());
                if key.is_some_and(|k| deleted.contains(&(m.slot, k))) {
                    m.warning = Some(format!(
                        "its file was deleted (or replaced at its path) while the array uses it: the next start will not find it; move it with a hot replace (raidctl replace {} {} NEW)",
                        st.name,
                        m.path.as_deref().unwrap_or("OLD")
                    ));
                }
            }
            let mut health = self.member_health(s);
            for m in &mut st.members {
                // A reading of the device the slot held before is not this one's.
                m.health = health
                    .remove(&m.slot)
                    .filter(|(member, _)| m.path.as_ref() == Some(member))
                    .map(|(_, h)| h);
            }
            st.scrub = s.array.scrub_progress().map(|p| {
                let g = s.array.geometry();
                let per_row = (g.chunk * g.members as u64) as f64;
                status::ScrubStatus {
                    repair: p.repair,
                    rows_done: p.rows_done,
                    rows_total: p.rows_total,
                    percent: p.rows_done as f64 * 100.0 / p.rows_total.max(1) as f64,
                    rate_bytes_per_sec: p.rate,
                    eta_seconds: (p.rows_done > 0)
                        .then(|| (p.rows_total - p.rows_done) as f64 * per_row / p.rate.max(1.0)),
                }
            });
            out.push(st);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response {
            ok: true,
            arrays: out,
            ..Default::default()
        })
    }
}

/// The metadata event of the device at `path` where it holds the metadata
/// of member `member` of array `array` (UUIDs as status shows them).
fn member_events(path: &std::path::Path, array: &str, member: &str) -> Option<u64> {
    status::superblock_at(path)
        .ok()
        .filter(|sb| sb.array_uuid.to_string() == array && sb.member_uuid.to_string() == member)
        .map(|sb| sb.events)
}
