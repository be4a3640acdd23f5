//! One function per command: argument checks, then raid-core or the daemon.

mod alert;
mod create;
mod delete;
mod iostat;
mod scrub;
mod start;
mod wait;

use create::{create, CreateArgs};
use delete::delete;
use scrub::scrub;
use start::{scan_members, start};
use wait::wait;

use crate::config::Config;
use crate::daemon::{describe, parse_size, Daemon};
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
use std::sync::atomic::{AtomicBool, Ordering};
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
            tls,
            tls_verify_peer,
            insecure,
            foreground,
            parity,
            scan,
            force,
        } => {
            let listed = scan.is_none() && !members.is_empty();
            let members = match scan {
                Some(dirs) => scan_members(&st, &name, &dirs)?,
                None => members,
            };
            let nbd = nbd.map(|spec| {
                (
                    spec,
                    crate::export::Security {
                        tls: tls.map(|d| std::path::absolute(&d).unwrap_or(d)),
                        verify_peer: tls_verify_peer,
                        insecure,
                    },
                )
            });
            let how = start::How { force, listed };
            start(&st, &name, members, nbd, foreground, parity, how)
        }
        Command::Stop { name, force } => {
            let req = Request::Stop {
                name: name.clone(),
                force,
            };
            match daemon_call(&st, &name, req) {
                Ok(r) => print_message(&r),
                Err(e) => clear_left_mounts(&st, &name, e)?,
            }
            Ok(())
        }
        Command::Delete { name, wipe, force } => delete(&st, &name, wipe, force),
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
            // A record keeps it as a TOML integer (at most 2^63 - 1).
            let size = |v: Option<String>| -> Result<Option<u64>> {
                v.map(|v| match parse_size(&v).map_err(CliError::usage)? {
                    r if r > i64::MAX as u64 => Err(CliError::usage(format!(
                        "rate {v} is beyond any device (at most 8388607T): give a rate in bytes per second such as 200M, or 0 for no limit"
                    ))),
                    r => Ok(r),
                })
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
            let member = existing_member(&member, &name)?;
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
            match daemon_call(&st, &name, Request::Unmount { name: name.clone() }) {
                Ok(r) => print_message(&r),
                Err(e) => clear_left_mounts(&st, &name, e)?,
            }
            Ok(())
        }
        Command::Wait { name, timeout } => wait(&st, &name, timeout),
        Command::Daemon {
            config,
            exit_when_idle,
            metrics,
        } => {
            let c = Config::load(&st, config.as_deref())?;
            let metrics = metrics
                .as_deref()
                .map(crate::metrics::parse_listen)
                .transpose()?;
            let start = c.starts(&st);
            Daemon::run(
                st,
                c.daemon_options(config.as_deref(), exit_when_idle, start, metrics),
            )
        }
        Command::Events { name } => events(&st, &name, fmt),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "raidctl", &mut buf);
            out!("{}", String::from_utf8_lossy(&buf).trim_end());
            Ok(())
        }
        Command::Manpages { dir } => manpages(&dir),
        Command::Health { devices } => health(&st, &devices, fmt),
        Command::Iostat {
            name,
            interval,
            count,
        } => {
            // `raidctl iostat 2` means every array, every 2 s (as iostat
            // reads it), unless an array is named "2".
            let (name, interval, count) = match (name, interval) {
                (Some(n), i) if n.parse::<f64>().is_ok() && st.load(&n).is_err() => {
                    (None, n.parse().ok(), i.map(|c| c as u64))
                }
                (n, i) => (n, i, count),
            };
            let count = count.or(interval.is_none().then_some(1));
            iostat::iostat(&st, name.as_deref(), interval.unwrap_or(1.0), count, fmt)
        }
        Command::Bench {
            dir,
            members,
            level,
            member_size,
            seconds,
            sweep_seconds,
            drives,
            json,
            plot,
            throughput_plot,
            replot,
        } => {
            let member_bytes = parse_size(&member_size).map_err(CliError::usage)?;
            let args = crate::bench::BenchArgs {
                dir,
                members,
                level,
                member_bytes,
                seconds,
                sweep_seconds,
                simulated: drives == "simulated",
                json,
                plot,
                throughput_plot,
            };
            let r = match &replot {
                Some(j) => crate::bench::replot(j, &args)?,
                None => crate::bench::bench(&args)?,
            };
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
        } => scrub(&st, &name, (repair, background, cancel), fmt),
        Command::Alert {
            what: AlertCmd::Test { config },
        } => alert::test(&st, config.as_deref(), fmt),
        Command::Selftest { width, chunk_kib } => {
            crate::selftest::run(width, chunk_kib * 1024, fmt == Format::Json)
                .map_err(CliError::failed)
        }
    }
}

