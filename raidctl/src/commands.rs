//! One function per command: argument checks, then raid-core or the daemon.

use crate::config::Config;
use crate::daemon::{describe, parse_size, Daemon, DaemonOptions};
use crate::error::{CliError, Result};
use crate::inspect::{probe, Content};
use crate::protocol::{call, Request, Response};
use crate::registry::{check_name, ArrayRecord, StateDir};
use crate::status::{self, render, ArrayStatus};
use crate::{AlertCmd, Cli, Command, Format, Parity};
use raid_core::array::{Array, CreateOptions};
use raid_core::layout::Level;
use raid_core::member::{DeviceKey, FileMember, Member, MemberRef};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn run(cli: Cli) -> Result<()> {
    let st = StateDir::resolve(cli.state_dir);
    let fmt = cli.format;
    match cli.command {
        Command::Create {
            name,
            level,
            chunk,
            parity,
            spares,
            force,
            sparse,
            members,
        } => create(
            &st,
            &CreateArgs {
                name: &name,
                level,
                chunk: &chunk,
                parity,
                spares: &spares,
                force,
                sparse,
                members: &members,
            },
        ),
        Command::Start {
            name,
            members,
            nbd,
            foreground,
            parity,
            scan,
            force,
        } => {
            let members = match scan {
                Some(dirs) => scan_members(&st, &name, &dirs)?,
                None => members,
            };
            start(&st, &name, members, nbd, foreground, parity, force)
        }
        Command::Stop { name } => {
            let r = daemon_call(&st, &name, Request::Stop { name: name.clone() })?;
            print_message(&r);
            Ok(())
        }
        Command::List => list(&st, fmt),
        Command::Status { name } => show(&st, name.as_deref(), fmt, false),
        Command::Detail { name } => show(&st, Some(&name), fmt, true),
        Command::Fail {
            name,
            member,
            force,
        } => {
            let member = absolute(&member);
            print_message(&daemon_call(
                &st,
                &name,
                Request::Fail {
                    name: name.clone(),
                    member,
                    force,
                },
            )?);
            Ok(())
        }
        Command::Examine { devices } => crate::examine::run(&devices, fmt),
        Command::Rate {
            name,
            rebuild,
            scrub,
        } => {
            let size = |v: Option<String>| -> Result<Option<u64>> {
                v.map(|v| parse_size(&v).map_err(CliError::usage))
                    .transpose()
            };
            print_message(&daemon_call(
                &st,
                &name,
                Request::Rate {
                    name: name.clone(),
                    rebuild: size(rebuild)?,
                    scrub: size(scrub)?,
                },
            )?);
            Ok(())
        }
        Command::Remove { name, member } => {
            let member = absolute(&member);
            print_message(&daemon_call(
                &st,
                &name,
                Request::Remove {
                    name: name.clone(),
                    member,
                },
            )?);
            Ok(())
        }
        Command::Add { name, member } => {
            let member = existing(&member)?;
            print_message(&daemon_call(
                &st,
                &name,
                Request::Add {
                    name: name.clone(),
                    member,
                },
            )?);
            Ok(())
        }
        Command::ReAdd { name, member } => {
            let member = existing(&member)?;
            print_message(&daemon_call(
                &st,
                &name,
                Request::ReAdd {
                    name: name.clone(),
                    member,
                },
            )?);
            Ok(())
        }
        Command::Replace { name, old, new } => {
            let (old, new) = (absolute(&old), existing(&new)?);
            print_message(&daemon_call(
                &st,
                &name,
                Request::Replace {
                    name: name.clone(),
                    old,
                    new,
                },
            )?);
            Ok(())
        }
        Command::Mount {
            name,
            with_loop,
            dir,
        } => {
            let dir = dir.map(|d| absolute(&d));
            print_message(&daemon_call(
                &st,
                &name,
                Request::Mount {
                    name: name.clone(),
                    dir,
                    loop_dev: with_loop,
                },
            )?);
            Ok(())
        }
        Command::Unmount { name } => {
            print_message(&daemon_call(
                &st,
                &name,
                Request::Unmount { name: name.clone() },
            )?);
            Ok(())
        }
        Command::Wait { name, timeout } => wait(&st, &name, timeout),
        Command::Daemon {
            config,
            exit_when_idle,
        } => {
            let c = Config::load(&st, config.as_deref())?;
            Daemon::run(
                st,
                DaemonOptions {
                    exit_when_idle,
                    start: c.starts(),
                    alerts: c.alerts,
                    scrub: c.scrub,
                },
            )
        }
        Command::Events { name } => events(&st, &name, fmt),
        Command::Bench {
            dir,
            members,
            level,
            member_size,
            seconds,
            sweep_seconds,
            json,
            plot,
        } => {
            let member_bytes = parse_size(&member_size).map_err(CliError::usage)?;
            let r = crate::bench::bench(&crate::bench::BenchArgs {
                dir,
                members,
                level,
                member_bytes,
                seconds,
                sweep_seconds,
                json,
                plot,
            })?;
            if fmt == Format::Json {
                print_json(&r);
            } else {
                crate::bench::print(&r);
            }
            Ok(())
        }
        Command::Scrub {
            name,
            repair,
            background,
            cancel,
        } => {
            let r = daemon_call(
                &st,
                &name,
                Request::Scrub {
                    name: name.clone(),
                    repair,
                    background,
                    cancel,
                },
            )?;
            if background || cancel {
                print_message(&r);
                return Ok(());
            }
            let s = r
                .scrub
                .ok_or_else(|| CliError::daemon("the daemon sent no scrub report"))?;
            let unrepaired = s.mismatches.iter().any(|m| !m.repaired);
            if fmt == Format::Json {
                print_json(&s);
            } else {
                out!(
                    "scrub of '{}': {} rows, {} read, {} mismatches{}",
                    s.array,
                    s.rows_checked,
                    status::human_bytes(s.bytes_read),
                    s.mismatches.len(),
                    if s.repair {
                        " (repaired)"
                    } else {
                        " (check only: raidctl scrub --repair fixes them)"
                    }
                );
                for m in &s.mismatches {
                    out!(
                        "  stripe {} slot {} {}: {}",
                        m.stripe,
                        m.slot,
                        m.member.as_deref().unwrap_or("-"),
                        m.what
                    );
                }
            }
            // Mismatches left as they are: scripts and cron must notice.
            if unrepaired {
                return Err(CliError::quiet(crate::error::code::FAILED));
            }
            Ok(())
        }
        Command::Alert {
            what: AlertCmd::Test { config },
        } => alert_test(&st, config.as_deref()),
        Command::Selftest { width, chunk_kib } => {
            crate::selftest::run(width, chunk_kib * 1024).map_err(CliError::failed)
        }
    }
}

