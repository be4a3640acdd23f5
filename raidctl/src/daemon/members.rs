//! The daemon's membership commands: which slot the operator means,
//! which device may join (by identity, across every running array), and
//! fail, remove, add, re-add, replace and hot replace, each a call of the
//! array's own membership rules.

use super::{describe, Daemon, Served, SpareTurn};
use crate::error::{CliError, Result};
use crate::inspect::{probe, Content};
use raid_core::array::{ArrayError, Rule};
use raid_core::member::{DeviceKey, MemberRef};
use std::path::Path;
use std::sync::Arc;

/// Where the operator named a member by its slot number (`fail NAME 1`,
/// read as a file named "1"): members are named by path, so the error
/// names the path that slot's member has. Not taken as the slot itself:
/// a command that fails or replaces a member must not guess which.
fn slot_hint(s: &Served, path: &Path) -> String {
    let slot = path
        .file_name()
        .and_then(|f| f.to_str())
        .and_then(|f| f.parse::<usize>().ok());
    slot.and_then(|i| {
        let member = s.array.member_of(i).map(|m| m.identity().to_string());
        member
            .or_else(|| {
                let recorded = s.record.lock().members.get(i).cloned();
                recorded.map(|p| p.display().to_string())
            })
            .map(|m| format!("; members are named by path: slot {i} is {m}"))
    })
    .unwrap_or_default()
}

impl Daemon {
    /// The slot the operator means by `path`: the slot whose member is that
    /// device (by identity, whatever path names it), else the slot whose
    /// member has that name, else an empty slot recorded under that path (a
    /// member missing or left out at start).
    pub(super) fn slot_named(&self, s: &Served, path: &Path) -> Result<usize> {
        if let Ok(key) = crate::remote::key_of(path) {
            if let Some(slot) = s.array.slot_by_key(key) {
                return Ok(slot);
            }
        }
        if let Ok(slot) = s.array.slot_of(&path.display().to_string()) {
            return Ok(slot);
        }
        let slots = s.array.slots();
        let recorded = s.record.lock().members.iter().position(|p| p == path);
        if let Some(i) = recorded.filter(|&i| slots[i].member.is_none()) {
            return Ok(i);
        }
        let name = s.array.name();
        // No such file is "not found" (exit 3), as the exit codes say; a
        // network member's name is no path.
        let p = path.display().to_string();
        if !p.contains("://") && !path.exists() {
            return Err(CliError::not_found(format!(
                "{p} does not exist, and no member of array '{name}' is named so{} (raidctl status {name} lists them)",
                slot_hint(s, path)
            )));
        }
        Err(CliError::refused(format!(
            "{p} is not a member of array '{name}' (raidctl status {name} lists them)"
        )))
    }

