#!/usr/bin/env bash
# Copying a mostly empty array out over NBD (a benchmark, not a test):
# nbdcopy from the export to nowhere (null:), the way a backup or an
# image conversion reads it, against qemu-nbd and nbdkit's file plugin
# serving one sparse file with the same data, in the same run. A copy
# asks the server which parts hold data (block status, `base:allocation`)
# and reads only those; `--no-extents` reads every byte, for comparison.
#
# Our export: a RAID5 of 4 sparse files of BENCH_SIZE (default 1G) each,
# created --sparse; BENCH_DATA MiB (default 256) written through it in
# 1 MiB pieces spread over the array. The single files: the same data at
# the same offsets. BENCH_BEFORE=PATH copies from a second array served by
# another raidctl binary (a build from before a change), side by side.
# Members live in BENCH_DIR (default /dev/shm). BENCH_MEMBERS=nbd makes
# them network members: each file served by nbdkit's file plugin on a
# Unix socket, the array reaching it over NBD (its holes then come from
# the servers' block status: `[remote] trust_holes = true` in this build's
# config). Needs nbdcopy, qemu-nbd, nbdkit, qemu-io
# (scripts/install-test-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
. scripts/nbd-peers.sh
cargo build --release -p raidctl >/dev/null
raidctl=$root/target/release/raidctl
before=${BENCH_BEFORE:-}
size=${BENCH_SIZE:-1G}
data_mib=${BENCH_DATA:-256}
work=$(mktemp -d "${BENCH_DIR:-/dev/shm}/raid-copy-bench.XXXXXX")
export RAIDCTL_STATE_DIR=$work/state RAIDCTL_LOG=warn
pids=()
cleanup() {
  "$raidctl" stop copy >/dev/null 2>&1 || true
  [ -z "$before" ] || RAIDCTL_STATE_DIR=$work/state-before "$before" stop copy >/dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

serve() { # binary state-dir tag
  local bin=$1 state=$2 tag=$3 members=()
  for i in 0 1 2 3; do
    truncate -s "$size" "$work/$tag-m$i.img"
    if [ "${BENCH_MEMBERS:-files}" = nbd ]; then
      nbdkit -f -U "$work/$tag-m$i.sock" file "$work/$tag-m$i.img" &
      pids+=($!)
      while [ ! -S "$work/$tag-m$i.sock" ]; do sleep 0.1; done
      members+=("nbd+unix:///?socket=$work/$tag-m$i.sock")
    else
      members+=("$work/$tag-m$i.img")
    fi
  done
  RAIDCTL_STATE_DIR=$state "$bin" create copy --level 5 --chunk 128K --sparse \
    "${members[@]}" >/dev/null
  RAIDCTL_STATE_DIR=$state "$bin" start copy --nbd "unix:$work/$tag.sock" >/dev/null
}
if [ "${BENCH_MEMBERS:-files}" = nbd ]; then
  mkdir -p "$work/state"
  printf '[remote]\ntrust_holes = true\n' > "$work/state/raidctl.toml"
fi
serve "$raidctl" "$work/state" ours
servers="ours"
if [ -n "$before" ]; then
  serve "$before" "$work/state-before" before
  servers="$servers before"
fi
# The single files are the size of the array, so the data lands at the
# same offsets everywhere.
cap=$(qemu-img info --output=json "nbd+unix:///?socket=$work/ours.sock" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["virtual-size"])')
truncate -s "$cap" "$work/qemu.img" "$work/nbdkit.img"
start_nbd_peers "$work"
servers="$servers qemu nbdkit"

# BENCH_DATA pieces of 1 MiB, evenly spread.
step=$(( cap / (1 << 20) / data_mib ))
cmds=()
for i in $(seq 0 $((data_mib - 1))); do
  cmds+=(-c "write -P $(( (i % 250) + 1 )) $(( i * step ))M 1M")
done
for s in $servers; do
  qemu-io -f raw "${cmds[@]}" "nbd+unix:///?socket=$work/$s.sock" >/dev/null
done

copy() { # server [nbdcopy flags] -> seconds
  local s=$1
  shift
  local t0 t1
  t0=$(date +%s.%N)
  nbdcopy "$@" "nbd+unix:///?socket=$work/$s.sock" null:
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.3f}')"
}

echo
echo "nbdcopy of $(( cap >> 20 )) MiB holding $data_mib MiB of data, to null: (seconds)"
echo
echo "| server | skipping holes | reading every byte | every byte / skipping |"
echo "|---|---|---|---|"
for s in $servers; do
  a=$(copy "$s")
  b=$(copy "$s" --no-extents)
  python3 -c "print(f'| $s | $a | $b | {$b / $a:.1f}x |')"
done
