#!/usr/bin/env bash
# The main job on a fresh machine: build the tools, prove every parity kernel
# of this CPU against the oracle, then run the parity benchmark (with ISA-L
# beside it when libisal-dev is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p raidctl
./target/release/raidctl selftest
if [ "$(id -u)" -eq 0 ]; then bash scripts/install-test-deps.sh || true; fi
cargo bench -p raid-core --bench parity -- ${BENCH_ARGS:---quick}
