#!/usr/bin/env bash
# The whole test suite on a fresh Debian/Ubuntu machine: installs the test
# dependencies, then runs every test of the workspace (release profile: the
# parity property tests run every SIMD kernel and are slow unoptimised).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
. scripts/env.sh
cargo test --workspace --release --no-fail-fast
# The benchmarks are not tests, but they must keep compiling.
cargo bench --workspace --no-run
