#!/usr/bin/env bash
# Client I/O while a hot replace copies (a benchmark, not a test): fio's
# nbd engine, 4 KiB random reads and writes at QD 32 on the NBD export of a
# RAID5 of 4 files, first idle, then while a hot replace paced at
# HOT_RATE (default 40M per second) copies a member onto a spare file;
# each as a ratio to idle. With OLD=/path/to/raidctl, that build runs the
# same rounds too, alternating which goes first (the disk's own caching
# swings single rounds, so compare several).
#   bash scripts/bench-hot-replace.sh
#   (OLD=... HOT_DIR=/var/tmp/raid-hot HOT_SIZE=512M HOT_ROUNDS=2 HOT_SECONDS=4)
# Members on the VM's disk are opened with O_DIRECT; HOT_DIR=/dev/shm/...
# puts them in memory. Needs fio with its nbd engine
# (scripts/install-test-deps.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
NEW=${NEW:-$root/target/release/raidctl}
[ -n "${NEW_BUILT:-}" ] || (cd "$root" && cargo build --release -p raidctl >/dev/null)
OLD=${OLD:-}
D=${HOT_DIR:-/var/tmp/raid-hot}
SIZE=${HOT_SIZE:-512M}
RATE=${HOT_RATE:-40M}
SECS=${HOT_SECONDS:-4}
export RAIDCTL_LOG=warn
cleanup() {
  for b in "$NEW" $OLD; do
    [ -d "$D/st" ] && RAIDCTL_STATE_DIR=$D/st "$b" stop hot >/dev/null 2>&1 || true
  done
  rm -rf "$D"
}
trap cleanup EXIT
job() { # uri rw -> IOPS
  fio --name=j --ioengine=nbd --uri="$1" --rw="$2" --bs=4k --iodepth=32 --size="$SIZE" \
      --time_based --runtime="$SECS" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; d=j["read"] if j["read"]["io_bytes"] else j["write"]; print(int(d["iops"]))'
}
one() { # binary label
  local b=$1
  rm -rf "$D"; mkdir -p "$D/st"
  export RAIDCTL_STATE_DIR=$D/st
  for i in 0 1 2 3 s; do truncate -s "$SIZE" "$D/m$i"; done
  "$b" create hot --level 5 "$D"/m{0,1,2,3} >/dev/null
  "$b" start hot --nbd "unix:$D/nbd.sock" >/dev/null
  local uri="nbd+unix:///hot?socket=$D/nbd.sock"
  fio --name=f --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size="$SIZE" \
      --output-format=terse >/dev/null
  local ir iw hr hw
  ir=$(job "$uri" randread); iw=$(job "$uri" randwrite)
  "$b" rate hot --rebuild "$RATE" >/dev/null
  "$b" replace hot "$D/m1" "$D/ms" >/dev/null
  hr=$(job "$uri" randread); hw=$(job "$uri" randwrite)
  "$b" status hot | grep -q "hot replace" ||
    echo "bench-hot-replace: the copy ended before the jobs did: lower HOT_RATE" >&2
  "$b" rate hot --rebuild 0 >/dev/null
  "$b" wait hot >/dev/null
  "$b" stop hot >/dev/null
  # A stopped array's daemon lingers: the next build must not reach it.
  flock -w 60 "$D/st/daemon.lock" true
  python3 -c "import sys; l, ir, hr, iw, hw = sys.argv[1], *map(int, sys.argv[2:])
print('| %s | %d | %d (%.2fx) | %d | %d (%.2fx) |' % (l, ir, hr, hr / ir, iw, hw, hw / iw))" \
    "$2" "$ir" "$hr" "$iw" "$hw"
}
echo "| build | randread idle | during the copy | randwrite idle | during the copy |"
echo "|---|---|---|---|---|"
for r in $(seq "${HOT_ROUNDS:-2}"); do
  if [ -z "$OLD" ]; then one "$NEW" this; continue; fi
  if [ $((r % 2)) = 1 ]; then one "$OLD" old; one "$NEW" this; else one "$NEW" this; one "$OLD" old; fi
done
