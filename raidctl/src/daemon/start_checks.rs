//! What a start checks of its devices' metadata before assembly, which
//! would otherwise take the newest metadata among them for the truth: each
//! refusal changes nothing on any device.

use crate::error::{CliError, Result};
use crate::registry::ArrayRecord;

/// Refuses a start whose devices (`read`: each one's path and metadata)
/// carry arrays other than `name`'s (its recorded uuid, or where none is
/// recorded the one most of them carry under that name), naming each
/// device that does not belong, before assembly: that would take the
/// newest metadata among all of them for the truth, another array's
/// maybe, and name `name`'s own devices as the ones to leave out.
pub(super) fn foreign_devices(
    name: &str,
    recorded: &Result<ArrayRecord>,
    read: &[(String, raid_core::metadata::Superblock)],
) -> Result<()> {
    let uuid_of = |sb: &raid_core::metadata::Superblock| sb.array_uuid.to_string();
    let ours = match recorded {
        Ok(r) => r.uuid.clone(),
        Err(_) => {
            let named: Vec<String> = read
                .iter()
                .filter(|(_, sb)| sb.name == name)
                .map(|(_, sb)| uuid_of(sb))
                .collect();
            let most = named
                .iter()
                .max_by_key(|u| named.iter().filter(|v| v == u).count());
            match most {
                Some(u) => u.clone(),
                None => return Ok(()),
            }
        }
    };
    if !read.iter().any(|(_, sb)| uuid_of(sb) == ours) {
        // None is this array's: same_array's refusal says which array
        // they carry.
        return Ok(());
    }
    let foreign: Vec<String> = read
        .iter()
        .filter(|(_, sb)| uuid_of(sb) != ours)
        .map(|(p, sb)| format!("{p} carries array '{}' (uuid {})", sb.name, uuid_of(sb)))
        .collect();
    if foreign.is_empty() {
        return Ok(());
    }
    Err(CliError::refused(format!(
        "{}, not '{name}' (uuid {ours}): leave it out of the devices of '{name}' (raidctl start {name} --members with its own devices only, or --scan DIR... to find them by their metadata); '{name}' is not started",
        foreign.join("; ")
    )))
}

/// Refuses a start from the record where the record is older than the
/// array: a slot in sync in the newest metadata of the devices it names
/// has none of them as its member, and the device the record names for it
/// is one the array replaced since (by a spare or a replace). Started, the
/// slot would be marked failed for a device that is in sync and only not
/// named (a state folder restored from a copy). A slot whose recorded
/// device is simply gone is a drive missing, and starts degraded.
pub(super) fn outdated_record(
    name: &str,
    recorded: &Result<ArrayRecord>,
    read: &[(String, raid_core::metadata::Superblock)],
) -> Result<()> {
    use raid_core::metadata::SlotState;
    let Ok(r) = recorded else { return Ok(()) };
    let ours: Vec<&raid_core::metadata::Superblock> = read
        .iter()
        .map(|(_, sb)| sb)
        .filter(|sb| sb.array_uuid.to_string() == r.uuid)
        .collect();
    let Some(truth) = ours.iter().max_by_key(|sb| sb.events) else {
        return Ok(());
    };
    for (i, slot) in truth.slots.iter().enumerate() {
        // Only a slot in sync: a rebuilding one's device may be new since
        // the record (a replace cut short by a crash before the record
        // was saved), and that array starts degraded as before.
        if slot.state != SlotState::Active || ours.iter().any(|sb| sb.member_uuid == slot.uuid) {
            continue;
        }
        let Some(path) = r.members.get(i).map(|p| p.to_string_lossy().to_string()) else {
            continue;
        };
        // A member the array replaced since: one of another slot there
        // now is a device renamed, and this slot's own simply missing.
        let replaced = read.iter().any(|(p, sb)| {
            *p == path
                && sb.array_uuid.to_string() == r.uuid
                && truth.slots.iter().all(|x| x.uuid != sb.member_uuid)
        });
        if replaced {
            return Err(CliError::refused(format!(
                "the record of '{name}' is older than the array: it names {path} for slot {i}, but the array's newest metadata (event {}) has another device in sync there, not among the recorded ones (a state folder restored from a copy?). raidctl start {name} --scan DIR... finds the array's devices by their metadata, or name them with --members; nothing was changed",
                truth.events
            )));
        }
    }
    Ok(())
}
