//! Starting and stopping one array in the daemon: its members opened
//! (and what a start must refuse), assembly, the record, the parity
//! engine, its export; and a stop that says what background work it cut.

use super::*;
use raid_core::array::RefusalKind;

/// A start under way (`Daemon::reserve`): the name is kept from a second
/// start until the array runs or the start fails.
struct Starting<'a> {
    daemon: &'a Daemon,
    name: String,
    lock: Option<std::fs::File>,
}

impl Starting<'_> {
    /// The array runs: its name lock is kept until it stops.
    fn started(mut self) {
        if let Some(f) = self.lock.take() {
            self.daemon.name_locks.lock().insert(self.name.clone(), f);
        }
    }
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.daemon.starting.lock().remove(&self.name);
    }
}

impl Daemon {
    /// Keeps `name` for this start: refused where the array runs, another
    /// start of it is under way, or a `delete` of it is.
    fn reserve(&self, name: &str) -> Result<Starting<'_>> {
        // Kept first, then the running check: a start that ends between
        // the two is running by then (it is inserted before it lets go).
        if !self.starting.lock().insert(name.to_string()) {
            return Err(CliError::refused(format!(
                "array '{name}' is being started already (another raidctl start): nothing else was done"
            )));
        }
        let mut s = Starting {
            daemon: self,
            name: name.to_string(),
            lock: None,
        };
        let running = self.arrays.lock().get(name).cloned();
        if let Some(served) = running {
            // Said with what it serves: a start after a crash without
            // --nbd serves no export, and a second start with --nbd is
            // refused here.
            let exports: Vec<String> = served.exports.lock().iter().map(|e| e.describe()).collect();
            let serving = match exports.is_empty() {
                true => "no NBD export".to_string(),
                false => exports.join(", "),
            };
            return Err(CliError::refused(format!(
                "array '{name}' is already running (serving {serving}): nothing was changed. To serve it on another export, stop it (raidctl stop {name}), then start it with --nbd"
            )));
        }
        match self.state.hold_name(name, false) {
            Ok(Some(f)) => s.lock = Some(f),
            Ok(None) => {
                return Err(CliError::refused(format!(
                    "array '{name}' is being deleted (a raidctl delete runs now): not started"
                )))
            }
            // A read-only state folder: started without it, as before.
            Err(e) => tracing::debug!(array = %name, "no name lock ({e})"),
        }
        Ok(s)
    }

    pub(super) fn start(
        &self,
        name: &str,
        members: Vec<PathBuf>,
        nbd: Option<(String, crate::export::Security)>,
        parity_asked: Option<String>,
        // `force`: members marked failed or stale too; `listed`: the
        // members were typed, each slot in sync must be among them.
        (force, listed): (bool, bool),
    ) -> Result<String> {
        let starting = self.reserve(name)?;
        if let Some((spec, sec)) = &nbd {
            // Another array's export named first: the spec's own check
            // would call it only "another server".
            let arrays: Vec<Arc<Served>> = self.arrays.lock().values().cloned().collect();
            if let Some(other) = arrays
                .iter()
                .find(|s| s.exports.lock().iter().any(|e| e.listens_at(spec)))
            {
                let other = other.array.name();
                return Err(CliError::refused(format!(
                    "{spec} is where array '{other}' is exported already: choose another for '{name}' (or raidctl stop {other} first)"
                )));
            }
            crate::export::check_spec(spec, sec)?;
        }
        if let Some(p) = &parity_asked {
            p.parse::<ParityMode>().map_err(CliError::usage)?;
        }
        let recorded = self.state.load(name);
        let importing = !members.is_empty();
        let (paths, spares, parity) = match (&recorded, importing) {
            (_, true) => (
                members.clone(),
                vec![],
                recorded
                    .as_ref()
                    .map(|r| r.parity.clone())
                    .unwrap_or("auto".into()),
            ),
            (Ok(r), false) => (r.members.clone(), r.spares.clone(), r.parity.clone()),
            (Err(e), false) => return Err(e.clone()),
        };
        // Each device once, by identity (a second open of the same one
        // would be refused as "in use", which it is not).
        let mut seen = std::collections::HashMap::new();
        for p in paths.iter().filter(|_| importing) {
            if let Some(first) = crate::remote::key_of(p)
                .ok()
                .and_then(|k| seen.insert(k, p))
            {
                return Err(CliError::refused(format!(
                    "{} and {} are the same device: list each device once",
                    first.display(),
                    p.display()
                )));
            }
        }
        let mut opened: Vec<MemberRef> = Vec::new();
        let mut files: Vec<Arc<FileMember>> = Vec::new();
        let mut notes = Vec::new();
        // An empty path: a slot no device was ever recorded for (a start
        // that found none for it); nothing to open.
        for p in paths
            .iter()
            .chain(&spares)
            .filter(|p| !p.as_os_str().is_empty())
        {
            let m = if crate::remote::is_remote(p) {
                crate::remote::open_member(p)
            } else {
                FileMember::open(p).map(|m| {
                    let m = Arc::new(m);
                    files.push(m.clone());
                    m as MemberRef
                })
            };
            // A device the record still names for a slot (a member
            // removed there) that another running array holds now: not
            // this array's any more, so its slot stays empty rather than
            // the whole start refused as "in use".
            let elsewhere = match &m {
                Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy && !importing => {
                    crate::remote::key_of(p)
                        .ok()
                        .and_then(|k| self.not_held(p, k).err())
                }
                _ => None,
            };
            match m {
                Err(_) if elsewhere.is_some() => notes.push(format!(
                    "{} is recorded for '{name}' but is not used: {}",
                    p.display(),
                    elsewhere.map(|e| e.msg).unwrap_or_default()
                )),
                Ok(m) => opened.push(m),
                // Held by another array or program: starting without it
                // would mark it failed for nothing. Refuse the whole start.
                Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => {
                    return Err(CliError::refused(format!(
                        "{e}; '{name}' is not started. Stop whatever holds it (raidctl list shows the running arrays)"
                    )))
                }
                Err(e) if importing => {
                    return Err(CliError::not_found(format!(
                        "member {} cannot be opened: {e}",
                        p.display()
                    )))
                }
                Err(e) => notes.push(format!("member {} is missing ({e})", p.display())),
            }
        }
        // Members typed on the command line must be all of them: one left
        // out by mistake would turn the array degraded. Recorded members,
        // a scan's or the config's, that cannot be found (a drive gone)
        // do not stop it.
        if opened.is_empty() {
            return Err(CliError::not_found(format!(
                "none of the devices of '{name}' could be opened ({}): if they moved, raidctl start {name} --scan [DIR...] finds them by the array's uuid; or name them with --members",
                notes.join("; ")
            )));
        }
        // Which array the devices carry, read before assembly writes to
        // them: a start refused for naming the wrong array must leave
        // every device as it was (the same checks follow assembly, for
        // what it settles from all of them).
        let read: Vec<(String, raid_core::metadata::Superblock)> = opened
            .iter()
            .filter_map(|m| {
                let sb = raid_core::metadata::read_superblock(m.as_ref()).ok()?;
                Some((m.identity().to_string(), sb))
            })
            .collect();
        let carried: Vec<(String, String)> = read
            .iter()
            .map(|(_, sb)| (sb.name.clone(), sb.array_uuid.to_string()))
            .collect();
        // The device each slot's metadata names, given though assembly may
        // leave it out (stale, failed): a slot with no member in use is
        // recorded with it, where no record names one (an import), so that
        // replace, delete --wipe and status can name it.
        let claimed = |uuid: &str, slot: usize| {
            read.iter()
                .find(|(_, sb)| sb.array_uuid.to_string() == uuid && sb.role as usize == slot)
                .map(|(p, _)| PathBuf::from(p))
        };
        self.same_array(name, &recorded, &carried)?;
        super::start_checks::foreign_devices(name, &recorded, &read)?;
        if !importing && !force {
            super::start_checks::outdated_record(name, &recorded, &read)?;
        }
        // Arrays created sparse before this was the rule: their metadata
        // and journal area gets its blocks now, before assembly writes
        // there (a full filesystem must not stop it), and after the checks
        // above, so that a refused start leaves the files as they were.
        for f in &files {
            let me = raid_core::member::Member::identity(f.as_ref());
            let area = read
                .iter()
                .find(|(p, _)| p == me)
                .map_or(raid_core::metadata::MIN_DATA_OFFSET, |(_, sb)| {
                    sb.data_offset
                });
            if let Err(e) = f.allocate_range(0, area) {
                tracing::warn!(member = %me, "cannot allocate the metadata area: {e}");
            }
        }
        // An unclean start is served at once: its resync runs in the
        // background (the monitor starts it), as md's does.
        let asm = Array::assemble_with(
            opened,
            raid_core::array::AssembleOptions {
                force,
                every_member: listed && !force,
                resync: raid_core::array::ResyncAt::Background,
            },
        )?;
        let mut array = asm.array;
        array.set_bitmap_linger(Some(self.bitmap_linger));
        // The same rule on what assembly settled from all of them.
        self.same_array(
            name,
            &recorded,
            &[(array.name().to_string(), array.uuid().to_string())],
        )?;
        // A recorded spare that assembly left out of a start naming its
        // devices is told of as a spare, below, where it is dropped from
        // the record.
        let key = |p: &Path| raid_core::member::DeviceKey::of_path(p).ok();
        let recorded_spare = |m: &str| {
            let k = key(Path::new(m));
            importing
                && k.is_some()
                && recorded.as_ref().is_ok_and(|r| {
                    r.spares.iter().any(|sp| key(sp) == k) && !r.members.iter().any(|p| key(p) == k)
                })
        };
        for (m, why) in asm.refused.iter().filter(|(m, _)| !recorded_spare(m)) {
            // Where its metadata cannot say which slot it held, the record
            // can.
            let slot = recorded
                .as_ref()
                .ok()
                .and_then(|r| r.members.iter().position(|p| p == Path::new(m)))
                .filter(|_| why.kind == RefusalKind::NoMetadata)
                .map(|i| format!(" (the record has it in slot {i})"))
                .unwrap_or_default();
            notes.push(format!("member {m} not used{slot}: {why}"));
        }
        for (m, why) in &asm.forced {
            notes.push(format!("member {m} {why}"));
        }
        let g = array.geometry();
        let record = ArrayRecord {
            name: name.to_string(),
            uuid: array.uuid().to_string(),
            level: g.level.number(),
            chunk: g.chunk,
            members: array
                .slots()
                .iter()
                .map(|s| {
                    s.member
                        .as_ref()
                        .map(PathBuf::from)
                        .or_else(|| {
                            recorded
                                .as_ref()
                                .ok()
                                .and_then(|r| r.members.get(s.slot).cloned())
                                .filter(|p| !p.as_os_str().is_empty())
                        })
                        .or_else(|| claimed(&array.uuid().to_string(), s.slot))
                        .unwrap_or_default()
                })
                .collect(),
            spares: array.spares().into_iter().map(PathBuf::from).collect(),
            parity: parity_asked.unwrap_or(parity),
            rebuild_rate: recorded.as_ref().ok().and_then(|r| r.rebuild_rate),
            scrub_rate: recorded.as_ref().ok().and_then(|r| r.scrub_rate),
        };
        if let (Ok(r), true) = (&recorded, importing) {
            // A recorded spare the array does not hold after this start is
            // dropped from the record. One whose recorded path is gone
            // (moved: a scan's case) counts as kept while as many spares
            // were found as were recorded.
            let kept: Vec<_> = record.spares.iter().filter_map(|p| key(p)).collect();
            let named: Vec<_> = members.iter().filter_map(|p| key(p)).collect();
            let moved_ok = record.spares.len() >= r.spares.len();
            let dropped = r.spares.iter().filter_map(|p| match key(p) {
                Some(k) if kept.contains(&k) => None,
                Some(k) => Some((p, named.contains(&k))),
                None => (!moved_ok).then_some((p, false)),
            });
            for (spare, given) in dropped {
                let (why, back) = if given {
                    // Left out by assembly, which says why.
                    let reason = asm
                        .refused
                        .iter()
                        .find(|(m, _)| key(Path::new(m)) == key(spare))
                        .map_or(String::new(), |(_, why)| format!(": {}", why.reason));
                    (
                        format!("was given to this start, but assembly did not take it back{reason}"),
                        " where it can (it writes the metadata anew, or says what stands in the way)",
                    )
                } else {
                    (
                        "was not among the devices given to this start".to_string(),
                        " (or list it with the members at the next import)",
                    )
                };
                let spare = spare.display();
                notes.push(format!(
                    "spare {spare} of '{name}' {why}, so the array runs without it and it is no longer recorded as its spare: raidctl add {name} {spare} takes it back{back}"
                ));
            }
        }
        // The array's metadata is written already (assembly may have taken
        // members back or recorded missing ones): a record that cannot be
        // written now must not undo the start half-way. It lags, shown by
        // status and written again by the monitor (`record.rs`).
        let lag = match self.state.save(&record) {
            Ok(()) => None,
            Err(e) => {
                tracing::error!(array = %name, "the array's record lags its membership: {e}");
                notes.push(format!(
                    "warning: the array's record could not be written ({e}): the daemon writes it again every quarter second; free space on that filesystem (or make it writable)"
                ));
                Some(e.msg)
            }
        };
        let engine = Arc::new(parity_engine(&record.parity, g));
        array.set_engine(engine.clone());
        let array = Arc::new(array);
        // Background work starts at the rates `raidctl rate` kept in the
        // record (0 there: no limit, on purpose), else the environment's.
        array.set_rates(
            Some(
                record
                    .rebuild_rate
                    .unwrap_or(self.rebuild_opts.rate_limit.unwrap_or(0)),
            ),
            Some(
                record
                    .scrub_rate
                    .unwrap_or(scrub_options(false).rate_limit.unwrap_or(0)),
            ),
        );
        array.record_event(ArrayEvent::ParityEngineChosen {
            engine: engine.name(),
            detail: engine.describe_choice(),
        });
        let weak = Arc::downgrade(&array);
        engine.on_fallback(move |f| {
            // The hook runs on the thread whose parity call met the GPU's
            // failure: a shard, or a writer counted in the array's parity
            // writes in flight. Failing a member holds the array's metadata
            // lock while it waits for those writers, so this must not wait
            // for that lock: the event is logged now where the lock is
            // free, else from a thread of its own.
            let Some(a) = weak.upgrade() else { return };
            let ev = ArrayEvent::ParityEngineFallback {
                from: f.from,
                to: f.to,
                reason: f.reason,
            };
            if let Err(ev) = a.try_record_event(ev) {
                let log = move || a.record_event(ev);
                if let Err(e) = std::thread::Builder::new()
                    .name("event-log".into())
                    .spawn(log)
                {
                    tracing::error!("cannot log the parity engine's fallback: {e}");
                }
            }
        });
        let mut exports = Vec::new();
        if let Some((spec, sec)) = nbd {
            exports.push(crate::export::Export::start_nbd(
                array.clone(),
                &spec,
                &sec,
            )?);
        }
        let served = Arc::new(Served {
            array: array.clone(),
            engine,
            record: Mutex::new(record),
            exports: Mutex::new(exports),
            mount: Mutex::new(None),
            events_seen: std::sync::atomic::AtomicUsize::new(0),
            health: Default::default(),
            health_checked: AtomicBool::new(false),
            deleted_warned: Default::default(),
            record_unsaved: Mutex::new(lag),
            scrub_mark: Mutex::new(()),
            stopping: Mutex::new(()),
            settling: Default::default(),
        });
        // Slots the operator's own member list left empty are theirs to
        // fill: not retried by the daemon as a member whose server was
        // down at the start (that retry is for recorded members).
        self.reconnects.forget_array(name);
        if listed {
            for x in served.array.slots().iter().filter(|x| x.missing_at_start) {
                self.reconnects.hold(name, x.slot);
            }
        }
        self.arrays.lock().insert(name.to_string(), served.clone());
        starting.started();
        // A failed slot with a spare at hand gets it now, as the monitor
        // would at its next look: status, right after, says so rather than
        // offering a re-add the spare is about to make moot.
        if let super::SpareTurn::Took(slot, spare) = self.take_spare(&served) {
            notes.push(format!(
                "spare {spare} took slot {slot}, which had no member in sync, and is being rebuilt"
            ));
        }
        self.kick_rebuild(&served);
        notes.extend(crate::fuse::place::dead_notes(
            &array,
            &self.default_mount_dir(name),
        ));
        if let Some((slot, new)) = self.unfinished_hot_replace(name, &array) {
            let reason = "the daemon ended before the copy was complete (killed, or the host went down): the old member stays; replace again to restart it".to_string();
            notes.push(format!(
                "the hot replace of slot {slot} onto {new} did not end: {reason}"
            ));
            array.record_event(ArrayEvent::HotReplaceFailed { slot, new, reason });
        }
        // A scrub the daemon before never saw end.
        let cut = self.state.scrub_running(name);
        if let Ok(kind) = std::fs::read_to_string(&cut) {
            let _ = std::fs::remove_file(&cut);
            let repair = kind.trim() == "repair";
            notes.push(format!(
                "a scrub{} of '{name}' did not end (the daemon stopped while it ran): raidctl scrub {name}{} checks the whole array again",
                if repair { " with repair" } else { "" },
                if repair { " --repair" } else { "" }
            ));
            array.record_event(ArrayEvent::ScrubCut { repair });
        }
        let mut msg = format!(
            "array '{name}' started: {} {}, {} usable",
            g.level,
            array.state().name(),
            status::human_bytes(g.capacity())
        );
        for e in served.exports.lock().iter() {
            msg.push_str(&format!("\nexport: {}", e.describe()));
        }
        for n in notes {
            msg.push_str(&format!("\nnote: {n}"));
        }
        tracing::info!("{msg}");
        Ok(msg)
    }

    /// Refuses a start whose devices carry another array: none of
    /// `carried` (name, uuid) is array `name`, or, where the state folder
    /// records `name`, none of those so named has its uuid (a different
    /// array of the same name). An empty `carried` says nothing.
    fn same_array(
        &self,
        name: &str,
        recorded: &Result<ArrayRecord>,
        carried: &[(String, String)],
    ) -> Result<()> {
        let named: Vec<_> = carried.iter().filter(|(n, _)| n == name).collect();
        if let (Some((other, _)), true) = (carried.first(), named.is_empty()) {
            return Err(CliError::refused(format!(
                "the members given carry array '{other}', not '{name}': start it as raidctl start {other} --members ..."
            )));
        }
        if let (Ok(r), Some((_, uuid))) = (recorded, named.first()) {
            if !named.iter().any(|(_, u)| *u == r.uuid) {
                return Err(CliError::refused(format!(
                    "the members carry array '{name}' uuid {uuid}, but {} records '{name}' uuid {}: a different array of the same name",
                    self.state.root.display(),
                    r.uuid
                )));
            }
        }
        Ok(())
    }

    /// Stops `name`; `force`: also where that loses its data (`deleted_files`).
    pub(super) fn stop(&self, name: &str, force: bool) -> Result<String> {
        let served = self.served(name)?;
        let _one = served.stopping.lock();
        let still = self
            .arrays
            .lock()
            .get(name)
            .is_some_and(|s| Arc::ptr_eq(s, &served));
        if !still {
            return Err(self.served(name).err().unwrap_or_else(|| {
                CliError::refused(format!(
                    "array '{name}' was stopped by another command meanwhile, and started again since"
                ))
            }));
        }
        let (mut stopped_work, deleted) = self.deleted_files(&served, force)?;
        if served.mount.lock().is_some() {
            // Not flushed here: closing the array flushes, and a failed
            // array must still stop.
            self.unmount_only(name)?;
        } else {
            // A mount a killed daemon left is cleared where it can be, and
            // said where it cannot: it must not outlive the array unsaid.
            for r in crate::fuse::place::clear_dead_of(&served.array) {
                match r {
                    Ok(cleared) => stopped_work.push_str(&format!("; {cleared}")),
                    Err(why) => stopped_work.push_str(&format!("; note: {why}")),
                }
            }
        }
        // Clients still connected are cut: said, since they see only a
        // closed connection.
        let cut: usize = served.exports.lock().drain(..).map(|e| e.stop()).sum();
        if cut > 0 {
            stopped_work.push_str(&format!(
                "; {cut} NBD client connection(s) were cut: requests they had in flight got no reply (as on any disconnect, the client treats them as not done)"
            ));
        }
        // What close() stops (it joins the array's rebuild, hot replace and
        // scrub before it flushes), to be said.
        let hot = served.array.hot_replace_progress().map(|(slot, new, ..)| {
            let old = served
                .array
                .member_of(slot)
                .map(|m| m.identity().to_string());
            (slot, new, old.unwrap_or_else(|| "OLD".into()))
        });
        let rebuild = served
            .array
            .copy_progress()
            .filter(|c| c.kind == raid_core::array::CopyKind::Rebuild);
        let closed = served.array.close();
        // A bitmap settle under way held the array: close waited for its
        // flush; its thread lets the array go just after. Waited for, so
        // that the members' files are closed when the stop returns.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while served.settling.load(Ordering::Acquire) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if let Some((slot, new, old)) = hot {
            stopped_work.push_str(&match deleted.contains(&slot) {
                // Its source's file was deleted: nothing stays.
                true => format!(
                    "; the hot replace of slot {slot} onto {new} was stopped before its copy was complete, and its old member's file is gone with the stop: the slot is missing at the next start (then raidctl replace {name} {old} NEW_DEVICE)"
                ),
                false => format!(
                    "; the hot replace of slot {slot} onto {new} was stopped before its copy was complete: the old member stays (raidctl replace {name} {old} {new} starts it again)"
                ),
            });
        }
        if let Some(c) = rebuild {
            // Where each resumes: the row its metadata saved at the stop (a
            // slot that joined a pass under way is saved at 0 until the
            // pass wraps, and starts again).
            let saved = served.array.slots();
            let rows = served.array.geometry().rows().max(1);
            let each: Vec<String> = std::iter::once(c.slot)
                .chain(c.with)
                .map(|slot| {
                    let row = saved.get(slot).map_or(0, |s| s.rebuild_row);
                    let done = served.array.rebuild_progress(slot).map_or(0, |p| p.0);
                    match row {
                        0 if done > 0 => format!("slot {slot} starts again from 0% (it joined a pass under way; its rows are kept only once the pass has wrapped)"),
                        _ => format!("slot {slot} resumes from {:.1}%", row as f64 * 100.0 / rows as f64),
                    }
                })
                .collect();
            stopped_work.push_str(&format!(
                "; the rebuild pauses, and at the next start {}",
                each.join(", ")
            ));
        }
        {
            let _one = self.events_lock.lock();
            self.process_events_of(&served);
        }
        // A record that lags is tried once more: after this, no one will.
        // Logged too: a stop at shutdown has no one to tell but the log.
        self.save_record_again(&served);
        if let Some(e) = self.record_lag(&served) {
            tracing::error!(array = %name, "stopped with its record lagging its membership: {e}; start it with raidctl start {name} --scan DIR");
            stopped_work.push_str(&format!(
                "; warning: its record could not be written ({e}), so it may name devices that left the array and miss some that joined: once there is room, start it with raidctl start {name} --scan DIR (the folders of its devices), which finds them by their metadata"
            ));
        }
        match closed {
            Ok(()) => {
                self.arrays.lock().remove(name);
                self.name_locks.lock().remove(name);
                // Left dirty where a write failed on a full filesystem (a
                // stripe may be torn) or a resync was put off: said so, as
                // status and examine say it.
                let how = match served.array.left_dirty_because() {
                    None => "flushed, marked clean".to_string(),
                    Some(why) => format!(
                        "flushed; left marked dirty, as {why}: the next start resyncs the regions concerned"
                    ),
                };
                Ok(format!("array '{name}' stopped ({how}){stopped_work}"))
            }
            // A failed array serves nothing: stopping it must still work,
            // so the operator can start it again (with --force).
            Err(e) if served.array.state() == raid_core::array::ArrayState::Failed => {
                served.array.retire();
                self.arrays.lock().remove(name);
                self.name_locks.lock().remove(name);
                Ok(format!(
                    "array '{name}' stopped; it had failed ({e}), so it is not marked clean. Next: bring the lost members back, then raidctl start {name} (or raidctl start {name} --force to take back members marked failed: docs/recovery.md){stopped_work}"
                ))
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Daemon {
    /// Member files deleted while the array ran live on only in its open
    /// files: a stop loses them. Refused (nothing done) where the others
    /// cannot serve every byte without them, unless `force`; otherwise
    /// said, with what the next start will find. Returns what to say and
    /// the slots whose files went.
    fn deleted_files(&self, served: &Served, force: bool) -> Result<(String, Vec<usize>)> {
        let name = served.array.name();
        let deleted = served.array.check_member_files();
        if deleted.is_empty() {
            return Ok((String::new(), Vec::new()));
        }
        let slots: Vec<usize> = deleted.iter().map(|(s, _)| *s).collect();
        let list = deleted
            .iter()
            .map(|(s, m)| format!("{} (slot {s})", m.identity()))
            .collect::<Vec<_>>()
            .join(", ");
        let first = deleted[0].1.identity().to_string();
        // A failed array has no data left to lose by a stop.
        let failed = served.array.state() == raid_core::array::ArrayState::Failed;
        if !failed && !served.array.serves_all_without(&slots) {
            if !force {
                // One being moved already: wait for it, not a second move.
                let how = match served.array.hot_replace_progress() {
                    Some((hot, new, ..)) if slots.contains(&hot) => format!(
                        "The hot replace of slot {hot} moves it onto {new} now: wait for it (raidctl wait {name}), then stop"
                    ),
                    _ => format!(
                        "Move it to a new device first (raidctl replace {name} {first} NEW_DEVICE: a hot replace copies it from the open file), then stop"
                    ),
                };
                return Err(CliError::refused(format!(
                    "stopping '{name}' now would lose its data: the file of {list} was deleted while the array ran and lives on only while it runs, and the other members cannot serve every byte without it. {how}; raidctl stop {name} --force stops anyway and loses it"
                )));
            }
            return Ok((
                format!(
                    "; forced: the file of {list} was deleted while the array ran and is gone with this stop: the array cannot start again without it"
                ),
                slots,
            ));
        }
        Ok((
            format!(
                "; warning: the file of {list} was deleted while the array ran and is gone with this stop: the next start finds it missing and the array degraded (then raidctl replace {name} {first} NEW_DEVICE)"
            ),
            slots,
        ))
    }
}

/// The parity engine for an array: the recorded mode (cpu, gpu, auto), on
/// the array's own stripe shape for `auto`'s measurement. Levels without
/// parity never open a GPU.
fn parity_engine(mode: &str, g: raid_core::layout::Geometry) -> Selection {
    let mode: ParityMode = mode.parse().unwrap_or(ParityMode::Auto);
    let Some(kind) = g.level.parity_kind() else {
        return Selection::no_parity(mode, format!("{} computes no parity", g.level));
    };
    Selection::new(
        mode,
        StripeShape {
            kind,
            data_chunks: g.data_chunks(),
            chunk: g.chunk as usize,
        },
    )
}