    pub(super) fn fail(&self, name: &str, member: &Path, force: bool) -> Result<String> {
        let s = self.served(name)?;
        // The new device of a hot replace: failing it drops the replacement.
        if let Some(slot) = crate::remote::key_of(member)
            .ok()
            .and_then(|k| s.array.drop_replacement(k))
        {
            return Ok(format!(
                "the hot replace of slot {slot} of '{name}' onto {} is dropped at the copy's next batch; the slot's member stays as it was, and the array loses no redundancy",
                member.display()
            ));
        }
        let slot = self.slot_named(&s, member)?;
        let was = s.array.state();
        // A hot replace of this slot ends with its source: said below.
        let copy = s
            .array
            .hot_replace_progress()
            .filter(|(hot, ..)| *hot == slot)
            .map(|(_, new, ..)| new);
        // Held before the fail: a hot replace's copy may take the slot for
        // its new device as soon as the fail is in, and release it.
        let newly_held = self.reconnects.hold(name, slot);
        let (failed, spares) = (
            s.array.member_of(slot).map(|m| m.identity().to_string()),
            s.array.spares(),
        );
        if let Err(e) = s.array.fail_member(slot, force) {
            // A network member the daemon gave up (unreachable) is failed
            // already, and would come back by itself when its server
            // answers: the operator's fail keeps it out.
            // So is one whose server did not answer at the start, which
            // the daemon retries by its recorded URI.
            let given_up = s.array.member_of(slot).is_some_and(|m| m.unreachable());
            let missed = s.array.member_of(slot).is_none()
                && crate::remote::is_remote(member)
                && s.array
                    .slots()
                    .get(slot)
                    .is_some_and(|x| x.missing_at_start);
            if (given_up || missed)
                && matches!(
                    e,
                    ArrayError::Refused {
                        rule: Rule::AlreadyFailed,
                        ..
                    }
                )
            {
                return Ok(format!(
                    "member {m} (slot {slot}) of '{name}' was failed already ({why}); it now stays out: it is not taken back when its server answers again (raidctl re-add {name} {m} takes it back, raidctl replace {name} {m} NEW_DEVICE puts another device in)",
                    m = member.display(),
                    why = match given_up {
                        true => "given up as unreachable",
                        false => "its server did not answer at the start",
                    }
                ));
            }
            if newly_held {
                self.reconnects.release(name, slot);
            }
            return Err(e.into());
        }
        let now = s.array.state();
        let mut msg = format!(
            "member {} (slot {slot}) of '{name}' marked failed; array is {}",
            member.display(),
            now.name()
        );
        match copy {
            Some(new) if now == raid_core::array::ArrayState::Failed => msg.push_str(&format!(
                "\nthe hot replace of slot {slot} onto {new} is dropped at the copy's next batch: there is nothing left to rebuild {new} from"
            )),
            Some(new) => msg.push_str(&format!(
                "\nthe hot replace of slot {slot} onto {new} becomes a rebuild: {new} takes the slot as soon as the copy sees the failure (its current batch, or its pause, ends) and is rebuilt from the other members (raidctl wait {name})"
            )),
            // A spare at hand takes the slot now, as the monitor would at
            // its next look (another command may take it first: say what
            // happened): a re-add of this member is then refused, so say
            // what remains.
            None if now != raid_core::array::ArrayState::Failed => {
                let turn = self.take_spare(&s);
                // Said from who holds the slot now, whoever gave it: this
                // look, or the monitor's, which may come between the
                // failure and it (one of the spares there were, not the
                // failed member).
                let holder = s.array.member_of(slot).map(|m| m.identity().to_string());
                let given = holder.filter(|sp| Some(sp) != failed.as_ref() && spares.contains(sp));
                if let Some(spare) = &given {
                    msg.push_str(&format!(
                        "\nspare {spare} took slot {slot} and is being rebuilt (raidctl wait {name}); {m} can come back only as a spare now (raidctl add {name} {m})",
                        m = member.display()
                    ));
                }
                match turn {
                    SpareTurn::Took(took, spare) if took != slot => msg.push_str(&format!(
                        "\nspare {spare} took slot {took}, failed before this one, and is being rebuilt"
                    )),
                    SpareTurn::Waits(what, k) if given.is_none() => {
                        if let Some(spare) = s.array.spares().first() {
                            msg.push_str(&format!(
                                "\na spare ({spare} now) takes slot {slot} once the {what} of slot {k} ends, if it is still a spare then"
                            ));
                        }
                    }
                    _ => {}
                }
            }
            None => {}
        }
        if now == raid_core::array::ArrayState::Failed && was != now {
            msg.push_str(&format!(
                "\nforced: '{name}' has lost more members than its level tolerates and serves no I/O now. To undo: raidctl stop {name}; raidctl start {name} --force (takes back the newest failed members)"
            ));
        }
        Ok(msg)
    }

    /// A hot replace the event log shows started and never ended (the
    /// daemon was killed while it copied): its slot and new device. Nothing
    /// of it is on disk (the old device is still the member), but the log
    /// and its alerts would otherwise stop at "started".
    /// A slot whose device is `new` already (the switch, or the takeover
    /// after its source failed, reached the metadata but not the log
    /// before the daemon died) did end, whatever the log says.
    pub(super) fn unfinished_hot_replace(
        &self,
        name: &str,
        array: &raid_core::array::Array,
    ) -> Option<(usize, String)> {
        let log = crate::eventlog::read(&self.state, name);
        let last = log
            .iter()
            .rev()
            .find(|r| r.event.starts_with("hot_replace_"))?;
        if last.event != "hot_replace_started" {
            return None;
        }
        // A log an earlier version wrote names it only in the message:
        // "... copying OLD onto NEW, redundancy kept" (ArrayEvent::describe).
        let new = last.new_member.clone().or_else(|| {
            last.message
                .rsplit_once(" onto ")
                .map(|(_, t)| t.trim_end_matches(", redundancy kept").to_string())
        })?;
        let slot = last.slot?;
        let holds_new = array
            .slots()
            .get(slot)
            .is_some_and(|s| s.member.as_deref() == Some(new.as_str()));
        (!holds_new).then_some((slot, new))
    }

