//! `raidctl examine DEV...`: what a device holds, from its own metadata,
//! read-only (safe on a member of a running array): the first thing to run
//! when an array will not start, or a disk's past is unknown (mdadm
//! --examine).

use crate::error::{code, CliError, Result};
use crate::inspect::{probe, Content};
use crate::Format;
use raid_core::metadata::{read_superblock, ROLE_SPARE};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What one device holds, as `examine` prints it (and its JSON form).
#[derive(Debug, Serialize)]
pub struct Examined {
    pub device: String,
    /// "member", "spare", "other" (a filesystem, partition table, nothing
    /// recognisable) or "unreadable".
    pub kind: String,
    pub array: Option<String>,
    pub array_uuid: Option<String>,
    pub level: Option<String>,
    pub chunk_bytes: Option<u64>,
    /// Where the array's data starts on the device: the metadata, bitmap
    /// and degraded-write journal ring lie before it.
    pub data_offset_bytes: Option<u64>,
    /// Bytes of the device the array's data uses, from the data offset on.
    pub data_bytes: Option<u64>,
    pub members: Option<usize>,
    /// The slot this device holds, per its own metadata.
    pub slot: Option<usize>,
    pub member_uuid: Option<String>,
    /// This device's state as its own metadata records it (active, failed,
    /// rebuilding; the newest metadata elsewhere may say more).
    pub member_state: Option<String>,
    pub rebuild_row: Option<u64>,
    /// The event counter: of several devices of one array, the highest is
    /// the newest view; a lower one missed changes.
    pub events: Option<u64>,
    pub created: Option<String>,
    pub updated: Option<String>,
    /// Whether the array was stopped cleanly when this copy was written.
    pub clean: Option<bool>,
    /// What is there when it is not a member, or why it cannot be read.
    pub detail: Option<String>,
    /// Where another device examined with it holds newer metadata of the
    /// same array that no longer gives this device's slot to it (replaced,
    /// failed): what that metadata says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub superseded: Option<String>,
    /// The slot table of this device's metadata (member uuid, state), to
    /// compare devices examined together.
    #[serde(skip)]
    slots: Vec<(String, String)>,
    /// The spares' member uuids in this device's metadata.
    #[serde(skip)]
    spares: Vec<String>,
}

impl Examined {
    fn bare(device: &Path, kind: &str, detail: String) -> Examined {
        Examined {
            device: device.display().to_string(),
            kind: kind.into(),
            array: None,
            array_uuid: None,
            level: None,
            chunk_bytes: None,
            data_offset_bytes: None,
            data_bytes: None,
            members: None,
            slot: None,
            member_uuid: None,
            member_state: None,
            rebuild_row: None,
            events: None,
            created: None,
            updated: None,
            clean: None,
            detail: Some(detail),
            superseded: None,
            slots: Vec::new(),
            spares: Vec::new(),
        }
    }
}

pub fn examine(device: &Path) -> Examined {
    let remote = crate::remote::is_remote(device);
    if device.is_dir() && !remote {
        return Examined::bare(
            device,
            "unreadable",
            "a folder, not a device or a file: name a member device or file".into(),
        );
    }
    let m = match crate::remote::inspect_member(device) {
        Ok(m) => m,
        Err(e) => return Examined::bare(device, "unreadable", format!("cannot open: {e}")),
    };
    let sb = match read_superblock(m.as_ref()) {
        Ok(sb) => sb,
        Err(e) if e.damaged => {
            return Examined::bare(
                device,
                "damaged",
                format!("array metadata found, but no copy of it is valid ({e}): a member whose metadata is damaged; its array starts without it (raidctl start says so), and raidctl replace puts a device (this one too) back in its slot"),
            )
        }
        Err(e) => {
            let what = match probe(device).ok().filter(|_| !remote) {
                Some(Content::Nothing) => "no array metadata, nothing recognisable".to_string(),
                Some(c) => format!("no array metadata; holds {}", crate::daemon::describe(&c)),
                None => String::new(),
            };
            return Examined::bare(
                device,
                "other",
                format!("{what} ({e})").trim_start().to_string(),
            );
        }
    };
    let time = |t: u64| (t > 0).then(|| crate::eventlog::rfc3339(t));
    let entry = (sb.role != ROLE_SPARE)
        .then(|| sb.slots.get(sb.role as usize))
        .flatten();
    Examined {
        device: device.display().to_string(),
        kind: if sb.role == ROLE_SPARE {
            "spare"
        } else {
            "member"
        }
        .into(),
        array: Some(sb.name.clone()),
        array_uuid: Some(sb.array_uuid.to_string()),
        level: Some(sb.level.to_string()),
        chunk_bytes: Some(sb.chunk as u64),
        data_offset_bytes: Some(sb.data_offset),
        data_bytes: Some(sb.data_size),
        members: Some(sb.slots.len()),
        slot: (sb.role != ROLE_SPARE).then_some(sb.role as usize),
        member_uuid: Some(sb.member_uuid.to_string()),
        member_state: entry.map(|e| e.state.name().to_string()),
        rebuild_row: entry
            .filter(|e| e.state == raid_core::metadata::SlotState::Rebuilding)
            .map(|e| e.rebuild_row),
        events: Some(sb.events),
        created: time(sb.ctime),
        updated: time(sb.utime),
        clean: Some(sb.clean),
        detail: None,
        superseded: None,
        slots: sb
            .slots
            .iter()
            .map(|e| (e.uuid.to_string(), e.state.name().to_string()))
            .collect(),
        spares: sb.spares.iter().map(|u| u.to_string()).collect(),
    }
}

