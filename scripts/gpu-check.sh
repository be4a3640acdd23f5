#!/usr/bin/env bash
# The one script for a machine with a real GPU: the GPU tests and the GPU
# benchmark, with what the machine says about its GPU, in one short run.
#
#   bash scripts/gpu-check.sh prepare   # here: build the binaries it runs
#   bash scripts/gpu-check.sh run       # there: run them, results in $OUT
#
# `prepare` builds the release test and bench binaries and copies them,
# stripped, to target/gpu-check/ (so a GPU machine without a Rust toolchain
# or a crates.io mirror can run them: carry that folder). `run` uses a local
# build instead when cargo can build offline.
#
# `run` writes to $OUT (default ./gpu-out): adapter.txt (nvidia-smi,
# vulkaninfo, what wgpu opened), selftest.txt, tests.txt, bench.txt and
# bench-gpu.json (the table docs/benchmarks.md records). If wgpu sees no
# adapter, adapter.txt and the tests say why: that is a result too.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/gpu-check
mode=${1:-run}

if [ "$mode" = prepare ]; then
  cargo build --release -p raidctl
  cargo test --release -p raid-gpu --no-run
  cargo bench -p raid-gpu --bench gpu --no-run
  rm -rf "$dir" && mkdir -p "$dir"
  cp target/release/raidctl "$dir/"
  for t in gpu_parity gpu_engine gpu_array gpu; do
    f=$(ls -t target/release/deps/"$t"-* | grep -v '\.d$' | head -1)
    cp "$f" "$dir/$t"
  done
  strip "$dir"/* 2>/dev/null || true
  du -sh "$dir"
  exit 0
fi

out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
export RUST_LOG=${RUST_LOG:-info}

{
  date -u
  nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
  (vulkaninfo --summary 2>&1 || echo "vulkaninfo: not available") | head -40
  ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>&1 || true
} > "$out/adapter.txt"

bin=$dir
if [ ! -x "$bin/gpu_parity" ]; then
  echo "no prepared binaries in $dir: building here (needs cargo and crates)" | tee -a "$out/adapter.txt"
  bash "$0" prepare
fi

set +e
"$bin/raidctl" selftest > "$out/selftest.txt" 2>&1
echo "selftest rc=$?" >> "$out/selftest.txt"
{
  "$bin/gpu_parity" --test-threads 2; echo "gpu_parity rc=$?"
  "$bin/gpu_engine" --test-threads 1; echo "gpu_engine rc=$?"
  "$bin/gpu_array"; echo "gpu_array rc=$?"
} > "$out/tests.txt" 2>&1
BENCH_JSON="$out/bench-gpu.json" BENCH_SECONDS=${BENCH_SECONDS:-240} \
  "$bin/gpu" --bench > "$out/bench.txt" 2>&1
echo "bench rc=$?" >> "$out/bench.txt"
set -e
grep -h "rc=\|adapter\|GPU faster\|not faster" "$out"/*.txt | head -20
