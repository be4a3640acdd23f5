//! raidctl: the operator's CLI. For now it runs the parity self-test; the
//! array commands (create, start, status, ...) arrive with the array engine.

fn main() {
    println!("raidctl {}", env!("CARGO_PKG_VERSION"));
}