pub fn run(devices: &[PathBuf], fmt: Format) -> Result<()> {
    // A network device that connects and then does not answer is given up
    // after a few seconds, not the daemon's member timeout (30 s a read).
    crate::remote::set_timeout(std::time::Duration::from_secs(3));
    let mut all: Vec<Examined> = devices.iter().map(|d| examine(d)).collect();
    mark_superseded(&mut all);
    if fmt == Format::Json {
        out!(
            "{}",
            serde_json::to_string_pretty(&all).expect("examine serialises")
        );
    } else {
        for e in &all {
            out!("{}", render(e));
        }
    }
    if all.iter().any(|e| e.kind == "unreadable") {
        return Err(CliError::quiet(code::NOT_FOUND));
    }
    // Damaged metadata is worth a non-zero status to a script.
    if all.iter().any(|e| e.kind == "damaged") {
        return Err(CliError::quiet(code::FAILED));
    }
    Ok(())
}

/// Marks each member whose slot, in the newest metadata of its array among
/// the devices examined, is no longer its own or is failed: by its own
/// metadata alone it still looks like a member in service.
fn mark_superseded(all: &mut [Examined]) {
    // For each device, the one with its array's newest metadata, if newer.
    let newest: Vec<Option<usize>> = all
        .iter()
        .map(|e| {
            let uuid = e.array_uuid.as_ref()?;
            (0..all.len())
                .filter(|&o| all[o].array_uuid.as_ref() == Some(uuid))
                .max_by_key(|&o| all[o].events.unwrap_or(0))
                .filter(|&o| all[o].events > e.events)
        })
        .collect();
    for (i, n) in newest.into_iter().enumerate() {
        let (Some(n), Some(me)) = (n, all[i].member_uuid.as_ref()) else {
            continue;
        };
        let (dev, events) = (&all[n].device, all[n].events.unwrap_or(0));
        let Some(slot) = all[i].slot else {
            // A spare: taken into a slot since, or no longer the array's.
            let taken = all[n].slots.iter().position(|(holder, _)| holder == me);
            all[i].superseded = match taken {
                Some(k) => Some(format!(
                    "{dev} holds newer metadata of this array (event {events}): this spare took slot {k} there"
                )),
                None if !all[n].spares.contains(me) => Some(format!(
                    "{dev} holds newer metadata of this array (event {events}): this device is no longer a spare of it"
                )),
                None => None,
            };
            continue;
        };
        let said = match all[n].slots.get(slot) {
            Some((holder, _)) if holder != me => Some(format!(
                "{dev} holds newer metadata of this array (event {events}): slot {slot} is another device's now; this one is not in the array"
            )),
            Some((_, state)) if state == "failed" => Some(format!(
                "{dev} holds newer metadata of this array (event {events}): this device is failed there"
            )),
            _ => None,
        };
        all[i].superseded = said;
    }
}

fn render(e: &Examined) -> String {
    let mut t = format!("{}:\n", e.device);
    if e.array.is_none() {
        t.push_str(&format!(
            "  {}: {}\n",
            e.kind,
            e.detail.as_deref().unwrap_or("")
        ));
        return t;
    }
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    t.push_str(&format!(
        "  array:   {} (uuid {})\n  level:   {}, {} members, chunk {}\n",
        opt(&e.array),
        opt(&e.array_uuid),
        opt(&e.level),
        e.members.unwrap_or(0),
        crate::status::human_bytes(e.chunk_bytes.unwrap_or(0))
    ));
    if let (Some(at), Some(len)) = (e.data_offset_bytes, e.data_bytes) {
        t.push_str(&format!(
            "  data:    {} from {} on (metadata and journal before it)\n",
            crate::status::human_bytes(len),
            crate::status::human_bytes(at)
        ));
    }
    match e.slot {
        Some(s) => t.push_str(&format!(
            "  role:    slot {s}, {}{}\n",
            opt(&e.member_state),
            e.rebuild_row
                .map(|r| format!(" (in sync up to row {r})"))
                .unwrap_or_default()
        )),
        None => t.push_str("  role:    spare\n"),
    }
    t.push_str(&format!(
        "  member:  uuid {}\n  events:  {}\n  state:   {}\n  created: {}\n  updated: {}",
        opt(&e.member_uuid),
        e.events.unwrap_or(0),
        if e.clean == Some(true) {
            "clean"
        } else {
            "dirty (not stopped cleanly, or running)"
        },
        opt(&e.created),
        opt(&e.updated)
    ));
    if let Some(s) = &e.superseded {
        t.push_str(&format!("\n  superseded: {s}"));
    }
    t
}
