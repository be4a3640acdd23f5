//! `raidctl scrub`: asks the daemon for a scrub (waited for, with its
//! progress on a terminal, or in the background, or cancelled) and prints
//! its report; the exit status says whether anything was left wrong.

use super::*;

/// `(repair, background, cancel)` as the command line gave them.
pub(super) fn scrub(
    st: &StateDir,
    name: &str,
    (repair, background, cancel): (bool, bool, bool),
    fmt: Format,
) -> Result<()> {
    let ask = || {
        daemon_call(
            st,
            name,
            Request::Scrub {
                name: name.to_string(),
                repair,
                background,
                cancel,
            },
        )
    };
    // A scrub waited for shows its progress on a terminal.
    let shown = !background
        && !cancel
        && fmt != Format::Json
        && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let r = if shown {
        /// Ends the progress line however the call ends (a panic
        /// too: the scope would wait for the line's thread).
        struct Ends<'a>(&'a AtomicBool);
        impl Drop for Ends<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let done = AtomicBool::new(false);
        std::thread::scope(|sc| {
            sc.spawn(|| scrub_progress_line(st, name, &done));
            let _ends = Ends(&done);
            ask()
        })?
    } else {
        ask()?
    };
    if background || cancel {
        print_message(&r);
        return Ok(());
    }
    let s = r
        .scrub
        .ok_or_else(|| CliError::daemon("the daemon sent no scrub report"))?;
    // Unresolved: the parity now agrees with data that may be
    // wrong; a repair cannot fix that, and scripts must notice.
    let unrepaired = s.mismatches.iter().any(|m| !m.repaired || m.unresolved);
    if fmt == Format::Json {
        print_json(&s);
    } else {
        out!(
            "scrub of '{}': {} {}, {} read, {} mismatches{}",
            s.array,
            s.rows_checked,
            match s.rows_are.as_str() {
                "" => "rows",
                unit => unit,
            },
            status::human_bytes(s.bytes_read),
            s.mismatches.len(),
            match (s.repair, s.mismatches.is_empty()) {
                (_, true) => "",
                (true, false) if s.mismatches.iter().any(|m| m.unresolved) => {
                    " (repaired where located; where more than one chunk was wrong, the parity now agrees with data that may itself be wrong: check the files there (fsck), restore them from a backup if damaged)"
                }
                (true, false) => " (repaired)",
                (false, false) if s.mismatches.iter().all(|m| m.located) => {
                    " (check only: raidctl scrub --repair rewrites the chunks found wrong)"
                }
                (false, false) => {
                    " (check only). Where the wrong chunk cannot be located (RAID5, mirrors, more than one chunk wrong), --repair makes the parity or copies agree with the data, which may be the bad part: if one member is suspect (its errors, its health), fail and replace it instead, so that it is rebuilt from the others; else raidctl scrub --repair"
                }
            }
        );
        for m in &s.mismatches {
            match m.slot {
                Some(slot) => out!(
                    "  stripe {} slot {} {}: {}",
                    m.stripe,
                    slot,
                    m.member.as_deref().unwrap_or("-"),
                    m.what
                ),
                None => out!("  stripe {}: {}", m.stripe, m.what),
            }
        }
    }
    // Mismatches left as they are: scripts and cron must notice.
    if unrepaired {
        return Err(CliError::quiet(crate::error::code::FAILED));
    }
    Ok(())
}

/// While a scrub the command waits for runs: its progress on one line of
/// the terminal (stderr), redrawn every second, cleared once `done`.
fn scrub_progress_line(st: &StateDir, name: &str, done: &AtomicBool) {
    let mut drawn = false;
    let mut next = Instant::now() + Duration::from_secs(1);
    while !done.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() < next {
            continue;
        }
        next = Instant::now() + Duration::from_secs(1);
        let ask = Request::Status {
            name: Some(name.into()),
        };
        let Ok(r) = daemon_call(st, name, ask) else {
            continue;
        };
        let Some(s) = r.arrays.into_iter().next().and_then(|a| a.scrub) else {
            continue;
        };
        eprint!("\r\x1b[K{name}: scrub {}", status::scrub_progress(&s));
        drawn = true;
    }
    if drawn {
        eprint!("\r\x1b[K");
    }
}
