//! `raidctl create`: checks (names, sizes, each device once by identity,
//! nothing in use or holding data unless forced, never a running array's
//! members or name), allocation, metadata, the record.

use super::*;

/// What `create` was asked.
pub(super) struct CreateArgs<'a> {
    pub name: &'a str,
    pub level: u32,
    pub chunk: &'a str,
    pub parity: Parity,
    pub spares: &'a [PathBuf],
    pub force: bool,
    pub sparse: bool,
    pub members: &'a [PathBuf],
}

pub(super) fn create(st: &StateDir, a: &CreateArgs<'_>) -> Result<()> {
    let (name, force) = (a.name, a.force);
    check_name(name)?;
    // Valid for an array that has it already (start takes it after --),
    // but a new one would need -- before its name in every command, and
    // the commands its events suggest would not work as printed.
    if name.starts_with('-') {
        return Err(CliError::usage(format!(
            "array name '{name}' starts with '-': every command would read it as an option. Choose a name that starts with a letter or digit"
        )));
    }
    let level = Level::from_number(a.level).ok_or_else(|| {
        CliError::usage(format!(
            "RAID level {} is not supported: use 0, 1, 5, 6 or 10",
            a.level
        ))
    })?;
    let chunk = parse_size(a.chunk).map_err(CliError::usage)?;
    if !chunk.is_power_of_two() {
        return Err(CliError::usage(format!(
            "chunk {chunk} bytes is not a power of two: use one from 4K to 1M (64K is usual)"
        )));
    }
    if !(4096..=1 << 20).contains(&chunk) {
        return Err(CliError::usage(format!(
            "chunk {chunk} bytes is outside 4K to 1M: use one in that range (64K is usual)"
        )));
    }
    if st.exists(name) && !force {
        return Err(CliError::refused(format!(
            "an array named '{name}' is already recorded in {}: choose another name (or --force to replace the record of a stopped array)",
            st.root.display()
        )));
    }
    // --force replaces a record and overwrites members, but never those of
    // an array that is running: it would write under a live array.
    if running_names(st)?.iter().any(|n| n == name) {
        return Err(CliError::refused(format!(
            "array '{name}' is running: --force does not replace a running array. Stop it first (raidctl stop {name})"
        )));
    }
    if a.members.len() < level.min_members() {
        return Err(CliError::usage(format!(
            "{level} needs at least {} members, {} given",
            level.min_members(),
            a.members.len()
        )));
    }
    let members: Vec<PathBuf> = a
        .members
        .iter()
        .map(|p| existing(p))
        .collect::<Result<_>>()?;
    let spares: Vec<PathBuf> = a
        .spares
        .iter()
        .map(|p| existing(p))
        .collect::<Result<_>>()?;
    // Each device once, by identity: a hard link or a second path to a
    // device is the same member.
    let mut seen: std::collections::HashMap<DeviceKey, &PathBuf> = Default::default();
    for p in members.iter().chain(&spares) {
        let key = crate::remote::key_of(p)
            .map_err(|e| CliError::not_found(format!("cannot read {}: {e}", p.display())))?;
        if let Some(first) = seen.insert(key, p) {
            return Err(CliError::refused(if first == p {
                format!("{} is listed twice: list each device once", p.display())
            } else {
                format!(
                    "{} and {} are the same device ({key}: a hard link or another path to it): list each device once",
                    first.display(),
                    p.display()
                )
            }));
        }
    }
    // What --force overwrites, said after it is done.
    let mut overwritten = Vec::new();
    let taken: Vec<DeviceKey> = seen.keys().copied().collect();
    for p in members.iter().chain(&spares) {
        let content = probe(p)
            .map_err(|e| CliError::not_found(format!("cannot read {}: {e}", p.display())))?;
        let Some(h) = Held::of(st, p, name, content) else {
            continue;
        };
        if !force {
            return Err(CliError::refused(h.refusal(p)));
        }
        overwritten.push(h.overwritten(p, name, st, &taken));
    }
    // Opening takes every member exclusively: one a running array holds is
    // refused here, before anything is written, --force or not.
    // Every member is opened (exclusively) before any is allocated.
    let open = |p: &PathBuf| -> Result<(MemberRef, Option<Arc<FileMember>>)> {
        if crate::remote::is_remote(p) {
            // The export's own space: nothing to allocate from here.
            let m = crate::remote::open_member(p)
                .map_err(|e| CliError::failed(format!("cannot open {}: {e}", p.display())))?;
            return Ok((m, None));
        }
        let f = Arc::new(FileMember::open(p).map_err(|e| match e.kind() {
            std::io::ErrorKind::ResourceBusy => CliError::refused(format!(
                "{e}: nothing was written. A member of a running array is never overwritten, even with --force"
            )),
            _ => CliError::failed(format!("cannot open {}: {e}", p.display())),
        })?);
        Ok((f.clone(), Some(f)))
    };
    let (m, m_files): (Vec<MemberRef>, Vec<_>) = members
        .iter()
        .map(open)
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let (s, s_files): (Vec<MemberRef>, Vec<_>) = spares
        .iter()
        .map(open)
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let opts = CreateOptions {
        name: name.into(),
        level,
        chunk,
        data_offset: None,
    };
    // Sizes and the rest checked before a file is allocated: refused
    // input leaves the devices as they were.
    let plan = Array::check_create(&m, &s, &opts)?;
    // One export by two URIs: found by writing through one name and
    // reading through the other (put back), before anything is allocated.
    Array::check_distinct_devices(&m.iter().chain(&s).cloned().collect::<Vec<_>>())?;
    // Until the array is made, an interrupt says what it left.
    let _said = SayIfInterrupted::arm();
    st.ensure()?;
    // The record must be writable before any device is written (or
    // allocated): else the devices would carry an array no record names.
    st.check_writable().map_err(|e| {
        CliError::failed(format!(
            "nothing written: {e}. Free space on that filesystem (or make it writable), then create again"
        ))
    })?;
    for f in m_files.iter().chain(&s_files).flatten() {
        // Even sparse, the metadata, bitmap and journal area is allocated:
        // a full filesystem must never stop those writes.
        let r = if a.sparse {
            f.allocate_range(0, plan.data_offset)
        } else {
            f.allocate()
        };
        r.map_err(|e| {
            CliError::failed(format!(
                "cannot allocate {}: {e}. Free space, or create with --sparse to leave member files sparse",
                f.identity()
            ))
        })?;
    }
    // The array holds the members from here: the allocation's handles go.
    drop((m_files, s_files));
    let uneven = uneven_sizes(&m);
    // The spares as the array names them, to record only those it kept.
    let spare_ids: Vec<String> = s.iter().map(|m| m.identity().to_string()).collect();
    let array = {
        let line = ProgressLine::new(std::io::IsTerminal::is_terminal(&std::io::stderr()));
        // From here the devices are written: their metadata first.
        WRITING.store(true, std::sync::atomic::Ordering::SeqCst);
        let r = Array::create_with_progress(m, s, opts, &|done, total| line.draw(done, total));
        line.clear();
        r?
    };
    array.close()?;
    // A spare that could not be written as the array was closed is
    // dropped by it (a spare_dropped event): the record must not name it,
    // or a start would offer it again as a spare. (One that fails the
    // create's own writes fails the create.)
    let kept = array.spares();
    let (mut held, mut dropped) = (Vec::new(), Vec::new());
    for (p, id) in spares.into_iter().zip(&spare_ids) {
        match kept.contains(id) {
            true => held.push(p),
            false => dropped.push(p),
        }
    }
    let spares = held;
    let g = array.geometry();
    st.save(&ArrayRecord {
        name: name.into(),
        uuid: array.uuid().to_string(),
        level: level.number(),
        chunk,
        members: members.clone(),
        spares: spares.clone(),
        parity: a.parity.name().into(),
        rebuild_rate: None,
        scrub_rate: None,
    })
    .map_err(|e| {
        CliError::failed(format!(
            "the array is created on its devices, but its record could not be written ({e}): once there is room, raidctl start {name} --members {} records it",
            members.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" ")
        ))
    })?;
    // A log left under this name is another array's (one --force replaced,
    // or one deleted by hand): its events must not read as this one's.
    let log = crate::eventlog::path(st, name);
    if log.exists() {
        if let Err(e) = std::fs::remove_file(&log) {
            tracing::warn!("cannot remove the old event log {}: {e}", log.display());
        }
    }
    st.remove_scrub_marks(name);
    let parity = a.parity;
    out!(
        "created {level} '{name}': {} members, chunk {}, capacity {}, parity engine {}{}",
        members.len(),
        status::human_bytes(chunk),
        status::human_bytes(g.capacity()),
        parity.name(),
        if level.parity_kind().is_some() {
            " (opened when the array starts)"
        } else {
            " (unused: this level has no parity)"
        }
    );
    for (i, p) in members.iter().enumerate() {
        out!("  slot {i}: {}", p.display());
    }
    for p in &spares {
        out!("  spare: {}", p.display());
    }
    for p in &dropped {
        out!(
            "warning: spare {} could not be written and is not a spare of {name}: check the device, then raidctl add {name} {}",
            p.display(),
            p.display()
        );
    }
    if let Some(note) = uneven {
        out!("note: {note}");
    }
    for o in &overwritten {
        out!("note: --force overwrote {o}");
    }
    out!("start it with: raidctl start {name}");
    Ok(())
}