    pub(super) fn remove(&self, name: &str, member: &Path) -> Result<String> {
        let s = self.served(name)?;
        let key = match crate::remote::key_of(member) {
            Ok(k) => k,
            Err(_) => {
                // The device is gone: its slot (if any) is already empty.
                let slot = self.slot_named(&s, member)?;
                return Err(CliError::refused(format!(
                    "{} is gone and slot {slot} of '{name}' is already empty: put a new device in it (raidctl replace {name} {} NEW_DEVICE)",
                    member.display(),
                    member.display()
                )));
            }
        };
        if s.array.is_replacement(key) {
            return Err(CliError::refused(format!(
                "{} is the new device of a hot replace that runs, not yet a member: to drop it, raidctl fail {name} {}",
                member.display(),
                member.display()
            )));
        }
        if !s.array.holds(key) {
            return Err(CliError::refused(format!(
                "{} is neither a member nor a spare of '{name}' (raidctl status {name} lists them)",
                member.display()
            )));
        }
        self.record_writable(&s)?;
        s.array.remove_member(key)?;
        s.record_spares(None);
        let warn = self.save_record(&s).err().unwrap_or_default();
        Ok(format!(
            "member {m} removed from '{name}'; its metadata stays on it: raidctl add {name} {m} takes it back, and for another array {}{warn}",
            erase_hint(member),
            m = member.display()
        ))
    }

    /// Refuses `path` (device `key`) where a running array holds it: as a
    /// member, as the new device of a hot replace, or as a spare.
    pub(super) fn not_held(&self, path: &Path, key: DeviceKey) -> Result<()> {
        let running: Vec<Arc<Served>> = self.arrays.lock().values().cloned().collect();
        for other in running {
            if let Some(slot) = other.array.slot_by_key(key) {
                return Err(CliError::refused(format!(
                    "{} is the member of slot {slot} of array '{}' (the same {key}, whatever the path): a device can only be in one place. Name a device that is in no array [refused: {}]",
                    path.display(),
                    other.array.name(),
                    Rule::AlreadyMember
                )));
            }
            if other.array.is_replacement(key) {
                return Err(CliError::refused(format!(
                    "{} is the device array '{}' is copying a member onto (a hot replace): it becomes that slot's member when the copy ends (raidctl status {} shows it). Name another device",
                    path.display(),
                    other.array.name(),
                    other.array.name()
                )));
            }
            if other.array.holds(key) {
                return Err(CliError::refused(format!(
                    "{} is a spare of array '{}' (the same {key}): remove it there first (raidctl remove {} {})",
                    path.display(),
                    other.array.name(),
                    other.array.name(),
                    path.display()
                )));
            }
        }
        Ok(())
    }