fn print_message(r: &Response) {
    if let Some(m) = &r.message {
        out!("{m}");
    }
}

/// An absolute path without requiring it to exist (a vanished member).
fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()))
}

/// A path that must exist, made canonical.
fn existing(p: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(p).map_err(|_| {
        CliError::not_found(format!(
            "no such file or device: {} (for an array on files, create it first: truncate -s 10G {})",
            p.display(),
            p.display()
        ))
    })
}

/// What `create` was asked.
struct CreateArgs<'a> {
    name: &'a str,
    level: u32,
    chunk: &'a str,
    parity: Parity,
    spares: &'a [PathBuf],
    force: bool,
    sparse: bool,
    members: &'a [PathBuf],
}

fn create(st: &StateDir, a: &CreateArgs<'_>) -> Result<()> {
    let (name, force) = (a.name, a.force);
    check_name(name)?;
    let level = Level::from_number(a.level).ok_or_else(|| {
        CliError::usage(format!(
            "RAID level {} is not supported: use 0, 1, 5, 6 or 10",
            a.level
        ))
    })?;
    let chunk = parse_size(a.chunk).map_err(CliError::usage)?;
    if !chunk.is_power_of_two() || !(4096..=1 << 20).contains(&chunk) {
        return Err(CliError::usage(format!(
            "chunk {chunk} bytes is not a power of two between 4K and 1M"
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
        let key = DeviceKey::of_path(p)
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
    for p in members.iter().chain(&spares) {
        let content = probe(p)
            .map_err(|e| CliError::not_found(format!("cannot read {}: {e}", p.display())))?;
        if force {
            continue;
        }
        match content {
            Content::Nothing => {}
            Content::Array { name: other, uuid } => {
                return Err(CliError::refused(format!(
                    "member {} is part of array '{other}' (uuid {uuid}): use --force to overwrite, or raidctl stop {other}",
                    p.display()
                )))
            }
            c => {
                return Err(CliError::refused(format!(
                    "member {} holds {}: use --force to overwrite it",
                    p.display(),
                    describe(&c)
                )))
            }
        }
        if let Some(owner) = st.owner_of(p, Some(name)) {
            return Err(CliError::refused(format!(
                "member {} is recorded as part of array '{}': use --force to overwrite, or raidctl stop {}",
                p.display(),
                owner.name,
                owner.name
            )));
        }
    }
    // Opening takes every member exclusively: one a running array holds is
    // refused here, before anything is written, --force or not.
    let open = |p: &PathBuf| -> Result<FileMember> {
        FileMember::open(p).map_err(|e| match e.kind() {
            std::io::ErrorKind::ResourceBusy => CliError::refused(format!(
                "{e}: nothing was written. A member of a running array is never overwritten, even with --force"
            )),
            _ => CliError::failed(format!("cannot open {}: {e}", p.display())),
        })
    };
    let m: Vec<FileMember> = members.iter().map(open).collect::<Result<_>>()?;
    let s: Vec<FileMember> = spares.iter().map(open).collect::<Result<_>>()?;
    for f in m.iter().chain(&s) {
        // Even sparse, the metadata, bitmap and journal area is allocated:
        // a full filesystem must never stop those writes.
        let r = if a.sparse {
            f.allocate_range(0, raid_core::metadata::DATA_OFFSET)
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
    let m: Vec<MemberRef> = m.into_iter().map(|f| Arc::new(f) as MemberRef).collect();
    let s: Vec<MemberRef> = s.into_iter().map(|f| Arc::new(f) as MemberRef).collect();
    st.ensure()?;
    let array = Array::create(
        m,
        s,
        CreateOptions {
            name: name.into(),
            level,
            chunk,
        },
    )?;
    array.close()?;
    let g = array.geometry();
    st.save(&ArrayRecord {
        name: name.into(),
        uuid: array.uuid().to_string(),
        level: level.number(),
        chunk,
        members: members.clone(),
        spares: spares.clone(),
        parity: a.parity.name().into(),
    })?;
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
    out!("start it with: raidctl start {name}");
    Ok(())
}

/// The names of the arrays the daemon serves now (none without a daemon).
fn running_names(st: &StateDir) -> Result<Vec<String>> {
    Ok(match call(&st.socket(), &Request::Status { name: None })? {
        Some(r) => r
            .into_result()?
            .arrays
            .into_iter()
            .map(|a| a.name)
            .collect(),
        None => vec![],
    })
}

/// Calls the daemon about array `name`; no daemon means it is not running.
fn daemon_call(st: &StateDir, name: &str, req: Request) -> Result<Response> {
    match call(&st.socket(), &req)? {
        Some(r) => r.into_result(),
        None => {
            st.load(name)?;
            Err(CliError::refused(format!(
                "array '{name}' is not running (raidctl start {name})"
            )))
        }
    }
}

fn start(
    st: &StateDir,
    name: &str,
    members: Vec<PathBuf>,
    nbd: Option<String>,
    foreground: bool,
    parity: Option<Parity>,
    force: bool,
) -> Result<()> {
    check_name(name)?;
    let members: Vec<PathBuf> = members.iter().map(|p| existing(p)).collect::<Result<_>>()?;
    if members.is_empty() {
        st.load(name)?;
    }
    let req = Request::Start {
        name: name.into(),
        members,
        nbd,
        parity: parity.map(|p| p.name().to_string()),
        force,
    };
    if foreground {
        let c = Config::load(st, None)?;
        return Daemon::run(
            st.clone(),
            DaemonOptions {
                exit_when_idle: false,
                start: vec![req],
                alerts: c.alerts,
                scrub: c.scrub,
            },
        );
    }
    // A daemon exiting idle just as we connect does not take the request
    // (see protocol::call): start another and ask again.
    for _ in 0..3 {
        ensure_daemon(st)?;
        if let Some(r) = call(&st.socket(), &req)? {
            print_message(&r.into_result()?);
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(CliError::daemon(format!(
        "the daemon at {} went away three times before answering: see {}",
        st.socket().display(),
        st.log().display()
    )))
}

/// The devices and files in `dirs` (default /dev/disk/by-id) that hold
/// metadata of the array: by the recorded uuid, or by name when the array
/// is not recorded. Several paths to one device count once.
fn scan_members(st: &StateDir, name: &str, dirs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let default = [PathBuf::from("/dev/disk/by-id")];
    let dirs = if dirs.is_empty() { &default[..] } else { dirs };
    let uuid = st.load(name).ok().map(|r| r.uuid);
    let mut seen = std::collections::HashSet::new();
    let mut found = Vec::new();
    for d in dirs {
        let entries = std::fs::read_dir(d)
            .map_err(|e| CliError::not_found(format!("cannot list {}: {e}", d.display())))?;
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            let e = crate::examine::examine(&p);
            let ours = match &uuid {
                Some(u) => e.array_uuid.as_deref() == Some(u.as_str()),
                None => e.array.as_deref() == Some(name),
            };
            if !ours {
                continue;
            }
            let Ok(key) = DeviceKey::of_path(&p) else {
                continue;
            };
            if seen.insert(key) {
                found.push(std::fs::canonicalize(&p).unwrap_or(p));
            }
        }
    }
    if found.is_empty() {
        return Err(CliError::not_found(format!(
            "no member of '{name}' found in {} (raidctl examine DEV shows what a device holds)",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    for p in &found {
        tracing::info!(array = name, member = %p.display(), "found by scan");
    }
    Ok(found)
}

/// Starts a background daemon for this state directory if none answers.
fn ensure_daemon(st: &StateDir) -> Result<()> {
    if call(&st.socket(), &Request::Ping)?.is_some() {
        return Ok(());
    }
    st.ensure()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(st.log())
        .map_err(|e| CliError::failed(format!("cannot open {}: {e}", st.log().display())))?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::failed(format!("cannot find raidctl itself: {e}")))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--state-dir")
        .arg(&st.root)
        .arg("daemon")
        .arg("--exit-when-idle")
        .stdin(std::process::Stdio::null())
        .stdout(
            log.try_clone()
                .map_err(|e| CliError::failed(e.to_string()))?,
        )
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from the
    // caller's session so it outlives the terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| CliError::failed(format!("cannot start the daemon: {e}")))?;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if call(&st.socket(), &Request::Ping)?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(CliError::daemon(format!(
        "the daemon did not come up; see {}",
        st.log().display()
    )))
}

/// Every known array's status: running ones from the daemon, the rest from disk.
fn statuses(st: &StateDir) -> Result<Vec<ArrayStatus>> {
    let running = match call(&st.socket(), &Request::Status { name: None })? {
        Some(r) => r.into_result()?.arrays,
        None => vec![],
    };
    let mut out = running.clone();
    for r in st.list() {
        if !running.iter().any(|s| s.name == r.name) {
            out.push(status::of_stopped(&r));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn print_json<T: serde::Serialize>(v: &T) {
    out!(
        "{}",
        serde_json::to_string_pretty(v).expect("status serialises")
    );
}

fn list(st: &StateDir, fmt: Format) -> Result<()> {
    let all = statuses(st)?;
    if fmt == Format::Json {
        print_json(&all);
        return Ok(());
    }
    if all.is_empty() {
        out!("no arrays recorded in {}", st.root.display());
    }
    for s in &all {
        let state = if s.running {
            s.state.clone()
        } else {
            format!("stopped ({})", s.health)
        };
        out!(
            "{:<16} {:<7} {:<22} {:>10} {} members",
            s.name,
            s.level,
            state,
            status::human_bytes(s.capacity_bytes),
            s.members.len()
        );
    }
    Ok(())
}

fn show(st: &StateDir, name: Option<&str>, fmt: Format, detail: bool) -> Result<()> {
    if let Some(n) = name {
        st.load(n)?;
    }
    let all: Vec<ArrayStatus> = statuses(st)?
        .into_iter()
        .filter(|s| name.is_none_or(|n| s.name == n))
        .collect();
    match (fmt, name) {
        (Format::Json, Some(_)) => print_json(&all[0]),
        (Format::Json, None) => print_json(&all),
        (Format::Text, _) => {
            if all.is_empty() {
                out!("no arrays recorded in {}", st.root.display());
            }
            for s in &all {
                print!("{}", render(s, detail));
            }
        }
    }
    // `status` says the health in its exit status too (cron, monitoring
    // scripts): 0 optimal, 1 degraded or rebuilding, 2 failed; the worst
    // array decides.
    let worst = all.iter().map(|s| s.exit_code()).max().unwrap_or(0);
    if !detail && worst > 0 {
        return Err(CliError::quiet(worst));
    }
    Ok(())
}

/// Waits until no rebuild is pending or running, then says how the array
/// ended: 0 optimal; 1 degraded (nothing to rebuild onto), failed, or a
/// rebuild that cannot run.
fn wait(st: &StateDir, name: &str, timeout: u64) -> Result<()> {
    let t = Instant::now();
    let mut last = -1.0;
    loop {
        let r = daemon_call(
            st,
            name,
            Request::Status {
                name: Some(name.into()),
            },
        )?;
        let s = r
            .arrays
            .into_iter()
            .next()
            .ok_or_else(|| CliError::not_found(format!("array '{name}' is not running")))?;
        if let Some(rb) = &s.rebuild {
            if rb.percent - last >= 10.0 {
                out!("{name}: rebuilding slot {} {:.0}%", rb.slot, rb.percent);
                last = rb.percent;
            }
        }
        if let Some(h) = &s.hot_replace {
            if h.percent - last >= 10.0 {
                out!("{name}: replacing slot {} {:.0}%", h.slot, h.percent);
                last = h.percent;
            }
        }
        match s.state.as_str() {
            _ if s.hot_replace.is_some() => {}
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
            // taken by the monitor is worth waiting for, nothing else is.
            "degraded" if s.spares.is_empty() => {
                let failed: Vec<String> = s
                    .members
                    .iter()
                    .filter(|m| m.state != "active")
                    .map(|m| m.path.clone().unwrap_or_else(|| format!("slot {}", m.slot)))
                    .collect();
                return Err(CliError::failed(format!(
                    "array '{name}' is degraded and no rebuild is pending ({} down): raidctl replace {name} OLD NEW",
                    failed.join(", ")
                )));
            }
            _ => {}
        }
        if t.elapsed() > Duration::from_secs(timeout) {
            return Err(CliError::failed(format!(
                "array '{name}' is still {} after {timeout} s",
                s.state
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn events(st: &StateDir, name: &str, fmt: Format) -> Result<()> {
    st.load(name)?;
    let all = crate::eventlog::read(st, name);
    if fmt == Format::Json {
        print_json(&all);
        return Ok(());
    }
    if all.is_empty() {
        out!("no events recorded for '{name}'");
    }
    for e in all {
        print!("{} {:<8} {:<17} {}", e.time, e.severity, e.event, e.message);
        if let Some(n) = &e.next {
            print!("  (next: {n})");
        }
        out!();
    }
    Ok(())
}

fn alert_test(st: &StateDir, config: Option<&Path>) -> Result<()> {
    let c = Config::load(st, config)?;
    let a = c.alerts.ok_or_else(|| {
        CliError::not_found(format!(
            "no [alerts] section in {}: see docs/alerts.md",
            config.map(|p| p.display().to_string()).unwrap_or_else(|| st
                .root
                .join("raidctl.toml")
                .display()
                .to_string())
        ))
    })?;
    let r = crate::eventlog::record_for_test();
    let (subject, body) = crate::alerts::compose(&[r]);
    let answer = a.send(&subject, &body)?;
    out!(
        "test message sent to {}: server answered {answer}",
        a.to.join(", ")
    );
    Ok(())
}