/// What a device named for the new array already holds, where it holds
/// anything: refused without --force, said after it with.
enum Held {
    /// Another array's metadata.
    Array { name: String, uuid: String },
    /// Nothing of ours, but another array's record lists it.
    Recorded(String),
    /// Something else: a filesystem, a partition table.
    Other(String),
}

/// What --force does to a device of another array.
const FORCE_OVERWRITES: &str = "--force overwrites it, and with it that array's data on this device (a running array's members are never overwritten: raidctl list shows what runs)";

impl Held {
    fn of(st: &StateDir, p: &Path, creating: &str, content: Content) -> Option<Held> {
        match content {
            Content::Nothing => st
                .owner_of(p, Some(creating))
                .map(|r| Held::Recorded(r.name)),
            Content::Array { name, uuid } => Some(Held::Array { name, uuid }),
            c => Some(Held::Other(describe(&c))),
        }
    }

    fn refusal(&self, p: &Path) -> String {
        let p = p.display();
        match self {
            Held::Array { name, uuid } => {
                format!("member {p} is part of array '{name}' (uuid {uuid}): {FORCE_OVERWRITES}")
            }
            Held::Recorded(name) => {
                format!("member {p} is recorded as part of array '{name}': {FORCE_OVERWRITES}")
            }
            Held::Other(what) => format!("member {p} holds {what}: use --force to overwrite it"),
        }
    }

