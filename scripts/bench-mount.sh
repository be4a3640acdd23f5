#!/usr/bin/env bash
# The mounted array against its peers (a benchmark, not a test): fio with
# io_uring, direct=1, on a 1 GiB file in each of
#   - ext4 on `raidctl mount --loop` over a RAID5 of 5 tmpfs files (ours),
#     twice where the kernel has FUSE over io_uring: one mount served by
#     threads reading /dev/fuse, one through the io_uring transport,
#   - btrfs RAID5 (data and metadata) over 5 loop devices on tmpfs files of
#     the same size (the in-kernel RAID peer: this kernel has no md),
#   - ext4 on one loop device on one tmpfs file (the single-drive analog),
# in the same run, job by job, with the ratios of ours to each; then,
# once those are unmounted, the NBD export of a RAID0, a RAID5 and a RAID6
# against qemu-nbd and nbdkit (scripts/bench-nbd.sh, this tree's build;
# BENCH_NBD=0 leaves it out).
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
  for a in bench benchu; do
    "$RAIDCTL" unmount $a >/dev/null 2>&1 || true
    "$RAIDCTL" stop $a >/dev/null 2>&1 || true
  done
  for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null || true; done
  if [ -n "${uring_was:-}" ]; then echo "$uring_was" > "$param"; fi
  rm -rf "$work"
}
param=/sys/module/fuse/parameters/enable_uring
uring_was=$(cat "$param" 2>/dev/null || true)
trap cleanup EXIT

member=600M
mkdir -p "$work/ours" "$work/btrfs" "$work/one"
for i in 0 1 2 3 4; do truncate -s "$member" "$work/m$i.img" "$work/b$i.img"; done
truncate -s 2400M "$work/one.img"

# Ours, served by threads reading /dev/fuse: the fuse module's
# enable_uring is off while it mounts (the kernel reads it at each mount).

[ -n "$uring_was" ] && echo N > "$param"
"$RAIDCTL" create bench --level 5 --chunk 64K "$work"/m{0,1,2,3,4}.img >/dev/null
"$RAIDCTL" start bench >/dev/null
dev=$("$RAIDCTL" mount bench --loop | head -1)
mkfs.ext4 -q -F "$dev"
mount "$dev" "$work/ours"
mnts+=("$work/ours")

# Ours again, a second array of the same shape, over FUSE's io_uring
# transport where the kernel has it (Linux 6.14 on).
dirs="ours"
if [ -n "$uring_was" ]; then
  echo Y > "$param"
  for i in 0 1 2 3 4; do truncate -s "$member" "$work/u$i.img"; done
  mkdir -p "$work/oursu"
  "$RAIDCTL" create benchu --level 5 --chunk 64K "$work"/u{0,1,2,3,4}.img >/dev/null
  "$RAIDCTL" start benchu >/dev/null
  udev=$("$RAIDCTL" mount benchu --loop | head -1)
  echo "$uring_was" > "$param"
  mkfs.ext4 -q -F "$udev"
  mount "$udev" "$work/oursu"
  mnts+=("$work/oursu")
  dirs="ours oursu"
fi

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
for d in $dirs btrfs one; do
  fio --name=fill --directory="$work/$d" --filename=bench.dat --ioengine=io_uring --direct=1 \
      --rw=write --bs=1M --iodepth=8 --size=1G --output-format=json >/dev/null 2>&1
done

echo "| job | ours (/dev/fuse) | ours (io_uring) | btrfs RAID5 | ext4 on one loop | io_uring / /dev/fuse | best / btrfs | best / one loop |"
echo "|---|---|---|---|---|---|---|---|"
for job in "randread 4k" "randwrite 4k" "read 128k" "write 128k"; do
  set -- $job
  o=$(run "$work/ours" "$1" "$2")
  u="0 0"
  [ -d "$work/oursu" ] && u=$(run "$work/oursu" "$1" "$2")
  b=$(run "$work/btrfs" "$1" "$2")
  n=$(run "$work/one" "$1" "$2")
  python3 - "$1 $2" "$o" "$u" "$b" "$n" <<'EOF'
import sys
job, o, u, b, n = sys.argv[1], *[list(map(float, a.split())) for a in sys.argv[2:]]
fmt = lambda x: "%.1fK IOPS (%.2f GB/s)" % (x[0] / 1e3, x[1] / 1e3) if x[0] else "n/a"
best = max(o[0], u[0])
ratio = "%.2fx" % (u[0] / o[0]) if u[0] else "n/a"
print("| %s | %s | %s | %s | %s | %s | %.2fx | %.2fx |" % (job, fmt(o), fmt(u), fmt(b), fmt(n), ratio, best / b[0], best / n[0]))
EOF
done

if [ "${BENCH_NBD:-1}" != 0 ]; then
  # The mounts' memory back before the NBD bench lays its files down.
  cleanup
  trap - EXIT
  echo
  echo "The NBD export against qemu-nbd and nbdkit (scripts/bench-nbd.sh):"
  BENCH_SECONDS=$secs bash scripts/bench-nbd.sh
fi
