#!/usr/bin/env bash
# NBD export benchmark (not a test): the same fio jobs, through fio's nbd
# engine, against
#   - our NBD export of a RAID0, a RAID5 and a RAID6 over 4 tmpfs member
#     files each (BENCH_LEVELS, default "0 5 6"),
#   - qemu-nbd serving one tmpfs file,
#   - nbdkit's file plugin serving one tmpfs file,
# in the same run, and the ratio of ours to the better of the two, job by job.
#
# BENCH_SECONDS (default 10) per job; BENCH_SIZE (default 1G) per file;
# BENCH_ROUNDS (default 1): each job run that many times per server, the
# servers in turn, and each server's median shown (one run of a server
# here moves by up to a third from the next);
# BENCH_JOBS, a comma-separated list of "rw bs depth connections" (default
# the four jobs at QD 32 on one connection). BENCH_BEFORE=PATH serves the
# same arrays with another raidctl binary too (a build from before a
# change), side by side in the same run. Targets (not tests): ours >= 1.5x
# the better of the two on RAID0, >= 1.0x on RAID5. Needs fio, qemu-nbd,
# nbdkit (scripts/install-test-deps.sh). Members live in BENCH_DIR (default
# /dev/shm: memory, no device latency; a directory on a disk puts a real
# device's latency under every member I/O, members opened O_DIRECT).
# BENCH_DEGRADED=1 fails one member of each RAID5/6 after the fill, so the
# jobs run degraded (writes then go through the degraded-write journal).
# BENCH_FIO_ARGS adds fio options to every job: "--fsync=1" makes each
# write wait for a flush, as a database's log does. BENCH_CHUNK (default
# 128K) is the arrays' chunk: at raidctl's default, 64K, a 128 KiB request
# covers two chunks.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
. scripts/nbd-peers.sh
secs=${BENCH_SECONDS:-10}
cargo build --release -p raidctl >/dev/null
raidctl=$root/target/release/raidctl
before=${BENCH_BEFORE:-}
work=$(mktemp -d "${BENCH_DIR:-/dev/shm}/raid-nbd-bench.XXXXXX")
export RAIDCTL_STATE_DIR=$work/state RAIDCTL_LOG=warn
pids=()
cleanup() {
  for l in ${BENCH_LEVELS:-0 5 6}; do
    "$raidctl" stop "bench$l" >/dev/null 2>&1 || true
    [ -z "$before" ] || RAIDCTL_STATE_DIR=$work/state-before "$before" stop "bench$l" >/dev/null 2>&1 || true
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

size=${BENCH_SIZE:-1G}
levels=${BENCH_LEVELS:-0 5 6}
serve() { # binary state-dir tag level
  local bin=$1 state=$2 tag=$3 l=$4
  for i in 0 1 2 3; do truncate -s "$size" "$work/$tag$l-m$i.img"; done
  # Sparse like the qemu-nbd and nbdkit images it is compared with.
  RAIDCTL_STATE_DIR=$state "$bin" create "bench$l" --level "$l" --chunk "${BENCH_CHUNK:-128K}" --sparse \
    "$work"/$tag$l-m{0,1,2,3}.img >/dev/null
  RAIDCTL_STATE_DIR=$state "$bin" start "bench$l" --nbd "unix:$work/$tag$l.sock" >/dev/null
}
for l in $levels; do
  serve "$raidctl" "$work/state" ours "$l"
  [ -z "$before" ] || serve "$before" "$work/state-before" before "$l"
done
truncate -s "$size" "$work/qemu.img"
truncate -s "$size" "$work/nbdkit.img"
start_nbd_peers "$work" -e 16

run() { # server rw bs depth connections -> "iops MB/s"
  local sock=$work/$1.sock rw=$2 bs=$3 depth=$4 conns=${5:-1}
  fio --name=j --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --rw="$rw" --bs="$bs" \
      --iodepth="$depth" --numjobs="$conns" --group_reporting --size="$size" \
      --time_based --runtime="$secs" --ramp_time=1 ${BENCH_FIO_ARGS:-} --output-format=json 2>/dev/null |
    python3 -c '
import json,sys
t=sys.stdin.read()
j=json.loads(t[t.index("{"):])["jobs"][0]
d=j["read"] if j["read"]["io_bytes"]>0 else j["write"]
print("%.0f %.1f" % (d["iops"], d["bw_bytes"]/1e6))'
}

# Fill the files first, so reads read real data everywhere.
servers="qemu nbdkit"
for l in $levels; do
  servers="$servers ours$l"
  [ -z "$before" ] || servers="$servers before$l"
done
for s in $servers; do
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$work/$s.sock" --rw=write --bs=1M \
      --iodepth=8 --size="$size" --output-format=json >/dev/null 2>&1
done

if [ "${BENCH_DEGRADED:-0}" = 1 ]; then
  for l in $levels; do
    [ "$l" = 0 ] && continue
    "$raidctl" fail "bench$l" "$work/ours$l-m1.img" >/dev/null
    [ -z "$before" ] || RAIDCTL_STATE_DIR=$work/state-before "$before" fail "bench$l" "$work/before$l-m1.img" >/dev/null
  done
fi

jobs=${BENCH_JOBS:-randread 4k 32 1,randwrite 4k 32 1,read 128k 32 1,write 128k 32 1}
rounds=${BENCH_ROUNDS:-1}
for l in $levels; do
echo
echo "RAID$l of 4 (ours${BENCH_DEGRADED:+, degraded=$BENCH_DEGRADED}) against one file (qemu-nbd, nbdkit)$([ "$rounds" = 1 ] || echo ", median of $rounds rounds, the servers in turn"):"
echo
if [ -n "$before" ]; then
  echo "| job | ours IOPS | ours MB/s | before IOPS | ours / before | qemu-nbd IOPS | nbdkit file IOPS | ours / best |"
else
  echo "| job | ours IOPS | ours MB/s | qemu-nbd IOPS | qemu-nbd MB/s | nbdkit file IOPS | nbdkit file MB/s | ours / best |"
fi
echo "|---|---|---|---|---|---|---|---|"
IFS=, read -ra list <<<"$jobs"
for job in "${list[@]}"; do
  set -- $job
  # Each server in turn, BENCH_ROUNDS times: the median of its rounds.
  o=""; q=""; n=""; b=""
  for _ in $(seq "$rounds"); do
    o="$o,$(run "ours$l" "$@")"; q="$q,$(run qemu "$@")"; n="$n,$(run nbdkit "$@")"
    [ -z "$before" ] || b="$b,$(run "before$l" "$@")"
  done
  [ -n "$b" ] || b=",0 0"
  python3 - "$1 $2 QD$3 x$4" "$o" "$q" "$n" "$b" <<'PY'
import statistics, sys
name,o,q,n,b=sys.argv[1:]
def median(runs):
    rows=[list(map(float,r.split())) for r in runs.split(",") if r.strip()]
    return [statistics.median(col) for col in zip(*rows)]
o,q,n,b=[median(x) for x in (o,q,n,b)]
best=max(q[0],n[0])
if b[0]:
    print(f"| {name} | {o[0]:.0f} | {o[1]:.0f} | {b[0]:.0f} | {o[0]/b[0]:.2f}x | {q[0]:.0f} | {n[0]:.0f} | {o[0]/best:.2f}x |")
else:
    print(f"| {name} | {o[0]:.0f} | {o[1]:.0f} | {q[0]:.0f} | {q[1]:.0f} | {n[0]:.0f} | {n[1]:.0f} | {o[0]/best:.2f}x |")
PY
done
done
