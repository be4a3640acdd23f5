//! `raidctl start`: the members (recorded, given, or found by a scan), the
//! daemon (started on demand), the request.

use super::*;

/// How the members are to be taken: `force`, members marked failed or
/// stale too; `listed`, the members were typed (`--members`), so each slot
/// in sync must be among them.
pub(super) struct How {
    pub force: bool,
    pub listed: bool,
}

pub(super) fn start(
    st: &StateDir,
    name: &str,
    members: Vec<PathBuf>,
    nbd: Option<(String, crate::export::Security)>,
    foreground: bool,
    parity: Option<Parity>,
    How { force, listed }: How,
) -> Result<()> {
    check_name(name)?;
    let members: Vec<PathBuf> = members
        .iter()
        .map(|p| super::existing_member(p, name))
        .collect::<Result<_>>()?;
    if members.is_empty() {
        st.load(name)?;
    }
    let (nbd, sec) = match nbd {
        Some((spec, sec)) => (Some(spec), sec),
        None => (None, Default::default()),
    };
    let req = Request::Start {
        name: name.into(),
        members,
        nbd,
        tls: sec.tls,
        tls_verify_peer: sec.verify_peer,
        insecure: sec.insecure,
        parity: parity.map(|p| p.name().to_string()),
        force,
        listed,
    };
    if foreground {
        let c = Config::load(st, None)?;
        return Daemon::run(st.clone(), c.daemon_options(None, false, vec![req], None));
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
pub(super) fn scan_members(st: &StateDir, name: &str, dirs: &[PathBuf]) -> Result<Vec<PathBuf>> {
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
    // The daemon reads the state folder's config as it starts and stops
    // on an error there: said here, naming the line, rather than as "did
    // not come up" with the reason left in its log.
    Config::load(st, None)?;
    st.ensure()?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(st.log())
        .map_err(|e| {
            // The daemon keeps its socket and log in the state folder: a
            // folder it cannot write is one it cannot run from (exit 5).
            CliError::daemon(format!(
                "cannot start the daemon: cannot write its log {} ({e}). The daemon keeps its socket, log and the arrays' records in {}: make that folder writable (or name another with --state-dir / RAIDCTL_STATE_DIR)",
                st.log().display(),
                st.root.display()
            ))
        })?;
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
    // Up to 40 s: a daemon that finds the one before it still exiting
    // waits up to 30 s for its lock (`daemon::process::lock_daemon`).
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(40) {
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
