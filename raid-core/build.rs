//! Finds ISA-L (Debian's libisal-dev) for the cross-check test and the
//! comparison benchmark. The library itself never links it: only test and
//! bench targets do, and both skip with a message when it is absent.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(have_isal)");
    println!("cargo::rerun-if-changed=build.rs");
    let pkg = Command::new("pkg-config")
        .args(["--exists", "libisal"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let header = Path::new("/usr/include/isa-l/raid.h").exists();
    if pkg || header {
        println!("cargo::rustc-cfg=have_isal");
        println!("cargo::rustc-link-arg-tests=-lisal");
        println!("cargo::rustc-link-arg-benches=-lisal");
    }
}