    fn overwritten(
        &self,
        p: &Path,
        creating: &str,
        st: &StateDir,
        // Every device this create takes (by identity).
        taken: &[DeviceKey],
    ) -> String {
        let p = p.display();
        match self {
            Held::Array { name, uuid } => format!(
                "{p} held array '{name}' (uuid {uuid}): that array has lost this device{}",
                run_without(name, creating, st, taken)
            ),
            Held::Recorded(name) => format!(
                "{p} was recorded as part of array '{name}': that array has lost this device{}",
                run_without(name, creating, st, taken)
            ),
            Held::Other(what) => format!("{p} held {what}"),
        }
    }
}

/// How array `other`, which lost a device to `--force`, runs on without
/// it (nothing where it is the array being created again); where this
/// create took every device it has left, how to forget it.
fn run_without(other: &str, creating: &str, st: &StateDir, taken: &[DeviceKey]) -> String {
    if other == creating {
        return String::new();
    }
    let left = st.load(other).ok().map(|r| {
        r.members
            .iter()
            .chain(&r.spares)
            .filter_map(|d| DeviceKey::of_path(d).ok())
            .filter(|k| !taken.contains(k))
            .count()
    });
    if left == Some(0) {
        return format!(
            " ('{other}' has no device left: raidctl delete {other} forgets it, so that it is no longer listed as failed)"
        );
    }
    format!(
        " (a plain start of '{other}' now refuses; raidctl start {other} --force --members <its other devices> runs it degraded, where its level allows)"
    )
}

