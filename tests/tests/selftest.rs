//! `raidctl selftest` on this machine: every kernel agrees with the oracle.

use raid_e2e::raidctl;

#[test]
fn selftest_passes_and_lists_every_level() {
    let out = raidctl(&["selftest", "--width", "6", "--chunk-kib", "16"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "selftest failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("scalar"), "{stdout}");
    assert!(!stdout.contains("MISMATCH"), "{stdout}");
    // Every listed level reports ok.
    let rows: Vec<&str> = stdout.lines().filter(|l| l.ends_with(" ok")).collect();
    assert!(!rows.is_empty(), "{stdout}");
}

/// `--format json` gives the same check as an object (it printed the text
/// table).
#[test]
fn selftest_speaks_json_when_asked() {
    let out = raidctl(&[
        "selftest",
        "--width",
        "4",
        "--chunk-kib",
        "4",
        "--format",
        "json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(v["ok"], true, "{v}");
    let engines = v["engines"].as_array().unwrap();
    assert!(engines.iter().any(|e| e["engine"] == "scalar"), "{v}");
    assert!(engines.iter().all(|e| e["ok"] == true), "{v}");
}

#[test]
fn selftest_refuses_a_width_q_cannot_cover() {
    let out = raidctl(&["selftest", "--width", "300"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--width 300 is out of range"), "{err}");
}

/// A reader that stops after the first line (`raidctl selftest | head -1`)
/// ends the command quietly and successfully, not with a panic: scripts
/// under `set -o pipefail` read the first line of `mount --loop` this way.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut child = Command::new(raid_e2e::raidctl_path())
        .args(["selftest", "--width", "4", "--chunk-kib", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("parity self-test"), "{first}");
    // The pipe's read end is dropped here; the rest of the output meets it.
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

/// Without XDG_RUNTIME_DIR (sudo, a system unit), opening the GPU engine
/// (here Mesa's lavapipe) made libwayland print a bare
/// `error: XDG_RUNTIME_DIR is invalid` line to stderr, the daemon's log:
/// two false errors per start of a RAID5/6 array. raidctl gives itself a
/// private one.
#[test]
fn no_stray_runtime_dir_error_on_stderr() {
    let tmp = raid_e2e::World::new("xdg");
    let out = std::process::Command::new(raid_e2e::raidctl_path())
        .args(["selftest", "--width", "4", "--chunk-kib", "4"])
        .env_remove("XDG_RUNTIME_DIR")
        .env("TMPDIR", &tmp.dir)
        .output()
        .expect("run raidctl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
}
