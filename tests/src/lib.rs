//! Helpers for the end-to-end tests in `tests/tests/`: they drive the real
//! `raidctl` binary, built by the same `cargo test` run.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `raidctl` binary of the profile these tests were built with. Cargo
/// builds every binary of the workspace before it runs any test; if this test
/// crate was built alone, the binary is built here.
pub fn raidctl_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>/raidctl
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    let bin = dir.join("raidctl");
    if !bin.exists() {
        let release = dir.ends_with("release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "raidctl"]);
        if release {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build -p raidctl");
        assert!(st.success(), "building raidctl failed");
    }
    bin
}

/// Runs raidctl with arguments and returns its output.
pub fn raidctl(args: &[&str]) -> Output {
    Command::new(raidctl_path())
        .args(args)
        .output()
        .expect("run raidctl")
}
