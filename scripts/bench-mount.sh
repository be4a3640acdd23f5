#!/usr/bin/env bash
# The mounted array against its peers (a benchmark, not a test): fio with
# io_uring, direct=1, on a 1 GiB file in each of
#   - ext4 on `raidctl mount --loop` over a RAID5 of 5 tmpfs files (ours),
#   - btrfs RAID5 (data and metadata) over 5 loop devices on tmpfs files of
#     the same size (the in-kernel RAID peer: this kernel has no md),
#   - ext4 on one loop device on one tmpfs file (the single-drive analog),
# in the same run, job by job, with the ratios of ours to each.
#
# BENCH_SECONDS (default 10) per job, BENCH_QD (default 32). Needs root,
# fio, mkfs.ext4, mkfs.btrfs and losetup (scripts/install-test-deps.sh).
# RAIDCTL=/path/to/raidctl measures another build (default: this tree's).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
secs=${BENCH_SECONDS:-10}
qd=${BENCH_QD:-32}
if [ -z "${RAIDCTL:-}" ]; then
  cargo build --release -p raidctl >/dev/null
  RAIDCTL=$root/target/release/raidctl
fi
work=$(mktemp -d /dev/shm/raid-mount-bench.XXXXXX)
export RAIDCTL_STATE_DIR=$work/state RAIDCTL_LOG=warn
loops=()
mnts=()
cleanup() {
  for m in "${mnts[@]}"; do umount "$m" 2>/dev/null || true; done
  "$RAIDCTL" unmount bench >/dev/null 2>&1 || true
  "$RAIDCTL" stop bench >/dev/null 2>&1 || true
  for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

member=600M
mkdir -p "$work/ours" "$work/btrfs" "$work/one"
for i in 0 1 2 3 4; do truncate -s "$member" "$work/m$i.img" "$work/b$i.img"; done
truncate -s 2400M "$work/one.img"

# Ours.
"$RAIDCTL" create bench --level 5 --chunk 64K "$work"/m{0,1,2,3,4}.img >/dev/null
"$RAIDCTL" start bench >/dev/null
dev=$("$RAIDCTL" mount bench --loop | head -1)
mkfs.ext4 -q -F "$dev"
mount "$dev" "$work/ours"
mnts+=("$work/ours")

# btrfs RAID5 over five loop devices.
bdevs=()
for i in 0 1 2 3 4; do
  l=$(losetup --find --show --direct-io=on "$work/b$i.img")
  loops+=("$l")
  bdevs+=("$l")
done
mkfs.btrfs -q -f -d raid5 -m raid5 "${bdevs[@]}" >/dev/null 2>&1
mount "${bdevs[0]}" "$work/btrfs"
mnts+=("$work/btrfs")

# One loop device.
l=$(losetup --find --show --direct-io=on "$work/one.img")
loops+=("$l")
mkfs.ext4 -q -F "$l"
mount "$l" "$work/one"
mnts+=("$work/one")

run() { # dir rw bs -> "iops MB/s"
  fio --name=j --directory="$1" --filename=bench.dat --ioengine=io_uring --direct=1 \
      --rw="$2" --bs="$3" --iodepth="$qd" --size=1G --time_based --runtime="$secs" \
      --ramp_time=1 --output-format=json 2>/dev/null |
    python3 -c '
import json,sys
t=sys.stdin.read()
j=json.loads(t[t.index("{"):])["jobs"][0]
d=j["read"] if j["read"]["io_bytes"]>0 else j["write"]
print("%.0f %.1f" % (d["iops"], d["bw_bytes"]/1e6))'
}

# Lay the files down first, so reads read written data everywhere.
for d in ours btrfs one; do
  fio --name=fill --directory="$work/$d" --filename=bench.dat --ioengine=io_uring --direct=1 \
      --rw=write --bs=1M --iodepth=8 --size=1G --output-format=json >/dev/null 2>&1
done

echo "| job | ours | btrfs RAID5 | ext4 on one loop | ours / btrfs | ours / one loop |"
echo "|---|---|---|---|---|---|"
for job in "randread 4k" "randwrite 4k" "read 128k" "write 128k"; do
  set -- $job
  o=$(run "$work/ours" "$1" "$2")
  b=$(run "$work/btrfs" "$1" "$2")
  n=$(run "$work/one" "$1" "$2")
  python3 - "$1 $2" "$o" "$b" "$n" <<'EOF'
import sys
job, o, b, n = sys.argv[1], *[list(map(float, a.split())) for a in sys.argv[2:]]
fmt = lambda x: "%.1fK IOPS (%.2f GB/s)" % (x[0] / 1e3, x[1] / 1e3)
print("| %s | %s | %s | %s | %.2fx | %.2fx |" % (job, fmt(o), fmt(b), fmt(n), o[0] / b[0], o[0] / n[0]))
EOF
done