/// Members of different sizes: every member is used up to the smallest's
/// size, so the rest of the larger ones holds nothing. Said (as mdadm
/// does) where it is more than 1% of the largest.
fn uneven_sizes(members: &[MemberRef]) -> Option<String> {
    let sizes = members.iter().map(|m| m.size());
    let (min, max) = (sizes.clone().min()?, sizes.max()?);
    ((max - min) * 100 > max).then(|| {
        format!(
            "the members differ in size (smallest {}, largest {}): each is used up to the smallest's size, so {} of the largest holds nothing",
            status::human_bytes(min),
            status::human_bytes(max),
            status::human_bytes(max - min)
        )
    })
}

/// The zeroing's progress on one line of stderr, where stderr is a
/// terminal: drawn from half a second on, at most twice a second, cleared
/// at the end. Without a terminal (a script, cron) nothing is drawn.
struct ProgressLine {
    shown: bool,
    began: std::time::Instant,
    last: std::sync::Mutex<Option<std::time::Instant>>,
}

impl ProgressLine {
    fn new(shown: bool) -> ProgressLine {
        ProgressLine {
            shown,
            began: std::time::Instant::now(),
            last: std::sync::Mutex::new(None),
        }
    }

    fn draw(&self, done: u64, total: u64) {
        let now = std::time::Instant::now();
        if !self.shown || now - self.began < std::time::Duration::from_millis(500) || total == 0 {
            return;
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|l| now - l < std::time::Duration::from_millis(500)) {
            return;
        }
        *last = Some(now);
        eprint!(
            "\r\x1b[Kzeroing the members' data areas: {:.0}% ({} of {})",
            done as f64 * 100.0 / total as f64,
            status::human_bytes(done),
            status::human_bytes(total)
        );
    }

    fn clear(&self) {
        if self
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            eprint!("\r\x1b[K");
        }
    }
}

/// While the devices are written (their metadata erased first, then their
/// data areas zeroed: minutes on large drives), Ctrl-C (or a SIGTERM)
/// says what it left before the process ends: nothing created, and the
/// devices no longer hold what they held. It said nothing.
struct SayIfInterrupted {
    before: [libc::sighandler_t; 2],
}

const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// Whether the devices are being written (`interrupted`'s message).
static WRITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn interrupted(sig: libc::c_int) {
    const ERASED: &[u8] = b"\nraidctl: create interrupted: nothing was created, and the devices no longer hold what they held (their metadata is erased first): run create again\n";
    const BEFORE: &[u8] =
        b"\nraidctl: create interrupted before it wrote the devices: nothing was created\n";
    let msg = match WRITING.load(std::sync::atomic::Ordering::SeqCst) {
        true => ERASED,
        false => BEFORE,
    };
    // SAFETY: an atomic load, write(2) and _exit(2) are async-signal-safe;
    // `msg` is a static buffer of that length.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(128 + sig);
    }
}

impl SayIfInterrupted {
    fn arm() -> SayIfInterrupted {
        let handler = interrupted as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: installs a handler that only calls async-signal-safe
        // functions; the handlers before are put back on drop.
        let before = SIGNALS.map(|sig| unsafe {
            let b = libc::signal(sig, handler);
            // A signal the caller ignores (a background job's SIGINT, nohup)
            // stays ignored.
            if b == libc::SIG_IGN {
                libc::signal(sig, libc::SIG_IGN);
            }
            b
        });
        SayIfInterrupted { before }
    }
}

impl Drop for SayIfInterrupted {
    fn drop(&mut self) {
        for (sig, h) in SIGNALS.iter().zip(self.before) {
            // SAFETY: puts back the handler that was there before `arm`.
            unsafe { libc::signal(*sig, h) };
        }
    }
}
