#!/usr/bin/env bash
# Synchronous writes on the mounted array (a benchmark, not a test): ext4
# on `raidctl mount --loop` over a RAID5 of 4 files, fio writing 4 KiB
# blocks with an fsync after each (a database's log, a mail spool), the
# way each write reaches the array as a write and a flush.
#
# Members are files of BENCH_SIZE (default 1G) in BENCH_DIR (default
# /var/tmp: a disk, whose flushes cost something; on tmpfs they cost
# nothing). BENCH_DEGRADED=1 fails one member after mkfs, so the writes go
# through the degraded-write journal. BENCH_BEFORE=PATH runs the same
# with another raidctl binary (a build from before a change), the two
# builds in turn; BENCH_ROUNDS (default 2) rounds; BENCH_SECONDS (default
# 8) per job; BENCH_BS (default 4k) the size of each write. Needs root, fio, mkfs.ext4 and losetup
# (scripts/install-test-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
cargo build --release -p raidctl >/dev/null
secs=${BENCH_SECONDS:-8}
bs=${BENCH_BS:-4k}
rounds=${BENCH_ROUNDS:-2}
size=${BENCH_SIZE:-1G}
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/raid-fsync-bench.XXXXXX")
export RAIDCTL_STATE_DIR=$work/state RAIDCTL_LOG=warn
builds="now=$root/target/release/raidctl"
[ -z "${BENCH_BEFORE:-}" ] || builds="$builds before=$BENCH_BEFORE"

bin=""
cleanup() {
  mountpoint -q "$work/mnt" && umount "$work/mnt"
  if [ -n "$bin" ]; then
    "$bin" unmount fsb >/dev/null 2>&1 || true
    "$bin" stop fsb >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# One build, one round: "job iops" lines.
run() {
  bin=$1
  mkdir -p "$work/mnt"
  for i in 0 1 2 3; do truncate -s "$size" "$work/m$i.img"; done
  "$bin" create fsb --level 5 --chunk 64K --sparse "$work"/m{0,1,2,3}.img >/dev/null
  "$bin" start fsb >/dev/null
  local dev
  dev=$("$bin" mount fsb --loop | head -1)
  mkfs.ext4 -q -F "$dev"
  mount "$dev" "$work/mnt"
  [ "${BENCH_DEGRADED:-0}" != 1 ] || "$bin" fail fsb "$work/m1.img" >/dev/null
  for job in "randwrite 1" "write 1" "randwrite 8"; do
    set -- $job
    fio --name=j --directory="$work/mnt" --rw="$1" --bs="$bs" --size=256M --ioengine=psync \
        --numjobs="$2" --fsync=1 --time_based --runtime="$secs" --ramp_time=1 \
        --group_reporting --output-format=json 2>/dev/null |
      python3 -c '
import json, sys
t = sys.stdin.read()
print("'"$1 x$2"'", round(json.loads(t[t.index("{"):])["jobs"][0]["write"]["iops"]))'
  done
  umount "$work/mnt"
  "$bin" unmount fsb >/dev/null
  "$bin" stop fsb >/dev/null
  # The daemon lingers a moment after its last array stops.
  while pgrep -f "state-dir $RAIDCTL_STATE_DIR daemon" >/dev/null; do sleep 0.5; done
  rm -rf "$work/state" "$work"/m*.img
}

results=$work/results
for _ in $(seq "$rounds"); do
  for b in $builds; do
    run "${b#*=}" | sed "s/^/${b%%=*} /" >>"$results"
  done
done

echo "ext4 on the mounted RAID5 of 4 (${BENCH_DEGRADED:+degraded, }members in ${BENCH_DIR:-/var/tmp}), $bs writes each followed by fsync, IOPS per round:"
echo
python3 - "$results" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    build, rw, jobs, iops = line.split()
    rows.setdefault(f"{rw} {jobs}", {}).setdefault(build, []).append(int(iops))
builds = ["now"] + (["before"] if any("before" in r for r in rows.values()) else [])
print("| job | " + " | ".join(builds) + (" | now / before |" if len(builds) > 1 else " |"))
print("|---" * (len(builds) + 1 + (len(builds) > 1)) + "|")
for job, r in rows.items():
    cells = [", ".join(map(str, r[b])) for b in builds]
    if len(builds) > 1:
        ratio = sum(r["now"]) / sum(r["before"])
        cells.append(f"{ratio:.2f}x")
    print(f"| {job} | " + " | ".join(cells) + " |")
PY
