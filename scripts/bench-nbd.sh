#!/usr/bin/env bash
# NBD export benchmark (not a test): the same fio jobs, through fio's nbd
# engine, against
#   - our NBD export of a RAID0, a RAID5 and a RAID6 over 4 tmpfs member
#     files each (BENCH_LEVELS, default "0 5 6"),
#   - qemu-nbd serving one tmpfs file,
#   - nbdkit's file plugin serving one tmpfs file,
# in the same run, and the ratio of ours to the better of the two, job by job.
#
# BENCH_SECONDS (default 10) per job. Targets (not tests): ours >= 1.5x the
# better of the two on RAID0, >= 1.0x on RAID5. Needs fio, qemu-nbd, nbdkit
# (scripts/install-test-deps.sh). Members live in /dev/shm.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
secs=${BENCH_SECONDS:-10}
cargo build --release -p raidctl >/dev/null
raidctl=$root/target/release/raidctl
work=$(mktemp -d /dev/shm/raid-nbd-bench.XXXXXX)
export RAIDCTL_STATE_DIR=$work/state RAIDCTL_LOG=warn
pids=()
cleanup() {
  for l in ${BENCH_LEVELS:-0 5 6}; do "$raidctl" stop "bench$l" >/dev/null 2>&1 || true; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

size=1G
levels=${BENCH_LEVELS:-0 5 6}
for l in $levels; do
  for i in 0 1 2 3; do truncate -s "$size" "$work/l$l-m$i.img"; done
  # Sparse like the qemu-nbd and nbdkit images it is compared with.
  "$raidctl" create "bench$l" --level "$l" --chunk 128K --sparse "$work"/l$l-m{0,1,2,3}.img >/dev/null
  "$raidctl" start "bench$l" --nbd "unix:$work/ours$l.sock" >/dev/null
done
truncate -s "$size" "$work/qemu.img"
truncate -s "$size" "$work/nbdkit.img"
qemu-nbd -f raw --cache=writeback --aio=threads -e 16 -t -k "$work/qemu.sock" "$work/qemu.img" &
pids+=($!)
nbdkit -f -U "$work/nbdkit.sock" file "$work/nbdkit.img" &
pids+=($!)
for s in qemu nbdkit; do
  for _ in $(seq 100); do [ -S "$work/$s.sock" ] && break; sleep 0.1; done
done

run() { # server job -> "iops MB/s"
  local sock=$work/$1.sock rw=$2 bs=$3 depth=$4
  fio --name=j --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --rw="$rw" --bs="$bs" \
      --iodepth="$depth" --size=1G --time_based --runtime="$secs" --ramp_time=1 \
      --output-format=json 2>/dev/null |
    python3 -c '
import json,sys
t=sys.stdin.read()
j=json.loads(t[t.index("{"):])["jobs"][0]
d=j["read"] if j["read"]["io_bytes"]>0 else j["write"]
print("%.0f %.1f" % (d["iops"], d["bw_bytes"]/1e6))'
}

# Fill the files first, so reads read real data everywhere.
servers="qemu nbdkit"
for l in $levels; do servers="$servers ours$l"; done
for s in $servers; do
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$work/$s.sock" --rw=write --bs=1M \
      --iodepth=8 --size=1G --output-format=json >/dev/null 2>&1
done

for l in $levels; do
echo
echo "RAID$l of 4 (ours) against one file (qemu-nbd, nbdkit):"
echo
echo "| job | ours IOPS | ours MB/s | qemu-nbd IOPS | qemu-nbd MB/s | nbdkit file IOPS | nbdkit file MB/s | ours / best |"
echo "|---|---|---|---|---|---|---|---|"
for job in "randread 4k 32" "randwrite 4k 32" "read 128k 32" "write 128k 32"; do
  set -- $job
  o=$(run "ours$l" "$1" "$2" "$3"); q=$(run qemu "$1" "$2" "$3"); n=$(run nbdkit "$1" "$2" "$3")
  python3 - "$1 $2 QD$3" "$o" "$q" "$n" <<'PY'
import sys
name,o,q,n=sys.argv[1:]
o,q,n=[list(map(float,x.split())) for x in (o,q,n)]
best=max(q[0],n[0])
print(f"| {name} | {o[0]:.0f} | {o[1]:.0f} | {q[0]:.0f} | {q[1]:.0f} | {n[0]:.0f} | {n[1]:.0f} | {o[0]/best:.2f}x |")
PY
done
done
