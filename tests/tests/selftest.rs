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

#[test]
fn selftest_refuses_a_width_q_cannot_cover() {
    let out = raidctl(&["selftest", "--width", "300"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--width 300 is out of range"), "{err}");
}