fn print_message(r: &Response) {
    if let Some(m) = &r.message {
        out!("{m}");
    }
}

/// An absolute path without requiring it to exist (a vanished member); a
/// network member's URI as given.
fn absolute(p: &Path) -> PathBuf {
    if crate::remote::is_remote(p) {
        return p.to_path_buf();
    }
    std::fs::canonicalize(p)
        .unwrap_or_else(|_| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()))
}

/// A path that must exist and name a device the array had (a re-add, a
/// start's members), made canonical: where it does not, creating it is no
/// answer.
pub(crate) fn existing_member(p: &Path, name: &str) -> Result<PathBuf> {
    existing_or(p, || {
        format!("raidctl status {name} names the devices the array had; raidctl examine DEV says what a device holds")
    })
}

/// A path that must exist, made canonical.
fn existing(p: &Path) -> Result<PathBuf> {
    existing_or(p, || {
        format!(
            "for an array on files, create it first: truncate -s 10G {}",
            p.display()
        )
    })
}

/// `existing`, where a path that does not exist is said with `hint`: what
/// to do about it.
fn existing_or(p: &Path, hint: impl FnOnce() -> String) -> Result<PathBuf> {
    // A network member is named by its URI, checked when it is opened.
    if crate::remote::is_remote(p) {
        return Ok(p.to_path_buf());
    }
    let full = std::fs::canonicalize(p).map_err(|_| {
        CliError::not_found(format!(
            "no such file or device: {} ({})",
            p.display(),
            hint()
        ))
    })?;
    if full.is_dir() {
        return Err(CliError::usage(format!(
            "{} is a folder: name a block device, or a file in it (truncate -s 10G {}/member0.img makes one)",
            p.display(),
            p.display()
        )));
    }
    Ok(full)
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

/// `raidctl health DEV...`: each device's health, with the thresholds of
/// the config's `[health]` (the daemon's), exit 1 when one warns.
fn health(st: &StateDir, devices: &[PathBuf], fmt: Format) -> Result<()> {
    use crate::health::Probe;
    let thresholds = Config::load(st, None)?
        .health
        .unwrap_or_default()
        .thresholds();
    let mut report = Vec::new();
    let mut warned = false;
    for d in devices {
        let (health, note) = match crate::health::probe(d) {
            Probe::Drive(h) => (Some(h), None),
            Probe::NotADrive => (
                None,
                Some(
                    "not a drive (a file, loop, RAM or virtual device): no health to read"
                        .to_string(),
                ),
            ),
            Probe::NoTool(t) => (None, Some(format!("cannot read its health: {t}"))),
            Probe::Failed(e) => (None, Some(format!("cannot read its health: {e}"))),
        };
        let warnings = health
            .as_ref()
            .map(|h| crate::health::warnings(h, &thresholds))
            .unwrap_or_default();
        warned |= !warnings.is_empty();
        report.push(serde_json::json!({
            "device": d.display().to_string(),
            "health": health,
            "warnings": warnings,
            "note": note,
        }));
        if fmt == Format::Text {
            match (health, note) {
                (Some(h), _) => {
                    let text = status::render_health(&h, &warnings);
                    out!("{}:\n{}", d.display(), text.trim_end());
                }
                (None, Some(n)) => out!("{}: {n}", d.display()),
                (None, None) => {}
            }
        }
    }
    if fmt == Format::Json {
        print_json(&report);
    }
    if warned {
        return Err(CliError::quiet(1));
    }
    Ok(())
}

/// Writes raidctl.1 and raidctl-COMMAND.1 for each command into `dir`.
fn manpages(dir: &std::path::Path) -> Result<()> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::failed(format!("cannot create {}: {e}", dir.display())))?;
    let cmd = Cli::command();
    let write = |name: &str, c: clap::Command| -> Result<()> {
        let p = dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(c)
            .render(&mut buf)
            .map_err(|e| CliError::failed(format!("rendering {name}: {e}")))?;
        std::fs::write(&p, buf)
            .map_err(|e| CliError::failed(format!("cannot write {}: {e}", p.display())))
    };
    write("raidctl", cmd.clone())?;
    let mut n = 1;
    for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
        let name = format!("raidctl-{}", sub.get_name());
        let bin = format!("raidctl {}", sub.get_name());
        write(&name, sub.clone().name(name.clone()).bin_name(bin))?;
        n += 1;
    }
    out!("{n} man pages written to {}", dir.display());
    Ok(())
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