    /// Opens a device that is to join `served`, refusing one that is in
    /// any array (by identity: a hard link or another path to a member is
    /// the member), holds data, or is in use.
    pub(super) fn open_new_member(&self, served: &Served, path: &Path) -> Result<MemberRef> {
        /// Whether `served`'s record names the device `key` (a slot's or
        /// a spare's).
        fn recorded_in(served: &Served, key: DeviceKey) -> bool {
            let rec = served.record.lock();
            rec.members
                .iter()
                .chain(&rec.spares)
                .any(|p| crate::remote::key_of(p).ok() == Some(key))
        }
        let key = crate::remote::key_of(path)
            .map_err(|e| CliError::not_found(format!("{} cannot be read: {e}", path.display())))?;
        self.not_held(path, key)?;
        match probe(path) {
            Err(e) => {
                return Err(CliError::not_found(format!(
                    "{} cannot be read: {e}",
                    path.display()
                )))
            }
            Ok(Content::Nothing) => {}
            Ok(Content::Array { uuid, .. }) if uuid == served.array.uuid().to_string() => {}
            Ok(Content::Array { name, uuid }) => {
                // Not held by a running array (checked above, by device):
                // a stopped array's, an old member of one, or one this
                // host does not know. Deleting that array frees this device
                // only where the record is of this very array and names
                // it; otherwise it would wipe another array's devices.
                let recorded = self.state.load(&name).is_ok_and(|r| {
                    r.uuid == uuid
                        && r.members
                            .iter()
                            .chain(&r.spares)
                            .any(|p| DeviceKey::of_path(p).ok() == Some(key))
                });
                let free = if recorded {
                    format!("if '{name}' is no longer wanted, raidctl delete {name} --wipe --force frees its devices")
                } else {
                    format!("if its data is not wanted, {}", erase_hint(path))
                };
                return Err(CliError::refused(format!(
                    "{} carries the metadata of array '{name}' (uuid {uuid}): {free}",
                    path.display()
                )));
            }
            // Damaged metadata on a device this array's record names (its
            // own member, left out at the start for it): put back in its
            // slot, it is rebuilt whole, as a blank device would be.
            Ok(Content::UnreadableArray(_)) if recorded_in(served, key) => {}
            // wipefs does not know raidctl's metadata: it would report
            // success and leave it.
            Ok(other @ Content::UnreadableArray(_)) => {
                return Err(CliError::refused(format!(
                    "{} holds {}: if its data is not wanted, {}",
                    path.display(),
                    describe(&other),
                    erase_hint(path)
                )))
            }
            Ok(other) => {
                return Err(CliError::refused(format!(
                    "{} holds {}: wipe it first (wipefs -a) if its data is not wanted",
                    path.display(),
                    describe(&other)
                )))
            }
        }
        // A record naming it for a slot its running array no longer holds
        // it in (a member removed there, kept as the slot's recorded
        // device) does not make it that array's: the running array says.
        let owner = self
            .state
            .owner_of(path, Some(served.array.name()))
            .filter(|r| {
                let running = self.arrays.lock().get(&r.name).cloned();
                running.is_none_or(|a| a.array.holds(key))
            });
        if let Some(owner) = owner {
            return Err(CliError::refused(format!(
                "{} is recorded as a member of array '{}'",
                path.display(),
                owner.name
            )));
        }
        crate::remote::open_member(path).map_err(|e| match e.kind() {
            // Taken meanwhile by a command that ran at the same time (the
            // checks above passed): said as the array and slot that hold
            // it, once that command has put it there (it holds the device
            // open a moment before it does).
            std::io::ErrorKind::ResourceBusy => {
                let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
                loop {
                    if let Err(held) = self.not_held(path, key) {
                        break held;
                    }
                    if std::time::Instant::now() >= until {
                        break CliError::refused(e.to_string());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
            _ => CliError::not_found(format!("{} cannot be opened: {e}", path.display())),
        })
    }

    pub(super) fn add(&self, name: &str, member: &Path) -> Result<String> {
        let s = self.served(name)?;
        let m = self.open_new_member(&s, member)?;
        self.record_writable(&s)?;
        s.array.add_spare(m)?;
        s.record_spares(Some(member));
        let warn = self.save_record(&s).err().unwrap_or_default();
        Ok(format!(
            "{} added to '{name}' as a spare{warn}",
            member.display()
        ))
    }

    /// Takes back a member that left its slot: it must not be held by any
    /// other running array; the array checks it is this slot's own member.
    pub(super) fn re_add(&self, name: &str, member: &Path) -> Result<String> {
        self.re_add_as(name, member, false)
    }

    /// `re_add`; `auto`: the daemon's own, for a network member back after
    /// it was given up, which must not take a slot the operator failed
    /// meanwhile (checked under the holds' lock, which `fail` takes too).
    pub(super) fn re_add_as(&self, name: &str, member: &Path, auto: bool) -> Result<String> {
        let s = self.served(name)?;
        let key = crate::remote::key_of(member).map_err(|e| {
            CliError::not_found(format!("{} cannot be read: {e}", member.display()))
        })?;
        let running: Vec<Arc<Served>> = self.arrays.lock().values().cloned().collect();
        for other in running.iter().filter(|o| o.array.name() != name) {
            if other.array.holds(key) {
                return Err(CliError::refused(format!(
                    "{} is in array '{}' now: it cannot be re-added to '{name}'",
                    member.display(),
                    other.array.name()
                )));
            }
        }
        // A failed member still in its slot is held open by this array
        // already: use that handle rather than opening it again.
        let open = || {
            crate::remote::open_member(member).map_err(|e| match e.kind() {
                std::io::ErrorKind::ResourceBusy => CliError::refused(e.to_string()),
                _ => CliError::not_found(format!("{} cannot be opened: {e}", member.display())),
            })
        };
        // A network member takes a new connection (the old one was given
        // up, or its server answered with errors or another disk).
        let m: MemberRef = match s.array.slot_by_key(key) {
            Some(slot) => match s.array.member_of(slot) {
                Some(m) if m.unreachable() || crate::remote::is_remote(member) => open()?,
                Some(m) => m,
                None => {
                    return Err(CliError::refused(format!(
                        "slot {slot} of '{name}' holds no device"
                    )))
                }
            },
            None => open()?,
        };
        // Where the record names this path in its slot already (a network
        // member reconnecting, a re-add by the recorded path) it does not
        // change: nothing to refuse for.
        let recorded = s.array.slot_by_key(key).is_some_and(|slot| {
            s.record.lock().members.get(slot).map(|p| p.as_path()) == Some(member)
        });
        if !recorded {
            self.record_writable(&s)?;
        }
        let slot = {
            // The daemon's own re-add holds the holds' lock through it.
            let holds = auto.then(|| self.reconnects.holds());
            let slot = s.array.slot_by_key(key);
            if let (Some(holds), Some(slot)) = (&holds, slot) {
                if holds.contains(&(name.to_string(), slot)) {
                    return Err(CliError::refused(format!(
                        "slot {slot} of '{name}' was failed by the operator: it is not taken back by itself"
                    )));
                }
            }
            // By itself, only a member as it left: an older copy of it
            // (a server restarted on an old image) is the operator's call.
            match auto {
                true => s.array.re_add_if_current(m)?,
                false => s.array.re_add(m)?,
            }
        };
        // Asked before its rebuild starts (a short one may end at once).
        let how = match s.array.resyncs_dirty_only(slot) {
            true => "resyncing the regions written since it left",
            false => "copying it whole (raidctl events says why)",
        };
        self.reconnects.release(name, slot);
        if !auto {
            self.reconnects.forget_returns(name, slot);
        }
        s.record_slot(slot, key, member);
        let warn = self.save_record(&s).err().unwrap_or_default();
        self.kick_rebuild(&s);
        Ok(format!(
            "{} re-added to slot {slot} of '{name}'; {how}{warn}",
            member.display()
        ))
    }

    pub(super) fn replace(&self, name: &str, old: &Path, new: &Path) -> Result<String> {
        let s = self.served(name)?;
        let slot = self.slot_named(&s, old)?;
        // The slot's own failed member named as its new device: what is
        // meant is a re-add, or a full rebuild once it is out of the slot.
        let own = crate::remote::key_of(new).is_ok_and(|k| s.array.slot_by_key(k) == Some(slot))
            && s.array.slots()[slot].state == raid_core::metadata::SlotState::Failed;
        if own {
            // What it serves now: the member (a re-add fits), or a disk
            // without the array's metadata (a blank one swapped in behind
            // the same path or URI), which only a rebuild can fill.
            // (A network member's old connection may be given up: asked
            // on a new one; one that cannot be reached is taken as the
            // member, for a re-add to say more.)
            let device = match crate::remote::is_remote(new) {
                true => crate::remote::open_member(new).ok(),
                false => s.array.member_of(slot),
            };
            let holds_member = device.is_none_or(|m| {
                match raid_core::metadata::read_superblock(m.as_ref()) {
                    Ok(sb) => sb.array_uuid == s.array.uuid(),
                    // Not read: not known to be blank (a dying disk).
                    Err(e) => e.unreadable,
                }
            });
            return Err(CliError::refused(match holds_member {
                true => format!(
                    "{n} is slot {slot}'s own member, marked failed: to take it back, raidctl re-add {name} {n} (only the regions written since it left are resynced); to rebuild it whole, raidctl remove {name} {n} first, then this replace",
                    n = new.display()
                ),
                false => format!(
                    "{n} is slot {slot}'s own device, marked failed, and holds no metadata of '{name}' now (a blank disk behind the same name?): raidctl remove {name} {n} takes it out of the slot, then this replace rebuilds onto it",
                    n = new.display()
                ),
            }));
        }
        let m = self.open_new_member(&s, new)?;
        // A hot replace records its switch when the copy makes it: that
        // record must be writable too.
        self.record_writable(&s)?;
        if s.array.slots()[slot].state == raid_core::metadata::SlotState::Active {
            return self.hot_replace(&s, slot, m, old, new);
        }
        let key = m.device_key();
        s.array.replace(slot, m)?;
        self.reconnects.release(name, slot);
        self.reconnects.forget_returns(name, slot);
        s.record_slot(slot, key, new);
        let warn = self.save_record(&s).err().unwrap_or_default();
        // One copy runs at a time: a hot replace, or a mirror's rebuild,
        // goes on first; a RAID5/6 rebuild pass takes the new member on.
        let busy = s.array.copy_progress().filter(|c| c.slot != slot);
        let parity = matches!(
            s.array.geometry().level,
            raid_core::layout::Level::Raid5 | raid_core::layout::Level::Raid6
        );
        self.kick_rebuild(&s);
        let when = match busy {
            Some(c) if parity && c.kind == raid_core::array::CopyKind::Rebuild => format!(
                "rebuild started, in the pass that rebuilds slot {}: one pass of reads for both, slot {}'s rebuild not held back (raidctl status {name} shows each)",
                c.slot, c.slot
            ),
            Some(c) => format!(
                "rebuilt once slot {}'s {} ends (raidctl status {name} shows both)",
                c.slot,
                match c.kind {
                    raid_core::array::CopyKind::Rebuild => "rebuild",
                    raid_core::array::CopyKind::HotReplace => "hot replace",
                }
            ),
            None => "rebuild started".into(),
        };
        Ok(format!(
            "{} replaces {} in slot {slot} of '{name}'; {when}{warn}",
            new.display(),
            old.display()
        ))
    }

    /// Replaces an active member while the array keeps its redundancy
    /// (the array runs the copy in its rebuild's place, one at a time); the
    /// record names the new device once the copy has switched it in.
    pub(super) fn hot_replace(
        &self,
        s: &Arc<Served>,
        slot: usize,
        m: MemberRef,
        old: &Path,
        new: &Path,
    ) -> Result<String> {
        let name = s.array.name().to_string();
        let (served, state, path) = (s.clone(), self.state.clone(), new.to_path_buf());
        let (key, reconnects) = (m.device_key(), self.reconnects.clone());
        s.array.start_hot_replace(
            slot,
            m,
            &self.rebuild_opts,
            // The new device holds the slot when the copy switched it in,
            // and also when the old one failed and it took the slot to be
            // rebuilt (the monitor starts that rebuild once this copy's
            // thread has ended).
            Box::new(move |a, _| {
                if served.record_slot(slot, key, &path) {
                    reconnects.release(a.name(), slot);
                    // Written again by the monitor where it cannot be now.
                    let _ = super::record::save(&state, &served);
                }
            }),
        )?;
        // Said as it is: a degraded array stays degraded during the copy.
        let meanwhile = match s.array.state() {
            raid_core::array::ArrayState::Optimal => {
                "the array keeps its redundancy meanwhile".to_string()
            }
            st => format!(
                "the array stays {} meanwhile (the slot keeps its device until the copy ends)",
                st.name()
            ),
        };
        Ok(format!(
            "hot replace: copying {} onto {} in slot {slot} of '{name}'; {meanwhile} (raidctl wait {name})",
            old.display(),
            new.display()
        ))
    }
}

/// How to erase a device's raidctl metadata (both copies lie in its first
/// MiB; wipefs does not know them), keeping a member file's size.
fn erase_hint(device: &Path) -> String {
    match crate::remote::is_remote(device) {
        true => format!(
            "erase its first MiB (qemu-io -f raw -c 'write -z 0 1M' '{}')",
            device.display()
        ),
        false => format!(
            "erase its first MiB (dd if=/dev/zero of={} bs=1M count=1 conv=notrunc)",
            device.display()
        ),
    }
}
