#!/usr/bin/env bash
# The whole test suite on a fresh Debian/Ubuntu machine: installs the test
# dependencies, then runs every test of the workspace (release profile: the
# parity property tests run every SIMD kernel and are slow unoptimised).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
. scripts/env.sh
# The end-to-end tests drive target/release/raidctl. Build it first: a plain
# build resolves features apart from the test build, and if the binary is
# missing the first e2e test builds it itself, two minutes inside a test
# that waits for an email.
cargo build --release -p raidctl
cargo test --workspace --release --no-fail-fast
# The benchmarks are not tests, but they must keep compiling.
cargo bench --workspace --no-run