/// `stop` or `unmount` of an array that is not running, refused with `e`:
/// the mounts its daemon left when it was killed (a FUSE mount nothing
/// serves, its loop device) are cleared and said, since no daemon will;
/// without any, `e` stands.
fn clear_left_mounts(st: &StateDir, name: &str, e: CliError) -> Result<()> {
    let Ok(record) = st.load(name) else {
        return Err(e);
    };
    if running_names(st)?.iter().any(|n| n == name) {
        return Err(e);
    }
    let source = crate::fuse::place::source_for(name, &record.uuid);
    let cleared = crate::fuse::place::clear_dead_from(&source);
    if cleared.is_empty() {
        return Err(e);
    }
    let mut failed = Vec::new();
    for r in cleared {
        match r {
            Ok(m) => out!("{m}"),
            Err(why) => failed.push(why),
        }
    }
    if !failed.is_empty() {
        return Err(CliError::refused(failed.join("\n")));
    }
    out!("array '{name}' is not running (raidctl start {name})");
    Ok(())
}

/// Every known array's status: running ones from the daemon, the rest from
/// disk; and the records that cannot be read, said on stderr (an array
/// left out without a word reads as one that does not exist).
fn statuses(st: &StateDir) -> Result<(Vec<ArrayStatus>, bool)> {
    let running = match call(&st.socket(), &Request::Status { name: None })? {
        Some(r) => r.into_result()?.arrays,
        None => vec![],
    };
    let mut out = running.clone();
    // A stopped array's network members are read here, in the command: one
    // that does not answer is given up after a few seconds (see examine).
    crate::remote::set_timeout(std::time::Duration::from_secs(3));
    let (records, bad) = st.list_all();
    for r in records {
        if !running.iter().any(|s| s.name == r.name) {
            out.push(status::of_stopped(&r));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    for why in &bad {
        eprintln!("raidctl: warning: {why}");
    }
    Ok((out, !bad.is_empty()))
}

fn print_json<T: serde::Serialize>(v: &T) {
    out!(
        "{}",
        serde_json::to_string_pretty(v).expect("status serialises")
    );
}

fn list(st: &StateDir, fmt: Format) -> Result<()> {
    let (all, bad) = statuses(st)?;
    if fmt == Format::Json {
        print_json(&all);
        return bad_records(bad);
    }
    if all.is_empty() {
        out!("no arrays recorded in {}", st.root.display());
    }
    for s in &all {
        let state = status::state_line(s);
        out!(
            "{:<16} {:<7} {:<22} {:>10} {} members",
            s.name,
            s.level,
            state,
            status::human_bytes(s.capacity_bytes),
            s.members.len()
        );
    }
    bad_records(bad)
}

/// `list`'s and `status`'s exit status where a record could not be read
/// (said on stderr by `statuses`): 1, as for an array that needs a look.
fn bad_records(bad: bool) -> Result<()> {
    match bad {
        true => Err(CliError::quiet(1)),
        false => Ok(()),
    }
}

fn show(st: &StateDir, name: Option<&str>, fmt: Format, detail: bool) -> Result<()> {
    if let Some(n) = name {
        st.load(n)?;
    }
    let (all, bad) = statuses(st)?;
    let bad = bad && name.is_none();
    let all: Vec<ArrayStatus> = all
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
    let worst = all
        .iter()
        .map(|s| s.exit_code())
        .chain(bad.then_some(1))
        .max()
        .unwrap_or(0);
    if !detail && worst > 0 {
        return Err(CliError::quiet(worst));
    }
    Ok(())
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
